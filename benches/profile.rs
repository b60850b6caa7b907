//! Where the router's CPU goes, in instruction counts (repeatable where time
//! is not), and what it costs at a low steady rate.
//!
//! 1. **Instructions per placed message.** The release binary runs under
//!    `valgrind --tool=callgrind` twice, draining a prefilled ingress of
//!    BENCH_SMALL and then BENCH_LARGE persistent 512-byte messages into a
//!    bucket; the difference of the two totals over the difference of the
//!    counts is the cost of one message, start-up and shutdown excluded. The
//!    functions that spend most in the large run are printed
//!    (`callgrind_annotate`, self cost).
//! 2. **CPU per event at 100 events/s.** The release binary (no valgrind)
//!    places messages published at BENCH_RATE per second for BENCH_SECS
//!    seconds into a 3 s bucket (longer than the 2 s the router times itself), so it both places and forwards; utime +
//!    stime from /proc over that span, divided by the events (placements and
//!    deliveries) — idle wake-ups included — and the context switches of
//!    all the router's threads (`/proc/<pid>/task/*/status`) per event.
//!    The bench consumes the destination as messages arrive and prints
//!    their lateness (arrival less publish less the 3 s asked for).
//!
//! BENCH_WAY=delivery measures the other half of a message's way instead of
//! placement: prefilled into the expired queue (the broker dead-letters them
//! from a bucket, its death headers on them, their deadline past), delivered
//! to a destination queue.
//!
//! 3. **The floor** (benches/floor): lapin alone, forwarding messages from
//!    one queue to another as the router does on the wire (two connections,
//!    the same prefetch, confirms, acks with `multiple`, same runtime and
//!    allocator) and nothing else; the same two measures, one forward being
//!    one event. What the router spends above it is the router's own.
//!    BENCH_FLOOR=0 leaves it out.
//! 4. **What a thread hand-off costs here**, when perf is installed:
//!    `perf bench sched pipe -T` (two threads passing a byte back and forth).
//!    And what a bare wake-up costs: a thread that does nothing but sleep
//!    and wake as often as the low rate's events come, its own CPU per wake
//!    (exact, from `/proc/thread-self/schedstat`; and as the router is
//!    measured, utime + stime) — what any process pays per event on this
//!    machine before it does any work.
//! 5. **Idle** (BENCH_IDLE_ONLY=1, nothing else): the router on the shipped
//!    `buckets.toml`'s ladder, no traffic, BENCH_SECS seconds after a 10 s
//!    start: its CPU and context switches a second, and the broker's CPU a
//!    second with the router against as long without it (the topology
//!    check every `check_interval` is nearly all of it).
//!
//! `cargo bench --bench profile` (env: BENCH_SMALL=2000 BENCH_LARGE=12000
//! BENCH_RATE=100 BENCH_SECS=30; BENCH_KEEP=1 keeps the callgrind files; BENCH_LOW_RATE_ONLY=1 skips them; BENCH_IDLE_ONLY=1 measures idle alone;
//! BENCH_BIN=/path/to/delay-router measures another build; with BENCH_WAY=delivery,
//! BENCH_TRANSIT_FORMAT=spelled-out for a build before the compact transit record).

mod floor;
mod procfs;

// The floor runs in this binary's process (re-executed), with the router's allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use delay_router::broker;
use delay_router::config::Config;
use delay_router::core::decision::{Action, Rules};
use delay_router::testkit::decide;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const BODY: usize = 512;

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn props(delay: &str, routing_key: &str) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(
        "x-requested-delay".into(),
        AMQPValue::LongString(LongString::from(delay)),
    );
    h.insert(
        "x-original-exchange".into(),
        AMQPValue::LongString(LongString::from("")),
    );
    h.insert(
        "x-original-routing-key".into(),
        AMQPValue::LongString(LongString::from(routing_key)),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(h)
}

async fn depth(conn: &Connection, queue: &str) -> u32 {
    broker::probe::depth(conn, &queue.into())
        .await
        .expect("depth")
        .unwrap_or(0)
}

async fn wait_depth(conn: &Connection, queue: &str, n: u32, within: Duration) {
    wait_depths(conn, &[queue.to_owned()], n, within).await;
}

