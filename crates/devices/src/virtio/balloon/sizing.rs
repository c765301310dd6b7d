//! How big a balloon makes a guest as small as a guest booted smaller:
//! `ctl balloon --guest-memory` and the advisor's `--apply` size the
//! balloon with it, and the advisor reads a ballooned guest back with it.

const MIB: u64 = 1 << 20;

/// What a Linux guest's kernel spends, at boot, per byte of the memory it
/// boots with, in parts per 10 000: its `struct page`s (64 bytes per 4 KiB
/// page, 1.56 %) and the tables it sizes by memory (hash tables, page
/// tables of the direct map). The balloon cannot give this back: a guest
/// booted at 512 MiB and ballooned down by 384 MiB keeps the `struct page`s
/// of all 512, and has less memory than a guest booted at 128 MiB.
/// Measured in the rig with Debian 12's 6.1 kernel: `MemTotal` 457.6 MiB
/// booted at 512 MiB, 80.1 MiB booted at 128 MiB, so 377.4 MiB of
/// `MemTotal` for 384 MiB of memory (1.71 %); the 512 MiB guest with a
/// 384 MiB balloon had 73.6 MiB, where bench-iocache's advised fio cell,
/// which thrashed in the booted 128 MiB guest, went on to the OOM killer
/// (bench/results/evidence/iocache-balloon-stall.md).
pub const BOOT_OVERHEAD_PER_10K: u64 = 171;

/// The balloon that leaves a guest booted at `memory_bytes` what a guest
/// booted at `guest_bytes` has: not their difference, but the difference
/// less what the kernel spent on it at boot ([`BOOT_OVERHEAD_PER_10K`]),
/// rounded down to whole MiB (never less memory than asked).
pub fn balloon_for_guest_bytes(memory_bytes: u64, guest_bytes: u64) -> u64 {
    let freed = u128::from(memory_bytes.saturating_sub(guest_bytes));
    let usable = freed * u128::from(10_000 - BOOT_OVERHEAD_PER_10K) / 10_000;
    (usable as u64) / MIB * MIB
}

/// The inverse of [`balloon_for_guest_bytes`]: the booted guest that a
/// guest booted at `memory_bytes` with `balloon_bytes` in its balloon is
/// like (at most a MiB more than the guest asked for, the balloon being
/// whole MiB).
pub fn guest_bytes_with_balloon(memory_bytes: u64, balloon_bytes: u64) -> u64 {
    let freed = u128::from(balloon_bytes) * 10_000 / u128::from(10_000 - BOOT_OVERHEAD_PER_10K);
    memory_bytes.saturating_sub(freed as u64)
}

/// The balloon, in MiB, for `ctl balloon --guest-memory guest_mib` in a VM
/// of `memory_bytes`: [`balloon_for_guest_bytes`], refusing a guest
/// larger than the VM (a balloon cannot add memory; likely a typo).
pub fn balloon_mib_for_guest_mib(memory_bytes: u64, guest_mib: u64) -> Result<u64, String> {
    let memory_mib = memory_bytes / MIB;
    if guest_mib > memory_mib {
        return Err(format!(
            "guest memory {guest_mib} MiB is more than the VM's {memory_mib} MiB"
        ));
    }
    Ok(balloon_for_guest_bytes(memory_bytes, guest_mib * MIB) / MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_balloon_leaves_what_a_guest_booted_smaller_has() {
        // bench-iocache's advisor: a 512 MiB guest advised down to 128 MiB.
        // 512 - 128 = 384 MiB of balloon left it 73.6 MiB of MemTotal where
        // a guest booted at 128 MiB has 80.1 (457.6 at 512): 6.5 MiB short,
        // and fio's cell thrashed. 377 MiB leaves it 457.6 - 377 = 80.6.
        assert_eq!(balloon_for_guest_bytes(512 * MIB, 128 * MIB), 377 * MIB);
        let memtotal_512 = 468_548 * 1024;
        let memtotal_128 = 82_052 * 1024;
        let left = memtotal_512 - balloon_for_guest_bytes(512 * MIB, 128 * MIB);
        assert!(left >= memtotal_128, "{} < {}", left, memtotal_128);
        assert!(
            left - memtotal_128 < MIB,
            "{} MiB more",
            (left - memtotal_128) / MIB
        );
        // Nothing to give back, or less than a MiB of it: no balloon.
        assert_eq!(balloon_for_guest_bytes(512 * MIB, 512 * MIB), 0);
        assert_eq!(balloon_for_guest_bytes(512 * MIB, 1024 * MIB), 0);
        assert_eq!(balloon_for_guest_bytes(512 * MIB, 511 * MIB), 0);
        // Never less memory than asked, and the way back gives the guest
        // asked for, or at most a MiB more (the balloon is whole MiB), for
        // every whole-MiB guest of a few boots.
        for memory in [256 * MIB, 512 * MIB, 1024 * MIB, 4096 * MIB] {
            for guest in (128 * MIB..=memory).step_by(MIB as usize) {
                let balloon = balloon_for_guest_bytes(memory, guest);
                assert_eq!(balloon % MIB, 0);
                assert!(balloon <= memory - guest);
                let back = guest_bytes_with_balloon(memory, balloon);
                assert!(
                    back >= guest && back - guest <= MIB + MIB / 50,
                    "memory {} MiB, guest {} MiB, balloon {} MiB: {} bytes back",
                    memory / MIB,
                    guest / MIB,
                    balloon / MIB,
                    back
                );
            }
        }
        assert_eq!(guest_bytes_with_balloon(512 * MIB, 0), 512 * MIB);
        // 384 MiB of balloon is 390.7 MiB of booted memory.
        let back = guest_bytes_with_balloon(512 * MIB, 384 * MIB);
        assert_eq!(back / (MIB / 10), 1213, "{back}");
    }

    #[test]
    fn a_guest_size_becomes_a_balloon_or_a_one_line_refusal() {
        assert_eq!(balloon_mib_for_guest_mib(512 * MIB, 128), Ok(377));
        assert_eq!(balloon_mib_for_guest_mib(512 * MIB, 512), Ok(0));
        assert_eq!(
            balloon_mib_for_guest_mib(512 * MIB, 513),
            Err("guest memory 513 MiB is more than the VM's 512 MiB".into())
        );
        // No overflow on the largest request.
        assert!(balloon_mib_for_guest_mib(512 * MIB, u64::MAX).is_err());
    }
}
