//! Fuzzing the publish path against the real broker: random destinations
//! (existing, unbound, missing, internal, forbidden by permission or by topic
//! permission, outside the allow-list, a full queue, the router's own names)
//! and random property sets, sent through the router exchange and written by
//! hand into a bucket with forged transit headers. The invariant is the
//! chaos test's: every message is delivered where it should be or parked with
//! a reason, none is lost, none is both, and the flow never stops (the router
//! keeps its one session).
//!
//! FUZZ_IO_ROUNDS (default 3) rounds of FUZZ_IO_MESSAGES (default 80)
//! messages; FUZZ_IO_SEED replays a run (the seed is printed).

mod common;
use common::*;
use delay_router::core::security::{AllowList, Permissions};
use delay_router::core::topology::Names;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Where a message should end up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Delivered(String),
    Parked,
}

/// The world the router publishes into: destinations with known fates.
struct World {
    /// Exchange, routing key, fate for a message the router may send as is.
    destinations: Vec<(String, String, Fate)>,
    queues: Vec<String>,
}

async fn world(h: &mut Harness) -> World {
    let p = h.prefix.clone();
    let q_direct = h.queue("dest-q").await;
    let q_topic = h.queue("dest-topic-q").await;
    let q_denied = h.queue("denied-q").await;
    let direct = h.exchange("dest-direct").await;
    h.bind(&q_direct, &direct, "k").await;
    let unbound = h.exchange("dest-unbound").await;
    let forbidden = h.exchange("forbidden").await;
    let denied = format!("{p}-denied");
    declare_exchange(h, &denied, ExchangeKind::Direct, false).await;
    h.bind(&q_denied, &denied, "k").await;
    let internal = format!("{p}.dest-internal");
    declare_exchange(h, &internal, ExchangeKind::Topic, true).await;
    let topic = format!("{p}.dest-topic");
    declare_exchange(h, &topic, ExchangeKind::Topic, false).await;
    h.bind(&q_topic, &topic, "#").await;
    let full = format!("{p}.dest-full");
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongInt(0));
    args.insert("x-overflow".into(), s("reject-publish"));
    h.ch.queue_declare(full.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    h.track_queue(&full);
    let names = h.names.clone();
    let delivered = |q: &str| Fate::Delivered(q.to_owned());
    let destinations = vec![
        (String::new(), q_direct.clone(), delivered(&q_direct)),
        (direct.clone(), "k".into(), delivered(&q_direct)),
        (topic.clone(), "ok.eu".into(), delivered(&q_topic)),
        (topic.clone(), "no.eu".into(), Fate::Parked),
        (direct, "other".into(), Fate::Parked),
        (unbound, "k".into(), Fate::Parked),
        (String::new(), format!("{p}.no-such-queue"), Fate::Parked),
        (String::new(), full, Fate::Parked),
        (format!("{p}.dest-missing"), "k".into(), Fate::Parked),
        (internal, "k".into(), Fate::Parked),
        (forbidden, "k".into(), Fate::Parked),
        (denied, "k".into(), Fate::Parked),
        ("amq.rabbitmq.trace".into(), "k".into(), Fate::Parked),
        ("amq.direct".into(), "k".into(), Fate::Parked),
        ("amq.default".into(), q_direct.clone(), Fate::Parked),
        (names.router_exchange.to_string(), "k".into(), Fate::Parked),
        (names.expired_exchange.to_string(), "k".into(), Fate::Parked),
        (String::new(), names.ingress.to_string(), Fate::Parked),
        (String::new(), names.parked.to_string(), Fate::Parked),
        (String::new(), names.state.to_string(), Fate::Parked),
        (String::new(), format!("{p}.bucket.1s"), Fate::Parked),
    ];
    World {
        destinations,
        queues: vec![q_direct, q_topic, q_denied],
    }
}

