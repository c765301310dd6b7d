//! The source side (`ctl migrate`): connect, agree on the machine, copy RAM
//! while the guest runs (precopy rounds over the dirty log), stop the guest,
//! send its state, and either finish (precopy) or serve the destination's
//! page requests with their neighbours plus a background push (postcopy).
//! Hybrid runs precopy rounds and switches to postcopy as soon as the
//! measured dirty rate against the measured bandwidth says the rounds will
//! not get the rest under the downtime limit.
//!
//! A failure before the switch-over leaves the source running as before.
//! After it the destination has run the guest: the source never runs it
//! again; it ends once the destination has every page.

use std::io::{BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::address::MigrationAddress;
use super::dirty::RamDirtyLog;
use super::history::page_crc;
use super::link::{Auth, Link, Stream};
use super::pages::{PageBitmap, RamLayout};
use super::protocol::{
    read_message, write_message, Message, PageKind, StreamError, MAX_RUN_PAGES, PAGE_SIZE,
    PROTOCOL_VERSION,
};
use super::status::{MigrationStatus, Phase, Round, SharedStatus};
use super::switchover::{self, Decision, RoundFigures};
use super::{unix_now_ns, Hello, MigrationError, MigrationMode};
use crate::event::{EventSender, VmmEvent};
use crate::memory::MemoryManager;
use crate::snapshot::state::VmSnapshot;
use crate::snapshot::{SnapshotSource, HAKONIWA_VERSION};
use crate::vcpu::RunControl;

/// How long connecting to the destination may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the destination may take to answer the hello, to start the VM
/// after the state arrived, and between frames while serving postcopy.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a source that migrated away stays up for its last report.
const FINAL_REPORT_GRACE: Duration = Duration::from_millis(500);
/// Pages of data per slice of the background push: few, so a demand
/// request waits behind at most this much on the wire.
const BACKGROUND_RUN: usize = 16;
/// Pages a slice of the background push may span. A run of zero pages
/// costs the wire one frame header, whatever its length, so a slice goes
/// on over zero pages until it has BACKGROUND_RUN pages of data or spans
/// this many: an idle 1 GiB guest took 16384 slices of 16 pages (each a
/// write, a wake-up and a read on both sides) and 13 s to push 105 MiB in
/// the rig, where precopy took 3 s. Not more: the pages are read for zeros
/// before requests are looked at again.
const BACKGROUND_SPAN: usize = MAX_RUN_PAGES;

/// What `ctl migrate` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationRequest {
    /// The destination's `--incoming` address, with how to authenticate.
    pub to: MigrationAddress,
    pub mode: MigrationMode,
    /// Neighbours sent on each side of a demanded page.
    pub prefetch: u32,
    /// The downtime precopy aims for, ms.
    pub max_downtime_ms: u64,
    /// Precopy rounds after the first before giving up on converging
    /// (precopy then stops anyway; hybrid switches to postcopy).
    pub max_rounds: u32,
    /// Push pages nobody asked for during postcopy.
    pub background: bool,
    /// Cap on the precopy rounds' and the background push's bandwidth,
    /// MiB/s (demanded pages and their neighbours are never held back).
    pub max_bandwidth_mib: Option<u32>,
    /// Resume a postcopy whose connection dropped, over a new one to `to`.
    pub resume: bool,
    /// Send the CRC32 of every page once the guest is stopped; the
    /// destination checks every page against it (a test and diagnosis
    /// mode: the checksums take a pass over RAM inside the downtime).
    #[serde(default)]
    pub verify_pages: bool,
}

/// Pauses and resumes the VM's vCPUs for the migration (the API's pause).
pub trait VmPauser: Send + Sync {
    fn pause(&self) -> Result<(), String>;
    fn resume(&self);
    fn run_control(&self) -> &RunControl;
}

/// A running VM's side of migrations: starts them and reports on them.
pub struct MigrationSource {
    memory: Arc<MemoryManager>,
    snapshot: Arc<SnapshotSource>,
    pauser: Arc<dyn VmPauser>,
    events: EventSender,
    current: Mutex<Option<Arc<SharedStatus>>>,
    /// Set while a postcopy waits for `migrate --resume`: where to send
    /// the new destination address.
    resume: Arc<Mutex<Option<mpsc::Sender<MigrationAddress>>>>,
    /// A migration failed after the switch-over: the guest is stopped
    /// here with its disks handed over and its devices paused.
    stranded: Arc<Mutex<Option<Stranded>>>,
}

/// How a guest left stopped by a migration that failed after the
/// switch-over may go on here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stranded {
    /// The destination never said it ran the guest: whether it did, only
    /// the operator knows. A `resume` takes the disks back (refused while
    /// the destination holds them) and runs the guest here again, as
    /// QEMU's `cont` does after a failed migration.
    Unconfirmed,
    /// The guest ran on the destination: its state here is older than
    /// what the guest has seen and written since, so it must not run here
    /// again.
    RanThere,
}

/// Whether the API may resume the VM, given its outgoing migration.
#[derive(Debug, PartialEq, Eq)]
pub enum ResumeCheck {
    /// No migration holds the VM: resume as usual.
    Free,
    /// A migration failed after the switch-over and the destination never
    /// confirmed running the guest: take the disks and devices back first
    /// ([`MigrationSource::reclaim`]).
    Reclaim,
}

