//! `[topology] queue_type = "auto"`, the default: quorum queues for a new
//! prefix, and an existing prefix's queues kept as the type they are (an
//! upgrade from a version whose default was classic starts without a
//! conflict). The type is read off the broker's refusals, as
//! `broker::declare::existing_queue_type` says.

mod common;
use common::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use std::collections::BTreeMap;
use std::time::Duration;

const AUTO: &str = "[topology]\nqueue_type = \"auto\"\n";
const LADDER: [&str; 2] = ["1s", "2s"];

/// The type of every queue of `prefix` but the test's own, the cancels
/// stream and the routers' exclusive presence queues, as the broker lists
/// them.
fn router_queue_types(h: &Harness) -> BTreeMap<String, String> {
    rabbitmqctl(&["list_queues", "-q", "name", "type"])
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(name, _)| {
            name.starts_with(&format!("{}.", h.prefix))
                && *name != format!("{}.dest", h.prefix)
                && *name != h.names.cancels.as_str()
                && !name.contains(".presence.")
        })
        .map(|(name, t)| (name.to_owned(), t.trim().to_owned()))
        .collect()
}

/// `delay-router declare` on `prefix` with `extra`: its exit status and
/// what it printed.
fn declare(h: &Harness, extra: &str) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("{}-declare.toml", h.prefix));
    std::fs::write(&path, config_toml(&h.prefix, &LADDER, extra)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_delay-router"))
        .args(["declare", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `delay-router declare` with `queue_type = "auto"` succeeds, declaring
/// queues of type `t`.
fn declares_as(h: &Harness, t: &str) {
    let (ok, text) = declare(h, AUTO);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("{t} buckets")), "{text}");
}

async fn delivers_one(h: &Harness, q: &str) {
    h.publish("k", to_queue(q, AMQPValue::LongLongInt(1500)), b"x")
        .await;
    let got = h.receive(q, 1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn auto_declares_quorum_queues_for_a_new_prefix_and_keeps_them() {
    let mut h = Harness::new(&LADDER, AUTO).await;
    h.start_router().await;
    let q = h.queue("dest").await;
    delivers_one(&h, &q).await;
    let types = router_queue_types(&h);
    assert!(types.contains_key(h.names.ingress.as_str()), "{types:?}");
    assert!(types.len() >= 6, "{types:?}");
    assert!(types.values().all(|t| t == "quorum"), "{types:?}");
    h.stop_router().await.unwrap();
    // Declared again by auto: quorum, found, not a conflict.
    declares_as(&h, "quorum");
    h.cleanup().await;
}

#[tokio::test]
async fn auto_keeps_the_classic_queues_of_an_existing_prefix_and_warns_once() {
    // A prefix declared classic, as the default of earlier versions did.
    let mut h = Harness::new(&LADDER, "[topology]\nqueue_type = \"classic\"\n").await;
    h.start_router().await;
    h.stop_router().await.unwrap();
    let q = h.queue("dest").await;
    let path = write_config(&h.prefix, &LADDER, AUTO);
    let log = std::env::temp_dir().join(format!("{}-auto.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    delivers_one(&h, &q).await;
    router.kill_9();
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(&log).ok();
    std::fs::remove_file(&path).ok();
    let types = router_queue_types(&h);
    assert!(types.len() >= 6, "{types:?}");
    assert!(types.values().all(|t| t == "classic"), "{types:?}");
    assert!(
        text.lines()
            .any(|l| l.contains("keeping their type") && l.contains("classic")),
        "{text}"
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("WARN") && l.contains("queue_type is classic"))
            .count(),
        1,
        "{text}"
    );
    declares_as(&h, "classic");
    h.cleanup().await;
}

/// An ingress declared by hand with only `args`: as an earlier version
/// (without the dead-letter target and delivery limit) left it, or with
/// arguments the router never declares.
async fn ingress_by_hand(h: &Harness, args: &[(&str, AMQPValue)]) {
    let mut table = FieldTable::default();
    for (k, v) in args {
        table.insert((*k).into(), v.clone());
    }
    h.ch.queue_declare(
        h.names.ingress.clone(),
        QueueDeclareOptions::durable(),
        table,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn auto_tells_the_type_of_an_earlier_versions_ingress_with_fewer_arguments() {
    // Quorum, without the delivery limit and the dead-letter target.
    let h = Harness::new(&LADDER, AUTO).await;
    ingress_by_hand(
        &h,
        &[("x-queue-type", AMQPValue::LongString("quorum".into()))],
    )
    .await;
    declares_as(&h, "quorum");
    h.cleanup().await;
    // Classic, without the dead-letter target.
    let h = Harness::new(&LADDER, AUTO).await;
    ingress_by_hand(&h, &[]).await;
    declares_as(&h, "classic");
    h.cleanup().await;
}

#[tokio::test]
async fn an_ingress_with_arguments_the_router_never_declares_is_a_clear_error() {
    let h = Harness::new(&LADDER, AUTO).await;
    ingress_by_hand(&h, &[("x-max-length", AMQPValue::LongLongInt(5))]).await;
    let (ok, text) = declare(&h, AUTO);
    assert!(!ok, "{text}");
    assert!(text.contains("x-max-length"), "{text}");
    assert!(
        text.contains(h.names.ingress.as_str()) && !text.contains("panicked"),
        "{text}"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn auto_gives_a_new_priority_prefix_classic_buckets_before_rabbitmq_4_3() {
    let extra = "[topology]\nqueue_type = \"auto\"\n[placement]\nstrategy = \"priority\"\n";
    let mut h = Harness::new(&LADDER, extra).await;
    let info = delay_router::broker::server::server_info(&h.config.urls[0], None)
        .await
        .expect("the broker's server-properties");
    // The router runs (it is not refused as with queue_type = "quorum").
    h.start_router().await;
    let q = h.queue("dest").await;
    delivers_one(&h, &q).await;
    h.stop_router().await.unwrap();
    let expected = if info.at_least(4, 3) {
        "quorum"
    } else {
        "classic"
    };
    let types = router_queue_types(&h);
    assert!(types.len() >= 4, "{types:?}");
    assert!(types.values().all(|t| t == expected), "{info}: {types:?}");
    h.cleanup().await;
}
