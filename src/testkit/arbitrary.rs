//! proptest strategies: header names the router reads, header values of
//! every AMQP type, whole property sets.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString};
use proptest::prelude::*;

/// Header names the router reads, plus arbitrary ones.
pub fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x-requested-delay".to_string()),
        Just("x-deliver-at".to_string()),
        Just("x-cancel-message-id".to_string()),
        Just("x-original-exchange".to_string()),
        Just("x-original-routing-key".to_string()),
        Just("x-death".to_string()),
        Just("x-delay-router-attempts".to_string()),
        Just("x-delay-router".to_string()),
        Just("x-delay-router-deadline".to_string()),
        Just("x-delay-router-exchange".to_string()),
        Just("x-delay-router-routing-key".to_string()),
        Just("x-delay-router-saved-properties".to_string()),
        Just("x-delay-router-saved-headers".to_string()),
        "[a-z-]{1,20}",
    ]
}

/// A header value of every AMQP type, delay-like strings included.
pub fn leaf() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>().prop_map(AMQPValue::Float),
        any::<f64>().prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        ".{0,40}".prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        prop::collection::vec(any::<u8>(), 0..300)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        "(-?[0-9]{1,25}|[0-9]{1,6} ?(ms|s|m|h|d|us|ns)|soon|)"
            .prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        "[a-z0-9.]{0,30}".prop_map(|s| AMQPValue::ShortString(s.as_str().into())),
        prop::collection::vec(any::<u8>(), 0..40)
            .prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
        Just(AMQPValue::Void),
    ]
}

/// A header value, tables and arrays nested up to three deep.
pub fn value() -> impl Strategy<Value = AMQPValue> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| AMQPValue::FieldTable(table(m))),
        ]
    })
}

/// A table from a map.
pub fn table(m: std::collections::BTreeMap<String, AMQPValue>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in m {
        t.insert(k.into(), v);
    }
    t
}

/// Properties with any headers and any delivery mode, expiration, priority
/// and user-id (including ones the broker would refuse).
pub fn properties() -> impl Strategy<Value = BasicProperties> {
    (
        prop::option::of(prop::collection::btree_map(key(), value(), 0..10)),
        prop::option::of(any::<u8>()),
        prop::option::of("[0-9]{0,8}"),
        prop::option::of(any::<u8>()),
        prop::option::of("[a-z]{0,8}"),
    )
        .prop_map(|(headers, mode, expiration, priority, user)| {
            let mut p = BasicProperties::default();
            if let Some(h) = headers {
                p = p.with_headers(table(h));
            }
            if let Some(m) = mode {
                p = p.with_delivery_mode(m);
            }
            if let Some(e) = expiration {
                p = p.with_expiration(e.as_str().into());
            }
            if let Some(pr) = priority {
                p = p.with_priority(pr);
            }
            if let Some(u) = user {
                p = p.with_user_id(u.as_str().into());
            }
            p
        })
}
