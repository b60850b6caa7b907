//! `[topology] classic_queue_version`: the `x-queue-version` of every
//! classic queue the router declares (unset: none, the broker's default).
//! Queues declared before with another version are kept, with one warning
//! saying how to convert them.

mod common;
use common::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;

/// The storage version the broker runs each queue whose name starts with
/// `prefix.`, from the backing queue's status (`rabbitmqctl eval`).
fn versions(prefix: &str) -> Vec<(String, u32)> {
    let expr = format!(
        "[{{element(4, amqqueue:get_name(Q)), \
         proplists:get_value(version, proplists:get_value(backing_queue_status, \
         rabbit_amqqueue:info(Q, [backing_queue_status])))}} \
         || Q <- rabbit_amqqueue:list(), \
         lists:prefix(\"{prefix}.\", binary_to_list(element(4, amqqueue:get_name(Q)))), \
         amqqueue:get_type(Q) =:= rabbit_classic_queue].",
    );
    let out = rabbitmqctl(&["eval", &expr]);
    // [{<<"name">>,2}, ...], perhaps over several lines.
    out.split("{<<\"")
        .skip(1)
        .filter_map(|part| {
            let (name, rest) = part.split_once("\">>,")?;
            let version = rest.split('}').next()?.trim().parse().ok()?;
            Some((name.to_owned(), version))
        })
        .collect()
}

/// The broker's major version (`rabbit_misc:version()`).
fn broker_major() -> u32 {
    let out = rabbitmqctl(&["eval", "rabbit_misc:version()."]);
    out.trim()
        .trim_matches('"')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("a version like \"3.10.8\"")
}

// Classic queues named, whatever the harness's default type
// (DELAY_ROUTER_TEST_QUEUE_TYPE): the version is a classic queue's.
const VERSION_2: &str = "[topology]\nqueue_type = \"classic\"\nclassic_queue_version = 2\n";
const CLASSIC: &str = "[topology]\nqueue_type = \"classic\"\n";

#[tokio::test]
async fn every_classic_queue_of_the_router_has_the_configured_version() {
    let mut h = Harness::new(&["1s", "3s"], VERSION_2).await;
    h.start_router().await;
    let found = versions(&h.prefix);
    let mut expected: Vec<String> = delay_router::core::decision::Rules::from_config(&h.config)
        .topology()
        .bucket_names()
        .iter()
        .map(|q| q.to_string())
        .collect();
    expected.extend(
        [
            &h.names.ingress,
            &h.names.expired,
            &h.names.parked,
            &h.names.state,
        ]
        .map(|q| q.to_string()),
    );
    for q in &expected {
        let version = found.iter().find(|(n, _)| n == q).map(|(_, v)| *v);
        assert_eq!(version, Some(2), "{q} in {found:?}");
    }
    h.cleanup().await;
}

/// A prefix declared before without `x-queue-version` (by an earlier
/// version, or without the option) keeps working when the option is set: the router keeps those queues as they
/// are, says so once naming them, and still delivers through them.
#[tokio::test]
async fn queues_declared_without_a_version_are_kept_with_one_warning() {
    let ladder = ["2s"];
    let mut h = Harness::new(&ladder, VERSION_2).await;
    let bucket = format!("{}.bucket.2s", h.prefix);
    let mut bucket_args = FieldTable::default();
    bucket_args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(2000));
    bucket_args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(h.names.expired_exchange.as_str().into()),
    );
    for (q, args) in [
        (bucket.clone(), bucket_args),
        (h.names.expired.to_string(), FieldTable::default()),
    ] {
        h.ch.queue_declare(q.as_str().into(), QueueDeclareOptions::durable(), args)
            .await
            .unwrap();
    }
    let path = write_config(&h.prefix, &ladder, VERSION_2);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;

    let dest = h.queue("dest").await;
    h.publish(
        "k",
        to_queue(&dest, AMQPValue::LongLongInt(2500)).with_message_id("1".into()),
        b"through the old bucket",
    )
    .await;
    let got = h.receive(&dest, 1, Duration::from_secs(20)).await;
    assert_eq!(got[0].1.data, b"through the old bucket");

    let text = std::fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("another x-queue-version"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per declare:\n{text}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(warnings[0].contains(&bucket), "{}", warnings[0]);
    assert!(
        warnings[0].contains(h.names.expired.as_str()),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains("set_policy"), "{}", warnings[0]);
    assert!(
        !warnings[0].contains(h.names.ingress.as_str()),
        "the ingress was declared anew, as version 2: {}",
        warnings[0]
    );

    // Kept as they were: version 1 on 3.x (every classic queue is 2 from 4.0).
    let found = versions(&h.prefix);
    let old = if broker_major() < 4 { 1 } else { 2 };
    for (q, version) in [
        (bucket.as_str(), old),
        (h.names.expired.as_str(), old),
        (h.names.ingress.as_str(), 2),
    ] {
        assert_eq!(
            found.iter().find(|(n, _)| n == q).map(|(_, v)| *v),
            Some(version),
            "{q} in {found:?}"
        );
    }
    router.kill_9();
    std::fs::remove_file(path).unwrap();
    std::fs::remove_file(log).unwrap();
    h.cleanup().await;
}

/// Lacking the version does not hide another difference: a bucket with
/// another TTL is still refused, naming the TTL.
#[tokio::test]
async fn a_bucket_differing_in_more_than_the_version_is_still_refused() {
    let h = Harness::new(&["1s"], VERSION_2).await;
    let bucket = format!("{}.bucket.1s", h.prefix);
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1000));
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("somewhere-else".into()),
    );
    h.ch.queue_declare(bucket.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    let err = delay_router::commands::declare::declare(&h.config)
        .await
        .expect_err("a conflicting bucket is refused");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "queue '{bucket}' already exists with different arguments"
        )),
        "{text}"
    );
    assert!(text.contains("x-dead-letter-exchange"), "{text}");
    h.cleanup().await;
}

/// The other way: queues declared with version 2, the option then removed.
/// Unset, the router asks for no version, and keeps the queues as they are.
#[tokio::test]
async fn queues_declared_with_a_version_are_kept_when_the_option_is_unset() {
    let mut h = Harness::new(&["2s"], VERSION_2).await;
    h.start_router().await;
    h.restart_with(&["2s"], CLASSIC).await;
    let dest = h.queue("dest").await;
    h.publish(
        "k",
        to_queue(&dest, AMQPValue::LongLongInt(2500)).with_message_id("1".into()),
        b"kept",
    )
    .await;
    let got = h.receive(&dest, 1, Duration::from_secs(20)).await;
    assert_eq!(got[0].1.data, b"kept");
    let found = versions(&h.prefix);
    let bucket = format!("{}.bucket.2s", h.prefix);
    assert_eq!(
        found.iter().find(|(n, _)| *n == bucket).map(|(_, v)| *v),
        Some(2),
        "{found:?}"
    );
    h.cleanup().await;
}
