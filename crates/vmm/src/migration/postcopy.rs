//! The destination's postcopy: guest RAM registered with userfaultfd, a
//! fault thread that asks the source for missing pages, and placement of
//! the pages that arrive (demanded, prefetched or pushed) with
//! UFFDIO_COPY, which also wakes whoever waits for them.
//!
//! Faults reach us from three kinds of threads, told apart by the thread
//! id userfaultfd reports: a vCPU thread (the vCPU waits: the guest runs
//! nothing on it meanwhile), one of KVM's async page-fault workers (the
//! guest was told "page not present" and runs another task: the para-
//! virtualized page fault of seed 003), or one of our own device threads.
//! The time vCPUs wait gives the guest's run-time fraction. A guest that
//! has not enabled async page faults (`--async-pf off`, `no-kvmapf`) still
//! sees its faults taken by KVM's worker, but KVM parks the vCPU in an
//! "artificial halt" until the page is there (only interrupts get in): such
//! a fault is the vCPU's wait too.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use userfaultfd::{Event, FeatureFlags, RegisterMode, Uffd, UffdBuilder};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::history::{PageHistory, WrongPage};
use super::link::Stream;
use super::pages::{PageBitmap, RamLayout};
use super::protocol::{write_message, Message, PageKind, PAGE_SIZE};
use super::status::{RunFraction, SharedStatus};
use super::MigrationError;
use crate::snapshot::state::MsrValue;

/// Width of one window of the run-time fraction.
const RUN_WINDOW: Duration = Duration::from_millis(100);

/// Who took a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Faulter {
    Vcpu(usize),
    AsyncWorker,
    Vmm,
}

/// A fault waiting for its page.
struct Pending {
    since: Instant,
    /// vCPUs that wait for it: each vCPU thread that faulted on it, and,
    /// in a guest without async page faults, each async worker's fault
    /// (its vCPU is halted meanwhile).
    stalled: usize,
}

/// Whether a fault taken by `faulter` stops a vCPU until the page is here.
/// An async worker's fault does only when the guest cannot be told "page
/// not present" (`guest_async_pf` false): KVM then halts the vCPU instead.
fn stalls_vcpu(faulter: Faulter, guest_async_pf: bool) -> bool {
    match faulter {
        Faulter::Vcpu(_) => true,
        Faulter::AsyncWorker => !guest_async_pf,
        Faulter::Vmm => false,
    }
}

/// MSR_KVM_ASYNC_PF_EN, and the bits KVM (Linux >= 5.8) needs set in it
/// to deliver async page faults: enabled, "page ready" as an interrupt.
const MSR_KVM_ASYNC_PF_EN: u32 = 0x4b56_4d02;
const ASYNC_PF_ON: u64 = 1 | (1 << 3);

/// Whether the guest enabled async page faults on every vCPU, from the
/// vCPUs' MSRs in the migrated state.
pub fn guest_async_pf(vcpu_msrs: &[&[MsrValue]]) -> bool {
    !vcpu_msrs.is_empty()
        && vcpu_msrs.iter().all(|msrs| {
            msrs.iter()
                .any(|m| m.index == MSR_KVM_ASYNC_PF_EN && m.data & ASYNC_PF_ON == ASYNC_PF_ON)
        })
}

/// What the fault thread and the page placement share.
pub struct PostcopyShared {
    layout: RamLayout,
    /// How each page arrived; the source's checksums (`--verify-pages`).
    history: Arc<PageHistory>,
    uffd: Uffd,
    /// Pages in place.
    pub received: PageBitmap,
    /// Pages asked for (a request is on its way or answered).
    requested: PageBitmap,
    pending: Mutex<HashMap<usize, Pending>>,
    /// Requests go out on the connection's writing half; `None` while the
    /// connection is down (the requests are made again on resume).
    writer: Mutex<Option<Stream>>,
    status: Arc<SharedStatus>,
    /// When the vCPUs started, and the time they waited per window.
    run_start: Mutex<Option<Instant>>,
    blocked_ns: Mutex<Vec<u64>>,
    vcpus: usize,
    faulters: Mutex<HashMap<i32, Faulter>>,
    /// The guest has async page faults enabled (set from the migrated
    /// state before the fault thread starts).
    guest_async_pf: AtomicBool,
}

