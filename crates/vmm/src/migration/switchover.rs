//! The precopy switch-over decision (docs/migration.md): after each round,
//! run another, stop the guest and copy the rest, or (hybrid) switch to
//! postcopy. Pure: a round's figures in, a [`Decision`] out, no KVM and no
//! I/O; `source.rs` measures the rounds and carries the decision out.
//!
//! - [`PrecopyOnly`] (the baseline, `--mode precopy`): stop once the rest
//!   fits the downtime limit at the measured bandwidth; after
//!   `--max-rounds` stop anyway.
//! - [`Hybrid`] (`--mode hybrid`): the same stop, but switch to postcopy as
//!   soon as the guest dirties at least [`HYBRID_SWITCH_RATIO`] of what the
//!   link sends (from round [`HYBRID_FIRST_ROUND`]), or after
//!   `--max-rounds`.

use super::protocol::PAGE_SIZE;
use super::MigrationMode;

/// Hybrid switches once the dirty rate reaches this share of the
/// bandwidth: each round shrinks the rest by about rate / bandwidth, and at
/// 0.8 or more it will not get under the limit in time.
pub const HYBRID_SWITCH_RATIO: f64 = 0.8;
/// The first round whose dirty rate may make hybrid switch (round 1 sends
/// all of RAM).
pub const HYBRID_FIRST_ROUND: u32 = 2;

const MIB: f64 = (1 << 20) as f64;

/// One precopy round as the source measured it, with the request's limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundFigures {
    /// The round just sent, from 1 (round 1 is all of RAM).
    pub round: u32,
    /// Pages the round sent.
    pub pages_sent: usize,
    /// Pages the guest dirtied since the previous harvest of the log.
    pub pages_dirtied: usize,
    /// Seconds since that harvest: what the dirty rate is over (> 0).
    pub dirty_seconds: f64,
    /// Seconds the round's sending took.
    pub round_seconds: f64,
    /// Bytes per second the round was sent at.
    pub bandwidth: f64,
    /// Pages still to send: dirty now.
    pub remaining: usize,
    /// The downtime to aim for, ms (`--max-downtime`).
    pub max_downtime_ms: u64,
    /// Rounds after the first before precopy stops converging
    /// (`--max-rounds`).
    pub max_rounds: u32,
}

impl RoundFigures {
    /// Pages the guest dirties per second.
    pub fn dirty_rate(&self) -> f64 {
        self.pages_dirtied as f64 / self.dirty_seconds
    }

    /// Seconds the remaining pages would take at this round's bandwidth:
    /// the downtime if the guest stopped now.
    pub fn predicted_downtime_s(&self) -> f64 {
        self.remaining as f64 * PAGE_SIZE as f64 / self.bandwidth.max(1.0)
    }

    /// The rest fits the downtime limit.
    fn converged(&self) -> bool {
        self.predicted_downtime_s() <= self.max_downtime_ms as f64 / 1000.0
    }
}

/// What to do after a round.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Send what the guest dirtied meanwhile.
    NextRound,
    /// The rest fits the downtime limit: stop the guest and copy it.
    StopAndCopy,
    /// Precopy did not converge within its rounds: stop and copy anyway,
    /// over the downtime limit (`reason` for the log).
    GiveUp { reason: String },
    /// Stop the guest and go on in postcopy (`reason`: the report's
    /// `switch_reason`).
    SwitchToPostcopy { reason: String },
}

/// Decides after each precopy round.
pub trait SwitchOverPolicy: Send {
    fn decide(&mut self, round: &RoundFigures) -> Decision;
}

/// The policy of a migration `mode`. Postcopy runs no precopy rounds, so
/// it never asks; it gets the baseline.
pub fn for_mode(mode: MigrationMode) -> Box<dyn SwitchOverPolicy> {
    match mode {
        MigrationMode::Hybrid => Box::new(Hybrid),
        MigrationMode::Precopy | MigrationMode::Postcopy => Box::new(PrecopyOnly),
    }
}

/// `--mode precopy`: rounds until the rest fits the downtime limit, or
/// `--max-rounds` of them.
#[derive(Clone, Copy, Debug, Default)]
pub struct PrecopyOnly;

impl SwitchOverPolicy for PrecopyOnly {
    fn decide(&mut self, r: &RoundFigures) -> Decision {
        if r.converged() {
            Decision::StopAndCopy
        } else if r.round > r.max_rounds {
            Decision::GiveUp {
                reason: format!(
                    "precopy did not converge in {} rounds: stopping with {} pages left",
                    r.max_rounds, r.remaining
                ),
            }
        } else {
            Decision::NextRound
        }
    }
}

/// `--mode hybrid`: precopy rounds; postcopy as soon as the dirty rate says
/// they will not converge, or after `--max-rounds`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Hybrid;