impl MigrationSource {
    pub fn new(
        memory: Arc<MemoryManager>,
        snapshot: Arc<SnapshotSource>,
        pauser: Arc<dyn VmPauser>,
        events: EventSender,
    ) -> MigrationSource {
        MigrationSource {
            memory,
            snapshot,
            pauser,
            events,
            current: Mutex::new(None),
            resume: Arc::new(Mutex::new(None)),
            stranded: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether the VM may be resumed through the API now: not while a
    /// migration has it stopped for its switch-over or runs it elsewhere
    /// (two running copies of one guest), and not after one failed once
    /// the guest ran on the destination. Err says why, in one line.
    pub fn check_resume(&self) -> Result<ResumeCheck, String> {
        if let Some(status) = self.status() {
            match status.phase {
                Phase::StopAndCopy => {
                    return Err(
                        "a migration is in its stop-and-copy phase; it runs the guest here again if it fails before the switch-over"
                            .into(),
                    )
                }
                Phase::Postcopy => {
                    return Err(format!(
                        "the guest runs on {} now (postcopy)",
                        status.peer
                    ))
                }
                Phase::Paused => {
                    return Err(format!(
                        "the postcopy to {} is paused: the guest's newest state is there; resume the migration with `hakoniwa ctl migrate --resume --to ADDRESS`",
                        status.peer
                    ))
                }
                _ => {}
            }
        }
        match *self.stranded.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(ResumeCheck::Free),
            Some(Stranded::Unconfirmed) => Ok(ResumeCheck::Reclaim),
            Some(Stranded::RanThere) => Err(
                "the guest ran on the migration's destination after the switch-over: its state here is older, so it may not run here again"
                    .into(),
            ),
        }
    }

    /// After [`ResumeCheck::Reclaim`]: locks the disks again (fails while
    /// the destination holds them) and resumes the virtio devices, so the
    /// vCPUs may run.
    pub fn reclaim(&self) -> Result<(), String> {
        let mut stranded = self.stranded.lock().unwrap_or_else(|e| e.into_inner());
        if *stranded != Some(Stranded::Unconfirmed) {
            return Err("no migration left the guest stopped here".into());
        }
        self.snapshot.take_back_disks().map_err(|e| {
            format!("the disks cannot be taken back (does the destination run the guest?): {e}")
        })?;
        self.snapshot
            .resume_devices()
            .map_err(|e| format!("cannot resume the virtio devices: {e}"))?;
        *stranded = None;
        Ok(())
    }

    /// Starts a migration on its own thread; refuses while one runs.
    pub fn start(&self, request: MigrationRequest) -> Result<(), MigrationError> {
        // Credentials that cannot be loaded fail `ctl migrate` at once.
        source_auth(&request.to)?;
        if request.resume {
            let waiting = self.resume.lock().unwrap_or_else(|e| e.into_inner()).take();
            return match waiting {
                Some(tx) => tx
                    .send(request.to)
                    .map_err(|_| MigrationError::Invalid("the paused migration has ended".into())),
                None => Err(MigrationError::Invalid(
                    "no migration is paused: nothing to resume".into(),
                )),
            };
        }
        if self
            .stranded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            // Its devices are paused and its disks handed over: a second
            // migration would take the state of a half-released VM.
            return Err(MigrationError::Invalid(
                "a migration failed after its switch-over and left the guest stopped here: `hakoniwa ctl resume` it first, if it may run here".into(),
            ));
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(status) = current.as_ref() {
            let s = status.get();
            if !s.finished() {
                return Err(MigrationError::Invalid(format!(
                    "a migration to {} is already {}",
                    s.peer,
                    phase_words(s.phase)
                )));
            }
        }
        let layout = RamLayout::new(self.memory.ram());
        let status = Arc::new(SharedStatus::new(MigrationStatus::new(
            "source",
            request.mode,
            request.to.host_port(),
            layout.pages() as u64,
        )));
        status.update(|s| s.verify_pages = request.verify_pages);
        *current = Some(status.clone());
        let job = SourceJob {
            memory: self.memory.clone(),
            layout,
            snapshot: self.snapshot.clone(),
            pauser: self.pauser.clone(),
            events: self.events.clone(),
            status,
            request,
            resume: self.resume.clone(),
            stranded: self.stranded.clone(),
        };
        std::thread::Builder::new()
            .name("migrate-out".into())
            .spawn(move || {
                sandbox::enter_or_exit(sandbox::ThreadKind::MigrateOut);
                job.run()
            })
            .map_err(|e| {
                MigrationError::Invalid(format!("cannot start the migration thread: {e}"))
            })?;
        Ok(())
    }

    /// The current (or last) migration's report.
    pub fn status(&self) -> Option<MigrationStatus> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().map(|s| s.get())
    }
}

fn phase_words(phase: Phase) -> &'static str {
    match phase {
        Phase::Setup => "being set up",
        Phase::Precopy => "copying memory",
        Phase::StopAndCopy => "in its stop-and-copy phase",
        Phase::Postcopy => "in postcopy",
        Phase::Paused => "paused (its connection dropped)",
        Phase::Completed => "completed",
        Phase::Failed => "failed",
    }
}

/// What the State frame carries: the VM's state and when the source
/// stopped it.
#[derive(Serialize, Deserialize)]
pub struct StateEnvelope {
    pub stopped_at_unix_ns: u64,
    pub snapshot: VmSnapshot,
}