impl PostcopyShared {
    /// Registers RAM with a new userfaultfd (missing-page mode); `received`
    /// says which pages are already in place (precopy rounds of a hybrid).
    pub fn register(
        history: Arc<PageHistory>,
        received: PageBitmap,
        writer: Stream,
        status: Arc<SharedStatus>,
        vcpus: usize,
    ) -> Result<Arc<PostcopyShared>, MigrationError> {
        let layout = history.layout().clone();
        // Kernel-mode faults must reach us: KVM faults on guest RAM on the
        // vCPU's behalf, in the kernel (hence not user_mode_only).
        let uffd = UffdBuilder::new()
            .close_on_exec(true)
            .non_blocking(true)
            .user_mode_only(false)
            .require_features(FeatureFlags::THREAD_ID)
            .create()
            .map_err(|e| {
                MigrationError::Uffd(format!(
                    "cannot create one (root, or access to /dev/userfaultfd, is needed): {e}"
                ))
            })?;
        for (host, len) in layout.host_ranges() {
            uffd.register_with_mode(host as *mut libc::c_void, len, RegisterMode::MISSING)
                .map_err(|e| MigrationError::Uffd(format!("register guest RAM: {e}")))?;
        }
        let pages = layout.pages();
        Ok(Arc::new(PostcopyShared {
            layout,
            history,
            uffd,
            received,
            requested: PageBitmap::new(pages),
            pending: Mutex::new(HashMap::new()),
            writer: Mutex::new(Some(writer)),
            status,
            run_start: Mutex::new(None),
            blocked_ns: Mutex::new(Vec::new()),
            vcpus: vcpus.max(1),
            faulters: Mutex::new(HashMap::new()),
            guest_async_pf: AtomicBool::new(true),
        }))
    }

    /// Whether the guest takes async page faults (`guest_async_pf` of its
    /// vCPUs' MSRs): without, an async worker's fault halts a vCPU.
    pub fn set_guest_async_pf(&self, enabled: bool) {
        self.guest_async_pf.store(enabled, Ordering::SeqCst);
    }

