//! Image locking that QEMU understands: open file description locks
//! (`F_OFD_SETLK`) on single bytes of the image, in QEMU's scheme
//! (block/file-posix.c, `raw_apply_lock_bytes` / `raw_check_lock_bytes`).
//!
//! QEMU has four block permissions (bit i: consistent read, write, write
//! unchanged, resize). A user holds a shared (read) lock on byte 100 + i
//! for every permission it uses, and on byte 200 + i for every permission
//! it does not let others have. Two users conflict when one uses what the
//! other does not share: that shows as another open file description
//! holding byte 200 + i of a permission we want, or byte 100 + i of one
//! we refuse to share. Read locks never block each other, so everyone
//! first takes its bytes, then tests the others' (with `F_OFD_GETLK`).
//!
//! QEMU 10 with a virtio-blk drive takes: read-write, bytes 100, 101 and
//! 201 (reads and writes, shares everything but writing); read-only, 100
//! and 201 (a reader still refuses writers, unless `share-rw=on`).
//! hakoniwa takes the same bytes, so each refuses the other on one image
//! both ways, and read-only users of either kind share it.
//!
//! hakoniwa also holds byte [`HAKONIWA_BYTE`], which QEMU never looks at,
//! so that a refusal can say whether the holder is another hakoniwa or
//! QEMU (an OFD lock has no owner pid to ask, `l_pid` is -1).
//!
//! The decision is the pure [`conflict`]; [`ImageLock`] does the fcntl
//! calls. Locks live on the open file description: closing the image (or
//! [`ImageLock::release`]) drops them, and other descriptors of the same
//! process conflict like another process's, which the unit tests use.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// QEMU's first "permission used" byte (RAW_LOCK_PERM_BASE).
pub const PERM_BASE: u64 = 100;
/// QEMU's first "permission not shared" byte (RAW_LOCK_SHARED_BASE).
pub const SHARED_BASE: u64 = 200;
/// The byte only hakoniwa locks ("hako" in ASCII), far from QEMU's.
pub const HAKONIWA_BYTE: u64 = 0x6861_6b6f;

/// QEMU's block permissions, as bits (include/block/block-common.h).
pub const PERM_CONSISTENT_READ: u8 = 0x01;
pub const PERM_WRITE: u8 = 0x02;
pub const PERM_WRITE_UNCHANGED: u8 = 0x04;
pub const PERM_RESIZE: u8 = 0x08;
/// Every permission QEMU knows (BLK_PERM_ALL).
pub const PERM_ALL: u8 = 0x0f;
const PERM_COUNT: u32 = 4;

/// QEMU's name of each permission bit, for messages.
fn perm_name(bit: u8) -> &'static str {
    match bit {
        PERM_CONSISTENT_READ => "consistent read",
        PERM_WRITE => "write",
        PERM_WRITE_UNCHANGED => "write unchanged",
        _ => "resize",
    }
}

/// What one user of the image does and lets others do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permissions {
    /// Permissions used (bytes 100 + i).
    pub used: u8,
    /// Permissions shared with others (bytes 200 + i for the rest).
    pub shared: u8,
}

impl Permissions {
    /// What a hakoniwa disk takes: what QEMU's virtio-blk takes for a
    /// drive of the same `readonly` (see the module comment).
    pub fn for_disk(readonly: bool) -> Permissions {
        let used = if readonly {
            PERM_CONSISTENT_READ
        } else {
            PERM_CONSISTENT_READ | PERM_WRITE
        };
        Permissions {
            used,
            shared: PERM_ALL & !PERM_WRITE,
        }
    }

    /// Every byte this user locks: its used and its not-shared bytes.
    pub fn bytes(&self) -> Vec<u64> {
        let mut bytes = Vec::new();
        for i in 0..PERM_COUNT {
            if self.used & (1 << i) != 0 {
                bytes.push(PERM_BASE + u64::from(i));
            }
        }
        for i in 0..PERM_COUNT {
            if self.shared & (1 << i) == 0 {
                bytes.push(SHARED_BASE + u64::from(i));
            }
        }
        bytes
    }
}

