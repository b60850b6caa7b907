//! The janitor: buckets no longer in the ladder (a rung removed, a strategy
//! switched) keep dead-lettering into the router until they are empty, and are
//! then deleted. Which buckets a prefix has declared is kept in one message in
//! `<prefix>.state`, because AMQP cannot list queues.
//!
//! It also retires an earlier version's due lane ([`retire_due_lane`]).

use crate::broker::publish::{Message, Outcome, confirm_channel, publish_once};
use crate::broker::{self, BrokerError, RPC_TIMEOUT, close_channel, probe, timed};
use crate::core::envelope::PERSISTENT;
use crate::core::topology::{
    QueueType, Topology, feeds_into, laps_of, parse_state, render_state, retired_due_binding,
    stale_buckets,
};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeleteOptions,
};
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

/// Retires an earlier version's due lane, `<prefix>.due`, for as long as it
/// exists: unbinds it from the lanes (what the buckets expire then all goes
/// to the expired queue), moves what it holds into the expired queue (each
/// message published whole, confirmed, then acked), and deletes it once it
/// is empty. A router of the earlier version, still running during an
/// upgrade, binds it again and consumes it, so each sweep does it again
/// until the queue is gone. A quorum queue cannot be deleted only if empty
/// (RabbitMQ closes the connection), so an empty quorum due lane is left for
/// the operator, with one warning, and still watched.
pub async fn retire_due_lane(
    conn: &Connection,
    t: &Topology,
    stop: CancellationToken,
) -> Result<(), BrokerError> {
    let due = &t.names.due;
    let mut warned = false;
    loop {
        let Some(waiting) = probe::depth(conn, due).await? else {
            return Ok(());
        };
        let moved = move_due_lane(conn, t).await?;
        if moved > 0 || waiting > 0 {
            info!(queue = %due, moved, "an earlier version's due lane: moved into the expired queue");
        }
        match t.queue_type {
            QueueType::Quorum if !warned => {
                warn!(
                    queue = %due,
                    "an earlier version's due lane, unbound and emptied: RabbitMQ deletes a \
                     quorum queue only unconditionally, so the router leaves it; delete it \
                     once no router of an earlier version runs: rabbitmqctl delete_queue {due}"
                );
                warned = true;
            }
            QueueType::Quorum => {}
            // Not deleted (a message arrived meanwhile): again at the next sweep.
            QueueType::Classic => {
                if delete_if_empty(conn, due).await.is_ok() {
                    info!(queue = %due, "an earlier version's due lane, emptied: removed");
                    return Ok(());
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

/// Unbinds the due lane and moves what it holds into the expired queue;
/// returns how many messages it moved.
async fn move_due_lane(conn: &Connection, t: &Topology) -> Result<u64, BrokerError> {
    let names = &t.names;
    let ch = confirm_channel(conn).await?;
    let moved = async {
        timed(
            "queue.unbind due",
            RPC_TIMEOUT,
            ch.queue_unbind(
                names.due.clone(),
                names.lanes.clone(),
                "".into(),
                retired_due_binding(),
            ),
        )
        .await?;
        let mut moved = 0;
        while let Some(m) = timed(
            "basic.get due",
            RPC_TIMEOUT,
            ch.basic_get(names.due.clone(), BasicGetOptions { no_ack: false }),
        )
        .await?
        {
            let d = m.delivery;
            let data = Arc::new(d.data);
            let message = Message {
                exchange: &"".into(),
                routing_key: &names.expired,
                properties: &d.properties,
                data: &data,
            };
            let outcome = publish_once(&ch, message).await?;
            if !matches!(outcome, Outcome::Confirmed) {
                // Left in the due lane, for the next sweep.
                let _ = timed(
                    "basic.nack due",
                    RPC_TIMEOUT,
                    ch.basic_nack(d.delivery_tag, BasicNackOptions { requeue: true, multiple: false }),
                )
                .await;
                return Err(BrokerError::other(
                    "moving the due lane into the expired queue",
                    format!("{outcome:?}"),
                ));
            }
            timed(
                "basic.ack due",
                RPC_TIMEOUT,
                ch.basic_ack(d.delivery_tag, BasicAckOptions::default()),
            )
            .await?;
            moved += 1;
        }
        Ok(moved)
    }
    .await;
    close_channel(&ch, "due lane moved").await;
    moved
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
