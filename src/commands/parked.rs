//! `delay-router parked list|replay|purge`: look at the park, send parked
//! messages back to their destination, or empty it.
//!
//! Listing takes messages with `basic.get` without acking them and closes the
//! channel, which returns them in order (a quorum park counts them again a
//! moment later; `list` returns once it does). Replay acks a parked message only
//! after the broker confirmed its republish, so a replay killed at any point
//! loses nothing (a message in flight at the kill may arrive twice).

use crate::broker::publish::{Message, Outcome, Publisher};
use crate::broker::{self, BrokerError, RPC_TIMEOUT, close_channel, probe, timed};
use crate::core::contract::{PARK_REASON, PARKED_AT, integer};
use crate::core::decision::Rules;
use crate::core::parking::{parked_destination, unpark};
use crate::core::reasons::exchange_label;
use crate::core::retry::{ATTEMPTS, SOURCE_QUEUE};
use crate::core::topology::Names;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueuePurgeOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// One parked message, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub reason: String,
    pub source_queue: Option<String>,
    pub attempts: Option<i64>,
    pub parked_at_ms: Option<i64>,
    pub destination: Option<String>,
}

fn text(h: &FieldTable, key: &str) -> Option<String> {
    match h.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// What `list` shows of a parked delivery. A message RabbitMQ itself
/// dead-lettered into the park (expired in ingress) has no `x-park-reason`;
/// its `x-first-death-reason` is shown instead.
pub fn row(d: &Delivery) -> Row {
    let empty = FieldTable::default();
    let h = d.properties.headers().as_ref().unwrap_or(&empty);
    let reason = text(h, PARK_REASON)
        .or_else(|| {
            text(h, "x-first-death-reason").map(|r| format!("dead-lettered by RabbitMQ ({r})"))
        })
        .unwrap_or_else(|| "(no reason recorded)".into());
    Row {
        reason,
        source_queue: text(h, SOURCE_QUEUE),
        attempts: integer(h, ATTEMPTS),
        parked_at_ms: integer(h, PARKED_AT),
        destination: parked_destination(&d.properties).map(|d| {
            format!(
                "{} / {}",
                exchange_label(d.exchange.as_str()),
                d.routing_key
            )
        }),
    }
}

/// Which parked messages `replay` takes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub source_queue: Option<String>,
    pub reason_contains: Option<String>,
    pub limit: Option<usize>,
}

impl Filter {
    pub fn matches(&self, r: &Row) -> bool {
        self.source_queue
            .as_ref()
            .is_none_or(|q| r.source_queue.as_ref() == Some(q))
            && self
                .reason_contains
                .as_ref()
                .is_none_or(|t| r.reason.contains(t.as_str()))
    }
}

/// Reads up to `limit` parked messages without removing any.
pub async fn list(
    conn: &Connection,
    names: &Names,
    limit: Option<usize>,
) -> Result<Vec<Row>, BrokerError> {
    let ch = broker::channel(conn).await?;
    let mut rows = Vec::new();
    // The park's depth when the listing began, as the first get tells it.
    let mut depth = 0;
    while limit.is_none_or(|l| rows.len() < l) {
        match get_counted(&ch, names).await? {
            Some((d, left)) => {
                if rows.is_empty() {
                    depth = left.saturating_add(1);
                }
                rows.push(row(&d));
            }
            None => break,
        }
    }
    // Closing without acking returns every message to the park, in order.
    close_channel(&ch, "listed").await;
    if !rows.is_empty() {
        wait_returned(conn, names, depth).await?;
    }
    Ok(rows)
}

/// How long `list` waits for the park to count its messages again.
pub const RETURN_WAIT: Duration = Duration::from_secs(3);

