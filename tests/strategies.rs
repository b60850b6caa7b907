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

/// Several whole laps of a rung wait in that rung's chain: the broker moves
/// the message from lap to lap, the router places it once.
#[tokio::test]
async fn cascade_waits_several_laps_of_a_rung_in_its_chain_placed_once() {
    several_laps_in_a_chain("classic").await;
}

/// The same with quorum buckets, which dead-letter from lap to lap at least once.
#[tokio::test]
async fn quorum_chains_move_a_message_from_lap_to_lap() {
    several_laps_in_a_chain("quorum").await;
}

async fn several_laps_in_a_chain(queue_type: &str) {
    let port = free_port();
    let extra = format!(
        "[placement]\nstrategy = \"cascade\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n[topology]\nqueue_type = \"{queue_type}\"\n"
    );
    let mut h = Harness::new(&["1s", "4s"], &extra).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let chain = |rung: &str, laps: u32| format!("{}.bucket.{rung}.x{laps}", h.prefix);
    // 1s fits three times below 4s; the top rung chains up to five laps.
    for (rung, laps) in [("1s", 2), ("1s", 3), ("4s", 2), ("4s", 5)] {
        assert!(h.exists(&chain(rung, laps)).await, "{}", chain(rung, laps));
    }
    assert!(!h.exists(&chain("1s", 4)).await);
    // 3.5 s: three laps of 1s (one placement), then 500 ms the router times.
    // 9.3 s: two laps of 4s (one placement), then 1.3 s the router times.
    let delays = [3_500, 9_300];
    let sent = send(&h, &q, &delays).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        h.depth(&chain("1s", 3)).await,
        1,
        "3.5 s waits in the 1s chain"
    );
    assert_eq!(
        h.depth(&chain("4s", 2)).await,
        1,
        "9.3 s waits in the 4s chain"
    );
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
        assert_eq!(header(d, "x-death"), None, "the chain's x-death leaked");
        assert_eq!(header(d, "x-first-death-queue"), None);
    }
    // One placement each; without chains three (1s, 1s, 1s) and two (4s, 4s).
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
    // Ten in the 5s bucket, ten two laps up its chain: the chain's lap must
    // outlive nothing it dead-letters into.
    let delays: Vec<u64> = (0..20)
        .map(|i| if i < 10 { 5_000 } else { 10_000 } + i * 50)
        .collect();
    let sent = send(&h, &q, &delays).await;
    let removed = format!("{}.bucket.5s", h.prefix);
    let chain = format!("{}.bucket.5s.x2", h.prefix);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.depth(&removed).await, 10);
    assert_eq!(h.depth(&chain).await, 10);
    h.restart_with(&["1s", "2s"], "[placement]\nstrategy = \"cascade\"")
        .await;
    let late = lateness(&h, &q, &sent, Duration::from_secs(40)).await;
    assert_eq!(late.len(), 20);
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.exists(&removed).await || h.exists(&chain).await {
        assert!(
            Instant::now() < deadline,
            "removed rung's bucket still exists"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(h.exists(&format!("{}.bucket.2s", h.prefix)).await);
    h.cleanup().await;
}
