//! Broker faults: when the broker closes the router's connections, the router
//! reconnects, re-declares and resumes; unconfirmed work is redelivered, never lost.

mod common;
use common::*;
use lapin::types::AMQPValue;
use std::time::Duration;

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
