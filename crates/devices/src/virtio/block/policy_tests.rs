//! What main's werror/rerror, sticky-flush and statistics tests check,
//! on both engines and several queues: host errors that come back from
//! the engine itself (a negative io_uring CQE result, an errno from the
//! threads' preadv/pwritev2/fdatasync), not from `DiskBackend` methods.
//! The errors are real: the descriptor the engines use is `dup2`ed, between
//! requests, onto a read-only or write-only descriptor of the image (EBADF)
//! or onto a pipe (fdatasync: EINVAL). No KVM.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use vm_memory::{Bytes, GuestAddress};

use super::request::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use super::sticky::StickyFlush;
use super::test_support::activate;
use super::tests::{guest_memory, pattern, put_header, r, read_mem, status_at, w, TempImage};
use super::tests::{HDR, STATUS};
use super::*;
use crate::virtio::testing::DriverQueue;
use crate::virtio::VirtioDevice;
use crate::GuestMemoryMmap;

const SIZE: usize = 256 * 1024;
/// Guest data of queue `i`'s requests (region 2 of the test memory).
const QDATA: u64 = 0x20_0000;

/// An image whose engine descriptor can be pointed at a bad one.
struct SwitchDisk {
    _image: TempImage,
    rw: File,
    ro: File,
    wo: File,
    /// /dev/full: every write fails with ENOSPC.
    full: File,
    pipe: [OwnedFd; 2],
    /// What the engines read, write and sync: a dup of one of the above.
    fd: OwnedFd,
    sticky: StickyFlush,
}

impl SwitchDisk {
    fn new() -> SwitchDisk {
        let image = TempImage::new(&pattern(SIZE, 21));
        let open = |read, write| {
            OpenOptions::new()
                .read(read)
                .write(write)
                .open(&image.path)
                .unwrap()
        };
        let (rw, ro, wo) = (open(true, true), open(true, false), open(false, true));
        let full = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the array it is given.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both were just created by pipe and are owned by nobody
        // else.
        let pipe =
            unsafe { [0, 1].map(|i| <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[i])) };
        let fd = rw.try_clone().unwrap().into();
        SwitchDisk {
            _image: image,
            rw,
            ro,
            wo,
            full,
            pipe,
            fd,
            sticky: StickyFlush::default(),
        }
    }

    /// Makes the engines' descriptor `to` from the next request on.
    fn point(&self, to: RawFd) {
        // SAFETY: dup2 replaces the descriptor this disk owns with a copy
        // of another it owns; no memory is involved.
        assert!(unsafe { libc::dup2(to, self.fd.as_raw_fd()) } >= 0);
    }

    fn healthy(&self) {
        self.point(self.rw.as_raw_fd());
    }
    fn read_only(&self) {
        self.point(self.ro.as_raw_fd());
    }
    fn write_only(&self) {
        self.point(self.wo.as_raw_fd());
    }
    fn out_of_space(&self) {
        self.point(self.full.as_raw_fd());
    }
    fn unsyncable(&self) {
        self.point(self.pipe[0].as_raw_fd());
    }

    fn contents(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.rw.read_exact_at(&mut v, offset).unwrap();
        v
    }
}

impl DiskBackend for SwitchDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.rw.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.rw.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<bool> {
        self.sticky.run(|| self.rw.sync_data()).map(|()| true)
    }
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _unmap: bool) -> io::Result<()> {
        Ok(())
    }
    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }
    fn sticky(&self) -> Option<&StickyFlush> {
        Some(&self.sticky)
    }
}

/// A disk of two queues on `engine`, both used by the driver.
struct TwoQueues {
    block: Block,
    disk: Arc<SwitchDisk>,
    mem: GuestMemoryMmap,
    /// The two queues, in order.
    q: Vec<DriverQueue>,
}

impl TwoQueues {
    fn start(engine: EngineKind, options: &str) -> TwoQueues {
        TwoQueues::start_without(engine, options, 0)
    }

