//! A few bytes of "firmware" at the reset vector.
//!
//! A kernel that reboots "through the BIOS" (Linux does after its EFI
//! attempt on hardware-reduced ACPI machines, and on `sysrq b`) drops to
//! real mode and jumps to f000:fff0. There is no BIOS in a hakoniwa VM, so
//! without code there the vCPU would run zeroed memory forever. The stub
//! does what a firmware reset would end in: it writes the reset value to
//! the ACPI reset register, which ends the VM as a reboot.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::RESET_VECTOR;
use crate::Error;

/// 16-bit real-mode code: `cli; mov dx, port; mov al, value; out dx, al;
/// hlt; jmp $-1`.
pub fn reset_stub(port: u16, value: u8) -> [u8; 10] {
    let [port_lo, port_hi] = port.to_le_bytes();
    [
        0xfa, 0xba, port_lo, port_hi, 0xb0, value, 0xee, 0xf4, 0xeb, 0xfd,
    ]
}

/// Writes the stub at the reset vector.
pub fn write_reset_vector<M: GuestMemoryBackend>(
    mem: &M,
    reset_port: u16,
    reset_value: u8,
) -> Result<(), Error> {
    mem.write_slice(
        &reset_stub(reset_port, reset_value),
        GuestAddress(RESET_VECTOR),
    )
    .map_err(|_| Error::BootStructure("reset vector"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_writes_the_reset_value_to_the_port() {
        let code = reset_stub(0x602, 0x1);
        // mov dx, 0x0602
        assert_eq!(&code[1..4], &[0xba, 0x02, 0x06]);
        // mov al, 1; out dx, al
        assert_eq!(&code[4..7], &[0xb0, 0x01, 0xee]);
        // then halt, and loop back to the halt
        assert_eq!(&code[7..], &[0xf4, 0xeb, 0xfd]);
        assert!(code.len() <= 16, "must fit below 1 MiB");
    }
}
