//! Property-based fuzzing of the pure core with arbitrary headers: nothing
//! panics, every outcome is a placement, a delivery or a park with a reason,
//! what the router would publish fits the frame and is acceptable to the
//! broker from the router's user, and a placed message is restored exactly
//! on the way out.
//!
//! PROPTEST_CASES raises the case count for a long local run.

use delay_router::core::clock::Clock;
use delay_router::core::decision::{Action, Context, Delivery, Rules, Source};
use delay_router::core::delayed::{DelayedExchange, DelayedType};
use delay_router::core::envelope::{leave_transit, read_transit};
use delay_router::core::ladder::Ladder;
use delay_router::core::wire;
use delay_router::testkit::arbitrary::properties;
use delay_router::testkit::rules::{any_queue_policy, every_strategy};
use lapin::BasicProperties;
use lapin::types::ShortString;
use proptest::prelude::*;
use std::borrow::Cow;

fn rules() -> Vec<Rules> {
    let ladder = Ladder::from_labels(&["1s", "2s", "5s"]).unwrap();
    every_strategy(&ladder, "fz", "guest", &[any_queue_policy()])
}

const NOW: i64 = 1_800_000_000_000;

/// What every action the router publishes must be.
fn publishable(action: &Action, frame_max: u32) -> Result<(), TestCaseError> {
    prop_assert!(
        wire::acceptable(action.properties(), "guest").is_ok(),
        "{:?}",
        action
    );
    prop_assert!(wire::fits(action.properties(), frame_max), "{:?}", action);
    if let Action::Park { reason, properties } = action {
        prop_assert!(!reason.to_string().is_empty());
        prop_assert!(
            properties
                .headers()
                .as_ref()
                .is_some_and(|h| h.contains_key("x-park-reason"))
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_messages_never_panic_and_parks_say_why(
        p in properties(),
        rk in ".{0,300}",
        body in prop::collection::vec(any::<u8>(), 0..64),
        unit in 0.0f64..1.0,
        later in 0i64..100_000_000,
        frame_max in prop::sample::select(vec![4_096u32, 131_072]),
        cancelled in any::<bool>(),
        hold_ms in 0u64..5_000,
    ) {
        let hold_up_to = std::time::Duration::from_millis(hold_ms);
        let rk = ShortString::try_new(rk).unwrap_or_else(|_| "k".into());
        let cx = |now_ms| Context { unit, frame_max, cancelled, hold_up_to, ..Context::at(Clock::at_ms(now_ms)) };
        for rules in rules() {
            let delivery = |source, properties: &BasicProperties| {
                let d = Delivery { source, exchange: "fz.router", routing_key: &rk, properties: Cow::Borrowed(properties), body: &body };
                rules.decide(d, &cx(NOW + if source == Source::Expired { later } else { 0 }))
            };
            // The same message on a plugin exchange: waits or goes to the
            // delivery exchange, or is parked with a reason; never panics.
            let plugin = DelayedExchange { name: "orders.delayed".into(), kind: DelayedType::Topic, deliver_to: "orders.delayed.delivered".into() };
            let served = rules.clone().with_delayed_exchanges(vec![plugin]);
            let d = Delivery { source: Source::Ingress, exchange: "orders.delayed", routing_key: &rk, properties: Cow::Borrowed(&p), body: &body };
            let on_plugin = served.decide(d, &cx(NOW));
            publishable(&on_plugin.action, frame_max)?;
            match &on_plugin.action {
                Action::Deliver { destination, .. } => prop_assert_eq!(destination.exchange.as_str(), "orders.delayed.delivered"),
                Action::Wait { properties, .. } => {
                    let transit = read_transit(properties).unwrap();
                    prop_assert_eq!(transit.destination.exchange.as_str(), "orders.delayed.delivered");
                }
                Action::Park { .. } => {}
                Action::Cancel { .. } => prop_assert!(false, "a plugin exchange's message is no cancel request"),
            }
            let plan = delivery(Source::Ingress, &p);
            publishable(&plan.action, frame_max)?;
            // Whatever a bucket might hand back: the raw input too.
            publishable(&delivery(Source::Expired, &p).action, frame_max)?;
            match &plan.action {
                Action::Wait { properties, ttl, .. } => {
                    prop_assert!(!ttl.is_zero());
                    prop_assert!(read_transit(properties).is_ok());
                    // As if the bucket expired it, at any later time.
                    publishable(&delivery(Source::Expired, properties).action, frame_max)?;
                    let back = leave_transit(properties);
                    prop_assert!(back.headers().as_ref().is_none_or(|h| !h.contains_key("x-delay-router-deadline") && !h.contains_key("x-delay-router")));
                }
                Action::Deliver { .. } => {
                    for failure in [
                        delay_router::core::parking::Failure::Returned,
                        delay_router::core::parking::Failure::Nacked,
                    ] {
                        publishable(&plan.failed(failure), frame_max)?;
                    }
                }
                Action::Park { .. } => {}
                Action::Cancel { message_id, .. } => prop_assert!(!message_id.as_str().is_empty()),
            }
        }
    }
}
