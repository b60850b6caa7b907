//! Counters of what the router has done since it started, logged once a
//! minute and readable by embedders (the precision benchmark reads hops).

use crate::core::decision::Action;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// How often the counters are logged (when they changed).
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// Confirmed publishes by kind.
#[derive(Debug, Default)]
pub struct Stats {
    placed: AtomicU64,
    delivered: AtomicU64,
    held: AtomicU64,
    parked: AtomicU64,
    sessions: AtomicU64,
    suspects: AtomicU64,
    refusals: AtomicU64,
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
    /// Broker sessions opened: 1 while the router never had to reconnect.
    pub sessions: u64,
    /// Publishes in flight on a channel the broker closed, sent again one at a time.
    pub suspects: u64,
    /// Publishes the broker refused by closing the channel, each parked.
    pub refusals: u64,
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

    /// Counts a session that connected and declared its topology.
    pub fn record_session(&self) {
        self.sessions.fetch_add(1, Relaxed);
    }

    /// Counts a publish caught on a channel the broker closed.
    pub fn record_suspect(&self) {
        self.suspects.fetch_add(1, Relaxed);
    }

    /// Counts a publish the broker refused by closing the channel.
    pub fn record_refusal(&self) {
        self.refusals.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            placed: self.placed.load(Relaxed),
            delivered: self.delivered.load(Relaxed),
            held: self.held.load(Relaxed),
            parked: self.parked.load(Relaxed),
            sessions: self.sessions.load(Relaxed),
            suspects: self.suspects.load(Relaxed),
            refusals: self.refusals.load(Relaxed),
        }
    }
}

/// Logs the counters every [`LOG_EVERY`] when they changed, until `stop`.
pub async fn log_every(stats: Arc<Stats>, stop: CancellationToken) {
    let mut last = Snapshot::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(LOG_EVERY) => {}
        }
        let now = stats.snapshot();
        if now != last {
            info!(
                placed = now.placed,
                delivered = now.delivered,
                held = now.held,
                parked = now.parked,
                refused = now.refusals,
                resent = now.suspects,
                sessions = now.sessions,
                "figures since start"
            );
            last = now;
        }
    }
}
