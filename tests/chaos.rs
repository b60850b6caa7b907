//! The chaos test: 20,000 persistent messages with delays across a short
//! ladder, while the router is killed with SIGKILL several times, the broker
//! closes its connections, and the broker application is stopped and started
//! once. At the end: sent, delivered, lost (must be 0), duplicated, parked,
//! for classic and for quorum buckets.
//!
//! It restarts the shared broker, so it is `#[ignore]`d in the parallel suite
//! and run on its own by scripts/test (and .ci/run) afterwards:
//!
//!     cargo build --release --bin delay-router
//!     DELAY_ROUTER_TEST_BIN=target/release/delay-router \
//!         cargo test --test chaos -- --ignored --nocapture --test-threads 1
//!
//! DELAY_ROUTER_TEST_BIN is the router binary it runs (default: the debug
//! build of the test run; scripts/test gives it the release build, as
//! `scripts/run` runs). CHAOS_MESSAGES sets the number of messages per mode
//! (default 20,000), CHAOS_PREFETCH the router's `amqp.prefetch` (default:
//! the router's, 500), CHAOS_KEEP_LOG keeps the router's log.

mod common;
use common::*;
use lapin::options::{BasicAckOptions, BasicPublishOptions};
use lapin::types::AMQPValue;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const LADDER: &[&str] = &["1s", "2s", "4s"];
/// Delays spread over 0 to 10 s: most messages wait in buckets (and cascade
/// through several) while the chaos happens.
const MAX_DELAY_MS: i64 = 10_000;
/// How long to wait for the last messages; a quorum queue re-sends
/// dead-letters whose confirm was lost only after 180 s.
const SETTLE_WITHIN: Duration = Duration::from_secs(300);

