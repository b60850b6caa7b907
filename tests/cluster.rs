//! The cluster chaos test: a 3-node RabbitMQ 4.3 cluster (scripts/ensure-rabbitmq4
//! --nodes 3), quorum buckets, two routers started with the same list of
//! nodes, 20,000 persistent messages with delays from 0 to 10 s over a
//! 1s/2s/4s/8s ladder. While they are sent and wait: `stop_app` on the node
//! leading the most bucket queues, kill -9 of the Erlang VM of the node a
//! router uses and its restart, SIGKILL of one router, forced connection
//! closes, and a rolling restart of all three nodes with messages waiting.
//! Then every message is counted: sent, delivered, lost, duplicated, parked,
//! early, lateness p50/p99/max, and each fault's worst lateness.
//!
//! It restarts the cluster's nodes, so it is `#[ignore]`d and run on its own
//! (scripts/test does, after the 4.3 suite):
//!
//!     cargo test --test cluster -- --ignored --nocapture
//!
//! CLUSTER_MESSAGES sets the number of messages (default 20,000), CLUSTER_RATE
//! the rate (default 50 a second), CLUSTER_STALL_MS the lateness past which a
//! message counts as stalled (default 10,000 ms).

mod common;
use common::*;
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::process::Command;

const NODES: [(&str, u16); 3] = [
    ("rabbit1@localhost", 5682),
    ("rabbit2@localhost", 5683),
    ("rabbit3@localhost", 5684),
];
const LADDER: &[&str] = &["1s", "2s", "4s", "8s"];
const MAX_DELAY_MS: i64 = 10_000;
/// The routers' log filter: every decision, with its message id.
const TRACE: &str = "info,lapin::channel=off,delay_router::router::pipeline=debug";
/// Later than this (CLUSTER_STALL_MS), a message has stalled: the test names
/// where it lost the time, prints the brokers' log lines of that time and,
/// for a stall away from the faults, keeps the routers' logs.
const STALL_MS: i64 = 10_000;
/// A quorum bucket whose dead-letter target was down retries after this.
const SETTLE_WITHIN: Duration = Duration::from_secs(300);

