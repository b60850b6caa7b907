//! The publish gate of one pipeline: at most [`InflightLimit::limit`]
//! publishes unconfirmed at once (see [`crate::core::inflight`] for why and
//! how the limit moves). Deliveries past it wait, unpublished, in the order
//! they came (tokio's semaphore is fair).

use super::stats::Stats;
use crate::core::inflight::InflightLimit;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tracing::debug;

pub struct PublishGate {
    permits: Semaphore,
    state: Mutex<State>,
    stats: Arc<Stats>,
}

struct State {
    limit: InflightLimit,
    /// Permits to drop rather than return: the limit shrank by more than
    /// were free at the time.
    debt: usize,
}

/// One publish let through; its permit goes back (or is dropped, when the
/// limit shrank meanwhile) when this is dropped.
pub struct Entry<'a> {
    gate: &'a PublishGate,
    permit: Option<SemaphorePermit<'a>>,
}

impl PublishGate {
    /// A gate for a pipeline whose prefetch window is `max`.
    pub fn new(max: u16, stats: Arc<Stats>) -> Self {
        let limit = InflightLimit::new(usize::from(max));
        stats.publish_window(limit.limit() as i64);
        Self {
            permits: Semaphore::new(limit.limit()),
            state: Mutex::new(State { limit, debt: 0 }),
            stats,
        }
    }

    /// Waits for room to publish.
    pub async fn enter(&self) -> Entry<'_> {
        // The semaphore is never closed.
        let permit = self.permits.acquire().await.ok();
        Entry { gate: self, permit }
    }

    /// The prefetch window became `max`.
    pub fn set_max(&self, max: u16) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let old = state.limit.limit();
        if let Some(new) = state.limit.set_max(usize::from(max)) {
            self.resize(&mut state, old, new);
        }
    }

    /// The limit now.
    pub fn limit(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.limit.limit()
    }

    fn confirmed(&self, rtt: Duration) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let old = state.limit.limit();
        if let Some(new) = state.limit.confirmed(rtt) {
            debug!(
                from = old,
                to = new,
                base_us = state.limit.base().map_or(0, |b| b.as_micros() as u64),
                mean_us = rtt.as_micros() as u64,
                "publish window"
            );
            self.resize(&mut state, old, new);
        }
    }

    fn resize(&self, state: &mut State, old: usize, new: usize) {
        if new > old {
            let grow = new - old;
            let repaid = grow.min(state.debt);
            state.debt -= repaid;
            self.permits.add_permits(grow - repaid);
        } else {
            let shrink = old - new;
            let forgotten = self.permits.forget_permits(shrink);
            state.debt += shrink - forgotten;
        }
        self.stats.publish_window(new as i64 - old as i64);
    }

    fn leave(&self, permit: SemaphorePermit<'_>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.debt > 0 {
            state.debt -= 1;
            permit.forget();
        } else {
            drop(permit);
        }
    }
}

impl Drop for PublishGate {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.stats.publish_window(-(state.limit.limit() as i64));
    }
}

impl Entry<'_> {
    /// The broker answered the publish (confirm, nack or return) after `rtt`.
    pub fn answered(&self, rtt: Duration) {
        self.gate.confirmed(rtt);
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.gate.leave(permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::inflight::FLOOR;

    #[tokio::test]
    async fn at_most_the_limit_enters_and_a_shrink_is_honoured() {
        let stats = Arc::new(Stats::default());
        let gate = PublishGate::new(500, stats);
        let held: Vec<_> = futures_util::future::join_all((0..FLOOR).map(|_| gate.enter())).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), gate.enter())
                .await
                .is_err(),
            "one more than the limit entered"
        );
        // The window shrinks below what is in flight: what leaves is not
        // returned until the gate is back under the new limit.
        gate.set_max(4);
        drop(held);
        let four: Vec<_> = futures_util::future::join_all((0..4).map(|_| gate.enter())).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(50), gate.enter())
                .await
                .is_err()
        );
        drop(four);
        assert_eq!(gate.permits.available_permits(), 4);
    }
}
