//! Readiness: whether the router consumes ingress and expired now, and if
//! not, why — for `/readyz` and the `delay_router_ready` gauge.

use super::stats::Stats;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pipelines a ready router runs: ingress and expired.
pub const PIPELINES: usize = 2;

/// The router's readiness, shared by its sessions.
#[derive(Debug)]
pub struct Health {
    consuming: AtomicUsize,
    /// Why it is not ready, when no pipeline runs.
    why: Mutex<String>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            consuming: AtomicUsize::new(0),
            why: Mutex::new("starting: not connected to RabbitMQ yet".into()),
        }
    }
}

impl Health {
    /// A pipeline started consuming.
    pub fn consuming(&self, stats: &Stats) {
        self.consuming.fetch_add(1, Ordering::SeqCst);
        stats.set_ready(self.ready().is_ok());
    }

    /// A pipeline stopped consuming, because of `why`.
    pub fn stopped(&self, stats: &Stats, why: &str) {
        let _ = self
            .consuming
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        self.set_reason(why);
        stats.set_ready(false);
    }

    /// Records why the router is not ready (while it is not).
    pub fn set_reason(&self, why: &str) {
        *self.why.lock().unwrap_or_else(|p| p.into_inner()) = why.to_owned();
    }

    /// `Ok` while both pipelines consume; else the reason, on one line.
    pub fn ready(&self) -> Result<(), String> {
        if self.consuming.load(Ordering::SeqCst) >= PIPELINES {
            return Ok(());
        }
        let why = self.why.lock().unwrap_or_else(|p| p.into_inner());
        Err(why.replace('\n', " "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_both_pipelines_consume() {
        let (h, s) = (Health::default(), Stats::new());
        assert!(h.ready().unwrap_err().contains("not connected"));
        h.consuming(&s);
        assert!(h.ready().is_err());
        h.consuming(&s);
        assert!(h.ready().is_ok());
        h.stopped(&s, "broker session lost: connection reset");
        assert_eq!(
            h.ready(),
            Err("broker session lost: connection reset".into())
        );
    }
}
