//! Security: no message stops the flow. A message whose publish the broker
//! refuses (an internal exchange, an exchange the router's user may not
//! write, a routing key its topic permissions forbid, an exchange deleted
//! while messages flow to it, a user-id the router may not send) is parked
//! once with a reason naming the destination and the broker's words, and the
//! good messages sent right behind it all arrive. The router never
//! reconnects because of a message.

mod common;
use common::*;
use delay_router::core::security::{AllowList, Permissions};
use delay_router::core::topology::Names;
use lapin::BasicProperties;
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;

const GOOD: usize = 100;

fn to_exchange(exchange: &str, routing_key: &str, delay_ms: i64) -> BasicProperties {
    BasicProperties::default().with_headers(headers(&[
        ("x-requested-delay", AMQPValue::LongLongInt(delay_ms)),
        ("x-original-exchange", s(exchange)),
        ("x-original-routing-key", s(routing_key)),
    ]))
}

/// Publishes `bad`, then [`GOOD`] good messages to a queue of their own. All
/// good ones arrive within seconds, `bad` is parked exactly once with a reason
/// containing each of `reason_has`, and the router kept its first session.
async fn bad_then_good(h: &mut Harness, name: &str, bad: BasicProperties, reason_has: &[&str]) {
    let q = h.queue(&format!("good-after-{name}")).await;
    h.publish(
        "k",
        bad.with_message_id(format!("bad-{name}").into()),
        b"bad",
    )
    .await;
    for i in 0..GOOD {
        let p = to_queue(&q, AMQPValue::LongInt(300)).with_message_id(i.to_string().into());
        h.publish("k", p, b"good").await;
    }
    h.receive_distinct(&q, GOOD, Duration::from_secs(15)).await;
    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    let (_, p) = &parked[0];
    assert_eq!(
        p.properties.message_id().as_ref().map(|m| m.as_str()),
        Some(format!("bad-{name}").as_str())
    );
    let reason = header_str(p, "x-park-reason").expect("x-park-reason");
    for part in reason_has {
        assert!(reason.contains(part), "{name}: {reason:?} lacks {part:?}");
    }
    assert_eq!(p.data, b"bad", "{name}: the body is kept");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        h.depth(h.names.parked.as_str()).await,
        0,
        "{name}: parked exactly once"
    );
    assert_eq!(
        h.stats.snapshot().sessions,
        1,
        "{name}: the router never reconnected because of a message"
    );
}

