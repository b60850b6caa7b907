//! Cancel by message-id: by the CLI and by a message with
//! `x-cancel-message-id` on the control exchange; tombstones survive a router restart and are shared
//! by every router of the prefix; an unknown id harms nothing.

mod common;

use common::*;
use lapin::BasicProperties;
use std::collections::BTreeMap;
use std::time::Duration;

const LADDER: [&str; 3] = ["1s", "2s", "4s"];

fn delayed(queue: &str, id: &str, delay: &str) -> BasicProperties {
    to_queue(queue, s(delay)).with_message_id(id.into())
}

fn cancel_request(id: &str) -> BasicProperties {
    BasicProperties::default().with_headers(headers(&[("x-cancel-message-id", s(id))]))
}

fn cli_cancel(config: &std::path::Path, ids: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .args(["cancel", "--config"])
        .arg(config)
        .args(ids)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    text
}

/// Message-ids arriving at `queue` within `quiet` of each other, counted.
async fn arrivals(h: &Harness, queue: &str, quiet: Duration) -> BTreeMap<String, usize> {
    let mut c = Consumer::open(&h.conn, queue, Acks::Auto).await;
    let got = c.drain(quiet).await;
    c.close().await;
    let mut n = BTreeMap::new();
    for d in got {
        let id = d.properties.message_id().as_ref().unwrap().to_string();
        *n.entry(id).or_default() += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_messages_never_arrive_across_a_restart() {
    let mut h = Harness::start(&LADDER).await;
    let file = write_config(&h.prefix, &LADDER, "");
    let q = h.queue("dest").await;
    for id in ["a", "b", "c", "d", "e", "f"] {
        h.publish("k", delayed(&q, id, "6s"), b"x").await;
    }
    // Two by the CLI (with an id nobody used), one by a message.
    let said = cli_cancel(&file, &["a", "b", "never-sent"]);
    assert!(said.contains("cancelled 3 message-id(s)"), "{said}");
    h.publish_control(cancel_request("c"), b"").await;
    // The router restarts between the cancel and the due time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    h.stop_router().await.expect("stopped cleanly");
    h.start_router().await;

    let got = arrivals(&h, &q, Duration::from_secs(12)).await;
    let want: BTreeMap<String, usize> = [("d", 1), ("e", 1), ("f", 1)]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
    assert_eq!(got, want, "the cancelled never arrive, the others once");
    // Where they went: the park, each with its reason.
    let parked = h
        .receive(h.names.parked.as_str(), 3, Duration::from_secs(5))
        .await;
    let mut ids: Vec<String> = parked
        .iter()
        .map(|(_, d)| {
            let reason = header_str(d, "x-park-reason").unwrap();
            assert!(reason.starts_with("cancelled: message-id"), "{reason}");
            d.properties.message_id().as_ref().unwrap().to_string()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, ["a", "b", "c"]);
    let counted = h.stats.snapshot();
    assert_eq!(counted.cancelled, 3, "{counted:?}");
    std::fs::remove_file(file).ok();
    h.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_share_the_tombstones() {
    let mut h = Harness::start(&LADDER).await;
    let file = write_config(&h.prefix, &LADDER, "");
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut second = spawn_binary(&file, &log);
    // Both consume: every queue has two consumers.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while h.consumers(h.names.expired.as_str()).await < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second router never started"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let q = h.queue("dest").await;
    let ids: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    for id in &ids {
        h.publish("k", delayed(&q, id, "5s"), b"x").await;
    }
    // The first ten cancelled, by requests either router may take. (Not the
    // even ones: the broker hands expiries to the two consumers in turn, so
    // one router could take every even one.)
    for id in &ids[..10] {
        h.publish_control(cancel_request(id), b"").await;
    }
    let got = arrivals(&h, &q, Duration::from_secs(10)).await;
    let want: BTreeMap<String, usize> = ids[10..].iter().map(|id| (id.clone(), 1)).collect();
    // Half the requests went to each router at most: without shared
    // tombstones about half the cancelled messages would arrive.
    assert_eq!(got, want);
    // Expiries went to both routers.
    let snap = h.stats.snapshot();
    let in_process = snap.cancelled + snap.delivered;
    assert!(
        (1..20).contains(&in_process),
        "the in-process router took {in_process} of 20 expiries: the other router took the rest"
    );
    assert_eq!(h.depth(h.names.parked.as_str()).await, 10);
    // Before cleanup: a live router would declare its queues again.
    second.kill_9();
    std::fs::remove_file(file).ok();
    std::fs::remove_file(log).ok();
    h.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_without_an_id_is_parked_with_a_reason() {
    let mut h = Harness::start(&LADDER).await;
    h.publish_control(cancel_request(""), b"").await;
    let bad = BasicProperties::default().with_headers(headers(&[(
        "x-cancel-message-id",
        lapin::types::AMQPValue::LongLongInt(5),
    )]));
    h.publish_control(bad, b"").await;
    let parked = h
        .receive(h.names.parked.as_str(), 2, Duration::from_secs(5))
        .await;
    for (_, d) in &parked {
        let reason = header_str(d, "x-park-reason").unwrap();
        assert!(
            reason.starts_with("invalid cancel request: x-cancel-message-id"),
            "{reason}"
        );
    }
    let file = write_config(&h.prefix, &LADDER, "");
    let out = std::process::Command::new(BIN)
        .args(["cancel", "--config"])
        .arg(&file)
        .arg("")
        .output()
        .unwrap();
    std::fs::remove_file(file).ok();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("message-id must not be empty"));
    let _ = h.stop_router().await;
    h.cleanup().await;
}
