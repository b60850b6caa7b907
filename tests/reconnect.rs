//! Broker faults: when the broker closes the router's connections, the router
//! reconnects, re-declares and resumes; unconfirmed work is redelivered, never lost.

mod common;
use common::*;
use lapin::types::AMQPValue;
use std::process::Command;
use std::time::Duration;

/// Closes every connection whose client properties name this test's prefix
/// (the router's consume and publish connections), as a broker fault would.
fn close_router_connections(prefix: &str) -> usize {
    let out = Command::new("rabbitmqctl")
        .args(["list_connections", "-q", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl on PATH (the broker runs locally)");
    let listing = String::from_utf8_lossy(&out.stdout);
    let pids: Vec<&str> = listing
        .lines()
        .filter(|l| {
            l.contains(&format!("delay-router consume {prefix}"))
                || l.contains(&format!("delay-router publish {prefix}"))
        })
        .filter_map(|l| l.split('\t').next())
        .collect();
    for pid in &pids {
        let status = Command::new("rabbitmqctl")
            .args(["close_connection", pid, "test: simulated broker fault"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    pids.len()
}

#[tokio::test]
async fn the_router_reconnects_after_the_broker_closes_its_connections() {
    const N: usize = 300;
    let mut h = Harness::start(&["1s", "2s"]).await;
    let q = h.queue("dest").await;
    for i in 0..N / 2 {
        let delay = (i as i64 * 53) % 2500;
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongLongInt(delay)).with_message_id(i.to_string().into()),
            b"r",
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        close_router_connections(&h.prefix),
        2,
        "the router's consume and publish connections"
    );
    // Messages published while the router is away wait in ingress.
    for i in N / 2..N {
        let delay = (i as i64 * 53) % 2500;
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongLongInt(delay)).with_message_id(i.to_string().into()),
            b"r",
        )
        .await;
    }
    h.wait_consumers().await; // reconnected
    let mut duplicates = h.receive_distinct(&q, N, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    duplicates += h.depth(&q).await as usize;
    eprintln!(
        "{N} sent, {N} delivered, 0 lost, {duplicates} duplicate(s) from work in flight at the fault"
    );
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);
    h.cleanup().await;
}
