//! Translating a guest linear address through the guest's own page tables,
//! as the MMU would: for reports on a guest that failed (which page RIP,
//! the stack or the IDT is on, and which page-table pages lead there).
//!
//! Pure: the caller reads guest memory (`read_u64`), so a page that cannot
//! be read (not in memory yet, e.g. still on a migration's source) ends the
//! walk with [`WalkEnd::Unreadable`] instead of blocking.

/// CR0.PG, CR4.PAE, CR4.LA57, EFER.LMA.
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const EFER_LMA: u64 = 1 << 10;

const PRESENT: u64 = 1;
/// PS: the entry maps a large page (1 GiB at level 3, 2 MiB at level 2).
const PAGE_SIZE_BIT: u64 = 1 << 7;
/// Physical-address bits 12..51 of an entry.
const FRAME_MASK: u64 = 0x000f_ffff_ffff_f000;

/// The control registers that decide how an address is translated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PagingRegs {
    pub cr0: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
}

impl PagingRegs {
    /// The paging mode's name, as the report shows it.
    pub fn mode(&self) -> &'static str {
        if self.cr0 & CR0_PG == 0 {
            "none"
        } else if self.efer & EFER_LMA == 0 {
            if self.cr4 & CR4_PAE != 0 {
                "32-bit PAE"
            } else {
                "32-bit"
            }
        } else if self.cr4 & CR4_LA57 != 0 {
            "5-level"
        } else {
            "4-level"
        }
    }
}

/// One page-table entry read on the way: the table's guest-physical page
/// address, the entry's address and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkStep {
    /// 5 (PML5), 4 (PML4), 3 (PDPT), 2 (PD) or 1 (PT).
    pub level: u8,
    pub table: u64,
    pub entry_address: u64,
    pub entry: u64,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkEnd {
    /// The address maps to `physical`, in a page of `page_size` bytes.
    Mapped { physical: u64, page_size: u64 },
    /// The entry at `level` is not present: the guest itself would fault.
    NotPresent { level: u8 },
    /// The table entry at this guest-physical address could not be read.
    Unreadable { address: u64 },
    /// A paging mode this walker does not follow (32-bit modes).
    Unsupported(&'static str),
}

/// A whole walk: each entry read, and the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    pub steps: Vec<WalkStep>,
    pub end: WalkEnd,
}

impl Walk {
    /// The guest-physical address, when the walk found one.
    pub fn physical(&self) -> Option<u64> {
        match self.end {
            WalkEnd::Mapped { physical, .. } => Some(physical),
            _ => None,
        }
    }
}

