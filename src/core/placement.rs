//! Placement: which bucket a message waits in for the time it has left, per strategy.
//!
//! - `round-up`: the smallest rung at least the time left (longer than the top
//!   rung: the top rung, again and again). One hop; late by up to the gap to
//!   the next rung.
//! - `cascade`: the largest rung not longer than the time left, again at every
//!   expiry; below the smallest rung, finer rungs the router adds itself (halving
//!   down to [`HOLD_BELOW`]); the last fraction the router times itself while
//!   the delivery stays unacked. Never early; late by milliseconds.
//! - `priority`: round-up buckets with `x-max-priority`; the message carries a
//!   per-message `expiration` of the time left and a priority that rises as its
//!   delay falls within the bucket's range. Only as good as the broker's expiry
//!   of priority queues (see README).

use crate::core::ladder::{Ladder, Rung};
use std::{fmt, str::FromStr, time::Duration};

/// Below this the cascade router times the rest itself instead of using a bucket.
pub const HOLD_BELOW: Duration = Duration::from_millis(250);
/// While it has room ([`Context::hold_up_to`](crate::core::decision::Context)),
/// the cascade router times up to this much itself: the finer rungs' hops it
/// saves (about one in three hops of a 1–60 s delay) each cost the broker a
/// publish, a confirm, a dead-lettering, a delivery and an ack.
pub const HOLD_WITH_ROOM: Duration = Duration::from_secs(2);
/// A message due within this long after its bucket expires it is sorted into
/// the due lane (`[placement] due_within`).
///
/// A bucket expires what it holds in waves when many messages entered it
/// together, and the router then works through them in the order the
/// broker dead-lettered them. In the expired lane a message is late only if
/// that backlog outlasts the time it has left, which is at least this long;
/// the due lane holds only what has less, and the router serves it first.
/// One minute. Before the chains it was five: every `5m` hop then came
/// back through the router, and a bound below the backlog such a wave left
/// made the expired lane late instead. With the chains what leaves the `5m`
/// chain has under five minutes left, so a five-minute bound put everything
/// into the one due lane (README, A million waiting: at a fifth of the time
/// scale, p99 11.7 s with the bound at a fifth of 5m, 3.7 s at a fifth of 1m).
pub const DEFAULT_DUE_WITHIN: Duration = Duration::from_secs(60);
/// Priority levels of a priority bucket (`x-max-priority`).
pub const PRIORITY_LEVELS: u8 = 10;

/// How the router chooses a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementStrategy {
    RoundUp,
    Priority,
    Cascade,
}

impl PlacementStrategy {
    /// Every strategy name accepted in `[placement] strategy`.
    pub const NAMES: [&'static str; 3] = ["round-up", "priority", "cascade"];
}

impl FromStr for PlacementStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round-up" => Ok(Self::RoundUp),
            "priority" => Ok(Self::Priority),
            "cascade" => Ok(Self::Cascade),
            other => Err(format!(
                "unknown strategy \"{other}\"; expected one of: {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for PlacementStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::RoundUp => "round-up",
            Self::Priority => "priority",
            Self::Cascade => "cascade",
        })
    }
}

/// The rungs a strategy uses: the user's ladder, plus for cascade the finer
/// rungs below its smallest one (each half the one above, whole milliseconds,
/// down to [`HOLD_BELOW`]).
pub fn effective_ladder(strategy: PlacementStrategy, ladder: &Ladder) -> Ladder {
    if strategy != PlacementStrategy::Cascade {
        return ladder.clone();
    }
    let mut rungs = ladder.rungs().to_vec();
    let mut ms = ladder.smallest().ttl.as_millis() as u64 / 2;
    while Duration::from_millis(ms) >= HOLD_BELOW {
        let ttl = Duration::from_millis(ms);
        if !rungs.iter().any(|r| r.ttl == ttl) {
            rungs.push(Rung {
                label: format!("{ms}ms"),
                ttl,
            });
        }
        ms /= 2;
    }
    Ladder::new(rungs).expect("finer rungs keep the ladder valid")
}

/// Most laps of one rung a message makes in a single placement (a chain).
///
/// A message with several multiples of a rung to wait (twenty minutes on
/// the shipped ladder: four of `5m`) goes into a chain of that rung's
/// buckets, `<bucket>.x4` → `.x3` → `.x2` → the bucket, each dead-lettering
/// straight into the next: the broker moves it three times, the router
/// once, where the router would otherwise take and place it four times.
/// Five: enough for every rung of the shipped ladder below the top (`1m`
/// needs four, `5m` five), and five days on the top rung, inside the
/// default tombstone life a cancel needs (`[cancel] keep`, 7 days).
pub const MAX_LAPS: u32 = 5;