async fn declare_exchange(h: &mut Harness, name: &str, kind: ExchangeKind, internal: bool) {
    h.ch.exchange_declare(
        name.into(),
        kind,
        ExchangeDeclareOptions {
            internal,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    h.track_exchange(name);
}

/// One generated message: how it is sent, and its properties.
#[derive(Debug, Clone)]
struct Sent {
    destination: usize,
    delay: AMQPValue,
    /// Written into a bucket with transit headers rather than sent to the router.
    forged: Option<FieldTable>,
    props: BasicProperties,
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ._/-]{0,12}"
}

/// Properties the broker accepts from the test's publisher (guest); a
/// `user-id` of guest is one the router's user may not send.
fn properties() -> impl Strategy<Value = BasicProperties> {
    (
        (
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(any::<u64>()),
            prop::option::of(text()),
        ),
        (
            prop::option::of(prop::sample::select(vec![1u8, 2])),
            prop::option::of(any::<u8>()),
            prop::option::of(prop::sample::select(vec!["600000", "+900000"])),
            prop::option::weighted(0.1, Just("guest")),
            prop::collection::btree_map("[a-z]{1,8}", any::<i32>(), 0..4),
        ),
    )
        .prop_map(
            |((ct, ce, corr, reply, ts, kind), (mode, priority, exp, user, extra))| {
                let mut p = BasicProperties::default();
                if let Some(v) = ct {
                    p = p.with_content_type(v.as_str().into());
                }
                if let Some(v) = ce {
                    p = p.with_content_encoding(v.as_str().into());
                }
                if let Some(v) = corr {
                    p = p.with_correlation_id(v.as_str().into());
                }
                if let Some(v) = reply {
                    p = p.with_reply_to(v.as_str().into());
                }
                if let Some(v) = ts {
                    p = p.with_timestamp(v);
                }
                if let Some(v) = kind {
                    p = p.with_type(v.as_str().into());
                }
                if let Some(v) = mode {
                    p = p.with_delivery_mode(v);
                }
                if let Some(v) = priority {
                    p = p.with_priority(v);
                }
                if let Some(v) = exp {
                    p = p.with_expiration(v.into());
                }
                if let Some(v) = user {
                    p = p.with_user_id(v.into());
                }
                let mut h = FieldTable::default();
                for (k, v) in extra {
                    h.insert(format!("app-{k}").as_str().into(), AMQPValue::LongInt(v));
                }
                p.with_headers(h)
            },
        )
}

fn delay() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        8 => (0i64..1500).prop_map(AMQPValue::LongLongInt),
        2 => (0u32..1500).prop_map(|ms| s(&format!("{ms}ms"))),
        1 => Just(s("soon")),
        1 => Just(AMQPValue::Double(1.5)),
    ]
}

/// What a hand-written bucket message saved for its sender: sometimes
/// values the broker refuses.
fn saved_properties() -> impl Strategy<Value = Option<FieldTable>> {
    prop::option::of(
        (
            prop::option::of(prop::sample::select(vec![
                "50000", "abc", " 5", "-1", "", "+70000",
            ])),
            prop::option::of(prop::sample::select(vec![0u8, 1, 2, 3, 255])),
            prop::option::of(prop::sample::select(vec!["guest", "mallory"])),
        )
            .prop_map(|(exp, mode, user)| {
                let mut t = FieldTable::default();
                if let Some(e) = exp {
                    t.insert("expiration".into(), s(e));
                }
                if let Some(m) = mode {
                    t.insert("delivery-mode".into(), AMQPValue::ShortShortUInt(m));
                }
                if let Some(u) = user {
                    t.insert("user-id".into(), s(u));
                }
                t
            }),
    )
}

fn message(destinations: usize) -> impl Strategy<Value = Sent> {
    (
        // The first three destinations take messages: about half go there.
        prop_oneof![1 => 0..3usize, 1 => 0..destinations],
        delay(),
        prop::option::weighted(0.2, saved_properties()),
        properties(),
    )
        .prop_map(|(destination, delay, forged, props)| Sent {
            destination,
            delay,
            forged: forged.map(Option::unwrap_or_default),
            props,
        })
}

