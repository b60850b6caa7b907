//! How many publishes a pipeline keeps unconfirmed: sized from the observed
//! confirm latency, like TCP Vegas sizes a congestion window. Pure.
//!
//! Every message published and not yet confirmed when the router dies (or
//! its connection does) is published again after the broker redelivers its
//! source: the count in flight at a fault is the count of duplicates it
//! makes. Deliveries the router holds unpublished cost nothing at a fault.
//! So the prefetch window stays wide (the broker keeps the router fed) while
//! the publishes in flight are only as many as the broker needs to keep its
//! pace: past that, more in flight only queues at the broker, and the
//! confirm latency shows it.
//!
//! The limit is reconsidered once per round (about one window of confirms).
//! A round's mean confirm latency is compared with the lowest round mean
//! seen (the base: what a confirm takes when little is queued; a round mean,
//! not a single confirm, so the broker's batching of fsyncs is in the base
//! too). Below [`GROW_BELOW`] times the base the broker is not queueing: the
//! limit grows by a quarter. Above [`SHRINK_ABOVE`] it is: the limit shrinks
//! by a tenth. Between them it holds, so under a saturated broker two to
//! four times what it needs unloaded is in flight: enough for it to batch
//! its fsyncs through a stall (narrower bounds cost placement rate; see
//! docs/mechanisms.md).

use std::time::Duration;
pub use crate::tuning::{GROW_BELOW, SHRINK_ABOVE, FLOOR, MIN_ROUND, BASE_ROUNDS};

/// The limit on publishes in flight and what it learned.
#[derive(Debug, Clone)]
pub struct InflightLimit {
    limit: usize,
    max: usize,
    round_count: usize,
    round_sum: Duration,
    base: Option<Duration>,
    /// Lowest round mean of the current and the previous generation of
    /// [`BASE_ROUNDS`] rounds.
    current_min: Option<Duration>,
    previous_min: Option<Duration>,
    rounds: u32,
}

impl InflightLimit {
    /// Starts at [`FLOOR`] (or `max`, when smaller), at most `max`.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            limit: FLOOR.min(max),
            max,
            round_count: 0,
            round_sum: Duration::ZERO,
            base: None,
            current_min: None,
            previous_min: None,
            rounds: 0,
        }
    }

    /// The limit in force.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The lowest round mean that counts now, once a round has ended.
    pub fn base(&self) -> Option<Duration> {
        self.base
    }

    /// A new ceiling (the prefetch window changed): the limit comes down to
    /// it at once when above it.
    pub fn set_max(&mut self, max: usize) -> Option<usize> {
        self.max = max.max(1);
        if self.limit > self.max {
            self.limit = self.max;
            return Some(self.limit);
        }
        None
    }

    /// Records one confirm that took `rtt`; returns the new limit when it changes.
    pub fn confirmed(&mut self, rtt: Duration) -> Option<usize> {
        self.round_count += 1;
        self.round_sum = self.round_sum.saturating_add(rtt);
        if self.round_count < self.limit.max(MIN_ROUND) {
            return None;
        }
        let mean = self.round_sum / u32::try_from(self.round_count).unwrap_or(u32::MAX);
        self.round_count = 0;
        self.round_sum = Duration::ZERO;
        self.rounds += 1;
        if self.rounds >= BASE_ROUNDS {
            self.rounds = 0;
            self.previous_min = self.current_min.take();
        }
        self.current_min = Some(self.current_min.map_or(mean, |m| m.min(mean)));
        let base = match (self.current_min, self.previous_min) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(mean),
        };
        self.base = Some(base);
        let inflation = if base.is_zero() {
            if mean.is_zero() { 1.0 } else { f64::INFINITY }
        } else {
            mean.as_secs_f64() / base.as_secs_f64()
        };
        let next = if inflation < GROW_BELOW {
            (self.limit + (self.limit / 4).max(1)).min(self.max)
        } else if inflation > SHRINK_ABOVE {
            (self.limit - (self.limit / 10).max(1)).max(FLOOR.min(self.max))
        } else {
            self.limit
        };
        if next == self.limit {
            return None;
        }
        self.limit = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    /// Feeds rounds of confirms whose latency `latency(limit)` gives, returns the limits.
    fn run(
        l: &mut InflightLimit,
        rounds: usize,
        latency: impl Fn(usize) -> Duration,
    ) -> Vec<usize> {
        let mut seen = Vec::new();
        for _ in 0..rounds {
            let rtt = latency(l.limit());
            for _ in 0..l.limit().max(MIN_ROUND) {
                l.confirmed(rtt);
            }
            seen.push(l.limit());
        }
        seen
    }

    #[test]
    fn an_idle_broker_lets_it_grow_to_the_window() {
        let mut l = InflightLimit::new(500);
        run(&mut l, 40, |_| 3 * MS);
        assert_eq!(l.limit(), 500);
    }

    #[test]
    fn a_saturated_broker_holds_it_at_two_to_four_times_what_it_needs() {
        // The broker confirms 10 messages per ms after a 2 ms floor: with
        // `n` in flight a confirm takes 2 ms + n / 10 ms.
        let mut l = InflightLimit::new(500);
        let limits = run(&mut l, 300, |n| 2 * MS + MS * (n as u32) / 10);
        let last = *limits.last().unwrap();
        // Base about 2 ms + 32/10 = 5.2 ms; holds where 2 + n/10 is
        // between 2 and 4 times that: n between 84 and 188.
        assert!((80..=200).contains(&last), "limit {last}: {limits:?}");
        assert!(last < 500);
    }

    #[test]
    fn it_shrinks_when_the_broker_slows_down() {
        let mut l = InflightLimit::new(500);
        run(&mut l, 40, |_| 2 * MS);
        assert_eq!(l.limit(), 500);
        run(&mut l, 40, |_| 20 * MS);
        assert_eq!(l.limit(), FLOOR);
    }

    #[test]
    fn a_smaller_window_caps_it_at_once() {
        let mut l = InflightLimit::new(500);
        run(&mut l, 40, |_| 2 * MS);
        assert_eq!(l.set_max(100), Some(100));
        assert_eq!(l.limit(), 100);
        assert_eq!(l.set_max(200), None);
        let mut tiny = InflightLimit::new(4);
        assert_eq!(tiny.limit(), 4);
        run(&mut tiny, 10, |_| 50 * MS);
        assert_eq!(tiny.limit(), 4);
    }

    #[test]
    fn zero_latency_is_no_inflation() {
        let mut l = InflightLimit::new(64);
        run(&mut l, 20, |_| Duration::ZERO);
        assert_eq!(l.limit(), 64);
    }

    proptest! {
        /// Whatever the latencies, the limit stays within its bounds and
        /// changes only at the end of a round.
        #[test]
        fn bounded(max in 1usize..2000, rtts in proptest::collection::vec(0u64..100_000, 1..3000)) {
            let mut l = InflightLimit::new(max);
            for us in rtts {
                let before = l.limit();
                let changed = l.confirmed(Duration::from_micros(us));
                prop_assert!(l.limit() >= FLOOR.min(max) && l.limit() <= max);
                match changed {
                    Some(n) => prop_assert_eq!(n, l.limit()),
                    None => prop_assert_eq!(before, l.limit()),
                }
            }
        }
    }
}