/// One migration, on its thread.
struct SourceJob {
    memory: Arc<MemoryManager>,
    layout: RamLayout,
    snapshot: Arc<SnapshotSource>,
    pauser: Arc<dyn VmPauser>,
    events: EventSender,
    status: Arc<SharedStatus>,
    request: MigrationRequest,
    resume: Arc<Mutex<Option<mpsc::Sender<MigrationAddress>>>>,
    stranded: Arc<Mutex<Option<Stranded>>>,
}

/// Where the job is, for cleaning up after a failure.
enum Stage {
    /// The guest still runs here (or can run again): undo and carry on.
    BeforeSwitchover { paused: bool },
    /// The destination has the state: the guest does not run here again
    /// unless the operator, knowing the destination did not run it, says
    /// so (`ctl resume`, only while the destination has not said it ran).
    AfterSwitchover(Stranded),
}

impl SourceJob {
    fn run(self) {
        let mut stage = Stage::BeforeSwitchover { paused: false };
        match self.migrate(&mut stage) {
            Ok(()) => {
                self.status.finish(Phase::Completed, None);
                // Linger a moment so `ctl migrate` can read the final
                // report before this hakoniwa (and its socket) ends.
                std::thread::sleep(FINAL_REPORT_GRACE);
                let s = self.status.get();
                self.events.send(VmmEvent::Migrated(format!(
                    "migrated to {} ({}, {:.1} s, downtime {})",
                    self.request.to.host_port(),
                    self.request.mode.name(),
                    s.total_ms.unwrap_or(0) as f64 / 1000.0,
                    s.downtime_ms
                        .or(s.source_downtime_ms)
                        .map(|d| format!("{d:.0} ms"))
                        .unwrap_or_else(|| "unknown".into())
                )));
            }
            Err(e) => {
                let message = e.to_string();
                match stage {
                    Stage::BeforeSwitchover { paused } => {
                        if paused {
                            // The disks were handed over: the guest may
                            // only write them again once they are ours.
                            if let Err(e) = self.snapshot.take_back_disks() {
                                say!("hakoniwa: migration to {} failed: {message}; the VM stays stopped here: {e}", self.request.to.host_port());
                                self.status.finish(Phase::Failed, Some(message));
                                return;
                            }
                            // Devices first: taking the state paused them.
                            if let Err(e) = self.snapshot.resume_devices() {
                                say!("hakoniwa: cannot resume the virtio devices: {e}");
                            }
                            self.pauser.resume();
                        }
                        say!("hakoniwa: migration to {} failed: {message}; the VM keeps running here", self.request.to.host_port());
                    }
                    Stage::AfterSwitchover(how) => {
                        *self.stranded.lock().unwrap_or_else(|e| e.into_inner()) = Some(how);
                        match how {
                            Stranded::Unconfirmed => say!("hakoniwa: migration to {} failed after the switch-over: {message}; the VM stays stopped here (the destination did not say it ran the guest: if it did not, `hakoniwa ctl resume` runs it here again)", self.request.to.host_port()),
                            Stranded::RanThere => say!("hakoniwa: migration to {} failed after the switch-over: {message}; the VM stays stopped here (it ran on the destination)", self.request.to.host_port()),
                        }
                    }
                }
                self.status.finish(Phase::Failed, Some(message));
            }
        }
    }

    fn migrate(&self, stage: &mut Stage) -> Result<(), MigrationError> {
        let (link, mut reader, mut out) = self.handshake(&self.request.to, false)?;

        let pages = self.layout.pages();
        // Pages the destination has a current copy of.
        let sent = PageBitmap::new(pages);
        // Pages to send (again) in the next round / after the switch-over.
        let dirty = PageBitmap::new(pages);
        let mut postcopy = self.request.mode == MigrationMode::Postcopy;
        let log = if postcopy {
            None
        } else {
            Some(RamDirtyLog::start(&self.memory)?)
        };
        if let Some(log) = &log {
            postcopy = self.precopy_rounds(log, &mut out, &sent, &dirty)?;
        }

        // Stop the guest and take its state.
        self.status.update(|s| s.phase = Phase::StopAndCopy);
        self.pauser.pause().map_err(MigrationError::Invalid)?;
        let stopped = Instant::now();
        let stopped_at_unix_ns = unix_now_ns();
        *stage = Stage::BeforeSwitchover { paused: true };
        let snapshot = self.snapshot.collect(self.pauser.run_control())?;
        // The devices are idle: make the disks durable and let the
        // destination lock them before it can run the guest.
        self.snapshot.hand_over_disks()?;
        if let Some(log) = &log {
            log.harvest(&dirty)?;
        }
        drop(log);
        let state = to_json(&StateEnvelope {
            stopped_at_unix_ns,
            snapshot,
        })?;
        // RAM is as the destination must end up with it from here on.
        let checksums = self.request.verify_pages.then(|| {
            // SAFETY: the vCPUs are paused and the devices idle (their
            // state was just collected), and `ram` is dropped before
            // either can run again.
            let ram = unsafe { self.layout.at_rest() };
            Message::Checksums((0..pages).map(|i| page_crc(ram.page(i))).collect())
        });

        if !postcopy {
            // Stop-and-copy: the rest of the dirty pages, the state, done.
            self.send_set(&mut out, &dirty, &sent, PageKind::Precopy)?;
            if let Some(checksums) = &checksums {
                out.send(checksums)?;
            }
            out.send(&Message::State(state))?;
            out.send(&Message::Done)?;
            out.flush()?;
            *stage = Stage::AfterSwitchover(Stranded::Unconfirmed);
            if let Err(e) = self.wait_running(&mut reader, stopped, stopped_at_unix_ns) {
                if matches!(e, MigrationError::Refused(_)) {
                    // The destination never ran the guest: it goes on here.
                    *stage = Stage::BeforeSwitchover { paused: true };
                }
                return Err(e);
            }
            link.shutdown();
            return Ok(());
        }

        // Postcopy: pages sent but dirty since are dropped at the
        // destination; it runs as soon as it has the state.
        let discard = runs_of(&dirty, &sent, |i| self.layout.page_of_index(i));
        for i in (0..pages).filter(|&i| dirty.get(i)) {
            sent.clear(i);
        }
        out.send(&Message::Postcopy { discard })?;
        if let Some(checksums) = &checksums {
            out.send(checksums)?;
        }
        out.send(&Message::State(state))?;
        out.flush()?;
        *stage = Stage::AfterSwitchover(Stranded::Unconfirmed);
        self.status.update(|s| {
            s.phase = Phase::Postcopy;
            s.remaining_pages = (pages - sent.count()) as u64;
        });
        let mut connection = (link, reader, out);
        let mut running = false;
        loop {
            let (link, reader, out) = connection;
            match self.serve_postcopy(
                reader,
                out,
                &sent,
                stopped,
                stopped_at_unix_ns,
                &mut running,
            ) {
                Ok(()) => {
                    link.shutdown();
                    return Ok(());
                }
                // The link broke, not the stream: both sides wait for a
                // new connection (QEMU's postcopy recovery).
                Err(e) if e.is_disconnect() => {
                    link.shutdown();
                    connection = self.wait_and_resume(&e, &sent)?;
                }
                // It refused the state before running the guest (e.g. a
                // page failed --verify-pages): the guest goes on here.
                Err(e @ MigrationError::Refused(_)) if !running => {
                    *stage = Stage::BeforeSwitchover { paused: true };
                    return Err(e);
                }
                Err(e) => {
                    if running {
                        *stage = Stage::AfterSwitchover(Stranded::RanThere);
                    }
                    return Err(e);
                }
            }
        }
    }

