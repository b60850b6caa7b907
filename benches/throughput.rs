//! Throughput: messages/s the router moves from its ingress queue into a bucket,
//! against RabbitMQ's own shovel (ack-mode on-confirm) moving the same messages
//! between two durable queues, in the same run on the same broker.
//!
//! Both drain a prefilled queue of persistent 512-byte messages with confirms
//! and acks. The rate is measured from the first message moved to the last
//! (start-up excluded for both); each round runs both, alternating.
//!
//! The shovel runs twice a round: between two plain classic queues (the
//! reference the issue set), and from the router's own ingress into the
//! bucket the router would place the messages in (queues declared by the
//! router's rules: dead-letter arguments on the ingress, TTL and
//! dead-lettering on the bucket), so that both movers meet the same queues.
//!
//! The router is the release binary in its own process, as users run it, with
//! the shipped prefetch unless BENCH_PREFETCH says otherwise.
//!
//! Beside the rates it prints the CPU per message of each drain: the
//! router's, and the broker's (beam.smp, from /proc; BENCH_BROKER_PID or
//! `rabbitmqctl eval`) while the router drains and while the shovel does
//! (the shovel runs inside the broker, so its own work is in that figure).
//!
//! BENCH_SHOVEL_SHAPE=placed: the shovel moves messages shaped as the router's
//! output (its transit headers and derived `message-id`, about 200 bytes of
//! properties more than the senders' messages), not as its input.
//! BENCH_FLOOR_SHAPE=placed does the same for the floor (below), so that it
//! and the router publish the same bytes into the bucket.
//!
//! `cargo bench --bench throughput` (env: BENCH_MESSAGES=30000 BENCH_ROUNDS=5).
//! BENCH_BASELINE=/path/to/another/delay-router adds that binary to every
//! round (same broker, same run), to compare two builds of the router;
//! BENCH_BIN=/path/to/delay-router replaces the one `cargo bench` built.
//! BENCH_PREFETCH and BENCH_BASELINE_PREFETCH set `amqp.prefetch` for the
//! router and for the baseline; a router's drain counts every queue of the
//! bucket's rung (its binary's built-in number of queues a rung).
//!
//! Every round also runs the floor (benches/floor): lapin alone moving the
//! same messages between two queues as the router moves them (two
//! connections, the same prefetch, confirms, acks with `multiple`), in a
//! process of its own, so the rates and CPU per message say what part of
//! the router's cost is its own and what part is lapin's and the runtime's.
//! BENCH_FLOOR=0 leaves it out.
//!
//! BENCH_FLOOR_SHARDS=k: the floor publishes over k queues of the bucket's
//! rung in turn (each on its own channel), as the router places over a
//! rung's queues; one otherwise.
//!
//! BENCH_QUEUE_TYPE=quorum: every queue of the run (the router's, the
//! floor's, the shovel's plain pair) a quorum queue; classic otherwise.

mod floor;
mod procfs;

// The floor runs in this binary's process (re-executed), with the router's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use delay_router::broker;
use delay_router::config::Config;
use delay_router::core::decision::{Action, Rules};
use delay_router::core::identity;
use delay_router::core::topology::{QueueType, queue_arguments};
use delay_router::testkit::decide;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::process::Command;
use std::time::{Duration, Instant};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const BODY: usize = 512;
const WINDOW: usize = 2000;
const POLL: Duration = Duration::from_millis(5);

/// The type of every queue of the run (BENCH_QUEUE_TYPE, classic unless set).
fn queue_type() -> QueueType {
    std::env::var("BENCH_QUEUE_TYPE").map_or(QueueType::Classic, |t| {
        t.parse().expect("BENCH_QUEUE_TYPE: classic or quorum")
    })
}

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn props() -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(
        "x-requested-delay".into(),
        AMQPValue::LongString(LongString::from("30m")),
    );
    h.insert(
        "x-original-exchange".into(),
        AMQPValue::LongString(LongString::from("")),
    );
    h.insert(
        "x-original-routing-key".into(),
        AMQPValue::LongString(LongString::from("bench.nowhere")),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(h)
}

