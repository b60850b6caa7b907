//! Unit tests of the one decision: what `decide` stamps, removes and plans,
//! and what becomes of a delivery its destination does not take.

use crate::testkit::decide;
use super::tests::{NOW, rules, rules_for};
use super::*;
use crate::core::clock::Clock;
use crate::core::contract::ORIGINAL_EXCHANGE;
use crate::core::parking::Failure;
use crate::core::wire;
use crate::testkit::props::{props, s};
use lapin::types::{AMQPValue, FieldTable};

/// The context of a delivery read at exactly NOW, with little held.
fn context(unit: f64) -> Context<'static> {
    Context {
        unit,
        ..Context::at(Clock::at_ms(NOW))
    }
}

#[test]
fn decide_stamps_a_derived_message_id_at_ingress_and_keeps_a_senders() {
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(1500)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let cx = context(0.0);
    let decide = |p: &BasicProperties| {
        rules().decide(
            Delivery {
                source: Source::Ingress,
                exchange: "t.router",
                routing_key: &"eu".into(),
                properties: Cow::Borrowed(p),
                body: b"body",
            },
            &cx,
        )
    };
    let plan = decide(&p);
    let id = plan.action.properties().message_id().clone().unwrap();
    assert!(id.as_str().starts_with(crate::core::identity::PREFIX));
    assert_eq!(decide(&p), plan, "the same delivery gets the same plan");
    let own = p.with_message_id("order-17".into());
    let plan = decide(&own);
    assert_eq!(
        plan.action
            .properties()
            .message_id()
            .as_ref()
            .unwrap()
            .as_str(),
        "order-17"
    );
    assert_eq!((plan.decided_ms, plan.frame_max), (NOW, 131_072));
}

#[test]
fn decide_removes_what_a_quorum_queue_adds_on_redelivery() {
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(0)),
        (ORIGINAL_EXCHANGE, s("orders")),
        ("x-delivery-count", AMQPValue::LongLongInt(3)),
        ("x-acquired-count", AMQPValue::LongLongInt(4)),
    ])
    .with_message_id("m".into());
    let cx = context(0.0);
    let d = Delivery {
        source: Source::Ingress,
        exchange: "t.router",
        routing_key: &"eu".into(),
        properties: Cow::Borrowed(&p),
        body: b"",
    };
    let quorum = rules()
        .with_queue_type(QueueType::Quorum)
        .decide(d.clone(), &cx);
    let h = quorum.action.properties().headers().clone().unwrap();
    assert!(!h.contains_key("x-delivery-count"));
    assert!(!h.contains_key("x-acquired-count"));
    let classic = rules().decide(d, &cx);
    assert_eq!(classic.action.properties(), &p, "classic queues add none");
}

#[test]
fn a_delivery_the_destination_does_not_take_is_parked_with_the_reason() {
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(0)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ])
    .with_message_id("m".into());
    let plan = Plan {
        action: decide::ingress(&rules(), &"eu".into(), &p, NOW, 0.0),
        decided_ms: NOW,
        frame_max: 131_072,
        retry_policy: None,
        waiting: None,
    };
    let Action::Park { reason, properties } = plan.failed(Failure::Returned) else {
        panic!("a failed delivery is parked")
    };
    assert!(matches!(reason, ParkReason::NoRoute { .. }));
    assert_eq!(
        parking::parked_destination(&properties)
            .unwrap()
            .exchange
            .as_str(),
        "orders"
    );
    assert_eq!(parking::unpark(&properties), p);
    let placed = Plan {
        action: decide::ingress(&rules(), 
            &"eu".into(),
            &props(&[("x-requested-delay", s("1s")), (ORIGINAL_EXCHANGE, s("o"))]),
            NOW,
            0.0,
        ),
        decided_ms: NOW,
        frame_max: 131_072,
        retry_policy: None,
        waiting: None,
    };
    assert_eq!(
        placed.failed(Failure::Nacked),
        placed.action,
        "only deliveries fail so"
    );
}