    /// A postcopy lost its connection: says so, waits for `migrate
    /// --resume`, reconnects and learns which pages the destination has.
    fn wait_and_resume(
        &self,
        why: &MigrationError,
        sent: &PageBitmap,
    ) -> Result<(Link, Stream, Out), MigrationError> {
        self.status.update(|s| s.phase = Phase::Paused);
        say!(
            "hakoniwa: migration to {} paused: {why}; the guest stays stopped here and on the destination until `hakoniwa ctl migrate --resume --to {}` (or another address of the destination)",
            self.request.to.host_port(),
            self.request.to
        );
        loop {
            let (tx, rx) = mpsc::channel();
            *self.resume.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
            // Blocks until the operator resumes: this side holds the only
            // copy of the pages the destination lacks.
            let to = rx
                .recv()
                .map_err(|_| MigrationError::Invalid("resume channel closed".into()))?;
            match self.reconnect(&to, sent) {
                Ok(connection) => {
                    self.status.update(|s| {
                        s.phase = Phase::Postcopy;
                        s.resumes += 1;
                        s.peer = to.host_port();
                        s.remaining_pages = (sent.len() - sent.count()) as u64;
                    });
                    say!("hakoniwa: migration resumed to {}", to.host_port());
                    return Ok(connection);
                }
                Err(e) => {
                    say!(
                        "hakoniwa: resuming the migration to {} failed: {e}; still paused",
                        to.host_port()
                    )
                }
            }
        }
    }