fn expected(world: &World, m: &Sent) -> Fate {
    let ok_delay = matches!(m.delay, AMQPValue::LongLongInt(_))
        || matches!(&m.delay, AMQPValue::LongString(v) if v.as_bytes().ends_with(b"ms"));
    let sends_user_id = m.props.user_id().is_some();
    let forged_ok = m.forged.as_ref().is_none_or(|saved| {
        let exp_ok = match saved.inner().get("expiration") {
            Some(AMQPValue::LongString(e)) => matches!(e.as_bytes(), b"50000" | b"+70000"),
            _ => true,
        };
        let mode_ok = !matches!(
            saved.inner().get("delivery-mode"),
            Some(AMQPValue::ShortShortUInt(0 | 3 | 255))
        );
        // A saved user-id is the park's bookkeeping: delivery ignores it.
        exp_ok && mode_ok
    });
    let delay_ok = m.forged.is_some() || ok_delay;
    if !delay_ok || sends_user_id || !forged_ok {
        return Fate::Parked;
    }
    world.destinations[m.destination].2.clone()
}

async fn send(h: &Harness, world: &World, id: &str, m: &Sent) {
    let (exchange, key, _) = &world.destinations[m.destination];
    let mut headers = m.props.headers().clone().unwrap_or_default();
    let (target_exchange, target_key) = match &m.forged {
        None => {
            headers.insert("x-requested-delay".into(), m.delay.clone());
            headers.insert("x-original-exchange".into(), s(exchange));
            headers.insert("x-original-routing-key".into(), s(key));
            (h.names.router_exchange.to_string(), "k".to_owned())
        }
        Some(saved) => {
            headers.insert("x-delay-router-exchange".into(), s(exchange));
            headers.insert("x-delay-router-routing-key".into(), s(key));
            headers.insert("x-delay-router-deadline".into(), AMQPValue::LongLongInt(0));
            headers.insert("x-delay-router-hops".into(), AMQPValue::LongLongInt(1));
            if !saved.inner().is_empty() {
                headers.insert(
                    "x-delay-router-saved-properties".into(),
                    AMQPValue::FieldTable(saved.clone()),
                );
            }
            (String::new(), format!("{}.bucket.1s", h.prefix))
        }
    };
    let props = m
        .props
        .clone()
        .with_headers(headers)
        .with_message_id(id.into());
    let confirm =
        h.ch.basic_publish(
            target_exchange.as_str().into(),
            target_key.as_str().into(),
            BasicPublishOptions::default(),
            id.as_bytes(),
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack(), "the test's own publish of {id}");
}

/// Consumes the destination queues and the park until every id is
/// accounted for; returns where each copy of each id arrived.
async fn collect(
    h: &Harness,
    world: &World,
    ids: &BTreeSet<String>,
) -> BTreeMap<String, Vec<(String, Option<String>)>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut consumers = Vec::new();
    for q in world
        .queues
        .iter()
        .cloned()
        .chain([h.names.parked.to_string()])
    {
        let mut consumer = Consumer::open(&h.conn, &q, Acks::Auto).await;
        let (tx, stop) = (tx.clone(), stop.clone());
        consumers.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let Some(d) = consumer.next_within(Duration::from_millis(200)).await else {
                    continue;
                };
                let id = d
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                let _ = tx.send((id, q.clone(), header_str(&d, "x-park-reason")));
            }
            consumer.close().await;
        }));
    }
    let mut seen: BTreeMap<String, Vec<(String, Option<String>)>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ids.iter().all(|id| seen.contains_key(id)) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, q, reason))) => seen.entry(id).or_default().push((q, reason)),
            _ => break,
        }
    }
    // Late copies (duplicates) and anything delivered twice.
    while let Ok(Some((id, q, reason))) =
        tokio::time::timeout(Duration::from_millis(1500), rx.recv()).await
    {
        seen.entry(id).or_default().push((q, reason));
    }
    stop.cancel();
    for c in consumers {
        let _ = c.await;
    }
    seen
}