fn messages() -> usize {
    std::env::var("CHAOS_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

struct Chaos {
    kills: usize,
    forced_closes: usize,
    app_restarts: usize,
}

struct Router {
    process: Spawned,
    path: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Router {
    fn start(path: std::path::PathBuf, log: std::path::PathBuf) -> Self {
        let process = spawn_binary(&path, &log);
        Self { process, path, log }
    }
    /// SIGKILL and start again.
    fn kill_9(&mut self, chaos: &mut Chaos) {
        self.process.kill_9();
        chaos.kills += 1;
        self.process = spawn_binary(&self.path, &self.log);
    }
}

/// Publishes messages `range` persistent, with confirms, 500 at a time.
async fn publish(h: &Harness, q: &str, range: std::ops::Range<usize>) {
    let ids: Vec<usize> = range.collect();
    for batch in ids.chunks(500) {
        let mut confirms = Vec::with_capacity(batch.len());
        for &i in batch {
            let delay = (i as i64 * 7_919) % MAX_DELAY_MS;
            let mut p = to_queue(q, AMQPValue::LongLongInt(delay)).with_delivery_mode(2);
            let mut hd = p.headers().clone().unwrap();
            hd.insert("seq".into(), AMQPValue::LongLongInt(i as i64));
            p = p.with_headers(hd);
            let confirm =
                h.ch.basic_publish(
                    h.names.router_exchange.clone(),
                    "k".into(),
                    BasicPublishOptions::default(),
                    format!("chaos {i}").as_bytes(),
                    p,
                )
                .await
                .unwrap();
            confirms.push(confirm);
        }
        for c in confirms {
            assert!(c.await.unwrap().is_ack(), "the broker refused a publish");
        }
    }
}

/// Consumes `queue` (acking after recording) until `n` distinct seqs have
/// arrived and nothing more came for `quiet`, or `within` passed.
async fn collect(
    h: &Harness,
    queue: &str,
    n: usize,
    quiet: Duration,
    within: Duration,
) -> BTreeMap<i64, Vec<String>> {
    let mut consumer = Consumer::open(&h.conn, queue, Acks::Manual(1000)).await;
    let mut copies: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    let deadline = Instant::now() + within;
    loop {
        let wait = if copies.len() >= n {
            quiet
        } else {
            Duration::from_secs(5)
        };
        match consumer.next_within(wait).await {
            Some(d) => {
                let seq = match header(&d, "seq") {
                    Some(AMQPValue::LongLongInt(s)) => *s,
                    other => panic!("seq header: {other:?}"),
                };
                let id = d
                    .properties
                    .message_id()
                    .as_ref()
                    .map_or_else(|| "(none)".to_owned(), |m| m.to_string());
                // Headers of the router's own queues must not reach the destination.
                let leaked = ["x-delivery-count", "x-acquired-count", "x-death"]
                    .iter()
                    .any(|k| header(&d, k).is_some());
                copies.entry(seq).or_default().push(if leaked {
                    format!("{id} (leaked headers)")
                } else {
                    id
                });
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
            None if copies.len() >= n || Instant::now() >= deadline => break,
            None => {}
        }
    }
    consumer.close().await;
    copies
}

async fn run(queue_type: &str) {
    let n = messages();
    let started = Instant::now();
    let mut extra = format!("[topology]\nqueue_type = \"{queue_type}\"\ncheck_interval = \"1s\"\n");
    // CHAOS_PREFETCH: the router's window (duplicates per fault grow with it).
    if let Ok(prefetch) = std::env::var("CHAOS_PREFETCH") {
        extra.push_str(&format!(
            "[amqp]\nurl = \"{}\"\nprefetch = \"{prefetch}\"\n",
            url()
        ));
    }
    let mut h = Harness::new(LADDER, &extra).await;
    let path = write_config(&h.prefix, LADDER, &extra);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = Router::start(path.clone(), log.clone());
    h.wait_consumers().await;
    let q = h.queue("dest").await;
    let mut chaos = Chaos {
        kills: 0,
        forced_closes: 0,
        app_restarts: 0,
    };

    // Publish in four parts, killing the router between them.
    for part in 0..4 {
        publish(&h, &q, part * n / 4..(part + 1) * n / 4).await;
        if part < 3 {
            router.kill_9(&mut chaos);
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    h.wait_consumers().await;
    assert_eq!(close_router_connections(&h.prefix), 2);
    chaos.forced_closes += 1;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The broker application stops and starts with messages in every bucket.
    eprintln!("chaos {queue_type}: stop_app / start_app");
    rabbitmqctl(&["stop_app"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);
    chaos.app_restarts += 1;
    h.reconnect().await;
    h.wait_consumers().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    router.kill_9(&mut chaos);
    h.wait_consumers().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(close_router_connections(&h.prefix), 2);
    chaos.forced_closes += 1;

    let copies = collect(&h, &q, n, Duration::from_secs(5), SETTLE_WITHIN).await;
    let parked_depth = h.depth(h.names.parked.as_str()).await as usize;
    let parked = if parked_depth > 0 {
        collect(
            &h,
            h.names.parked.as_str(),
            parked_depth,
            Duration::from_secs(1),
            Duration::from_secs(30),
        )
        .await
    } else {
        BTreeMap::new()
    };
    let delivered: usize = copies.values().map(Vec::len).sum();
    let accounted: BTreeSet<i64> = copies.keys().chain(parked.keys()).copied().collect();
    let lost = n - accounted.len();
    let duplicated = delivered - copies.len();
    let unstable = copies
        .values()
        .filter(|ids| ids.iter().collect::<BTreeSet<_>>().len() > 1)
        .count();
    println!(
        "chaos {queue_type}: sent {n}, delivered {} (distinct), lost {lost}, duplicated {duplicated}, parked {}, \
         ids stable {}/{} — {} kill -9, {} forced connection closes, {} stop_app/start_app, {:.0} s, router {}",
        copies.len(),
        parked.len(),
        copies.len() - unstable,
        copies.len(),
        chaos.kills,
        chaos.forced_closes,
        chaos.app_restarts,
        started.elapsed().as_secs_f64(),
        router_bin().display()
    );
    // Which publish part the copies came from (the faults follow each part).
    let mut by_part = [0usize; 4];
    for (seq, ids) in &copies {
        by_part[(*seq as usize * 4 / n).min(3)] += ids.len() - 1;
    }
    println!("chaos {queue_type}: duplicated by publish part {by_part:?}");
    if lost > 0 || !parked.is_empty() {
        let missing: Vec<i64> = (0..n as i64)
            .filter(|s| !accounted.contains(s))
            .take(20)
            .collect();
        eprintln!("missing seqs (first 20): {missing:?}");
        eprintln!("router log: {}", log.display());
    }
    assert_eq!(lost, 0, "messages lost");
    assert!(parked.is_empty(), "messages parked: {parked:?}");
    assert_eq!(unstable, 0, "a message arrived with different ids");
    // At most 10 % (issue 12). Release router, default settings: 1.6-5.0 %;
    // the debug build 5.6-6.5 %; before the publish gate and the abandoning
    // of unpublished deliveries on a fault 4-6 % and 15-17 %; 185 % with a
    // window of 5000 (README, Measured under chaos).
    assert!(
        duplicated <= n / 10,
        "{duplicated} duplicates for {n} messages (more than 10 %)"
    );
    router.process.kill_9();
    let _ = std::fs::remove_file(&path);
    if std::env::var_os("CHAOS_KEEP_LOG").is_some() {
        eprintln!("router log: {}", log.display());
    } else {
        let _ = std::fs::remove_file(&log);
    }
    h.cleanup().await;
}

#[tokio::test]
#[ignore = "restarts the shared broker: run on its own (scripts/test does, after the suite)"]
async fn chaos_classic_buckets() {
    run("classic").await;
}

#[tokio::test]
#[ignore = "restarts the shared broker: run on its own (scripts/test does, after the suite)"]
async fn chaos_quorum_buckets() {
    run("quorum").await;
}
