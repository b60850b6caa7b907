//! The lanes: what a bucket expires reaches the router through
//! `<prefix>.lanes`, a headers exchange with no binding of its own, whose
//! alternate exchange passes everything to `<prefix>.expired`. Checked on
//! the broker itself (the dead-lettering, the exchange-to-exchange binding
//! and the alternate exchange) with classic and with quorum buckets, over
//! the topology an earlier version declared, and through the retirement of
//! an earlier version's due lane (`<prefix>.due`).

mod common;
use common::*;
use delay_router::core::contract::{DUE_LANE, TRANSIT_LANE};
use delay_router::core::decision::{Action, Rules};
use delay_router::core::topology::retired_due_binding;
use delay_router::testkit::decide;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::time::{Duration, Instant};

const QUORUM: &str = "[topology]\nqueue_type = \"quorum\"\n";
const CLASSIC: &str = "[topology]\nqueue_type = \"classic\"\n";

fn delayed(ms: i64, to: &str) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(
        "x-requested-delay".into(),
        AMQPValue::LongString(LongString::from(ms.to_string())),
    );
    h.insert(
        "x-original-exchange".into(),
        AMQPValue::LongString(LongString::from("")),
    );
    h.insert(
        "x-original-routing-key".into(),
        AMQPValue::LongString(LongString::from(to)),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(h)
}

/// Where the core places a message of `ms` for queue `to`, placed at
/// `now_ms`: the bucket and the properties it waits there with.
fn placement(rules: &Rules, ms: i64, to: &str, now_ms: i64) -> (ShortString, BasicProperties) {
    match decide::ingress(rules, &"k".into(), &delayed(ms, to), now_ms, 0.0) {
        Action::Wait {
            queue, properties, ..
        } => (queue, properties),
        other => panic!("{ms} ms waits in a bucket, not {other:?}"),
    }
}

