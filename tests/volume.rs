//! Volume: many messages through the router, none lost, none duplicated.

mod common;
use common::*;
use lapin::types::AMQPValue;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_thousand_messages_arrive_exactly_once_and_never_early() {
    const N: usize = 1000;
    let mut h = Harness::start(&["1s", "2s"]).await;
    let q = h.queue("dest").await;
    let t0 = Instant::now();
    let mut sent = Vec::with_capacity(N);
    for i in 0..N {
        let delay_ms = (i as i64 * 7919) % 2500;
        let props =
            to_queue(&q, AMQPValue::LongLongInt(delay_ms)).with_message_id(i.to_string().into());
        // Before the publish: the router, on this same runtime, may stamp the
        // deadline before this task resumes after the publish.
        let at = Instant::now();
        let c =
            h.ch.basic_publish(
                h.names.router_exchange.clone(),
                "k".into(),
                Default::default(),
                &i.to_le_bytes(),
                props,
            )
            .await
            .unwrap();
        sent.push((at, delay_ms, c));
    }
    let mut publish_times = Vec::with_capacity(N);
    for (at, delay_ms, c) in sent {
        assert!(c.await.unwrap().is_ack());
        publish_times.push((at, delay_ms));
    }
    let got = h.receive(&q, N, Duration::from_secs(60)).await;
    let mut seen = BTreeSet::new();
    for (arrived, d) in &got {
        let i: usize = id(d);
        assert!(seen.insert(i), "message {i} delivered twice");
        assert_eq!(d.data, i.to_le_bytes());
        let (at, delay_ms) = publish_times[i];
        assert!(
            *arrived - at >= Duration::from_millis(delay_ms as u64),
            "message {i} early: waited {:?} for {delay_ms}ms",
            *arrived - at
        );
    }
    assert_eq!(seen.len(), N);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.depth(&q).await, 0, "no duplicates after the last one");
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    eprintln!("{N} messages in {:?}", t0.elapsed());
    h.cleanup().await;
}

#[tokio::test]
async fn large_messages_shrink_the_window_and_all_arrive() {
    let mut h = Harness::new(&["1s"], "").await;
    // Built in at 64 MiB; 1 MiB makes three-MiB messages exceed it.
    h.config.inflight_bytes = 1 << 20;
    h.start_router().await;
    let q = h.queue("dest").await;
    let body: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
    for i in 0..12 {
        let props = to_queue(&q, AMQPValue::LongInt(100)).with_message_id(i.to_string().into());
        h.publish("k", props, &body).await;
    }
    let got = h.receive(&q, 12, Duration::from_secs(60)).await;
    let ids: BTreeSet<String> = got
        .iter()
        .map(|(_, d)| d.properties.message_id().as_ref().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 12);
    assert!(got.iter().all(|(_, d)| d.data == body));
    // The broker's view: one consumer on the ingress queue, with a window of
    // one delivery (1 MiB budget, 3 MiB messages), not the configured 2000.
    let listed = rabbitmqctl(&[
        "list_consumers",
        "-q",
        "--no-table-headers",
        "queue_name",
        "consumer_tag",
        "prefetch_count",
    ]);
    let ingress: Vec<&str> = listed
        .lines()
        .filter(|l| l.split('\t').next() == Some(h.names.ingress.as_str()))
        .collect();
    assert_eq!(ingress.len(), 1, "ingress consumers: {ingress:?}");
    assert_eq!(ingress[0].split('\t').nth(2), Some("1"), "{ingress:?}");
    h.cleanup().await;
}
