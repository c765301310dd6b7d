//! The display device: owns the framebuffer, the update detector, the VNC
//! server and the update thread that drives them once a refresh period.
//!
//! ```text
//! guest draws into the framebuffer (its own KVM slot)
//!   → period ends (timer; or in refresh=event, the first write after idle)
//!   → tracker.harvest(): candidate pages            (dirty::{compare,dirtylog,wp})
//!   → UpdateScanner::scan(): compare with the Screen, copy changes in,
//!     changed rectangles                            (update.rs)
//!   → VncServer::damage(rects): each client encodes and sends from the
//!     Screen in its own thread when it has asked for an update (vnc/)
//!   → AdaptivePeriod::after_period(changed)          (refresh.rs)
//! ```

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::DisplayConfig;
use crate::dirty::{
    CompareTracker, DirtyError, DirtyLogTracker, DirtyMethod, DirtyTracker, FramebufferLog,
    PageSet, WpTracker,
};
use crate::framebuffer::FramebufferMemory;
use crate::layout::FbGeometry;
use crate::metrics::{DisplayMetrics, PeriodSample, RateWindow};
use crate::refresh::{AdaptivePeriod, RefreshMode};
use crate::update::UpdateScanner;
use crate::vnc::{VncConfig, VncServer};
use crate::{InputSink, Screen};

#[derive(Debug, thiserror::Error)]
pub enum DisplayError {
    #[error("cannot map the framebuffer: {0}")]
    Memory(std::io::Error),
    #[error("{0}")]
    Dirty(#[from] DirtyError),
    #[error("cannot listen for VNC on {0}: {1}")]
    Listen(std::net::SocketAddr, std::io::Error),
    #[error("cannot start the display thread: {0}")]
    Thread(std::io::Error),
}

/// A longest single sleep, so stop requests are seen promptly even when
/// the adaptive period is long.
const SLEEP_SLICE: Duration = Duration::from_millis(100);
/// How long a run-time switch may take before the caller is answered.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Requests {
    dirty: Option<DirtyMethod>,
    refresh: Option<RefreshMode>,
    input: bool,
    stop: bool,
    /// Bumped by the update thread each time it applies requests.
    applied: u64,
}

/// The handle the rest of the VMM (API, metrics, input) holds.
pub struct DisplayControl {
    requests: Mutex<Requests>,
    wake: Condvar,
    metrics: Mutex<DisplayMetrics>,
    geometry: FbGeometry,
    guest_address: u64,
}

impl DisplayControl {
    fn lock(&self) -> std::sync::MutexGuard<'_, Requests> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn metrics(&self) -> DisplayMetrics {
        self.metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn geometry(&self) -> FbGeometry {
        self.geometry
    }

    /// Guest-physical address of the framebuffer.
    pub fn guest_address(&self) -> u64 {
        self.guest_address
    }