/// How many laps rung `rung` of a cascade's effective ladder chains: as
/// many of it as fit below the next rung up (on the top rung, [`MAX_LAPS`]),
/// at least one, at most [`MAX_LAPS`].
pub fn max_laps(ladder: &Ladder, rung: usize) -> u32 {
    let rungs = ladder.rungs();
    let ttl = rungs[rung].ttl.as_millis().max(1);
    match rungs.get(rung + 1) {
        Some(next) => {
            // Whole laps that fit below the next rung; a ratio within 1 % of
            // a whole number counts as that number, so the router's halving
            // rungs (937ms over 468ms) get no chain for an odd millisecond.
            let ratio = next.ttl.as_secs_f64() / (ttl as f64 / 1000.0);
            let whole = ratio.round();
            let fit = if (ratio - whole).abs() <= ratio / 100.0 {
                whole - 1.0
            } else {
                ratio.floor()
            };
            (fit.min(f64::from(MAX_LAPS)) as u32).clamp(1, MAX_LAPS)
        }
        None => MAX_LAPS,
    }
}

/// How many laps of rung `rung` a message with `remaining` left makes in
/// one placement: every whole multiple of the rung it still has, up to the
/// rung's chain ([`max_laps`]); at least one.
pub fn laps(ladder: &Ladder, rung: usize, remaining: Duration) -> u32 {
    let ttl = ladder.rungs()[rung].ttl.as_millis().max(1);
    let whole = u32::try_from(remaining.as_millis() / ttl).unwrap_or(u32::MAX);
    whole.clamp(1, max_laps(ladder, rung))
}

/// Where a message waits next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// In the bucket of this rung (of the effective ladder).
    Bucket {
        rung: usize,
        /// Per-message expiration (priority strategy): the time left, when shorter than the rung.
        expiration: Option<Duration>,
        /// Message priority inside a priority bucket.
        priority: Option<u8>,
    },
    /// Timed by the router itself for this long, then delivered (cascade only).
    Hold(Duration),
}

/// Chooses where a message with `remaining` time left waits, or `None` when it is due now.
/// `ladder` is the strategy's effective ladder.
pub fn place(
    strategy: PlacementStrategy,
    ladder: &Ladder,
    remaining: Duration,
) -> Option<Placement> {
    if remaining.is_zero() {
        return None;
    }
    Some(match strategy {
        PlacementStrategy::RoundUp => Placement::Bucket {
            rung: ladder.round_up(remaining),
            expiration: None,
            priority: None,
        },
        PlacementStrategy::Cascade => match ladder.round_down(remaining) {
            Some(rung) if ladder.rungs()[rung].ttl >= HOLD_BELOW => Placement::Bucket {
                rung,
                expiration: None,
                priority: None,
            },
            _ if remaining < HOLD_BELOW => Placement::Hold(remaining),
            // The user's smallest rung is below HOLD_BELOW: use it.
            Some(rung) => Placement::Bucket {
                rung,
                expiration: None,
                priority: None,
            },
            None => Placement::Hold(remaining),
        },
        PlacementStrategy::Priority => {
            let rung = ladder.round_up(remaining);
            let hi = ladder.rungs()[rung].ttl;
            if remaining >= hi {
                // At or beyond the top rung: a full lap at the lowest priority.
                Placement::Bucket {
                    rung,
                    expiration: None,
                    priority: Some(0),
                }
            } else {
                let lo = rung
                    .checked_sub(1)
                    .map_or(Duration::ZERO, |i| ladder.rungs()[i].ttl);
                Placement::Bucket {
                    rung,
                    expiration: Some(remaining),
                    priority: Some(priority_within(remaining, lo, hi)),
                }
            }
        }
    })
}

/// Whether a message with `remaining` time left, placed in a bucket of
/// `ttl`, is due within `due_within` of leaving it: then it waits for its
/// next step in the due lane, ahead of messages with time to spare.
pub fn due_lane(remaining: Duration, ttl: Duration, due_within: Duration) -> bool {
    remaining.saturating_sub(ttl) < due_within
}

/// [`place`], with the router timing under cascade whatever is left below
/// `hold_up_to` itself (at least what [`place`] would hold).
pub fn place_or_hold(
    strategy: PlacementStrategy,
    ladder: &Ladder,
    remaining: Duration,
    hold_up_to: Duration,
) -> Option<Placement> {
    if strategy == PlacementStrategy::Cascade && !remaining.is_zero() && remaining < hold_up_to {
        return Some(Placement::Hold(remaining));
    }
    place(strategy, ladder, remaining)
}

