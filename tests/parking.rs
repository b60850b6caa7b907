//! Every park reason: the message lands in `<prefix>.parked` with `x-park-reason`,
//! its body unchanged, and is never also delivered.

mod common;
use common::*;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::time::Duration;

struct Case {
    name: &'static str,
    props: BasicProperties,
    reason_contains: &'static str,
}

#[tokio::test]
async fn bad_or_undeliverable_messages_are_parked_with_a_reason_and_never_delivered() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let dest = h.queue("dest").await;
    let unbound_ex = h.exchange("nobody-bound").await;
    let router_ex = h.names.router_exchange.to_string();
    let to_dest = |delay: AMQPValue| to_queue(&dest, delay);
    let with =
        |pairs: &[(&str, AMQPValue)]| BasicProperties::default().with_headers(headers(pairs));
    let cases = vec![
        Case {
            name: "missing-delay",
            props: with(&[
                ("x-original-exchange", s("")),
                ("x-original-routing-key", s(&dest)),
            ]),
            reason_contains: "missing x-requested-delay",
        },
        Case {
            name: "negative",
            props: to_dest(AMQPValue::LongInt(-1000)),
            reason_contains: "negative (-1000)",
        },
        Case {
            name: "negative-string",
            props: to_dest(s("-5")),
            reason_contains: "negative (-5)",
        },
        Case {
            name: "empty",
            props: to_dest(s("")),
            reason_contains: "x-requested-delay is empty",
        },
        Case {
            name: "garbage",
            props: to_dest(s("soon")),
            reason_contains: "\"soon\" is neither",
        },
        Case {
            name: "float",
            props: to_dest(AMQPValue::Double(1.5)),
            reason_contains: "floating point",
        },
        Case {
            name: "bool",
            props: to_dest(AMQPValue::Boolean(true)),
            reason_contains: "boolean",
        },
        Case {
            name: "no-destination",
            props: with(&[("x-requested-delay", s("1s"))]),
            reason_contains: "x-original-exchange header is missing",
        },
        Case {
            name: "destination-is-router",
            props: with(&[
                ("x-requested-delay", s("1s")),
                ("x-original-exchange", s(&router_ex)),
            ]),
            reason_contains: "router exchange",
        },
        Case {
            name: "missing-exchange",
            props: with(&[
                ("x-requested-delay", s("300ms")),
                (
                    "x-original-exchange",
                    s(&format!("{}.does-not-exist", h.prefix)),
                ),
            ]),
            reason_contains: "does not exist",
        },
        Case {
            name: "nothing-bound",
            props: with(&[
                ("x-requested-delay", s("300ms")),
                ("x-original-exchange", s(&unbound_ex)),
                ("x-original-routing-key", s("k")),
            ]),
            reason_contains: "no queue is bound",
        },
        Case {
            name: "no-such-queue",
            props: with(&[
                ("x-requested-delay", AMQPValue::LongInt(0)),
                ("x-original-exchange", s("")),
                (
                    "x-original-routing-key",
                    s(&format!("{}.no-such-queue", h.prefix)),
                ),
            ]),
            reason_contains: "NO_ROUTE",
        },
    ];
    for c in &cases {
        let body = format!("body of {}", c.name);
        h.publish(
            "rk",
            c.props.clone().with_message_id(c.name.into()),
            body.as_bytes(),
        )
        .await;
    }
    let parked = h
        .receive(
            h.names.parked.as_str(),
            cases.len(),
            Duration::from_secs(15),
        )
        .await;
    for (_, d) in &parked {
        let id = d.properties.message_id().as_ref().unwrap().to_string();
        let case = cases.iter().find(|c| c.name == id).unwrap();
        let reason =
            header_str(d, "x-park-reason").unwrap_or_else(|| panic!("{id}: no x-park-reason"));
        assert!(
            reason.contains(case.reason_contains),
            "{id}: reason {reason:?} lacks {:?}",
            case.reason_contains
        );
        assert_eq!(
            d.data,
            format!("body of {id}").into_bytes(),
            "{id}: body unchanged"
        );
        let original = case.props.headers().as_ref().unwrap();
        for (k, v) in original.inner() {
            assert_eq!(header(d, k.as_str()), Some(v), "{id}: header {k} unchanged");
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        h.depth(&dest).await,
        0,
        "a parked message is never also delivered"
    );
    assert_eq!(
        h.depth(h.names.parked.as_str()).await,
        0,
        "each message parked exactly once"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn a_message_published_straight_into_a_bucket_is_parked_not_dropped() {
    let h = Harness::start(&["1s"]).await;
    let bucket = h
        .names
        .bucket(h.config.strategy, h.config.ladder.smallest())
        .to_string();
    let c =
        h.ch.basic_publish(
            "".into(),
            bucket.as_str().into(),
            Default::default(),
            b"stray",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(c.is_ack());
    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    let reason = header_str(&parked[0].1, "x-park-reason").unwrap();
    assert!(
        reason.contains("without the router's transit headers"),
        "{reason}"
    );
    assert_eq!(parked[0].1.data, b"stray");
    h.cleanup().await;
}

/// AMQP's basic.return names no delivery tag, and lapin hands it to whichever
/// confirm completes next. With many publishes in flight, routed and
/// unroutable ones mixed, each must still get its own fate: the unroutable
/// ones parked, the routed ones delivered, none lost, none both.
#[tokio::test]
async fn routed_and_unroutable_deliveries_in_flight_together_each_get_their_own_fate() {
    const N: usize = 2000;
    let mut h = Harness::start(&["1s", "2s"]).await;
    let ex = h.exchange("mixed").await;
    let q = h.queue("mixed-q").await;
    h.bind(&q, &ex, "bound").await;
    let props = |i: usize| {
        let key = if i % 3 == 0 { "unbound" } else { "bound" };
        BasicProperties::default()
            .with_headers(headers(&[
                ("x-requested-delay", AMQPValue::LongInt(0)),
                ("x-original-exchange", s(&ex)),
                ("x-original-routing-key", s(key)),
            ]))
            .with_message_id(i.to_string().into())
    };
    // One first, so the exchange is known and the rest share the main channel.
    h.publish("k", props(1), b"m").await;
    h.receive(&q, 1, Duration::from_secs(10)).await;
    let mut confirms = Vec::new();
    for i in 2..N {
        let c =
            h.ch.basic_publish(
                h.names.router_exchange.clone(),
                "k".into(),
                Default::default(),
                b"m",
                props(i),
            )
            .await
            .unwrap();
        confirms.push(c);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    let unroutable = (2..N).filter(|i| i % 3 == 0).count();
    let routed = N - 2 - unroutable;
    let delivered = h.receive(&q, routed, Duration::from_secs(30)).await;
    let parked = h
        .receive(h.names.parked.as_str(), unroutable, Duration::from_secs(30))
        .await;
    for (_, d) in &delivered {
        assert_ne!(id(d) % 3, 0, "message {} was unroutable", id(d));
    }
    for (_, d) in &parked {
        assert_eq!(id(d) % 3, 0, "message {} was routed, yet parked", id(d));
        let reason = header_str(d, "x-park-reason").unwrap();
        assert!(reason.contains("NO_ROUTE"), "{reason}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(h.depth(&q).await, 0, "nothing delivered twice");
    assert_eq!(
        h.depth(h.names.parked.as_str()).await,
        0,
        "nothing parked twice"
    );
    h.cleanup().await;
}
