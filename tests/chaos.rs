//! The chaos test: 20,000 persistent messages with delays across a short
//! ladder, while the router is killed with SIGKILL several times, the broker
//! closes its connections, and the broker application is stopped and started
//! once. At the end: sent, delivered, lost, duplicated, parked, for classic
//! and for quorum buckets.
//!
//! Nothing may be lost, with one exception RabbitMQ makes: a classic queue
//! dead-letters at most once, and what a classic bucket dead-letters while
//! the broker stops is dropped (measured without the router: README,
//! Guarantees). So with classic buckets a lost message passes only if the
//! router's log shows it was last placed in a bucket whose TTL ran out while
//! `stop_app` ran; any other loss fails, and with quorum buckets any loss.
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
//!
//! The router logs each decision with the message's id (its pipeline at
//! debug), so a lost message can be followed: the test derives the id the
//! router gave it and prints every line of the log that names it.

mod common;
use common::*;
use delay_router::core::identity;
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicPublishOptions};
use lapin::types::AMQPValue;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const LADDER: &[&str] = &["1s", "2s", "4s"];
/// Delays spread over 0 to 10 s: most messages wait in buckets (and cascade
/// through several) while the chaos happens.
const MAX_DELAY_MS: i64 = 10_000;
/// How long to wait for the last messages: a quorum queue re-sends
/// dead-letters whose confirm was lost only after 180 s; a classic queue
/// never re-sends, and the router reconnects within 30 s.
fn settle_within(queue_type: &str) -> Duration {
    Duration::from_secs(if queue_type == "quorum" { 300 } else { 90 })
}
/// The router's log filter: every decision with its message id.
const TRACE: &str = "info,lapin::channel=off,delay_router::router::pipeline=debug";

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
        let process = spawn_binary_logging(&path, &log, Some(TRACE));
        Self { process, path, log }
    }
    /// SIGKILL and start again.
    fn kill_9(&mut self, chaos: &mut Chaos) {
        self.process.kill_9();
        chaos.kills += 1;
        self.process = spawn_binary_logging(&self.path, &self.log, Some(TRACE));
    }
}

/// Message `i`: its delay, properties and body.
fn message(q: &str, i: usize) -> (BasicProperties, Vec<u8>) {
    let delay = (i as i64 * 7_919) % MAX_DELAY_MS;
    let p = to_queue(q, AMQPValue::LongLongInt(delay)).with_delivery_mode(2);
    let mut hd = p.headers().clone().unwrap();
    hd.insert("seq".into(), AMQPValue::LongLongInt(i as i64));
    (p.with_headers(hd), format!("chaos {i}").into_bytes())
}

/// The id the router derives at ingress for message `i` (it has none).
fn derived_id(h: &Harness, q: &str, i: usize) -> String {
    let (p, body) = message(q, i);
    identity::derive(&p, h.names.router_exchange.as_str(), "k", &body)
}