/// Priority for a delay in `(lo, hi]`: the shorter the delay, the higher.
pub fn priority_within(remaining: Duration, lo: Duration, hi: Duration) -> u8 {
    let span = (hi - lo).as_secs_f64();
    if span <= 0.0 {
        return 0;
    }
    let frac = ((remaining.saturating_sub(lo)).as_secs_f64() / span).clamp(0.0, 1.0);
    let top = f64::from(PRIORITY_LEVELS - 1);
    (top - (frac * top).round()).clamp(0.0, top) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop_assert, prop_assert_eq, proptest};
    use proptest::strategy::Strategy as _;

    fn ladder_strategy() -> impl proptest::strategy::Strategy<Value = Ladder> {
        proptest::collection::btree_set(1u64..100_000_000, 1..12).prop_map(|ttls| {
            Ladder::from_labels(&ttls.iter().map(|t| format!("{t}ms")).collect::<Vec<_>>()).unwrap()
        })
    }

    fn bucket_rung(p: Placement) -> usize {
        match p {
            Placement::Bucket { rung, .. } => rung,
            Placement::Hold(_) => panic!("unexpected hold"),
        }
    }

    #[test]
    fn a_due_message_is_not_placed() {
        let l = Ladder::from_labels(&["1s"]).unwrap();
        for s in [
            PlacementStrategy::RoundUp,
            PlacementStrategy::Cascade,
            PlacementStrategy::Priority,
        ] {
            assert_eq!(place(s, &l, Duration::ZERO), None);
        }
    }

    #[test]
    fn the_due_lane_holds_what_has_less_than_its_bound_left_after_the_bucket() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        assert!(due_lane(s(65), s(60), s(120)));
        assert!(!due_lane(s(180), s(60), s(120)));
        assert!(due_lane(ms(179_999), s(60), s(120)));
        // Round-up: the bucket outlasts the delay, so it is due on expiry.
        assert!(due_lane(s(20), s(30), s(120)));
        // A bound of zero: no due lane.
        assert!(!due_lane(s(20), s(30), Duration::ZERO));
    }

    #[test]
    fn a_chain_holds_what_fits_below_the_next_rung_and_a_message_takes_every_whole_lap() {
        let shipped = effective_ladder(
            PlacementStrategy::Cascade,
            &Ladder::from_labels(&["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"])
                .unwrap(),
        );
        let chains: Vec<_> = shipped
            .rungs()
            .iter()
            .enumerate()
            .map(|(i, r)| (r.label.as_str(), max_laps(&shipped, i)))
            .filter(|(_, n)| *n > 1)
            .collect();
        assert_eq!(chains, [("1m", 4), ("5m", 5), ("1h", 2), ("24h", MAX_LAPS)]);
        let five = shipped
            .rungs()
            .iter()
            .position(|r| r.label == "5m")
            .unwrap();
        let m = |s: u64| Duration::from_secs(60 * s);
        assert_eq!(laps(&shipped, five, m(5)), 1);
        assert_eq!(laps(&shipped, five, m(29) + Duration::from_secs(59)), 5);
        assert_eq!(laps(&shipped, five, m(12)), 2);
        let top = shipped.rungs().len() - 1;
        assert_eq!(laps(&shipped, top, m(60 * 24 * 30)), MAX_LAPS);
    }

    #[test]
    fn unknown_strategy_lists_the_known_ones() {
        let e = "fastest".parse::<PlacementStrategy>().unwrap_err();
        assert_eq!(
            e,
            "unknown strategy \"fastest\"; expected one of: round-up, priority, cascade"
        );
    }

    #[test]
    fn cascade_adds_halving_rungs_below_the_smallest() {
        let l = Ladder::from_labels(&["1s", "2s"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &l);
        let labels: Vec<_> = e.rungs().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["250ms", "500ms", "1s", "2s"]);
        let shipped = Ladder::from_labels(&["30s", "1m"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &shipped);
        assert_eq!(e.smallest().ttl, Duration::from_millis(468));
        assert_eq!(effective_ladder(PlacementStrategy::RoundUp, &l), l);
    }

    #[test]
    fn cascade_holds_up_to_its_room_and_the_others_never_hold() {
        let l = effective_ladder(
            PlacementStrategy::Cascade,
            &Ladder::from_labels(&["30s", "1m"]).unwrap(),
        );
        let held = |left_ms, room| {
            place_or_hold(
                PlacementStrategy::Cascade,
                &l,
                Duration::from_millis(left_ms),
                room,
            )
        };
        // Without room, the 468 ms rung: a hold only below it.
        assert!(matches!(
            held(1_999, HOLD_BELOW),
            Some(Placement::Bucket { .. })
        ));
        assert_eq!(
            held(400, HOLD_BELOW),
            Some(Placement::Hold(Duration::from_millis(400)))
        );
        assert_eq!(
            held(1_999, HOLD_WITH_ROOM),
            Some(Placement::Hold(Duration::from_millis(1_999)))
        );
        assert!(matches!(
            held(2_000, HOLD_WITH_ROOM),
            Some(Placement::Bucket { .. })
        ));
        assert_eq!(held(0, HOLD_WITH_ROOM), None);
        let plain = Ladder::from_labels(&["1s", "4s"]).unwrap();
        for s in [PlacementStrategy::RoundUp, PlacementStrategy::Priority] {
            assert!(matches!(
                place_or_hold(s, &plain, Duration::from_millis(500), HOLD_WITH_ROOM),
                Some(Placement::Bucket { .. })
            ));
        }
    }

    #[test]
    fn priority_rises_as_the_delay_falls_within_the_bucket() {
        let (lo, hi) = (Duration::from_secs(2), Duration::from_secs(4));
        assert_eq!(priority_within(Duration::from_millis(2001), lo, hi), 9);
        assert_eq!(priority_within(Duration::from_secs(3), lo, hi), 4);
        assert_eq!(priority_within(hi, lo, hi), 0);
        let l = Ladder::from_labels(&["1s", "4s"]).unwrap();
        let p = place(PlacementStrategy::Priority, &l, Duration::from_millis(1500)).unwrap();
        assert_eq!(
            p,
            Placement::Bucket {
                rung: 1,
                expiration: Some(Duration::from_millis(1500)),
                priority: Some(7)
            }
        );
    }

    proptest! {
        #[test]
        fn round_up_picks_the_smallest_rung_at_least_the_delay(ladder in ladder_strategy(), ms in 1u64..400_000_000) {
            let delay = Duration::from_millis(ms);
            let rung = bucket_rung(place(PlacementStrategy::RoundUp, &ladder, delay).unwrap());
            let rungs = ladder.rungs();
            if delay <= ladder.top().ttl {
                prop_assert!(rungs[rung].ttl >= delay);
                prop_assert!(rung == 0 || rungs[rung - 1].ttl < delay);
            } else {
                prop_assert_eq!(rung, rungs.len() - 1);
            }
        }

        /// Simulates each strategy with buckets that expire exactly on time:
        /// never early, nothing waits with a TTL of zero, and each ends.
        #[test]
        fn every_plan_adds_up_to_at_least_the_delay(ladder in ladder_strategy(), ms in 1u64..400_000_000) {
            for strategy in [PlacementStrategy::RoundUp, PlacementStrategy::Cascade, PlacementStrategy::Priority] {
                let eff = effective_ladder(strategy, &ladder);
                let delay = Duration::from_millis(ms);
                let (mut left, mut waited, mut hops) = (delay, Duration::ZERO, 0);
                while let Some(p) = place(strategy, &eff, left) {
                    let wait = match p {
                        Placement::Hold(d) => {
                            prop_assert_eq!(strategy, PlacementStrategy::Cascade);
                            prop_assert!(d < HOLD_BELOW || d < eff.smallest().ttl);
                            d
                        }
                        Placement::Bucket { rung, expiration, .. } => {
                            let ttl = eff.rungs()[rung].ttl;
                            let ttl = if strategy == PlacementStrategy::Cascade {
                                let n = laps(&eff, rung, left);
                                prop_assert!(n >= 1 && n <= max_laps(&eff, rung));
                                ttl * n
                            } else {
                                ttl
                            };
                            expiration.map_or(ttl, |e| e.min(ttl))
                        }
                    };
                    prop_assert!(!wait.is_zero());
                    waited += wait;
                    left = left.saturating_sub(wait);
                    hops += 1;
                    prop_assert!(hops < 100_000);
                }
                prop_assert!(waited >= delay, "{strategy}: waited {waited:?} < {delay:?}");
                if strategy == PlacementStrategy::Cascade {
                    // Exact when the broker is exact: it never overshoots.
                    prop_assert_eq!(waited, delay);
                }
            }
        }
    }
}
