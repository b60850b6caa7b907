//! Placement: which bucket a message waits in for the time it has left, per strategy.
//!
//! - `round-up`: the smallest rung at least the time left (longer than the top
//!   rung: the top rung, again and again). One hop; late by up to the gap to
//!   the next rung.
//! - `cascade`: the largest rung not longer than the time left, again at every
//!   expiry. Its ladder is the user's plus rungs the router adds itself:
//!   whole multiples of a rung below the rung two up ([`max_laps`]), a rung
//!   every [`GRID`] below the second rung and a minute, and finer ones
//!   (halving down to [`HOLD_BELOW`]); the last fraction the router times
//!   itself while the delivery stays unacked. Never early; late by milliseconds ([`ROUND_UP_WITHIN`]).
//! - `priority`: round-up buckets with `x-max-priority`; the message carries a
//!   per-message `expiration` of the time left and a priority that rises as its
//!   delay falls within the bucket's range. Only as good as the broker's expiry
//!   of priority queues ([`crate::core::compat`]).

use crate::core::ladder::{Ladder, MAX_TTL, Rung};
use std::{fmt, str::FromStr, time::Duration};
pub use crate::tuning::{HOLD_BELOW, HOLD_WITH_ROOM, ROUND_UP_WITHIN, GRID, GRID_BELOW, MAX_LAPS, MAX_REACH_LAPS};

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

/// The rungs a strategy uses: the user's ladder, plus for cascade
/// - the multiples of each rung ([`max_laps`]): from the second rung up,
///   those below the rung two up; of the smallest rung and the top ones,
///   those below the next one;
/// - the grid: every multiple of [`GRID`] below the second rung (the only
///   one, if it is alone) and below [`GRID_BELOW`], so that what a message
///   has left under it takes one hop and a hold;
/// - finer rungs below the smallest one (each half the one above, whole
///   milliseconds): down to the grid, and below the grid's step down to
///   [`HOLD_BELOW`] (without a grid, down to [`HOLD_BELOW`]).
///
/// A rung the user's ladder already has (by TTL) is not added twice.
pub fn effective_ladder(strategy: PlacementStrategy, ladder: &Ladder) -> Ladder {
    if strategy != PlacementStrategy::Cascade {
        return ladder.clone();
    }
    let mut rungs = ladder.rungs().to_vec();
    let add = |rungs: &mut Vec<Rung>, ttl: Duration, label: String| {
        if !rungs.iter().any(|r| r.ttl == ttl) {
            rungs.push(Rung { label, ttl });
        }
    };
    let spelled = |ttl: Duration| -> String {
        humantime::format_duration(ttl)
            .to_string()
            .split_whitespace()
            .collect()
    };
    for (i, rung) in ladder.rungs().iter().enumerate() {
        if rung.ttl < HOLD_BELOW {
            continue;
        }
        for n in 2..=max_laps(ladder, i) {
            let ttl = rung.ttl * n;
            if ttl <= MAX_TTL {
                add(&mut rungs, ttl, spelled(ttl));
            }
        }
    }
    let smallest = ladder.smallest().ttl;
    let grid_top = grid_top(ladder);
    let mut ttl = GRID;
    while ttl < grid_top {
        add(&mut rungs, ttl, spelled(ttl));
        ttl += GRID;
    }
    let has_grid = grid_top > GRID;
    let halves = |rungs: &mut Vec<Rung>, from: Duration, down_to: Duration| {
        let mut ms = from.as_millis() as u64 / 2;
        while Duration::from_millis(ms) >= down_to.max(HOLD_BELOW) {
            add(rungs, Duration::from_millis(ms), format!("{ms}ms"));
            ms /= 2;
        }
    };
    if has_grid {
        halves(&mut rungs, smallest, grid_top);
        halves(&mut rungs, GRID, HOLD_BELOW);
    } else {
        halves(&mut rungs, smallest, HOLD_BELOW);
    }
    Ladder::new(rungs).expect("added rungs keep the ladder valid")
}

/// The top of the cascade's grid: the second rung (the only one, if it is
/// alone), at most [`GRID_BELOW`].
pub fn grid_top(ladder: &Ladder) -> Duration {
    ladder
        .rungs()
        .get(1)
        .map_or(ladder.smallest().ttl, |r| r.ttl)
        .min(GRID_BELOW)
}