    /// Connects to `to`, says hello (the destination checks the machine
    /// before anything runs) and waits for its welcome. Returns the link,
    /// its reading half (with a timeout for answers) and its buffered
    /// writing half.
    fn handshake(
        &self,
        to: &MigrationAddress,
        resume: bool,
    ) -> Result<(Link, Stream, Out), MigrationError> {
        let link = connect(to)?;
        let mut reader = link
            .stream
            .try_clone()
            .map_err(|e| MigrationError::Invalid(e.to_string()))?;
        reader.set_read_timeout(Some(ANSWER_TIMEOUT)).ok();
        let mut out =
            Out::new(&link, self.status.clone())?.with_limit(self.request.max_bandwidth_mib);
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            hakoniwa: HAKONIWA_VERSION.into(),
            mode: self.request.mode,
            machine: self.snapshot.machine().clone(),
            resume,
        };
        // A destination that rejects our certificate says so in a TLS
        // alert, which ends the stream: its reason beats "closed".
        let tls = link.tls_failure();
        let tls_refusal = |e: MigrationError| match tls.reason() {
            Some(reason) => MigrationError::Connect {
                to: to.host_port(),
                reason,
            },
            None => e,
        };
        out.send(&Message::Hello(to_json(&hello)?))
            .and_then(|()| out.flush())
            .map_err(tls_refusal)?;
        let answer = read_message(&mut reader)
            .map_err(|e| tls_refusal(MigrationError::Stream(e)))?
            .0;
        match answer {
            Message::Welcome(_) => Ok((link, reader, out)),
            Message::Refused(why) => Err(MigrationError::Refused(why)),
            other => Err(MigrationError::Unexpected {
                got: other.name(),
                when: "instead of the destination's welcome",
            }),
        }
    }

    /// Connects to the destination again for a resumed postcopy; `sent`
    /// becomes what it says it has.
    fn reconnect(
        &self,
        to: &MigrationAddress,
        sent: &PageBitmap,
    ) -> Result<(Link, Stream, Out), MigrationError> {
        let (link, mut reader, out) = self.handshake(to, true)?;
        let Message::Received(bitmap) = read_message(&mut reader)?.0 else {
            return Err(MigrationError::Invalid(
                "the destination did not say which pages it has".into(),
            ));
        };
        let have = PageBitmap::from_bytes(sent.len(), &bitmap).ok_or_else(|| {
            MigrationError::Stream(StreamError::Corrupt("the received-pages bitmap".into()))
        })?;
        // Pages on their way when the link broke may be lost: what the
        // destination does not have is sent again.
        sent.clear_all();
        let mut next = 0;
        while let Some(i) = have.next_set(next) {
            sent.set(i);
            next = i + 1;
        }
        Ok((link, reader, out))
    }

    /// Precopy rounds until the rest fits the downtime limit; returns
    /// whether to switch to postcopy (hybrid) instead of stop-and-copy.
    fn precopy_rounds(
        &self,
        log: &RamDirtyLog,
        out: &mut Out,
        sent: &PageBitmap,
        dirty: &PageBitmap,
    ) -> Result<bool, MigrationError> {
        self.status.update(|s| s.phase = Phase::Precopy);
        let mut policy = switchover::for_mode(self.request.mode);
        // Round 0: everything.
        dirty.set_all();
        let mut round = 0u32;
        let mut last_harvest = Instant::now();
        loop {
            let started = Instant::now();
            let bytes_before = out.bytes;
            let pages_sent = self.send_set(out, dirty, sent, PageKind::Precopy)?;
            out.flush()?;
            let took = started.elapsed().as_secs_f64().max(1e-6);
            let bandwidth = (out.bytes - bytes_before) as f64 / took; // bytes/s
            round += 1;
            // What the guest dirtied meanwhile.
            let found = log.harvest(dirty)?;
            let since = last_harvest.elapsed().as_secs_f64().max(1e-6);
            last_harvest = Instant::now();
            let dirty_rate = found as f64 / since; // pages/s
            let remaining = dirty.count();
            let predicted = remaining as f64 * PAGE_SIZE as f64 / bandwidth.max(1.0);
            self.status.update(|s| {
                s.rounds = round;
                s.remaining_pages = remaining as u64;
                s.dirty_pages_per_s = dirty_rate;
                s.round_log.push(Round {
                    round,
                    pages: pages_sent as u64,
                    seconds: took,
                    mib_per_s: bandwidth / (1 << 20) as f64,
                    dirty_pages: found as u64,
                    dirty_pages_per_s: dirty_rate,
                    predicted_downtime_ms: predicted * 1000.0,
                });
            });
            let figures = RoundFigures {
                round,
                pages_sent,
                pages_dirtied: found,
                dirty_seconds: since,
                round_seconds: took,
                bandwidth,
                remaining,
                max_downtime_ms: self.request.max_downtime_ms,
                max_rounds: self.request.max_rounds,
            };
            match policy.decide(&figures) {
                Decision::NextRound => {}
                Decision::StopAndCopy => return Ok(false),
                Decision::GiveUp { reason } => {
                    tracing::warn!("{reason}");
                    return Ok(false);
                }
                Decision::SwitchToPostcopy { reason } => {
                    self.status.update(|s| s.switch_reason = Some(reason));
                    return Ok(true);
                }
            }
        }
    }

    /// Sends every page set in `set` (clearing it), marking it sent;
    /// returns how many.
    fn send_set(
        &self,
        out: &mut Out,
        set: &PageBitmap,
        sent: &PageBitmap,
        kind: PageKind,
    ) -> Result<usize, MigrationError> {
        let mut n = 0;
        let mut next = 0;
        while let Some(start) = set.next_set(next) {
            let limit = self.layout.pages_left_in_region(start).min(MAX_RUN_PAGES);
            let mut len = 1;
            while len < limit && set.get(start + len) {
                len += 1;
            }
            for i in start..start + len {
                set.clear(i);
                sent.set(i);
            }
            self.send_run(out, kind, start, len)?;
            n += len;
            next = start + len;
        }
        Ok(n)
    }

    /// Sends pages `start..start+len` (contiguous in one region), zero
    /// pages as `Zero` frames and the rest as `Pages`.
    fn send_run(
        &self,
        out: &mut Out,
        kind: PageKind,
        start: usize,
        len: usize,
    ) -> Result<(), MigrationError> {
        let is_zero = |i| self.layout.is_zero(i);
        let runs = page_runs(start, len, |_| false, is_zero, usize::MAX);
        self.send_frames(out, kind, &runs)
    }

    /// Sends each run (contiguous in one region) as one frame: `Zero` or
    /// `Pages`.
    fn send_frames(
        &self,
        out: &mut Out,
        kind: PageKind,
        runs: &[PageRun],
    ) -> Result<(), MigrationError> {
        for run in runs {
            let first = self.layout.page_of_index(run.start);
            let count = run.len;
            let message = if run.zero {
                self.status.update(|s| s.pages.zero += count as u64);
                Message::Zero {
                    kind,
                    first,
                    count: count as u32,
                }
            } else {
                let mut data = Vec::with_capacity(count * PAGE_SIZE);
                self.layout.append_pages(run.start, count, &mut data);
                Message::Pages { kind, first, data }
            };
            match kind {
                PageKind::Precopy | PageKind::Background => out.send_paced(&message)?,
                PageKind::Demand | PageKind::Prefetch => out.send(&message)?,
            }
            self.status.update(|s| s.pages.add(kind, count as u64));
        }
        Ok(())
    }

    /// Waits for the destination's `Running` and records the downtime as
    /// the source sees it.
    fn wait_running(
        &self,
        reader: &mut Stream,
        stopped: Instant,
        stopped_at_unix_ns: u64,
    ) -> Result<(), MigrationError> {
        match read_message(reader)?.0 {
            Message::Running { at_unix_ns } => {
                self.record_downtime(stopped, stopped_at_unix_ns, at_unix_ns);
                Ok(())
            }
            Message::Refused(why) => Err(MigrationError::Refused(why)),
            other => Err(MigrationError::Unexpected {
                got: other.name(),
                when: "while waiting for the destination to run",
            }),
        }
    }

    /// The destination runs since `at_unix_ns`: the downtime by both
    /// clocks (the same clock on one host), and as seen from here.
    fn record_downtime(&self, stopped: Instant, stopped_at_unix_ns: u64, at_unix_ns: u64) {
        let seen_here = stopped.elapsed().as_secs_f64() * 1000.0;
        let measured = at_unix_ns.saturating_sub(stopped_at_unix_ns) as f64 / 1e6;
        self.status.update(|s| {
            s.source_downtime_ms = Some(seen_here);
            s.downtime_ms = Some(measured);
        });
    }

    /// Serves postcopy: demanded pages first, each with its ±N neighbours,
    /// and otherwise the background push, until every page is sent and the
    /// destination confirms it has them all.
    fn serve_postcopy(
        &self,
        reader: Stream,
        mut out: Out,
        sent: &PageBitmap,
        stopped: Instant,
        stopped_at_unix_ns: u64,
        running: &mut bool,
    ) -> Result<(), MigrationError> {
        let pages = self.layout.pages();
        let (tx, rx) = mpsc::channel::<Result<Message, StreamError>>();
        // The destination's requests and reports, read on their own thread
        // so a request never waits behind a page we are writing.
        let reader_thread = std::thread::Builder::new()
            .name("migrate-requests".into())
            .spawn(move || {
                sandbox::enter_or_exit(sandbox::ThreadKind::MigrateRequests);
                let mut reader = reader;
                reader.set_read_timeout(None).ok();
                loop {
                    match read_message(&mut reader) {
                        Ok((message, _)) => {
                            let end = matches!(message, Message::Complete);
                            if tx.send(Ok(message)).is_err() || end {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    }
                }
            })
            .map_err(|e| MigrationError::Invalid(format!("cannot start a thread: {e}")))?;
        let prefetch = self.request.prefetch as usize;
        let mut cursor = 0usize;
        let mut done_sent = false;
        // The background push waits until the destination runs: until
        // then its only faults come from restoring the state (KVM writing
        // kvm-clock pages, devices reading rings), and those must not
        // queue behind pushed pages — that would be downtime.
        // Bound what can queue in front of a demanded page: the socket's
        // send buffer, and our buffer, which background pages never wait in.
        set_send_buffer(&out, POSTCOPY_SEND_BUFFER);
        let handle = |message: Message,
                      out: &mut Out,
                      cursor: &mut usize|
         -> Result<Heard, MigrationError> {
            match message {
                Message::Request { first, count } => {
                    self.status.update(|s| s.requests += 1);
                    let Some(index) = self.layout.index_of_page(first) else {
                        return Err(MigrationError::Invalid(format!(
                            "the destination asked for page {first:#x}, which is not RAM"
                        )));
                    };
                    let count =
                        (count.max(1) as usize).min(self.layout.pages_left_in_region(index));
                    for i in index..index + count {
                        if !sent.set(i) {
                            self.send_run(out, PageKind::Demand, i, 1)?;
                        }
                    }
                    // Neighbours, nearest first, each side.
                    for d in 1..=prefetch {
                        for i in [index.checked_sub(d), Some(index + count - 1 + d)]
                            .into_iter()
                            .flatten()
                        {
                            if i < pages && !sent.set(i) {
                                self.send_run(out, PageKind::Prefetch, i, 1)?;
                            }
                        }
                    }
                    out.flush()?;
                    // QEMU's trick: the background push goes on from here,
                    // where the guest is working.
                    *cursor = index;
                    Ok(Heard::Request)
                }
                Message::Running { at_unix_ns } => {
                    self.record_downtime(stopped, stopped_at_unix_ns, at_unix_ns);
                    Ok(Heard::Running)
                }
                Message::Complete => Ok(Heard::Complete),
                Message::Refused(why) => Err(MigrationError::Refused(why)),
                other => Err(MigrationError::Unexpected {
                    got: other.name(),
                    when: "during postcopy",
                }),
            }
        };
        let result = loop {
            // Requests first.
            let mut complete = false;
            let pushing = *running && !done_sent && self.request.background;
            let next = if !pushing {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        break Err(MigrationError::Invalid("the request reader stopped".into()))
                    }
                }
            } else {
                rx.try_recv().ok()
            };
            if let Some(m) = next {
                match m {
                    Ok(message) => match handle(message, &mut out, &mut cursor) {
                        Ok(Heard::Complete) => complete = true,
                        Ok(Heard::Running) => *running = true,
                        Ok(Heard::Request) => {}
                        Err(e) => break Err(e),
                    },
                    Err(e) => break Err(MigrationError::Stream(e)),
                }
            }
            if complete {
                break Ok(());
            }
            // Then a slice of the background push.
            if !done_sent {
                if pushing {
                    let from = sent.next_clear(cursor).or_else(|| sent.next_clear(0));
                    if let Some(start) = from {
                        let span = self.layout.pages_left_in_region(start).min(BACKGROUND_SPAN);
                        let runs = background_slice(
                            start,
                            span,
                            |i| sent.get(i),
                            |i| self.layout.is_zero(i),
                        );
                        let len: usize = runs.iter().map(|r| r.len).sum();
                        for i in start..start + len {
                            sent.set(i);
                        }
                        if let Err(e) = self
                            .send_frames(&mut out, PageKind::Background, &runs)
                            .and_then(|()| out.flush())
                        {
                            break Err(e);
                        }
                        cursor = start + len;
                    }
                }
                let left = pages - sent.count();
                self.status.update(|s| s.remaining_pages = left as u64);
                if left == 0 {
                    if let Err(e) = out.send(&Message::Done).and_then(|_| out.flush()) {
                        break Err(e);
                    }
                    done_sent = true;
                }
            }
        };
        drop(rx);
        if result.is_ok() {
            // It ended at Complete; on errors it ends with the connection.
            let _ = reader_thread.join();
        }
        result
    }
}

