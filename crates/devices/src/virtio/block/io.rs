//! Disk back ends: where the sectors live.
//!
//! [`FileDisk`] serves a regular file or a host block device with the
//! [`CacheMode`] semantics; [`MemDisk`] keeps the sectors in memory (tests,
//! fuzzing). Requests reach a back end in two ways, always with ranges
//! already checked against the capacity: an I/O engine (`engine`) reads
//! and writes the back end's descriptor ([`DiskBackend::raw_fd`]) with
//! iovecs over guest memory or an aligned bounce buffer, and everything
//! else (discard, write-zeroes, back ends without a descriptor, accesses
//! O_DIRECT cannot take) goes through [`DiskBackend`]'s methods with
//! buffers that are not guest memory.

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::gate::DirectGate;
use super::lock::{ImageLock, LockError};
use super::sticky::StickyFlush;
use super::{BlockConfig, BlockError, CacheMode, SECTOR_SIZE, SERIAL_LEN};

/// Alignment of [`AlignedBuf`]: enough for O_DIRECT on any common device
/// (logical blocks of 512 or 4096 bytes) and a page.
pub const BUF_ALIGN: usize = 4096;

/// A zeroed heap buffer whose start is aligned to [`BUF_ALIGN`], as O_DIRECT
/// needs. Its length is rounded up to a multiple of [`BUF_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Box<[u8]>);
// access goes through &self / &mut self, so moving it to another thread or
// sharing &AlignedBuf is as safe as for a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: see Send: shared access is read-only through &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes (at least one block).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Layout::from_size_align(len, BUF_ALIGN).expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size (at least BUF_ALIGN).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, layout }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to an initialised (zeroed at allocation)
        // allocation of `layout.size()` bytes that lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated by alloc_zeroed with this `layout`
        // and is freed exactly once, here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Storage for a virtio-blk device. Offsets and lengths are in bytes and
/// lie within the capacity the device advertises (the caller checks).
pub trait DiskBackend: Send + Sync {
    /// Fills `buf` from `offset`; bytes past the end of the storage read
    /// as zeroes.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable. Returns whether it synced
    /// (false when the cache mode ignores flushes).
    fn flush(&self) -> io::Result<bool>;
    /// Deallocates a range (a hint: the range may then read as anything).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes a range read as zeroes, deallocating it if `unmap` allows.
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> io::Result<()>;
    /// The descriptor an I/O engine reads and writes with vectored I/O
    /// straight from guest memory; None (the default) for a back end that
    /// must be given copies through `read_at`/`write_at`.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    /// The offset, length and memory alignment the descriptor needs
    /// (O_DIRECT); 1 when anything goes.
    fn direct_alignment(&self) -> u64 {
        1
    }
    /// Whether `flush` does nothing (cache=unsafe), so a FLUSH request
    /// need not reach an engine.
    fn ignores_flush(&self) -> bool {
        false
    }
    /// The sticky flush state an engine's own syncs feed (see
    /// [`super::sticky`]); None for a back end whose flushes cannot fail
    /// that way.
    fn sticky(&self) -> Option<&StickyFlush> {
        None
    }
    /// What an engine's O_DIRECT op holds while in flight, against the
    /// accesses of the buffered descriptor (see [`super::gate`]); None
    /// without one.
    fn direct_gate(&self) -> Option<&DirectGate> {
        None
    }
}

/// A disk image file or host block device.
pub struct FileDisk {
    path: PathBuf,
    /// The image, with O_DIRECT for [`CacheMode::None`].
    file: File,
    /// For [`CacheMode::None`]: the image without O_DIRECT, for the rare
    /// access that is not aligned as O_DIRECT needs (a guest writing single
    /// 512-byte sectors on a 4K-sector host disk).
    buffered: Option<File>,
    /// The offset, length and memory alignment O_DIRECT needs (1 without).
    align: u64,
    /// With O_DIRECT, aligned accesses share this lock and the buffered
    /// ones take it alone: mixing direct and page-cache I/O on the same
    /// blocks concurrently can lose updates, serially it is coherent.
    lock: RwLock<()>,
    cache: CacheMode,
    readonly: bool,
    /// The usable size: the image size rounded down to whole sectors.
    size: u64,
    serial: [u8; SERIAL_LEN],
    /// QEMU-compatible OFD locks on `file` (see [`super::lock`]).
    image_lock: Mutex<ImageLock>,
    /// Whether an earlier sync failed (see [`super::sticky`]).
    sticky: StickyFlush,
    /// The engines' O_DIRECT ops against the buffered accesses of the
    /// queues (see [`super::gate`]).
    gate: DirectGate,
}