/// Translates `linear` with the guest's paging registers `regs`, reading
/// page-table entries with `read_u64(guest_physical_address)`.
pub fn translate(regs: &PagingRegs, linear: u64, read_u64: impl Fn(u64) -> Option<u64>) -> Walk {
    let mut steps = Vec::new();
    let levels: u8 = match regs.mode() {
        "none" => {
            return Walk {
                steps,
                end: WalkEnd::Mapped {
                    physical: linear,
                    page_size: 4096,
                },
            }
        }
        "4-level" => 4,
        "5-level" => 5,
        other => {
            return Walk {
                steps,
                end: WalkEnd::Unsupported(other),
            }
        }
    };
    let mut table = regs.cr3 & FRAME_MASK;
    for level in (1..=levels).rev() {
        let shift = 12 + 9 * u32::from(level - 1);
        let index = (linear >> shift) & 0x1ff;
        let entry_address = table + index * 8;
        let Some(entry) = read_u64(entry_address) else {
            return Walk {
                steps,
                end: WalkEnd::Unreadable {
                    address: entry_address,
                },
            };
        };
        steps.push(WalkStep {
            level,
            table,
            entry_address,
            entry,
        });
        if entry & PRESENT == 0 {
            return Walk {
                steps,
                end: WalkEnd::NotPresent { level },
            };
        }
        if level == 1 || (level <= 3 && entry & PAGE_SIZE_BIT != 0) {
            let page_size = 1u64 << shift;
            let frame = entry & FRAME_MASK & !(page_size - 1);
            return Walk {
                steps,
                end: WalkEnd::Mapped {
                    physical: frame | (linear & (page_size - 1)),
                    page_size,
                },
            };
        }
        table = entry & FRAME_MASK;
    }
    unreachable!("level 1 always ends the walk")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const LONG_MODE: PagingRegs = PagingRegs {
        cr0: CR0_PG | 1,
        cr3: 0x1000,
        cr4: CR4_PAE,
        efer: EFER_LMA | (1 << 8),
    };

    /// Guest memory as entry address → value.
    fn memory(entries: &[(u64, u64)]) -> HashMap<u64, u64> {
        entries.iter().copied().collect()
    }

    #[test]
    fn a_4k_page_is_found_through_four_tables() {
        // The kernel's text mapping of 0xffffffff81000000 + 0x1234.
        let va = 0xffff_ffff_8100_1234u64;
        let (l4, l3, l2, l1) = (
            (va >> 39) & 0x1ff,
            (va >> 30) & 0x1ff,
            (va >> 21) & 0x1ff,
            (va >> 12) & 0x1ff,
        );
        let mem = memory(&[
            (0x1000 + l4 * 8, 0x2000 | 0x3),
            (0x2000 + l3 * 8, 0x3000 | 0x3),
            (0x3000 + l2 * 8, 0x4000 | 0x3),
            // NX and a PTE's high attribute bits are not part of the frame.
            (0x4000 + l1 * 8, (1 << 63) | 0x12_3456_7000 | 0x1),
        ]);
        let walk = translate(&LONG_MODE, va, |a| mem.get(&a).copied());
        assert_eq!(
            walk.end,
            WalkEnd::Mapped {
                physical: 0x12_3456_7234,
                page_size: 4096
            }
        );
        let tables: Vec<(u8, u64)> = walk.steps.iter().map(|s| (s.level, s.table)).collect();
        assert_eq!(
            tables,
            vec![(4, 0x1000), (3, 0x2000), (2, 0x3000), (1, 0x4000)]
        );
        assert_eq!(walk.physical(), Some(0x12_3456_7234));
    }

    #[test]
    fn large_pages_end_the_walk_early() {
        let va = 0x4020_1234u64; // PML4 0, PDPT 1, PD 1
        let two_mib = memory(&[
            (0x1000, 0x2000 | 0x3),
            (0x2000 + 8, 0x3000 | 0x3),
            // 2 MiB page at 0x8000_0000; bit 12 (PAT) set must not leak in.
            (0x3000 + 8, 0x8000_0000 | (1 << 12) | PAGE_SIZE_BIT | 0x3),
        ]);
        let walk = translate(&LONG_MODE, va, |a| two_mib.get(&a).copied());
        assert_eq!(
            walk.end,
            WalkEnd::Mapped {
                physical: 0x8000_1234,
                page_size: 2 << 20
            }
        );
        let one_gib = memory(&[
            (0x1000, 0x2000 | 0x3),
            (0x2000 + 8, 0x1_0000_0000 | PAGE_SIZE_BIT | 0x3),
        ]);
        let walk = translate(&LONG_MODE, va, |a| one_gib.get(&a).copied());
        assert_eq!(walk.physical(), Some(0x1_0020_1234));
        assert_eq!(walk.steps.len(), 2);
    }

    #[test]
    fn a_missing_entry_or_an_unreadable_table_says_where() {
        let mem = memory(&[(0x1000, 0x2000 | 0x3), (0x2000, 0)]);
        let walk = translate(&LONG_MODE, 0x1000, |a| mem.get(&a).copied());
        assert_eq!(walk.end, WalkEnd::NotPresent { level: 3 });
        assert_eq!(walk.steps.len(), 2);
        // The PDPT page cannot be read (e.g. it never arrived).
        let mem = memory(&[(0x1000, 0x2000 | 0x3)]);
        let walk = translate(&LONG_MODE, 0x1000, |a| mem.get(&a).copied());
        assert_eq!(walk.end, WalkEnd::Unreadable { address: 0x2000 });
        assert_eq!(walk.physical(), None);
    }

    #[test]
    fn modes_without_4_level_paging() {
        let off = PagingRegs::default();
        assert_eq!(off.mode(), "none");
        assert_eq!(translate(&off, 0x1234, |_| None).physical(), Some(0x1234));
        let pae = PagingRegs {
            cr0: CR0_PG,
            cr4: CR4_PAE,
            ..Default::default()
        };
        assert_eq!(
            translate(&pae, 0x1234, |_| None).end,
            WalkEnd::Unsupported("32-bit PAE")
        );
        let la57 = PagingRegs {
            cr4: CR4_PAE | CR4_LA57,
            ..LONG_MODE
        };
        assert_eq!(la57.mode(), "5-level");
        let walk = translate(&la57, 0, |a| (a == 0x1000).then_some(0));
        assert_eq!(walk.end, WalkEnd::NotPresent { level: 5 });
    }
}
