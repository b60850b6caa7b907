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
    std::fs::write(&classic, config_toml(&h.prefix, &["1s", "2s"], "")).unwrap();
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
    h.start_router().await; // re-declares the expired queue and binding
    // The broker retries unconfirmed dead-letters every
    // dead_letter_worker_publisher_confirm_timeout (180 s by default).
    let got = h.receive(&q, N, Duration::from_secs(240)).await;
    let ids: BTreeSet<usize> = got.iter().map(|(_, d)| id(d)).collect();
    assert_eq!(ids.len(), N, "a classic bucket would have dropped them all");
    h.cleanup().await;
}
