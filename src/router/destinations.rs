//! What the router has learned about destination exchanges, shared by both
//! pipelines and kept across reconnects: which took a message lately (they
//! go on the main lane), and which the broker refused (messages to them are
//! parked without a publish for a while, so a burst costs one channel).

use crate::core::contract::Destination;
use crate::core::decision::Refusals;
use crate::core::parking::Failure;
use crate::core::reasons::{ACCESS_REFUSED, BrokerReply, NOT_FOUND};
use dashmap::DashMap;
use lapin::types::ShortString;
use std::time::{Duration, Instant};
pub use crate::tuning::{REFUSAL_MEMORY, VERIFIED_FOR};
use crate::tuning::REFUSALS_PRUNE_ABOVE as PRUNE_ABOVE;

/// A refusal is remembered for the whole exchange (a missing exchange) or for
/// one routing key of it (an access refusal: topic permissions are per key).
type RefusalKey = (ShortString, Option<ShortString>);

/// What the router has learned about destination exchanges; shared by both
/// pipelines and kept across reconnects.
#[derive(Debug, Default)]
pub struct Destinations {
    verified: DashMap<ShortString, Instant>,
    refused: DashMap<RefusalKey, (BrokerReply, Instant)>,
}

impl Destinations {
    /// A refusal of `d` learned less than [`REFUSAL_MEMORY`] ago, with its age.
    pub fn refusal(&self, d: &Destination) -> Option<(BrokerReply, Duration)> {
        if self.refused.is_empty() {
            return None;
        }
        [
            (d.exchange.clone(), None),
            (d.exchange.clone(), Some(d.routing_key.clone())),
        ]
        .iter()
        .find_map(|key| {
            let entry = self.refused.get(key)?;
            let age = entry.1.elapsed();
            (age < REFUSAL_MEMORY).then(|| (entry.0.clone(), age))
        })
    }

    /// Whether `exchange` confirmed a publish within [`VERIFIED_FOR`].
    /// The default exchange always takes publishes.
    pub fn is_verified(&self, exchange: &str) -> bool {
        exchange.is_empty()
            || self
                .verified
                .get(exchange)
                .is_some_and(|seen| seen.elapsed() < VERIFIED_FOR)
    }

    /// Records that `exchange` confirmed a publish.
    pub fn verify(&self, exchange: &ShortString) {
        if !exchange.as_str().is_empty() {
            self.verified.insert(exchange.clone(), Instant::now());
        }
    }

    /// Records that the broker closed the channel over a publish to `d`:
    /// 404 for the whole exchange, 403 for this routing key; a refusal of the
    /// message itself (406...) is not about the destination and is not kept.
    pub fn refuse(&self, d: &Destination, reply: &BrokerReply) {
        let key = match reply.code {
            NOT_FOUND => (d.exchange.clone(), None),
            ACCESS_REFUSED => (d.exchange.clone(), Some(d.routing_key.clone())),
            _ => return,
        };
        self.verified.remove(&d.exchange);
        if self.refused.len() > PRUNE_ABOVE {
            self.refused
                .retain(|_, (_, at)| at.elapsed() < REFUSAL_MEMORY);
        }
        self.refused.insert(key, (reply.clone(), Instant::now()));
    }
}

impl Refusals for Destinations {
    fn refusal(&self, destination: &Destination) -> Option<Failure> {
        let (reply, age) = self.refusal(destination)?;
        tracing::debug!(exchange = %destination.exchange, "parking from a remembered refusal");
        Some(Failure::Refused {
            reply,
            remembered_ms: Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(exchange: &str, key: &str) -> Destination {
        Destination {
            exchange: exchange.into(),
            routing_key: key.into(),
        }
    }

    fn reply(code: u16) -> BrokerReply {
        BrokerReply {
            code,
            text: "words".into(),
        }
    }

    #[test]
    fn a_missing_exchange_is_remembered_for_every_routing_key() {
        let d = Destinations::default();
        d.refuse(&dest("gone", "a"), &reply(NOT_FOUND));
        assert!(d.refusal(&dest("gone", "b")).is_some());
        assert!(d.refusal(&dest("other", "a")).is_none());
    }

    #[test]
    fn an_access_refusal_is_remembered_for_its_routing_key_only() {
        let d = Destinations::default();
        d.verify(&"topic".into());
        d.refuse(&dest("topic", "denied"), &reply(ACCESS_REFUSED));
        assert!(d.refusal(&dest("topic", "denied")).is_some());
        assert!(d.refusal(&dest("topic", "allowed")).is_none());
        assert!(!d.is_verified("topic"), "a refusal ends the trust");
    }

    #[test]
    fn a_refusal_of_the_message_itself_is_not_kept_against_its_destination() {
        let d = Destinations::default();
        d.refuse(&dest("orders", "k"), &reply(406));
        assert!(d.refusal(&dest("orders", "k")).is_none());
    }

    #[test]
    fn the_default_exchange_is_always_verified_others_once_they_confirm() {
        let d = Destinations::default();
        assert!(d.is_verified(""));
        assert!(!d.is_verified("orders"));
        d.verify(&"orders".into());
        assert!(d.is_verified("orders"));
    }
}
