//! Zero-code retries: a work queue dead-letters to the router exchange and its
//! consumer only rejects. The router sends each failure back to exactly that
//! queue after the policy's delay, counts attempts, and parks the last failure.

mod common;
use common::*;
use lapin::BasicProperties;
use lapin::options::*;

use std::time::{Duration, Instant};

const POLICY: &str = "[placement]\nstrategy = \"cascade\"\n[[policy]]\nqueue = \"*.work\"\ninitial = \"1s\"\nmultiplier = 2.0\nmax_delay = \"10s\"\njitter = 0.0\nmax_attempts = 4\n";

/// A work queue bound to `exchange` with `key`, dead-lettering to the router.
async fn work_queue(h: &mut Harness, exchange: &str, key: &str) -> String {
    let name = h.work_queue().await;
    h.bind(&name, exchange, key).await;
    name
}

#[tokio::test]
async fn a_consumer_that_only_nacks_gets_policy_delays_then_success() {
    let mut h = Harness::new(&["1s", "2s", "5s"], POLICY).await;
    h.start_router().await;
    let ex = h.exchange("orders").await;
    let work = work_queue(&mut h, &ex, "eu").await;
    let observer = h.queue("observer").await;
    h.bind(&observer, &ex, "eu").await;

    let mut consumer = Consumer::open(&h.conn, &work, Acks::Manual(10)).await;
    h.ch.basic_publish(
        ex.as_str().into(),
        "eu".into(),
        BasicPublishOptions::default(),
        b"order-1",
        BasicProperties::default().with_message_id("o1".into()),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    // Fail twice, then succeed.
    let mut seen = Vec::new();
    for attempt in 1..=3 {
        let d = consumer.next(Duration::from_secs(20)).await;
        seen.push((
            Instant::now(),
            header_int(&d.properties, "x-delay-router-attempts"),
            d.data.clone(),
        ));
        if attempt < 3 {
            d.acker
                .nack(BasicNackOptions {
                    requeue: false,
                    ..Default::default()
                })
                .await
                .unwrap();
        } else {
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        }
    }
    assert_eq!(
        seen.iter().map(|s| s.1).collect::<Vec<_>>(),
        [None, Some(1), Some(2)]
    );
    assert!(seen.iter().all(|s| s.2 == b"order-1"));
    let first_gap = seen[1].0 - seen[0].0;
    let second_gap = seen[2].0 - seen[1].0;
    assert!(
        first_gap >= Duration::from_secs(1),
        "first retry early: {first_gap:?}"
    );
    assert!(
        second_gap >= Duration::from_secs(2),
        "second retry early: {second_gap:?}"
    );
    assert!(
        first_gap < Duration::from_millis(1800) && second_gap < Duration::from_millis(2800),
        "{first_gap:?} {second_gap:?}"
    );
    // Retries go back to the work queue only: the observer saw the original once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        h.depth(&observer).await,
        1,
        "no extra copies to other queues on the same binding"
    );
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    consumer.close().await;
    h.cleanup().await;
}

#[tokio::test]
async fn the_last_allowed_failure_is_parked_with_attempts_and_source() {
    let mut h = Harness::new(&["1s", "2s", "5s"], POLICY).await;
    h.start_router().await;
    let ex = h.exchange("jobs").await;
    let work = work_queue(&mut h, &ex, "run").await;
    let mut consumer = Consumer::open(&h.conn, &work, Acks::Manual(10)).await;
    let t0 = Instant::now();
    h.ch.basic_publish(
        ex.as_str().into(),
        "run".into(),
        BasicPublishOptions::default(),
        b"job",
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    for _ in 0..4 {
        let d = consumer.next(Duration::from_secs(20)).await;
        d.acker
            .reject(BasicRejectOptions { requeue: false })
            .await
            .unwrap();
    }
    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    let d = &parked[0].1;
    // 1 s + 2 s + 4 s of backoff before the fourth delivery.
    assert!(t0.elapsed() >= Duration::from_secs(7));
    let reason = header_str(d, "x-park-reason").unwrap();
    assert!(reason.starts_with("gave up after 4 attempts"), "{reason}");
    assert_eq!(
        header_int(&d.properties, "x-delay-router-attempts"),
        Some(4)
    );
    assert_eq!(
        header_str(d, "x-delay-router-source-queue").as_deref(),
        Some(work.as_str())
    );
    let (first, last) = (
        header_int(&d.properties, "x-delay-router-first-failure").unwrap(),
        header_int(&d.properties, "x-delay-router-last-failure").unwrap(),
    );
    assert!(last - first >= 7_000, "first {first} last {last}");
    assert_eq!(d.data, b"job");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        h.depth(&work).await,
        0,
        "a parked message is not retried again"
    );
    consumer.close().await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_rejection_no_policy_matches_is_parked_with_that_reason() {
    let mut h = Harness::new(&["1s"], "").await;
    h.start_router().await;
    let ex = h.exchange("misc").await;
    let work = work_queue(&mut h, &ex, "k").await;
    let ch = h.conn.create_channel().await.unwrap();
    h.ch.basic_publish(
        ex.as_str().into(),
        "k".into(),
        BasicPublishOptions::default(),
        b"m",
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let got = ch
        .basic_get(work.as_str().into(), BasicGetOptions::default())
        .await
        .unwrap();
    let d = got.expect("one message").delivery;
    d.acker
        .nack(BasicNackOptions {
            requeue: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    let reason = header_str(&parked[0].1, "x-park-reason").unwrap();
    assert!(reason.contains("which no [[policy]] matches"), "{reason}");
    h.cleanup().await;
}