    /// [`TwoQueues::start`] with a driver that does not accept the
    /// feature bits in `refused`.
    fn start_without(engine: EngineKind, options: &str, refused: u64) -> TwoQueues {
        let disk = Arc::new(SwitchDisk::new());
        let mut config = BlockConfig::parse(&format!("/switch,num_queues=2{options}")).unwrap();
        config.engine = engine;
        let mut block = Block::from_backend(config, disk.clone(), SIZE as u64, [0; 20]);
        block.set_name("disk7");
        if engine == EngineKind::IoUring && block.engine() != EngineKind::IoUring {
            eprintln!("io_uring refused here: {:?}", block.engine_fallback());
        }
        let mem = guest_memory();
        let features = block.device_features() & !refused;
        let (q, _irq) = activate(&mut block, &mem, &[(0, 64), (0x4000, 64)], features);
        TwoQueues {
            block,
            disk,
            mem,
            q,
        }
    }

    /// Offers a request of `kind` on queue `queue`, slot `slot` (its own
    /// header, data and status byte, the status set to 0xff), and kicks.
    fn request(&mut self, queue: usize, slot: u64, kind: u32, sector: u64) -> u16 {
        let n = queue as u64 * 16 + slot;
        let (hdr, data, status) = (HDR + 16 * n, QDATA + 0x1000 * n, STATUS + n);
        put_header(&self.mem, hdr, kind, sector);
        self.mem.write_obj(0xffu8, GuestAddress(status)).unwrap();
        let descs = match kind {
            VIRTIO_BLK_T_OUT => vec![r(hdr, 16), r(data, 4096), w(status, 1)],
            VIRTIO_BLK_T_IN => vec![r(hdr, 16), w(data, 4096), w(status, 1)],
            _ => vec![r(hdr, 16), w(status, 1)],
        };
        let head = self.q[queue].offer(&descs);
        self.q[queue].kick.write(1).unwrap();
        head
    }

    fn status(&self, queue: usize, slot: u64) -> u8 {
        status_at(&self.mem, STATUS + queue as u64 * 16 + slot)
    }

    /// Offers a request (see [`TwoQueues::request`]), waits until it is
    /// in the used ring, and returns its status.
    fn served(&mut self, queue: usize, slot: u64, kind: u32, sector: u64) -> u8 {
        self.request(queue, slot, kind, sector);
        self.q[queue].wait_used_n(1);
        self.status(queue, slot)
    }