/// Who holds the lock that refused us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A hakoniwa (it holds [`HAKONIWA_BYTE`]), writing or only reading.
    Hakoniwa { writing: bool },
    /// Someone in QEMU's scheme without hakoniwa's byte: QEMU or one of
    /// its tools (qemu-img, qemu-nbd, qemu-storage-daemon).
    Qemu { writing: bool },
}

/// Why the image cannot be ours: the permission in conflict and its holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The QEMU permission bit that clashed.
    pub perm: u8,
    /// We want it and they do not share it (true), or they use it and we
    /// do not share it (false).
    pub we_want_it: bool,
    pub holder: Holder,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (who, writing) = match self.holder {
            Holder::Hakoniwa { writing } => ("another hakoniwa", writing),
            Holder::Qemu { writing } => ("QEMU", writing),
        };
        let how = if writing { "read-write" } else { "read-only" };
        let lock = if self.we_want_it {
            format!("\"{}\"", perm_name(self.perm))
        } else {
            format!("shared \"{}\"", perm_name(self.perm))
        };
        write!(
            f,
            "in use by {who} ({how}; its lock refuses us the {lock} lock)"
        )
    }
}

/// What testing the image's bytes showed: which bytes another open file
/// description holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Others {
    /// Bit i: someone else holds byte 100 + i (uses permission i).
    pub used: u8,
    /// Bit i: someone else holds byte 200 + i (does not share i).
    pub unshared: u8,
    /// Someone else holds [`HAKONIWA_BYTE`].
    pub hakoniwa: bool,
}

/// Whether `ours` can coexist with the others, QEMU's way: the first
/// permission we want that someone does not share, else the first one
/// someone uses that we do not share.
pub fn conflict(ours: Permissions, others: Others) -> Option<Conflict> {
    let writing = others.used & PERM_WRITE != 0;
    let holder = if others.hakoniwa {
        Holder::Hakoniwa { writing }
    } else {
        Holder::Qemu { writing }
    };
    let first = |bits: u8| (0..PERM_COUNT).map(|i| 1u8 << i).find(|b| bits & b != 0);
    if let Some(perm) = first(ours.used & others.unshared) {
        return Some(Conflict {
            perm,
            we_want_it: true,
            holder,
        });
    }
    first(others.used & !ours.shared).map(|perm| Conflict {
        perm,
        we_want_it: false,
        holder,
    })
}

/// Why locking failed.
#[derive(Debug)]
pub enum LockError {
    /// Someone else has the image in a way ours cannot coexist with.
    Conflict(Conflict),
    /// fcntl failed (e.g. a file system without OFD locks).
    Io(io::Error),
}

/// The locks hakoniwa holds on one image (on its descriptor's open file
/// description).
#[derive(Debug)]
pub struct ImageLock {
    perms: Permissions,
    held: bool,
}

impl ImageLock {
    /// Locks `file` for a disk of the given `readonly`, or says who is in
    /// the way (leaving nothing locked).
    pub fn acquire(file: &File, readonly: bool) -> Result<ImageLock, LockError> {
        let mut lock = ImageLock {
            perms: Permissions::for_disk(readonly),
            held: false,
        };
        lock.reacquire(file)?;
        Ok(lock)
    }

    /// Describes the locks for `readonly` without taking them, for an
    /// image whose locking waits (a migration's destination).
    pub fn deferred(readonly: bool) -> ImageLock {
        ImageLock {
            perms: Permissions::for_disk(readonly),
            held: false,
        }
    }

    /// Whether the locks are held.
    pub fn is_held(&self) -> bool {
        self.held
    }

