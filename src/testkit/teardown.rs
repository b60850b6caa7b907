//! Removing what a router declared: one helper for every test and bench
//! that runs a router on a prefix of its own.

use crate::core::decision::Rules;
use lapin::Channel;
use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};

/// Deletes every queue and exchange the router of `rules` declares (its
/// buckets, its own queues and exchanges) and `extra` queues; returns how
/// many messages the buckets and the ingress, expired and due queues still
/// held (waiting, not lost). Failures are ignored: what is gone is gone.
pub async fn remove_topology(ch: &Channel, rules: &Rules, extra: &[String]) -> u64 {
    let names = &rules.names;
    let waiting = [&names.ingress, &names.expired, &names.due]
        .into_iter()
        .cloned()
        .chain(rules.topology().bucket_names());
    let mut held = 0;
    for q in waiting {
        if let Ok(n) = ch.queue_delete(q, QueueDeleteOptions::default()).await {
            held += u64::from(n);
        }
    }
    let records = [&names.parked, &names.state, &names.cancels]
        .into_iter()
        .cloned()
        .chain(extra.iter().map(|q| q.as_str().into()));
    for q in records {
        let _ = ch.queue_delete(q, QueueDeleteOptions::default()).await;
    }
    for e in names.own_exchanges() {
        let _ = ch
            .exchange_delete(e.clone(), ExchangeDeleteOptions::default())
            .await;
    }
    held
}
