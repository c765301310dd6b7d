//! hakoniwa's own diagnostics on stderr.
//!
//! Every crate reports device errors, guest misbehaviour and host notes
//! through `tracing` (`tracing::warn!` and friends). This installs the one
//! subscriber that prints them: warnings and errors by default, one line
//! each (`hakoniwa: warning: ...`, like the exit messages), with the level
//! per crate settable through `HK_LOG` (`HK_LOG=info`,
//! `HK_LOG=devices=debug,warn`: tracing-subscriber's `Targets` syntax).
//!
//! A guest can provoke most of these messages (a malformed descriptor
//! chain, a bad MSI-X write) as fast as it likes, so each call site may
//! print a burst, then is quiet for the rest of its window; the next line
//! it prints says how many were suppressed ([`RateLimit`]), as the
//! kernel's printk_ratelimit does.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::Hash;
use std::io::Write as _;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The environment variable that sets the levels.
pub const LEVEL_VAR: &str = "HK_LOG";
/// Lines one call site may print per window.
const BURST: u32 = 10;
/// The rate limit's window.
const WINDOW: Duration = Duration::from_secs(5);

/// Installs the stderr subscriber. A malformed `HK_LOG` is reported once
/// and the default (warnings and errors) used: a diagnostic setting must
/// not stop a VM from starting.
pub fn init() {
    let targets = match std::env::var(LEVEL_VAR) {
        Ok(text) => text.parse::<Targets>().unwrap_or_else(|e| {
            eprintln!("hakoniwa: warning: {LEVEL_VAR}={text:?} ignored ({e}); printing warnings and errors");
            default_targets()
        }),
        Err(_) => default_targets(),
    };
    let stderr = LineLayer::new(|line: &str| {
        // One write per line, so lines of different threads do not mix.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    });
    // Fails only if a subscriber is already set (never, in this binary).
    let _ = tracing_subscriber::registry()
        .with(stderr.with_filter(targets))
        .try_init();
}

fn default_targets() -> Targets {
    Targets::new().with_default(Level::WARN)
}

/// Formats each admitted event as one line (with its newline) and hands
/// it to the sink: stderr in the binary, a buffer in the tests.
struct LineLayer<F> {
    limit: Mutex<RateLimit<tracing::callsite::Identifier>>,
    sink: F,
}

impl<F: Fn(&str) + 'static> LineLayer<F> {
    fn new(sink: F) -> LineLayer<F> {
        LineLayer {
            limit: Mutex::new(RateLimit::new(BURST, WINDOW)),
            sink,
        }
    }
}

impl<S: Subscriber, F: Fn(&str) + 'static> Layer<S> for LineLayer<F> {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let admitted = self
            .limit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(meta.callsite(), Instant::now());
        let Some(suppressed) = admitted else { return };
        let mut line = LineVisitor::default();
        event.record(&mut line);
        let mut text = format!("hakoniwa: {}: {}", level_word(*meta.level()), line.message);
        text.push_str(&line.fields);
        if suppressed > 0 {
            let _ = write!(text, " ({suppressed} more like this suppressed)");
        }
        text.push('\n');
        (self.sink)(&text);
    }
}

fn level_word(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// The event's message, then its other fields as ` key=value`; newlines
/// (from a guest-supplied string, say) become spaces so a line stays one.
#[derive(Default)]
struct LineVisitor {
    message: String,
    fields: String,
}

impl Visit for LineVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        self.put(field, &text);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value);
    }
}

impl LineVisitor {
    fn put(&mut self, field: &Field, value: &str) {
        let value = one_line(value);
        if field.name() == "message" {
            self.message = value;
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A per-key rate limit: `burst` admissions per `window`, then silence
/// until the window ends; the first admission after silence reports how
/// many were refused. Pure (the caller gives the time), so it is tested
/// without a clock.
pub struct RateLimit<K> {
    burst: u32,
    window: Duration,
    sites: HashMap<K, Site>,
}

struct Site {
    window_start: Instant,
    admitted: u32,
    suppressed: u64,
}

impl<K: Hash + Eq> RateLimit<K> {
    pub fn new(burst: u32, window: Duration) -> RateLimit<K> {
        RateLimit {
            burst,
            window,
            sites: HashMap::new(),
        }
    }

    /// Whether `key` may print at `now`: `Some(n)` with the number of its
    /// lines suppressed since it last printed, or `None` to stay quiet.
    pub fn admit(&mut self, key: K, now: Instant) -> Option<u64> {
        let site = self.sites.entry(key).or_insert(Site {
            window_start: now,
            admitted: 0,
            suppressed: 0,
        });
        if now.saturating_duration_since(site.window_start) >= self.window {
            site.window_start = now;
            site.admitted = 0;
        }
        if site.admitted < self.burst {
            site.admitted += 1;
            Some(std::mem::take(&mut site.suppressed))
        } else {
            site.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_then_the_rest_of_the_window_is_counted() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(3, Duration::from_secs(5));
        let admitted: Vec<_> = (0..5)
            .map(|i| limit.admit("site", t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(admitted, [Some(0), Some(0), Some(0), None, None]);
        // The next window: admitted again, saying two were suppressed.
        assert_eq!(limit.admit("site", t0 + Duration::from_secs(5)), Some(2));
        assert_eq!(limit.admit("site", t0 + Duration::from_secs(6)), Some(0));
    }

    #[test]
    fn call_sites_are_limited_separately() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(1, Duration::from_secs(5));
        assert_eq!(limit.admit("a", t0), Some(0));
        assert_eq!(limit.admit("a", t0), None);
        assert_eq!(limit.admit("b", t0), Some(0));
    }

    #[test]
    fn a_steady_trickle_below_the_burst_is_never_suppressed() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(2, Duration::from_secs(5));
        for i in 0..20 {
            assert_eq!(limit.admit("a", t0 + Duration::from_secs(3 * i)), Some(0));
        }
    }

    /// The lines a burst of events from one call site gives.
    fn lines_of(events: usize) -> Vec<String> {
        use std::sync::Arc;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let layer = LineLayer::new(move |line: &str| sink.lock().unwrap().push(line.to_string()));
        let subscriber = tracing_subscriber::registry().with(layer.with_filter(default_targets()));
        tracing::subscriber::with_default(subscriber, || {
            for i in 0..events {
                tracing::warn!(queue = i, "disk: bad chain\nfrom the guest");
                tracing::info!("not printed by default");
            }
            tracing::error!("a second site");
        });
        let lines = lines.lock().unwrap().clone();
        lines
    }

    #[test]
    fn events_are_one_line_each_and_a_flood_is_cut_to_the_burst() {
        let lines = lines_of(BURST as usize + 5);
        assert_eq!(lines.len(), BURST as usize + 1, "{lines:?}");
        assert_eq!(
            lines[0],
            "hakoniwa: warning: disk: bad chain from the guest queue=0\n"
        );
        assert_eq!(lines.last().unwrap(), "hakoniwa: error: a second site\n");
    }

    #[test]
    fn control_characters_do_not_break_the_line() {
        assert_eq!(one_line("a\nb\r\x1b[2Jc"), "a b  [2Jc");
    }
}
