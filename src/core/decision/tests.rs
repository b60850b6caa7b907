//! Unit tests of the decision.

use crate::testkit::decide;
use super::*;
use crate::core::contract::{ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY};
use crate::core::envelope::read_transit;
use crate::core::wire;
use crate::testkit::props::{props, s};
use lapin::types::AMQPValue;

pub(super) fn rules() -> Rules {
    rules_for(PlacementStrategy::RoundUp)
}

pub(super) fn rules_for(strategy: PlacementStrategy) -> Rules {
    Rules::new(
        &Ladder::from_labels(&["1s", "2s", "5s"]).unwrap(),
        strategy,
        "t",
        "guest",
    )
}

pub(super) const NOW: i64 = 1_000_000;

/// The sender's properties `p` as the decision delivers them: with the
/// message-id derived at ingress (`delivered` carries it).
fn with_derived_id(p: &BasicProperties, delivered: &BasicProperties) -> BasicProperties {
    let id = delivered.message_id().clone().expect("a message-id");
    assert!(id.as_str().starts_with(crate::core::identity::PREFIX), "{id}");
    p.clone().with_message_id(id)
}

#[test]
fn ingress_places_in_the_round_up_bucket_with_a_deadline() {
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(1500)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let Action::Wait {
        queue,
        ttl,
        properties,
        ..
    } = decide::ingress(&rules(), &"eu".into(), &p, NOW, 0.0)
    else {
        panic!("expected a bucket")
    };
    assert_eq!(queue.as_str(), "t.bucket.2s");
    assert_eq!(ttl, Duration::from_secs(2));
    let t = read_transit(&properties).unwrap();
    assert_eq!(t.deadline_ms, NOW + 1500);
    assert_eq!(
        (
            t.destination.exchange.as_str(),
            t.destination.routing_key.as_str()
        ),
        ("orders", "eu")
    );
}

#[test]
fn expiry_before_the_deadline_goes_round_again_and_after_it_delivers() {
    let p = props(&[
        ("x-requested-delay", s("7s")),
        (ORIGINAL_EXCHANGE, s("")),
        (ORIGINAL_ROUTING_KEY, s("jobs")),
    ]);
    let rules = rules();
    let Action::Wait {
        queue, properties, ..
    } = decide::ingress(&rules, &"x".into(), &p, NOW, 0.0)
    else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.bucket.5s");
    let Action::Wait {
        queue, properties, ..
    } = decide::expired(&rules, &properties, NOW + 5_000)
    else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.bucket.2s");
    assert_eq!(read_transit(&properties).unwrap().hops, 2);
    let Action::Deliver {
        destination,
        properties,
        after,
        due_ms,
        hops,
    } = decide::expired(&rules, &properties, NOW + 7_000)
    else {
        panic!()
    };
    assert_eq!(after, Duration::ZERO);
    assert_eq!((due_ms, hops), (NOW + 7_000, 2));
    assert_eq!(destination.routing_key.as_str(), "jobs");
    assert_eq!(properties, with_derived_id(&p, &properties));
}

#[test]
fn zero_delay_delivers_at_once_unchanged() {
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(0)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    assert!(
        matches!(decide::ingress(&rules(), &"eu".into(), &p, NOW, 0.0), Action::Deliver { properties, .. } if properties == with_derived_id(&p, &properties))
    );
}

#[test]
fn cascade_goes_down_the_ladder_and_holds_the_last_fraction() {
    let rules = rules_for(PlacementStrategy::Cascade);
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(3_400)),
        (ORIGINAL_EXCHANGE, s("o")),
    ]);
    let Action::Wait {
        queue, properties, ..
    } = decide::ingress(&rules, &"k".into(), &p, NOW, 0.0)
    else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.bucket.2s");
    let Action::Wait {
        queue, properties, ..
    } = decide::expired(&rules, &properties, NOW + 2_003)
    else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.bucket.1s");
    let Action::Wait {
        queue, properties, ..
    } = decide::expired(&rules, &properties, NOW + 3_010)
    else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.bucket.250ms");
    let Action::Deliver {
        after, properties, ..
    } = decide::expired(&rules, &properties, NOW + 3_262)
    else {
        panic!()
    };
    assert_eq!(after, Duration::from_millis(138));
    assert_eq!(properties, with_derived_id(&p, &properties));
    // Finer rungs below 1s: 500ms, 250ms.
    let Action::Wait { queue, .. } = decide::ingress(&rules, 
        &"k".into(),
        &props(&[
            ("x-requested-delay", AMQPValue::LongInt(700)),
            (ORIGINAL_EXCHANGE, s("o")),
        ]),
        NOW,
        0.0,
    ) else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.bucket.500ms");
}

/// The docs' example (docs/concepts.md): 100 s on the shipped ladder.
#[test]
fn cascade_on_the_shipped_ladder_matches_the_documented_example() {
    let shipped = crate::config::Config::from_toml(include_str!("../../../buckets.toml")).unwrap();
    let rules = Rules::new(
        &shipped.ladder,
        PlacementStrategy::Cascade,
        "delay",
        "guest",
    );
    let p = props(&[
        ("x-requested-delay", s("100s")),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let (mut action, mut now, mut path) =
        (decide::ingress(&rules, &"k".into(), &p, NOW, 0.0), NOW, vec![]);
    while let Action::Wait {
        queue,
        ttl,
        properties,
        ..
    } = action
    {
        path.push(queue.to_string());
        now += ttl.as_millis() as i64;
        action = decide::expired(&rules, &properties, now);
    }
    assert_eq!(path, ["delay.bucket.1m", "delay.bucket.40s"]);
    assert!(matches!(action, Action::Deliver { after, .. } if after.is_zero()));
}

#[test]
fn priority_sets_expiration_and_priority_and_restores_the_sender_values() {
    let rules = rules_for(PlacementStrategy::Priority);
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(1_200)),
        (ORIGINAL_EXCHANGE, s("o")),
    ])
    .with_priority(1);
    let Action::Wait {
        queue, properties, ..
    } = decide::ingress(&rules, &"k".into(), &p, NOW, 0.0)
    else {
        panic!()
    };
    assert_eq!(queue.as_str(), "t.pbucket.2s");
    assert_eq!(properties.expiration().as_ref().unwrap().as_str(), "1200");
    assert_eq!(*properties.priority(), Some(7));
    let Action::Deliver { properties, .. } =
        decide::expired(&rules, &properties.with_expiration("0".into()), NOW + 1_200)
    else {
        panic!()
    };
    assert_eq!(properties.priority(), &Some(1));
}