/// The next slice of the background push from `start`: unsent pages
/// only, at most `span` of them and at most BACKGROUND_RUN that are not
/// zero. Empty if `start` was sent.
fn background_slice(
    start: usize,
    span: usize,
    is_sent: impl Fn(usize) -> bool,
    is_zero: impl Fn(usize) -> bool,
) -> Vec<PageRun> {
    page_runs(start, span, is_sent, is_zero, BACKGROUND_RUN)
}

/// Pages `start..start+len` in RAM order, all zero or all data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PageRun {
    start: usize,
    len: usize,
    zero: bool,
}

/// Pages from `start` cut into runs of zero pages and of data, in order:
/// up to `span` pages, stopping before the first page `is_sent` and before
/// the page of data past `max_data`.
fn page_runs(
    start: usize,
    span: usize,
    is_sent: impl Fn(usize) -> bool,
    is_zero: impl Fn(usize) -> bool,
    max_data: usize,
) -> Vec<PageRun> {
    let mut runs: Vec<PageRun> = Vec::new();
    let mut data = 0;
    let mut i = start;
    while i < start + span && !is_sent(i) {
        let zero = is_zero(i);
        if !zero {
            if data == max_data {
                break;
            }
            data += 1;
        }
        match runs.last_mut() {
            Some(run) if run.zero == zero => run.len += 1,
            _ => runs.push(PageRun {
                start: i,
                len: 1,
                zero,
            }),
        }
        i += 1;
    }
    runs
}