/// The properties the router gives a message of [`props`] when it places
/// it: its transit headers and a derived `message-id`. BENCH_SHOVEL_SHAPE=placed
/// has the shovel move messages of this shape, so both move the same bytes.
fn placed_props() -> BasicProperties {
    let text = "[amqp]\nurl = \"amqp://127.0.0.1\"\n[topology]\nprefix = \"bench-00000000\"\nqueue_type = \"classic\"\n[[bucket]]\nttl = \"1h\"\n";
    let config = Config::from_toml(text).unwrap();
    let rules = Rules::new(&config.ladder, config.strategy, "bench-00000000", "guest");
    let now_ms = 1_800_000_000_000;
    let Action::Wait { properties, .. } =
        decide::ingress(&rules, &"bench".into(), &props(), now_ms, 0.0)
    else {
        panic!("a 30m delay waits in a bucket")
    };
    let body = vec![b'x'; BODY];
    let id = identity::derive(
        &props(),
        rules.names.router_exchange.as_str(),
        "bench",
        &body,
    );
    properties.with_message_id(id.into())
}

async fn prefill(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    n: usize,
    properties: &BasicProperties,
) {
    let body = vec![b'x'; BODY];
    let mut pending = Vec::with_capacity(WINDOW);
    for _ in 0..n {
        let c = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                &body,
                properties.clone(),
            )
            .await
            .expect("publish");
        pending.push(c);
        if pending.len() == WINDOW {
            for c in pending.drain(..) {
                assert!(c.await.expect("confirm").is_ack());
            }
        }
    }
    for c in pending {
        assert!(c.await.expect("confirm").is_ack());
    }
}

async fn depth(conn: &Connection, queue: &str) -> u32 {
    broker::probe::depth(conn, &queue.into())
        .await
        .expect("depth")
        .unwrap_or(0)
}