#[test]
fn a_message_written_into_a_bucket_by_hand_is_checked_when_due() {
    let allow = crate::core::security::AllowList::new(vec!["orders".into()]).unwrap();
    let rules = rules().with_allow_list(Some(allow));
    let forged = |exchange: &str, saved: Option<FieldTable>| {
        let mut pairs = vec![
            (crate::core::contract::TRANSIT_EXCHANGE, s(exchange)),
            (crate::core::contract::TRANSIT_ROUTING_KEY, s("k")),
            (
                crate::core::contract::TRANSIT_DEADLINE,
                AMQPValue::LongLongInt(0),
            ),
        ];
        if let Some(t) = saved {
            pairs.push((
                crate::core::contract::SAVED_PROPERTIES,
                AMQPValue::FieldTable(t),
            ));
        }
        props(&pairs)
    };
    let park_reason = |p: &BasicProperties| match decide::expired(&rules, p, NOW) {
        Action::Park { reason, .. } => reason,
        other => panic!("expected a park, got {other:?}"),
    };
    assert!(matches!(
        park_reason(&forged("billing", None)),
        ParkReason::NotAllowed { .. }
    ));
    assert!(matches!(
        park_reason(&forged("t.expired", None)),
        ParkReason::OwnDestination { .. }
    ));
    let mut saved = FieldTable::default();
    saved.insert("expiration".into(), s("abc"));
    assert!(matches!(
        park_reason(&forged("orders", Some(saved))),
        ParkReason::Unacceptable(wire::Unacceptable::Expiration(_))
    ));
    let mut saved = FieldTable::default();
    saved.insert("delivery-mode".into(), AMQPValue::ShortShortUInt(3));
    assert!(matches!(
        park_reason(&forged("orders", Some(saved))),
        ParkReason::Unacceptable(wire::Unacceptable::DeliveryMode(3))
    ));
    assert!(matches!(
        decide::expired(&rules, &forged("orders", None), NOW),
        Action::Deliver { .. }
    ));
}