/// What the destination said during postcopy.
enum Heard {
    Request,
    Running,
    Complete,
}

/// The socket send buffer during postcopy: a demanded page waits behind
/// at most this much background data (plus the receiver's buffer).
const POSTCOPY_SEND_BUFFER: usize = 256 << 10;

/// Sets SO_SNDBUF of the connection `out` writes to and of the TCP
/// socket under it (the same one without TLS; best effort).
fn set_send_buffer(out: &Out, bytes: usize) {
    for socket in [out.writer.get_ref(), &out.network] {
        if let Err(e) = socket.set_send_buffer_size(bytes) {
            tracing::warn!("SO_SNDBUF: {e}");
        }
    }
}

/// Runs of pages set in both `a` and `b`, as (first guest page, count);
/// `page_of` turns a RAM-order index into its guest page.
fn runs_of(a: &PageBitmap, b: &PageBitmap, page_of: impl Fn(usize) -> u64) -> Vec<(u64, u32)> {
    let mut runs: Vec<(u64, u32)> = Vec::new();
    let mut next = 0;
    while let Some(i) = a.next_set(next) {
        next = i + 1;
        if !b.get(i) {
            continue;
        }
        // Runs are merged by guest page, so one never spans the MMIO hole.
        let page = page_of(i);
        match runs.last_mut() {
            Some((first, count)) if *first + u64::from(*count) == page => *count += 1,
            _ => runs.push((page, 1)),
        }
    }
    runs
}

/// The buffered writing half, counting bytes into the status.
struct Out {
    writer: BufWriter<Stream>,
    /// The TCP socket under it, for its send buffer.
    network: Stream,
    bytes: u64,
    status: Arc<SharedStatus>,
    /// `--max-bandwidth`, bytes/s, and what was sent under it since when.
    limit: Option<f64>,
    paced_since: Instant,
    paced_bytes: u64,
}

/// The longest single wait for the bandwidth cap: the postcopy loop looks
/// at requests between waits.
const PACE_STEP: Duration = Duration::from_millis(20);

impl Out {
    fn new(link: &Link, status: Arc<SharedStatus>) -> Result<Out, MigrationError> {
        let clone = |r: std::io::Result<Stream>| {
            r.map_err(|e| MigrationError::Invalid(format!("cannot clone the connection: {e}")))
        };
        Ok(Out {
            writer: BufWriter::with_capacity(1 << 20, clone(link.stream.try_clone())?),
            network: clone(link.network())?,
            bytes: 0,
            status,
            limit: None,
            paced_since: Instant::now(),
            paced_bytes: 0,
        })
    }