impl SwitchOverPolicy for Hybrid {
    fn decide(&mut self, r: &RoundFigures) -> Decision {
        if r.converged() {
            return Decision::StopAndCopy;
        }
        if r.round >= HYBRID_FIRST_ROUND {
            let dirty_bytes_rate = r.dirty_rate() * PAGE_SIZE as f64;
            let ratio = dirty_bytes_rate / r.bandwidth.max(1.0);
            if ratio >= HYBRID_SWITCH_RATIO {
                return Decision::SwitchToPostcopy {
                    reason: format!(
                        "round {}: the guest dirties {:.1} MiB/s against {:.1} MiB/s sent (ratio {ratio:.2}); {} pages left would take {:.0} ms, over the {} ms limit",
                        r.round,
                        dirty_bytes_rate / MIB,
                        r.bandwidth / MIB,
                        r.remaining,
                        r.predicted_downtime_s() * 1000.0,
                        r.max_downtime_ms
                    ),
                };
            }
        }
        if r.round > r.max_rounds {
            return Decision::SwitchToPostcopy {
                reason: format!(
                    "no convergence after {} rounds ({} pages left)",
                    r.max_rounds, r.remaining
                ),
            };
        }
        Decision::NextRound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGES_PER_MIB: usize = (1 << 20) / PAGE_SIZE;

    /// Round `round` sent at `mib_s` MiB/s while the guest dirtied
    /// `dirty_mib_s` MiB/s (over one second); `left_mib` to go; the
    /// defaults' limits (300 ms, 30 rounds).
    fn round(round: u32, mib_s: f64, dirty_mib_s: f64, left_mib: usize) -> RoundFigures {
        RoundFigures {
            round,
            pages_sent: 1000,
            pages_dirtied: (dirty_mib_s * PAGES_PER_MIB as f64) as usize,
            dirty_seconds: 1.0,
            round_seconds: 0.5,
            bandwidth: mib_s * MIB,
            remaining: left_mib * PAGES_PER_MIB,
            max_downtime_ms: 300,
            max_rounds: 30,
        }
    }

    #[test]
    fn the_figures_the_decisions_rest_on() {
        let r = round(3, 10.0, 8.0, 100);
        assert_eq!(r.dirty_rate(), 2048.0);
        assert_eq!(r.predicted_downtime_s(), 10.0);
        // No bandwidth measured (an empty round): taken as 1 byte/s.
        let r = RoundFigures {
            bandwidth: 0.0,
            remaining: 1,
            ..r
        };
        assert_eq!(r.predicted_downtime_s(), PAGE_SIZE as f64);
    }

    #[test]
    fn precopy_stops_once_the_rest_fits_and_after_its_rounds() {
        let mut p = PrecopyOnly;
        // 3 MiB at 10 MiB/s: exactly the 300 ms limit.
        assert_eq!(p.decide(&round(1, 10.0, 0.0, 3)), Decision::StopAndCopy);
        assert_eq!(p.decide(&round(5, 10.0, 50.0, 3)), Decision::StopAndCopy);
        assert_eq!(p.decide(&round(1, 10.0, 0.0, 4)), Decision::NextRound);
        // A guest that dirties faster than the link: precopy goes on...
        for n in 1..=30 {
            assert_eq!(p.decide(&round(n, 10.0, 50.0, 100)), Decision::NextRound);
        }
        // ...until max_rounds are over, then stops anyway.
        assert_eq!(
            p.decide(&round(31, 10.0, 50.0, 100)),
            Decision::GiveUp {
                reason: "precopy did not converge in 30 rounds: stopping with 25600 pages left"
                    .into()
            }
        );
    }

    #[test]
    fn hybrid_switches_on_the_dirty_rate_from_round_two() {
        let mut h = Hybrid;
        // The rest fits: stop, whatever the dirty rate.
        assert_eq!(h.decide(&round(4, 10.0, 50.0, 2)), Decision::StopAndCopy);
        // Round 1 (all of RAM) never switches on its rate.
        assert_eq!(h.decide(&round(1, 10.0, 50.0, 100)), Decision::NextRound);
        // Dirtying at 0.8 of the bandwidth: switch, and say why.
        assert_eq!(
            h.decide(&round(2, 10.0, 8.0, 100)),
            Decision::SwitchToPostcopy {
                reason: "round 2: the guest dirties 8.0 MiB/s against 10.0 MiB/s sent (ratio 0.80); 25600 pages left would take 10000 ms, over the 300 ms limit".into()
            }
        );
        // Below 0.8: another round.
        assert_eq!(h.decide(&round(2, 10.0, 7.9, 100)), Decision::NextRound);
        assert_eq!(h.decide(&round(30, 10.0, 7.9, 100)), Decision::NextRound);
    }

    #[test]
    fn hybrid_switches_after_its_rounds() {
        let mut h = Hybrid;
        let slow = RoundFigures {
            max_rounds: 4,
            ..round(5, 10.0, 1.0, 100)
        };
        assert_eq!(
            h.decide(&slow),
            Decision::SwitchToPostcopy {
                reason: "no convergence after 4 rounds (25600 pages left)".into()
            }
        );
        let last = RoundFigures { round: 4, ..slow };
        assert_eq!(h.decide(&last), Decision::NextRound);
    }

    #[test]
    fn each_mode_has_its_policy() {
        let r = round(2, 10.0, 9.0, 100);
        assert!(matches!(
            for_mode(MigrationMode::Hybrid).decide(&r),
            Decision::SwitchToPostcopy { .. }
        ));
        assert_eq!(
            for_mode(MigrationMode::Precopy).decide(&r),
            Decision::NextRound
        );
    }
}
