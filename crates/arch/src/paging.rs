//! Identity page tables for the 64-bit Linux boot protocol, which requires
//! the kernel, zero page and command line to be identity mapped.

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::layout::PML4_START;
use crate::Error;

/// How much of the guest physical space the boot tables map: all of the
/// first 4 GiB, which covers every place a kernel or initramfs can be put.
pub const IDENTITY_MAPPED_BYTES: u64 = 4 << 30;

const PAGE_SIZE: u64 = 0x1000;
const PRESENT_WRITABLE: u64 = 0x3;
const HUGE_PAGE: u64 = 0x80;
const TWO_MIB: u64 = 2 << 20;

/// Writes PML4 → PDPT → four page directories of 2 MiB pages at
/// `PML4_START` and returns the value to load into CR3.
pub fn write_identity_tables<M: GuestMemoryBackend>(mem: &M) -> Result<u64, Error> {
    let pml4 = PML4_START;
    let pdpt = pml4 + PAGE_SIZE;
    let first_pd = pdpt + PAGE_SIZE;
    let pd_count = IDENTITY_MAPPED_BYTES / (512 * TWO_MIB);

    let write = |value: u64, addr: u64| {
        mem.write_obj(value, GuestAddress(addr))
            .map_err(|_| Error::BootStructure("page tables"))
    };
    write(pdpt | PRESENT_WRITABLE, pml4)?;
    for pd_index in 0..pd_count {
        let pd = first_pd + pd_index * PAGE_SIZE;
        write(pd | PRESENT_WRITABLE, pdpt + pd_index * 8)?;
        for entry in 0..512u64 {
            let phys = (pd_index * 512 + entry) * TWO_MIB;
            write(phys | PRESENT_WRITABLE | HUGE_PAGE, pd + entry * 8)?;
        }
    }
    Ok(pml4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    #[test]
    fn tables_map_addresses_to_themselves() {
        let mem: GuestMemoryMmap =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let cr3 = write_identity_tables(&mem).unwrap();
        assert_eq!(cr3, PML4_START);
        // Walk the tables for a few addresses as the MMU would.
        for addr in [0u64, 0x1234_5678, 0xbfff_ffff, 0xffff_f000] {
            let pml4e: u64 = mem
                .read_obj(GuestAddress(cr3 + ((addr >> 39) & 0x1ff) * 8))
                .unwrap();
            assert_eq!(pml4e & 1, 1);
            let pdpt = pml4e & !0xfff;
            let pdpte: u64 = mem
                .read_obj(GuestAddress(pdpt + ((addr >> 30) & 0x1ff) * 8))
                .unwrap();
            assert_eq!(pdpte & 1, 1, "addr {addr:#x}");
            let pd = pdpte & !0xfff;
            let pde: u64 = mem
                .read_obj(GuestAddress(pd + ((addr >> 21) & 0x1ff) * 8))
                .unwrap();
            assert_eq!(pde & HUGE_PAGE, HUGE_PAGE);
            let phys = (pde & !0x1f_ffff & !HUGE_PAGE & !PRESENT_WRITABLE) | (addr & 0x1f_ffff);
            assert_eq!(phys, addr);
        }
    }
}
