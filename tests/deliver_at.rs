//! `x-deliver-at`: a point in time instead of a delay, as epoch
//! milliseconds (integer or digit string) or RFC 3339, never early.

mod common;

use common::*;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn rfc3339_with_offset(ms: i64) -> String {
    // +02:00: the same instant written two hours ahead.
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap()
        .to_offset(time::macros::offset!(+2));
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

fn at(queue: &str, id: &str, value: AMQPValue, extra: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut h = vec![
        ("x-deliver-at", value),
        ("x-original-exchange", s("")),
        ("x-original-routing-key", s(queue)),
    ];
    h.extend(extra.iter().cloned());
    BasicProperties::default()
        .with_headers(headers(&h))
        .with_message_id(id.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_at_arrives_not_before_its_time() {
    let mut h = Harness::start(&["1s", "2s", "4s"]).await;
    let q = h.queue("dest").await;
    let now = epoch_ms();
    let due: BTreeMap<&str, i64> = [
        ("int", now + 3_000),
        ("digits", now + 2_500),
        ("rfc3339", now + 3_500),
        ("past", now - 60_000),
        ("both", now + 1_500),
    ]
    .into();
    h.publish(
        "k",
        at(&q, "int", AMQPValue::LongLongInt(due["int"]), &[]),
        b"",
    )
    .await;
    let digits = AMQPValue::LongString(due["digits"].to_string().into());
    h.publish("k", at(&q, "digits", digits, &[]), b"").await;
    let rfc = AMQPValue::LongString(rfc3339_with_offset(due["rfc3339"]).into());
    h.publish("k", at(&q, "rfc3339", rfc, &[]), b"").await;
    h.publish(
        "k",
        at(&q, "past", AMQPValue::LongLongInt(due["past"]), &[]),
        b"",
    )
    .await;
    // Both headers: x-deliver-at wins over the 10 s delay.
    let both = [("x-requested-delay", s("10s"))];
    h.publish(
        "k",
        at(&q, "both", AMQPValue::LongLongInt(due["both"]), &both),
        b"",
    )
    .await;
    let garbage = at(&q, "garbage", s("next tuesday"), &[]);
    h.publish("k", garbage, b"").await;

    let mut c = Consumer::open(&h.conn, &q, Acks::Auto).await;
    let mut arrived = BTreeMap::new();
    while arrived.len() < due.len() {
        let d = c.next(Duration::from_secs(15)).await;
        let got = epoch_ms();
        let id = d.properties.message_id().as_ref().unwrap().to_string();
        assert!(arrived.insert(id.clone(), got).is_none(), "{id} twice");
    }
    assert!(c.next_within(Duration::from_secs(1)).await.is_none());
    c.close().await;
    for (id, due_ms) in &due {
        let late = arrived[*id] - due_ms.max(&now);
        println!("{id}: {late} ms after its time");
        assert!(late >= 0, "{id} arrived {} ms early", -late);
        // Generous: precision is measured by the benchmark.
        assert!(late < 1_500, "{id} arrived {late} ms late");
    }

    let parked = h
        .receive(&h.names.parked.to_string(), 1, Duration::from_secs(5))
        .await;
    let reason = header_str(&parked[0].1, "x-park-reason").unwrap();
    assert!(
        reason.starts_with("invalid delivery time: x-deliver-at \"next tuesday\""),
        "{reason}"
    );
    h.cleanup().await;
}
