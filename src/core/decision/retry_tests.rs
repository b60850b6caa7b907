//! Unit tests of the decision's retry path (zero-code and explicit).

use crate::testkit::decide;
use super::tests::{NOW, rules_for};
use super::*;
use crate::core::contract::{Destination, ORIGINAL_EXCHANGE};
use crate::core::envelope::read_transit;
use crate::core::retry::{ATTEMPTS, FIRST_FAILURE, LAST_FAILURE};
use crate::testkit::props::{header_int, props, rejected_by, s};

fn retry_rules() -> Rules {
    let policy = Policy {
        queue: "orders.*".into(),
        initial: Duration::from_secs(1),
        multiplier: 2.0,
        max_delay: Duration::from_secs(60),
        jitter: 0.0,
        max_attempts: 3,
    };
    rules_for(PlacementStrategy::Cascade).with_policies(vec![policy])
}

#[test]
fn a_rejected_message_returns_to_exactly_its_queue_after_the_policy_delay() {
    let rules = retry_rules();
    let p = rejected_by("orders.eu", &[]);
    let Action::Wait { properties, .. } = decide::ingress(&rules, &"eu".into(), &p, NOW, 0.0) else {
        panic!()
    };
    let t = read_transit(&properties).unwrap();
    assert_eq!(
        t.destination,
        Destination {
            exchange: "".into(),
            routing_key: "orders.eu".into()
        }
    );
    assert_eq!(t.deadline_ms, NOW + 1_000);
    // The second failure waits twice as long and counts on.
    let Action::Deliver { properties, .. } = decide::expired(&rules, &properties, NOW + 1_000) else {
        panic!()
    };
    assert_eq!(header_int(&properties, ATTEMPTS), Some(1));
    let Action::Wait { properties, .. } =
        decide::ingress(&rules, &"eu".into(), &properties, NOW + 5_000, 0.0)
    else {
        panic!()
    };
    let t = read_transit(&properties).unwrap();
    assert_eq!(t.deadline_ms, NOW + 5_000 + 2_000);
    let delivered = envelope::leave_transit(&properties);
    assert_eq!(header_int(&delivered, ATTEMPTS), Some(2));
    assert_eq!(header_int(&delivered, FIRST_FAILURE), Some(NOW));
    assert_eq!(header_int(&delivered, LAST_FAILURE), Some(NOW + 5_000));
    // The third failure is the last one allowed.
    match decide::ingress(&rules, &"eu".into(), &delivered, NOW + 9_000, 0.0) {
        Action::Park { reason, properties } => {
            assert_eq!(
                reason.to_string(),
                "gave up after 3 attempts: policy \"orders.*\" allows 3 deliveries to queue 'orders.eu'"
            );
            assert_eq!(header_int(&properties, ATTEMPTS), Some(3));
            assert_eq!(header_int(&properties, FIRST_FAILURE), Some(NOW));
        }
        other => panic!("expected park, got {other:?}"),
    }
}

#[test]
fn no_policy_parks_and_an_explicit_delay_wins() {
    let rules = retry_rules();
    assert!(matches!(
        decide::ingress(&rules, &"k".into(), &rejected_by("billing", &[]), NOW, 0.0),
        Action::Park { reason: ParkReason::NoPolicy(q), .. } if q == "billing"
    ));
    let p = rejected_by("orders.eu", &[("x-requested-delay", s("7s"))]);
    let Action::Wait { properties, .. } = decide::ingress(&rules, &"k".into(), &p, NOW, 0.0) else {
        panic!()
    };
    assert_eq!(read_transit(&properties).unwrap().deadline_ms, NOW + 7_000);
}

#[test]
fn plain_delayed_messages_get_no_attempt_headers() {
    let p = props(&[("x-requested-delay", s("1s")), (ORIGINAL_EXCHANGE, s("o"))]);
    let Action::Wait { properties, .. } = decide::ingress(&retry_rules(), &"k".into(), &p, NOW, 0.0)
    else {
        panic!()
    };
    assert_eq!(header_int(&properties, ATTEMPTS), None);
}
