//! When to look for updates: the paper's adaptive period (also QEMU's VNC
//! timer): 30 ms to start; +50 ms after a period with no change; halved
//! (not below 30 ms) after a change; back to 30 ms on keyboard or pointer
//! input.

use std::time::Duration;

pub const BASE_PERIOD: Duration = Duration::from_millis(30);
pub const IDLE_STEP: Duration = Duration::from_millis(50);
/// An upper bound the paper does not state: QEMU stops at 3 s.
pub const MAX_PERIOD: Duration = Duration::from_millis(3000);

/// What ends a period: `refresh=` (defined once, in the `choices` crate).
pub use choices::RefreshMode;

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
