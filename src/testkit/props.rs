//! Property and header fixtures, and what RabbitMQ does to a message.

use crate::core::contract::{Destination, integer};
use crate::core::envelope::{self, Transit, headers_of};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

/// A long-string header value.
pub fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// A header table from pairs.
pub fn headers(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut h = FieldTable::default();
    for (k, v) in pairs {
        h.insert((*k).into(), v.clone());
    }
    h
}

/// Properties with these headers and nothing else.
pub fn props(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
    BasicProperties::default().with_headers(headers(pairs))
}

/// `p` with these headers added (or replaced).
pub fn with_headers(p: BasicProperties, pairs: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut h = p.headers().clone().unwrap_or_default();
    for (k, v) in pairs {
        h.insert((*k).into(), v.clone());
    }
    p.with_headers(h)
}

/// Every basic property a sender can set (the broker refuses a non-empty
/// cluster-id, so not that one), non-persistent and with an expiration the
/// router must set aside and restore, a `user-id` of `guest`, and headers
/// of every common AMQP type, the sender's own `x-death` among them. Add the
/// contract headers with [`with_headers`].
pub fn every_property() -> BasicProperties {
    let nested = headers(&[("k", AMQPValue::Boolean(true))]);
    let h = headers(&[
        ("tenant", s("acme")),
        ("n", AMQPValue::LongLongInt(-42)),
        ("f", AMQPValue::Double(2.5)),
        ("t", AMQPValue::FieldTable(nested)),
        (
            "a",
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongInt(1), s("two")])),
        ),
        (
            "x-death",
            AMQPValue::FieldArray(FieldArray::from(vec![s("sender's own")])),
        ),
        ("x-first-death-queue", s("work")),
    ]);
    BasicProperties::default()
        .with_content_type("application/octet-stream".into())
        .with_content_encoding("identity".into())
        .with_headers(h)
        .with_delivery_mode(1)
        .with_priority(7)
        .with_correlation_id("corr-1".into())
        .with_reply_to("replies".into())
        .with_expiration("600000".into())
        .with_message_id("msg-1".into())
        .with_timestamp(1_700_000_000)
        .with_type("order.created".into())
        .with_user_id("guest".into())
        .with_app_id("shop".into())
}

/// What a sender publishes in the unit tests: [`every_property`] and a
/// 5 s `x-requested-delay`.
pub fn sent() -> BasicProperties {
    with_headers(every_property(), &[("x-requested-delay", s("5s"))])
}

/// A message in transit to exchange `orders`, routing key `eu`, due at
/// 1000 ms, after its first hop.
pub fn transit() -> Transit {
    Transit {
        destination: Destination {
            exchange: "orders".into(),
            routing_key: "eu".into(),
        },
        deadline_ms: 1_000,
        hops: 1,
    }
}

/// `p` without these header keys (headers stay absent when absent).
pub fn without(p: &BasicProperties, keys: &[&str]) -> BasicProperties {
    let headers = p.headers().as_ref().map(|_| {
        let mut h = headers_of(p);
        h.retain(|k, _| !keys.contains(&k.as_str()));
        h
    });
    envelope::rebuild(
        p,
        headers,
        p.expiration().clone(),
        *p.delivery_mode(),
        *p.priority(),
    )
}

/// The properties as AMQP encodes them in a content header.
pub fn wire(p: &BasicProperties) -> Option<Vec<u8>> {
    crate::core::wire::encode_properties(p)
}

/// Equal on the wire: `PartialEq` would call two NaN header values different.
pub fn same(a: &BasicProperties, b: &BasicProperties) -> bool {
    match (wire(a), wire(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// An integer header of any AMQP integer type.
pub fn header_int(p: &BasicProperties, key: &str) -> Option<i64> {
    integer(p.headers().as_ref()?, key)
}

/// What RabbitMQ does to a message it dead-letters from `queue` for `reason`:
/// a new `x-death` entry at the front (or the matching one counted up and
/// moved there), `x-first-death-*` set once, `x-last-death-*` always; the
/// per-message `expiration` removed.
pub fn dead_letter(p: &BasicProperties, queue: &str, reason: &str, now_ms: i64) -> BasicProperties {
    let mut h = headers_of(p);
    let old: Vec<AMQPValue> = match h.get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let same = |v: &AMQPValue| match v {
        AMQPValue::FieldTable(t) => {
            t.inner().get("queue") == Some(&s(queue)) && t.inner().get("reason") == Some(&s(reason))
        }
        _ => false,
    };
    let count = old
        .iter()
        .find(|v| same(v))
        .and_then(|v| match v {
            AMQPValue::FieldTable(t) => integer(t, "count"),
            _ => None,
        })
        .unwrap_or(0)
        .saturating_add(1);
    let entry = headers(&[
        ("count", AMQPValue::LongLongInt(count)),
        ("reason", s(reason)),
        ("queue", s(queue)),
        ("exchange", s("")),
        (
            "routing-keys",
            AMQPValue::FieldArray(FieldArray::from(vec![s(queue)])),
        ),
        (
            "time",
            AMQPValue::Timestamp(u64::try_from(now_ms / 1000).unwrap_or(0)),
        ),
    ]);
    let mut deaths = vec![AMQPValue::FieldTable(entry)];
    deaths.extend(old.into_iter().filter(|v| !same(v)));
    h.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(deaths)),
    );
    for (k, v) in [
        ("queue", s(queue)),
        ("reason", s(reason)),
        ("exchange", s("")),
    ] {
        h.entry(ShortString::from(format!("x-first-death-{k}")))
            .or_insert_with(|| v.clone());
        h.insert(format!("x-last-death-{k}").into(), v);
    }
    envelope::rebuild(p, Some(h), None, *p.delivery_mode(), *p.priority())
}

/// A message a work queue's consumer rejected: one `rejected` x-death entry
/// for `queue`, plus these headers.
pub fn rejected_by(queue: &str, extra: &[(&str, AMQPValue)]) -> BasicProperties {
    dead_letter(&props(extra), queue, "rejected", 0)
}
