//! Placement strategies end to end: cascade's precision, priority's bounds,
//! delays beyond the top rung, and switching strategy or ladder while
//! messages wait (none lost, none early, stale buckets removed).

mod common;
use common::*;
use lapin::types::AMQPValue;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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
    let mut h = Harness::new(&["1s", "2s", "5s"], "[placement]\nstrategy = \"round-up\"").await;
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
    h.restart_with(&["1s", "2s", "5s"], "[placement]\nstrategy = \"priority\"")
        .await;
    lateness(&h, &q, &sent, Duration::from_secs(30)).await;
    // Emptied buckets of the old strategy are removed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.exists(&old_bucket).await || h.exists(&format!("{}.bucket.1s", h.prefix)).await {
        assert!(Instant::now() < deadline, "old buckets were not removed");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        h.exists(&format!("{}.pbucket.5s", h.prefix)).await,
        "current buckets stay"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn removing_a_rung_while_messages_wait_loses_none() {
    let mut h = Harness::new(&["1s", "2s", "5s"], "[placement]\nstrategy = \"cascade\"").await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let delays: Vec<u64> = (0..20).map(|i| 5_000 + i * 100).collect();
    let sent = send(&h, &q, &delays).await;
    let removed = format!("{}.bucket.5s", h.prefix);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.depth(&removed).await, 20);
    h.restart_with(&["1s", "2s"], "[placement]\nstrategy = \"cascade\"")
        .await;
    let late = lateness(&h, &q, &sent, Duration::from_secs(30)).await;
    assert_eq!(late.len(), 20);
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.exists(&removed).await {
        assert!(
            Instant::now() < deadline,
            "removed rung's bucket still exists"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(h.exists(&format!("{}.bucket.2s", h.prefix)).await);
    h.cleanup().await;
}
