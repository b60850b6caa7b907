//! Topology drift: exchanges deleted while messages wait are declared again by
//! the router's periodic check, loudly, before the waiting messages need them.

mod common;
use common::*;
use lapin::options::ExchangeDeleteOptions;
use lapin::types::AMQPValue;
use lapin::types::FieldTable;
use std::time::{Duration, Instant};

const EXTRA: &str =
    "[topology]\ncheck_interval = \"500ms\"\n[placement]\nstrategy = \"round-up\"\n";

async fn delete_exchange(h: &Harness, name: &str) {
    let ch = h.conn.create_channel().await.unwrap();
    ch.exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = ch.close(200, "ok".into()).await;
}

async fn wait_for_log(log: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the router's log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn deleted_exchanges_are_repaired_while_messages_wait() {
    const N: usize = 20;
    let mut h = Harness::new(&["3s"], EXTRA).await;
    let path = write_config(&h.prefix, &["3s"], EXTRA);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    let q = h.queue("dest").await;
    for i in 0..N {
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongInt(2500)).with_message_id(i.to_string().into()),
            b"d",
        )
        .await;
    }
    // Both exchanges go while the messages wait in the 3 s bucket: without a
    // repair the classic bucket would drop them all at expiry.
    delete_exchange(&h, h.names.expired_exchange.as_str()).await;
    delete_exchange(&h, h.names.router_exchange.as_str()).await;
    let text = wait_for_log(&log, "topology repaired").await;
    assert!(text.contains("topology drift"), "{text}");
    assert!(
        text.contains(&format!("exchange {}", h.names.expired_exchange)),
        "{text}"
    );
    assert!(
        text.contains(&format!("exchange {}", h.names.router_exchange)),
        "{text}"
    );

    // The router exchange takes publishes again.
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(100)).with_message_id(N.to_string().into()),
        b"d",
    )
    .await;
    let got = h.receive(&q, N + 1, Duration::from_secs(15)).await;
    let mut ids: Vec<usize> = got.iter().map(|(_, d)| id(d)).collect();
    ids.sort();
    assert_eq!(ids, (0..=N).collect::<Vec<_>>());
    assert_eq!(h.depth(h.names.parked.as_str()).await, 0);

    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
}

#[tokio::test]
async fn drift_is_reported_at_start() {
    let mut h = Harness::new(&["1s"], EXTRA).await;
    let path = write_config(&h.prefix, &["1s"], EXTRA);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    router.kill_9();
    delete_exchange(&h, h.names.expired_exchange.as_str()).await;
    router = spawn_binary(&path, &log);
    let text = wait_for_log(&log, "topology drift found at start").await;
    assert!(
        text.contains(&format!("exchange {}", h.names.expired_exchange)),
        "{text}"
    );
    h.wait_consumers().await;
    let q = h.queue("dest").await;
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(500)).with_message_id("0".into()),
        b"d",
    )
    .await;
    h.receive(&q, 1, Duration::from_secs(10)).await;
    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
}

/// A binding removed while the router runs is made again by the next check
/// though every exchange and queue is still there (the checks that declare
/// nothing else but the bindings: the whole topology is declared again only
/// every twelfth check, 6 s at this interval).
#[tokio::test]
async fn a_removed_binding_is_made_again() {
    let mut h = Harness::new(&["1s"], EXTRA).await;
    let path = write_config(&h.prefix, &["1s"], EXTRA);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    let ch = h.conn.create_channel().await.unwrap();
    ch.queue_unbind(
        h.names.ingress.clone(),
        h.names.router_exchange.clone(),
        "".into(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let _ = ch.close(200, "ok".into()).await;
    // Three checks at 500 ms, none of them the twelfth.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let q = h.queue("dest").await;
    for i in 0..5 {
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongInt(100)).with_message_id(i.to_string().into()),
            b"d",
        )
        .await;
    }
    // Unbound, the router exchange would have dropped them.
    h.receive(&q, 5, Duration::from_secs(10)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!text.contains("topology check failed"), "{text}");
    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
}