/// Waits until `queues` hold `n` messages between them.
async fn wait_depths(conn: &Connection, queues: &[String], n: u32, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut held = 0;
        for q in queues {
            held += depth(conn, q).await;
        }
        if held >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{queues:?} never reached {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every queue of the rung whose first queue is `queue` (`[topology]
/// bucket_shards`: placements spread over them, shard `k` above 0 being
/// `<queue>.<k>`).
fn rung_queues(rules: &Rules, queue: &str) -> Vec<String> {
    (0..rules.bucket_shards())
        .map(|k| match k {
            0 => queue.to_owned(),
            k => format!("{queue}.{k}"),
        })
        .collect()
}

/// A prefix of its own, its topology declared, and the config file that runs it.
struct Setup {
    rules: Rules,
    config: PathBuf,
}

async fn setup(conn: &Connection, ladder: &str) -> Setup {
    let prefix = format!("bench-profile-{:08x}", rand::random::<u32>());
    let text = format!(
        "[amqp]\nurl = \"{URL}\"\n[topology]\nprefix = \"{prefix}\"\nqueue_type = \"classic\"\n{ladder}"
    );
    let config = Config::from_toml(&text).unwrap();
    // BENCH_TRANSIT_FORMAT=spelled-out: the bucket messages of BENCH_WAY=delivery
    // as a build before the compact record wrote them (to measure that build).
    let format = std::env::var("BENCH_TRANSIT_FORMAT")
        .map_or(Ok(Default::default()), |v| v.parse())
        .expect("BENCH_TRANSIT_FORMAT: compact or spelled-out");
    let rules =
        Rules::new(&config.ladder, config.strategy, &prefix, "guest").with_transit_format(format);
    broker::declare::declare(conn, &rules.topology())
        .await
        .unwrap();
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, &text).unwrap();
    Setup {
        rules,
        config: path,
    }
}

async fn teardown(ch: &Channel, setup: Setup) {
    delay_router::testkit::teardown::remove_topology(ch, &setup.rules, &[]).await;
    let _ = std::fs::remove_file(setup.config);
}

async fn publish(ch: &Channel, exchange: &str, p: &BasicProperties, n: u64) {
    publish_to(ch, exchange, "bench", p, n).await;
}

async fn publish_to(ch: &Channel, exchange: &str, routing_key: &str, p: &BasicProperties, n: u64) {
    let body = vec![b'x'; BODY];
    let mut pending = Vec::new();
    for _ in 0..n {
        let c = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                &body,
                p.clone(),
            )
            .await
            .expect("publish");
        pending.push(c);
        if pending.len() == 2000 {
            for c in pending.drain(..) {
                assert!(c.await.expect("confirm").is_ack());
            }
        }
    }
    for c in pending {
        assert!(c.await.expect("confirm").is_ack());
    }
}

/// Stops a child with SIGINT (killed if that fails) and waits for it.
struct Stop(Option<Child>);

impl Stop {
    async fn interrupt(mut self) {
        let mut child = self.0.take().unwrap();
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "router exited with {status}");
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Which half of a message's way through the router a callgrind run measures.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// From the ingress queue into a bucket.
    Placement,
    /// From the expired queue (dead-lettered by a bucket, the broker's death
    /// headers on it, its deadline past) to its destination queue.
    Delivery,
}

/// Runs the router under callgrind until it has placed (or delivered) `n`
/// prefilled messages; returns the total instructions and the profile's path.
async fn callgrind_run(
    conn: &Connection,
    ch: &Channel,
    n: u64,
    bin: &Path,
    way: Way,
) -> (u64, PathBuf) {
    let s = setup(conn, "[[bucket]]\nttl = \"1h\"\n").await;
    let sink = format!("{}.sink", s.rules.names.prefix);
    let p = props(
        "30m",
        if way == Way::Placement {
            "bench.nowhere"
        } else {
            &sink
        },
    );
    // Placed at the epoch: in the bucket its deadline is long past.
    let Action::Wait {
        queue,
        properties: placed,
        ..
    } = decide::ingress(&s.rules, &"bench".into(), &p, 0, 0.0)
    else {
        panic!("a 30m delay waits in a bucket")
    };
    let (source, target) = match way {
        Way::Placement => {
            publish(ch, s.rules.names.router_exchange.as_str(), &p, n).await;
            // The rung's queues between them (two a classic rung).
            (
                s.rules.names.ingress.to_string(),
                rung_queues(&s.rules, queue.as_str()),
            )
        }
        Way::Delivery => {
            ch.queue_declare(
                sink.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
            // Into the bucket with a 1 ms TTL: the broker dead-letters each
            // into the expired queue at once, with its own death headers.
            let expiring = placed.with_expiration("1".into());
            publish_to(ch, "", queue.as_str(), &expiring, n).await;
            let deadline = Instant::now() + Duration::from_secs(600);
            loop {
                if depth(conn, s.rules.names.expired.as_str()).await >= n as u32 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the buckets never dead-lettered {n}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (s.rules.names.expired.to_string(), vec![sink.clone()])
        }
    };
    if way == Way::Placement {
        wait_depth(conn, &source, n as u32, Duration::from_secs(600)).await;
    }
    let out = std::env::temp_dir().join(format!("{}.callgrind", s.rules.names.prefix));
    let mut program = vec![bin.display().to_string(), "run".into(), "--config".into()];
    program.push(s.config.display().to_string());
    let stop = under_callgrind(&out, &program);
    wait_depths(conn, &target, n as u32, Duration::from_secs(1800)).await;
    stop.interrupt().await;
    if way == Way::Delivery {
        let _ = ch
            .queue_delete(sink.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    teardown(ch, s).await;
    (program_total(&out), out)
}

/// Starts `program` (its path, then its arguments) under callgrind, writing to `out`.
fn under_callgrind(out: &Path, program: &[String]) -> Stop {
    let child = Command::new("valgrind")
        .args(["--tool=callgrind", "--quiet"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .args(program)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("valgrind (apt-get install valgrind)");
    Stop(Some(child))
}

/// The total instructions of a callgrind profile.
fn program_total(out: &Path) -> u64 {
    let annotate = Command::new("callgrind_annotate")
        .arg(out)
        .output()
        .expect("callgrind_annotate");
    let text = String::from_utf8_lossy(&annotate.stdout);
    text.lines()
        .find(|l| l.contains("PROGRAM TOTALS"))
        .and_then(|l| l.split_whitespace().next())
        .map(|v| v.replace(',', ""))
        .and_then(|v| v.parse().ok())
        .expect("PROGRAM TOTALS in callgrind_annotate's output")
}

/// Two queues for the floor to forward between, and the messages for it.
async fn floor_queues(ch: &Channel) -> (String, String) {
    let prefix = format!("bench-floor-{:08x}", rand::random::<u32>());
    let (src, dst) = (format!("{prefix}.src"), format!("{prefix}.dst"));
    for q in [&src, &dst] {
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    (src, dst)
}

async fn delete_floor_queues(ch: &Channel, queues: (String, String)) {
    for q in [queues.0, queues.1] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

/// The floor under callgrind forwarding `n` prefilled messages: total
/// instructions and the profile's path.
async fn floor_callgrind_run(conn: &Connection, ch: &Channel, n: u64) -> (u64, PathBuf) {
    let (src, dst) = floor_queues(ch).await;
    publish_to(ch, "", &src, &props("30m", "bench.nowhere"), n).await;
    wait_depth(conn, &src, n as u32, Duration::from_secs(600)).await;
    let out = std::env::temp_dir().join(format!("{src}.callgrind"));
    let stop = under_callgrind(&out, &floor::args(URL, &src, &dst));
    wait_depth(conn, &dst, n as u32, Duration::from_secs(1800)).await;
    stop.interrupt().await;
    delete_floor_queues(ch, (src, dst)).await;
    (program_total(&out), out)
}

/// The floor at `rate` messages/s for `secs` seconds: CPU µs per event (one
/// forward).
async fn floor_low_rate(conn: &Connection, ch: &Channel, rate: u64, secs: u64) -> LowRate {
    let (src, dst) = floor_queues(ch).await;
    let child = floor::command(URL, &src, &dst)
        .spawn()
        .expect("the floor forwarder");
    let pid = child.id();
    let stop = Stop(Some(child));
    while depth_consumers(ch, &src).await < 1 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = props("3s", "bench.nowhere");
    let (cpu_before, _) = procfs::cpu_and_rss(pid);
    let switches_before = procfs::context_switches(pid);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        publish_to(ch, "", &src, &p, 1).await;
        sent += 1;
    }
    wait_depth(conn, &dst, sent as u32, Duration::from_secs(60)).await;
    let (cpu_after, rss) = procfs::cpu_and_rss(pid);
    let switches = procfs::context_switches(pid).saturating_sub(switches_before);
    stop.interrupt().await;
    delete_floor_queues(ch, (src, dst)).await;
    let events = sent as f64;
    LowRate {
        us_per_event: (cpu_after - cpu_before) as f64 / events,
        switches_per_event: switches as f64 / events,
        peak_rss_kib: rss,
        lateness_ms: None,
    }
}

/// The functions with the highest self cost, as `callgrind_annotate` lists them.
fn top_functions(profile: &Path, count: usize) -> Vec<String> {
    let out = Command::new("callgrind_annotate")
        .args(["--threshold=100"])
        .arg(profile)
        .output()
        .expect("callgrind_annotate");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.contains("file:function"))
        .skip(2)
        .take(count)
        .map(str::to_owned)
        .collect()
}

/// The router at `rate` messages/s for `secs` seconds through a 3 s bucket
/// (a longer delay than the 2 s the router would time itself):
/// CPU µs per event (placement or delivery).
async fn low_rate(conn: &Connection, ch: &Channel, rate: u64, secs: u64, bin: &Path) -> LowRate {
    let s = setup(conn, "[[bucket]]\nttl = \"3s\"\n").await;
    let dest = format!("{}.dest", s.rules.names.prefix);
    ch.queue_declare(
        dest.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&s.config)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("router binary");
    let pid = child.id();
    let stop = Stop(Some(child));
    while depth_consumers(ch, s.rules.names.ingress.as_str()).await < 1 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exchange = s.rules.names.router_exchange.as_str().to_owned();
    let arrivals = lateness_consumer(conn, &dest).await;
    let (cpu_before, _) = procfs::cpu_and_rss(pid);
    let switches_before = procfs::context_switches(pid);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        // Stamped just before the publish: lateness counts from here.
        let mut p = props("3s", &dest);
        let mut h = p.headers().clone().unwrap_or_default();
        h.insert("bench-sent-us".into(), AMQPValue::LongLongInt(epoch_us()));
        p = p.with_headers(h);
        publish(ch, &exchange, &p, 1).await;
        sent += 1;
    }
    let late = arrivals.collect(sent, Duration::from_secs(60)).await;
    let (cpu_after, rss) = procfs::cpu_and_rss(pid);
    let switches = procfs::context_switches(pid).saturating_sub(switches_before);
    stop.interrupt().await;
    let _ = ch
        .queue_delete(dest.as_str().into(), QueueDeleteOptions::default())
        .await;
    teardown(ch, s).await;
    // Each message is two events: placed, then forwarded.
    let events = (2 * sent) as f64;
    LowRate {
        us_per_event: (cpu_after - cpu_before) as f64 / events,
        switches_per_event: switches as f64 / events,
        peak_rss_kib: rss,
        lateness_ms: Some(late),
    }
}

fn epoch_us() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("microseconds fit")
}

/// Arrivals at the destination, consumed as they come, each one's lateness
/// (arrival less `bench-sent-us` less the 3 s asked for).
struct Arrivals {
    late_us: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    task: tokio::task::JoinHandle<()>,
}

async fn lateness_consumer(conn: &Connection, queue: &str) -> Arrivals {
    use futures_util::StreamExt;
    let ch = conn.create_channel().await.expect("channel");
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "bench-lateness".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("consume the destination");
    let late_us = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = late_us.clone();
    let task = tokio::spawn(async move {
        let _ch = ch;
        while let Some(Ok(d)) = consumer.next().await {
            let now = epoch_us();
            let sent = d
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get("bench-sent-us").cloned());
            let Some(AMQPValue::LongLongInt(sent)) = sent else {
                panic!("a delivery without bench-sent-us: {:?}", d.properties);
            };
            sink.lock().unwrap().push(now - sent - 3_000_000);
        }
    });
    Arrivals { late_us, task }
}

impl Arrivals {
    /// Waits for `n` arrivals; their lateness in ms: p50, p99, max, and
    /// how many came early.
    async fn collect(self, n: u64, within: Duration) -> Lateness {
        let deadline = Instant::now() + within;
        loop {
            let got = self.late_us.lock().unwrap().len() as u64;
            if got >= n {
                break;
            }
            assert!(Instant::now() < deadline, "{got} of {n} arrived");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.task.abort();
        let mut v = self.late_us.lock().unwrap().clone();
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
        Lateness {
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
            early: v.iter().filter(|l| **l < 0).count(),
        }
    }
}

/// Lateness of the low rate's arrivals, ms.
struct Lateness {
    p50: f64,
    p99: f64,
    max: f64,
    early: usize,
}

/// The router idle on the shipped ladder for `secs` seconds: its CPU and
/// context switches a second, and what it costs the broker a second (the
/// broker's CPU with the router, less its CPU over as long without it).
async fn idle(conn: &Connection, ch: &Channel, secs: u64, bin: &Path) {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/buckets.toml"))
        .expect("buckets.toml");
    // The shipped rungs only: the rest of the file names the shipped prefix.
    let ladder: String = shipped
        .lines()
        .filter(|l| l.starts_with("[[bucket]]") || l.starts_with("ttl"))
        .map(|l| format!("{l}\n"))
        .collect();
    let beam = procfs::broker_pid();
    let span = Duration::from_secs(secs);
    let (without_before, _) = procfs::cpu_and_rss(beam);
    tokio::time::sleep(span).await;
    let (without_after, _) = procfs::cpu_and_rss(beam);
    let s = setup(conn, &ladder).await;
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&s.config)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("router binary");
    let pid = child.id();
    let stop = Stop(Some(child));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (cpu_before, _) = procfs::cpu_and_rss(pid);
    let switches_before = procfs::context_switches(pid);
    let (beam_before, _) = procfs::cpu_and_rss(beam);
    tokio::time::sleep(span).await;
    let (cpu_after, rss) = procfs::cpu_and_rss(pid);
    let switches = procfs::context_switches(pid).saturating_sub(switches_before);
    let (beam_after, _) = procfs::cpu_and_rss(beam);
    stop.interrupt().await;
    teardown(ch, s).await;
    let per_s = |us: u64| us as f64 / 1000.0 / secs as f64;
    let broker_with = per_s(beam_after - beam_before);
    let broker_without = per_s(without_after - without_before);
    println!(
        "idle for {secs} s on the shipped ladder: router CPU {:.2} ms a second, {:.1} context switches a second, peak RSS {rss} KiB; broker CPU {broker_with:.2} ms a second with it, {broker_without:.2} without: {:.2} for the router",
        per_s(cpu_after - cpu_before),
        switches as f64 / secs as f64,
        broker_with - broker_without
    );
}

/// What a round trip between two threads costs on this machine (two
/// wake-ups, two context switches), from `perf bench sched pipe -T`, if perf
/// is installed: what each of the low rate's hand-offs costs.
fn handoff_us() -> Option<f64> {
    let out = Command::new("perf")
        .args(["bench", "sched", "pipe", "-T", "-l", "50000"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("usecs/op"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A thread that only sleeps and wakes `per_s` times a second for `secs`
/// seconds: its CPU per wake in µs, exactly (schedstat's run time) and as
/// utime + stime (in ticks, as the router's CPU is read).
fn bare_wake_us(per_s: u64, secs: u64) -> (f64, f64) {
    std::thread::spawn(move || {
        let wakes = per_s * secs;
        let period = Duration::from_secs(1) / per_s as u32;
        let run = || {
            let exact = std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
            let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
            let fields: Vec<u64> = stat
                .rsplit_once(')')
                .map_or("", |(_, r)| r)
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse().ok())
                .collect();
            (exact, fields.iter().sum::<u64>() * 10_000) // 100 ticks per second
        };
        let (exact_before, ticks_before) = run();
        for _ in 0..wakes {
            std::thread::sleep(period);
        }
        let (exact_after, ticks_after) = run();
        (
            exact_after.saturating_sub(exact_before) as f64 / 1000.0 / wakes as f64,
            ticks_after.saturating_sub(ticks_before) as f64 / wakes as f64,
        )
    })
    .join()
    .expect("the bare wake thread")
}

/// What the low-rate run measured.
struct LowRate {
    us_per_event: f64,
    switches_per_event: f64,
    peak_rss_kib: u64,
    /// The router's run only (the floor's is not measured).
    lateness_ms: Option<Lateness>,
}

async fn depth_consumers(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .map_or(0, |q| q.consumer_count())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if floor::run_if_asked() {
        return;
    }
    let with_floor = std::env::var("BENCH_FLOOR").map_or(true, |v| v != "0");
    let small = env_or("BENCH_SMALL", 2000);
    let large = env_or("BENCH_LARGE", 12_000);
    let rate = env_or("BENCH_RATE", 100);
    let secs = env_or("BENCH_SECS", 30);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ensure-rabbitmq");
    assert!(
        Command::new(script)
            .status()
            .expect("ensure-rabbitmq")
            .success()
    );
    // BENCH_BIN: another build's binary, to compare.
    let bin = std::env::var_os("BENCH_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_delay-router")),
        PathBuf::from,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = Connection::connect(URL, ConnectionProperties::default())
            .await
            .expect("broker");
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        if std::env::var_os("BENCH_IDLE_ONLY").is_some() {
            idle(&conn, &ch, secs, &bin).await;
            return;
        }
        if std::env::var_os("BENCH_LOW_RATE_ONLY").is_none() {
            let way = match std::env::var("BENCH_WAY").as_deref() {
                Ok("delivery") => Way::Delivery,
                _ => Way::Placement,
            };
            instructions(&conn, &ch, small, large, &bin, way).await;
            if with_floor {
                floor_instructions(&conn, &ch, small, large).await;
            }
        }
        let r = low_rate(&conn, &ch, rate, secs, &bin).await;
        println!(
            "at {rate} messages/s for {secs} s (placed and forwarded): CPU {:.1} µs per event, {:.1} context switches per event, peak RSS {} KiB",
            r.us_per_event, r.switches_per_event, r.peak_rss_kib
        );
        if let Some(l) = &r.lateness_ms {
            println!(
                "  lateness at the destination (from the publish, 3 s asked for): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} early",
                l.p50, l.p99, l.max, l.early
            );
        }
        if let Some(us) = handoff_us() {
            println!(
                "this machine's thread hand-off (`perf bench sched pipe -T`): {us:.1} µs per round trip, two hand-offs"
            );
        }
        let (exact, ticks) = bare_wake_us(2 * rate, secs);
        println!(
            "a bare wake-up at {} a second for {secs} s (a thread that only sleeps): CPU {exact:.1} µs per wake (schedstat), {ticks:.1} (utime + stime)",
            2 * rate
        );
        if with_floor {
            let f = floor_low_rate(&conn, &ch, rate, secs).await;
            println!(
                "the floor at {rate} messages/s for {secs} s (forwarded): CPU {:.1} µs per event, {:.1} context switches per event, peak RSS {} KiB",
                f.us_per_event, f.switches_per_event, f.peak_rss_kib
            );
        }
    });
}

/// Instructions per placed (or delivered) message: two callgrind runs,
/// `small` and `large` messages.
async fn instructions(
    conn: &Connection,
    ch: &Channel,
    small: u64,
    large: u64,
    bin: &Path,
    way: Way,
) {
    let (ir_small, p_small) = callgrind_run(conn, ch, small, bin, way).await;
    let (ir_large, p_large) = callgrind_run(conn, ch, large, bin, way).await;
    let per_msg = (ir_large.saturating_sub(ir_small)) as f64 / (large - small) as f64;
    let what = match way {
        Way::Placement => "placed message (ingress to a bucket)",
        Way::Delivery => "delivered message (expired queue to its destination)",
    };
    println!("instructions: {small} messages {ir_small}, {large} messages {ir_large}");
    println!("instructions per {what}: {per_msg:.0}");
    println!("highest self cost, {large} messages:");
    for line in top_functions(&p_large, 30) {
        println!("  {line}");
    }
    if std::env::var_os("BENCH_KEEP").is_none() {
        let _ = std::fs::remove_file(p_small);
        let _ = std::fs::remove_file(p_large);
    } else {
        println!("profiles: {} {}", p_small.display(), p_large.display());
    }
}

/// Instructions per message the floor forwards: two callgrind runs, as for the router.
async fn floor_instructions(conn: &Connection, ch: &Channel, small: u64, large: u64) {
    let (ir_small, p_small) = floor_callgrind_run(conn, ch, small).await;
    let (ir_large, p_large) = floor_callgrind_run(conn, ch, large).await;
    let per_msg = (ir_large.saturating_sub(ir_small)) as f64 / (large - small) as f64;
    println!("floor instructions: {small} messages {ir_small}, {large} messages {ir_large}");
    println!("floor instructions per forwarded message (lapin alone): {per_msg:.0}");
    println!("floor, highest self cost, {large} messages:");
    for line in top_functions(&p_large, 15) {
        println!("  {line}");
    }
    if std::env::var_os("BENCH_KEEP").is_none() {
        let _ = std::fs::remove_file(p_small);
        let _ = std::fs::remove_file(p_large);
    } else {
        println!(
            "floor profiles: {} {}",
            p_small.display(),
            p_large.display()
        );
    }
}
