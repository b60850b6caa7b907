//! The lanes: what a bucket expires reaches the router through `<prefix>.lanes`,
//! which sorts a message due soon after its bucket into `<prefix>.due` and
//! passes the rest to `<prefix>.expired`. Checked on the broker itself (the
//! dead-lettering, the exchange-to-exchange binding, the headers match and
//! the alternate exchange) with classic and with quorum buckets, and over
//! the topology an earlier version declared.

mod common;
use common::*;
use delay_router::core::decision::{Action, Rules};
use delay_router::testkit::decide;
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, QueueBindOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::time::Duration;

const QUORUM: &str = "[topology]\nqueue_type = \"quorum\"\n";
/// A short due lane, so that a test ladder has messages on both sides of it.
/// The due lane takes what is due within 1 s of its bucket's expiry (built
/// in at 1 m).
fn due_within_1s(c: &mut delay_router::config::Config) {
    c.due_within = std::time::Duration::from_secs(1);
}

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

/// Where the core places a message of `ms` at ingress: the bucket and the
/// properties it waits there with.
fn placement(rules: &Rules, ms: i64) -> (ShortString, BasicProperties) {
    match decide::ingress(rules, &"k".into(), &delayed(ms, "nowhere"), 0, 0.0) {
        Action::Wait {
            queue, properties, ..
        } => (queue, properties),
        other => panic!("{ms} ms waits in a bucket, not {other:?}"),
    }
}

/// Places messages in their buckets as the router would (no router runs),
/// waits for the buckets to expire them, and counts where they arrived.
async fn sorted_by_the_broker(extra: &str) {
    let h = Harness::tuned(&["1s", "2s"], extra, due_within_1s).await;
    let rules = Rules::from_config(&h.config);
    delay_router::broker::declare::declare(&h.conn, &rules.topology())
        .await
        .unwrap();
    // 1.2 s: the 1s bucket, 0.2 s left after it; 5.5 s: two laps of 2s (the
    // 4s bucket cascade adds), 1.5 s left.
    let (soon_bucket, soon) = placement(&rules, 1200);
    let (later_bucket, later) = placement(&rules, 5500);
    assert_eq!(later_bucket.as_str(), format!("{}.bucket.4s", h.prefix));
    assert_ne!(soon_bucket, later_bucket);
    for (bucket, props, n) in [(&soon_bucket, &soon, 3), (&later_bucket, &later, 2)] {
        for _ in 0..n {
            let confirm =
                h.ch.basic_publish(
                    "".into(),
                    bucket.clone(),
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
            assert_eq!(confirm, lapin::Confirmation::Ack(None), "into {bucket}");
        }
    }
    h.wait_depth(h.names.due.as_str(), 3).await;
    h.wait_depth(h.names.expired.as_str(), 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.depth(h.names.due.as_str()).await, 3);
    assert_eq!(h.depth(h.names.expired.as_str()).await, 2);
    h.cleanup().await;
}

#[tokio::test]
async fn a_classic_bucket_sorts_what_is_due_soon_into_the_due_lane() {
    sorted_by_the_broker("").await;
}

#[tokio::test]
async fn a_quorum_bucket_sorts_what_is_due_soon_into_the_due_lane() {
    sorted_by_the_broker(QUORUM).await;
}

/// A prefix an earlier version declared has the expired queue bound to the
/// expired exchange directly. Declaring it anew removes that binding: a due
/// message then reaches the due lane only, and one without the lane header
/// (placed by the earlier version) still reaches the expired queue.
#[tokio::test]
async fn declaring_over_an_earlier_topology_leaves_one_way_to_each_lane() {
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
    let mut due = FieldTable::default();
    due.insert(
        delay_router::core::contract::TRANSIT_LANE.into(),
        AMQPValue::LongString("due".into()),
    );
    for props in [
        BasicProperties::default().with_headers(due),
        BasicProperties::default(),
    ] {
        let confirm =
            h.ch.basic_publish(
                h.names.expired_exchange.clone(),
                "".into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                b"m",
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(confirm, lapin::Confirmation::Ack(None));
    }
    h.wait_depth(h.names.due.as_str(), 1).await;
    h.wait_depth(h.names.expired.as_str(), 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.depth(h.names.due.as_str()).await, 1);
    assert_eq!(h.depth(h.names.expired.as_str()).await, 1);
    h.cleanup().await;
}

/// The router consumes the due lane too: a message due soon after its
/// bucket arrives on time through it, with none of the router's headers.
#[tokio::test]
async fn a_message_through_the_due_lane_arrives_on_time_without_router_headers() {
    let mut h = Harness::tuned(&["1s", "2s"], "", due_within_1s).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    // The router's deadlines are on the wall clock (README, Guarantees: "by
    // the router's clock"); a step of it (a VM resumed from a pause) moves
    // them against the monotonic clock, so both are read.
    let sent = std::time::Instant::now();
    let sent_wall = std::time::SystemTime::now();
    // The 2s bucket with 2.6 s left after it, then the 2s bucket with 0.6 s
    // left (the due lane), then 0.6 s the router times itself.
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
    assert_eq!(h.stats.snapshot().due, 1, "through the due lane once");
    h.cleanup().await;
}

/// A burst that leaves its bucket together with a second left is timed by
/// the router on the due lane's hold room, not sent through finer buckets:
/// with a prefetch of 20, holds were capped at 10, and the other 50 took
/// one to three more buckets (the halving rungs) each.
#[tokio::test]
async fn a_burst_due_together_is_held_in_the_due_lanes_room() {
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
    assert_eq!(s.due, 60, "{s:?}");
    h.cleanup().await;
}