/// `p` with the lane mark an earlier version wrote on what it sorted into
/// its due lane.
fn marked(p: &BasicProperties) -> BasicProperties {
    let mut h = p.headers().clone().unwrap_or_default();
    h.insert(TRANSIT_LANE.into(), AMQPValue::LongString(DUE_LANE.into()));
    p.clone().with_headers(h)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn publish_to(h: &Harness, exchange: &str, key: &str, props: &BasicProperties) {
    let confirm =
        h.ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"m",
            props.clone(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        confirm,
        lapin::Confirmation::Ack(None),
        "into {exchange}/{key}"
    );
}

/// Places messages in their buckets as the router would (no router runs),
/// some with an earlier version's lane mark, waits for the buckets to
/// expire them, and counts where they arrived: all in the expired queue.
async fn expired_into_the_expired_queue(extra: &str) {
    let h = Harness::new(&["1s", "2s"], extra).await;
    let rules = Rules::from_config(&h.config);
    delay_router::broker::declare::declare(&h.conn, &rules.topology())
        .await
        .unwrap();
    // 1.2 s: the 1s bucket; 5.5 s: two laps of 2s (the 4s bucket cascade adds).
    let (soon_bucket, soon) = placement(&rules, 1200, "nowhere", 0);
    let (later_bucket, later) = placement(&rules, 5500, "nowhere", 0);
    assert_eq!(later_bucket.as_str(), format!("{}.bucket.4s", h.prefix));
    assert_ne!(soon_bucket, later_bucket);
    for (bucket, props, n) in [
        (&soon_bucket, soon.clone(), 2),
        (&soon_bucket, marked(&soon), 1),
        (&later_bucket, later.clone(), 1),
        (&later_bucket, marked(&later), 1),
    ] {
        for _ in 0..n {
            publish_to(&h, "", bucket.as_str(), &props).await;
        }
    }
    h.wait_depth(h.names.expired.as_str(), 5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.depth(h.names.expired.as_str()).await, 5);
    assert!(
        !h.exists(h.names.due.as_str()).await,
        "no due lane is declared"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn what_a_classic_bucket_expires_reaches_the_expired_queue() {
    expired_into_the_expired_queue("").await;
}

#[tokio::test]
async fn what_a_quorum_bucket_expires_reaches_the_expired_queue() {
    expired_into_the_expired_queue(QUORUM).await;
}

/// A prefix an earlier version declared has the expired queue bound to the
/// expired exchange directly. Declaring it anew removes that binding: a
/// message, with or without the lane mark, then reaches the expired queue
/// once.
#[tokio::test]
async fn declaring_over_an_earlier_topology_leaves_one_way_to_the_expired_queue() {
    let h = Harness::new(&["1s"], "").await;
    let rules = Rules::from_config(&h.config);
    let topology = rules.topology();
    delay_router::broker::declare::declare(&h.conn, &topology)
        .await
        .unwrap();
    // As the earlier version bound it.
    h.ch.queue_bind(
        h.names.expired.clone(),
        h.names.expired_exchange.clone(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    delay_router::broker::declare::declare(&h.conn, &topology)
        .await
        .unwrap();
    let plain = BasicProperties::default();
    for props in [marked(&plain), plain] {
        publish_to(&h, h.names.expired_exchange.as_str(), "", &props).await;
    }
    h.wait_depth(h.names.expired.as_str(), 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.depth(h.names.expired.as_str()).await, 2);
    h.cleanup().await;
}

/// An earlier version's due lane: `<prefix>.due`, bound to the lanes with
/// the lane mark's binding, holding what its buckets expired with the mark.
/// The router unbinds it, moves what it holds into the expired queue (each
/// message delivered once, none early) and deletes it when classic; a
/// quorum one it leaves, empty, for the operator. Afterwards a marked
/// message (placed by the earlier version) reaches the expired queue.
async fn an_earlier_due_lane_is_retired(extra: &str, quorum: bool) {
    let mut h = Harness::new(&["1s", "2s"], extra).await;
    let rules = Rules::from_config(&h.config);
    delay_router::broker::declare::declare(&h.conn, &rules.topology())
        .await
        .unwrap();
    let mut args = FieldTable::default();
    if quorum {
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    h.ch.queue_declare(
        h.names.due.clone(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap();
    h.ch.queue_bind(
        h.names.due.clone(),
        h.names.lanes.clone(),
        "".into(),
        QueueBindOptions::default(),
        retired_due_binding(),
    )
    .await
    .unwrap();
    let q = h.queue("dest").await;
    // 2.3 s: the 2s bucket, then 0.3 s: what the due lane took.
    let (placed, placed_at) = (Instant::now(), now_ms());
    let (bucket, props) = placement(&rules, 2300, &q, placed_at);
    for _ in 0..3 {
        publish_to(&h, "", bucket.as_str(), &marked(&props)).await;
    }
    h.wait_depth(h.names.due.as_str(), 3).await;
    let started = Instant::now();
    h.start_router().await;
    let got = h.receive(&q, 3, Duration::from_secs(15)).await;
    assert!(
        got.iter()
            .all(|(at, _)| *at - placed >= Duration::from_millis(2300)),
        "delivered before the deadline"
    );
    assert!(
        got.iter()
            .all(|(at, _)| *at - started < Duration::from_secs(10)),
        "moved out of the due lane and delivered within 10 s of the start"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    if quorum {
        while h.depth(h.names.due.as_str()).await > 0 {
            assert!(
                Instant::now() < deadline,
                "the quorum due lane was not emptied"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        while h.exists(h.names.due.as_str()).await {
            assert!(
                Instant::now() < deadline,
                "the classic due lane was not removed"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Placed by the earlier version, expired after the retirement: through
    // the expired queue, once.
    let (bucket, props) = placement(&rules, 1100, &q, now_ms());
    publish_to(&h, "", bucket.as_str(), &marked(&props)).await;
    let got = h.receive(&q, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.depth(&q).await, 0, "delivered once");
    if quorum {
        assert!(
            h.exists(h.names.due.as_str()).await,
            "a quorum due lane is left"
        );
        assert_eq!(
            h.depth(h.names.due.as_str()).await,
            0,
            "unbound: nothing enters it"
        );
    }
    h.cleanup().await;
}

#[tokio::test]
async fn an_earlier_classic_due_lane_is_emptied_and_removed() {
    an_earlier_due_lane_is_retired(CLASSIC, false).await;
}

#[tokio::test]
async fn an_earlier_quorum_due_lane_is_emptied_unbound_and_left() {
    an_earlier_due_lane_is_retired(QUORUM, true).await;
}

/// A message through two buckets and the router's own last fraction
/// arrives on time, with none of the router's headers.
#[tokio::test]
async fn a_message_through_the_lanes_arrives_on_time_without_router_headers() {
    let mut h = Harness::new(&["1s", "2s"], "").await;
    h.start_router().await;
    let q = h.queue("dest").await;
    // The router's deadlines are on the wall clock (README, Guarantees: "by
    // the router's clock"); a step of it (a VM resumed from a pause) moves
    // them against the monotonic clock, so both are read.
    let sent = std::time::Instant::now();
    let sent_wall = std::time::SystemTime::now();
    // The 2s bucket with 2.6 s left after it, then the 2s bucket with 0.6 s
    // left, then 0.6 s the router times itself.
    h.publish("k", to_queue(&q, AMQPValue::LongLongInt(4600)), b"due")
        .await;
    let got = h.receive(&q, 1, Duration::from_secs(15)).await;
    let took = got[0].0 - sent;
    // Wall time from the publish to now, less the (monotonic) moment since
    // the arrival: the arrival by the wall clock, give or take a step in
    // between.
    let took_wall = sent_wall
        .elapsed()
        .unwrap_or_default()
        .saturating_sub(got[0].0.elapsed());
    assert!(
        took_wall >= Duration::from_millis(4600),
        "early: arrived {took_wall:?} by the wall clock ({took:?} by the monotonic one) after the publish of a 4.6 s delay"
    );
    let headers = got[0].1.properties.headers().clone().unwrap_or_default();
    assert!(
        headers
            .inner()
            .keys()
            .all(|k| !k.as_str().contains("delay-router")),
        "{headers:?}"
    );
    h.cleanup().await;
}

/// A burst that leaves its bucket together with a second left is timed by
/// the router on the expired queue's hold room, not sent through finer buckets:
/// with a prefetch of 20, holds were capped at 10, and the other 50 took
/// one to three more buckets (the halving rungs) each.
#[tokio::test]
async fn a_burst_due_together_is_held_in_the_expired_queues_room() {
    let mut h = Harness::new(&["4s"], "[amqp]\nprefetch = 20\n").await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let sent = std::time::Instant::now();
    for i in 0..60 {
        let props =
            to_queue(&q, AMQPValue::LongLongInt(5000)).with_message_id(i.to_string().into());
        h.publish("k", props, b"burst").await;
    }
    let got = h.receive(&q, 60, Duration::from_secs(30)).await;
    let ids: std::collections::BTreeSet<usize> = got.iter().map(|(_, d)| id(d)).collect();
    assert_eq!(ids.len(), 60, "every message once");
    for (at, d) in &got {
        assert!(
            *at - sent >= Duration::from_millis(5000),
            "message {} early: {:?} after the first publish",
            id(d),
            *at - sent
        );
    }
    let s = h.stats.snapshot();
    assert_eq!(
        s.placed, 60,
        "one bucket each, no finer ones after it: {s:?}"
    );
    assert_eq!(s.held, 60, "the router timed every last second: {s:?}");
    h.cleanup().await;
}
