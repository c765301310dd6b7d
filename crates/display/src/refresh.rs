//! When to look for updates: the paper's adaptive period (also QEMU's VNC
//! timer): 30 ms to start; +50 ms after a period with no change; halved
//! (not below 30 ms) after a change; back to 30 ms on keyboard or pointer
//! input.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub const BASE_PERIOD: Duration = Duration::from_millis(30);
pub const IDLE_STEP: Duration = Duration::from_millis(50);
/// An upper bound the paper does not state: QEMU stops at 3 s.
pub const MAX_PERIOD: Duration = Duration::from_millis(3000);

/// How a period ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RefreshMode {
    /// The timer only (the paper; every VMM today).
    Timer,
    /// The timer, but during an idle stretch (period above the base) the
    /// guest's first write to the framebuffer ends the wait at once.
    Event,
}

impl RefreshMode {
    pub fn name(self) -> &'static str {
        match self {
            RefreshMode::Timer => "timer",
            RefreshMode::Event => "event",
        }
    }
}

impl fmt::Display for RefreshMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RefreshMode {
    type Err = String;
    fn from_str(s: &str) -> Result<RefreshMode, String> {
        match s {
            "timer" => Ok(RefreshMode::Timer),
            "event" => Ok(RefreshMode::Event),
            _ => Err(format!("unknown refresh '{s}' (timer or event)")),
        }
    }
}

/// The adaptive refresh period.
#[derive(Clone, Copy, Debug)]
pub struct AdaptivePeriod {
    period: Duration,
}

impl Default for AdaptivePeriod {
    fn default() -> Self {
        AdaptivePeriod {
            period: BASE_PERIOD,
        }
    }
}

impl AdaptivePeriod {
    pub fn current(&self) -> Duration {
        self.period
    }

    /// Idle: the period is above the base.
    pub fn is_idle(&self) -> bool {
        self.period > BASE_PERIOD
    }

    /// After a period: `changed` says whether anything on screen changed.
    pub fn after_period(&mut self, changed: bool) {
        self.period = if changed {
            (self.period / 2).max(BASE_PERIOD)
        } else {
            (self.period + IDLE_STEP).min(MAX_PERIOD)
        };
    }

    /// Keyboard or pointer input arrived.
    pub fn on_input(&mut self) {
        self.period = BASE_PERIOD;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_paper() {
        let mut p = AdaptivePeriod::default();
        assert_eq!(p.current(), Duration::from_millis(30));
        p.after_period(false);
        p.after_period(false);
        assert_eq!(p.current(), Duration::from_millis(130));
        assert!(p.is_idle());
        p.after_period(true);
        assert_eq!(p.current(), Duration::from_millis(65));
        p.after_period(true);
        p.after_period(true);
        assert_eq!(p.current(), Duration::from_millis(30));
        for _ in 0..100 {
            p.after_period(false);
        }
        assert_eq!(p.current(), MAX_PERIOD);
        p.on_input();
        assert_eq!(p.current(), BASE_PERIOD);
        assert!(!p.is_idle());
    }
}
