//! The janitor: buckets no longer in the ladder (a rung removed, a strategy
//! switched) keep dead-lettering into the router until they are empty, and are
//! then deleted. Which buckets a prefix has declared is kept in one message in
//! `<prefix>.state`, because AMQP cannot list queues.

use crate::broker::{self, BrokerError, CONFIRM_TIMEOUT, RPC_TIMEOUT, timed};
use crate::topology::{Names, parse_state, render_state, stale_buckets};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions,
};
use lapin::types::ShortString;
use lapin::{BasicProperties, Confirmation, Connection};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often stale buckets are checked.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Records `current` plus every still-recorded stale bucket as the prefix's
/// state, and returns the stale ones.
pub async fn record(
    conn: &Connection,
    names: &Names,
    current: &[ShortString],
) -> Result<Vec<String>, BrokerError> {
    let ch = broker::channel(conn).await?;
    timed(
        "confirm.select",
        RPC_TIMEOUT,
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    let mut recorded = Vec::new();
    let mut last_tag = None;
    while let Some(m) = timed(
        "basic.get state",
        RPC_TIMEOUT,
        ch.basic_get(names.state.clone(), BasicGetOptions { no_ack: false }),
    )
    .await?
    {
        recorded.extend(parse_state(&names.prefix, &m.delivery.data));
        last_tag = Some(m.delivery.delivery_tag);
    }
    let stale = stale_buckets(&recorded, current);
    let mut state: Vec<String> = current.iter().map(|q| q.to_string()).collect();
    state.extend(stale.iter().cloned());
    let confirm = timed(
        "basic.publish state",
        RPC_TIMEOUT,
        ch.basic_publish(
            "".into(),
            names.state.clone(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &render_state(&state),
            BasicProperties::default().with_delivery_mode(2),
        ),
    )
    .await?;
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Ok(Ok(Confirmation::Ack(None))) => {}
        other => {
            return Err(BrokerError::Amqp {
                what: "recording the bucket state".into(),
                message: format!("{other:?}"),
            });
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
    let _ = timed(
        "channel.close",
        RPC_TIMEOUT,
        ch.close(200, "state recorded".into()),
    )
    .await;
    Ok(stale)
}

/// Deletes each stale bucket once it is empty, until none is left or `stop`.
pub async fn sweep(
    conn: &Connection,
    names: &Names,
    current: &[ShortString],
    mut stale: Vec<String>,
    stop: CancellationToken,
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
        let mut left = Vec::new();
        for q in stale {
            let queue = ShortString::from(q.as_str());
            match broker::depth(conn, &queue).await? {
                None => info!(bucket = %q, "stale bucket already gone"),
                Some(0) => {
                    let ch = broker::channel(conn).await?;
                    let deleted = timed(
                        "queue.delete",
                        RPC_TIMEOUT,
                        ch.queue_delete(
                            queue.clone(),
                            QueueDeleteOptions {
                                if_empty: true,
                                ..Default::default()
                            },
                        ),
                    )
                    .await;
                    let _ = timed("channel.close", RPC_TIMEOUT, ch.close(200, "ok".into())).await;
                    match deleted {
                        Ok(_) => info!(bucket = %q, "stale bucket empty: removed"),
                        // Not empty after all (a message arrived): try again later.
                        Err(_) => left.push(q),
                    }
                }
                Some(n) => {
                    info!(bucket = %q, waiting = n, "stale bucket draining");
                    left.push(q);
                }
            }
        }
        stale = left;
        if stale.len() != before {
            record(conn, names, current).await?;
        }
    }
    Ok(())
}