#[test]
fn an_x_deliver_at_held_at_ingress_is_timed_from_now_rounded_down() {
    // Read at NOW + 0.4 ms: stamped NOW + 1, compared as NOW. A hold counted
    // from the stamp would end 0.6 ms before the time the sender asked for.
    let at = NOW + 500;
    let p = props(&[
        ("x-deliver-at", AMQPValue::LongLongInt(at)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let cx = Context {
        hold_up_to: std::time::Duration::from_secs(2),
        ..Context::at(Clock::from_unix_nanos(NOW as u64 * 1_000_000 + 400_000))
    };
    let plan = super::tests::rules_for(PlacementStrategy::Cascade).decide(
        Delivery {
            source: Source::Ingress,
            exchange: "t.router",
            routing_key: &"eu".into(),
            properties: Cow::Borrowed(&p),
            body: b"body",
        },
        &cx,
    );
    let Action::Deliver { after, due_ms, .. } = plan.action else {
        panic!("held at ingress: {:?}", plan.action)
    };
    assert_eq!(due_ms, at);
    assert_eq!(after, std::time::Duration::from_millis(500));
}

#[test]
fn the_draw_picks_a_rungs_queue_and_every_hop_may_take_another() {
    let p = props(&[
        ("x-requested-delay", AMQPValue::LongInt(2_500)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let rules = rules().with_bucket_shards(Some(4));
    let decide = |source, p: &BasicProperties, unit| {
        let cx = context(unit);
        rules.decide(
            Delivery {
                source,
                exchange: "t.router",
                routing_key: &"eu".into(),
                properties: Cow::Borrowed(p),
                body: b"body",
            },
            &cx,
        )
    };
    let queue = |plan: &Plan| match &plan.action {
        Action::Wait { queue, .. } => queue.to_string(),
        other => panic!("{other:?}"),
    };
    // Round-up puts 2.5 s in the 5s rung; the draw picks one of its four queues.
    for (unit, expected) in [
        (0.0, "t.bucket.5s"),
        (0.3, "t.bucket.5s.1"),
        (0.5, "t.bucket.5s.2"),
        (0.99, "t.bucket.5s.3"),
        (1.0, "t.bucket.5s.3"),
        (f64::NAN, "t.bucket.5s"),
    ] {
        assert_eq!(
            queue(&decide(Source::Ingress, &p, unit)),
            expected,
            "{unit}"
        );
    }
    // The same rung, whichever its queue: the same message otherwise.
    let a = decide(Source::Ingress, &p, 0.0);
    let b = decide(Source::Ingress, &p, 0.9);
    let (
        Action::Wait {
            properties: pa,
            ttl: ta,
            ..
        },
        Action::Wait {
            properties: pb,
            ttl: tb,
            ..
        },
    ) = (&a.action, &b.action)
    else {
        panic!()
    };
    assert_eq!((pa, ta), (pb, tb));
}

#[test]
fn only_the_control_exchange_takes_cancel_requests() {
    let cancel = props(&[("x-cancel-message-id", s("order-7"))]);
    let plain = props(&[
        ("x-requested-delay", AMQPValue::LongInt(1500)),
        (ORIGINAL_EXCHANGE, s("orders")),
    ]);
    let cx = context(0.0);
    let decide = |exchange: &str, p: &BasicProperties| {
        rules()
            .decide(
                Delivery {
                    source: Source::Ingress,
                    exchange,
                    routing_key: &"".into(),
                    properties: Cow::Borrowed(p),
                    body: b"",
                },
                &cx,
            )
            .action
    };
    assert!(
        matches!(decide("t.control", &cancel), Action::Cancel { message_id, .. } if message_id.as_str() == "order-7")
    );
    for exchange in ["t.router", ""] {
        match decide(exchange, &cancel) {
            Action::Park { reason, .. } => {
                assert!(reason.to_string().contains("'t.control'"), "{reason}")
            }
            other => panic!("a cancel request on '{exchange}': {other:?}"),
        }
    }
    match decide("t.control", &plain) {
        Action::Park { reason, .. } => assert!(
            reason.to_string().contains("without x-cancel-message-id"),
            "{reason}"
        ),
        other => panic!("a plain message on the control exchange: {other:?}"),
    }
}

/// Remembers a refusal of one exchange, as the shell's memory of
/// destinations does.
#[derive(Debug)]
struct Refusing(&'static str);

impl Refusals for Refusing {
    fn refusal(&self, d: &Destination) -> Option<Failure> {
        (d.exchange.as_str() == self.0).then(|| Failure::Refused {
            reply: crate::core::reasons::BrokerReply {
                code: crate::core::reasons::NOT_FOUND,
                text: "NOT_FOUND - no exchange".into(),
            },
            remembered_ms: Some(40),
        })
    }
}

#[test]
fn a_remembered_refusal_is_an_input_of_the_decision() {
    let due = |exchange: &str| {
        props(&[
            ("x-requested-delay", AMQPValue::LongInt(0)),
            (ORIGINAL_EXCHANGE, s(exchange)),
        ])
    };
    let refused = Refusing("gone");
    let cx = Context {
        refused: &refused,
        ..context(0.0)
    };
    let decide = |p: &BasicProperties| {
        decide::from(&rules(), Source::Ingress, &"eu".into(), p, &cx)
    };
    let Action::Park { reason, properties } = decide(&due("gone")) else {
        panic!("a delivery to a refused exchange is parked without a publish")
    };
    assert!(
        matches!(reason, ParkReason::ExchangeNotFound { remembered_ms: Some(40), .. }),
        "{reason}"
    );
    assert_eq!(
        parking::parked_destination(&properties).unwrap().exchange.as_str(),
        "gone",
        "kept for replay"
    );
    assert!(matches!(decide(&due("orders")), Action::Deliver { .. }));
    // A placement is no delivery: the refusal is asked again when it is due.
    let p = props(&[("x-requested-delay", s("1s")), (ORIGINAL_EXCHANGE, s("gone"))]);
    assert!(matches!(decide(&p), Action::Wait { .. }));
    // The shell asks the plan again before publishing once more.
    let plan = rules().decide(
        Delivery {
            source: Source::Ingress,
            exchange: "t.router",
            routing_key: &"eu".into(),
            properties: Cow::Owned(due("gone")),
            body: b"body",
        },
        &context(0.0),
    );
    assert!(matches!(plan.action, Action::Deliver { .. }));
    assert!(matches!(plan.checked(&refused).action, Action::Park { .. }));
}

#[test]
fn a_plugin_message_is_counted_from_its_first_bucket_until_it_leaves_them() {
    use crate::core::contract::COUNTED;
    use crate::core::delayed::{DelayedExchange, DelayedType};
    let rules = rules_for(crate::core::placement::PlacementStrategy::Cascade).with_delayed_exchanges(
        vec![DelayedExchange {
            name: "orders.delayed".into(),
            kind: DelayedType::Topic,
            deliver_to: "orders.delayed.delivered".into(),
        }],
    );
    let queue: ShortString = "t.waiting.orders.delayed".into();
    let at = |source, exchange: &str, p: &BasicProperties, now_ms, cancelled| {
        let cx = Context {
            cancelled,
            ..Context::at(Clock::at_ms(now_ms))
        };
        let d = Delivery {
            source,
            exchange,
            routing_key: &"eu.created".into(),
            properties: Cow::Borrowed(p),
            body: b"body",
        };
        rules.decide(d, &cx)
    };
    let has_mark = |p: &BasicProperties| p.headers().as_ref().is_some_and(|h| h.contains_key(COUNTED));
    // Published to the plugin exchange with 4 s to wait: counted once its bucket has it.
    let p = props(&[("x-delay", AMQPValue::LongInt(4000))]).with_message_id("m".into());
    let first = at(Source::Ingress, "orders.delayed", &p, NOW, false);
    assert_eq!(first.waiting, Some(Waiting::Enter(queue.clone())));
    let Action::Wait { properties: placed, .. } = &first.action else {
        panic!("4 s waits in a bucket: {:?}", first.action)
    };
    assert!(has_mark(placed));
    // Placed again on the way down the ladder: still counted, no change.
    let again = at(Source::Expired, "", placed, NOW + 2000, false);
    let Action::Wait { properties: replaced, .. } = &again.action else {
        panic!("2 s left is placed again under cascade: {:?}", again.action)
    };
    assert_eq!(again.waiting, None);
    assert!(has_mark(replaced));
    // Delivered: it leaves the count, and the mark does not reach the consumer.
    let due = at(Source::Expired, "", replaced, NOW + 4000, false);
    let Action::Deliver { properties: delivered, destination, .. } = &due.action else {
        panic!("due: {:?}", due.action)
    };
    assert_eq!(destination.exchange.as_str(), "orders.delayed.delivered");
    assert!(!has_mark(delivered));
    assert_eq!(due.waiting, Some(Waiting::Leave(queue.clone())));
    // Cancelled: parked, and it leaves the count too.
    let cancelled = at(Source::Expired, "", replaced, NOW + 4000, true);
    assert!(matches!(cancelled.action, Action::Park { .. }));
    assert_eq!(cancelled.waiting, Some(Waiting::Leave(queue.clone())));
    // What never waits in a bucket is never counted.
    let now = props(&[("x-delay", AMQPValue::LongInt(0))]).with_message_id("n".into());
    let at_once = at(Source::Ingress, "orders.delayed", &now, NOW, false);
    assert!(matches!(at_once.action, Action::Deliver { .. }));
    assert_eq!(at_once.waiting, None);
    // The router exchange's messages are not counted, and a sender cannot
    // forge the mark: a message that waits leaves without it.
    let forged = props(&[
        ("x-requested-delay", AMQPValue::LongInt(4000)),
        (ORIGINAL_EXCHANGE, s("orders.delayed.delivered")),
        (COUNTED, s("orders.delayed")),
    ])
    .with_message_id("f".into());
    let routed = at(Source::Ingress, "t.router", &forged, NOW, false);
    assert_eq!(routed.waiting, None);
    let Action::Wait { properties: unmarked, .. } = &routed.action else {
        panic!("4 s waits: {:?}", routed.action)
    };
    assert!(!has_mark(unmarked));
    assert_eq!(at(Source::Expired, "", unmarked, NOW + 4000, false).waiting, None);
}
