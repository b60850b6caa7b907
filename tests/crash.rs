//! Crash safety: `kill -9` of the router at random instants loses nothing,
//! and every copy of a message carries the same message-id, so consumers can
//! de-duplicate what the router sends twice.

mod common;
use common::*;

use lapin::types::AMQPValue;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const N: usize = 3000;

#[tokio::test]
async fn kill_9_loses_nothing_and_ids_stay_stable() {
    let mut h = Harness::new(&["1s", "2s"], "").await;
    let path = write_config(&h.prefix, &["1s", "2s"], "");
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    let q = h.queue("dest").await;

    // A consumer collecting every copy: seq -> message-ids seen.
    let mut consumer = Consumer::open(&h.conn, &q, Acks::Auto).await;
    let collector = tokio::spawn(async move {
        let mut copies: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        let mut last = Instant::now();
        loop {
            match consumer.next_within(Duration::from_secs(8)).await {
                Some(d) => {
                    let seq = match header(&d, "seq") {
                        Some(AMQPValue::LongLongInt(n)) => *n,
                        other => panic!("seq header: {other:?}"),
                    };
                    let id = d.properties.message_id().as_ref().map(|m| m.to_string());
                    copies
                        .entry(seq)
                        .or_default()
                        .push(id.expect("a message-id on every delivery"));
                    last = Instant::now();
                }
                // Quiet for 8 s after everything arrived: done.
                None if copies.len() >= N => break copies,
                None if last.elapsed() > Duration::from_secs(90) => break copies,
                None => {}
            }
        }
    });

    // Publish without message-ids while killing the router three times.
    let kills_at = [N / 5, N / 2, 4 * N / 5];
    let mut kills = 0;
    for i in 0..N {
        let mut p = to_queue(&q, AMQPValue::LongLongInt((i as i64 * 37) % 3000));
        let mut hd = p.headers().clone().unwrap();
        hd.insert("seq".into(), AMQPValue::LongLongInt(i as i64));
        p = p.with_headers(hd);
        h.publish("k", p, format!("body {i}").as_bytes()).await;
        if kills_at.contains(&i) {
            router.kill_9(); // SIGKILL
            kills += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            router = spawn_binary(&path, &log);
        }
    }
    // One more while messages expire out of the buckets.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    router.kill_9();
    kills += 1;
    router = spawn_binary(&path, &log);

    let copies = collector.await.unwrap();
    let delivered: usize = copies.values().map(Vec::len).sum();
    let lost = N - copies.len();
    let duplicates = delivered - copies.len();
    eprintln!(
        "{N} sent, {kills} kill -9s: {} delivered, {lost} lost, {duplicates} duplicate(s)",
        copies.len()
    );
    assert_eq!(
        lost,
        0,
        "lost messages: {:?}",
        (0..N as i64)
            .filter(|s| !copies.contains_key(s))
            .take(10)
            .collect::<Vec<_>>()
    );
    let mut ids = BTreeSet::new();
    for (seq, seen) in &copies {
        let distinct: BTreeSet<&String> = seen.iter().collect();
        assert_eq!(
            distinct.len(),
            1,
            "message {seq} arrived with different ids: {distinct:?}"
        );
        assert!(seen[0].starts_with("dr-"), "{}", seen[0]);
        ids.insert(seen[0].clone());
    }
    assert_eq!(ids.len(), N, "every message has its own id");
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);

    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
}
