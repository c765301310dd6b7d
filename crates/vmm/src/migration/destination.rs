//! The destination side (`run --incoming tcp:ADDR:PORT`): wait for the
//! source, check that its machine is this one before anything runs, take
//! precopy pages into RAM, and either the whole state (precopy) or the
//! switch to postcopy: drop the pages the source says changed, register
//! RAM with userfaultfd and fetch what is missing as the guest touches it.
//!
//! Until a connection has passed the TLS handshake (`tls=`) and sent a
//! well-formed hello, it is nobody: it is dropped with one line on stderr
//! and the destination goes on listening. Only then may a refusal tell
//! the peer how its VM differs from this one; an unauthenticated peer
//! (`auth=none`) learns what differs, never our values.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::address::MigrationAddress;
use super::history::{PageHistory, WrongPage};
use super::link::{Auth, Link, Stream};
use super::pages::{PageBitmap, RamAtRest, RamLayout};
use super::postcopy::{guest_async_pf, FaultThread, PostcopyShared};
use super::protocol::{
    read_message, write_message, Message, PageKind, StreamError, PAGE_SIZE, PROTOCOL_VERSION,
};
use super::source::{StateEnvelope, VmPauser};
use super::status::{MigrationStatus, Phase, SharedStatus};
use super::{unix_now_ns, Hello, MigrationError, MigrationMode};
use crate::memory::backing::advise_huge_pages;
use crate::memory::GuestMemoryMmap;
use crate::snapshot::state::{MachineState, VmSnapshot};
use crate::snapshot::HAKONIWA_VERSION;

/// How long the source may stay silent before the state has arrived.
const PRECOPY_READ_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a new connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// `--incoming`: the listening socket, bound before any KVM work so a bad
/// address or a port in use fails at once, and the credentials, loaded
/// as early for the same reason.
pub struct Incoming {
    listener: TcpListener,
    address: String,
    auth: Auth,
    /// `--memory thp=on`: RAM gets transparent huge pages once no page of
    /// it is left to userfaultfd.
    huge_pages: bool,
}