async fn wait_depth(conn: &Connection, queue: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while depth(conn, queue).await < n {
        assert!(Instant::now() < deadline, "{queue} never reached {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A drain measured: messages/s from the first moved to the last and, for
/// a process of ours, its CPU per message over the same span and peak RSS.
struct Drain {
    rate: f64,
    cpu_us_per_msg: f64,
    /// The broker's CPU (beam.smp) per message over the same span; for the
    /// shovel's drain it includes the shovel, which runs inside the broker.
    broker_us_per_msg: f64,
    /// Context switches of the router's threads per message (0 for the shovel).
    switches_per_msg: f64,
    /// The share of that process's CPU spent in the kernel (stime).
    system_share: f64,
    rss_kib: u64,
}

/// Polls `dst` until it holds `n`.
async fn drain_rate(
    conn: &Connection,
    dst: &[String],
    n: u32,
    pid: Option<u32>,
    broker: u32,
) -> Drain {
    let start = Instant::now();
    let mut first: Option<(Instant, u32, u64)> = None;
    let (mut switches_before, mut broker_before, mut system_before) = (0, 0, 0);
    loop {
        let mut d = 0;
        for q in dst {
            d += depth(conn, q).await;
        }
        let now = Instant::now();
        if first.is_none() && d > 0 {
            first = Some((now, d, pid.map_or(0, |p| procfs::cpu_and_rss(p).0)));
            switches_before = pid.map_or(0, procfs::context_switches);
            system_before = pid.map_or(0, procfs::system_cpu);
            broker_before = procfs::cpu_and_rss(broker).0;
        }
        if d >= n {
            let (t, base, cpu_before) = first.unwrap();
            let (cpu_after, rss_kib) = pid.map_or((0, 0), procfs::cpu_and_rss);
            let broker_after = procfs::cpu_and_rss(broker).0;
            let switches = pid
                .map_or(0, procfs::context_switches)
                .saturating_sub(switches_before);
            let system = pid
                .map_or(0, procfs::system_cpu)
                .saturating_sub(system_before);
            let moved = f64::from(n - base);
            let secs = (now - t).as_secs_f64();
            return Drain {
                system_share: system as f64 / (cpu_after - cpu_before).max(1) as f64,
                rate: if secs > 0.0 {
                    moved / secs
                } else {
                    f64::INFINITY
                },
                cpu_us_per_msg: (cpu_after - cpu_before) as f64 / moved.max(1.0),
                broker_us_per_msg: broker_after.saturating_sub(broker_before) as f64
                    / moved.max(1.0),
                switches_per_msg: switches as f64 / moved.max(1.0),
                rss_kib,
            };
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "{dst:?} stuck at {d}"
        );
        tokio::time::sleep(POLL).await;
    }
}

fn prefix() -> String {
    format!("bench-{:08x}", rand::random::<u32>())
}

async fn delete_queues(ch: &Channel, queues: &[String]) {
    for q in queues {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

async fn router_round(
    conn: &Connection,
    n: usize,
    binary: &std::path::Path,
    broker: u32,
    prefetch_key: &str,
) -> Drain {
    let prefix = prefix();
    let prefetch = std::env::var(prefetch_key)
        .map(|p| format!("prefetch = \"{p}\"\n"))
        .unwrap_or_default();
    let qt = queue_type();
    let text = format!(
        "[amqp]\nurl = \"{URL}\"\n{prefetch}[topology]\nprefix = \"{prefix}\"\nqueue_type = \"{qt}\"\n[[bucket]]\nttl = \"1h\"\n"
    );
    let config = Config::from_toml(&text).unwrap();
    let rules = Rules::new(&config.ladder, config.strategy, &prefix, "guest")
        .with_bucket_shards(config.bucket_shards)
        .with_queue_type(qt);
    let names = rules.names.clone();
    broker::declare::declare(conn, &rules.topology())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    prefill(&ch, names.router_exchange.as_str(), "bench", n, &props()).await;
    wait_depth(conn, names.ingress.as_str(), n as u32).await;
    // The bucket the router places these messages in, by its own decision.
    let Action::Wait { queue, .. } = decide::ingress(&rules, &"bench".into(), &props(), 0, 0.0)
    else {
        panic!("a 30m delay waits in a bucket")
    };
    // Every queue of that bucket's rung (its shards): the router spreads
    // its placements over them.
    let shard = format!("{queue}.");
    let bucket: Vec<String> = rules
        .topology()
        .bucket_names()
        .into_iter()
        .filter(|q| *q == queue || q.as_str().starts_with(&shard))
        .map(|q| q.to_string())
        .collect();
    // The shipped binary, in its own process, as users run it.
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, &text).unwrap();
    let child = Command::new(binary)
        .args(["run", "--config"])
        .arg(&path)
        // BENCH_ROUTER_LOG: the router's RUST_LOG (its log goes to stderr).
        .env(
            "RUST_LOG",
            std::env::var("BENCH_ROUTER_LOG").unwrap_or_else(|_| "warn".to_owned()),
        )
        .spawn()
        .expect("router binary");
    // Killed if the measurement panics, so no router outlives the bench.
    let mut guard = KillOnDrop(Some(child));
    let pid = guard.0.as_ref().map(std::process::Child::id);
    let drain = drain_rate(conn, &bucket, n as u32, pid, broker).await;
    let mut child = guard.0.take().unwrap();
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "router exited with {status}");
    std::fs::remove_file(path).unwrap();
    delay_router::testkit::teardown::remove_topology(&ch, &rules, &[]).await;
    drain
}

struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl on PATH");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shovel moving `n` prefilled messages: between two plain classic
/// queues, or (`same_queues`) from the router's own ingress into the bucket
/// the router would place them in, as the router and the floor move them.
async fn shovel_round(conn: &Connection, n: usize, broker: u32, same_queues: bool) -> Drain {
    let prefix = prefix();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let (rules, src, dst) = if same_queues {
        let (rules, ingress, bucket) = router_queues(conn, &ch, n, &props()).await;
        (Some(rules), ingress, bucket)
    } else {
        let (src, dst) = (format!("{prefix}.src"), format!("{prefix}.dst"));
        plain_queues(conn, &ch, n, &src, &dst).await;
        (None, src, dst)
    };
    let definition = format!(
        r#"{{"src-protocol":"amqp091","src-uri":"amqp://guest:guest@127.0.0.1","src-queue":"{src}","dest-protocol":"amqp091","dest-uri":"amqp://guest:guest@127.0.0.1","dest-queue":"{dst}","ack-mode":"on-confirm","src-prefetch-count":1000}}"#
    );
    let name = format!("{prefix}-shovel");
    let setter = {
        let (name, definition) = (name.clone(), definition.clone());
        tokio::task::spawn_blocking(move || {
            rabbitmqctl(&["set_parameter", "-q", "shovel", &name, &definition])
        })
    };
    let drain = drain_rate(conn, std::slice::from_ref(&dst), n as u32, None, broker).await;
    setter.await.unwrap();
    rabbitmqctl(&["clear_parameter", "-q", "shovel", &name]);
    match rules {
        Some(rules) => {
            delay_router::testkit::teardown::remove_topology(&ch, &rules, &[]).await;
        }
        None => delete_queues(&ch, &[src, dst]).await,
    }
    drain
}

/// Two plain queues (no arguments but the BENCH_QUEUE_TYPE), `src` prefilled with `n`
/// messages (shaped as BENCH_SHOVEL_SHAPE says).
async fn plain_queues(conn: &Connection, ch: &Channel, n: usize, src: &str, dst: &str) {
    for q in [src, dst] {
        ch.queue_declare(
            q.into(),
            QueueDeclareOptions::durable(),
            queue_arguments(queue_type()),
        )
        .await
        .unwrap();
    }
    let shape = match std::env::var("BENCH_SHOVEL_SHAPE").as_deref() {
        Ok("placed") => placed_props(),
        _ => props(),
    };
    prefill(ch, "", src, n, &shape).await;
    wait_depth(conn, src, n as u32).await;
}

/// The router's topology under a new prefix, its ingress prefilled with `n`
/// messages: the rules and the bucket the router would place them in.
async fn router_queues(
    conn: &Connection,
    ch: &Channel,
    n: usize,
    shape: &BasicProperties,
) -> (Rules, String, String) {
    let prefix = prefix();
    let qt = queue_type();
    let text = format!(
        "[amqp]\nurl = \"{URL}\"\n[topology]\nprefix = \"{prefix}\"\nqueue_type = \"{qt}\"\n[[bucket]]\nttl = \"1h\"\n"
    );
    let config = Config::from_toml(&text).unwrap();
    // BENCH_FLOOR_SHARDS: that many queues a rung (else the type's default).
    let shards = std::env::var("BENCH_FLOOR_SHARDS")
        .ok()
        .map(|s| s.parse::<u8>().expect("BENCH_FLOOR_SHARDS: 1 to 16"));
    let rules = Rules::new(&config.ladder, config.strategy, &prefix, "guest")
        .with_bucket_shards(shards)
        .with_queue_type(qt);
    broker::declare::declare(conn, &rules.topology())
        .await
        .unwrap();
    prefill(ch, rules.names.router_exchange.as_str(), "bench", n, shape).await;
    wait_depth(conn, rules.names.ingress.as_str(), n as u32).await;
    let Action::Wait { queue, .. } = decide::ingress(&rules, &"bench".into(), &props(), 0, 0.0)
    else {
        panic!("a 30m delay waits in a bucket")
    };
    let ingress = rules.names.ingress.to_string();
    (rules, ingress, queue.to_string())
}

/// The floor moving `n` prefilled messages from the router's own ingress
/// into the bucket the router would place them in (benches/floor): the same
/// queues, declared by the router's rules, so the broker's side is the same.
async fn floor_round(conn: &Connection, n: usize, broker: u32) -> Drain {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    // BENCH_FLOOR_SHAPE=placed: the floor moves messages shaped as the
    // router's output, so that it and the router publish the same bytes.
    let shape = match std::env::var("BENCH_FLOOR_SHAPE").as_deref() {
        Ok("placed") => placed_props(),
        _ => props(),
    };
    let (rules, ingress, bucket) = router_queues(conn, &ch, n, &shape).await;
    // BENCH_FLOOR_SHARDS=k: the floor publishes over the rung's first k
    // queues in turn, as the router places over them.
    let k = std::env::var("BENCH_FLOOR_SHARDS").map_or(1, |s| s.parse::<usize>().unwrap_or(1));
    let shard = format!("{bucket}.");
    let buckets: Vec<String> = rules
        .topology()
        .bucket_names()
        .into_iter()
        .filter(|q| q.as_str() == bucket || q.as_str().starts_with(&shard))
        .take(k.max(1))
        .map(|q| q.to_string())
        .collect();
    let child = floor::command(URL, &ingress, &buckets.join(","))
        .spawn()
        .expect("the floor forwarder");
    let mut guard = KillOnDrop(Some(child));
    let pid = guard.0.as_ref().map(std::process::Child::id);
    let drain = drain_rate(conn, &buckets, n as u32, pid, broker).await;
    let mut child = guard.0.take().unwrap();
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the floor exited with {status}");
    delay_router::testkit::teardown::remove_topology(&ch, &rules, &[]).await;
    drain
}

/// Who a round runs.
#[derive(Clone, PartialEq)]
enum Contender {
    Router(std::path::PathBuf),
    Baseline(std::path::PathBuf),
    /// Between plain queues (false), or the router's own (true).
    Shovel(bool),
    Floor,
}

/// The median of sorted values: the mean of the middle two of an even count
/// (before 2026-11-27 this printed the upper one of them).
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists; nothing to list here.
    }
    if floor::run_if_asked() {
        return;
    }
    let with_floor = std::env::var("BENCH_FLOOR").map_or(true, |v| v != "0");
    let n = env_or("BENCH_MESSAGES", 30_000);
    let rounds = env_or("BENCH_ROUNDS", 5);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ensure-rabbitmq");
    let ok = Command::new(script)
        .args(["--plugin", "rabbitmq_shovel"])
        .status()
        .expect("scripts/ensure-rabbitmq");
    assert!(ok.success(), "broker or shovel plugin unavailable");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = Connection::connect(URL, ConnectionProperties::default()).await.expect("broker");
        // BENCH_BIN: the build measured as "router" (else this crate's, as
        // `cargo bench` built it).
        let this = std::env::var_os("BENCH_BIN").map_or_else(
            || std::path::PathBuf::from(env!("CARGO_BIN_EXE_delay-router")),
            std::path::PathBuf::from,
        );
        let baseline = std::env::var_os("BENCH_BASELINE").map(std::path::PathBuf::from);
        let (mut routers, mut shovels, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cpus, mut rss, mut switches) = (Vec::new(), Vec::new(), Vec::new());
        let (mut baselines, mut vs_baseline) = (Vec::new(), Vec::new());
        let (mut router_system, mut floor_system) = (Vec::new(), Vec::new());
        let (mut shovels_same, mut ratios_same, mut broker_shovel_same) = (Vec::new(), Vec::new(), Vec::new());
        let (mut floors, mut floor_vs_shovel, mut router_vs_floor) = (Vec::new(), Vec::new(), Vec::new());
        let (mut floor_cpus, mut floor_switches, mut broker_floor) = (Vec::new(), Vec::new(), Vec::new());
        // The machine's CPU per message: the broker's in each drain, and
        // the router's added to it.
        let broker = procfs::broker_pid();
        let (mut broker_router, mut machine_router, mut broker_shovel) =
            (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            // Rotate who goes first so nobody always runs on a warmer broker.
            let mut contenders = vec![
                Contender::Router(this.clone()),
                Contender::Shovel(false),
                Contender::Shovel(true),
            ];
            if let Some(b) = &baseline {
                contenders.push(Contender::Baseline(b.clone()));
            }
            if with_floor {
                contenders.push(Contender::Floor);
            }
            let len = contenders.len();
            contenders.rotate_left((round - 1) % len);
            let (mut r, mut s, mut s_same, mut b, mut f) = (0.0, 0.0, 0.0, None, None);
            for c in contenders {
                match c {
                    Contender::Floor => {
                        let d = floor_round(&conn, n, broker).await;
                        println!("round {round}: floor CPU {:.1} µs/msg ({:.0} % in the kernel), {:.2} context switches/msg, peak RSS {} KiB; broker CPU {:.1} µs/msg", d.cpu_us_per_msg, 100.0 * d.system_share, d.switches_per_msg, d.rss_kib, d.broker_us_per_msg);
                        floor_system.push(100.0 * d.system_share);
                        floor_cpus.push(d.cpu_us_per_msg);
                        floor_switches.push(d.switches_per_msg);
                        broker_floor.push(d.broker_us_per_msg);
                        f = Some(d.rate);
                    }
                    Contender::Shovel(true) => {
                        let d = shovel_round(&conn, n, broker, true).await;
                        println!("round {round}: shovel between the router's queues: broker CPU {:.1} µs/msg (the shovel included)", d.broker_us_per_msg);
                        broker_shovel_same.push(d.broker_us_per_msg);
                        s_same = d.rate;
                    }
                    Contender::Shovel(false) => {
                        let d = shovel_round(&conn, n, broker, false).await;
                        println!("round {round}: shovel: broker CPU {:.1} µs/msg (the shovel included)", d.broker_us_per_msg);
                        broker_shovel.push(d.broker_us_per_msg);
                        s = d.rate;
                    }
                    Contender::Router(bin) => {
                        let d = router_round(&conn, n, &bin, broker, "BENCH_PREFETCH").await;
                        println!("round {round}: router CPU {:.1} µs/msg ({:.0} % in the kernel), {:.2} context switches/msg, peak RSS {} KiB; broker CPU {:.1} µs/msg", d.cpu_us_per_msg, 100.0 * d.system_share, d.switches_per_msg, d.rss_kib, d.broker_us_per_msg);
                        router_system.push(100.0 * d.system_share);
                        broker_router.push(d.broker_us_per_msg);
                        machine_router.push(d.broker_us_per_msg + d.cpu_us_per_msg);
                        cpus.push(d.cpu_us_per_msg);
                        switches.push(d.switches_per_msg);
                        rss.push(d.rss_kib as f64 / 1024.0);
                        r = d.rate;
                    }
                    Contender::Baseline(bin) => {
                        let d = router_round(&conn, n, &bin, broker, "BENCH_BASELINE_PREFETCH").await;
                        println!("round {round}: baseline CPU {:.1} µs/msg, {:.2} context switches/msg, peak RSS {} KiB; broker CPU {:.1} µs/msg", d.cpu_us_per_msg, d.switches_per_msg, d.rss_kib, d.broker_us_per_msg);
                        b = Some(d.rate);
                    }
                }
            }
            match b {
                Some(b) => {
                    println!("round {round}: router {r:>8.0} msg/s   baseline {b:>8.0} msg/s   shovel {s:>8.0} msg/s   ratio {:.2}   router/baseline {:.2}", r / s, r / b);
                    baselines.push(b);
                    vs_baseline.push(r / b);
                }
                None => println!("round {round}: router {r:>8.0} msg/s   shovel {s:>8.0} msg/s   ratio {:.2}", r / s),
            }
            println!("round {round}: shovel between the router's queues {s_same:>8.0} msg/s   router/that shovel {:.2}", r / s_same);
            shovels_same.push(s_same);
            ratios_same.push(r / s_same);
            if let Some(f) = f {
                println!("round {round}: floor {f:>8.0} msg/s   floor/that shovel {:.2}   router/floor {:.2}", f / s_same, r / f);
                floors.push(f);
                floor_vs_shovel.push(f / s_same);
                router_vs_floor.push(r / f);
            }
            routers.push(r);
            shovels.push(s);
            ratios.push(r / s);
        }
        for v in [&mut routers, &mut shovels, &mut ratios, &mut baselines, &mut vs_baseline, &mut cpus, &mut rss, &mut switches, &mut broker_router, &mut machine_router, &mut broker_shovel, &mut shovels_same, &mut ratios_same, &mut broker_shovel_same, &mut floors, &mut floor_vs_shovel, &mut router_vs_floor, &mut floor_cpus, &mut floor_switches, &mut broker_floor, &mut router_system, &mut floor_system] {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        }
        println!();
        let shape = match std::env::var("BENCH_SHOVEL_SHAPE").as_deref() {
            Ok("placed") => "messages shaped as the router places them",
            _ => "the senders' messages",
        };
        println!("{n} persistent {BODY}-byte messages, {rounds} rounds, {} queues, ingress -> bucket vs shovel queue -> queue ({shape})", queue_type());
        println!("| | min | median | max |");
        println!("|---|---|---|---|");
        let mut rows = vec![
            ("router msg/s", &routers, 0),
            ("shovel msg/s", &shovels, 0),
            ("ratio router/shovel", &ratios, 2),
            ("router CPU µs/msg", &cpus, 1),
            ("router context switches/msg", &switches, 2),
            ("router CPU in the kernel %", &router_system, 0),
            ("router peak RSS MiB", &rss, 1),
            ("broker CPU µs/msg, router's drain", &broker_router, 1),
            ("router + broker CPU µs/msg", &machine_router, 1),
            ("broker CPU µs/msg, shovel's drain (shovel included)", &broker_shovel, 1),
            ("shovel between the router's queues msg/s", &shovels_same, 0),
            ("ratio router/shovel between the router's queues", &ratios_same, 2),
            ("broker CPU µs/msg, that shovel's drain (shovel included)", &broker_shovel_same, 1),
        ];
        if with_floor {
            rows.push(("floor (lapin alone) msg/s", &floors, 0));
            rows.push(("ratio floor/shovel between the router's queues", &floor_vs_shovel, 2));
            rows.push(("ratio router/floor", &router_vs_floor, 2));
            rows.push(("floor CPU µs/msg", &floor_cpus, 1));
            rows.push(("floor context switches/msg", &floor_switches, 2));
            rows.push(("floor CPU in the kernel %", &floor_system, 0));
            rows.push(("broker CPU µs/msg, floor's drain", &broker_floor, 1));
        }
        if baseline.is_some() {
            rows.push(("baseline msg/s", &baselines, 0));
            rows.push(("ratio router/baseline", &vs_baseline, 2));
        }
        for (name, v, unit) in rows {
            println!(
                "| {name} | {:.*} | {:.*} | {:.*} |",
                unit, v[0], unit, median(v), unit, v[v.len() - 1]
            );
        }
    });
}
