//! Property-based fuzzing of the pure core with arbitrary headers: nothing
//! panics, every outcome is a placement, a delivery or a park with a reason,
//! and a placed message is restored exactly on the way out.
//!
//! PROPTEST_CASES raises the case count for a long local run.

use delay_router::decision::{Action, Plan};
use delay_router::envelope::{leave_transit, read_transit};
use delay_router::ladder::Ladder;
use delay_router::placement::Strategy as Placement;
use delay_router::retry::Policy;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString};
use proptest::prelude::*;
use std::time::Duration;

/// Header names the router reads, plus arbitrary ones.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x-requested-delay".to_string()),
        Just("x-original-exchange".to_string()),
        Just("x-original-routing-key".to_string()),
        Just("x-death".to_string()),
        Just("x-delay-router-attempts".to_string()),
        Just("x-delay-router-deadline".to_string()),
        Just("x-delay-router-exchange".to_string()),
        Just("x-delay-router-routing-key".to_string()),
        Just("x-delay-router-saved-properties".to_string()),
        Just("x-delay-router-saved-headers".to_string()),
        "[a-z-]{1,20}",
    ]
}

fn leaf() -> impl Strategy<Value = AMQPValue> {
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
        Just(AMQPValue::Void),
    ]
}

fn value() -> impl Strategy<Value = AMQPValue> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| AMQPValue::FieldTable(table(m))),
        ]
    })
}

fn table(m: std::collections::BTreeMap<String, AMQPValue>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in m {
        t.insert(k.into(), v);
    }
    t
}

fn properties() -> impl Strategy<Value = BasicProperties> {
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

fn plans() -> Vec<Plan> {
    let ladder = Ladder::from_labels(&["1s", "2s", "5s"]).unwrap();
    let policy = Policy {
        queue: "*".into(),
        initial: Duration::from_secs(1),
        multiplier: 3.0,
        max_delay: Duration::from_secs(60),
        jitter: 0.5,
        max_attempts: 3,
    };
    [Placement::RoundUp, Placement::Cascade, Placement::Priority]
        .into_iter()
        .map(|s| Plan::new(&ladder, s, "fz", "guest").with_policies(vec![policy.clone()]))
        .collect()
}

const NOW: i64 = 1_800_000_000_000;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_messages_never_panic_and_parks_say_why(p in properties(), rk in ".{0,300}", unit in 0.0f64..1.0, later in 0i64..100_000_000) {
        let rk = lapin::types::ShortString::try_new(rk).unwrap_or_else(|_| "k".into());
        for plan in plans() {
            match plan.on_ingress(&rk, &p, NOW, unit) {
                Action::Park { reason, properties } => {
                    prop_assert!(!reason.to_string().is_empty());
                    prop_assert!(properties.headers().as_ref().is_some_and(|h| h.contains_key("x-park-reason")));
                }
                Action::Deliver { .. } => {}
                Action::Wait { properties, ttl, .. } => {
                    prop_assert!(!ttl.is_zero());
                    let t = read_transit(&properties);
                    prop_assert!(t.is_ok());
                    // As if the bucket expired it, at any later time: never panics either.
                    let _ = plan.on_expired(&properties, NOW + later);
                    let back = leave_transit(&properties);
                    prop_assert!(back.headers().as_ref().is_none_or(|h| !h.contains_key("x-delay-router-deadline")));
                }
            }
            let _ = plan.on_expired(&p, NOW + later);
        }
    }
}
