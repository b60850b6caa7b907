//! Unit tests of the decision's frame-size outcome.

use super::tests::{NOW, rules_for};
use super::*;
use crate::core::contract::{ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY};
use crate::core::wire;
use crate::testkit::decide;
use crate::testkit::props::{props, s};
use lapin::types::AMQPValue;

fn padded(pad: usize) -> BasicProperties {
    props(&[
        ("x-requested-delay", AMQPValue::LongInt(300)),
        (ORIGINAL_EXCHANGE, s("")),
        (ORIGINAL_ROUTING_KEY, s("work")),
        ("pad", s(&"p".repeat(pad))),
    ])
    .with_message_id("m-1".into())
}

/// What `decide` makes of `p` at ingress before it is fitted to a frame: the
/// decision with a frame no header table reaches.
fn unfitted(rules: &Rules, p: &BasicProperties) -> Action {
    let cx = Context {
        frame_max: u32::MAX,
        ..Context::at(crate::core::clock::Clock::at_ms(NOW))
    };
    decide::from(rules, Source::Ingress, &"k".into(), p, &cx)
}

/// The largest pad with which the sender's own message fits the frame.
fn largest_pad(frame_max: u32) -> usize {
    frame_max as usize - wire::header_frame_len(&padded(0)).unwrap()
}

#[test]
fn a_message_that_fits_is_left_alone() {
    let rules = rules_for(PlacementStrategy::Cascade);
    let p = padded(100_000);
    let a = unfitted(&rules, &p);
    assert_eq!(rules.within_frame(a.clone(), || p.clone(), NOW, 131_072), a);
}

#[test]
fn headers_too_large_with_the_routers_are_parked_with_the_largest_removed() {
    let rules = rules_for(PlacementStrategy::Cascade);
    let p = padded(largest_pad(131_072));
    assert!(wire::fits(&p, 131_072), "the sender's message fits");
    let a = unfitted(&rules, &p);
    assert!(
        !wire::fits(a.properties(), 131_072),
        "with transit it does not"
    );
    let Action::Park { reason, properties } = rules.within_frame(a, || p.clone(), NOW, 131_072)
    else {
        panic!("expected a park")
    };
    assert!(wire::fits(&properties, 131_072));
    let text = reason.to_string();
    assert!(text.starts_with("header table too large"), "{text}");
    assert!(
        text.contains("removed these sender headers: 'pad' ("),
        "{text}"
    );
    let h = properties.headers().as_ref().unwrap();
    assert!(!h.contains_key("pad"));
    assert!(h.contains_key(ORIGINAL_ROUTING_KEY), "other headers stay");
    assert_eq!(properties.message_id(), p.message_id());
}

#[test]
fn an_oversized_park_keeps_its_own_reason() {
    let rules = rules_for(PlacementStrategy::Cascade);
    let p = padded(largest_pad(131_072)).with_user_id("mallory".into());
    let a = unfitted(&rules, &p);
    let Action::Park { reason, .. } = rules.within_frame(a, || p.clone(), NOW, 131_072) else {
        panic!("expected a park")
    };
    assert!(
        reason.to_string().starts_with("user-id 'mallory'"),
        "{reason}"
    );
}

proptest::proptest! {
    #[test]
    fn whatever_the_headers_the_result_fits(
        pad in 0usize..140_000,
        extra in 0usize..3,
        frame_max in proptest::sample::select(vec![4_096u32, 8_192, 131_072]),
        strategy in proptest::sample::select(vec![PlacementStrategy::RoundUp, PlacementStrategy::Priority, PlacementStrategy::Cascade]),
    ) {
        let rules = rules_for(strategy);
        let mut p = padded(pad.min(largest_pad(frame_max)));
        let mut h = p.headers().clone().unwrap();
        for i in 0..extra {
            h.insert(format!("more-{i}").as_str().into(), s(&"q".repeat(pad / 3)));
        }
        p = p.with_headers(h);
        let a = unfitted(&rules, &p);
        let out = rules.within_frame(a, || p.clone(), NOW, frame_max);
        proptest::prop_assert!(wire::fits(out.properties(), frame_max));
    }
}
