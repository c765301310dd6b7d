//! The display's figures, as the paper reports them: update-detection time
//! per period and its split (detect / compare, and the VNC side's encode /
//! send), pages reported dirty vs pages really changed (the "useful
//! detection ratio"), detections per second (the paper's frame rate) and
//! CPU use.

use std::time::{Duration, Instant};

use crate::dirty::{DirtyMethod, TrackerCounters};
use crate::layout::Layout;
use crate::refresh::RefreshMode;
use crate::vnc::VncStats;

/// One refresh period.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PeriodSample {
    /// Harvesting the candidate pages (dirty log read + clear, or taking
    /// the write-protect faults and re-arming, or nothing for compare).
    pub detect_ms: f64,
    /// Comparing candidate pages with the screen copy and making rectangles.
    pub compare_ms: f64,
    pub pages_reported: usize,
    pub pages_changed: usize,
    pub pixels_changed: u64,
    pub rects: usize,
}

/// Totals and rates since the display started.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DisplayMetrics {
    /// Where VNC clients connect (and WebSocket clients, if enabled).
    pub vnc_address: String,
    pub websocket_address: Option<String>,
    pub dirty: DirtyMethod,
    pub layout: Layout,
    pub refresh: RefreshMode,
    pub width: u16,
    pub height: u16,
    /// The adaptive refresh period now.
    pub period_ms: f64,
    /// Detection periods run.
    pub periods: u64,
    /// Periods that found a change (updates published to clients).
    pub updates: u64,
    /// Detection periods per second over the last window (the paper's
    /// "frame rate").
    pub detections_per_s: f64,
    /// Mean detect + compare time per period over the last window.
    pub detection_ms: f64,
    pub detect_ms_total: f64,
    pub compare_ms_total: f64,
    pub pages_reported: u64,
    pub pages_changed: u64,
    /// pages_changed / pages_reported: how much of what detection reports
    /// really changed.
    pub useful_ratio: f64,
    /// CPU time of the whole VMM process (vCPU threads included) and of the
    /// display's update thread, as a percentage of one CPU over the window.
    pub cpu_process_percent: f64,
    pub cpu_display_percent: f64,
    pub last: PeriodSample,
    pub tracker: TrackerCounters,
    pub vnc: VncStats,
    /// The last failed switch of the detection method, if any.
    pub last_error: Option<String>,
}

impl DisplayMetrics {
    pub fn new(dirty: DirtyMethod, layout: Layout, refresh: RefreshMode, w: u16, h: u16) -> Self {
        DisplayMetrics {
            vnc_address: String::new(),
            websocket_address: None,
            dirty,
            layout,
            refresh,
            width: w,
            height: h,
            period_ms: 0.0,
            periods: 0,
            updates: 0,
            detections_per_s: 0.0,
            detection_ms: 0.0,
            detect_ms_total: 0.0,
            compare_ms_total: 0.0,
            pages_reported: 0,
            pages_changed: 0,
            useful_ratio: 0.0,
            cpu_process_percent: 0.0,
            cpu_display_percent: 0.0,
            last: PeriodSample::default(),
            tracker: TrackerCounters::default(),
            vnc: VncStats::default(),
            last_error: None,
        }
    }

    pub fn record(&mut self, sample: PeriodSample) {
        self.periods += 1;
        if sample.rects > 0 {
            self.updates += 1;
        }
        self.detect_ms_total += sample.detect_ms;
        self.compare_ms_total += sample.compare_ms;
        self.pages_reported += sample.pages_reported as u64;
        self.pages_changed += sample.pages_changed as u64;
        if self.pages_reported > 0 {
            self.useful_ratio = self.pages_changed as f64 / self.pages_reported as f64;
        }
        self.last = sample;
    }
}

/// Rates over windows of about a second.
pub struct RateWindow {
    start: Instant,
    periods: u64,
    detection_ms: f64,
    process_cpu: Duration,
    thread_cpu: Duration,
}

pub const WINDOW: Duration = Duration::from_secs(1);

impl RateWindow {
    pub fn new(m: &DisplayMetrics) -> RateWindow {
        RateWindow {
            start: Instant::now(),
            periods: m.periods,
            detection_ms: m.detect_ms_total + m.compare_ms_total,
            process_cpu: cpu_time(libc::RUSAGE_SELF),
            thread_cpu: cpu_time(libc::RUSAGE_THREAD),
        }
    }

    /// Call from the update thread after each period: when a window has
    /// passed, writes the rates into `m` and starts the next window.
    pub fn tick(&mut self, m: &mut DisplayMetrics) {
        let elapsed = self.start.elapsed();
        if elapsed < WINDOW {
            return;
        }
        let next = RateWindow::new(m);
        let secs = elapsed.as_secs_f64();
        let periods = m.periods - self.periods;
        m.detections_per_s = periods as f64 / secs;
        m.detection_ms = if periods > 0 {
            (next.detection_ms - self.detection_ms) / periods as f64
        } else {
            0.0
        };
        m.cpu_process_percent =
            100.0 * (next.process_cpu.saturating_sub(self.process_cpu)).as_secs_f64() / secs;
        m.cpu_display_percent =
            100.0 * (next.thread_cpu.saturating_sub(self.thread_cpu)).as_secs_f64() / secs;
        *self = next;
    }
}

/// User + system CPU time of the process or the calling thread.
fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: getrusage fills the zeroed struct we pass; rusage is plain
    // data for which all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    if unsafe { libc::getrusage(who, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
