//! Placement strategies end to end: cascade's precision, priority's bounds,
//! delays beyond the top rung, and switching strategy or ladder while
//! messages wait (none lost, none early, stale buckets removed, or left
//! for the operator when quorum).

mod common;
use common::*;
use delay_router::core::decision::{Action, Rules};
use delay_router::testkit::decide;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// These tests read which rung's queue a message waits in: one queue a rung
/// (the shards of a rung: tests/shards.rs).
const CASCADE: &str = "[placement]\nstrategy = \"cascade\"";
const ROUND_UP: &str = "[placement]\nstrategy = \"round-up\"";

fn one_queue(c: &mut delay_router::config::Config) {
    c.bucket_shards = Some(1);
}

/// Publishes one message per delay (ms) to `queue` via the router; returns send times by id.
async fn send(h: &Harness, queue: &str, delays: &[u64]) -> BTreeMap<usize, (Instant, u64)> {
    let mut sent = BTreeMap::new();
    for (i, d) in delays.iter().enumerate() {
        let props = to_queue(queue, AMQPValue::LongLongInt(*d as i64))
            .with_message_id(i.to_string().into());
        sent.insert(i, (Instant::now(), *d));
        h.publish("k", props, b"x").await;
    }
    sent
}

/// Receives every message and returns lateness (arrival - send - delay) by id; fails if any is early.
async fn lateness(
    h: &Harness,
    queue: &str,
    sent: &BTreeMap<usize, (Instant, u64)>,
    within: Duration,
) -> BTreeMap<usize, Duration> {
    let got = h.receive(queue, sent.len(), within).await;
    let mut out = BTreeMap::new();
    for (at, d) in got {
        let i = id(&d);
        let (t0, delay) = sent[&i];
        assert_eq!(
            *d.properties.expiration(),
            None,
            "message {i}: the router's TTL leaked"
        );
        assert_eq!(
            *d.properties.priority(),
            None,
            "message {i}: the router's priority leaked"
        );
        let waited = at - t0;
        let delay = Duration::from_millis(delay);
        assert!(
            waited >= delay,
            "message {i} early: waited {waited:?} for {delay:?}"
        );
        assert!(out.insert(i, waited - delay).is_none(), "message {i} twice");
    }
    out
}

#[tokio::test]
async fn cascade_delivers_within_milliseconds_and_never_early() {
    let mut h = Harness::new(&["1s", "2s"], "[placement]\nstrategy = \"cascade\"").await;
    h.start_router().await;
    let q = h.queue("dest").await;
    // Below the finer rungs, between them, between user rungs, beyond the top rung.
    let delays = [80, 300, 740, 1_300, 3_700, 6_100];
    let sent = send(&h, &q, &delays).await;
    let late = lateness(&h, &q, &sent, Duration::from_secs(20)).await;
    for (i, l) in &late {
        // Expected a few ms; the margin is for shared CI machines.
        assert!(
            *l < Duration::from_millis(600),
            "message {i} ({}ms) late by {l:?}",
            delays[*i]
        );
    }
    // The finer rungs exist only for cascade.
    assert!(h.exists(&format!("{}.bucket.500ms", h.prefix)).await);
    assert!(h.exists(&format!("{}.bucket.250ms", h.prefix)).await);
    h.cleanup().await;
}

/// The grid: below the second rung cascade adds a rung every 2 s, so the
/// time left under it takes one bucket and a hold (not the halves of the
/// smallest rung one after another).
#[tokio::test]
async fn cascade_fills_what_is_under_the_second_rung_with_one_grid_rung() {
    let mut h = Harness::tuned(&["3s", "6s"], CASCADE, one_queue).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let bucket = |ttl: &str| format!("{}.bucket.{ttl}", h.prefix);
    for ttl in ["2s", "4s", "1000ms", "500ms", "250ms"] {
        assert!(h.exists(&bucket(ttl)).await, "{ttl}");
    }
    assert!(!h.exists(&bucket("1500ms")).await);
    // 5.5 s: the 4s grid rung, then 1.5 s held (3s and 1500ms before the grid).
    let sent = send(&h, &q, &[5_500, 5_500, 5_500]).await;
    h.wait_depth(&bucket("4s"), 3).await;
    assert_eq!(h.depth(&bucket("3s")).await, 0);
    let late = lateness(&h, &q, &sent, Duration::from_secs(20)).await;
    for (i, l) in &late {
        // Expected a few ms; the margin is for shared CI machines.
        assert!(*l < Duration::from_millis(600), "message {i} late by {l:?}");
    }
    h.cleanup().await;
}