    /// Takes the locks (again): first our bytes, then a test of the
    /// others' as QEMU does; on a conflict ours are dropped again.
    pub fn reacquire(&mut self, file: &File) -> Result<(), LockError> {
        if self.held {
            return Ok(());
        }
        let mut bytes = self.perms.bytes();
        bytes.push(HAKONIWA_BYTE);
        let result = (|| {
            for &b in &bytes {
                set(file, b, libc::F_RDLCK as libc::c_short)?;
            }
            let others = others(file)?;
            match conflict(self.perms, others) {
                Some(c) => Err(LockError::Conflict(c)),
                None => Ok(()),
            }
        })();
        match result {
            Ok(()) => {
                self.held = true;
                Ok(())
            }
            Err(e) => {
                let _ = unlock_all(file, &bytes);
                Err(e)
            }
        }
    }

    /// Lets go of the image (a migration's source hands it over), keeping
    /// the descriptor open.
    pub fn release(&mut self, file: &File) -> io::Result<()> {
        if !self.held {
            return Ok(());
        }
        let mut bytes = self.perms.bytes();
        bytes.push(HAKONIWA_BYTE);
        unlock_all(file, &bytes)?;
        self.held = false;
        Ok(())
    }
}

impl From<io::Error> for LockError {
    fn from(e: io::Error) -> LockError {
        LockError::Io(e)
    }
}

fn unlock_all(file: &File, bytes: &[u64]) -> io::Result<()> {
    for &b in bytes {
        set(file, b, libc::F_UNLCK as libc::c_short)?;
    }
    Ok(())
}

/// Which of QEMU's bytes and hakoniwa's byte other descriptions hold.
fn others(file: &File) -> io::Result<Others> {
    let mut o = Others::default();
    for i in 0..PERM_COUNT {
        if held_by_other(file, PERM_BASE + u64::from(i))? {
            o.used |= 1 << i;
        }
        if held_by_other(file, SHARED_BASE + u64::from(i))? {
            o.unshared |= 1 << i;
        }
    }
    o.hakoniwa = held_by_other(file, HAKONIWA_BYTE)?;
    Ok(o)
}

fn flock_at(byte: u64, kind: libc::c_short) -> libc::flock {
    // SAFETY: flock is a plain C struct of integers; all-zero is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte as libc::off_t;
    fl.l_len = 1;
    fl
}

