//! Global descriptor table entries for entering the kernel, and their
//! conversion into the `kvm_segment` form KVM wants for the hidden parts
//! of segment registers.

use kvm_bindings::kvm_segment;

/// Flat 64-bit code segment (L=1, present, ring 0, execute/read).
pub const CODE64_FLAGS: u16 = 0xa09b;
/// Flat 32-bit code segment (D=1, G=1, present, ring 0, execute/read).
pub const CODE32_FLAGS: u16 = 0xc09b;
/// Flat data segment (D/B=1, G=1, present, ring 0, read/write).
pub const DATA_FLAGS: u16 = 0xc093;
/// 32/64-bit TSS (busy), needed so TR holds a valid descriptor.
pub const TSS_FLAGS: u16 = 0x808b;

/// Encodes one 8-byte GDT descriptor from its flags, base and limit.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((u64::from(base) & 0xff00_0000) << 32)
        | ((u64::from(flags) & 0x0000_f0ff) << 40)
        | ((u64::from(limit) & 0x000f_0000) << 32)
        | ((u64::from(base) & 0x00ff_ffff) << 16)
        | (u64::from(limit) & 0x0000_ffff)
}

fn entry_base(entry: u64) -> u64 {
    ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16)
}

fn entry_limit(entry: u64) -> u32 {
    (((entry & 0x000f_0000_0000_0000) >> 32) | (entry & 0x0000_0000_0000_ffff)) as u32
}

/// Builds the `kvm_segment` KVM needs for the descriptor at GDT `index`.
pub fn kvm_segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let bit = |shift: u32, mask: u64| ((entry >> shift) & mask) as u8;
    let granularity = bit(55, 1);
    let raw_limit = entry_limit(entry);
    // With G=1 the limit is in 4 KiB units; KVM wants it in bytes.
    let limit = if granularity == 1 {
        (raw_limit << 12) | 0xfff
    } else {
        raw_limit
    };
    kvm_segment {
        base: entry_base(entry),
        limit,
        selector: u16::from(index) * 8,
        type_: bit(40, 0xf),
        present: bit(47, 1),
        dpl: bit(45, 0x3),
        db: bit(54, 1),
        s: bit(44, 1),
        l: bit(53, 1),
        g: granularity,
        avl: bit(52, 1),
        padding: 0,
        // A segment is usable unless it is not present.
        unusable: u8::from(bit(47, 1) == 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code64_segment_round_trips() {
        let seg = kvm_segment_from_gdt(gdt_entry(CODE64_FLAGS, 0, 0xfffff), 1);
        assert_eq!(seg.selector, 0x8);
        assert_eq!(seg.l, 1);
        assert_eq!(seg.db, 0);
        assert_eq!(seg.g, 1);
        assert_eq!(seg.present, 1);
        assert_eq!(seg.s, 1);
        assert_eq!(seg.type_, 0xb);
        assert_eq!(seg.limit, 0xffff_ffff);
        assert_eq!(seg.base, 0);
        assert_eq!(seg.unusable, 0);
    }

    #[test]
    fn base_and_limit_are_split_and_rejoined() {
        let e = gdt_entry(0x0093, 0x1234_5678, 0xabcde);
        let seg = kvm_segment_from_gdt(e, 3);
        assert_eq!(seg.base, 0x1234_5678);
        assert_eq!(seg.limit, 0xabcde);
        assert_eq!(seg.g, 0);
        assert_eq!(seg.selector, 0x18);
    }

    #[test]
    fn absent_segment_is_unusable() {
        let seg = kvm_segment_from_gdt(gdt_entry(0, 0, 0), 0);
        assert_eq!(seg.present, 0);
        assert_eq!(seg.unusable, 1);
    }
}