fn park_reason(p: &BasicProperties) -> ParkReason {
    match decide::ingress(&rules(), &"rk".into(), p, NOW, 0.0) {
        Action::Park { reason, .. } => reason,
        other => panic!("expected park, got {other:?}"),
    }
}

#[test]
fn bad_input_is_parked_with_a_reason() {
    assert_eq!(
        park_reason(&props(&[(ORIGINAL_EXCHANGE, s("o"))])),
        ParkReason::MissingDelay
    );
    assert!(matches!(
        park_reason(&props(&[
            (ORIGINAL_EXCHANGE, s("o")),
            ("x-requested-delay", s("-3"))
        ])),
        ParkReason::InvalidDelay(_)
    ));
    assert!(matches!(
        park_reason(&props(&[("x-requested-delay", s("3s"))])),
        ParkReason::InvalidDestination(_)
    ));
    assert!(matches!(
        park_reason(&props(&[
            ("x-requested-delay", s("3s")),
            (ORIGINAL_EXCHANGE, s("t.router"))
        ])),
        ParkReason::DestinationIsRouter(_)
    ));
    let p = props(&[("x-requested-delay", s("3s")), (ORIGINAL_EXCHANGE, s("o"))])
        .with_user_id("mallory".into());
    assert!(matches!(
        park_reason(&p),
        ParkReason::Unacceptable(wire::Unacceptable::UserId { .. })
    ));
    assert!(matches!(
        park_reason(&BasicProperties::default()),
        ParkReason::InvalidDestination(_)
    ));
}

#[test]
fn expired_without_transit_headers_is_parked() {
    assert!(matches!(
        decide::expired(&rules(), &BasicProperties::default(), NOW),
        Action::Park {
            reason: ParkReason::NotInTransit(_),
            ..
        }
    ));
}

/// Transit headers are text anyone could have written: the most hops they
/// can say, on a deadline far off, go round again (hops saturated), and the
/// same on a deadline past deliver with hops clamped, never overflowing
/// (the fuzzer found the overflow, fuzz/seeds/headers/in-transit-hops-max).
#[test]
fn the_most_hops_the_headers_can_say_do_not_overflow() {
    use crate::core::contract::{
        TRANSIT_DEADLINE, TRANSIT_EXCHANGE, TRANSIT_HOPS, TRANSIT_ROUTING_KEY,
    };
    let transit = |deadline: i64| {
        props(&[
            (TRANSIT_EXCHANGE, s("orders")),
            (TRANSIT_ROUTING_KEY, s("eu")),
            (TRANSIT_DEADLINE, AMQPValue::LongLongInt(deadline)),
            (TRANSIT_HOPS, AMQPValue::LongLongInt(i64::MAX)),
        ])
    };
    let Action::Wait { properties, .. } = decide::expired(&rules(), &transit(i64::MAX), NOW) else {
        panic!("expected a bucket")
    };
    assert_eq!(read_transit(&properties).unwrap().hops, i64::MAX);
    let Action::Deliver { hops, .. } = decide::expired(&rules(), &transit(NOW), NOW) else {
        panic!("expected a delivery")
    };
    assert_eq!(hops, u32::MAX);
}

/// No placement writes the lane mark, and one an earlier version wrote (its
/// due lane) goes when the message is placed again.
#[test]
fn the_lane_mark_of_an_earlier_version_goes_at_the_next_placement() {
    use crate::core::contract::{DUE_LANE, TRANSIT_LANE};
    let rules = rules_for(PlacementStrategy::Cascade);
    let lane = |p: &BasicProperties| {
        p.headers()
            .as_ref()
            .and_then(|h| h.inner().get(TRANSIT_LANE).cloned())
    };
    for delay_ms in [1_800, 5_500, 12_000] {
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongLongInt(delay_ms)),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        let Action::Wait { properties, .. } = decide::ingress(&rules, &"eu".into(), &p, NOW, 0.0)
        else {
            panic!("{delay_ms} ms waits in a bucket")
        };
        assert_eq!(lane(&properties), None, "{delay_ms}");
    }
    // Placed by an earlier version with the mark, out of its bucket with
    // 6.9 s left (the clock stepped back 10 s): placed again, without it.
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongLongInt(1_900)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let Action::Wait { properties, .. } = decide::ingress(&rules, &"eu".into(), &p, NOW, 0.0) else {
        panic!("waits")
    };
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(TRANSIT_LANE.into(), AMQPValue::LongString(DUE_LANE.into()));
    let marked = properties.with_headers(headers);
    assert!(lane(&marked).is_some());
    let Action::Wait { properties, .. } = decide::expired(&rules, &marked, NOW - 10_000) else {
        panic!("waits again")
    };
    assert_eq!(lane(&properties), None);
}