fn fcntl_lock(file: &File, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    loop {
        // SAFETY: fcntl with an OFD lock command reads (and for GETLK
        // writes) the flock struct we own; it touches nothing else.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, fl as *mut libc::flock) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sets (F_RDLCK) or clears (F_UNLCK) our lock on one byte.
fn set(file: &File, byte: u64, kind: libc::c_short) -> io::Result<()> {
    let mut fl = flock_at(byte, kind);
    fcntl_lock(file, libc::F_OFD_SETLK, &mut fl)
}

/// Whether another open file description holds a lock on `byte`: the
/// test for a write lock is refused by any lock but ours.
fn held_by_other(file: &File, byte: u64) -> io::Result<bool> {
    let mut fl = flock_at(byte, libc::F_WRLCK as libc::c_short);
    fcntl_lock(file, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An image file, removed when dropped.
    struct Image(std::path::PathBuf);

    impl Drop for Image {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn image() -> (Image, std::path::PathBuf) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "hakoniwa-lock-test-{}-{}.img",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        (Image(path.clone()), path)
    }

    fn open(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn the_bytes_are_what_qemu_10_takes_for_virtio_blk() {
        // Seen in /proc/locks with qemu-system-x86_64 10.0.2 and
        // -drive file=IMG,if=virtio[,readonly=on]: 100-101 + 201, 100 + 201.
        assert_eq!(Permissions::for_disk(false).bytes(), vec![100, 101, 201]);
        assert_eq!(Permissions::for_disk(true).bytes(), vec![100, 201]);
    }

    #[test]
    fn writers_exclude_everyone_and_readers_share() {
        let rw = Permissions::for_disk(false);
        let ro = Permissions::for_disk(true);
        let as_others = |p: Permissions, hakoniwa| Others {
            used: p.used,
            unshared: PERM_ALL & !p.shared,
            hakoniwa,
        };
        let c = conflict(rw, as_others(rw, false)).unwrap();
        assert_eq!(
            c,
            Conflict {
                perm: PERM_WRITE,
                we_want_it: true,
                holder: Holder::Qemu { writing: true }
            }
        );
        assert!(conflict(rw, as_others(ro, true)).is_some());
        let c = conflict(ro, as_others(rw, true)).unwrap();
        assert_eq!(c.holder, Holder::Hakoniwa { writing: true });
        assert!(!c.we_want_it);
        assert_eq!(conflict(ro, as_others(ro, false)), None);
        assert_eq!(conflict(rw, Others::default()), None);
        // QEMU with share-rw=on shares writing: a reader still refuses it.
        let share_rw = Permissions {
            used: PERM_CONSISTENT_READ | PERM_WRITE,
            shared: PERM_ALL,
        };
        assert!(conflict(ro, as_others(share_rw, false)).is_some());
        assert_eq!(conflict(share_rw, as_others(share_rw, false)), None);
    }

    #[test]
    fn the_message_names_the_holder() {
        let c = conflict(
            Permissions::for_disk(false),
            Others {
                used: PERM_CONSISTENT_READ | PERM_WRITE,
                unshared: PERM_WRITE,
                hakoniwa: true,
            },
        )
        .unwrap();
        assert_eq!(
            c.to_string(),
            "in use by another hakoniwa (read-write; its lock refuses us the \"write\" lock)"
        );
        let c = conflict(
            Permissions::for_disk(true),
            Others {
                used: PERM_CONSISTENT_READ | PERM_WRITE,
                unshared: PERM_WRITE,
                hakoniwa: false,
            },
        )
        .unwrap();
        assert_eq!(
            c.to_string(),
            "in use by QEMU (read-write; its lock refuses us the shared \"write\" lock)"
        );
    }

    #[test]
    fn two_descriptions_exclude_each_other_until_released() {
        let (_dir, path) = image();
        let (a, b) = (open(&path), open(&path));
        let mut first = ImageLock::acquire(&a, false).unwrap();
        match ImageLock::acquire(&b, false) {
            Err(LockError::Conflict(c)) => {
                assert_eq!(c.holder, Holder::Hakoniwa { writing: true })
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        // A reader is refused too, and leaves nothing behind.
        assert!(matches!(
            ImageLock::acquire(&b, true),
            Err(LockError::Conflict(_))
        ));
        first.release(&a).unwrap();
        assert!(!first.is_held());
        let mut second = ImageLock::acquire(&b, false).unwrap();
        assert!(matches!(first.reacquire(&a), Err(LockError::Conflict(_))));
        second.release(&b).unwrap();
        first.reacquire(&a).unwrap();
        assert!(first.is_held());
    }

    #[test]
    fn readers_share() {
        let (_dir, path) = image();
        let (a, b, c) = (open(&path), open(&path), open(&path));
        let _first = ImageLock::acquire(&a, true).unwrap();
        let _second = ImageLock::acquire(&b, true).unwrap();
        assert!(matches!(
            ImageLock::acquire(&c, false),
            Err(LockError::Conflict(Conflict {
                holder: Holder::Hakoniwa { writing: false },
                ..
            }))
        ));
    }

    #[test]
    fn a_deferred_lock_holds_nothing_until_taken() {
        let (_dir, path) = image();
        let (a, b) = (open(&path), open(&path));
        let mut deferred = ImageLock::deferred(false);
        assert!(!deferred.is_held());
        let mut other = ImageLock::acquire(&b, false).unwrap();
        assert!(deferred.reacquire(&a).is_err());
        other.release(&b).unwrap();
        deferred.reacquire(&a).unwrap();
        assert!(deferred.is_held());
    }
}