/// Publishes messages `range` persistent, with confirms, 500 at a time.
async fn publish(h: &Harness, q: &str, range: std::ops::Range<usize>) {
    let ids: Vec<usize> = range.collect();
    for batch in ids.chunks(500) {
        let mut confirms = Vec::with_capacity(batch.len());
        for &i in batch {
            let (p, body) = message(q, i);
            let confirm =
                h.ch.basic_publish(
                    h.names.router_exchange.clone(),
                    "k".into(),
                    BasicPublishOptions::default(),
                    &body,
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
    let mut extra = format!("[topology]\nqueue_type = \"{queue_type}\"\n");
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
    let stop_began = std::time::SystemTime::now();
    eprintln!("chaos {queue_type}: stop_app at {}", now());
    rabbitmqctl(&["stop_app"]);
    let stopped = std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("chaos {queue_type}: start_app at {}", now());
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);
    eprintln!("chaos {queue_type}: started at {}", now());
    chaos.app_restarts += 1;
    h.reconnect().await;
    h.wait_consumers().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    router.kill_9(&mut chaos);
    h.wait_consumers().await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(close_router_connections(&h.prefix), 2);
    chaos.forced_closes += 1;

    let copies = collect(&h, &q, n, Duration::from_secs(5), settle_within(queue_type)).await;
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
    // The ids are derived from content (what lets the log be followed).
    if let Some((&seq, ids)) = copies.iter().next() {
        assert_eq!(
            ids[0],
            derived_id(&h, &q, seq as usize),
            "seq {seq} did not arrive with the id derived from its content"
        );
    }
    if lost > 0 || !parked.is_empty() {
        let missing: Vec<i64> = (0..n as i64)
            .filter(|s| !accounted.contains(s))
            .take(20)
            .collect();
        eprintln!("missing seqs (first 20): {missing:?}");
        eprintln!("router log: {}", log.display());
        follow(&h, &q, &missing, &log);
    }
    if lost > 0 && queue_type == "classic" {
        // What RabbitMQ dropped: last placed in a bucket that expired while
        // the broker stopped (its queues stop after the connections close).
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let window = (stop_began - Duration::from_secs(5))..=(stopped + Duration::from_secs(1));
        let unexplained: Vec<i64> = (0..n as i64)
            .filter(|s| !accounted.contains(s))
            .filter(|&s| {
                let id = derived_id(&h, &q, s as usize);
                let last = text.lines().rev().find(|l| l.contains(&id));
                !last
                    .and_then(expires_at)
                    .is_some_and(|at| window.contains(&at))
            })
            .collect();
        println!(
            "chaos {queue_type}: {} of the {lost} lost were last placed in a classic bucket whose TTL \
             ran out while stop_app ran (RabbitMQ's at-most-once dead-lettering)",
            lost - unexplained.len()
        );
        assert!(
            unexplained.is_empty(),
            "messages lost that no classic bucket dropped at the stop: {unexplained:?}"
        );
    } else {
        assert_eq!(lost, 0, "messages lost");
    }
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

/// When the bucket a `placed` line of the router's log names expires what it
/// placed: the line's time plus the bucket's TTL. `None` for other lines.
fn expires_at(line: &str) -> Option<std::time::SystemTime> {
    if !line.contains(" placed ") {
        return None;
    }
    let at = humantime::parse_rfc3339_weak(line.split_whitespace().next()?).ok()?;
    let ttl: u64 = line
        .split_once("ttl_ms=")?
        .1
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some(at + Duration::from_millis(ttl))
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// Prints what the router's log says of each missing message: every line
/// naming the id the router derived for it.
fn follow(h: &Harness, q: &str, missing: &[i64], log: &std::path::Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for &seq in missing {
        let id = derived_id(h, q, seq as usize);
        eprintln!("seq {seq} ({id}) in the router's log:");
        for line in text.lines().filter(|l| l.contains(&id)) {
            eprintln!("  {line}");
        }
    }
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

/// A `placed` line as the router writes it (from a run that lost three
/// messages at the stop) gives its time plus the TTL; other lines none.
#[test]
fn a_placed_line_gives_when_its_bucket_expires_it() {
    let line = "2026-11-27T07:18:56.484989Z DEBUG pipeline{source=\"ingress\"}: \
                delay_router::router::pipeline: placed message_id=\"dr-48d01118e33b24afa21ead86d519f9dd\" \
                redelivered=false bucket=drt-328c3c31.bucket.8s ttl_ms=8000";
    let at = expires_at(line).expect("a placed line");
    assert_eq!(
        humantime::format_rfc3339_micros(at).to_string(),
        "2026-11-27T07:19:04.484989Z"
    );
    let delivering = "2026-11-27T07:18:56.484989Z DEBUG pipeline{source=\"expired\"}: \
                      delay_router::router::pipeline: delivering message_id=\"dr-1\" \
                      redelivered=false exchange=(default) routing_key=q hold_ms=0";
    assert_eq!(expires_at(delivering), None);
}