    /// The vCPUs run from now: the run-time fraction counts from here.
    pub fn vcpus_started(&self) {
        *self.run_start.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Puts a run of pages from the source in place (skipping any that
    /// are already there), waking the threads that wait for them. `None`:
    /// the run is zero pages (see `place_zeros`).
    pub fn place(
        &self,
        kind: PageKind,
        first: u64,
        data: Option<&[u8]>,
        count: usize,
    ) -> Result<(), MigrationError> {
        let Some(data) = data else {
            return self.place_zeros(kind, first, count);
        };
        let mut k = 0;
        while k < count {
            let index = self.index_of(first + k as u64)?;
            if self.received.get(index) {
                k += 1;
                continue;
            }
            // A run of missing pages contiguous in our mapping.
            let mut n = 1;
            while k + n < count {
                let next = self.index_of(first + (k + n) as u64)?;
                if next != index + n
                    || self.received.get(next)
                    || self.layout.host_of_index(next)
                        != self.layout.host_of_index(index) + n * PAGE_SIZE
                {
                    break;
                }
                n += 1;
            }
            let run = &data[k * PAGE_SIZE..(k + n) * PAGE_SIZE];
            self.verify(kind, index, n, Some(run))?;
            self.copy_in(index, n, Some(run)).map_err(|e| {
                MigrationError::Uffd(format!("placing page {:#x}: {e}", first + k as u64))
            })?;
            for i in index..index + n {
                self.received.set(i);
            }
            self.history.arrived(kind, index, n, false);
            self.status.update(|s| s.pages.add(kind, n as u64));
            self.resolve(index, n);
            k += n;
        }
        Ok(())
    }

    /// Zero pages from the source are only marked as here: such a page
    /// stays missing until something touches it, and then `fault` fills
    /// it with zeros — a page of its own, as a fresh page on the source
    /// would be; untouched ones cost no memory, and after the migration
    /// they read as zero like any untouched anonymous memory. Pages a
    /// fault already waits for are filled now.
    ///
    /// Why not map the kernel's shared zero page (UFFDIO_ZEROPAGE, as
    /// QEMU does): every later guest write to such a page is then a
    /// copy-on-write under a live KVM mapping, and under the test rig's
    /// emulated nested SVM the guest went on reading the old zero frame
    /// after that: a 1 GiB guest migrated with 400 MiB of data
    /// triple-faulted in 3 runs of 4, and in 0 of 2 once zero pages were
    /// filled with UFFDIO_COPY (docs/migration.md).
    fn place_zeros(&self, kind: PageKind, first: u64, count: usize) -> Result<(), MigrationError> {
        let mut waited = Vec::new();
        let mut marked = 0u64;
        {
            // Under the lock `fault` holds while it checks `received`:
            // either it saw the page marked and fills it itself, or its
            // entry is in `pending` here and the page is filled below.
            let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            for k in 0..count {
                let index = self.index_of(first + k as u64)?;
                if self.received.get(index) {
                    continue;
                }
                self.verify(kind, index, 1, None)?;
                self.received.set(index);
                self.history.arrived(kind, index, 1, true);
                marked += 1;
                if pending.contains_key(&index) {
                    waited.push(index);
                }
            }
        }
        self.status.update(|s| {
            s.pages.add(kind, marked);
            s.pages.zero += marked;
        });
        for index in waited {
            self.copy_in(index, 1, None).map_err(|e| {
                MigrationError::Uffd(format!(
                    "placing zero page {:#x}: {e}",
                    self.layout.page_of_index(index)
                ))
            })?;
            self.resolve(index, 1);
        }
        Ok(())
    }

    /// UFFDIO_COPY of `n` pages at `index` from `bytes` (`None`: one page
    /// of zeros), waking their waiters. A page already in place (EEXIST) is
    /// left as it is, and the rest of the run is placed page by page around
    /// it: the kernel stops a copy at the first present page, reporting
    /// only EEXIST when that is the run's first. For a page of zeros that
    /// is expected (the fault thread fills a touched zero page, which may
    /// have arrived); a page of data from the source should never find its
    /// place taken, and each one that does is counted in the report
    /// (`pages.already_present`).
    fn copy_in(
        &self,
        index: usize,
        n: usize,
        bytes: Option<&[u8]>,
    ) -> Result<(), userfaultfd::Error> {
        static ZEROS: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
        debug_assert!(bytes.is_some() || n == 1, "zeros go one page at a time");
        let src_of = |at: usize, pages: usize| match bytes {
            Some(bytes) => {
                let off = (at - index) * PAGE_SIZE;
                &bytes[off..off + pages * PAGE_SIZE]
            }
            None => &ZEROS[..],
        };
        let copy = |at: usize, pages: usize| {
            let dst = self.layout.host_of_index(at) as *mut libc::c_void;
            let src = src_of(at, pages);
            debug_assert_eq!(src.len(), pages * PAGE_SIZE);
            // SAFETY: `dst` is `pages` pages of guest RAM registered with
            // this userfaultfd (the layout comes from the VM's memory,
            // alive while the VM is); `src` is as many bytes of our buffer
            // (one page of zeros only ever for one page: `n` is 1 without
            // `bytes`). UFFDIO_COPY fails rather than overwrite a present
            // page.
            unsafe {
                self.uffd
                    .copy(src.as_ptr().cast(), dst, pages * PAGE_SIZE, true)
            }
        };
        let mut at = index;
        while at < index + n {
            match copy(at, index + n - at) {
                Ok(_) => break,
                // Copied up to a page that stopped it; go on from there.
                Err(userfaultfd::Error::PartiallyCopied(bytes)) if bytes >= PAGE_SIZE => {
                    at += bytes / PAGE_SIZE;
                }
                // The page at `at` is present: leave it, wake whoever
                // waits for it, and go on after it.
                Err(e) if is_exists(&e) => {
                    if bytes.is_some() {
                        self.status.update(|s| s.pages.already_present += 1);
                    }
                    let dst = self.layout.host_of_index(at) as *mut libc::c_void;
                    let _ = self.uffd.wake(dst, PAGE_SIZE);
                    at += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `--verify-pages`: checks `n` pages at `index` about to be placed
    /// from `bytes` (`None`: one page of zeros) against the source's
    /// checksums. A difference stops the migration before the page is
    /// placed: the guest never sees it.
    fn verify(
        &self,
        kind: PageKind,
        index: usize,
        n: usize,
        bytes: Option<&[u8]>,
    ) -> Result<(), MigrationError> {
        if !self.history.verifying() {
            return Ok(());
        }
        let wrong: Vec<WrongPage> = (0..n)
            .filter_map(|k| {
                let page = bytes.map(|b| &b[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]);
                self.history.check(index + k, Some(kind), page).err()
            })
            .collect();
        super::destination::record_wrong(&self.status, n as u64, &wrong);
        match wrong.first() {
            None => Ok(()),
            Some(first) => Err(MigrationError::WrongPages(format!(
                "a page from the source differs from the source's checksum: {first}"
            ))),
        }
    }

    /// Records the faults that waited for pages `index..index+n`.
    fn resolve(&self, index: usize, n: usize) {
        let now = Instant::now();
        let mut resolved = Vec::new();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            for i in index..index + n {
                if let Some(p) = pending.remove(&i) {
                    resolved.push(p);
                }
            }
        }
        if resolved.is_empty() {
            return;
        }
        let start = *self.run_start.lock().unwrap_or_else(|e| e.into_inner());
        let mut blocked = self.blocked_ns.lock().unwrap_or_else(|e| e.into_inner());
        self.status.update(|s| {
            for p in &resolved {
                s.fault_latency.record((now - p.since).as_micros() as u64);
                if let Some(start) = start {
                    for _ in 0..p.stalled {
                        add_blocked(&mut blocked, start, p.since.max(start), now);
                    }
                }
            }
        });
    }

    fn index_of(&self, page: u64) -> Result<usize, MigrationError> {
        self.layout.index_of_page(page).ok_or_else(|| {
            MigrationError::Stream(super::protocol::StreamError::Corrupt(format!(
                "page {page:#x} is not RAM"
            )))
        })
    }

    /// Handles one fault: a page not yet here is asked for (once).
    fn fault(&self, address: usize, tid: i32) -> Result<(), MigrationError> {
        let Some(index) = self.layout.index_of_host(address) else {
            return Err(MigrationError::Uffd(format!(
                "a fault at {address:#x}, outside guest RAM"
            )));
        };
        let faulter = self.faulter(tid);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if self.received.get(index) {
            drop(pending);
            // Here already — or known to be zero but never backed (sent
            // as zero, by a precopy round or in postcopy): fill it with
            // zeros, which fails harmlessly on a page that is present,
            // and wake.
            self.copy_in(index, 1, None)
                .map_err(|e| MigrationError::Uffd(format!("zero page: {e}")))?;
            self.status.update(|s| s.faults.minor += 1);
            return Ok(());
        }
        let entry = pending.entry(index).or_insert_with(|| Pending {
            since: Instant::now(),
            stalled: 0,
        });
        if stalls_vcpu(faulter, self.guest_async_pf.load(Ordering::SeqCst)) {
            entry.stalled += 1;
        }
        drop(pending);
        let double = self.requested.set(index);
        self.status.update(|s| {
            match faulter {
                Faulter::Vcpu(_) => s.faults.vcpu += 1,
                Faulter::AsyncWorker => s.faults.async_worker += 1,
                Faulter::Vmm => s.faults.vmm += 1,
            }
            if double {
                s.faults.double += 1;
            } else {
                s.faults.major += 1;
                s.requests += 1;
            }
        });
        if !double {
            self.request(index)?;
        }
        Ok(())
    }

    fn request(&self, index: usize) -> Result<(), MigrationError> {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stream) = writer.as_mut() {
            let message = Message::Request {
                first: self.layout.page_of_index(index),
                count: 1,
            };
            if let Err(e) = write_message(stream, &message) {
                // The page reader notices the broken connection too and
                // pauses; the request is made again on resume.
                tracing::warn!("postcopy request: {e}");
                *writer = None;
            }
        }
        Ok(())
    }

    /// A new connection after a drop: requests go there, and every page
    /// asked for but not yet here is asked for again.
    pub fn reconnected(&self, writer: Stream) -> Result<(), MigrationError> {
        *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
        let waiting: Vec<usize> = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        for index in waiting {
            self.request(index)?;
        }
        Ok(())
    }

    pub fn disconnected(&self) {
        *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Sends a frame on the connection (Running, Complete).
    pub fn send(&self, message: &Message) -> Result<(), MigrationError> {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        match writer.as_mut() {
            Some(stream) => write_message(stream, message)
                .map(|_| ())
                .map_err(Into::into),
            None => Err(MigrationError::Invalid("the connection is down".into())),
        }
    }

    /// Thread id → vCPU, async worker or VMM thread.
    fn faulter(&self, tid: i32) -> Faulter {
        let mut known = self.faulters.lock().unwrap_or_else(|e| e.into_inner());
        *known.entry(tid).or_insert_with(|| {
            match std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")) {
                // Not one of our threads: a kernel worker doing the fault
                // for KVM's async page fault.
                Err(_) => Faulter::AsyncWorker,
                Ok(name) => match name
                    .trim()
                    .strip_prefix("vcpu")
                    .and_then(|n| n.parse().ok())
                {
                    Some(n) => Faulter::Vcpu(n),
                    None => Faulter::Vmm,
                },
            }
        })
    }

    /// The run-time fraction per window so far.
    pub fn run_fraction(&self) -> Vec<RunFraction> {
        let blocked = self.blocked_ns.lock().unwrap_or_else(|e| e.into_inner());
        let window = RUN_WINDOW.as_nanos() as f64 * self.vcpus as f64;
        blocked
            .iter()
            .enumerate()
            .map(|(i, &ns)| RunFraction {
                t_ms: (i as u64) * RUN_WINDOW.as_millis() as u64,
                fraction: (1.0 - ns as f64 / window).clamp(0.0, 1.0),
            })
            .collect()
    }

    /// Every page is here: faults cannot happen any more, so RAM goes back
    /// to plain memory (the balloon's MADV_DONTNEED must not fault to a
    /// handler that is gone).
    pub fn unregister(&self) {
        for (host, len) in self.layout.host_ranges() {
            if let Err(e) = self.uffd.unregister(host as *mut libc::c_void, len) {
                tracing::warn!("userfaultfd unregister: {e}");
            }
        }
    }

    /// Every page is here and RAM is plain memory again: it may have
    /// transparent huge pages (khugepaged collapses the 4 KiB pages
    /// placed so far), as QEMU's RAM after postcopy.
    pub fn allow_huge_pages(&self) {
        crate::memory::backing::advise_huge_pages(self.layout.host_ranges());
    }

    pub fn all_received(&self) -> bool {
        self.missing() == 0
    }

    /// Pages not here yet.
    pub fn missing(&self) -> usize {
        self.layout.pages() - self.received.count()
    }
}

/// Adds the time from `from` to `to` into 100 ms windows counted from
/// `start`.
fn add_blocked(windows: &mut Vec<u64>, start: Instant, from: Instant, to: Instant) {
    let window = RUN_WINDOW.as_nanos() as u64;
    let mut a = (from - start).as_nanos() as u64;
    let b = (to.max(from) - start).as_nanos() as u64;
    while a < b {
        let w = (a / window) as usize;
        let end = ((w as u64 + 1) * window).min(b);
        if windows.len() <= w {
            windows.resize(w + 1, 0);
        }
        windows[w] += end - a;
        a = end;
    }
}

fn is_exists(e: &userfaultfd::Error) -> bool {
    matches!(e, userfaultfd::Error::CopyFailed(errno) | userfaultfd::Error::ZeropageFailed(errno) if *errno as i32 == libc::EEXIST)
}

/// The fault thread; stops and joins when dropped.
pub struct FaultThread {
    stop: EventFd,
    stopped: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FaultThread {
    pub fn spawn(shared: Arc<PostcopyShared>) -> Result<FaultThread, MigrationError> {
        let stop = EventFd::new(EFD_NONBLOCK).map_err(|e| MigrationError::Uffd(e.to_string()))?;
        let stop_fd = stop
            .try_clone()
            .map_err(|e| MigrationError::Uffd(e.to_string()))?;
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let thread = std::thread::Builder::new()
            .name("postcopy-faults".into())
            .spawn(move || {
                sandbox::enter_or_exit(sandbox::ThreadKind::PostcopyFaults);
                if let Err(e) = serve_faults(&shared, &stop_fd) {
                    say!("hakoniwa: postcopy fault handler: {e}");
                }
                flag.store(true, Ordering::SeqCst);
            })
            .map_err(|e| MigrationError::Uffd(format!("cannot start the fault thread: {e}")))?;
        Ok(FaultThread {
            stop,
            stopped,
            thread: Some(thread),
        })
    }

    pub fn is_running(&self) -> bool {
        !self.stopped.load(Ordering::SeqCst)
    }
}

impl Drop for FaultThread {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_faults(shared: &PostcopyShared, stop: &EventFd) -> Result<(), MigrationError> {
    let mut fds = [
        libc::pollfd {
            fd: shared.uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfds for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(MigrationError::Uffd(format!("poll: {e}")));
        }
        if fds[1].revents != 0 {
            return Ok(());
        }
        loop {
            match shared.uffd.read_event() {
                Ok(Some(Event::Pagefault {
                    addr, thread_id, ..
                })) => {
                    shared.fault(addr as usize, thread_id.as_raw())?;
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => return Err(MigrationError::Uffd(format!("read: {e}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::status::MigrationStatus;
    use crate::migration::MigrationMode;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    /// A run of pages from the source whose first page is already present
    /// on the destination: that page is left alone and counted, and every
    /// other page of the run is written (the kernel reports a run's first
    /// present page as EEXIST and copies nothing after it).
    #[test]
    fn a_run_with_a_present_page_is_placed_around_it() {
        let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 8 * PAGE_SIZE)]).unwrap();
        let layout = RamLayout::new(&memory);
        let byte_of = |i: usize| layout.host_of_index(i) as *mut u8;
        // SAFETY: the first byte of a page of `memory`, alive for the test.
        unsafe { *byte_of(1) = 0xee };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let writer =
            Stream::from(std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        let status = Arc::new(SharedStatus::new(MigrationStatus::new(
            "destination",
            MigrationMode::Postcopy,
            String::new(),
            8,
        )));
        let received = PageBitmap::new(layout.pages());
        let history = Arc::new(PageHistory::new(layout.clone()));
        let shared =
            match PostcopyShared::register(history.clone(), received, writer, status.clone(), 1) {
                Ok(shared) => shared,
                Err(e) => {
                    // userfaultfd with kernel faults needs root (or
                    // /dev/userfaultfd); CI runs as root.
                    eprintln!("skipped: {e}");
                    return;
                }
            };
        let data = vec![0xabu8; 4 * PAGE_SIZE];
        // Pages 1..5 as one run (its first page is the present one), and
        // a lone page 6.
        shared
            .place(PageKind::Background, 1, Some(&data), 4)
            .unwrap();
        shared
            .place(PageKind::Background, 6, Some(&data[..PAGE_SIZE]), 1)
            .unwrap();
        shared.unregister();
        // SAFETY: as above; the pages are no longer registered, so a page
        // never placed reads as zero instead of waiting for a fault.
        let first_bytes: Vec<u8> = (0..8).map(|i| unsafe { *byte_of(i) }).collect();
        assert_eq!(first_bytes, [0, 0xee, 0xab, 0xab, 0xab, 0, 0xab, 0]);
        assert_eq!(status.get().pages.already_present, 1);
        assert_eq!(status.get().pages.background, 5);
        assert_eq!(history.record(6).unwrap().arrived, "background");
        assert_eq!(history.record(0).unwrap().arrived, "never");
    }

    #[test]
    fn an_async_workers_fault_stalls_a_vcpu_only_without_guest_async_pf() {
        assert!(stalls_vcpu(Faulter::Vcpu(0), true));
        assert!(stalls_vcpu(Faulter::Vcpu(1), false));
        // The guest was told "page not present" and runs another task.
        assert!(!stalls_vcpu(Faulter::AsyncWorker, true));
        // KVM's artificial halt: the vCPU waits for the worker's page.
        assert!(stalls_vcpu(Faulter::AsyncWorker, false));
        assert!(!stalls_vcpu(Faulter::Vmm, false));
    }

    #[test]
    fn guest_async_pf_is_read_from_every_vcpus_msr() {
        let msr = |data| MsrValue {
            index: MSR_KVM_ASYNC_PF_EN,
            data,
        };
        let other = MsrValue {
            index: 0x10,
            data: 9,
        };
        // Linux >= 5.8: enabled, delivered as an interrupt, send always.
        let on = [other, msr(0x2000_0000 | 0b1011)];
        let off = [other, msr(0)];
        assert!(guest_async_pf(&[&on]));
        assert!(guest_async_pf(&[&on, &on]));
        assert!(!guest_async_pf(&[&on, &off]));
        assert!(!guest_async_pf(&[&off]));
        // Enabled without interrupt delivery: KVM >= 5.8 delivers nothing.
        assert!(!guest_async_pf(&[&[msr(1)]]));
        // No such MSR in the state.
        assert!(!guest_async_pf(&[&[other]]));
        assert!(!guest_async_pf(&[]));
    }

    #[test]
    fn blocked_time_is_split_into_windows() {
        let start = Instant::now();
        let mut w = Vec::new();
        add_blocked(
            &mut w,
            start,
            start + Duration::from_millis(50),
            start + Duration::from_millis(250),
        );
        assert_eq!(w.len(), 3);
        assert_eq!(w[0], 50_000_000);
        assert_eq!(w[1], 100_000_000);
        assert_eq!(w[2], 50_000_000);
    }
}