impl Incoming {
    pub fn bind(address: &MigrationAddress) -> Result<Incoming, MigrationError> {
        let auth = Auth::destination(&address.auth)
            .map_err(|e| MigrationError::Invalid(format!("--incoming {address}: {e}")))?;
        let listener = TcpListener::bind(address.host_port()).map_err(|e| {
            MigrationError::Invalid(format!(
                "--incoming {address}: cannot listen: {}",
                api::io_reason(&e)
            ))
        })?;
        let address = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| address.host_port());
        Ok(Incoming {
            listener,
            address,
            auth,
            huge_pages: false,
        })
    }

    /// Whether guest RAM should have transparent huge pages (`--memory
    /// thp=on`) once a precopy starts or a postcopy completes.
    pub fn with_huge_pages(mut self, on: bool) -> Incoming {
        self.huge_pages = on;
        self
    }

    /// Where it listens (with the port the kernel picked for port 0).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Waits for a source whose machine is `machine`, and takes the VM in:
    /// returns once its state is here (precopy: with all of RAM; postcopy:
    /// with RAM arriving in the background and on demand).
    /// `take_disks` locks the disk images once the state is here (the
    /// source has flushed and released them by then); if it fails the
    /// source is told, and takes its guest back.
    pub fn receive(
        self,
        memory: &GuestMemoryMmap,
        machine: &MachineState,
        take_disks: &dyn Fn() -> Result<(), String>,
    ) -> Result<Received, MigrationError> {
        say!(
            "hakoniwa: waiting for a migration on tcp:{} ({})",
            self.address,
            if self.auth.authenticates() {
                "TLS, peers authenticated"
            } else {
                "auth=none: anyone who reaches it"
            }
        );
        let (link, hello, peer) = next_source(&self.listener, &self.auth)?;
        let mut refusals = clone_stream(&link.stream)?;
        let tls = link.tls_failure();
        self.take_vm(link, hello, peer, memory, machine, take_disks)
            .map_err(|e| tls.explain(e))
            .inspect_err(|e| {
                // Whatever went wrong before the guest ran here, the source
                // is told, so it knows the guest may go on there (without
                // it, a failure after its last frame looks like a
                // destination that may have run the guest). Refusals that
                // say more than the error are sent where they happen.
                if !matches!(e, MigrationError::RefusedIncoming(_)) {
                    let _ = write_message(&mut refusals, &Message::Refused(e.to_string()));
                }
            })
    }

    /// [`receive`](Self::receive) from the source's hello on, until the
    /// guest's state is here and its disks are ours.
    fn take_vm(
        self,
        link: Link,
        hello: Hello,
        peer: SocketAddr,
        memory: &GuestMemoryMmap,
        machine: &MachineState,
        take_disks: &dyn Fn() -> Result<(), String>,
    ) -> Result<Received, MigrationError> {
        link.stream
            .set_read_timeout(Some(PRECOPY_READ_TIMEOUT))
            .ok();
        let source_identity = link.peer_identity.clone();
        let mut reader = clone_stream(&link.stream)?;
        let mut writer = link.stream;

        if let Err(mismatch) = check_machine(&hello, machine) {
            let told = mismatch.for_peer(self.auth.authenticates());
            let _ = write_message(&mut writer, &Message::Refused(told));
            return Err(MigrationError::RefusedIncoming(mismatch.detail));
        }
        write_message(&mut writer, &Message::Welcome(b"{}".to_vec()))?;

        let layout = RamLayout::new(memory);
        // A precopy writes every page whole (a postcopy or a hybrid may
        // leave pages to userfaultfd: their RAM stays small until done).
        let precopy_only = hello.mode == MigrationMode::Precopy;
        if self.huge_pages && precopy_only {
            advise_huge_pages(layout.host_ranges());
        }
        let status = Arc::new(SharedStatus::new(MigrationStatus::new(
            "destination",
            hello.mode,
            peer.to_string(),
            layout.pages() as u64,
        )));
        status.update(|s| s.phase = Phase::Precopy);
        let history = Arc::new(PageHistory::new(layout.clone()));
        let mut written = PageBitmap::new(layout.pages());
        let mut postcopy: Option<Arc<PostcopyShared>> = None;
        let envelope: StateEnvelope = loop {
            let (message, n) = read_message(&mut reader)?;
            status.update(|s| s.bytes += n as u64);
            match message {
                Message::Pages { kind, first, data } => {
                    let count = data.len() / PAGE_SIZE;
                    match &postcopy {
                        None => {
                            write_pages(&history, &written, kind, first, Some(&data), count)?;
                            status.update(|s| s.pages.add(kind, count as u64));
                        }
                        Some(shared) => shared.place(kind, first, Some(&data), count)?,
                    }
                }
                Message::Zero { kind, first, count } => match &postcopy {
                    None => {
                        write_pages(&history, &written, kind, first, None, count as usize)?;
                        status.update(|s| {
                            s.pages.add(kind, u64::from(count));
                            s.pages.zero += u64::from(count);
                        });
                    }
                    Some(shared) => shared.place(kind, first, None, count as usize)?,
                },
                // Huge pages may hold zeros for pages never sent.
                Message::Postcopy { .. } if precopy_only => {
                    return Err(MigrationError::Stream(StreamError::Corrupt(
                        "a switch to postcopy in a precopy migration".into(),
                    )));
                }
                Message::Postcopy { discard } if postcopy.is_none() => {
                    discard_pages(&history, &written, &discard)?;
                    let received = std::mem::replace(&mut written, PageBitmap::new(0));
                    postcopy = Some(PostcopyShared::register(
                        history.clone(),
                        received,
                        clone_stream(&writer)?,
                        status.clone(),
                        usize::from(machine.vcpus),
                    )?);
                }
                Message::Checksums(crcs) => {
                    let n = crcs.len();
                    if !history.set_source_crcs(crcs) {
                        return Err(MigrationError::Stream(StreamError::Corrupt(format!(
                            "checksums for {n} pages, RAM has {} (or sent twice)",
                            layout.pages()
                        ))));
                    }
                    status.update(|s| s.verify_pages = true);
                }
                Message::State(json) => {
                    let envelope: StateEnvelope = serde_json::from_slice(&json).map_err(|e| {
                        MigrationError::Stream(StreamError::Corrupt(format!("state: {e}")))
                    })?;
                    check_state(&envelope.snapshot, machine)?;
                    if history.verifying() {
                        // Every page here must be what the source has now
                        // (precopy: all of RAM; postcopy: what came before
                        // the switch-over). Before any vCPU runs, so the
                        // source can take its guest back.
                        let arrived = postcopy.as_ref().map(|p| &p.received);
                        // SAFETY: no vCPU has run, no device is active and
                        // postcopy's fault thread has not started: only
                        // this thread writes RAM, and not while `ram` lives.
                        let ram = unsafe { layout.at_rest() };
                        verify_arrived(&history, &ram, arrived, &status)?;
                    }
                    if let Err(why) = take_disks() {
                        let _ = write_message(&mut writer, &Message::Refused(why.clone()));
                        return Err(MigrationError::RefusedIncoming(why));
                    }
                    break envelope;
                }
                other => {
                    return Err(MigrationError::Unexpected {
                        got: other.name(),
                        when: "before the VM's state",
                    })
                }
            }
        };
        let postcopy = match postcopy {
            None => {
                // Precopy: the state came last; Done closes the stream.
                match read_message(&mut reader)?.0 {
                    Message::Done => {}
                    other => {
                        return Err(MigrationError::Unexpected {
                            got: other.name(),
                            when: "after the state of a precopy",
                        })
                    }
                }
                status.update(|s| {
                    s.phase = Phase::StopAndCopy;
                    s.remaining_pages = 0;
                });
                None
            }
            Some(shared) => {
                let msrs: Vec<&[_]> = envelope
                    .snapshot
                    .vcpus
                    .iter()
                    .map(|v| v.msrs.as_slice())
                    .collect();
                let async_pf = guest_async_pf(&msrs);
                shared.set_guest_async_pf(async_pf);
                status.update(|s| {
                    s.guest_async_pf = Some(async_pf);
                    s.phase = Phase::Postcopy;
                    s.remaining_pages = (layout.pages() - shared.received.count()) as u64;
                });
                // Faults come before any vCPU runs (restoring the state
                // makes KVM write kvm-clock pages, devices read rings), and
                // the pages they ask for may queue behind background pages:
                // so both threads run from here on.
                let faults = FaultThread::spawn(shared.clone())?;
                reader.set_read_timeout(None).ok();
                let pauser: Arc<Mutex<Option<Arc<dyn VmPauser>>>> = Arc::new(Mutex::new(None));
                let pages = {
                    let (shared, status, pauser) = (shared.clone(), status.clone(), pauser.clone());
                    let huge_pages = self.huge_pages;
                    let wait = ResumeWait {
                        listener: self.listener,
                        auth: self.auth,
                        source_identity,
                        machine: machine.clone(),
                    };
                    std::thread::Builder::new()
                        .name("postcopy-pages".into())
                        .spawn(move || {
                            sandbox::enter_or_exit(sandbox::ThreadKind::PostcopyPages);
                            receive_pages(reader, wait, &shared, &status, &pauser, huge_pages)
                        })
                        .map_err(|e| {
                            MigrationError::Invalid(format!("cannot start a thread: {e}"))
                        })?
                };
                Some(PostcopyRun {
                    shared,
                    _faults: faults,
                    pauser,
                    _pages: pages,
                })
            }
        };
        Ok(Received {
            snapshot: envelope.snapshot,
            stopped_at_unix_ns: envelope.stopped_at_unix_ns,
            status,
            history,
            writer,
            postcopy,
        })
    }
}

fn clone_stream(stream: &Stream) -> Result<Stream, MigrationError> {
    stream
        .try_clone()
        .map_err(|e| MigrationError::Invalid(format!("cannot clone the connection: {e}")))
}

/// Accepts the next connection and authenticates it (`tls=`); one that
/// fails is dropped with one line, and the wait goes on. Only a failure
/// of the listening socket itself is an error.
fn accept_link(listener: &TcpListener, auth: &Auth) -> Result<(Link, SocketAddr), MigrationError> {
    loop {
        let (tcp, peer) = listener
            .accept()
            .map_err(|e| MigrationError::Invalid(format!("accept: {}", api::io_reason(&e))))?;
        match auth.open(tcp) {
            Ok(link) => return Ok((link, peer)),
            Err(e) => say!("hakoniwa: migration in: dropped a connection from {peer}: {e}"),
        }
    }
}