    /// Switches update detection and/or the refresh mode between two
    /// periods; returns once the update thread has applied it, with the
    /// switch's error if it failed (the previous method then stays).
    pub fn reconfigure(
        &self,
        dirty: Option<DirtyMethod>,
        refresh: Option<RefreshMode>,
    ) -> Result<(), String> {
        let target = {
            let mut r = self.lock();
            if r.stop {
                return Err("the display has stopped".into());
            }
            r.dirty = dirty.or(r.dirty);
            r.refresh = refresh.or(r.refresh);
            r.applied + 1
        };
        self.wake.notify_all();
        let r = self.lock();
        let (r, timeout) = self
            .wake
            .wait_timeout_while(r, SWITCH_TIMEOUT, |r| r.applied < target && !r.stop)
            .unwrap_or_else(|e| e.into_inner());
        drop(r);
        if timeout.timed_out() {
            return Err("the display did not apply the change in time".into());
        }
        let m = self.metrics();
        match (dirty, &m.last_error) {
            (Some(want), Some(e)) if m.dirty != want => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Keyboard or pointer input: back to the base period at once.
    pub fn note_input(&self) {
        self.lock().input = true;
        self.wake.notify_all();
    }

    fn stop(&self) {
        self.lock().stop = true;
        self.wake.notify_all();
    }
}

/// Passes input on to the guest and tells the display about it.
struct InputWatch {
    inner: Arc<dyn InputSink>,
    control: Arc<DisplayControl>,
}

impl InputSink for InputWatch {
    fn key(&self, keysym: u32, down: bool) {
        self.control.note_input();
        self.inner.key(keysym, down);
    }

    fn pointer(&self, x: u16, y: u16, buttons: u8) {
        self.control.note_input();
        self.inner.pointer(x, y, buttons);
    }
}

/// A running display.
pub struct Display {
    control: Arc<DisplayControl>,
    vnc_address: std::net::SocketAddr,
    websocket_address: Option<std::net::SocketAddr>,
    thread: Option<JoinHandle<()>>,
}

impl Display {
    /// Starts update detection over `memory` — the framebuffer, which the
    /// guest sees at `guest_address` through a memory slot whose dirty log
    /// is `log` — and the VNC server. Fails before the guest runs if any of
    /// it is unavailable (e.g. `dirty=wp` without userfaultfd). The first
    /// period sends whatever `memory` holds (black, or a restored picture).
    pub fn start(
        config: &DisplayConfig,
        memory: Arc<FramebufferMemory>,
        log: Arc<dyn FramebufferLog>,
        guest_address: u64,
        input: Arc<dyn InputSink>,
    ) -> Result<Display, DisplayError> {
        let g = config.geometry;
        let framebuffer = Framebuffer { memory, log };
        let tracker = make_tracker(config.dirty, &framebuffer)?;
        let control = Arc::new(DisplayControl {
            requests: Mutex::new(Requests::default()),
            wake: Condvar::new(),
            metrics: Mutex::new(DisplayMetrics::new(
                config.dirty,
                g.layout,
                config.refresh,
                g.width,
                g.height,
            )),
            geometry: g,
            guest_address,
        });
        let screen = Arc::new(Screen::new(g.width, g.height));
        if config.password_on_command_line {
            tracing::warn!(
                "the VNC password was given as password= on the command line, where every \
                 user of this host can read it (ps, /proc/PID/cmdline); use password_file=PATH"
            );
        }
        let vnc = VncServer::start(
            VncConfig {
                listen: config.listen,
                websocket: config.websocket,
                password: config.password.clone(),
                name: "hakoniwa".into(),
                front_door: config.front_door.clone(),
            },
            screen.clone(),
            Arc::new(InputWatch {
                inner: input,
                control: control.clone(),
            }),
        )
        .map_err(|e| DisplayError::Listen(config.listen, e))?;
        let vnc_address = vnc.local_addr();
        let websocket_address = vnc.websocket_addr();
        {
            let mut m = control.metrics.lock().unwrap_or_else(|e| e.into_inner());
            m.vnc_address = vnc_address.to_string();
            m.websocket_address = websocket_address.map(|a| a.to_string());
        }
        let updater = Updater {
            control: control.clone(),
            framebuffer,
            tracker,
            screen,
            vnc,
            scanner: UpdateScanner::new(g),
            period: AdaptivePeriod::default(),
            refresh: config.refresh,
            woken_by_write: false,
        };
        let thread = std::thread::Builder::new()
            .name("display".into())
            .spawn(move || {
                sandbox::enter_or_exit(sandbox::ThreadKind::Display);
                updater.run()
            })
            .map_err(DisplayError::Thread)?;
        tracing::info!(
            "display: {}x{} {} framebuffer at {guest_address:#x}, dirty={}, refresh={}, VNC on {vnc_address}",
            g.width,
            g.height,
            g.layout,
            config.dirty,
            config.refresh
        );
        Ok(Display {
            control,
            vnc_address,
            websocket_address,
            thread: Some(thread),
        })
    }

    pub fn control(&self) -> Arc<DisplayControl> {
        self.control.clone()
    }

    pub fn vnc_address(&self) -> std::net::SocketAddr {
        self.vnc_address
    }

    pub fn websocket_address(&self) -> Option<std::net::SocketAddr> {
        self.websocket_address
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        self.control.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The framebuffer's memory and its slot's dirty log.
struct Framebuffer {
    memory: Arc<FramebufferMemory>,
    log: Arc<dyn FramebufferLog>,
}

fn make_tracker(
    method: DirtyMethod,
    fb: &Framebuffer,
) -> Result<Box<dyn DirtyTracker>, DirtyError> {
    Ok(match method {
        DirtyMethod::Compare => Box::new(CompareTracker),
        DirtyMethod::DirtyLog => {
            Box::new(DirtyLogTracker::new(&fb.log, fb.memory.geometry().pages())?)
        }
        DirtyMethod::Wp => Box::new(WpTracker::new(fb.memory.clone())?),
    })
}

/// The update thread's state.
struct Updater {
    control: Arc<DisplayControl>,
    framebuffer: Framebuffer,
    tracker: Box<dyn DirtyTracker>,
    screen: Arc<Screen>,
    vnc: VncServer,
    scanner: UpdateScanner,
    period: AdaptivePeriod,
    refresh: RefreshMode,
    /// The last wait was ended by a guest write (refresh=event): the next
    /// wait is a plain timer wait, so the guest gets a whole base period to
    /// write before detection is re-armed. Without this, a guest rewriting
    /// the same pixels (no visible change, so the period stays "idle")
    /// would be re-armed after every single fault and crawl.
    woken_by_write: bool,
}

impl Updater {
    fn run(mut self) {
        let mut pages = PageSet::new(self.control.geometry.pages());
        let mut window = RateWindow::new(&self.control.metrics());
        let mut last = Instant::now();
        loop {
            if !self.apply_requests() {
                break;
            }
            let woken = self.wait(last);
            if let Err(e) = &woken {
                tracing::error!("display: waiting for updates failed: {e}");
                self.control
                    .metrics
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .last_error = Some(e.to_string());
                // Keep serving clients with the baseline.
                self.tracker = Box::new(CompareTracker);
            }
            last = Instant::now();

            pages.clear();
            let t0 = Instant::now();
            if let Err(e) = self.tracker.harvest(&mut pages) {
                tracing::error!("display: update detection failed, comparing instead: {e}");
                self.tracker = Box::new(CompareTracker);
                pages.insert_all();
            }
            let t1 = Instant::now();
            let changes = self
                .scanner
                .scan(&self.framebuffer.memory, &pages, &self.screen);
            let t2 = Instant::now();
            for m in &changes.moves {
                self.vnc.copy(m.src, m.dst_x, m.dst_y);
            }
            if !changes.rects.is_empty() {
                self.vnc.damage(&changes.rects);
            }
            let changed = !changes.rects.is_empty() || !changes.moves.is_empty();
            self.period.after_period(changed);
            self.woken_by_write = matches!(woken, Ok(true));
            if self.woken_by_write {
                // The guest is active again: like input, back to the base period.
                self.period.on_input();
            }

            let mut m = self
                .control
                .metrics
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            m.record(PeriodSample {
                detect_ms: (t1 - t0).as_secs_f64() * 1e3,
                compare_ms: (t2 - t1).as_secs_f64() * 1e3,
                pages_reported: pages.len(),
                pages_changed: changes.pages_changed,
                pixels_changed: changes.pixels_changed,
                rects: changes.rects.len() + changes.moves.len(),
            });
            m.dirty = self.tracker.method();
            m.refresh = self.refresh;
            m.period_ms = self.period.current().as_secs_f64() * 1e3;
            m.tracker = self.tracker.counters();
            m.vnc = self.vnc.stats();
            window.tick(&mut m);
        }
        self.vnc.shutdown();
    }

    /// Applies switches and input notes; false when told to stop.
    fn apply_requests(&mut self) -> bool {
        let mut r = self.control.lock();
        if r.stop {
            return false;
        }
        if std::mem::take(&mut r.input) {
            self.period.on_input();
        }
        let dirty = r.dirty.take();
        let refresh = r.refresh.take();
        drop(r);
        if let Some(refresh) = refresh {
            self.refresh = refresh;
        }
        let mut error = None;
        if let Some(method) = dirty.filter(|m| *m != self.tracker.method()) {
            // The old tracker goes first: dirty logging off, protection
            // lifted, before the new one arms.
            let old = self.tracker.method();
            self.tracker = Box::new(CompareTracker);
            match make_tracker(method, &self.framebuffer) {
                Ok(t) => {
                    tracing::info!("display: update detection {old} -> {method}");
                    self.tracker = t;
                }
                Err(e) => {
                    tracing::error!("display: cannot switch to {method}: {e}");
                    error = Some(e.to_string());
                    if let Ok(t) = make_tracker(old, &self.framebuffer) {
                        self.tracker = t;
                    }
                }
            }
        }
        {
            let mut m = self
                .control
                .metrics
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if dirty.is_some() {
                m.last_error = error;
            }
            m.dirty = self.tracker.method();
            m.refresh = self.refresh;
        }
        let mut r = self.control.lock();
        r.applied += 1;
        drop(r);
        self.control.wake.notify_all();
        true
    }

    /// Waits for the end of the period that started at `since`; true when
    /// a guest write ended it early (refresh=event).
    fn wait(&mut self, since: Instant) -> Result<bool, DirtyError> {
        let deadline = since + self.period.current();
        let event = self.refresh == RefreshMode::Event
            && self.period.is_idle()
            && !std::mem::take(&mut self.woken_by_write);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            let slice = (deadline - now).min(SLEEP_SLICE);
            if event {
                if self.tracker.wait_for_write(slice)? {
                    return Ok(true);
                }
            } else {
                let r = self.control.lock();
                let (r, _) = self
                    .control
                    .wake
                    .wait_timeout_while(r, slice, |r| {
                        !r.stop && !r.input && r.dirty.is_none() && r.refresh.is_none()
                    })
                    .unwrap_or_else(|e| e.into_inner());
                if r.stop || r.dirty.is_some() || r.refresh.is_some() {
                    return Ok(false);
                }
                if r.input {
                    // Input ends an idle wait: the period resets to the base.
                    return Ok(false);
                }
            }
            let r = self.control.lock();
            if r.stop || r.input || r.dirty.is_some() || r.refresh.is_some() {
                return Ok(false);
            }
        }
    }
}
