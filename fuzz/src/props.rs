//! Property helpers: copies with some fields changed (lapin's properties have
//! no setters that clear a field), and what the broker does to a message.

use delay_router::contract::{TRANSIT_HEADERS, integer};
use delay_router::retry::RETRY_HEADERS;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use std::collections::BTreeMap;

/// A copy of `p` with these headers and expiration; every other property equal.
pub fn rebuild(
    p: &BasicProperties,
    headers: Option<FieldTable>,
    expiration: Option<ShortString>,
) -> BasicProperties {
    let mut out = BasicProperties::default();
    macro_rules! copy {
        ($get:ident, $set:ident) => {
            if let Some(v) = p.$get().clone() {
                out = out.$set(v);
            }
        };
    }
    copy!(content_type, with_content_type);
    copy!(content_encoding, with_content_encoding);
    copy!(delivery_mode, with_delivery_mode);
    copy!(priority, with_priority);
    copy!(correlation_id, with_correlation_id);
    copy!(reply_to, with_reply_to);
    copy!(message_id, with_message_id);
    copy!(timestamp, with_timestamp);
    copy!(kind, with_type);
    copy!(user_id, with_user_id);
    copy!(app_id, with_app_id);
    copy!(cluster_id, with_cluster_id);
    if let Some(h) = headers {
        out = out.with_headers(h);
    }
    if let Some(e) = expiration {
        out = out.with_expiration(e);
    }
    out
}

/// The properties as AMQP encodes them in a content header.
pub fn wire(p: &BasicProperties) -> Option<Vec<u8>> {
    cookie_factory::gen_simple(lapin::protocol::basic::gen_properties(p), Vec::new()).ok()
}

/// Equal on the wire: `PartialEq` would call two NaN header values different.
pub fn same(a: &BasicProperties, b: &BasicProperties) -> bool {
    match (wire(a), wire(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// `p` with these header keys removed (headers stay absent when absent).
pub fn without(p: &BasicProperties, keys: &[&str]) -> BasicProperties {
    let headers = p.headers().as_ref().map(|h| {
        let kept: BTreeMap<ShortString, AMQPValue> = h
            .inner()
            .iter()
            .filter(|(k, _)| !keys.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        FieldTable::from(kept)
    });
    rebuild(p, headers, p.expiration().clone())
}

/// Whether a sender kept to the contract: none of the router's transit
/// headers (`x-delay-router-*` bookkeeping other than the retry counters,
/// which legitimately come back on redelivered messages).
pub fn honours_contract(p: &BasicProperties) -> bool {
    p.headers()
        .as_ref()
        .is_none_or(|h| TRANSIT_HEADERS.iter().all(|k| !h.contains_key(k)))
}

/// What the sender sees of a message: everything but the retry counters,
/// which the router adds or updates on purpose.
pub fn sender_view(p: &BasicProperties) -> BasicProperties {
    without(p, &RETRY_HEADERS)
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// What RabbitMQ does to a message it dead-letters from `queue` for `reason`:
/// a new `x-death` entry at the front (or the matching one counted up and moved
/// there), `x-first-death-*` set once, `x-last-death-*` always; the per-message
/// `expiration` removed.
pub fn dead_letter(p: &BasicProperties, queue: &str, reason: &str, now_ms: i64) -> BasicProperties {
    let mut h = p
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default();
    let old: Vec<AMQPValue> = match h.get("x-death") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().to_vec(),
        _ => Vec::new(),
    };
    let same = |v: &AMQPValue| match v {
        AMQPValue::FieldTable(t) => {
            t.inner().get("queue") == Some(&text(queue))
                && t.inner().get("reason") == Some(&text(reason))
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
    let mut entry = FieldTable::default();
    entry.insert("count".into(), AMQPValue::LongLongInt(count));
    entry.insert("reason".into(), text(reason));
    entry.insert("queue".into(), text(queue));
    entry.insert("exchange".into(), text(""));
    entry.insert(
        "routing-keys".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![text(queue)])),
    );
    entry.insert(
        "time".into(),
        AMQPValue::Timestamp(u64::try_from(now_ms / 1000).unwrap_or(0)),
    );
    let mut deaths = vec![AMQPValue::FieldTable(entry)];
    deaths.extend(old.into_iter().filter(|v| !same(v)));
    h.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(deaths)),
    );
    for (k, v) in [
        ("queue", text(queue)),
        ("reason", text(reason)),
        ("exchange", text("")),
    ] {
        h.entry(format!("x-first-death-{k}").into())
            .or_insert_with(|| v.clone());
        h.insert(format!("x-last-death-{k}").into(), v);
    }
    rebuild(p, Some(FieldTable::from(h)), None)
}