/// Several whole laps of a rung wait in one bucket cascade adds (a multiple
/// of the rung): the router places the message once, the broker
/// dead-letters it once.
#[tokio::test]
async fn cascade_waits_several_laps_of_a_rung_in_one_bucket_placed_once() {
    several_laps_in_one_bucket("classic").await;
}

/// The same with quorum buckets.
#[tokio::test]
async fn quorum_buckets_hold_several_laps_of_a_rung() {
    several_laps_in_one_bucket("quorum").await;
}

async fn several_laps_in_one_bucket(queue_type: &str) {
    let port = free_port();
    let extra = format!(
        "[placement]\nstrategy = \"cascade\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n[topology]\nqueue_type = \"{queue_type}\"\n"
    );
    let mut h = Harness::tuned(&["1s", "4s"], &extra, one_queue).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let bucket = |label: &str| format!("{}.bucket.{label}", h.prefix);
    // 1s fits three times below 4s; the top rung up to five times.
    for label in ["2s", "3s", "8s", "12s", "16s", "20s"] {
        assert!(h.exists(&bucket(label)).await, "{}", bucket(label));
    }
    assert!(!h.exists(&bucket("24s")).await);
    // 3.5 s: three laps of 1s in 3s, then 500 ms the router times.
    // 9.3 s: two laps of 4s in 8s, then 1.3 s the router times.
    let delays = [3_500, 9_300];
    let sent = send(&h, &q, &delays).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(h.depth(&bucket("3s")).await, 1, "3.5 s waits in 3s");
    assert_eq!(h.depth(&bucket("8s")).await, 1, "9.3 s waits in 8s");
    let got = h.receive(&q, 2, Duration::from_secs(30)).await;
    for (at, d) in &got {
        let i = id(d);
        let (t0, delay) = sent[&i];
        let waited = *at - t0;
        let delay = Duration::from_millis(delay);
        assert!(waited >= delay, "message {i} early: {waited:?} < {delay:?}");
        // Expected a few ms; the margin is for shared CI machines.
        assert!(
            waited - delay < Duration::from_millis(900),
            "message {i} late by {:?}",
            waited - delay
        );
        assert_eq!(header(d, "x-death"), None, "the bucket's x-death leaked");
        assert_eq!(header(d, "x-first-death-queue"), None);
    }
    // One placement each; on the user's rungs alone three (1s, 1s, 1s) and two (4s, 4s).
    let s = scrape(port).await;
    assert_eq!(
        sample(&s, "delay_router_messages_placed_total", &[]),
        Some(2.0)
    );
    h.cleanup().await;
}

#[tokio::test]
async fn priority_is_never_early_and_late_by_at_most_its_bucket() {
    let mut h = Harness::new(&["1s", "2s", "5s"], "[placement]\nstrategy = \"priority\"").await;
    h.start_router().await;
    assert!(h.exists(&format!("{}.pbucket.5s", h.prefix)).await);
    let q = h.queue("dest").await;
    // Longest first, the order the FACTS measurement shows to hurt; and one beyond the top.
    let delays = [4_800, 4_000, 2_500, 1_200, 600, 7_000];
    let sent = send(&h, &q, &delays).await;
    let late = lateness(&h, &q, &sent, Duration::from_secs(30)).await;
    for (i, l) in &late {
        assert!(
            *l <= Duration::from_secs(5) + Duration::from_secs(3),
            "message {i} late by {l:?}"
        );
    }
    h.cleanup().await;
}

