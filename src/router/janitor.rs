//! The janitor: buckets no longer in the ladder (a rung removed, a strategy
//! switched) keep dead-lettering into the router until they are empty, and are
//! then deleted. Which buckets a prefix has declared is kept in one message in
//! `<prefix>.state`, because AMQP cannot list queues.

use crate::broker::publish::{Message, Outcome, confirm_channel, publish_once};
use crate::broker::{self, BrokerError, RPC_TIMEOUT, close_channel, probe, timed};
use crate::core::envelope::PERSISTENT;
use crate::core::topology::{
    QueueType, Topology, feeds_into, laps_of, parse_state, render_state, stale_buckets,
};
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeleteOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Connection};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
pub use crate::tuning::SWEEP_EVERY;

/// Records the topology's buckets plus every still-recorded stale bucket as
/// the prefix's state, and returns the stale ones.
pub async fn record(conn: &Connection, t: &Topology) -> Result<Vec<String>, BrokerError> {
    let ch = confirm_channel(conn).await?;
    let recorded = async {
        let mut recorded = Vec::new();
        let mut last_tag = None;
        while let Some(m) = timed(
            "basic.get state",
            RPC_TIMEOUT,
            ch.basic_get(t.names.state.clone(), BasicGetOptions { no_ack: false }),
        )
        .await?
        {
            recorded.extend(parse_state(&t.names.prefix, &m.delivery.data));
            last_tag = Some(m.delivery.delivery_tag);
        }
        let current = t.bucket_names();
        let stale = stale_buckets(&recorded, &current);
        let mut state: Vec<String> = current.iter().map(|q| q.to_string()).collect();
        state.extend(stale.iter().cloned());
        let body = Arc::new(render_state(&state));
        let message = Message {
            exchange: &"".into(),
            routing_key: &t.names.state,
            properties: &BasicProperties::default().with_delivery_mode(PERSISTENT),
            data: &body,
        };
        match publish_once(&ch, message).await? {
            Outcome::Confirmed => {}
            other => {
                return Err(BrokerError::other(
                    "recording the bucket state",
                    format!("{other:?}"),
                ));
            }
        }
        if let Some(tag) = last_tag {
            timed(
                "basic.ack state",
                RPC_TIMEOUT,
                ch.basic_ack(tag, BasicAckOptions { multiple: true }),
            )
            .await?;
        }
        Ok(stale)
    }
    .await;
    close_channel(&ch, "state recorded").await;
    recorded
}

/// Deletes each stale bucket once it is empty, until none is left or `stop`.
/// A bucket another live router of the prefix uses (`in_use`, asked at every
/// sweep) is kept, so two routers with different ladders never delete each
/// other's buckets.
pub async fn sweep(
    conn: &Connection,
    t: &Topology,
    mut stale: Vec<String>,
    stop: CancellationToken,
    in_use: impl Fn() -> std::collections::BTreeSet<String>,
) -> Result<(), BrokerError> {
    for q in &stale {
        warn!(bucket = %q, "bucket no longer in the ladder: it keeps delivering into the router and is removed once empty");
    }
    while !stale.is_empty() {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        let before = stale.len();
        let mut left: Vec<String> = Vec::new();
        let used = in_use();
        // An earlier version's chain from its top lap down, so one sweep removes it.
        stale.sort_by_key(|q| std::cmp::Reverse(laps_of(q)));
        for q in stale {
            // In use, or a later lap of its chain still there (what waits in
            // it would be dead-lettered into nothing).
            if used.contains(&q) || left.iter().any(|up| feeds_into(up, &q)) {
                left.push(q);
                continue;
            }
            let queue = ShortString::from(q.as_str());
            match probe::depth(conn, &queue).await? {
                None => info!(bucket = %q, "stale bucket already gone"),
                // RabbitMQ refuses `if-empty` on a quorum queue with 540
                // NOT_IMPLEMENTED, closing the connection (the router's):
                // an empty quorum bucket is left for the operator, once.
                Some(0) if t.queue_type == QueueType::Quorum => warn!(
                    bucket = %q,
                    "stale quorum bucket empty: RabbitMQ deletes a quorum queue only \
                     unconditionally, so the router leaves it; delete it once no router \
                     uses it: rabbitmqctl delete_queue {q}"
                ),
                Some(0) => match delete_if_empty(conn, &queue).await {
                    Ok(()) => info!(bucket = %q, "stale bucket empty: removed"),
                    // Not empty after all (a message arrived): try again later.
                    Err(_) => left.push(q),
                },
                Some(n) => {
                    info!(bucket = %q, waiting = n, "stale bucket draining");
                    left.push(q);
                }
            }
        }
        stale = left;
        if stale.len() != before {
            record(conn, t).await?;
        }
    }
    Ok(())
}

async fn delete_if_empty(conn: &Connection, queue: &ShortString) -> Result<(), BrokerError> {
    let ch = broker::channel(conn).await?;
    let opts = QueueDeleteOptions {
        if_empty: true,
        ..Default::default()
    };
    let deleted = timed(
        "queue.delete",
        RPC_TIMEOUT,
        ch.queue_delete(queue.clone(), opts),
    )
    .await;
    close_channel(&ch, "ok").await;
    deleted.map(drop)
}