    fn data_addr(queue: usize, slot: u64) -> u64 {
        QDATA + 0x1000 * (queue as u64 * 16 + slot)
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn werror_stop_holds_engine_errors_on_every_queue_and_the_retry_resubmits_them() {
    for engine in [EngineKind::IoUring, EngineKind::Threads] {
        let mut t = TwoQueues::start(engine, ",werror=stop,rerror=report");
        let stops = Arc::new(Mutex::new(Vec::new()));
        let seen = stops.clone();
        t.block
            .errors()
            .set_handler(Arc::new(move |r| seen.lock().unwrap().push(r.to_string())));
        // Writes through a read-only descriptor: EBADF from the engine,
        // one on each queue.
        t.disk.read_only();
        for (queue, sector) in [(0, 8), (1, 16)] {
            let data = pattern(4096, 30 + queue as u8);
            let addr = TwoQueues::data_addr(queue, 0);
            t.mem.write_slice(&data, GuestAddress(addr)).unwrap();
            t.request(queue, 0, VIRTIO_BLK_T_OUT, sector);
        }
        let errors = t.block.errors();
        wait_for("both writes held", || errors.held() == 2);
        // The VM was stopped once, naming the disk and the errno.
        assert_eq!(
            *stops.lock().unwrap(),
            ["disk disk7: write failed: EBADF (Bad file descriptor)"],
            "{engine}"
        );
        std::thread::sleep(Duration::from_millis(30));
        for queue in 0..2 {
            assert_eq!(t.q[queue].used_idx(), 0, "{engine}: held, not answered");
            assert_eq!(t.status(queue, 0), 0xff, "{engine}: status untouched");
        }
        let err = t.block.pause().unwrap_err().to_string();
        assert!(err.contains("2 requests are held"), "{engine}: {err}");
        t.block.resume().unwrap();

        // rerror=report: a read the engine fails is the guest's I/O error.
        t.disk.write_only();
        t.request(1, 1, VIRTIO_BLK_T_IN, 0);
        assert_eq!(t.q[1].wait_used_n(1)[0].1, 1, "{engine}");
        assert_eq!(t.status(1, 1), VIRTIO_BLK_S_IOERR, "{engine}");
        assert_eq!(errors.held(), 2);

        // Fixed and resumed: each write completes on its own queue, once.
        t.disk.healthy();
        errors.retry();
        for (queue, sector) in [(0usize, 8u64), (1, 16)] {
            assert_eq!(t.q[queue].wait_used_n(1)[0].1, 1, "{engine}");
            assert_eq!(t.status(queue, 0), VIRTIO_BLK_S_OK, "{engine}");
            let on_disk = t.disk.contents(sector * 512, 4096);
            assert!(on_disk == pattern(4096, 30 + queue as u8), "{engine}");
        }
        assert_eq!((errors.held(), errors.reason()), (0, None));
        assert_eq!(stops.lock().unwrap().len(), 1);

        // Counted once each, as completed when they were: the held writes
        // as two good writes, the read as a failure; nothing in flight.
        let stats = t.block.stats();
        wait_for("the statistics", || stats.snapshot().ops() == 3);
        let c = stats.snapshot();
        let (write, read) = (c.kind(RequestKind::Write), c.kind(RequestKind::Read));
        assert_eq!(
            (write.ops, write.bytes, write.failed),
            (2, 8192, 0),
            "{engine}"
        );
        assert_eq!((read.ops, read.failed), (1, 1), "{engine}");
        assert_eq!(c.in_flight, 0, "{engine}");
        assert!(c.max_queue_depth >= 2, "{engine}: {}", c.max_queue_depth);
        t.block.reset();
    }
}

#[test]
fn a_failed_fsync_in_either_engine_fails_every_later_flush_on_every_queue() {
    for engine in [EngineKind::IoUring, EngineKind::Threads] {
        let mut t = TwoQueues::start(engine, "");
        assert_eq!(
            t.served(0, 0, VIRTIO_BLK_T_FLUSH, 0),
            VIRTIO_BLK_S_OK,
            "{engine}"
        );
        // fdatasync of a pipe fails (EINVAL), whoever runs it.
        t.disk.unsyncable();
        assert_eq!(
            t.served(0, 1, VIRTIO_BLK_T_FLUSH, 0),
            VIRTIO_BLK_S_IOERR,
            "{engine}"
        );
        // Healthy again, as Linux reports after a writeback error: the
        // flush still fails, on the other queue too, without syncing.
        t.disk.healthy();
        assert_eq!(
            t.served(1, 0, VIRTIO_BLK_T_FLUSH, 0),
            VIRTIO_BLK_S_IOERR,
            "{engine}"
        );
        // Counted in the disk's statistics: the good sync, the failed
        // one, the refused flush.
        assert_eq!(
            t.block.stats().snapshot().syncs,
            SyncCounters {
                ops: 2,
                failed: 1,
                refused: 1
            },
            "{engine}"
        );
        // Writes still work: only flushes are refused.
        assert_eq!(
            t.served(1, 1, VIRTIO_BLK_T_OUT, 0),
            VIRTIO_BLK_S_OK,
            "{engine}"
        );
        t.block.reset();
    }
}

#[test]
fn a_failed_write_through_write_is_a_failed_sync_on_either_engine() {
    for engine in [EngineKind::IoUring, EngineKind::Threads] {
        // Without FLUSH every write goes with RWF_DSYNC: its own sync.
        let mut t = TwoQueues::start_without(engine, "", 1 << VIRTIO_BLK_F_FLUSH);
        assert_eq!(
            t.served(0, 0, VIRTIO_BLK_T_OUT, 0),
            VIRTIO_BLK_S_OK,
            "{engine}"
        );
        assert!(!t.disk.sticky.is_failed(), "{engine}");
        // The engine's write fails (EBADF through a read-only
        // descriptor): whether the write or its sync failed cannot be
        // told, so it is a failed sync, as a failed fdatasync.
        t.disk.read_only();
        assert_eq!(
            t.served(0, 1, VIRTIO_BLK_T_OUT, 8),
            VIRTIO_BLK_S_IOERR,
            "{engine}"
        );
        assert!(t.disk.sticky.is_failed(), "{engine}: not sticky");
        // Healthy again: the next write-through write, on the other
        // queue, fails too, without reaching the image.
        t.disk.healthy();
        let data = pattern(4096, 40);
        t.mem
            .write_slice(&data, GuestAddress(TwoQueues::data_addr(1, 0)))
            .unwrap();
        assert_eq!(
            t.served(1, 0, VIRTIO_BLK_T_OUT, 16),
            VIRTIO_BLK_S_IOERR,
            "{engine}"
        );
        let image = pattern(SIZE, 21);
        let on_disk = t.disk.contents(16 * 512, 4096);
        assert!(on_disk == image[16 * 512..16 * 512 + 4096], "{engine}");
        // Reads still work: only what syncs is refused.
        assert_eq!(
            t.served(1, 1, VIRTIO_BLK_T_IN, 0),
            VIRTIO_BLK_S_OK,
            "{engine}"
        );
        // The good write's sync, the failed one, the refused one.
        assert_eq!(
            t.block.stats().snapshot().syncs,
            SyncCounters {
                ops: 2,
                failed: 1,
                refused: 1
            },
            "{engine}"
        );
        t.block.reset();
    }
}

#[test]
fn a_write_through_write_out_of_space_stays_retryable() {
    // io_uring only: /dev/full gives ENOSPC there, while the threads'
    // pwritev2 with RWF_DSYNC on a device without write_iter fails with
    // EOPNOTSUPP before writing (an I/O error, rightly sticky). The
    // decision is the engines' common completion (request.rs), so one
    // engine covers it.
    let engine = EngineKind::IoUring;
    let mut t = TwoQueues::start_without(engine, "", 1 << VIRTIO_BLK_F_FLUSH);
    // ENOSPC comes from the write itself (file systems reserve blocks
    // when it is made): nothing durable was lost, so the flush state
    // stays healthy and the same write succeeds once there is room.
    t.disk.out_of_space();
    let data = pattern(4096, 41);
    t.mem
        .write_slice(&data, GuestAddress(TwoQueues::data_addr(0, 0)))
        .unwrap();
    assert_eq!(
        t.served(0, 0, VIRTIO_BLK_T_OUT, 8),
        VIRTIO_BLK_S_IOERR,
        "{engine}"
    );
    assert!(
        !t.disk.sticky.is_failed(),
        "{engine}: ENOSPC made it sticky"
    );
    t.disk.healthy();
    t.mem
        .write_slice(&data, GuestAddress(TwoQueues::data_addr(0, 1)))
        .unwrap();
    assert_eq!(
        t.served(0, 1, VIRTIO_BLK_T_OUT, 8),
        VIRTIO_BLK_S_OK,
        "{engine}"
    );
    assert!(t.disk.contents(8 * 512, 4096) == data, "{engine}");
    let syncs = t.block.stats().snapshot().syncs;
    assert_eq!((syncs.failed, syncs.refused), (0, 0), "{engine}");
    t.block.reset();
}

#[test]
fn many_requests_in_flight_on_two_queues_are_each_counted_once() {
    for engine in [EngineKind::IoUring, EngineKind::Threads] {
        let mut t = TwoQueues::start(engine, "");
        let stats = t.block.stats();
        // Eight reads on each queue before either thread is kicked.
        for queue in 0..2 {
            for slot in 0..8 {
                let n = queue as u64 * 16 + slot;
                put_header(&t.mem, HDR + 16 * n, VIRTIO_BLK_T_IN, 8 * n);
                t.q[queue].offer(&[
                    r(HDR + 16 * n, 16),
                    w(QDATA + 0x1000 * n, 4096),
                    w(STATUS + n, 1),
                ]);
            }
        }
        for q in &t.q {
            q.kick.write(1).unwrap();
        }
        for queue in 0..2 {
            assert_eq!(t.q[queue].wait_used_n(8).len(), 8, "{engine}");
        }
        let image = pattern(SIZE, 21);
        for n in [0u64, 7, 16, 23] {
            let got = read_mem(&t.mem, QDATA + 0x1000 * n, 4096);
            let at = (8 * n * 512) as usize;
            assert!(got == image[at..at + 4096], "{engine}: request {n}");
        }
        wait_for("the statistics", || stats.snapshot().ops() == 16);
        let c = stats.snapshot();
        let read = c.kind(RequestKind::Read);
        assert_eq!((read.ops, read.bytes), (16, 16 * 4096), "{engine}");
        assert_eq!(c.in_flight, 0, "{engine}");
        // Each queue took its eight at once: at least that many were in
        // flight together, and never more than all sixteen.
        assert!(
            (8..=16).contains(&c.max_queue_depth),
            "{engine}: {}",
            c.max_queue_depth
        );
        for s in &c.stages {
            assert_eq!((s.count, s.histogram.count()), (16, 16), "{engine}: {s:?}");
        }
        t.block.reset();
        assert_eq!(stats.snapshot().in_flight, 0);
    }
}