/// When [`FileDisk::open_with`] locks the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locking {
    /// At once: the image is refused if another user is in the way.
    Now,
    /// Later, with [`FileDisk::lock_image`]: a migration's destination
    /// takes the image over from a source that may still hold it.
    Deferred,
}

enum Guard<'a> {
    None,
    Shared(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ENODEV)
    )
}

impl FileDisk {
    /// Opens the image of `config`: checks what it is, opens it with the
    /// cache mode's flags, locks it against other VMMs and QEMU (shared
    /// when read-only), and measures it.
    pub fn open(config: &BlockConfig) -> Result<FileDisk, BlockError> {
        FileDisk::open_with(config, Locking::Now)
    }

    /// [`FileDisk::open`], locking now or later.
    pub fn open_with(config: &BlockConfig, locking: Locking) -> Result<FileDisk, BlockError> {
        let path = &config.path;
        let io_err = |what, source| BlockError::Io {
            path: path.clone(),
            what,
            source,
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(BlockError::NotFound(path.clone()))
            }
            Err(e) => return Err(io_err("cannot inspect it", e)),
        };
        let ft = meta.file_type();
        if !ft.is_file() && !ft.is_block_device() {
            let kind = if ft.is_dir() {
                "a directory"
            } else if ft.is_char_device() {
                "a character device"
            } else if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else {
                "not a file"
            };
            return Err(BlockError::NotADisk {
                path: path.clone(),
                kind,
            });
        }

        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(!config.readonly);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let direct = config.cache == CacheMode::None;
        let file = open(direct).map_err(|e| open_error(config, e))?;
        let image_lock = match locking {
            Locking::Now => {
                ImageLock::acquire(&file, config.readonly).map_err(|e| lock_error(path, e))?
            }
            Locking::Deferred => ImageLock::deferred(config.readonly),
        };
        // SEEK_END also measures block devices, whose metadata length is 0.
        let raw_size = (&file)
            .seek(SeekFrom::End(0))
            .map_err(|e| io_err("cannot measure it", e))?;
        let size = raw_size - raw_size % SECTOR_SIZE;
        if size != raw_size {
            tracing::warn!(
                "disk image {}: size {raw_size} is not a multiple of {SECTOR_SIZE}; \
                 the last {} bytes are not visible to the guest",
                path.display(),
                raw_size - size
            );
        }
        let (buffered, align) = if direct {
            let buffered = open(false).map_err(|e| io_err("cannot open it", e))?;
            let align = probe_direct_alignment(&file, raw_size)
                .ok_or_else(|| BlockError::DirectIoUnsupported(path.clone()))?;
            (Some(buffered), align)
        } else {
            (None, 1)
        };
        let serial = match &config.id {
            Some(id) => serial_from(id.as_bytes()),
            None => {
                let dev = if ft.is_block_device() {
                    meta.rdev()
                } else {
                    meta.dev()
                };
                serial_from(format!("{dev:x}{:x}", meta.ino()).as_bytes())
            }
        };
        Ok(FileDisk {
            path: path.clone(),
            file,
            buffered,
            align,
            lock: RwLock::new(()),
            cache: config.cache,
            readonly: config.readonly,
            size,
            serial,
            image_lock: Mutex::new(image_lock),
            sticky: StickyFlush::default(),
            gate: DirectGate::default(),
        })
    }

    /// Takes the image's locks if they are not held (a migration's
    /// destination at the switch-over, a source whose migration failed).
    pub fn lock_image(&self) -> Result<(), BlockError> {
        self.image_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reacquire(&self.file)
            .map_err(|e| lock_error(&self.path, e))
    }

    /// Lets go of the image's locks (a migration's source, once it has
    /// flushed and before the destination may write).
    pub fn unlock_image(&self) -> Result<(), BlockError> {
        self.image_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .release(&self.file)
            .map_err(|e| BlockError::Io {
                path: self.path.clone(),
                what: "cannot unlock it",
                source: e,
            })
    }

    /// Whether this hakoniwa holds the image's locks.
    pub fn is_locked(&self) -> bool {
        self.image_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_held()
    }

    /// The image's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size the guest sees, in bytes (a multiple of 512).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the image is open read-only.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// The cache mode it was opened with.
    pub fn cache(&self) -> CacheMode {
        self.cache
    }

    /// The alignment O_DIRECT accesses need (1 without O_DIRECT).
    pub fn direct_alignment(&self) -> u64 {
        self.align
    }

    /// The GET_ID serial.
    pub fn serial(&self) -> &[u8; SERIAL_LEN] {
        &self.serial
    }

    /// Which descriptor serves an access of `len` bytes at `offset` from
    /// memory at `ptr`, and the lock it needs.
    fn pick(&self, ptr: *const u8, offset: u64, len: usize) -> (&File, Guard<'_>) {
        let Some(buffered) = &self.buffered else {
            return (&self.file, Guard::None);
        };
        let a = self.align;
        if (ptr as u64 | offset | len as u64).is_multiple_of(a) {
            let g = self.lock.read().unwrap_or_else(PoisonError::into_inner);
            (&self.file, Guard::Shared(g))
        } else {
            let g = self.lock.write().unwrap_or_else(PoisonError::into_inner);
            (buffered, Guard::Exclusive(g))
        }
    }

    fn exclusive(&self) -> Guard<'_> {
        if self.buffered.is_some() {
            Guard::Exclusive(self.lock.write().unwrap_or_else(PoisonError::into_inner))
        } else {
            Guard::None
        }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        loop {
            // SAFETY: fallocate only acts on the descriptor we own; it
            // touches no memory of this process.
            let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, len) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn write_zeroes_by_writing(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeroes = AlignedBuf::new(256 * 1024);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeroes.len() as u64) as usize;
            self.write_at(&zeroes[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

impl AsRawFd for FileDisk {
    /// The image's main descriptor (with O_DIRECT for cache=none).
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl DiskBackend for FileDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let pos = offset + done as u64;
            let (file, _guard) = self.pick(rest.as_ptr(), pos, rest.len());
            match file.read_at(rest, pos) {
                Ok(0) => {
                    // Past the end of the file (someone shrank it).
                    rest.fill(0);
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        // A short write (e.g. a full disk) leaves the rest to the next
        // turn, through the buffered descriptor if it became unaligned.
        while done < buf.len() {
            let rest = &buf[done..];
            let pos = offset + done as u64;
            let (file, _guard) = self.pick(rest.as_ptr(), pos, rest.len());
            match file.write_at(rest, pos) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<bool> {
        match self.cache {
            CacheMode::Unsafe => Ok(false),
            // fdatasync acts on the inode: it also covers what went through
            // the buffered descriptor.
            CacheMode::Writeback | CacheMode::None => {
                self.sticky.run(|| self.file.sync_data()).map(|()| true)
            }
        }
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn direct_alignment(&self) -> u64 {
        self.align
    }

    fn ignores_flush(&self) -> bool {
        self.cache == CacheMode::Unsafe
    }

    fn sticky(&self) -> Option<&StickyFlush> {
        Some(&self.sticky)
    }

    fn direct_gate(&self) -> Option<&DirectGate> {
        self.buffered.as_ref().map(|_| &self.gate)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _guard = self.exclusive();
        match self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            // Discard is a hint: a back end that cannot deallocate ignores it.
            Err(e) if is_unsupported(&e) => Ok(()),
            r => r,
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> io::Result<()> {
        {
            let _guard = self.exclusive();
            if unmap {
                // A punched hole reads as zeroes on files and on block
                // devices (which only accept it if they can guarantee that).
                match self.fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                ) {
                    Err(e) if is_unsupported(&e) => {}
                    r => return r,
                }
            }
            match self.fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Err(e) if is_unsupported(&e) => {}
                r => return r,
            }
        }
        self.write_zeroes_by_writing(offset, len)
    }
}

/// Names the reason `open(2)` failed on the image of `config`.
pub(crate) fn open_error(config: &BlockConfig, e: io::Error) -> BlockError {
    let path = config.path.clone();
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY) if !config.readonly => {
            BlockError::NotWritable { path, source: e }
        }
        Some(libc::EINVAL) if config.cache == CacheMode::None => {
            BlockError::DirectIoUnsupported(path)
        }
        Some(libc::ENOENT) => BlockError::NotFound(path),
        _ => BlockError::Io {
            path,
            what: "cannot open it",
            source: e,
        },
    }
}

/// Names why the image of `path` could not be locked.
fn lock_error(path: &Path, e: LockError) -> BlockError {
    match e {
        LockError::Conflict(conflict) => BlockError::Locked {
            path: path.to_path_buf(),
            conflict,
        },
        LockError::Io(source) => BlockError::Io {
            path: path.to_path_buf(),
            what: "cannot lock it",
            source,
        },
    }
}

/// The smallest offset/length alignment O_DIRECT reads on `file` accept
/// (the logical block size underneath), or None if even 4096 fails. An
/// image too small to probe gets the safe 4096.
fn probe_direct_alignment(file: &File, size: u64) -> Option<u64> {
    let mut buf = AlignedBuf::new(BUF_ALIGN);
    for align in [512u64, 1024, 2048, 4096] {
        if size < align {
            return Some(BUF_ALIGN as u64);
        }
        match file.read_at(&mut buf[..align as usize], 0) {
            Ok(_) => return Some(align),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => continue,
            // Some other failure: assume the safest alignment.
            Err(_) => return Some(BUF_ALIGN as u64),
        }
    }
    None
}

/// A serial padded with zeroes (or cut) to 20 bytes.
fn serial_from(bytes: &[u8]) -> [u8; SERIAL_LEN] {
    let mut serial = [0u8; SERIAL_LEN];
    let n = bytes.len().min(SERIAL_LEN);
    serial[..n].copy_from_slice(&bytes[..n]);
    serial
}

/// A disk held in memory (tests and fuzzing).
pub struct MemDisk {
    data: RwLock<Vec<u8>>,
}

impl MemDisk {
    /// A zeroed disk of `size` bytes.
    pub fn new(size: usize) -> MemDisk {
        MemDisk::from_bytes(vec![0; size])
    }

    /// A disk holding `data`.
    pub fn from_bytes(data: Vec<u8>) -> MemDisk {
        MemDisk {
            data: RwLock::new(data),
        }
    }

    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        self.data
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn range(len_total: usize, offset: u64, len: u64) -> io::Result<std::ops::Range<usize>> {
        let start = usize::try_from(offset).ok();
        let end = start.and_then(|s| s.checked_add(usize::try_from(len).ok()?));
        match (start, end) {
            (Some(s), Some(e)) if e <= len_total => Ok(s..e),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut data = self.data.write().unwrap_or_else(PoisonError::into_inner);
        let r = MemDisk::range(data.len(), offset, len)?;
        data[r].fill(0);
        Ok(())
    }
}

impl DiskBackend for MemDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let data = self.data.read().unwrap_or_else(PoisonError::into_inner);
        let r = MemDisk::range(data.len(), offset, buf.len() as u64)?;
        buf.copy_from_slice(&data[r]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut data = self.data.write().unwrap_or_else(PoisonError::into_inner);
        let r = MemDisk::range(data.len(), offset, buf.len() as u64)?;
        data[r].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<bool> {
        Ok(true)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _unmap: bool) -> io::Result<()> {
        self.zero(offset, len)
    }
}