#[tokio::test]
async fn every_message_is_delivered_where_it_should_be_or_parked_and_the_flow_never_stops() {
    let rounds = env("FUZZ_IO_ROUNDS", 3);
    let per_round = env("FUZZ_IO_MESSAGES", 80) as usize;
    let seed = env("FUZZ_IO_SEED", rand::random::<u64>());
    eprintln!("fuzz_publish: FUZZ_IO_SEED={seed}");
    let prefix = random_prefix();
    let dests = AllowList::new(vec![format!("{prefix}.dest*"), String::new()]).unwrap();
    let perms = Permissions::router(&Names::new(&prefix), Some(&dests));
    let router = BrokerUser::create(
        &prefix,
        "router",
        [&perms.configure, &perms.write, &perms.read],
    );
    // Broad enough that the broker, not the allow-list, refuses most bad
    // destinations; `<prefix>-denied` is the allow-list's.
    let extra = format!(
        "[amqp]\nurl = \"{}\"\n[security]\nallow_destinations = [\"\", \"{prefix}.*\", \"amq.*\"]",
        router.amqp_url()
    );
    let mut h = Harness::with_prefix(&prefix, &["1s", "2s"], &extra).await;
    let world = world(&mut h).await;
    // RabbitMQ 4 wants the exchange to exist first.
    router.topic_permissions(&format!("{prefix}.dest-topic"), "^ok\\.");
    h.start_router().await;

    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        proptest::test_runner::Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = prop::collection::vec(message(world.destinations.len()), per_round);
    let (mut delivered, mut parked, mut duplicates) = (0, 0, 0);
    for round in 0..rounds {
        let batch = strategy.new_tree(&mut runner).unwrap().current();
        let mut ids = BTreeSet::new();
        for (i, m) in batch.iter().enumerate() {
            let id = format!("r{round}-{i}");
            send(&h, &world, &id, m).await;
            ids.insert(id);
        }
        let seen = collect(&h, &world, &ids).await;
        for (i, m) in batch.iter().enumerate() {
            let id = format!("r{round}-{i}");
            let want = expected(&world, m);
            let copies = seen
                .get(&id)
                .unwrap_or_else(|| panic!("{id} lost (seed {seed}): {m:?}"));
            for (q, reason) in copies {
                match &want {
                    Fate::Delivered(dest) => assert_eq!(
                        q, dest,
                        "{id} (seed {seed}) should reach {dest}, came to {q} ({reason:?}): {m:?}"
                    ),
                    Fate::Parked => {
                        assert_eq!(
                            q,
                            h.names.parked.as_str(),
                            "{id} (seed {seed}) should be parked: {m:?}"
                        );
                        assert!(
                            reason.as_ref().is_some_and(|r| !r.is_empty()),
                            "{id}: parked without a reason"
                        );
                    }
                }
            }
            match want {
                Fate::Delivered(_) => delivered += 1,
                Fate::Parked => parked += 1,
            }
            duplicates += copies.len() - 1;
        }
        assert_eq!(
            h.stats.snapshot().sessions,
            1,
            "round {round} (seed {seed}): the router reconnected"
        );
    }
    for q in &world.queues {
        assert_eq!(h.depth(q).await, 0, "{q} holds nothing unexpected");
    }
    let stats = h.stats.snapshot();
    eprintln!(
        "fuzz_publish: {} messages in {rounds} rounds: {delivered} delivered, {parked} parked, \
         0 lost, {duplicates} duplicate(s); {} refused by the broker, {} resent after a closed channel; 1 session",
        rounds as usize * per_round,
        stats.refusals,
        stats.suspects
    );
    h.cleanup().await;
}
