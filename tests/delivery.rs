//! Round-up delivery end to end: timing, header forms, exact properties.

mod common;
use common::*;
use delay_router::core::identity;
use delay_router::testkit::props::{every_property, with_headers};
use lapin::types::AMQPValue;
use std::time::{Duration, Instant};

const MARGIN: Duration = Duration::from_secs(3);
const ROUND_UP: &str = "[placement]\nstrategy = \"round-up\"";

#[tokio::test]
async fn round_up_delivers_after_the_delay_never_early() {
    let mut h = Harness::new(&["1s", "2s", "5s"], ROUND_UP).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let cases = [(1500u64, 2u64), (400, 1), (4_200, 5)];
    let mut sent = Vec::new();
    for (i, (delay_ms, _)) in cases.iter().enumerate() {
        let props = to_queue(&q, AMQPValue::LongLongInt(*delay_ms as i64))
            .with_message_id(i.to_string().into());
        sent.push(Instant::now());
        h.publish("ignored", props, b"x").await;
    }
    let got = h.receive(&q, cases.len(), Duration::from_secs(20)).await;
    for (at, d) in got {
        let i = id(&d);
        let (delay_ms, bucket_s) = cases[i];
        let waited = at - sent[i];
        assert!(
            waited >= Duration::from_millis(delay_ms),
            "message {i} early: {waited:?} < {delay_ms}ms"
        );
        assert!(
            waited <= Duration::from_secs(bucket_s) + MARGIN,
            "message {i} waited {waited:?}, bucket is {bucket_s}s"
        );
    }
    assert_eq!(h.depth(&h.names.parked.to_string()).await, 0);
    h.cleanup().await;
}

#[tokio::test]
async fn every_header_form_is_accepted() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let q = h.queue("dest").await;
    let forms = [
        AMQPValue::ShortShortInt(5),
        AMQPValue::ShortShortUInt(5),
        AMQPValue::ShortInt(300),
        AMQPValue::ShortUInt(300),
        AMQPValue::LongInt(800),
        AMQPValue::LongUInt(800),
        AMQPValue::LongLongInt(900),
        s("900"),
        s("1s"),
        s("0.5s"),
        s("1s 500ms"),
        s(" 750ms "),
    ];
    for (i, f) in forms.iter().enumerate() {
        h.publish(
            "k",
            to_queue(&q, f.clone()).with_message_id(i.to_string().into()),
            b"",
        )
        .await;
    }
    let got = h.receive(&q, forms.len(), Duration::from_secs(15)).await;
    let mut ids: Vec<usize> = got.iter().map(|(_, d)| id(d)).collect();
    ids.sort();
    assert_eq!(ids, (0..forms.len()).collect::<Vec<_>>());
    assert_eq!(
        h.depth(h.names.parked.as_str()).await,
        0,
        "no form may be parked"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_delay_longer_than_the_top_rung_goes_round_and_is_never_early() {
    let mut h = Harness::new(&["1s", "2s"], ROUND_UP).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let t0 = Instant::now();
    h.publish("k", to_queue(&q, s("4500ms")), b"long").await;
    let got = h.receive(&q, 1, Duration::from_secs(20)).await;
    let waited = got[0].0 - t0;
    assert!(waited >= Duration::from_millis(4500), "early: {waited:?}");
    // 2s + 2s + 1s = 5s of buckets.
    assert!(
        waited <= Duration::from_secs(5) + MARGIN,
        "late: {waited:?}"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn body_and_every_property_arrive_unchanged() {
    let mut h = Harness::start(&["1s"]).await;
    let ex = h.exchange("orders").await;
    let q = h.queue("orders-eu").await;
    h.bind(&q, &ex, "orders.eu").await;
    let props = with_headers(
        every_property(),
        &[
            ("x-requested-delay", AMQPValue::LongInt(200)),
            ("x-original-exchange", s(&ex)),
            ("x-original-routing-key", s("orders.eu")),
        ],
    );
    let body: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    h.publish("ignored", props.clone(), &body).await;
    let got = h.receive(&q, 1, Duration::from_secs(10)).await;
    let d = &got[0].1;
    assert_eq!(d.data, body);
    assert_eq!(
        d.properties, props,
        "every property and header as the sender set it"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn zero_delay_delivers_at_once_unchanged() {
    let mut h = Harness::start(&["1s"]).await;
    let q = h.queue("dest").await;
    let props = to_queue(&q, AMQPValue::LongInt(0));
    h.publish("k", props.clone(), b"now").await;
    let got = h.receive(&q, 1, Duration::from_secs(5)).await;
    // Without a message-id of its own, a message gets one derived from its
    // content (the same on every copy), and nothing else changes.
    let id = identity::derive(&props, h.names.router_exchange.as_str(), "k", b"now");
    assert!(id.starts_with("dr-"));
    assert_eq!(
        got[0].1.properties,
        props.with_message_id(id.as_str().into()),
        "zero delay delivers at once, unchanged but for the derived id"
    );
    h.cleanup().await;
}
