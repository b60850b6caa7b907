//! `delay-router parked list|replay|purge` against the real broker.

mod common;
use common::*;
use lapin::BasicProperties;
use lapin::options::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

const GIVE_UP_AT_ONCE: &str =
    "[[policy]]\nqueue = \"*.work\"\ninitial = \"1s\"\nmax_attempts = 1\n";

fn parked_cli(path: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("parked")
        .args(args)
        .arg("--config")
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Parks `n` messages for `dest` (no x-requested-delay) through the router.
async fn park_for(h: &Harness, dest: &str, n: usize) {
    let props = |i: usize| {
        BasicProperties::default()
            .with_message_id(i.to_string().into())
            .with_headers(headers(&[
                ("x-original-exchange", s("")),
                ("x-original-routing-key", s(dest)),
            ]))
    };
    let mut confirms = Vec::new();
    for i in 0..n {
        confirms.push(
            h.ch.basic_publish(
                h.names.router_exchange.clone(),
                "k".into(),
                Default::default(),
                b"p",
                props(i),
            )
            .await
            .unwrap(),
        );
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
}

#[tokio::test]
async fn list_replay_and_purge_the_park() {
    let mut h = Harness::new(&["1s"], GIVE_UP_AT_ONCE).await;
    h.start_router().await;
    let parked = h.names.parked.to_string();
    // Three retries that give up at once, from a work queue.
    let work = h.work_queue().await;
    for i in 0..3 {
        h.ch.basic_publish(
            "".into(),
            work.as_str().into(),
            Default::default(),
            b"w",
            BasicProperties::default().with_message_id(format!("w{i}").into()),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let ch = h.conn.create_channel().await.unwrap();
    for _ in 0..3 {
        let d = ch
            .basic_get(work.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
            .unwrap()
            .delivery;
        d.acker
            .reject(BasicRejectOptions { requeue: false })
            .await
            .unwrap();
    }
    // Two without a delay, for another queue.
    let other = h.queue("other").await;
    park_for(&h, &other, 2).await;
    h.wait_depth(&parked, 5).await;
    let path = write_config(&h.prefix, &["1s"], GIVE_UP_AT_ONCE);

    let (ok, out, err) = parked_cli(&path, &["list"]);
    assert!(ok, "{err}");
    assert!(out.contains("5 parked message(s) shown"), "{out}");
    assert!(out.contains("gave up after 1 attempts"), "{out}");
    assert!(out.contains("missing x-requested-delay"), "{out}");
    assert!(out.contains(&work), "{out}");
    assert_eq!(h.depth(&parked).await, 5, "list removes nothing");

    let (ok, out, err) = parked_cli(&path, &["replay", "--source-queue", &work]);
    assert!(ok, "{err}");
    assert!(out.starts_with("replayed 3, skipped 2"), "{out}");
    assert_eq!(h.depth(&parked).await, 2);
    h.stop_router().await.unwrap(); // nobody consumes the work queue now
    let back = ch
        .basic_get(work.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .unwrap()
        .delivery;
    assert_eq!(header(&back, "x-park-reason"), None, "park headers removed");
    assert_eq!(
        header(&back, "x-delay-router-attempts"),
        None,
        "a replay starts a fresh count"
    );
    assert_eq!(back.data, b"w");

    let (ok, _, err) = parked_cli(&path, &["purge"]);
    assert!(!ok);
    assert!(
        err.contains("refusing to purge 2 parked message(s)"),
        "{err}"
    );
    assert_eq!(h.depth(&parked).await, 2);
    let (ok, out, _) = parked_cli(&path, &["purge", "--yes"]);
    assert!(ok);
    assert!(out.starts_with("purged 2"), "{out}");
    assert_eq!(h.depth(&parked).await, 0);
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}

#[tokio::test]
async fn a_replay_killed_midway_loses_nothing() {
    const N: usize = 3000;
    let mut h = Harness::new(&["1s"], "").await;
    h.start_router().await;
    let dest = h.queue("dest").await;
    let parked = h.names.parked.to_string();
    park_for(&h, &dest, N).await;
    h.wait_depth(&parked, N as u32).await;
    h.stop_router().await.unwrap();
    let path = write_config(&h.prefix, &["1s"], "");
    let mut child = Command::new(BIN)
        .args(["parked", "replay", "--config"])
        .arg(&path)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.depth(&dest).await < 50 {
        assert!(Instant::now() < deadline, "replay made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().unwrap(); // SIGKILL, mid-replay
    child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (in_dest, in_park) = (
        h.depth(&dest).await as usize,
        h.depth(&parked).await as usize,
    );
    assert!(
        in_dest < N,
        "the replay finished before the kill; the test proves nothing"
    );
    let ids = |got: Vec<(Instant, lapin::message::Delivery)>| {
        got.iter().map(|(_, d)| id(d)).collect::<Vec<_>>()
    };
    let delivered = ids(h.receive(&dest, in_dest, Duration::from_secs(20)).await);
    let still_parked = ids(h.receive(&parked, in_park, Duration::from_secs(20)).await);
    let all: BTreeSet<usize> = delivered.iter().chain(&still_parked).copied().collect();
    assert_eq!(all.len(), N, "lost {} messages", N - all.len());
    let duplicates = delivered.len() + still_parked.len() - N;
    eprintln!(
        "killed after {in_dest} replayed: {} still parked, {duplicates} duplicate(s), 0 lost",
        in_park
    );
    assert!(
        duplicates <= 1,
        "at most the message in flight at the kill is duplicated"
    );
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}