    fn with_limit(mut self, mib_per_s: Option<u32>) -> Out {
        self.limit = mib_per_s.map(|m| f64::from(m.max(1)) * (1 << 20) as f64);
        self
    }

    fn send(&mut self, message: &Message) -> Result<(), MigrationError> {
        let n = write_message(&mut self.writer, message)? as u64;
        self.bytes += n;
        self.status.update(|s| s.bytes += n);
        Ok(())
    }

    /// Sends under the bandwidth cap: waits (in short steps) while ahead
    /// of it.
    fn send_paced(&mut self, message: &Message) -> Result<(), MigrationError> {
        let before = self.bytes;
        self.send(message)?;
        let Some(limit) = self.limit else {
            return Ok(());
        };
        self.paced_bytes += self.bytes - before;
        let due = Duration::from_secs_f64(self.paced_bytes as f64 / limit);
        let elapsed = self.paced_since.elapsed();
        if due > elapsed {
            self.flush()?;
            std::thread::sleep((due - elapsed).min(PACE_STEP));
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), MigrationError> {
        self.writer
            .flush()
            .map_err(|e| MigrationError::Stream(e.into()))
    }
}

/// The source's credentials for `to` (none for `auth=none`).
fn source_auth(to: &MigrationAddress) -> Result<Auth, MigrationError> {
    Auth::source(&to.auth, &to.server_name()).map_err(MigrationError::Invalid)
}

/// Connects to `to` and authenticates both sides (`tls=`).
fn connect(to: &MigrationAddress) -> Result<Link, MigrationError> {
    let auth = source_auth(to)?;
    let host_port = to.host_port();
    let fail = |reason: String| MigrationError::Connect {
        to: host_port.clone(),
        reason,
    };
    let addresses: Vec<_> = host_port
        .to_socket_addrs()
        .map_err(|e| fail(e.to_string()))?
        .collect();
    let mut last = "no address".to_string();
    for address in addresses {
        match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
            Ok(stream) => return auth.open(stream).map_err(fail),
            Err(e) => last = api::io_reason(&e),
        }
    }
    Err(fail(last))
}

fn to_json(value: &impl Serialize) -> Result<Vec<u8>, MigrationError> {
    serde_json::to_vec(value).map_err(|e| MigrationError::Invalid(format!("state: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pages a slice takes, and whether it has them in order.
    fn slice_len(runs: &[PageRun], start: usize) -> usize {
        let mut at = start;
        for run in runs {
            assert_eq!(run.start, at, "runs are contiguous: {runs:?}");
            assert!(run.len > 0);
            at += run.len;
        }
        at - start
    }

    #[test]
    fn a_background_slice_carries_few_pages_of_data_and_spans_zero_pages() {
        let none_sent = |_| false;
        let all_data = background_slice(0, 256, none_sent, |_| false);
        assert_eq!(all_data.len(), 1);
        assert_eq!(slice_len(&all_data, 0), BACKGROUND_RUN);
        let all_zero = background_slice(0, 256, none_sent, |_| true);
        assert_eq!(
            all_zero,
            [PageRun {
                start: 0,
                len: 256,
                zero: true
            }]
        );
        // Every other page zero: BACKGROUND_RUN of data and the zeros
        // between them, stopping before the next page of data.
        let alternating = background_slice(0, 256, none_sent, |i| i % 2 == 1);
        assert_eq!(slice_len(&alternating, 0), 2 * BACKGROUND_RUN);
        assert_eq!(
            alternating.iter().filter(|r| !r.zero).count(),
            BACKGROUND_RUN
        );
        // Never past a page already sent, nor past the span.
        assert_eq!(
            slice_len(&background_slice(10, 256, |i| i == 15, |_| true), 10),
            5
        );
        assert_eq!(
            slice_len(&background_slice(10, 7, none_sent, |_| true), 10),
            7
        );
        assert!(background_slice(10, 256, |i| i == 10, |_| true).is_empty());
    }

    #[test]
    fn page_runs_alternate_and_cover_the_range() {
        let runs = page_runs(4, 6, |_| false, |i| (6..8).contains(&i), usize::MAX);
        assert_eq!(
            runs,
            [
                PageRun {
                    start: 4,
                    len: 2,
                    zero: false
                },
                PageRun {
                    start: 6,
                    len: 2,
                    zero: true
                },
                PageRun {
                    start: 8,
                    len: 2,
                    zero: false
                },
            ]
        );
        assert!(page_runs(4, 0, |_| false, |_| true, usize::MAX).is_empty());
    }

    #[test]
    fn discard_runs_cover_pages_dirty_and_sent() {
        let dirty = PageBitmap::new(20);
        let sent = PageBitmap::new(20);
        for i in [1, 2, 3, 7, 8, 15] {
            dirty.set(i);
        }
        for i in [2, 3, 7, 8, 9, 15] {
            sent.set(i);
        }
        assert_eq!(
            runs_of(&dirty, &sent, |i| i as u64),
            vec![(2, 2), (7, 2), (15, 1)]
        );
        // Contiguous indices on both sides of a hole are two runs.
        assert_eq!(
            runs_of(&dirty, &sent, |i| if i < 8 {
                i as u64
            } else {
                i as u64 + 100
            }),
            vec![(2, 2), (7, 1), (108, 1), (115, 1)]
        );
    }
}
