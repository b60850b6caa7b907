//! Bad input at the broker: header tables at the frame limit, empty and
//! 16 MiB bodies. Each is delivered exactly or parked with a reason, and none
//! stops the router or makes it loop.

mod common;
use common::*;
use delay_router::core::wire;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::time::Duration;

/// Long enough to need a bucket: the router times up to 2 s itself.
const DELAY_MS: i32 = 2_500;

fn padded(q: &str, pad: usize, id: usize) -> BasicProperties {
    let p = to_queue(q, AMQPValue::LongInt(DELAY_MS)).with_message_id(id.to_string().into());
    let mut h = p.headers().clone().unwrap();
    h.insert("pad".into(), s(&"p".repeat(pad)));
    p.with_headers(h)
}

#[tokio::test]
async fn header_tables_at_the_frame_limit_are_delivered_or_parked_not_looped() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let q = h.queue("dest").await;
    // The largest header the sender can publish: its own frame is full, so
    // the router's transit headers cannot be added.
    let largest =
        wire::DEFAULT_FRAME_MAX as usize - wire::header_frame_len(&padded(&q, 0, 1)).unwrap();
    let big = padded(&q, 100_000, 0);
    h.publish("k", big.clone(), b"big").await;
    h.publish("k", padded(&q, largest, 1), b"full").await;
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(DELAY_MS)).with_message_id("2".into()),
        b"plain",
    )
    .await;

    let got = h.receive(&q, 2, Duration::from_secs(15)).await;
    let mut ids: Vec<usize> = got.iter().map(|(_, d)| id(d)).collect();
    ids.sort();
    assert_eq!(ids, vec![0, 2]);
    let (_, d) = got.iter().find(|(_, d)| id(d) == 0).unwrap();
    assert_eq!(d.properties, big, "a 100 KB header table arrives exactly");
    assert_eq!(d.data, b"big");

    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    let (_, p) = &parked[0];
    assert_eq!(id(p), 1);
    assert_eq!(p.data, b"full", "the body is kept");
    let reason = header_str(p, "x-park-reason").unwrap();
    assert!(reason.starts_with("header table too large"), "{reason}");
    assert!(
        reason.contains("removed these sender headers: 'pad'"),
        "{reason}"
    );
    assert_eq!(
        header_str(p, "x-original-routing-key").as_deref(),
        Some(q.as_str())
    );
    // Parked once: no reconnect loop redelivers it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    assert_eq!(h.depth(h.names.ingress.as_str()).await, 0);
    assert_eq!(h.depth(&q).await, 0);
    h.cleanup().await;
}

#[tokio::test]
async fn empty_and_16_mib_bodies_arrive_exactly() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let q = h.queue("dest").await;
    let huge: Vec<u8> = (0..16 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(1500)).with_message_id("0".into()),
        b"",
    )
    .await;
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(1500)).with_message_id("1".into()),
        &huge,
    )
    .await;
    let got = h.receive(&q, 2, Duration::from_secs(30)).await;
    for (_, d) in &got {
        match id(d) {
            0 => assert!(d.data.is_empty()),
            1 => assert!(
                d.data == huge,
                "16 MiB body differs ({} bytes)",
                d.data.len()
            ),
            other => panic!("unexpected message {other}"),
        }
    }
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    h.cleanup().await;
}