/// The next connection that is an authenticated (`tls=`) source and sends
/// a well-formed hello; any other is dropped with one line, and the wait
/// goes on.
fn next_source(
    listener: &TcpListener,
    auth: &Auth,
) -> Result<(Link, Hello, SocketAddr), MigrationError> {
    loop {
        let (link, peer) = accept_link(listener, auth)?;
        match read_hello(&mut &link.stream) {
            Ok(hello) => return Ok((link, hello, peer)),
            Err(e) => say!(
                "hakoniwa: migration in: dropped a connection from {peer}: not a migration source: {e}"
            ),
        }
    }
}

/// Reads and checks the source's hello, waiting at most HELLO_TIMEOUT.
fn read_hello(reader: &mut &Stream) -> Result<Hello, MigrationError> {
    reader.set_read_timeout(Some(HELLO_TIMEOUT)).ok();
    parse_hello(reader)
}

/// Reads and checks a hello from any byte source (the fuzz target's too).
fn parse_hello(reader: &mut impl std::io::Read) -> Result<Hello, MigrationError> {
    let message = read_message(reader)?.0;
    let Message::Hello(json) = message else {
        return Err(MigrationError::Unexpected {
            got: message.name(),
            when: "instead of the source's hello",
        });
    };
    serde_json::from_slice(&json)
        .map_err(|e| MigrationError::Stream(StreamError::Corrupt(format!("hello: {e}"))))
}

/// Why the source's VM does not fit this one: `what` differs, in words
/// that describe neither side; `detail`, with both sides' values, for our
/// own log and for an authenticated source.
#[derive(Debug)]
struct Mismatch {
    what: &'static str,
    detail: String,
}

impl Mismatch {
    /// The refusal sent to the peer: the detail only once it has proved
    /// who it is.
    fn for_peer(&self, authenticated: bool) -> String {
        if authenticated {
            self.detail.clone()
        } else {
            format!(
                "the {} differs from the destination's (its log says how)",
                self.what
            )
        }
    }
}

/// Whether this VM can take the source's: the same protocol, build and
/// machine (memory, vCPUs, RAM layout, devices).
fn check_machine(hello: &Hello, ours: &MachineState) -> Result<(), Mismatch> {
    check_machine_detail(hello, ours).map_err(|(what, detail)| Mismatch { what, detail })
}

