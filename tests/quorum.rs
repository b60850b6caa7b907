//! Replicated buckets: `[topology] queue_type = "quorum"` declares every
//! router queue as a quorum queue, and buckets dead-letter at least once.

mod common;
use common::*;
use lapin::options::QueueDeleteOptions;
use lapin::types::AMQPValue;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const QUORUM: &str = "[topology]\nqueue_type = \"quorum\"\n";

#[tokio::test]
async fn quorum_buckets_deliver_every_message_never_early() {
    let mut h = Harness::new(&["1s", "2s"], QUORUM).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    let mut sent = Vec::new();
    for i in 0..200usize {
        let delay = (i as i64 * 37) % 3000;
        sent.push((Instant::now(), delay));
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongLongInt(delay)).with_message_id(i.to_string().into()),
            b"q",
        )
        .await;
    }
    let got = h.receive(&q, 200, Duration::from_secs(30)).await;
    let mut ids = BTreeSet::new();
    for (at, d) in &got {
        let i = id(d);
        assert!(ids.insert(i), "{i} twice");
        assert!(
            *at - sent[i].0 >= Duration::from_millis(sent[i].1 as u64),
            "{i} early"
        );
    }
    // The queues really are quorum queues: declaring them classic conflicts.
    let classic = std::env::temp_dir().join(format!("{}.toml", h.prefix));
    std::fs::write(
        &classic,
        config_toml(
            &h.prefix,
            &["1s", "2s"],
            "[topology]\nqueue_type = \"classic\"",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_delay-router"))
        .args(["declare", "--config"])
        .arg(&classic)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("x-queue-type"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(classic).unwrap();
    h.cleanup().await;
}

#[tokio::test]
async fn a_quorum_bucket_keeps_what_expires_while_the_router_queue_is_gone() {
    const N: usize = 20;
    // The broker sends an unconfirmed dead-letter again after
    // dead_letter_worker_publisher_confirm_timeout, 180 s by default; the
    // worker reads it when the bucket is declared. 5 s keeps the test short
    // and changes nothing else it shows.
    let _confirm_timeout =
        BrokerSetting::set("dead_letter_worker_publisher_confirm_timeout", "5000");
    let mut h = Harness::new(&["1s", "2s"], QUORUM).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    for i in 0..N {
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongLongInt(2000)).with_message_id(i.to_string().into()),
            b"kept",
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.stop_router().await.unwrap();
    // Topology drift while messages wait: the queue buckets dead-letter into is deleted.
    h.ch.queue_delete(h.names.expired.clone(), QueueDeleteOptions::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await; // every message has expired meanwhile
    assert_eq!(h.depth(&q).await, 0);
    h.start_router().await; // re-declares the expired queue and its binding
    let got = h.receive(&q, N, Duration::from_secs(60)).await;
    let ids: BTreeSet<usize> = got.iter().map(|(_, d)| id(d)).collect();
    assert_eq!(ids.len(), N, "a classic bucket would have dropped them all");
    h.cleanup().await;
}

/// A message the router's quorum `expired` queue delivers too often (a
/// router crashing on it again and again) ends in the park with RabbitMQ's
/// reason, never dropped: RabbitMQ 4 limits deliveries by default, and the
/// router makes the limit and its target explicit on every version.
#[tokio::test]
async fn a_message_delivered_too_often_is_parked_not_dropped() {
    use delay_router::core::topology::DELIVERY_LIMIT;
    use lapin::options::BasicPublishOptions;
    let h = Harness::new(&["1s"], QUORUM).await;
    delay_router::broker::declare::declare(
        &h.conn,
        &delay_router::core::decision::Rules::from_config(&h.config).topology(),
    )
    .await
    .unwrap();
    let c =
        h.ch.basic_publish(
            h.names.expired_exchange.clone(),
            "".into(),
            BasicPublishOptions::default(),
            b"poison",
            lapin::BasicProperties::default().with_message_id("p".into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(c.is_ack());
    // As a router that takes it and dies, over and over: its channel closes
    // with the delivery unacked. (RabbitMQ 4 counts that, and a reject, but
    // not a nack with requeue, as a failed delivery.)
    for _ in 0..=DELIVERY_LIMIT {
        let mut consumer = Consumer::open(&h.conn, h.names.expired.as_str(), Acks::Manual(1)).await;
        consumer.next(Duration::from_secs(10)).await;
        consumer.close().await;
    }
    let parked = h
        .receive(h.names.parked.as_str(), 1, Duration::from_secs(10))
        .await;
    assert_eq!(parked[0].1.data, b"poison");
    assert_eq!(
        header_str(&parked[0].1, "x-first-death-reason").as_deref(),
        Some("delivery_limit")
    );
    assert_eq!(h.depth(h.names.expired.as_str()).await, 0);
    h.cleanup().await;
}

/// A quorum prefix whose queues an earlier version declared without the
/// delivery limit keeps working: those queues are kept, with a warning.
#[tokio::test]
async fn a_quorum_prefix_declared_by_an_earlier_version_keeps_working() {
    let mut h = Harness::new(&["1s"], QUORUM).await;
    let mut args = lapin::types::FieldTable::default();
    args.insert("x-queue-type".into(), s("quorum"));
    for q in [&h.names.expired, &h.names.parked] {
        h.ch.queue_declare(
            q.clone(),
            lapin::options::QueueDeclareOptions::durable(),
            args.clone(),
        )
        .await
        .unwrap();
    }
    h.start_router().await;
    let q = h.queue("dest").await;
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(1200)).with_message_id("1".into()),
        b"old",
    )
    .await;
    let got = h.receive(&q, 1, Duration::from_secs(15)).await;
    assert_eq!(got[0].1.data, b"old");
    h.cleanup().await;
}

/// `parked list` reads without acking, so every listing returns the parked
/// messages to their queue, which a quorum queue counts as a failed
/// delivery: listing the park often must never dead-letter anything. And
/// the park counts them again when `list` returns.
#[tokio::test]
async fn listing_a_quorum_park_many_times_loses_nothing() {
    let mut h = Harness::new(&["1s"], QUORUM).await;
    h.start_router().await;
    const PARKED: u32 = 200;
    for i in 0..PARKED {
        h.publish(
            "k",
            to_queue("nowhere", s("soon")).with_message_id(format!("bad{i}").into()),
            b"parked",
        )
        .await;
    }
    h.wait_depth(h.names.parked.as_str(), PARKED).await;
    for i in 0..(delay_router::core::topology::DELIVERY_LIMIT + 5) {
        let rows = delay_router::commands::parked::list(&h.conn, &h.names, None)
            .await
            .unwrap();
        assert_eq!(rows.len(), PARKED as usize);
        // A quorum queue takes a listing's messages back after the channel
        // closed (a Raft command each); `list` returns once the park counts
        // them again, so that a replay run next sees them all.
        assert_eq!(
            h.depth(h.names.parked.as_str()).await,
            PARKED,
            "listing {i}: the park does not count every listed message yet"
        );
    }
    // A replay that matches none returns them all, and the park counts
    // them again when it returns too.
    let rules = delay_router::core::decision::Rules::from_config(&h.config);
    let filter = delay_router::commands::parked::Filter {
        source_queue: Some("no-such-queue".into()),
        reason_contains: None,
        limit: None,
    };
    let conn = std::sync::Arc::new(
        lapin::Connection::connect(&url(), lapin::ConnectionProperties::default())
            .await
            .unwrap(),
    );
    let done = delay_router::commands::parked::replay(conn.clone(), &rules, &filter)
        .await
        .unwrap();
    let _ = conn.close(200, "replayed".into()).await;
    assert_eq!(done.skipped, PARKED as usize);
    assert_eq!(h.depth(h.names.parked.as_str()).await, PARKED);
    h.cleanup().await;
}

/// `priority` with quorum buckets. From RabbitMQ 4.3 a quorum queue keeps a
/// FIFO per message priority and expires at the head of each, so a short
/// delay does not wait behind a long one in the same bucket (a classic
/// priority queue holds it until the long one expires). Before 4.3 the
/// router refuses to run it, naming the broker's version.
#[tokio::test]
async fn priority_with_quorum_buckets_expires_per_level_on_4_3_and_is_refused_before() {
    let extra = "[topology]\nqueue_type = \"quorum\"\n[placement]\nstrategy = \"priority\"\n";
    let mut h = Harness::new(&["1s", "5s"], extra).await;
    let info = delay_router::broker::server::server_info(&h.config.urls[0], None)
        .await
        .expect("the broker's server-properties");
    if !info.at_least(4, 3) {
        let run = delay_router::router::run(h.config.clone(), std::future::pending());
        let result = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("the router stops at once");
        let Err(delay_router::router::RouterError::Unsupported(why)) = result else {
            panic!("not refused on {info}: {result:?}");
        };
        assert!(why.contains("needs RabbitMQ 4.3 or later"), "{why}");
        let (major, minor) = info.major_minor().unwrap();
        assert!(
            why.contains(&format!("{major}.{minor}")),
            "names the broker: {why}"
        );
        h.cleanup().await;
        return;
    }
    h.start_router().await;
    let q = h.queue("dest").await;
    // Both wait in the 5s bucket (round-up); the short one with the higher
    // priority, behind the long one.
    let t0 = Instant::now();
    for (i, delay) in [(0usize, 5000i64), (1, 1500)] {
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongLongInt(delay)).with_message_id(i.to_string().into()),
            b"p",
        )
        .await;
    }
    let got = h.receive(&q, 2, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 2);
    for (at, d) in &got {
        let waited = at.duration_since(t0);
        match id(d) {
            0 => assert!(waited >= Duration::from_millis(5000), "early: {waited:?}"),
            _ => assert!(
                waited >= Duration::from_millis(1500) && waited < Duration::from_millis(4000),
                "the 1.5 s message arrived after {waited:?}: it waited behind the 5 s one"
            ),
        }
    }
    h.cleanup().await;
}

/// A retired quorum bucket: RabbitMQ refuses `queue.delete if-empty` on a
/// quorum queue with 540 NOT_IMPLEMENTED and closes the connection, so the
/// janitor leaves it (with a warning naming the command) instead of ending
/// the router's session at every sweep.
#[tokio::test]
async fn a_retired_quorum_bucket_is_left_in_place_and_the_session_lives_on() {
    let port = free_port();
    let extra = format!("{QUORUM}[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let mut h = Harness::new(&["1s", "2s"], &extra).await;
    h.start_router().await;
    let retired = format!("{}.bucket.2s", h.prefix);
    assert!(h.exists(&retired).await);
    h.restart_with(&["1s"], &extra).await;
    // Three of the janitor's sweeps.
    tokio::time::sleep(delay_router::router::janitor::SWEEP_EVERY * 3).await;
    assert!(h.exists(&retired).await, "left for the operator");
    let q = h.queue("dest").await;
    h.publish("k", to_queue(&q, AMQPValue::LongLongInt(500)), b"x")
        .await;
    assert_eq!(h.receive(&q, 1, Duration::from_secs(20)).await.len(), 1);
    let s = scrape(port).await;
    assert_eq!(
        sample(&s, "delay_router_reconnects_total", &[]),
        Some(0.0),
        "the router's session never ended"
    );
    h.cleanup().await;
}
