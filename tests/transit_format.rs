//! The router's bookkeeping in bucket messages: written compact (one
//! `x-delay-router` header) by default, spelled out (four headers) on
//! request, and both read, so messages an earlier version placed are
//! delivered by this one.

mod common;
use common::*;
use delay_router::core::decision::Rules;
use delay_router::core::envelope::TransitFormat;
use lapin::BasicProperties;
use lapin::options::{BasicGetOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SPELLED_OUT: [&str; 4] = [
    "x-delay-router-exchange",
    "x-delay-router-routing-key",
    "x-delay-router-deadline",
    "x-delay-router-hops",
];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Takes the one message waiting in any of the prefix's buckets, returns
/// its headers and puts it back.
async fn peek_bucket(h: &Harness) -> FieldTable {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let ch = h.conn.create_channel().await.unwrap();
    loop {
        let buckets = Rules::from_config(&h.config).topology().bucket_names();
        for bucket in buckets {
            let got = ch
                .basic_get(bucket.clone(), BasicGetOptions::default())
                .await
                .unwrap();
            if let Some(m) = got {
                let headers = m.delivery.properties.headers().clone().unwrap_or_default();
                m.delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                ch.close(200, "peeked".into()).await.unwrap();
                return headers;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing reached a bucket"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A message with 8 s to wait through `5s` buckets: placed, peeked at, delivered.
async fn place_peek_deliver(format: TransitFormat) -> FieldTable {
    let mut h = Harness::tuned(&["5s"], "", |c| c.transit_format = format).await;
    h.start_router().await;
    let dest = h.queue("dest").await;
    let props = BasicProperties::default().with_headers(headers(&[
        ("x-requested-delay", s("8s")),
        ("x-original-exchange", s("")),
        ("x-original-routing-key", s(&dest)),
        ("app", s("kept")),
    ]));
    let sent = now_ms();
    h.publish("k", props, b"m").await;
    let waiting = peek_bucket(&h).await;
    let got = h.receive(&dest, 1, Duration::from_secs(30)).await;
    let d = &got[0].1;
    assert!(now_ms() - sent >= 8_000, "never early");
    assert_eq!(header_str(d, "app").as_deref(), Some("kept"));
    for k in SPELLED_OUT.iter().chain(&["x-delay-router"]) {
        assert!(header(d, k).is_none(), "{k} reached the destination");
    }
    h.cleanup().await;
    waiting
}

#[tokio::test]
async fn by_default_a_waiting_message_carries_one_compact_record() {
    let waiting = place_peek_deliver(TransitFormat::Compact).await;
    let Some(AMQPValue::LongString(record)) = waiting.inner().get("x-delay-router") else {
        panic!("no compact record: {waiting:?}");
    };
    let record = String::from_utf8(record.as_bytes().to_vec()).unwrap();
    let parts: Vec<&str> = record.splitn(3, ' ').collect();
    assert!(
        parts[0].parse::<i64>().unwrap() > now_ms() - 60_000,
        "{record}"
    );
    assert_eq!(parts[1], "1", "first hop: {record}");
    assert!(
        parts[2].starts_with("0: drt-"),
        "default exchange, the queue: {record}"
    );
    for k in SPELLED_OUT {
        assert!(!waiting.contains_key(k), "{k} beside the compact record");
    }
}

#[tokio::test]
async fn told_to_spell_it_out_the_router_writes_the_four_headers() {
    let waiting = place_peek_deliver(TransitFormat::SpelledOut).await;
    assert!(!waiting.contains_key("x-delay-router"), "{waiting:?}");
    for k in SPELLED_OUT {
        assert!(waiting.contains_key(k), "{k} missing: {waiting:?}");
    }
}

/// As an earlier version left them in a bucket: the four spelled-out
/// headers. One is due when the bucket expires it, one needs another hop.
#[tokio::test]
async fn messages_an_earlier_version_placed_are_delivered() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let dest = h.queue("dest").await;
    let bucket = h
        .names
        .bucket(h.config.strategy, h.config.ladder.smallest())
        .to_string();
    let start = now_ms();
    for (id, deadline) in [("now", start + 1_000), ("later", start + 4_000)] {
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.into())
            .with_headers(headers(&[
                ("x-requested-delay", s("1s")),
                ("x-original-exchange", s("")),
                ("x-original-routing-key", s(&dest)),
                ("app", s("kept")),
                ("x-delay-router-exchange", s("")),
                ("x-delay-router-routing-key", s(&dest)),
                ("x-delay-router-deadline", AMQPValue::LongLongInt(deadline)),
                ("x-delay-router-hops", AMQPValue::LongLongInt(1)),
            ]));
        let c =
            h.ch.basic_publish(
                "".into(),
                bucket.as_str().into(),
                Default::default(),
                id.as_bytes(),
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(c.is_ack());
    }
    let got = h.receive(&dest, 2, Duration::from_secs(30)).await;
    let arrived = now_ms();
    let mut ids: Vec<String> = got
        .iter()
        .map(|(_, d)| {
            assert_eq!(header_str(d, "app").as_deref(), Some("kept"));
            assert_eq!(header_str(d, "x-original-routing-key"), Some(dest.clone()));
            for k in SPELLED_OUT.iter().chain(&["x-delay-router"]) {
                assert!(header(d, k).is_none(), "{k} reached the destination");
            }
            assert!(header(d, "x-death").is_none(), "bucket deaths removed");
            assert_eq!(*d.properties.delivery_mode(), Some(2));
            d.properties.message_id().as_ref().unwrap().to_string()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["later", "now"]);
    assert!(arrived - start >= 4_000, "the later one was not early");
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0, "nothing parked");
    h.cleanup().await;
}

/// An earlier router serving the prefix during an upgrade parks a compact
/// message as not in transit; `parked replay` of this version delivers it
/// to its destination as the sender sent it.
#[tokio::test]
async fn a_compact_message_an_earlier_version_parked_is_replayed() {
    let mut h = Harness::new(&["1s"], "").await;
    let dest = h.queue("dest").await;
    let record = format!("{} 1 0: {dest}", now_ms());
    // What the earlier router put in the park: the bucket message, its
    // record unread, the park's headers added.
    let parked = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id("m-1".into())
        .with_headers(headers(&[
            ("app", s("kept")),
            ("x-delay-router", s(&record)),
            ("x-first-death-queue", s("elsewhere.bucket.1s")),
            (
                "x-park-reason",
                s("a message from a bucket without the router's transit headers"),
            ),
            ("x-parked-at", AMQPValue::LongLongInt(now_ms())),
        ]));
    // The topology (the park) exists once a router has run.
    h.start_router().await;
    h.stop_router().await.unwrap();
    let c =
        h.ch.basic_publish(
            "".into(),
            h.names.parked.clone(),
            Default::default(),
            b"body",
            parked,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(c.is_ack());
    let path = write_config(&h.prefix, &["1s"], "");
    let out = std::process::Command::new(router_bin())
        .args(["parked", "replay", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("replayed 1"), "{stdout}");
    let got = h.receive(&dest, 1, Duration::from_secs(10)).await;
    let d = &got[0].1;
    assert_eq!(d.data, b"body");
    assert_eq!(header_str(d, "app").as_deref(), Some("kept"));
    for k in [
        "x-delay-router",
        "x-park-reason",
        "x-parked-at",
        "x-first-death-queue",
    ] {
        assert!(header(d, k).is_none(), "{k} reached the destination");
    }
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}