fn check_machine_detail(hello: &Hello, ours: &MachineState) -> Result<(), (&'static str, String)> {
    if hello.protocol != PROTOCOL_VERSION {
        return Err((
            "migration protocol",
            format!(
                "the source speaks migration protocol {}, this hakoniwa {}",
                hello.protocol, PROTOCOL_VERSION
            ),
        ));
    }
    if hello.hakoniwa != HAKONIWA_VERSION {
        return Err((
            "hakoniwa version",
            format!(
                "the source is hakoniwa {}, this is hakoniwa {}",
                hello.hakoniwa, HAKONIWA_VERSION
            ),
        ));
    }
    let theirs = &hello.machine;
    if theirs.memory_bytes != ours.memory_bytes {
        return Err((
            "memory size",
            format!(
                "the VM has {} of memory, --memory here is {}",
                crate::config::format_size(theirs.memory_bytes),
                crate::config::format_size(ours.memory_bytes)
            ),
        ));
    }
    if theirs.vcpus != ours.vcpus {
        return Err((
            "number of vCPUs",
            format!(
                "the VM has {} vCPUs, --cpus here is {}",
                theirs.vcpus, ours.vcpus
            ),
        ));
    }
    if theirs.ram_regions != ours.ram_regions {
        return Err((
            "RAM layout",
            "the VM's RAM layout differs from this one's".into(),
        ));
    }
    if theirs.display != ours.display {
        return Err((
            "display",
            format!(
                "the VM has {}, this one has {}",
                crate::snapshot::restore::display_words(&theirs.display),
                crate::snapshot::restore::display_words(&ours.display)
            ),
        ));
    }
    if theirs.devices != ours.devices {
        let names = |list: &[(String, String)]| {
            list.iter()
                .map(|(id, _)| id.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        return Err((
            "device list",
            format!(
                "the VM has devices {}, this one has {}",
                names(&theirs.devices),
                names(&ours.devices)
            ),
        ));
    }
    Ok(())
}

/// The state must describe this machine too (it came after the hello,
/// but a stream can be damaged in between without failing a checksum
/// only if it was forged; check anyway, it is cheap).
fn check_state(snapshot: &VmSnapshot, machine: &MachineState) -> Result<(), MigrationError> {
    let ok = snapshot.machine.memory_bytes == machine.memory_bytes
        && snapshot.vcpus.len() == usize::from(machine.vcpus)
        && snapshot
            .vcpus
            .iter()
            .enumerate()
            .all(|(i, v)| usize::from(v.index) == i);
    if ok {
        Ok(())
    } else {
        Err(MigrationError::Stream(StreamError::Corrupt(
            "the state does not match the machine".into(),
        )))
    }
}

/// Precopy placement: copies pages into RAM (before userfaultfd is
/// registered, plain writes). A zero page never written needs nothing:
/// fresh anonymous memory reads as zero; it is only marked as known.
fn write_pages(
    history: &PageHistory,
    written: &PageBitmap,
    kind: PageKind,
    first: u64,
    data: Option<&[u8]>,
    count: usize,
) -> Result<(), MigrationError> {
    let layout = history.layout();
    for k in 0..count {
        let index = layout.index_of_page(first + k as u64).ok_or_else(|| {
            MigrationError::Stream(StreamError::Corrupt(format!(
                "page {:#x} is not RAM",
                first + k as u64
            )))
        })?;
        match data {
            Some(bytes) => {
                layout.write_page(index, &bytes[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]);
                written.set(index);
            }
            None => {
                if written.get(index) && !layout.is_zero(index) {
                    layout.write_page(index, &[0u8; PAGE_SIZE]);
                }
                // Known to be zero, whether or not it is backed yet: a
                // postcopy maps the zero page when the guest touches it
                // rather than ask the source again.
                written.set(index);
            }
        }
        history.arrived(kind, index, 1, data.is_none());
    }
    Ok(())
}

/// `--verify-pages`: checks every page that has arrived (`arrived`; `None`:
/// all of RAM, as after a precopy) against the source's checksums. A page
/// not in memory was never written here and reads as zero. Returns how
/// many were checked; the first differences go to the report.
fn verify_arrived(
    history: &PageHistory,
    ram: &RamAtRest,
    arrived: Option<&PageBitmap>,
    status: &SharedStatus,
) -> Result<u64, MigrationError> {
    let layout = history.layout();
    let resident = layout
        .resident()
        .map_err(|e| MigrationError::Invalid(format!("mincore: {e}")))?;
    let mut wrong: Vec<WrongPage> = Vec::new();
    let mut checked = 0u64;
    for (index, &in_memory) in resident.iter().enumerate() {
        if arrived.is_some_and(|a| !a.get(index)) {
            continue;
        }
        // Reading a page not in memory would fault it in (and under
        // postcopy wait for the fault handler): it is zero.
        let bytes = in_memory.then(|| ram.page(index));
        checked += 1;
        if let Err(w) = history.check(index, None, bytes) {
            wrong.push(w);
        }
    }
    record_wrong(status, checked, &wrong);
    match wrong.first() {
        None => Ok(checked),
        Some(first) => Err(MigrationError::WrongPages(format!(
            "{} of {checked} pages differ from the source's; the first: {first}",
            wrong.len()
        ))),
    }
}

/// How many pages of the report's list of wrong pages to keep.
const WRONG_PAGES_KEPT: usize = 16;

/// Counts `checked` verified pages and `wrong` in the report.
pub(super) fn record_wrong(status: &SharedStatus, checked: u64, wrong: &[WrongPage]) {
    status.update(|s| {
        s.pages.verified += checked;
        s.pages.wrong += wrong.len() as u64;
        let room = WRONG_PAGES_KEPT.saturating_sub(s.wrong_pages.len());
        s.wrong_pages.extend(wrong.iter().take(room).cloned());
    });
}

/// Drops the pages the source changed after sending them, so they fault
/// and are fetched again: one madvise per run (per region it spans), not
/// per page — a hybrid's list can hold tens of thousands of pages, and
/// this runs inside the downtime.
fn discard_pages(
    history: &PageHistory,
    written: &PageBitmap,
    discard: &[(u64, u32)],
) -> Result<(), MigrationError> {
    let layout = history.layout();
    for &(first, count) in discard {
        let count = count as usize;
        let mut k = 0;
        while k < count {
            let page = first + k as u64;
            let index = layout.index_of_page(page).ok_or_else(|| {
                MigrationError::Stream(StreamError::Corrupt(format!(
                    "discarded page {page:#x} is not RAM"
                )))
            })?;
            // Guest pages that follow each other in one region are
            // contiguous in our mapping too.
            let n = (count - k).min(layout.pages_left_in_region(index));
            let host = layout.host_of_index(index);
            // SAFETY: `n` pages of guest RAM in one region, which no vCPU
            // uses yet; MADV_DONTNEED on private anonymous memory makes
            // them read as missing again.
            let r = unsafe {
                libc::madvise(
                    host as *mut libc::c_void,
                    n * PAGE_SIZE,
                    libc::MADV_DONTNEED,
                )
            };
            if r != 0 {
                return Err(MigrationError::Invalid(format!(
                    "madvise(MADV_DONTNEED): {}",
                    std::io::Error::last_os_error()
                )));
            }
            for i in index..index + n {
                written.clear(i);
                history.discarded(i);
            }
            k += n;
        }
    }
    Ok(())
}

/// A VM taken in: its state, and for postcopy the threads still bringing
/// RAM in.
pub struct Received {
    pub snapshot: VmSnapshot,
    stopped_at_unix_ns: u64,
    status: Arc<SharedStatus>,
    /// How each page arrived (and the source's checksums): for reports.
    history: Arc<PageHistory>,
    writer: Stream,
    postcopy: Option<PostcopyRun>,
}

struct PostcopyRun {
    shared: Arc<PostcopyShared>,
    _faults: FaultThread,
    /// Set once the vCPUs run: a lost connection pauses them.
    pauser: Arc<Mutex<Option<Arc<dyn VmPauser>>>>,
    /// The page receiver: it ends on its own, at Done or a broken stream.
    _pages: JoinHandle<()>,
}

impl Received {
    /// The migration's report, for the API.
    pub fn status(&self) -> Arc<SharedStatus> {
        self.status.clone()
    }

    /// How each page arrived, for failure reports.
    pub fn history(&self) -> Arc<PageHistory> {
        self.history.clone()
    }

    /// The vCPUs run: tell the source, record the downtime, and (postcopy)
    /// start taking pages in the background.
    pub fn started(&mut self, pauser: Arc<dyn VmPauser>) -> Result<(), MigrationError> {
        let now = unix_now_ns();
        let downtime_ms = now.saturating_sub(self.stopped_at_unix_ns) as f64 / 1e6;
        self.status.update(|s| s.downtime_ms = Some(downtime_ms));
        let running = Message::Running { at_unix_ns: now };
        match &mut self.postcopy {
            None => {
                write_message(&mut self.writer, &running)?;
                self.status.finish(Phase::Completed, None);
                say!("hakoniwa: migration in: precopy complete, downtime {downtime_ms:.0} ms");
            }
            Some(run) => {
                run.shared.vcpus_started();
                *run.pauser.lock().unwrap_or_else(|e| e.into_inner()) = Some(pauser);
                run.shared.send(&running)?;
            }
        }
        Ok(())
    }
}

/// How often the page receiver refreshes the run-time fraction.
const RUN_FRACTION_REFRESH: Duration = Duration::from_millis(200);

/// Postcopy after the vCPUs started: places every page that arrives until
/// the source says it sent them all, then confirms and lets RAM go back to
/// plain memory. A broken or corrupt stream pauses the guest: its missing
/// pages exist nowhere else.
fn receive_pages(
    mut reader: Stream,
    wait: ResumeWait,
    shared: &PostcopyShared,
    status: &SharedStatus,
    pauser: &Mutex<Option<Arc<dyn VmPauser>>>,
    huge_pages: bool,
) {
    let pause = || {
        if let Some(pauser) = pauser.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if let Err(p) = pauser.pause() {
                tracing::warn!("cannot pause the guest: {p}");
            }
        }
    };
    loop {
        let result = take_pages(&mut reader, shared, status);
        let fraction = shared.run_fraction();
        status.update(|s| s.run_fraction = fraction);
        match result {
            Ok(()) => {
                shared.unregister();
                if huge_pages {
                    shared.allow_huge_pages();
                }
                status.finish(Phase::Completed, None);
                let s = status.get();
                say!(
                    "hakoniwa: migration in: postcopy complete after {:.1} s ({} demand, {} prefetch, {} background pages; {} major, {} minor, {} double faults)",
                    s.total_ms.unwrap_or(0) as f64 / 1000.0,
                    s.pages.demand,
                    s.pages.prefetch,
                    s.pages.background,
                    s.faults.major,
                    s.faults.minor,
                    s.faults.double
                );
                if s.pages.already_present > 0 {
                    // Never expected (status.rs): say it where it is seen.
                    say!(
                        "hakoniwa: migration in: warning: {} pages from the source found their place in guest RAM taken and were not written",
                        s.pages.already_present
                    );
                }
                return;
            }
            // The link broke (or the source died): the guest waits, and
            // the source may resume over a new connection.
            Err(e) if e.is_disconnect() => {
                shared.disconnected();
                pause();
                status.update(|s| s.phase = Phase::Paused);
                let address = wait
                    .listener
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                say!(
                    "hakoniwa: migration in: postcopy connection lost ({e}); {} pages exist only on the source, so the guest is paused until the source resumes the migration (`hakoniwa ctl migrate --resume --to tcp:{address}{}` there)",
                    shared.missing(),
                    wait.auth.address_suffix()
                );
                match wait.accept_resume(shared) {
                    Ok(new_reader) => {
                        reader = new_reader;
                        status.update(|s| {
                            s.phase = Phase::Postcopy;
                            s.resumes += 1;
                        });
                        if let Some(pauser) =
                            pauser.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                        {
                            pauser.resume();
                        }
                        say!("hakoniwa: migration in: postcopy resumed");
                    }
                    Err(e) => {
                        say!("hakoniwa: migration in: cannot wait for a resume: {e}");
                        status.finish(Phase::Failed, Some(e.to_string()));
                        return;
                    }
                }
            }
            Err(e) => {
                shared.disconnected();
                pause();
                let missing = shared.missing();
                say!(
                    "hakoniwa: migration in: postcopy stopped: {e}; {missing} pages exist only on the source, so the guest is paused"
                );
                status.finish(
                    Phase::Failed,
                    Some(format!("{e}; {missing} pages missing; the guest is paused")),
                );
                return;
            }
        }
    }
}

/// Places pages until the source says it sent them all (then confirms).
fn take_pages(
    reader: &mut Stream,
    shared: &PostcopyShared,
    status: &SharedStatus,
) -> Result<(), MigrationError> {
    let mut refreshed = Instant::now();
    loop {
        let (message, n) = read_message(reader)?;
        status.update(|s| s.bytes += n as u64);
        match message {
            Message::Pages { kind, first, data } => {
                shared.place(kind, first, Some(&data), data.len() / PAGE_SIZE)?
            }
            Message::Zero { kind, first, count } => {
                shared.place(kind, first, None, count as usize)?
            }
            Message::Done => {
                if !shared.all_received() {
                    return Err(MigrationError::Stream(StreamError::Corrupt(format!(
                        "the source finished with {} pages missing",
                        shared.missing()
                    ))));
                }
                shared.send(&Message::Complete)?;
                return Ok(());
            }
            other => {
                return Err(MigrationError::Unexpected {
                    got: other.name(),
                    when: "during postcopy",
                })
            }
        }
        if refreshed.elapsed() >= RUN_FRACTION_REFRESH {
            refreshed = Instant::now();
            let fraction = shared.run_fraction();
            let missing = shared.missing() as u64;
            status.update(|s| {
                s.run_fraction = fraction;
                s.remaining_pages = missing;
            });
        }
    }
}

/// What a paused postcopy waits with: the listening socket, its
/// credentials, and who the source was.
struct ResumeWait {
    listener: TcpListener,
    auth: Auth,
    /// The source's certificate (TLS): a resume must show the same one.
    source_identity: Option<Vec<u8>>,
    machine: MachineState,
}

impl ResumeWait {
    /// Waits for the source to resume a postcopy and takes it: a welcome
    /// and the bitmap of the pages here. Returns the new reading half; the
    /// writing half goes to `shared`, which asks again for every page still
    /// awaited.
    fn accept_resume(&self, shared: &PostcopyShared) -> Result<Stream, MigrationError> {
        let link = self.next_resume()?;
        let reader = clone_stream(&link.stream)?;
        let mut writer = link.stream;
        write_message(&mut writer, &Message::Welcome(b"{}".to_vec()))?;
        write_message(&mut writer, &Message::Received(shared.received.to_bytes()))?;
        reader.set_read_timeout(None).ok();
        shared.reconnected(writer)?;
        Ok(reader)
    }

    /// The next connection that is a resume hello for this machine from
    /// the source's certificate; anything else is dropped or refused with
    /// one line, and the wait goes on.
    fn next_resume(&self) -> Result<Link, MigrationError> {
        loop {
            let (link, peer) = accept_link(&self.listener, &self.auth)?;
            if link.peer_identity != self.source_identity {
                say!("hakoniwa: migration in: dropped a connection from {peer}: its certificate is not the one the migration came from");
                continue;
            }
            let hello = match read_hello(&mut &link.stream) {
                Ok(hello) => hello,
                Err(e) => {
                    say!("hakoniwa: migration in: dropped a connection from {peer}: not a resume: {e}");
                    continue;
                }
            };
            let check = if hello.resume {
                check_machine(&hello, &self.machine)
                    .map_err(|m| (m.for_peer(self.auth.authenticates()), m.detail))
            } else {
                let why = "this VM is in a paused postcopy: only `migrate --resume` from its source is taken";
                Err((why.to_string(), why.to_string()))
            };
            match check {
                Ok(()) => return Ok(link),
                Err((told, detail)) => {
                    let _ = write_message(&mut &link.stream, &Message::Refused(told));
                    say!("hakoniwa: migration in: refused a connection from {peer}: {detail}");
                }
            }
        }
    }
}

/// Entry point for the fuzz target in `fuzz/` (not an API).
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Takes a precopy stream from `input` into `memory` as [`Incoming::receive`]
    /// does, with the same parsers and the same placement: the hello and
    /// its check against `machine`, pages and zero runs, checksums and
    /// their verification, the state and its check, and `Done`. A switch
    /// to postcopy drops the listed pages and ends the run there: what
    /// follows needs userfaultfd and a running guest.
    pub fn precopy_stream(
        memory: &GuestMemoryMmap,
        machine: &MachineState,
        mut input: &[u8],
    ) -> Result<(), MigrationError> {
        let hello = parse_hello(&mut input)?;
        check_machine(&hello, machine).map_err(|m| MigrationError::RefusedIncoming(m.detail))?;
        let layout = RamLayout::new(memory);
        let status = SharedStatus::new(MigrationStatus::new(
            "destination",
            hello.mode,
            "fuzz".into(),
            layout.pages() as u64,
        ));
        let history = PageHistory::new(layout.clone());
        let written = PageBitmap::new(layout.pages());
        loop {
            match read_message(&mut input)?.0 {
                Message::Pages { kind, first, data } => {
                    let count = data.len() / PAGE_SIZE;
                    write_pages(&history, &written, kind, first, Some(&data), count)?
                }
                Message::Zero { kind, first, count } => {
                    write_pages(&history, &written, kind, first, None, count as usize)?
                }
                Message::Postcopy { discard } => {
                    return discard_pages(&history, &written, &discard);
                }
                Message::Checksums(crcs) => {
                    if !history.set_source_crcs(crcs) {
                        return Err(MigrationError::Invalid("checksums refused".into()));
                    }
                }
                Message::State(json) => {
                    let envelope: StateEnvelope = serde_json::from_slice(&json)
                        .map_err(|e| MigrationError::Invalid(format!("state: {e}")))?;
                    check_state(&envelope.snapshot, machine)?;
                    if history.verifying() {
                        // SAFETY: the fuzzer's memory has no guest and no
                        // devices; only this loop writes it.
                        let ram = unsafe { layout.at_rest() };
                        verify_arrived(&history, &ram, None, &status)?;
                    }
                }
                Message::Done => return Ok(()),
                other => {
                    return Err(MigrationError::Unexpected {
                        got: other.name(),
                        when: "in a precopy",
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::address::MigrationAuth;
    use crate::migration::tls::test_credentials;
    use std::io::Write;
    use std::net::TcpStream;

    fn machine(memory_bytes: u64, vcpus: u8, devices: &[(&str, &str)]) -> MachineState {
        MachineState {
            memory_bytes,
            vcpus,
            ram_regions: vec![(0, memory_bytes)],
            devices: devices
                .iter()
                .map(|(id, kind)| (id.to_string(), kind.to_string()))
                .collect(),
            boot_protocol: String::new(),
            kernel: String::new(),
            cmdline: String::new(),
            display: None,
        }
    }

    fn hello(machine: MachineState) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            hakoniwa: HAKONIWA_VERSION.into(),
            mode: super::super::MigrationMode::Precopy,
            machine,
            resume: false,
        }
    }

    #[test]
    fn a_refusal_to_an_unauthenticated_peer_describes_nothing_of_ours() {
        let ours = machine(256 << 20, 3, &[("secret-disk", "virtio-blk")]);
        for theirs in [
            machine(512 << 20, 3, &[("secret-disk", "virtio-blk")]),
            machine(256 << 20, 7, &[("secret-disk", "virtio-blk")]),
            machine(256 << 20, 3, &[("their-disk", "virtio-blk")]),
        ] {
            let mismatch = check_machine(&hello(theirs), &ours).unwrap_err();
            let told = mismatch.for_peer(false);
            for ours_in_words in ["256", "3 vCPUs", "is 3", "secret-disk"] {
                assert!(!told.contains(ours_in_words), "{told}");
            }
            assert!(told.contains("differs"), "{told}");
            // Our own log, and an authenticated source, get the detail.
            assert_eq!(mismatch.for_peer(true), mismatch.detail);
            assert!(
                mismatch.detail.contains("256M")
                    || mismatch.detail.contains("is 3")
                    || mismatch.detail.contains("secret-disk"),
                "{}",
                mismatch.detail
            );
        }
        let mut other = hello(ours.clone());
        other.hakoniwa = "0.0.0-other".into();
        let told = check_machine(&other, &ours).unwrap_err().for_peer(false);
        assert!(!told.contains(HAKONIWA_VERSION), "{told}");
    }

    type Peer = Box<dyn FnOnce(TcpStream) + Send>;

    /// Connects to `port` once for each of `peers`, one after the other.
    fn connect_each(port: u16, peers: Vec<Peer>) -> JoinHandle<()> {
        std::thread::spawn(move || {
            for peer in peers {
                peer(TcpStream::connect(("127.0.0.1", port)).unwrap());
            }
        })
    }

    /// The port `incoming` listens on.
    fn port_of(incoming: &Incoming) -> u16 {
        incoming
            .address()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn send_hello(out: &mut impl std::io::Write, memory_bytes: u64) {
        let h = hello(machine(memory_bytes, 1, &[]));
        write_message(out, &Message::Hello(serde_json::to_vec(&h).unwrap())).unwrap();
    }

    fn tls(dir: &std::path::Path) -> MigrationAuth {
        MigrationAuth::Tls {
            dir: dir.to_path_buf(),
            name: None,
        }
    }

    fn send_resume(out: &mut impl std::io::Write, memory_bytes: u64) {
        let mut h = hello(machine(memory_bytes, 1, &[]));
        h.resume = true;
        write_message(out, &Message::Hello(serde_json::to_vec(&h).unwrap())).unwrap();
    }

    /// What a peer of a paused postcopy hears back: a refusal's reason, or
    /// `None` when the destination hangs up without a word.
    fn answer(link: &Link) -> Option<String> {
        match read_message(&mut &link.stream) {
            Ok((Message::Refused(why), _)) => Some(why),
            Ok((other, _)) => panic!("a bad resume got {}", other.name()),
            Err(_) => None,
        }
    }

    #[test]
    fn a_paused_postcopy_is_resumed_only_by_the_certificate_it_came_from() {
        let dir = test_credentials("resume");
        let auth = Auth::destination(&tls(&dir)).unwrap();
        let source = Auth::source(&tls(&dir), "127.0.0.1").unwrap();
        // The same CA, the same name, another key: the CA vouches for it,
        // but it is not the source.
        let sibling = Auth::source(&tls(&dir.join("sibling")), "127.0.0.1").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();

        let first = {
            let source = source.clone();
            connect_each(
                port,
                vec![Box::new(move |t| {
                    let link = source.open(t).unwrap();
                    send_hello(&mut &link.stream, 256 << 20);
                })],
            )
        };
        let (link, _, _) = next_source(&listener, &auth).unwrap();
        first.join().unwrap();
        let wait = ResumeWait {
            listener,
            auth,
            source_identity: link.peer_identity.clone(),
            machine: machine(256 << 20, 1, &[]),
        };
        assert!(wait.source_identity.is_some());

        let (told, told_rx) = std::sync::mpsc::channel::<(&str, Option<String>)>();
        // A peer that sends a hello (`resume` or not) through `auth` and
        // reports what it was answered, as `what`.
        let asking = |what: &'static str, auth: &Auth, memory_bytes: u64, resume: bool| -> Peer {
            let (told, auth) = (told.clone(), auth.clone());
            Box::new(move |t| {
                let link = auth.open(t).unwrap();
                if resume {
                    send_resume(&mut &link.stream, memory_bytes);
                } else {
                    send_hello(&mut &link.stream, memory_bytes);
                }
                told.send((what, answer(&link))).unwrap();
            })
        };
        let peers: Vec<Peer> = vec![
            asking("sibling", &sibling, 256 << 20, true),
            asking("not a resume", &source, 256 << 20, false),
            asking("another machine", &source, 512 << 20, true),
            Box::new(move |t| {
                let link = source.open(t).unwrap();
                send_resume(&mut &link.stream, 256 << 20);
                // Held open until the destination has taken it.
                let _ = read_message(&mut &link.stream);
            }),
        ];
        let clients = connect_each(port, peers);
        let resumed = wait.next_resume().unwrap();
        assert_eq!(resumed.peer_identity, wait.source_identity);
        drop(resumed);
        clients.join().unwrap();
        drop(told);
        let answers: Vec<_> = told_rx.iter().collect();
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert_eq!(answers[0], ("sibling", None), "{answers:?}");
        let (_, not_resume) = &answers[1];
        assert!(
            not_resume.as_deref().unwrap().contains("migrate --resume"),
            "{answers:?}"
        );
        // The source proved who it is: it is told what differs.
        let (_, other) = &answers[2];
        assert!(other.as_deref().unwrap().contains("256M"), "{answers:?}");
    }

    #[test]
    fn the_destination_drops_bad_peers_and_keeps_waiting_for_a_source() {
        // auth=none: a bare connect, garbage, a frame that is not a
        // hello, then a source.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let clients = connect_each(
            port,
            vec![
                Box::new(drop),
                Box::new(|mut t| t.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap()),
                Box::new(|mut t| {
                    write_message(&mut t, &Message::Done).unwrap();
                }),
                Box::new(|mut t| {
                    send_hello(&mut t, 256 << 20);
                    let _ = std::io::Read::read(&mut t, &mut [0u8; 1]);
                }),
            ],
        );
        let (link, hello, _) = next_source(&listener, &Auth::None).unwrap();
        assert_eq!(hello.machine.memory_bytes, 256 << 20);
        assert!(link.peer_identity.is_none());
        drop(link);
        clients.join().unwrap();

        // tls=: the same, plus a plain-TCP source and one with another
        // CA's certificate, then the real source.
        let dir = test_credentials("dst-loop");
        let stranger = test_credentials("stranger-loop");
        let auth = Auth::destination(&tls(&dir)).unwrap();
        let good = Auth::source(&tls(&dir), "127.0.0.1").unwrap();
        let bad = Auth::source(&tls(&stranger), "127.0.0.1").unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let clients = connect_each(
            port,
            vec![
                Box::new(drop),
                Box::new(|mut t| t.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap()),
                Box::new(|mut t| send_hello(&mut t, 256 << 20)),
                Box::new(move |t| {
                    if let Ok(link) = bad.open(t) {
                        let _ = std::io::Read::read(&mut &link.stream, &mut [0u8; 1]);
                    }
                }),
                Box::new(move |t| {
                    let link = good.open(t).unwrap();
                    send_hello(&mut &link.stream, 512 << 20);
                    let _ = std::io::Read::read(&mut &link.stream, &mut [0u8; 1]);
                }),
            ],
        );
        let (link, hello, _) = next_source(&listener, &auth).unwrap();
        assert_eq!(hello.machine.memory_bytes, 512 << 20);
        assert!(link.peer_identity.is_some());
        drop(link);
        clients.join().unwrap();
    }
    use vm_memory::GuestAddress;

    /// A source whose stream breaks after the hello, in each way a network
    /// or a peer can break it, is told the guest did not run here: it may
    /// go on there. (Without this, a failure after its last frame left the
    /// source unable to tell it from a destination that ran the guest.)
    #[test]
    fn a_stream_that_fails_after_the_hello_is_refused_back_to_the_source() {
        type Breaks = Box<dyn Fn(&mut TcpStream) + Send>;
        let broken: [(&str, Breaks); 4] = [
            (
                "checksum",
                Box::new(|t| {
                    let mut frame = Vec::new();
                    write_message(&mut frame, &Message::State(b"{}".to_vec())).unwrap();
                    *frame.last_mut().unwrap() ^= 1;
                    t.write_all(&frame).unwrap();
                }),
            ),
            (
                "state",
                Box::new(|t| {
                    write_message(t, &Message::State(b"{".to_vec()))
                        .map(drop)
                        .unwrap()
                }),
            ),
            (
                "before the VM's state",
                Box::new(|t| {
                    write_message(t, &Message::Running { at_unix_ns: 1 })
                        .map(drop)
                        .unwrap()
                }),
            ),
            // The hello said precopy: RAM may have huge pages, which hold
            // zeros where a postcopy would wait for the source's pages.
            (
                "a switch to postcopy in a precopy migration",
                Box::new(|t| {
                    write_message(t, &Message::Postcopy { discard: vec![] })
                        .map(drop)
                        .unwrap()
                }),
            ),
        ];
        for (word, breaks) in broken {
            let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 * PAGE_SIZE)]).unwrap();
            let ours = machine(4 * PAGE_SIZE as u64, 1, &[]);
            let incoming = Incoming::bind(&"tcp:127.0.0.1:0,auth=none".parse().unwrap()).unwrap();
            let port = port_of(&incoming);
            let source = std::thread::spawn(move || {
                let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
                send_hello(&mut t, 4 * PAGE_SIZE as u64);
                assert!(matches!(
                    read_message(&mut t).unwrap().0,
                    Message::Welcome(_)
                ));
                breaks(&mut t);
                read_message(&mut t).map(|(m, _)| m)
            });
            let err = incoming
                .receive(&memory, &ours, &|| Ok(()))
                .err()
                .expect("a broken stream was taken");
            assert!(err.to_string().contains(word), "{word}: {err}");
            match source.join().unwrap() {
                Ok(Message::Refused(why)) => assert_eq!(why, err.to_string()),
                other => panic!("{word}: the source heard {other:?}"),
            }
        }
    }

    #[test]
    fn a_precopy_destinations_ram_takes_huge_pages_where_the_host_gives_them() {
        use crate::memory::backing::tests::smaps_entry;
        use crate::memory::backing::{host_thp_setting, map_ram, MemoryConfig};
        use crate::migration::protocol::MAX_RUN_PAGES;
        use vm_memory::GuestMemoryBackend;
        const RAM: usize = 16 << 20;
        let mut huge: Vec<u64> = Vec::new();
        for huge_pages in [false, true] {
            let memory = map_ram(
                &MemoryConfig::new(RAM as u64),
                &[(GuestAddress(0), RAM)],
                true,
            )
            .unwrap();
            let incoming = Incoming::bind(&"tcp:127.0.0.1:0,auth=none".parse().unwrap())
                .unwrap()
                .with_huge_pages(huge_pages);
            let port = port_of(&incoming);
            let source = std::thread::spawn(move || {
                let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
                send_hello(&mut t, RAM as u64);
                assert!(matches!(
                    read_message(&mut t).unwrap().0,
                    Message::Welcome(_)
                ));
                // All of RAM, not zero, then a stream that ends early.
                let run = vec![0x5a; MAX_RUN_PAGES * PAGE_SIZE];
                for first in (0..(RAM / PAGE_SIZE) as u64).step_by(MAX_RUN_PAGES) {
                    let data = run.clone();
                    let pages = Message::Pages {
                        kind: PageKind::Precopy,
                        first,
                        data,
                    };
                    write_message(&mut t, &pages).unwrap();
                }
                write_message(&mut t, &Message::Running { at_unix_ns: 1 }).unwrap();
                read_message(&mut t).map(|(m, _)| m)
            });
            let ours = machine(RAM as u64, 1, &[]);
            let err = incoming.receive(&memory, &ours, &|| Ok(())).err().unwrap();
            assert!(err.to_string().contains("before the VM's state"), "{err}");
            source.join().unwrap().unwrap();
            let entry = smaps_entry(memory.iter().next().unwrap().as_ptr());
            let kib = entry.lines().find_map(|l| l.strip_prefix("AnonHugePages:"));
            let kib = kib.and_then(|k| k.trim().trim_end_matches("kB").trim().parse().ok());
            huge.push(kib.unwrap_or_else(|| panic!("no AnonHugePages: {entry}")));
        }
        // Not advised (thp=off): never huge. Advised: huge where this
        // host's THP setting allows it (a 16 MiB mapping holds at least
        // seven aligned 2 MiB pages; the kernel may still fall back to
        // small pages when it finds no free huge page).
        assert_eq!(huge[0], 0, "{huge:?}");
        if matches!(
            host_thp_setting(false).as_deref(),
            Some("always" | "madvise")
        ) {
            assert!(huge[1] >= 2048, "{huge:?}");
        }
    }

    #[test]
    fn verify_pages_checks_what_arrived_and_reads_absent_pages_as_zero() {
        let memory = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 * PAGE_SIZE)]).unwrap();
        let layout = RamLayout::new(&memory);
        let history = PageHistory::new(layout.clone());
        let status = SharedStatus::new(MigrationStatus::new(
            "destination",
            super::super::MigrationMode::Precopy,
            String::new(),
            4,
        ));
        // Page 1 holds data; pages 0, 2 and 3 were never written.
        // SAFETY: a byte of a page of `memory`, alive for the test.
        unsafe { *(layout.host_of_index(1) as *mut u8) = 9 };
        let mut data = vec![0u8; PAGE_SIZE];
        data[0] = 9;
        let zero = super::super::history::zero_page_crc();
        let crc = super::super::history::page_crc(&data);
        // The source had page 3 non-zero: it never arrived.
        assert!(history.set_source_crcs(vec![zero, crc, zero, crc]));
        // SAFETY: nothing else touches `memory` during the test.
        let ram = unsafe { layout.at_rest() };
        let err = verify_arrived(&history, &ram, None, &status).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--verify-pages: 1 of 4 pages differ from the source's; the first: page 0x3000 (never)"),
            "{err}"
        );
        let report = status.get();
        assert_eq!((report.pages.verified, report.pages.wrong), (4, 1));
        assert_eq!(report.wrong_pages[0].address, 0x3000);
        // Only the pages that arrived (a hybrid's precopy pages) are checked:
        // page 3 is still to come.
        let arrived = PageBitmap::new(4);
        for i in 0..3 {
            arrived.set(i);
        }
        assert_eq!(
            verify_arrived(&history, &ram, Some(&arrived), &status).unwrap(),
            3
        );
        // Nothing was faulted in to check it.
        assert_eq!(layout.resident().unwrap(), vec![false, true, false, false]);
    }

    #[test]
    fn discarded_runs_read_as_missing_again_across_regions() {
        let memory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 8 * PAGE_SIZE),
            (GuestAddress(0x1_0000_0000), 8 * PAGE_SIZE),
        ])
        .unwrap();
        let layout = RamLayout::new(&memory);
        let history = PageHistory::new(layout.clone());
        let written = PageBitmap::new(layout.pages());
        for i in 0..layout.pages() {
            // SAFETY: a byte of a page of `memory`, alive for the test.
            unsafe { *(layout.host_of_index(i) as *mut u8) = 7 };
            written.set(i);
        }
        // A run inside the low region, one that ends at its last page,
        // and one in the high region.
        discard_pages(&history, &written, &[(1, 3), (6, 2), (0x10_0002, 4)]).unwrap();
        let gone: Vec<usize> = (0..layout.pages()).filter(|&i| !written.get(i)).collect();
        assert_eq!(gone, vec![1, 2, 3, 6, 7, 10, 11, 12, 13]);
        for i in 0..layout.pages() {
            let zero = layout.is_zero(i);
            assert_eq!(zero, gone.contains(&i), "page index {i}");
        }
        // A run that runs past the end of RAM is refused.
        assert!(history.record(2).unwrap().discarded_at_switchover);
        let err = discard_pages(&history, &written, &[(0x10_0006, 3)]).unwrap_err();
        assert!(err.to_string().contains("not RAM"), "{err}");
    }
}
