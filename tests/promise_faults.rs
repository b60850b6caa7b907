//! The promises that need the broker itself to stop, proven from outside as
//! `tests/promises.rs` proves the others: the `delay-router` binary, a
//! configuration file, a RabbitMQ client and `rabbitmqctl`, nothing from the
//! `delay_router` crate. Each test stops the test broker (`stop_app`, a few
//! seconds, `start_app`: on the 4.3 cluster, the node the router and the
//! client use), so they are ignored in the parallel suite; `scripts/test`
//! runs them one at a time after it:
//!
//! `cargo test --test promise_faults -- --ignored --test-threads 1`

#[path = "promises/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::*;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::HashMap;
use std::time::Duration;

const LADDER: [&str; 4] = ["1s", "2s", "4s", "8s"];
/// Messages published before the broker stops.
const MESSAGES: usize = 240;
/// How long the broker's queues are stopped.
const STOPPED: Duration = Duration::from_secs(4);

/// One message as published: its delay, and when its publish began.
struct Sent {
    delay_ms: i64,
    published_ms: i64,
}

/// Publishes [`MESSAGES`] persistent messages for `dest` with the delays
/// 1, 2, 4 and 8 s in turn (each exactly a rung: under round-up one bucket,
/// expiring its TTL after the router placed it).
async fn publish(r: &Router, c: &Client, dest: &str) -> HashMap<String, Sent> {
    let mut sent = HashMap::new();
    for i in 0..MESSAGES {
        let delay_ms = 1_000i64 << (i % 4);
        let id = format!("m{i}");
        let p = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.as_str().into())
            .with_headers(table(&[
                ("x-requested-delay", AMQPValue::LongLongInt(delay_ms)),
                ("x-original-exchange", text(dest)),
            ]));
        let published_ms = now_ms();
        c.publish(&r.name("router"), "k", p, id.as_bytes()).await;
        sent.insert(
            id,
            Sent {
                delay_ms,
                published_ms,
            },
        );
    }
    sent
}

/// Stops the broker's queues for [`STOPPED`] and starts them again; the
/// span in ms since the Unix epoch during which they were stopping, stopped
/// or starting.
async fn restart_broker() -> (i64, i64) {
    let from = now_ms();
    ctl(&["stop_app"]);
    tokio::time::sleep(STOPPED).await;
    ctl(&["start_app"]);
    ctl(&["await_startup"]);
    (from, now_ms())
}

/// Publishes, restarts the broker while the messages wait, and collects
/// every arrival at the destination queue once the broker is back.
async fn through_a_restart(
    queue_type: &str,
) -> (HashMap<String, Sent>, Vec<(String, i64)>, (i64, i64)) {
    let prefix = format!("drp-{:08x}", rand::random::<u32>());
    let r = Router::on_typed(
        &prefix,
        queue_type,
        &LADDER,
        "[placement]\nstrategy = \"round-up\"\n",
    );
    r.wait_ready(Duration::from_secs(60)).await;
    let c = Client::connect().await;
    let (dest, inbox) = (r.name("dest"), r.name("inbox"));
    c.exchange(&dest, lapin::ExchangeKind::Direct).await;
    c.queue(&inbox, FieldTable::default(), &dest, "k").await;
    let sent = publish(&r, &c, &dest).await;
    // Some messages have left their 1 s bucket, the rest wait in theirs.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    drop(c);
    let stopped = restart_broker().await;
    let c = Client::connect_within(Duration::from_secs(60)).await;
    let mut consumer = c.consume(&inbox).await;
    let mut got = Vec::new();
    // The longest delay, the time the broker was away, and room.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = std::collections::HashSet::new();
    while seen.len() < sent.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some(a) = consumer.next(left).await else {
            break;
        };
        seen.insert(message_id(&a));
        got.push((message_id(&a), a.at_ms));
    }
    // A little longer for duplicates.
    while let Some(a) = consumer.next(Duration::from_secs(2)).await {
        got.push((message_id(&a), a.at_ms));
    }
    consumer.close().await;
    r.remove(&c).await;
    (sent, got, stopped)
}

/// Every arrival no earlier than its delay after its publish began (the
/// router read it then or later, never sooner).
fn assert_never_early(sent: &HashMap<String, Sent>, got: &[(String, i64)]) {
    for (id, at_ms) in got {
        let s = &sent[id];
        assert!(
            *at_ms >= s.published_ms + s.delay_ms,
            "{id} arrived {} ms after it was published, asked {} ms",
            at_ms - s.published_ms,
            s.delay_ms
        );
    }
}

#[tokio::test]
#[ignore = "stops the test broker: scripts/test runs it after the parallel suite"]
async fn quorum_buckets_lose_nothing_when_the_broker_restarts() {
    let (sent, got, (from, to)) = through_a_restart("quorum").await;
    let missing: Vec<&String> = sent
        .keys()
        .filter(|id| !got.iter().any(|(g, _)| g == *id))
        .collect();
    let twice = got.len() - (sent.len() - missing.len());
    eprintln!(
        "quorum: {} of {} arrived, {twice} twice, broker away {} ms",
        sent.len() - missing.len(),
        sent.len(),
        to - from
    );
    assert!(missing.is_empty(), "lost with quorum buckets: {missing:?}");
    assert_never_early(&sent, &got);
}

#[tokio::test]
#[ignore = "stops the test broker: scripts/test runs it after the parallel suite"]
async fn classic_buckets_lose_only_what_expires_while_the_broker_stops() {
    let (sent, got, (from, to)) = through_a_restart("classic").await;
    let missing: Vec<(&String, &Sent)> = sent
        .iter()
        .filter(|(id, _)| !got.iter().any(|(g, _)| g == *id))
        .collect();
    eprintln!(
        "classic: {} of {} arrived, broker away {} ms",
        sent.len() - missing.len(),
        sent.len(),
        to - from
    );
    // A classic bucket's message lost to the broker's at-most-once
    // dead-lettering had its TTL run out while the node was stopping its
    // queues: its bucket's expiry (placed a few ms after its publish) falls
    // in the span the broker was going down or away.
    for (id, s) in &missing {
        let expiry = s.published_ms + s.delay_ms;
        assert!(
            expiry >= from - 1_000 && expiry <= to + 1_000,
            "{id} (delay {} ms) was lost though its bucket expired it {} ms from the stop, outside the {} ms the broker was away",
            s.delay_ms,
            expiry - from,
            to - from
        );
    }
    assert_never_early(&sent, &got);
}