async fn internal_exchange(h: &mut Harness, suffix: &str) -> String {
    let name = format!("{}.{suffix}", h.prefix);
    h.ch.exchange_declare(
        name.as_str().into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions {
            internal: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    h.track_exchange(&name);
    name
}

#[tokio::test]
async fn internal_exchanges_are_parked_and_the_flow_goes_on() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    bad_then_good(
        &mut h,
        "trace",
        to_exchange("amq.rabbitmq.trace", "k", 200),
        &[
            "amq.rabbitmq.trace",
            "403",
            "ACCESS_REFUSED - cannot publish to internal exchange",
        ],
    )
    .await;
    let internal = internal_exchange(&mut h, "internal").await;
    bad_then_good(
        &mut h,
        "internal",
        to_exchange(&internal, "k", 0),
        &[&internal, "ACCESS_REFUSED"],
    )
    .await;
    h.cleanup().await;
}

/// The router as a user with the least privileges `delay-router permissions`
/// prints for an allow-list of `<prefix>.dest*`: it may write only its own
/// queues, the default exchange and those destinations.
fn least_privilege(prefix: &str) -> BrokerUser {
    let dests = AllowList::new(vec![format!("{prefix}.dest*")]).unwrap();
    let p = Permissions::router(&Names::new(prefix), Some(&dests));
    BrokerUser::create(prefix, "router", [&p.configure, &p.write, &p.read])
}

#[tokio::test]
async fn an_exchange_the_router_may_not_write_is_parked_and_the_flow_goes_on() {
    let prefix = random_prefix();
    let user = least_privilege(&prefix);
    let extra = format!("[amqp]\nurl = \"{}\"", user.amqp_url());
    let mut h = Harness::with_prefix(&prefix, &["1s", "2s"], &extra).await;
    h.start_router().await;
    // Exists, and outside the router's write permission (not `dest*`).
    let forbidden = h.exchange("forbidden").await;
    let allowed = h.exchange("dest-ex").await;
    let allowed_q = h.queue("dest-q").await;
    h.bind(&allowed_q, &allowed, "k").await;
    bad_then_good(
        &mut h,
        "forbidden",
        to_exchange(&forbidden, "k", 200),
        &[
            &forbidden,
            "403 ACCESS_REFUSED",
            // 3.10: "access to exchange ..."; 4.3: "write access to exchange ..."
            "access to exchange",
            &user.name,
        ],
    )
    .await;
    // An exchange the router may write is still delivered to.
    h.publish(
        "k",
        to_exchange(&allowed, "k", 100).with_message_id("0".into()),
        b"ok",
    )
    .await;
    h.receive(&allowed_q, 1, Duration::from_secs(10)).await;
    h.cleanup().await;
}

#[tokio::test]
async fn a_routing_key_the_topic_permissions_forbid_is_parked_and_others_are_delivered() {
    let prefix = random_prefix();
    let user = least_privilege(&prefix);
    let extra = format!("[amqp]\nurl = \"{}\"", user.amqp_url());
    let mut h = Harness::with_prefix(&prefix, &["1s", "2s"], &extra).await;
    let topic = format!("{prefix}.dest-topic");
    h.ch.exchange_declare(
        topic.as_str().into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    h.track_exchange(&topic);
    user.topic_permissions(&topic, "^allowed\\.");
    let q = h.queue("topic-q").await;
    h.bind(&q, &topic, "#").await;
    h.start_router().await;
    bad_then_good(
        &mut h,
        "topic",
        to_exchange(&topic, "denied.eu", 200),
        &[&topic, "denied.eu", "ACCESS_REFUSED"],
    )
    .await;
    // The refusal is remembered for that routing key only.
    for i in 0..10 {
        let p = to_exchange(&topic, "allowed.eu", 100).with_message_id(i.to_string().into());
        h.publish("k", p, b"ok").await;
    }
    h.receive_distinct(&q, 10, Duration::from_secs(10)).await;
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    h.cleanup().await;
}

#[tokio::test]
async fn a_user_id_the_router_may_not_send_is_parked_not_looped() {
    let prefix = random_prefix();
    let user = least_privilege(&prefix);
    let extra = format!("[amqp]\nurl = \"{}\"", user.amqp_url());
    let mut h = Harness::with_prefix(&prefix, &["1s", "2s"], &extra).await;
    h.start_router().await;
    let q = h.queue("dest-user").await;
    // The test publishes as guest: the broker accepts user-id guest from it,
    // and would refuse it from the router's user.
    bad_then_good(
        &mut h,
        "user-id",
        to_queue(&q, AMQPValue::LongInt(200)).with_user_id("guest".into()),
        &["user-id 'guest'", &user.name],
    )
    .await;
    h.cleanup().await;
}

#[tokio::test]
async fn an_exchange_deleted_while_messages_flow_to_it_parks_only_its_messages() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let ex = h.exchange("dest-ex").await;
    let q = h.queue("dest-q").await;
    h.bind(&q, &ex, "k").await;
    // The router learns that the exchange takes messages...
    h.publish(
        "k",
        to_exchange(&ex, "k", 0).with_message_id("first".into()),
        b"1",
    )
    .await;
    h.receive(&q, 1, Duration::from_secs(10)).await;
    // ...then it is deleted while a burst flows: the message for it is due
    // in the middle of 2 x 100 good ones, all in flight on one channel.
    h.ch.exchange_delete(ex.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let good = h.queue("good").await;
    let mut n = 0;
    for half in 0..2 {
        for _ in 0..GOOD {
            let p = to_queue(&good, AMQPValue::LongInt(500)).with_message_id(n.to_string().into());
            h.publish("k", p, b"good").await;
            n += 1;
        }
        if half == 0 {
            h.publish(
                "k",
                to_exchange(&ex, "k", 500).with_message_id("bad".into()),
                b"bad",
            )
            .await;
        }
    }
    h.receive_distinct(&good, 2 * GOOD, Duration::from_secs(15))
        .await;
    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    let reason = header_str(&parked[0].1, "x-park-reason").unwrap();
    assert!(
        reason.contains(&format!("'{ex}' does not exist")),
        "{reason}"
    );
    assert!(reason.contains("NOT_FOUND"), "{reason}");
    let stats = h.stats.snapshot();
    assert_eq!(stats.sessions, 1, "no reconnect");
    assert!(
        stats.suspects > 0,
        "the culprit was found among the publishes in flight on the main channel"
    );
    assert_eq!(stats.refusals, 1, "one refusal, one parked message");
    h.cleanup().await;
}

#[tokio::test]
async fn a_destination_outside_the_allow_list_is_parked_naming_the_setting() {
    let prefix = random_prefix();
    let extra = format!("[security]\nallow_destinations = [\"\", \"{prefix}.ok-*\"]");
    let mut h = Harness::with_prefix(&prefix, &["1s", "2s"], &extra).await;
    h.start_router().await;
    let denied = h.exchange("denied").await;
    let ok = h.exchange("ok-ex").await;
    let q = h.queue("bound").await;
    h.bind(&q, &denied, "k").await;
    h.bind(&q, &ok, "k").await;
    bad_then_good(
        &mut h,
        "allow-list",
        to_exchange(&denied, "k", 200),
        &[
            &format!("destination exchange '{denied}' is not allowed"),
            "[security] allow_destinations = [\"\", ",
        ],
    )
    .await;
    // An allowed exchange is delivered to.
    h.publish(
        "k",
        to_exchange(&ok, "k", 100).with_message_id("ok".into()),
        b"ok",
    )
    .await;
    let got = h.receive(&q, 1, Duration::from_secs(10)).await;
    assert_eq!(got[0].1.data, b"ok");
    // Transit headers written by hand into a bucket are checked again when
    // the message is due: the allow-list holds for them too.
    // Both forms of the record (spelled out, as earlier versions wrote it,
    // and compact).
    let bucket = format!("{prefix}.bucket.1s");
    let compact = format!("0 1 {}:{denied} k", denied.len());
    let forgeries = [
        headers(&[
            ("x-delay-router-exchange", s(&denied)),
            ("x-delay-router-routing-key", s("k")),
            ("x-delay-router-deadline", AMQPValue::LongLongInt(0)),
        ]),
        headers(&[("x-delay-router", s(&compact))]),
    ];
    for forged in forgeries {
        let forged = BasicProperties::default()
            .with_headers(forged)
            .with_message_id("forged".into());
        let c =
            h.ch.basic_publish(
                "".into(),
                bucket.as_str().into(),
                Default::default(),
                b"forged",
                forged,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(c.is_ack());
    }
    let parked = h
        .receive(h.names.parked.as_str(), 2, Duration::from_secs(10))
        .await;
    for (_, p) in &parked {
        let reason = header_str(p, "x-park-reason").unwrap();
        assert!(reason.contains("is not allowed"), "{reason}");
    }
    assert_eq!(
        h.depth(&q).await,
        0,
        "never delivered to the denied exchange"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn the_routers_own_queues_and_exchanges_are_no_destination() {
    let h = Harness::start(&["1s", "2s"]).await;
    let names = h.names.clone();
    let own = [
        ("", names.ingress.to_string()),
        ("", names.parked.to_string()),
        ("", names.state.to_string()),
        ("", format!("{}.bucket.1s", h.prefix)),
        (names.expired_exchange.as_str(), "k".to_string()),
    ];
    for (i, (exchange, key)) in own.iter().enumerate() {
        h.publish(
            "k",
            to_exchange(exchange, key, 100).with_message_id(format!("own-{i}").into()),
            b"own",
        )
        .await;
    }
    let parked = h
        .receive(names.parked.as_str(), own.len(), Duration::from_secs(10))
        .await;
    for (_, d) in &parked {
        let reason = header_str(d, "x-park-reason").unwrap();
        assert!(reason.contains("the router's own"), "{reason}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.depth(names.parked.as_str()).await, 0, "each parked once");
    assert_eq!(h.depth(names.ingress.as_str()).await, 0, "no loop");
    h.cleanup().await;
}
