//! Topology drift: exchanges deleted while messages wait are declared again by
//! the router's periodic check, loudly, before the waiting messages need them.

mod common;
use common::*;
use lapin::options::ExchangeDeleteOptions;
use lapin::types::AMQPValue;
use lapin::types::FieldTable;
use std::time::{Duration, Instant};

/// The router checks its topology every 5 s (`Config::check_interval`,
/// built in): every wait below allows for one check and then some.
const EXTRA: &str = "[placement]\nstrategy = \"round-up\"\n";

async fn delete_exchange(h: &Harness, name: &str) {
    let ch = h.conn.create_channel().await.unwrap();
    ch.exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = ch.close(200, "ok".into()).await;
}

async fn wait_for_log(log: &std::path::Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
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
    let mut h = Harness::new(&["8s"], EXTRA).await;
    let path = write_config(&h.prefix, &["8s"], EXTRA);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    let q = h.queue("dest").await;
    for i in 0..N {
        h.publish(
            "k",
            to_queue(&q, AMQPValue::LongInt(7500)).with_message_id(i.to_string().into()),
            b"d",
        )
        .await;
    }
    // Both exchanges go while the messages wait in the 8 s bucket: without a
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
    let got = h.receive(&q, N + 1, Duration::from_secs(25)).await;
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
/// every twelfth check).
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
    // At least one check, not the twelfth.
    tokio::time::sleep(Duration::from_millis(5600)).await;
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

/// The check's survey sends every passive declare at once (one round trip,
/// not one a name): every name there gives each queue's depth, in order;
/// a missing queue or exchange anywhere in the batch gives `None` (its 404
/// closes the channel and fails the probes behind it) and leaves the
/// connection usable for the one-by-one survey that names it.
#[tokio::test]
async fn the_survey_probes_everything_at_once_and_a_missing_name_falls_back() {
    use delay_router::broker::probe::all_present;
    use lapin::types::ShortString;
    let mut h = Harness::new(&["1s"], "").await;
    let mut queues = Vec::new();
    for i in 0..40 {
        queues.push(h.queue(&format!("q{i}")).await);
    }
    // Confirm mode: each confirm means the message is in the queue, so the
    // depth the survey reads on its own channel is 3, not a race.
    let ch = h.conn.create_channel().await.unwrap();
    ch.confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    for i in 0..3 {
        ch.basic_publish(
            "".into(),
            queues[7].as_str().into(),
            lapin::options::BasicPublishOptions::default(),
            &[i],
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let names: Vec<ShortString> = queues.iter().map(|q| q.as_str().into()).collect();
    let refs: Vec<&ShortString> = names.iter().collect();
    let default_exchange: ShortString = "".into();
    let direct: ShortString = "amq.direct".into();
    let fanout: ShortString = "amq.fanout".into();
    let exchanges = [&default_exchange, &direct, &fanout];

    let infos = all_present(&h.conn, &exchanges, &refs)
        .await
        .unwrap()
        .expect("every name exists");
    assert_eq!(infos.len(), 40);
    for (i, info) in infos.iter().enumerate() {
        assert_eq!(info.messages, if i == 7 { 3 } else { 0 }, "queue {i}");
        assert_eq!(info.consumers, 0);
    }

    let gone: ShortString = format!("{}.never-declared", h.prefix).into();
    let mut with_gone = refs.clone();
    with_gone.insert(20, &gone);
    assert!(
        all_present(&h.conn, &exchanges, &with_gone)
            .await
            .unwrap()
            .is_none()
    );
    let gone_exchange: ShortString = format!("{}.no-exchange", h.prefix).into();
    assert!(
        all_present(&h.conn, &[&direct, &gone_exchange], &refs)
            .await
            .unwrap()
            .is_none()
    );
    // The connection took only channel errors.
    assert_eq!(h.depth(&queues[7]).await, 3);
    let _ = ch.close(200, "ok".into()).await;
    h.cleanup().await;
}

/// A bucket deleted while the router runs is named by the check (found by
/// the one-by-one survey after the batch's 404) and declared again.
#[tokio::test]
async fn a_deleted_bucket_is_named_and_declared_again() {
    let h = Harness::new(&["1s"], EXTRA).await;
    let path = write_config(&h.prefix, &["1s"], EXTRA);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    let bucket = format!("{}.bucket.1s", h.prefix);
    assert_eq!(h.depth(&bucket).await, 0);
    let ch = h.conn.create_channel().await.unwrap();
    ch.queue_delete(
        bucket.as_str().into(),
        lapin::options::QueueDeleteOptions::default(),
    )
    .await
    .unwrap();
    let _ = ch.close(200, "ok".into()).await;
    let text = wait_for_log(&log, "topology repaired").await;
    assert!(text.contains(&format!("queue {bucket}")), "{text}");
    assert_eq!(h.depth(&bucket).await, 0);
    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
}
