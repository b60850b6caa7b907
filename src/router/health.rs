//! Readiness: whether every consumer the session runs consumes now, and if
//! not, why — for `/readyz` and the `delay_router_ready` gauge.
//!
//! A session names its consumers when it starts ([`Health::expect`]); each
//! one reports when it attaches and when it stops. Ready means all of them
//! consume: nothing here counts them by hand.

use super::stats::Stats;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The router's readiness, shared by its sessions.
#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Each consumer of the current session, and whether it consumes.
    consumers: BTreeMap<&'static str, bool>,
    /// Why it is not ready, when a consumer stopped or none started yet.
    why: String,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                consumers: BTreeMap::new(),
                why: "starting: not connected to RabbitMQ yet".into(),
            }),
        }
    }
}

impl Health {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A session starts: these consumers, none attached yet.
    pub fn expect(&self, stats: &Stats, consumers: impl IntoIterator<Item = &'static str>) {
        self.state().consumers = consumers.into_iter().map(|c| (c, false)).collect();
        stats.set_ready(false);
    }

    /// `consumer` started consuming.
    pub fn consuming(&self, stats: &Stats, consumer: &'static str) {
        self.set(stats, consumer, true);
    }

    /// `consumer` stopped consuming, because of `why`.
    pub fn stopped(&self, stats: &Stats, consumer: &'static str, why: &str) {
        self.set_reason(why);
        self.set(stats, consumer, false);
    }

    fn set(&self, stats: &Stats, consumer: &'static str, on: bool) {
        let ready = {
            let mut state = self.state();
            state.consumers.insert(consumer, on);
            state.ready().is_ok()
        };
        stats.set_ready(ready);
    }

    /// Records why the router is not ready (while it is not).
    pub fn set_reason(&self, why: &str) {
        self.state().why = why.to_owned();
    }

    /// `Ok` while every consumer of the session consumes; else the reason,
    /// on one line.
    pub fn ready(&self) -> Result<(), String> {
        self.state().ready()
    }
}

impl State {
    fn ready(&self) -> Result<(), String> {
        let waiting: Vec<&str> = self
            .consumers
            .iter()
            .filter(|(_, on)| !**on)
            .map(|(name, _)| *name)
            .collect();
        if !self.consumers.is_empty() && waiting.is_empty() {
            return Ok(());
        }
        let why = self.why.replace('\n', " ");
        if waiting.is_empty() || self.consumers.len() == waiting.len() {
            Err(why)
        } else {
            Err(format!("{why} (not consuming: {})", waiting.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_while_every_consumer_consumes() {
        let (h, s) = (Health::default(), Stats::new());
        assert!(h.ready().unwrap_err().contains("not connected"));
        h.expect(&s, ["ingress", "due", "expired"]);
        h.consuming(&s, "ingress");
        h.consuming(&s, "due");
        assert!(h.ready().is_err(), "two of three");
        h.consuming(&s, "expired");
        assert!(h.ready().is_ok());
        h.stopped(&s, "due", "broker session lost: consumer cancelled");
        let why = h.ready().unwrap_err();
        assert!(
            why.contains("consumer cancelled") && why.contains("due"),
            "{why}"
        );
        h.consuming(&s, "due");
        assert!(h.ready().is_ok());
    }

    #[test]
    fn a_new_session_is_not_ready_until_its_consumers_attach() {
        let (h, s) = (Health::default(), Stats::new());
        h.expect(&s, ["ingress"]);
        h.consuming(&s, "ingress");
        assert!(h.ready().is_ok());
        h.expect(&s, ["ingress", "expired"]);
        assert!(h.ready().is_err());
    }
}