fn script(name: &str) -> String {
    format!("{}/scripts/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn node_url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// rabbitmqctl on one node. Asynchronous, like every command here: a blocking
/// wait would stall the publisher and the collector on the test's runtime
/// and show up as lateness that the cluster did not cause.
async fn ctl(node: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(script("rabbitmqctl4"))
        .args(["-n", node])
        .args(args)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

async fn ensure_cluster() {
    let status = Command::new(script("ensure-rabbitmq4"))
        .args(["--nodes", "3"])
        .status()
        .await
        .expect("scripts/ensure-rabbitmq4");
    assert!(
        status.success(),
        "the 3-node RabbitMQ 4 cluster is not available"
    );
}

/// The node leading the most of these quorum queues.
async fn busiest_leader(queues: &[String]) -> &'static str {
    let mut listing = String::new();
    for (n, _) in NODES {
        if let Ok(l) = ctl(n, &["list_queues", "-q", "name", "leader"]).await {
            listing = l;
            break;
        }
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for line in listing.lines() {
        let mut cols = line.split_whitespace();
        if let (Some(q), Some(leader)) = (cols.next(), cols.next())
            && queues.iter().any(|b| b == q)
            && let Some((n, _)) = NODES.iter().find(|(n, _)| *n == leader)
        {
            *counts.entry(n).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, c)| *c)
        .map_or(NODES[0].0, |(n, _)| n)
}

/// kill -9 of a node's Erlang VM.
async fn kill_node(node: &str) {
    let pid = ctl(node, &["eval", "os:getpid()."])
        .await
        .expect("the node's OS pid");
    let pid = pid.trim().trim_matches('"');
    let status = Command::new("kill")
        .args(["-9", pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

/// Every broker call of the test's own publisher and collector is bounded:
/// a node stopping in the middle of one must not hang the test (a collector
/// waiting forever on a closed connection once stopped one run).
const BROKER_WAIT: Duration = Duration::from_secs(10);
/// A collector that gets nothing this long consumes again on a new connection,
/// in case the broker stopped delivering to it without a word.
const COLLECTOR_IDLE: Duration = Duration::from_secs(15);

async fn bounded<T, E>(call: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(BROKER_WAIT, call).await.ok()?.ok()
}

/// Connects to the first node that answers, retrying for a while.
async fn connect_any() -> Connection {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for (_, port) in NODES {
            if let Ok(Ok(c)) = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&node_url(port), ConnectionProperties::default()),
            )
            .await
            {
                return c;
            }
        }
        assert!(Instant::now() < deadline, "no node of the cluster answers");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The messages' send times and delays, by id.
type Sent = Arc<Mutex<HashMap<usize, (Instant, i64)>>>;

/// Publishes messages 0..n at `rate` per second, in batches with confirms,
/// reconnecting (and sending a batch again) when a node goes away.
fn publish_paced(
    prefix: String,
    dest: String,
    n: usize,
    rate: usize,
    sent: Sent,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        const BATCH: usize = 25;
        let exchange = format!("{prefix}.router");
        let start = Instant::now();
        let mut ch: Option<(Connection, lapin::Channel)> = None;
        let mut next = 0;
        while next < n {
            let due = start + Duration::from_secs_f64(next as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
            if ch.is_none() {
                let conn = connect_any().await;
                let Some(c) = bounded(conn.create_channel()).await else {
                    continue;
                };
                if bounded(c.confirm_select(ConfirmSelectOptions::default()))
                    .await
                    .is_none()
                {
                    continue;
                }
                ch = Some((conn, c));
            }
            let (_, c) = ch.as_ref().unwrap();
            let batch = next..(next + BATCH).min(n);
            let mut confirms = Vec::new();
            let mut ok = true;
            for i in batch.clone() {
                let delay = (i as i64 * 7_919) % (MAX_DELAY_MS + 1);
                let props = to_queue(&dest, AMQPValue::LongLongInt(delay))
                    .with_delivery_mode(2)
                    .with_message_id(i.to_string().into());
                sent.lock()
                    .unwrap()
                    .entry(i)
                    .or_insert((Instant::now(), delay));
                match bounded(c.basic_publish(
                    exchange.as_str().into(),
                    "k".into(),
                    BasicPublishOptions::default(),
                    b"cluster",
                    props,
                ))
                .await
                {
                    Some(confirm) => confirms.push(confirm),
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            for confirm in confirms {
                ok &= matches!(bounded(confirm).await, Some(c) if c.is_ack());
            }
            if ok {
                next = batch.end;
            } else {
                // Unconfirmed: sent again on a new connection (a duplicate
                // at most, with the same message id).
                if let Some((conn, _)) = ch.take() {
                    let _ = bounded(conn.close(200, "publish failed".into())).await;
                }
            }
        }
    })
}

/// Arrival times of every copy of each message, by sequence number.
type Arrivals = Arc<Mutex<BTreeMap<usize, Vec<Instant>>>>;

/// Every copy of every message that reached `dest`, with its arrival time,
/// consuming through whatever node answers until `stop`.
fn collect(
    dest: String,
    stop: tokio_util::sync::CancellationToken,
) -> (Arrivals, tokio::task::JoinHandle<()>) {
    let arrived: Arrivals = Arc::default();
    let sink = arrived.clone();
    let task = tokio::spawn(async move {
        while !stop.is_cancelled() {
            let conn = connect_any().await;
            let Some(ch) = bounded(conn.create_channel()).await else {
                continue;
            };
            let _ = bounded(ch.basic_qos(1000, BasicQosOptions::default())).await;
            let Some(mut consumer) = bounded(ch.basic_consume(
                dest.as_str().into(),
                "collector".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ))
            .await
            else {
                continue;
            };
            let why = loop {
                tokio::select! {
                    () = stop.cancelled() => break "stopped",
                    next = tokio::time::timeout(COLLECTOR_IDLE, consumer.next()) => match next {
                        Ok(Some(Ok(d))) => {
                            let id: usize = d.properties.message_id().as_ref().unwrap().as_str().parse().unwrap();
                            sink.lock().unwrap().entry(id).or_default().push(Instant::now());
                            if bounded(d.ack(BasicAckOptions::default())).await.is_none() {
                                break "an ack failed or hung";
                            }
                        }
                        Ok(_) => break "the consumer ended",
                        Err(_) => break "nothing delivered for a while",
                    }
                }
            };
            if why != "stopped" {
                eprintln!("cluster collector: {why}; consuming again");
            }
            let _ = bounded(conn.close(200, "collected".into())).await;
        }
    });
    (arrived, task)
}

/// A fault, and the window of due times whose messages it may have made late.
struct Fault {
    what: String,
    start: Instant,
    end: Instant,
    /// Messages due this long before the start count (they may be in flight).
    before: Duration,
    /// Messages due this long after the end count.
    after: Duration,
}

impl Fault {
    fn new(what: impl Into<String>, start: Instant) -> Fault {
        Fault {
            what: what.into(),
            start,
            end: Instant::now(),
            before: Duration::from_secs(1),
            after: Duration::from_secs(10),
        }
    }
}

/// The routers of the prefix as `status` sees them: instance -> consume node.
async fn routers(config: &delay_router::config::Config) -> BTreeMap<String, String> {
    match delay_router::commands::status::collect(config).await {
        Ok(s) => s
            .routers
            .into_iter()
            .map(|r| (r.instance, r.consume_node))
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// One decision about a message, from a router's log.
struct Step {
    id: usize,
    at: SystemTime,
    /// When the next step is expected: the bucket's TTL, or the hold.
    then: Duration,
    redelivered: bool,
    what: String,
    line: String,
}

impl Step {
    fn parse(line: &str) -> Option<Step> {
        let at = humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?;
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .map(|v| v.trim_matches('"').to_string())
        };
        let ms = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
        let (then, what) = if line.contains(" placed ") {
            (ms("ttl_ms")?, format!("in {}", field("bucket")?))
        } else if line.contains(" delivering ") {
            (ms("hold_ms")?, "published to the destination".to_string())
        } else {
            return None;
        };
        Some(Step {
            id: field("message_id")?.parse().ok()?,
            at,
            then: Duration::from_millis(then),
            redelivered: field("redelivered").as_deref() == Some("true"),
            what,
            line: line.to_string(),
        })
    }
}

/// Where a message lost the most time: the step that overran what its
/// bucket's TTL (or the router's hold) promised the most.
struct Loss {
    ms: i64,
    /// Where: the step after which the time was lost ("in <bucket>", ...).
    place: String,
    why: String,
    /// When the next step was due, and when it came.
    due: SystemTime,
    came: SystemTime,
    redelivered: bool,
}

fn lost_most(steps: &[Step], sent: SystemTime, arrival: SystemTime) -> Loss {
    let late = |from: SystemTime, to: SystemTime| {
        to.duration_since(from).map_or(0, |d| d.as_millis() as i64)
    };
    let Some(head) = steps.first() else {
        return Loss {
            ms: late(sent, arrival),
            place: "no router logged it".into(),
            why: "no router logged it".into(),
            due: sent,
            came: arrival,
            redelivered: false,
        };
    };
    let mut worst = Loss {
        ms: late(sent, head.at),
        place: "ingress".into(),
        why: "from the sender through the ingress queue to a router".into(),
        due: sent,
        came: head.at,
        redelivered: head.redelivered,
    };
    for pair in steps.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let overrun = late(a.at + a.then, b.at);
        if overrun > worst.ms {
            let why = if b.redelivered {
                format!(
                    "{} was not settled (its channel or node went away); the broker redelivered it",
                    a.what
                )
            } else if a.what.starts_with("in ") {
                format!(
                    "{}: reached a router late (dead-lettering to the expired queue, or its consumer)",
                    a.what
                )
            } else {
                format!("after: {}", a.what)
            };
            worst = Loss {
                ms: overrun,
                place: a.what.clone(),
                why,
                due: a.at + a.then,
                came: b.at,
                redelivered: b.redelivered,
            };
        }
    }
    let last = steps.last().unwrap();
    let tail = late(last.at + last.then, arrival);
    if tail > worst.ms {
        worst = Loss {
            ms: tail,
            place: "destination".into(),
            why: "from the router's publish through the destination queue to the consumer".into(),
            due: last.at + last.then,
            came: arrival,
            redelivered: false,
        };
    }
    worst
}

fn explain(steps: &[Step], sent: SystemTime, arrival: SystemTime) -> String {
    let loss = lost_most(steps, sent, arrival);
    format!("most time lost: {} ms, {}", loss.ms, loss.why)
}

/// The cluster's nodes' log files (scripts/ensure-rabbitmq4).
fn broker_logs() -> Vec<std::path::PathBuf> {
    let root = std::env::var("DELAY_ROUTER_TEST_BROKER_ROOT")
        .unwrap_or_else(|_| "/var/lib/delay-router-test/rabbitmq4/root".into());
    NODES
        .iter()
        .map(|(node, _)| std::path::Path::new(&root).join(format!("var/log/rabbitmq/{node}.log")))
        .collect()
}

/// The nodes' log lines from 10 s before `from` to 5 s after `to` that name
/// one of `needles` (the queues' leader changes are at info level), warnings,
/// errors and, at debug level (RMQ4_LOG_LEVEL=debug), the dead-letter
/// workers' starts and ends: what the broker said while messages stalled.
fn broker_log(from: SystemTime, to: SystemTime, needles: &[String]) -> Vec<String> {
    let (from, to) = (from - Duration::from_secs(10), to + Duration::from_secs(5));
    let mut lines = Vec::new();
    for path in broker_logs() {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let node = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut kept = 0;
        for line in text.lines() {
            // "2026-12-07 19:40:40.123456+00:00 [info] <0.1.0> ..."
            let Some(at) = line
                .get(..26)
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            else {
                continue;
            };
            if at < from || at > to {
                continue;
            }
            let lower = line.to_lowercase();
            let relevant = needles.iter().any(|n| line.contains(n.as_str()))
                || [
                    "rabbit_fifo_dlx_worker",
                    "timed out",
                    "[error]",
                    "[warning]",
                ]
                .iter()
                .any(|w| lower.contains(w));
            if relevant && kept < 40 {
                lines.push(format!(
                    "{node}: {}",
                    line.chars().take(300).collect::<String>()
                ));
                kept += 1;
            }
        }
    }
    lines
}

/// Every decision in the routers' logs, by message id, in time order.
fn steps_by_message(logs: &[std::path::PathBuf]) -> HashMap<usize, Vec<Step>> {
    let mut steps: HashMap<usize, Vec<Step>> = HashMap::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for step in text.lines().map(strip_ansi).filter_map(|l| Step::parse(&l)) {
            steps.entry(step.id).or_default().push(step);
        }
    }
    for s in steps.values_mut() {
        s.sort_by_key(|s| s.at);
    }
    steps
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test]
#[ignore = "restarts the nodes of the RabbitMQ 4 cluster: run on its own (scripts/test does)"]
async fn a_cluster_survives_node_and_router_faults_losing_nothing() {
    ensure_cluster().await;
    let n: usize = std::env::var("CLUSTER_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let started = Instant::now();
    let wall = std::time::SystemTime::now();
    let wall_of = |t: Instant| wall + t.duration_since(started);
    let clock = |t: Instant| humantime::format_rfc3339_millis(wall_of(t));
    let prefix = random_prefix();
    let urls: Vec<String> = NODES
        .iter()
        .map(|(_, p)| format!("\"{}\"", node_url(*p)))
        .collect();
    let extra = format!(
        "[amqp]\nurls = [{}]\n[topology]\nqueue_type = \"quorum\"\n",
        urls.join(", ")
    );
    let path = write_config(&prefix, LADDER, &extra);
    let config = delay_router::config::Config::load(&path).unwrap();
    let log = |k: usize| std::env::temp_dir().join(format!("{prefix}-router{k}.log"));
    // Each decision logged with its message id, to trace the latest messages.
    let spawn = |k: usize| spawn_binary_logging(&path, &log(k), Some(TRACE));
    let mut a = spawn(1);
    let _b = spawn(2);
    let logs = [log(1), log(2)];
    // The destination: a quorum queue, so it survives node faults too.
    let conn = connect_any().await;
    let ch = conn.create_channel().await.unwrap();
    let dest = format!("{prefix}.dest");
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), s("quorum"));
    ch.queue_declare(dest.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while routers(&config).await.len() < 2 {
        assert!(Instant::now() < deadline, "two routers did not start");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("cluster: routers on {:?}", routers(&config).await);
    let stop = tokio_util::sync::CancellationToken::new();
    let (arrived, collector) = collect(dest.clone(), stop.clone());
    let sent: Sent = Arc::default();
    let rules = delay_router::core::decision::Rules::from_config(&config);
    let buckets: Vec<String> = rules
        .topology()
        .bucket_names()
        .iter()
        .map(|q| q.to_string())
        .collect();
    let mut faults = Vec::new();
    // A steady stream while the faults happen, so that lateness away from
    // them measures the cluster, not a backlog of our own making.
    let rate: usize = std::env::var("CLUSTER_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let publisher = publish_paced(prefix.clone(), dest.clone(), n, rate, sent.clone());
    let sending = Duration::from_secs_f64(n as f64 / rate as f64);
    // The faults, spread over the sending, after a quiet first part.
    let began = Instant::now();
    let at = |fraction: f64| tokio::time::Instant::from(began + sending.mul_f64(fraction));

    // 1. stop_app on the node leading the most bucket queues.
    tokio::time::sleep_until(at(0.15)).await;
    let leader = busiest_leader(&buckets).await;
    let start = Instant::now();
    ctl(leader, &["stop_app"]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    ctl(leader, &["start_app"]).await.unwrap();
    ctl(leader, &["await_startup"]).await.unwrap();
    faults.push(Fault::new(
        format!("stop_app/start_app of {leader}, leading the most buckets"),
        start,
    ));

    // 2. kill -9 of the node a router uses, and its restart.
    tokio::time::sleep_until(at(0.3)).await;
    let before = routers(&config).await;
    let victim = before
        .values()
        .next()
        .and_then(|url| NODES.iter().find(|(_, p)| url.contains(&format!(":{p}/"))))
        .map_or(NODES[1].0, |(nd, _)| nd);
    let start = Instant::now();
    kill_node(victim).await;
    // A router whose node died resumes through another node.
    let moved = loop {
        let now = routers(&config).await;
        let on_victim = now.values().any(|u| {
            NODES
                .iter()
                .any(|(nd, p)| *nd == victim && u.contains(&format!(":{p}/")))
        });
        if now.len() == 2 && !on_victim {
            break start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the routers did not leave the dead node"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ensure_cluster().await;
    faults.push(Fault::new(
        format!(
            "kill -9 of {victim} (its router resumed on another node within {:.1} s) and restart",
            moved.as_secs_f64()
        ),
        start,
    ));

    // 3. SIGKILL of one router, started again 10 s later; the other keeps delivering.
    tokio::time::sleep_until(at(0.45)).await;
    let start = Instant::now();
    a.kill_9();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let restart = Instant::now();
    a = spawn(1);
    faults.push(Fault::new(
        "SIGKILL of one router, restarted after 10 s",
        start,
    ));
    // The other router alone: messages due from 1 s after the kill until the
    // restart were not in flight in the killed router.
    faults.push(Fault {
        what: "the other router alone (not in flight at the SIGKILL)".into(),
        start: start + Duration::from_secs(1),
        end: restart,
        before: Duration::ZERO,
        after: Duration::ZERO,
    });

    // 4. Forced connection closes of both routers.
    tokio::time::sleep_until(at(0.6)).await;
    let start = Instant::now();
    let mut listing = String::new();
    for (nd, _) in NODES {
        if let Ok(l) = ctl(nd, &["list_connections", "-q", "pid", "client_properties"]).await {
            listing.push_str(&l);
        }
    }
    for line in listing.lines().filter(|l| {
        l.contains(&format!("delay-router consume {prefix}"))
            || l.contains(&format!("delay-router publish {prefix}"))
    }) {
        if let Some(pid) = line.split('\t').next() {
            for (nd, _) in NODES {
                if ctl(nd, &["close_connection", pid, "test: forced close"])
                    .await
                    .is_ok()
                {
                    break;
                }
            }
        }
    }
    faults.push(Fault::new(
        "forced close of the routers' connections",
        start,
    ));

    // 5. Rolling restart of all three nodes, messages waiting in every bucket.
    tokio::time::sleep_until(at(0.7)).await;
    let start = Instant::now();
    for (node, _) in NODES {
        // The whole node (Erlang VM) stops, then starts again.
        ctl(node, &["stop"]).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        ensure_cluster().await;
    }
    faults.push(Fault::new("rolling restart of the three nodes", start));
    publisher.await.unwrap();

    // Everything arrives, at least once.
    let deadline = Instant::now() + SETTLE_WITHIN;
    while arrived.lock().unwrap().len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let _ = collector.await;
    let arrived = arrived.lock().unwrap().clone();
    let sent = sent.lock().unwrap().clone();
    let lost: Vec<usize> = (0..n).filter(|i| !arrived.contains_key(i)).collect();
    let duplicated: usize = arrived.values().map(|v| v.len() - 1).sum();
    let parked =
        delay_router::broker::probe::depth(&conn, &format!("{prefix}.parked").as_str().into())
            .await
            .ok()
            .flatten()
            .unwrap_or(0);
    let mut late: Vec<i64> = Vec::new();
    let mut early = 0;
    let mut quiet: Vec<i64> = Vec::new();
    let mut stalled: Vec<(usize, bool)> = Vec::new();
    let stall_ms: i64 = std::env::var("CLUSTER_STALL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STALL_MS);
    let mut during: Vec<Vec<(i64, usize)>> = vec![Vec::new(); faults.len()];
    for (i, copies) in &arrived {
        let (t0, delay) = sent[i];
        let first = copies.iter().min().unwrap();
        let lateness = first.duration_since(t0).as_millis() as i64 - delay;
        if lateness < 0 {
            early += 1;
        }
        late.push(lateness);
        let due = t0 + Duration::from_millis(delay as u64);
        let mut in_fault = false;
        for (k, f) in faults.iter().enumerate() {
            if due + f.before >= f.start && due <= f.end + f.after {
                in_fault = true;
                during[k].push((lateness, *i));
            }
        }
        if !in_fault {
            quiet.push(lateness);
        }
        if lateness > stall_ms {
            stalled.push((*i, in_fault));
        }
    }
    late.sort_unstable();
    quiet.sort_unstable();
    eprintln!(
        "cluster: sent {n}, delivered {} (distinct), lost {}, duplicated {duplicated}, parked {parked}, early {early}; \
         lateness p50 {} ms, p99 {} ms, max {} ms; away from faults ({} messages) p50 {} ms, p99 {} ms, max {} ms; \
         {rate} msg/s, {:.0} s",
        arrived.len(),
        lost.len(),
        percentile(&late, 0.5),
        percentile(&late, 0.99),
        late.last().copied().unwrap_or(0),
        quiet.len(),
        percentile(&quiet, 0.5),
        percentile(&quiet, 0.99),
        quiet.last().copied().unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    let steps = steps_by_message(&logs);
    for (f, mut d) in faults.iter().zip(during) {
        d.sort_unstable();
        let l: Vec<i64> = d.iter().map(|(l, _)| *l).collect();
        let worst = d.last().map_or(String::new(), |(l, i)| {
            let (t0, delay) = sent[i];
            let due = t0 + Duration::from_millis(delay as u64);
            let offset = due.saturating_duration_since(f.start).as_secs_f64()
                - f.start.saturating_duration_since(due).as_secs_f64();
            format!(
                "{l} ms (message {i}, delay {delay} ms, due {offset:+.1} s from the fault's start)"
            )
        });
        eprintln!(
            "cluster fault: {} (from {} to {}): {} messages due from {:.0} s before to {:.0} s after: p50 {} ms, p99 {} ms, worst {worst}",
            f.what,
            clock(f.start),
            clock(f.end),
            l.len(),
            f.before.as_secs_f64(),
            f.after.as_secs_f64(),
            percentile(&l, 0.5),
            percentile(&l, 0.99),
        );
        // The latest message's path, from the routers' logs, and where it
        // lost the most time.
        if let Some((_, i)) = d.last() {
            let (t0, delay) = sent[i];
            let steps = steps.get(i).map_or(&[][..], |s| &s[..]);
            let first = *arrived[i].iter().min().unwrap();
            eprintln!(
                "  message {i}: sent {}, due {}, first arrival {}; {}",
                clock(t0),
                clock(t0 + Duration::from_millis(delay as u64)),
                clock(first),
                explain(steps, wall_of(t0), wall_of(first))
            );
            for step in steps {
                eprintln!("    {}", step.line);
            }
        }
    }
    // Messages more than stall_ms late, grouped by where they lost the time:
    // a bucket that released them late, a queue that redelivered them.
    let mut stalls: BTreeMap<(String, bool), Vec<(Loss, bool)>> = BTreeMap::new();
    for (i, in_fault) in &stalled {
        let (t0, _) = sent[i];
        let first = *arrived[i].iter().min().unwrap();
        let steps = steps.get(i).map_or(&[][..], |s| &s[..]);
        let loss = lost_most(steps, wall_of(t0), wall_of(first));
        stalls
            .entry((loss.place.clone(), loss.redelivered))
            .or_default()
            .push((loss, *in_fault));
    }
    let away_stalled = stalled.iter().filter(|(_, f)| !f).count();
    for ((place, redelivered), losses) in &stalls {
        let time = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let due = (
            losses.iter().map(|(l, _)| l.due).min().unwrap(),
            losses.iter().map(|(l, _)| l.due).max().unwrap(),
        );
        let came = (
            losses.iter().map(|(l, _)| l.came).min().unwrap(),
            losses.iter().map(|(l, _)| l.came).max().unwrap(),
        );
        eprintln!(
            "cluster stall: {} messages over {} s late ({} away from faults), {} ({}redelivered): \
             due there from {} to {}, came from {} to {}",
            losses.len(),
            stall_ms as f64 / 1000.0,
            losses.iter().filter(|(_, f)| !f).count(),
            losses[0].0.why,
            if *redelivered { "" } else { "not " },
            time(due.0),
            time(due.1),
            time(came.0),
            time(came.1),
        );
        // The queues the time was lost in, as the brokers' logs name them.
        let queue = match place.as_str() {
            "ingress" => format!("{prefix}.ingress"),
            "destination" => dest.clone(),
            bucket => bucket.strip_prefix("in ").unwrap_or(bucket).to_string(),
        };
        let needles = [queue, format!("{prefix}.expired")];
        for line in broker_log(due.0, came.1, &needles) {
            eprintln!("    {line}");
        }
    }
    let keep_logs = away_stalled > 0 || !lost.is_empty();
    if keep_logs {
        eprintln!(
            "cluster: {away_stalled} messages away from faults over {} s late; router logs kept: {} {}; broker logs: {}",
            stall_ms as f64 / 1000.0,
            log(1).display(),
            log(2).display(),
            broker_logs()
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    if !lost.is_empty() {
        eprintln!("lost (first 20): {:?}", &lost[..lost.len().min(20)]);
    }
    assert!(lost.is_empty(), "messages lost");
    assert_eq!(early, 0, "messages early");
    assert_eq!(parked, 0, "messages parked");
    a.kill_9();
    drop(_b);
    // Remove what the test declared.
    let conn = connect_any().await;
    let ch = conn.create_channel().await.unwrap();
    delay_router::testkit::teardown::remove_topology(&ch, &rules, &[dest]).await;
    let _ = std::fs::remove_file(&path);
    // The routers' logs (3 MB each at this trace level) stay only when an
    // assertion above failed or messages stalled away from the faults.
    if !keep_logs {
        for k in [1, 2] {
            let _ = std::fs::remove_file(log(k));
        }
    }
}
