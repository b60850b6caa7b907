//! Tombstones: the message-ids cancelled (by `delay-router cancel` or a
//! message with `x-cancel-message-id`), as read from `<prefix>.cancels`.
//!
//! The cancels stream lives in the broker, replicated where the queues are,
//! so tombstones survive router restarts and every router of the prefix
//! sees every one. Each session reads the stream from its first retained
//! record, writes a catch-up marker of its own and reads on until it sees
//! it: only then does it consume expiries, so a cancel written before the
//! router (re)started is never missed. It then follows the stream until the
//! session ends. The expired pipeline looks each message-id up here
//! ([`Tombstones::is_cancelled`]): a concurrent map, read by the pipeline
//! while the follower writes.

use super::stats::Stats;
use crate::broker::publish::{Message, Outcome, confirm_channel, publish_once};
use crate::broker::{self, BrokerError, RPC_TIMEOUT, close_channel, timed};
use crate::core::cancel::{self, Record};
use crate::core::topology::Names;
use dashmap::DashMap;
use futures_util::StreamExt;
use lapin::Connection;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};
use crate::tuning::{CANCELS_PREFETCH as PREFETCH, CANCELS_ACK_EVERY as ACK_EVERY};

/// Longest wait for a session to read the whole stream at start.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// Cancelled message-ids and when each stops mattering (ms since the Unix epoch).
#[derive(Debug, Default)]
pub struct Tombstones {
    until: DashMap<String, i64>,
}

impl Tombstones {
    /// Records a tombstone; a later end wins.
    pub fn insert(&self, message_id: String, until_ms: i64) {
        self.until
            .entry(message_id)
            .and_modify(|u| *u = (*u).max(until_ms))
            .or_insert(until_ms);
    }

    /// Whether `message_id` is cancelled at `now_ms`.
    pub fn is_cancelled(&self, message_id: &str, now_ms: i64) -> bool {
        self.until.get(message_id).is_some_and(|u| *u > now_ms)
    }

    /// Forgets tombstones that ended; returns how many remain.
    pub fn sweep(&self, now_ms: i64) -> usize {
        self.until.retain(|_, u| *u > now_ms);
        self.until.len()
    }

    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

/// Reads the cancels stream from its start into `tombstones`, sends on
/// `caught_up` once this session's marker is read, then follows the stream
/// until `halt`. Markers are written on `publish_conn`.
pub async fn follow(
    conn: &Connection,
    publish_conn: &Connection,
    names: &Names,
    tombstones: &Tombstones,
    stats: &Stats,
    caught_up: oneshot::Sender<()>,
    halt: CancellationToken,
) -> Result<(), BrokerError> {
    let ch = broker::channel(conn).await?;
    let result = read(&ch, publish_conn, names, tombstones, stats, caught_up, halt).await;
    close_channel(&ch, "bye").await;
    result
}

async fn read(
    ch: &lapin::Channel,
    publish_conn: &Connection,
    names: &Names,
    tombstones: &Tombstones,
    stats: &Stats,
    caught_up: oneshot::Sender<()>,
    halt: CancellationToken,
) -> Result<(), BrokerError> {
    timed(
        "basic.qos (cancels)",
        RPC_TIMEOUT,
        ch.basic_qos(PREFETCH, BasicQosOptions::default()),
    )
    .await?;
    let mut args = FieldTable::default();
    args.insert(
        "x-stream-offset".into(),
        AMQPValue::LongString("first".into()),
    );
    let mut consumer = timed(
        &format!("basic.consume {}", names.cancels),
        RPC_TIMEOUT,
        ch.basic_consume(
            names.cancels.clone(),
            "delay-router-cancels".into(),
            BasicConsumeOptions::default(),
            args,
        ),
    )
    .await?;
    let token = super::presence::new_instance();
    write_marker(publish_conn, names, &token).await?;
    let started = std::time::Instant::now();
    let mut caught_up = Some(caught_up);
    let (mut read, mut unacked) = (0u64, 0u64);
    let mut sweep = tokio::time::interval(Duration::from_secs(60));
    loop {
        let delivery = tokio::select! {
            () = halt.cancelled() => return Ok(()),
            _ = sweep.tick() => {
                stats.set_tombstones(tombstones.sweep(super::clock::now_ms()));
                continue;
            }
            next = consumer.next() => match next {
                Some(Ok(d)) => d,
                Some(Err(e)) => return Err(BrokerError::amqp("cancels stream", e)),
                None => return Err(BrokerError::other("cancels stream", "the consumer was cancelled")),
            },
        };
        read += 1;
        unacked += 1;
        match cancel::read(&delivery.properties) {
            Some(Record::Tombstone {
                message_id,
                until_ms,
            }) => {
                if caught_up.is_none() {
                    info!(message_id = %message_id, "message-id cancelled");
                }
                tombstones.insert(message_id, until_ms);
                stats.set_tombstones(tombstones.len());
            }
            Some(Record::Marker(t)) if t == token => {
                if let Some(tx) = caught_up.take() {
                    let now = super::clock::now_ms();
                    stats.set_tombstones(tombstones.sweep(now));
                    info!(
                        records = read,
                        tombstones = tombstones.len(),
                        took_ms = started.elapsed().as_millis() as u64,
                        "cancels stream read"
                    );
                    let _ = tx.send(());
                }
            }
            Some(Record::Marker(_)) => {}
            None => debug!("ignoring a message in the cancels stream that is not a tombstone"),
        }
        if unacked >= ACK_EVERY || caught_up.is_none() {
            timed(
                "basic.ack (cancels)",
                RPC_TIMEOUT,
                delivery.acker.ack(BasicAckOptions { multiple: true }),
            )
            .await?;
            unacked = 0;
        }
    }
}

/// Writes this session's catch-up marker to the cancels stream.
async fn write_marker(conn: &Connection, names: &Names, token: &str) -> Result<(), BrokerError> {
    write(conn, names, &cancel::marker(token)).await
}

/// Writes one record to the cancels stream and waits for the broker's confirm.
async fn write(
    conn: &Connection,
    names: &Names,
    properties: &lapin::BasicProperties,
) -> Result<(), BrokerError> {
    let ch = confirm_channel(conn).await?;
    let outcome = publish_once(
        &ch,
        Message {
            exchange: &"".into(),
            routing_key: &names.cancels,
            properties,
            data: &std::sync::Arc::new(Vec::new()),
        },
    )
    .await;
    close_channel(&ch, "bye").await;
    match outcome? {
        Outcome::Confirmed => Ok(()),
        Outcome::Returned => Err(BrokerError::other(
            format!("publish to {}", names.cancels),
            "the cancels stream does not exist: run `delay-router declare` (or start the router) first",
        )),
        other => Err(BrokerError::other(
            format!("publish to {}", names.cancels),
            format!("{other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_end_and_the_later_end_wins() {
        let t = Tombstones::default();
        t.insert("a".into(), 100);
        t.insert("a".into(), 50);
        assert!(t.is_cancelled("a", 99));
        assert!(!t.is_cancelled("a", 100));
        assert!(!t.is_cancelled("b", 0));
        t.insert("b".into(), 10);
        assert_eq!(t.sweep(20), 1);
    }
}