/// How many laps of rung `rung` of a ladder one bucket holds, at least one:
/// - a rung at or above the grid's top ([`grid_top`]) with a rung two up:
///   as many as fit below that one, at most [`MAX_REACH_LAPS`]. A hop then
///   skips two of the user's rungs: on the shipped ladder anything from a
///   minute to half an hour takes one bucket of whole minutes and leaves
///   under a minute, which the grid takes in one more, where the multiples
///   of `5m` and then of `1m` would take two and the grid a third (fewer
///   bucket waits a message, and the broker's expiries spread over more
///   buckets);
/// - otherwise as many as fit below the next rung up (on the top rung,
///   [`MAX_LAPS`]), at most [`MAX_LAPS`].
pub fn max_laps(ladder: &Ladder, rung: usize) -> u32 {
    let rungs = ladder.rungs();
    let ttl = rungs[rung].ttl.as_millis().max(1);
    let reach = rungs
        .get(rung + 2)
        .filter(|_| rungs[rung].ttl >= grid_top(ladder));
    let (bound, cap) = match reach {
        Some(two_up) => (Some(two_up), MAX_REACH_LAPS),
        None => (rungs.get(rung + 1), MAX_LAPS),
    };
    match bound {
        Some(next) => {
            // Whole laps that fit below the bound; a ratio within 1 % of
            // a whole number counts as that number, so the router's halving
            // rungs (937ms over 468ms) get no multiple for an odd millisecond.
            let ratio = next.ttl.as_secs_f64() / (ttl as f64 / 1000.0);
            let whole = ratio.round();
            let fit = if (ratio - whole).abs() <= ratio / 100.0 {
                whole - 1.0
            } else {
                ratio.floor()
            };
            (fit.min(f64::from(cap)) as u32).clamp(1, cap)
        }
        None => MAX_LAPS,
    }
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
        PlacementStrategy::Cascade => cascade(ladder, remaining),
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

/// Cascade's next step for `remaining` (not zero): the largest rung (of at
/// least [`HOLD_BELOW`]) it fills, give or take [`ROUND_UP_WITHIN`].
fn cascade(ladder: &Ladder, remaining: Duration) -> Placement {
    if remaining < HOLD_BELOW {
        return Placement::Hold(remaining);
    }
    let bucket = |rung| Placement::Bucket {
        rung,
        expiration: None,
        priority: None,
    };
    let rungs = ladder.rungs();
    match ladder.round_down(remaining + ROUND_UP_WITHIN) {
        Some(rung) if rungs[rung].ttl >= HOLD_BELOW => bucket(rung),
        // The user's smallest rung is below HOLD_BELOW: use it.
        _ => ladder
            .round_down(remaining)
            .map_or(Placement::Hold(remaining), bucket),
    }
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
    fn cascade_adds_the_multiples_of_a_rung_that_fit_below_the_next() {
        let user = Ladder::from_labels(&["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"])
            .unwrap();
        let shipped = effective_ladder(PlacementStrategy::Cascade, &user);
        let laps: Vec<_> = (0..user.rungs().len())
            .map(|i| (user.rungs()[i].label.as_str(), max_laps(&user, i)))
            .filter(|(_, n)| *n > 1)
            .collect();
        // From the second rung up the multiples reach the rung two up; the
        // smallest rung's and the second-highest's stop at the next one.
        assert_eq!(
            laps,
            [
                ("1m", 29),
                ("5m", 11),
                ("30m", 5),
                ("1h", 5),
                ("3h", 3),
                ("6h", 3),
                ("24h", MAX_LAPS)
            ]
        );
        let labels: Vec<_> = shipped.rungs().iter().map(|r| r.label.as_str()).collect();
        let grid: Vec<String> = (1..30).map(|k| format!("{}s", 2 * k)).collect();
        assert_eq!(&labels[..3], ["250ms", "500ms", "1000ms"]);
        assert_eq!(labels[3..32], grid);
        let minutes: Vec<String> = (1..=30).map(|m| format!("{m}m")).collect();
        assert_eq!(labels[32..62], minutes);
        assert_eq!(
            &labels[62..],
            [
                "35m", "40m", "45m", "50m", "55m", "1h", "1h30m", "2h", "2h30m", "3h", "4h", "5h",
                "6h", "9h", "12h", "18h", "24h", "2days", "3days", "4days", "5days"
            ]
        );
        // A rung with a rung two up but below the grid's top stops at the next.
        let l = Ladder::from_labels(&["1s", "2s", "4s", "8s"]).unwrap();
        assert_eq!(
            (0..4).map(|i| max_laps(&l, i)).collect::<Vec<_>>(),
            [1, 3, 1, MAX_LAPS]
        );
        // A multiple the user's ladder already has is not added again.
        let l = Ladder::from_labels(&["1s", "2s", "4s"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &l);
        let labels: Vec<_> = e.rungs().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "250ms", "500ms", "1s", "2s", "4s", "8s", "12s", "16s", "20s"
            ]
        );
        // Nor past RabbitMQ's limit for a TTL.
        let long = Ladder::from_labels(&["1s", "40days"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &long);
        assert_eq!(e.top().label, "40days");
        assert_eq!(effective_ladder(PlacementStrategy::RoundUp, &user), user);
    }

    #[test]
    fn cascade_fills_the_time_left_with_one_rung_give_or_take_the_tolerance() {
        let shipped = effective_ladder(
            PlacementStrategy::Cascade,
            &Ladder::from_labels(&["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"])
                .unwrap(),
        );
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        let step = |left: Duration| match place(PlacementStrategy::Cascade, &shipped, left) {
            Some(Placement::Bucket { rung, .. }) => shipped.rungs()[rung].label.clone(),
            other => panic!("{left:?}: {other:?}"),
        };
        assert_eq!(step(s(17 * 60 + 40)), "17m");
        assert_eq!(step(s(47 * 60)), "45m");
        assert_eq!(step(s(2 * 3600 + 17 * 60)), "2h");
        assert_eq!(step(s(2 * 60 + 40)), "2m");
        assert_eq!(step(s(40)), "40s");
        assert_eq!(step(s(11)), "10s");
        // Within ROUND_UP_WITHIN of a rung: that rung, not the finer ones.
        assert_eq!(step(ms(15 * 60_000 - 10)), "15m");
        assert_eq!(step(ms(60_000 - 10)), "1m");
        assert_eq!(step(ms(60_000 - 11)), "58s");
        assert_eq!(step(s(86_400 * 9)), "5days");
        assert_eq!(
            place(PlacementStrategy::Cascade, &shipped, ms(249)),
            Some(Placement::Hold(ms(249)))
        );
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
    fn cascade_adds_the_grid_and_halving_rungs_below_the_second() {
        let l = Ladder::from_labels(&["1s", "2s"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &l);
        let labels: Vec<_> = e.rungs().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["250ms", "500ms", "1s", "2s", "4s", "6s", "8s", "10s"]
        );
        // With a grid: every 2 s below the second rung (or a minute), the
        // halves of the smallest rung above it, of the grid's step below it.
        let shipped = Ladder::from_labels(&["30s", "1m"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &shipped);
        let labels: Vec<_> = e.rungs().iter().map(|r| r.label.clone()).collect();
        let mut want = vec!["250ms".to_owned(), "500ms".into(), "1000ms".into()];
        want.extend((1..30).map(|k| format!("{}s", 2 * k)));
        want.extend(["1m", "2m", "3m", "4m", "5m"].map(String::from));
        assert_eq!(labels, want);
        let hours = Ladder::from_labels(&["1h", "3h"]).unwrap();
        let e = effective_ladder(PlacementStrategy::Cascade, &hours);
        let labels: Vec<_> = e.rungs().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(&labels[..4], ["250ms", "500ms", "1000ms", "2s"]);
        assert_eq!(
            &labels[32..],
            [
                "112500ms",
                "225000ms",
                "450000ms",
                "900000ms",
                "1800000ms",
                "1h",
                "2h",
                "3h",
                "6h",
                "9h",
                "12h",
                "15h"
            ]
        );
        assert_eq!(labels[31], "58s");
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
        // Without room, the 250 ms rung: a hold only below it.
        assert!(matches!(
            held(1_999, HOLD_BELOW),
            Some(Placement::Bucket { .. })
        ));
        assert!(matches!(
            held(400, HOLD_BELOW),
            Some(Placement::Bucket { .. })
        ));
        assert_eq!(
            held(240, HOLD_BELOW),
            Some(Placement::Hold(Duration::from_millis(240)))
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

    proptest! {
        /// The grid: on the shipped ladder, with room to hold, anything from
        /// 2 s to a minute takes one bucket and a hold under 2 s.
        #[test]
        fn under_a_minute_takes_one_hop_on_the_shipped_ladder(left_ms in 2_000u64..60_000) {
            let l = effective_ladder(
                PlacementStrategy::Cascade,
                &Ladder::from_labels(&["30s", "1m", "5m"]).unwrap(),
            );
            let left = Duration::from_millis(left_ms);
            let Some(Placement::Bucket { rung, .. }) =
                place_or_hold(PlacementStrategy::Cascade, &l, left, HOLD_WITH_ROOM)
            else {
                panic!("{left:?} not placed");
            };
            let after = left.saturating_sub(l.rungs()[rung].ttl);
            prop_assert!(after < HOLD_WITH_ROOM, "{left:?}: {after:?} left after {}", l.rungs()[rung].label);
        }

        /// The multiples of `1m` reach `30m`: on the shipped ladder anything
        /// from a minute to half an hour takes one bucket and leaves under a
        /// minute (which the grid then takes in one).
        #[test]
        fn under_half_an_hour_takes_one_hop_to_the_grid_on_the_shipped_ladder(left_ms in 60_000u64..1_800_000) {
            let l = effective_ladder(
                PlacementStrategy::Cascade,
                &Ladder::from_labels(&["30s", "1m", "5m", "30m", "1h"]).unwrap(),
            );
            let left = Duration::from_millis(left_ms);
            let Some(Placement::Bucket { rung, .. }) =
                place_or_hold(PlacementStrategy::Cascade, &l, left, HOLD_WITH_ROOM)
            else {
                panic!("{left:?} not placed");
            };
            let after = left.saturating_sub(l.rungs()[rung].ttl);
            prop_assert!(after < Duration::from_secs(60), "{left:?}: {after:?} left after {}", l.rungs()[rung].label);
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
                    // When the broker is exact, late by at most the tolerance.
                    prop_assert!(waited <= delay + ROUND_UP_WITHIN, "waited {waited:?} for {delay:?}");
                }
            }
        }
    }

    /// Bucket hops a message on `benches/precision.rs`'s workload (delays
    /// log-uniform from 200 ms to 60 s, at 2,000 evenly spaced quantiles),
    /// the router holding up to [`HOLD_WITH_ROOM`] itself and every hop
    /// coming back 3 ms late.
    fn precision_workload_hops(eff: &Ladder) -> f64 {
        let (lo, hi, n) = (200f64.ln(), 60_000f64.ln(), 2000);
        let mut hops = 0;
        for i in 0..n {
            let ms = (lo + (hi - lo) * (f64::from(i) + 0.5) / f64::from(n)).exp();
            let mut left = Duration::from_secs_f64(ms / 1000.0);
            while let Some(Placement::Bucket { rung, .. }) =
                place_or_hold(PlacementStrategy::Cascade, eff, left, HOLD_WITH_ROOM)
            {
                hops += 1;
                left = (left + Duration::from_millis(3)).saturating_sub(eff.rungs()[rung].ttl);
            }
        }
        f64::from(hops) / f64::from(n)
    }

    #[test]
    fn the_precision_workload_takes_fewer_hops_with_multiples_reaching_two_rungs_up() {
        let bench = Ladder::from_labels(&["1s", "2s", "4s", "8s", "16s", "32s"]).unwrap();
        let eff = effective_ladder(PlacementStrategy::Cascade, &bench);
        for added in ["6s", "12s", "24s"] {
            assert!(eff.rungs().iter().any(|r| r.label == added), "{added}");
        }
        let now = precision_workload_hops(&eff);
        // A ladder of halves and the top rung's multiples only: the
        // rungs cascade adds must take fewer hops than that.
        let before = Ladder::from_labels(&[
            "250ms", "500ms", "1s", "2s", "4s", "8s", "16s", "32s", "64s", "96s", "128s", "160s",
        ])
        .unwrap();
        let then = precision_workload_hops(&before);
        assert!((0.86..0.90).contains(&now), "{now}");
        assert!((1.08..1.12).contains(&then), "{then}");
    }
}