#[tokio::test]
async fn switching_strategy_while_messages_wait_loses_none_and_removes_old_buckets() {
    let mut h = Harness::tuned(&["1s", "2s", "5s"], ROUND_UP, one_queue).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let delays: Vec<u64> = (0..30).map(|i| 3_000 + i * 50).collect();
    let sent = send(&h, &q, &delays).await;
    let old_bucket = format!("{}.bucket.5s", h.prefix);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        h.depth(&old_bucket).await,
        30,
        "all wait in the round-up 5s bucket"
    );
    h.restart_tuned(
        &["1s", "2s", "5s"],
        "[placement]\nstrategy = \"priority\"",
        one_queue,
    )
    .await;
    lateness(&h, &q, &sent, Duration::from_secs(30)).await;
    // Emptied buckets of the old strategy are removed (classic) or left
    // for the operator (quorum).
    let one = format!("{}.bucket.1s", h.prefix);
    h.wait_retired(&[&old_bucket, &one], Duration::from_secs(30))
        .await;
    assert!(
        h.exists(&format!("{}.pbucket.5s", h.prefix)).await,
        "current buckets stay"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn removing_a_rung_while_messages_wait_loses_none() {
    let mut h = Harness::tuned(&["1s", "2s", "5s"], CASCADE, one_queue).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    // Ten in the 5s bucket, ten in 15s (three laps of 5s, which the new
    // ladder's top rung 2s does not have either). Each at least the
    // coalescing tick (100 ms) over its rung: with less left to hold,
    // cascade would begin the hold a rung lower (4s).
    let delays: Vec<u64> = (0..20)
        .map(|i| if i < 10 { 5_100 } else { 15_000 } + i * 50)
        .collect();
    let sent = send(&h, &q, &delays).await;
    let removed = format!("{}.bucket.5s", h.prefix);
    let multiple = format!("{}.bucket.15s", h.prefix);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.depth(&removed).await, 10);
    assert_eq!(h.depth(&multiple).await, 10);
    h.restart_tuned(&["1s", "2s"], CASCADE, one_queue).await;
    let late = lateness(&h, &q, &sent, Duration::from_secs(40)).await;
    assert_eq!(late.len(), 20);
    h.wait_retired(&[&removed, &multiple], Duration::from_secs(30))
        .await;
    assert!(h.exists(&format!("{}.bucket.2s", h.prefix)).await);
    h.cleanup().await;
}

/// An upgrade from the version that kept a rung's multiples as a chain
/// (`<bucket>.x2` dead-lettering into `<bucket>` through the default
/// exchange): what waits in such a chain arrives on time, and the janitor
/// removes the chain once it is empty.
#[tokio::test]
async fn what_waits_in_an_earlier_versions_chain_arrives_and_the_chain_is_removed() {
    // Classic queues, the earlier version's.
    let mut h = Harness::new(
        &["1s", "2s"],
        "[topology]\nqueue_type = \"classic\"\n[placement]\nstrategy = \"cascade\"",
    )
    .await;
    let rules = Rules::from_config(&h.config);
    delay_router::broker::declare::declare(&h.conn, &rules.topology())
        .await
        .unwrap();
    let q = h.queue("dest").await;
    let bucket = format!("{}.bucket.2s", h.prefix);
    let chain = format!("{bucket}.x2");
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(2000));
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(bucket.as_str().into()),
    );
    h.ch.queue_declare(
        chain.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .unwrap();
    h.track_queue(&chain);
    // 4.5 s as the previous version placed it: two laps of 2s in the chain.
    let sender = to_queue(&q, AMQPValue::LongLongInt(4_500)).with_message_id("0".into());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let t0 = Instant::now();
    let Action::Wait { properties, .. } =
        decide::ingress(&rules, &"k".into(), &sender, now_ms, 0.0)
    else {
        panic!("4.5 s waits in a bucket")
    };
    let publish = |queue: String, props, body: Vec<u8>| {
        let ch = h.ch.clone();
        async move {
            ch.basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
    };
    publish(chain.clone(), properties, b"x".to_vec()).await;
    // The state the previous version recorded names its chain.
    publish(
        h.names.state.to_string(),
        lapin::BasicProperties::default().with_delivery_mode(2),
        chain.clone().into_bytes(),
    )
    .await;
    h.start_router().await;
    // The deadline is in whole milliseconds of the wall clock: 4,499 ms
    // after t0 at the earliest.
    let sent = BTreeMap::from([(0, (t0, 4_499))]);
    let late = lateness(&h, &q, &sent, Duration::from_secs(30)).await;
    assert!(
        late[&0] < Duration::from_millis(900),
        "late by {:?}",
        late[&0]
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.exists(&chain).await {
        assert!(Instant::now() < deadline, "the old chain was not removed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(h.exists(&bucket).await, "the rung's bucket stays");
    h.cleanup().await;
}