/// A classic park has the listed messages back when the channel's close is
/// answered; a quorum park takes them back afterwards (a Raft command each
/// channel's end sends), and counts them only then. Waits, up to
/// [`RETURN_WAIT`], until the park's depth is back to what it was, so that a
/// command run next (a replay, a purge) sees every message. Another
/// consumer of the park (a replay running meanwhile) can keep it lower: then
/// the wait ends at its bound, and nothing is lost either way. `replay`
/// waits so for what it skipped or left.
async fn wait_returned(conn: &Connection, names: &Names, depth: u32) -> Result<(), BrokerError> {
    let until = tokio::time::Instant::now() + RETURN_WAIT;
    loop {
        let now = probe::depth(conn, &names.parked).await?.unwrap_or(0);
        if now >= depth || tokio::time::Instant::now() >= until {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get(ch: &Channel, names: &Names) -> Result<Option<Delivery>, BrokerError> {
    Ok(get_counted(ch, names).await?.map(|(d, _)| d))
}

/// A parked message and how many are left in the park behind it.
async fn get_counted(ch: &Channel, names: &Names) -> Result<Option<(Delivery, u32)>, BrokerError> {
    Ok(timed(
        "basic.get parked",
        RPC_TIMEOUT,
        ch.basic_get(names.parked.clone(), BasicGetOptions { no_ack: false }),
    )
    .await?
    .map(|m| (m.delivery, m.message_count)))
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    pub replayed: usize,
    pub skipped: usize,
    /// Matching but without a known destination, one the router may not
    /// deliver to (its own names, outside the allow-list), or refused by it:
    /// left parked.
    pub failed: usize,
}

/// Sends matching parked messages back to their destination; each leaves the
/// park only after its republish is confirmed and routed. A destination the
/// plan does not allow, or one the broker refuses (even by closing the
/// channel), leaves that message parked and the replay goes on.
pub async fn replay(
    conn: Arc<Connection>,
    rules: &Rules,
    filter: &Filter,
) -> Result<Replayed, BrokerError> {
    let names = &rules.names;
    let total = probe::depth(&conn, &names.parked).await?.unwrap_or(0) as usize;
    let get_ch = broker::channel(&conn).await?;
    let publisher = Publisher::open(conn.clone()).await?;
    let progress = std::io::stderr().is_terminal();
    let mut done = Replayed::default();
    let mut scanned = 0;
    while filter.limit.is_none_or(|l| done.replayed < l) && scanned < total {
        let Some(d) = get(&get_ch, names).await? else {
            break;
        };
        scanned += 1;
        let r = row(&d);
        let acker = d.acker.clone();
        if !filter.matches(&r) {
            done.skipped += 1;
            continue;
        }
        let Some(dest) = parked_destination(&d.properties) else {
            done.failed += 1;
            continue;
        };
        if let Err(reason) = rules.check_destination(&dest) {
            warn!(%reason, "not replayed: left parked");
            done.failed += 1;
            continue;
        }
        let data = Arc::new(d.data);
        let outcome = publisher
            .publish(Message {
                exchange: &dest.exchange,
                routing_key: &dest.routing_key,
                properties: &unpark(&d.properties),
                data: &data,
            })
            .await?;
        match outcome {
            Outcome::Confirmed => {
                timed(
                    "basic.ack parked",
                    RPC_TIMEOUT,
                    acker.ack(BasicAckOptions::default()),
                )
                .await?;
                done.replayed += 1;
            }
            other => {
                warn!(
                    exchange = exchange_label(dest.exchange.as_str()),
                    routing_key = %dest.routing_key,
                    outcome = ?other,
                    "not replayed: the destination refused it; left parked"
                );
                done.failed += 1;
            }
        }
        if progress {
            eprint!(
                "\rreplayed {} of {} scanned ({} in the park)   ",
                done.replayed, scanned, total
            );
            let _ = std::io::stderr().flush();
        }
    }
    if progress {
        eprintln!();
    }
    // Skipped and failed ones return to the park when the channel closes.
    close_channel(&get_ch, "replayed").await;
    publisher.close().await;
    if done.skipped + done.failed > 0 {
        let left = total.saturating_sub(done.replayed);
        wait_returned(&conn, names, u32::try_from(left).unwrap_or(u32::MAX)).await?;
    }
    Ok(done)
}

/// Empties the park; returns how many messages were removed.
pub async fn purge(conn: &Connection, names: &Names) -> Result<u32, BrokerError> {
    let ch = broker::channel(conn).await?;
    let n = timed(
        "queue.purge parked",
        RPC_TIMEOUT,
        ch.queue_purge(names.parked.clone(), QueuePurgeOptions::default()),
    )
    .await?;
    close_channel(&ch, "purged").await;
    Ok(n)
}

/// Renders rows as aligned text, ages relative to `now_ms`.
pub fn render(rows: &[Row], now_ms: i64) -> String {
    let mut out = format!(
        "{:>8}  {:>8}  {:<28}  {:<32}  reason\n",
        "age", "attempts", "source queue", "destination"
    );
    for r in rows {
        let age = r
            .parked_at_ms
            .map(|t| {
                humantime::format_duration(std::time::Duration::from_secs(
                    ((now_ms - t).max(0) / 1000) as u64,
                ))
                .to_string()
            })
            .unwrap_or_else(|| "?".into());
        out.push_str(&format!(
            "{:>8}  {:>8}  {:<28}  {:<32}  {}\n",
            age,
            r.attempts.map_or_else(|| "-".into(), |a| a.to_string()),
            r.source_queue.as_deref().unwrap_or("-"),
            r.destination.as_deref().unwrap_or("-"),
            r.reason
        ));
    }
    out.push_str(&format!("{} parked message(s) shown\n", rows.len()));
    out
}
