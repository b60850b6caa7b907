//! Counters of what the router has done since it started, logged once a
//! minute and readable by embedders (the precision benchmark reads hops).

use crate::decision::Action;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// How often the counters are logged (when they changed).
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// Confirmed publishes by kind.
#[derive(Debug, Default)]
pub struct Stats {
    placed: AtomicU64,
    delivered: AtomicU64,
    held: AtomicU64,
    parked: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Bucket placements (hops), every strategy.
    pub placed: u64,
    /// Messages delivered to their destination.
    pub delivered: u64,
    /// Of those, how many the router held for the last fraction first (cascade).
    pub held: u64,
    /// Messages parked.
    pub parked: u64,
}

impl Stats {
    /// Counts one confirmed publish.
    pub fn record(&self, action: &Action) {
        match action {
            Action::Wait { .. } => self.placed.fetch_add(1, Relaxed),
            Action::Deliver { after, .. } => {
                if !after.is_zero() {
                    self.held.fetch_add(1, Relaxed);
                }
                self.delivered.fetch_add(1, Relaxed)
            }
            Action::Park { .. } => self.parked.fetch_add(1, Relaxed),
        };
    }

    /// Counts a delivery the destination refused, parked instead.
    pub fn record_parked(&self) {
        self.parked.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            placed: self.placed.load(Relaxed),
            delivered: self.delivered.load(Relaxed),
            held: self.held.load(Relaxed),
            parked: self.parked.load(Relaxed),
        }
    }
}
