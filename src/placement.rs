//! Placement: which bucket a message waits in for the time it has left.

use crate::ladder::Ladder;
use std::{fmt, str::FromStr, time::Duration};

/// How the router chooses a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The smallest bucket at least as long as the time left; longer than the
    /// top rung: round the top bucket again until the rest fits. Never early,
    /// late by at most the gap to the next rung up.
    RoundUp,
}

impl Strategy {
    /// Every strategy name accepted in `[placement] strategy`.
    pub const NAMES: [&'static str; 1] = ["round-up"];
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "round-up" => Ok(Self::RoundUp),
            other => Err(format!(
                "unknown strategy \"{other}\"; expected one of: {}",
                Self::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::RoundUp => "round-up",
        })
    }
}

/// Where a message waits next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Index of the rung in the ladder.
    pub rung: usize,
}

/// Chooses the bucket for a message with `remaining` time left, or `None`
/// when it is due now.
pub fn place(strategy: Strategy, ladder: &Ladder, remaining: Duration) -> Option<Placement> {
    if remaining.is_zero() {
        return None;
    }
    match strategy {
        Strategy::RoundUp => Some(Placement {
            rung: ladder.round_up(remaining),
        }),
    }
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

    #[test]
    fn a_due_message_is_not_placed() {
        let l = Ladder::from_labels(&["1s"]).unwrap();
        assert_eq!(place(Strategy::RoundUp, &l, Duration::ZERO), None);
    }

    #[test]
    fn unknown_strategy_lists_the_known_ones() {
        let e = "fastest".parse::<Strategy>().unwrap_err();
        assert_eq!(e, "unknown strategy \"fastest\"; expected one of: round-up");
    }

    proptest! {
        #[test]
        fn round_up_picks_the_smallest_rung_at_least_the_delay(ladder in ladder_strategy(), ms in 1u64..400_000_000) {
            let delay = Duration::from_millis(ms);
            let p = place(Strategy::RoundUp, &ladder, delay).unwrap();
            let rungs = ladder.rungs();
            if delay <= ladder.top().ttl {
                prop_assert!(rungs[p.rung].ttl >= delay);
                prop_assert!(p.rung == 0 || rungs[p.rung - 1].ttl < delay);
            } else {
                prop_assert_eq!(p.rung, rungs.len() - 1);
            }
        }

        #[test]
        fn round_up_repeated_never_delivers_early_and_ends(ladder in ladder_strategy(), ms in 1u64..400_000_000) {
            // Simulate the router: wait a rung, subtract, place again until due.
            let mut left = Duration::from_millis(ms);
            let mut waited = Duration::ZERO;
            let mut hops = 0;
            while let Some(p) = place(Strategy::RoundUp, &ladder, left) {
                let ttl = ladder.rungs()[p.rung].ttl;
                prop_assert!(!ttl.is_zero());
                waited += ttl;
                left = left.saturating_sub(ttl);
                hops += 1;
                prop_assert!(hops < 10_000);
            }
            prop_assert!(waited >= Duration::from_millis(ms));
        }
    }
}
