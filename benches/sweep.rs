//! Lateness and CPU against rate: what users get from the router at its
//! default configuration, from one message a second up to most of what it
//! sustains, beside kombu's broker-only topology at the same rates and delays.
//!
//! The router is the release binary (benches/routerproc) on the shipped
//! `buckets.toml` with only its ladder replaced: the short rungs and the
//! shipped ladder's first two, 1s, 2s, 4s, 8s, 30s, 1m (a file written to the
//! temporary directory; BENCH_CONFIG names another base file). Prefix,
//! metrics address and URL come from the environment as for every bench that
//! runs the binary; the bucket type from BENCH_QUEUE_TYPE (classic).
//!
//! 1. The sustained rate: steps of 10 s of messages delayed 1 s, from 1,000
//!    msg/s doubled while the router keeps up, then halfway between the
//!    highest rate kept up with and the lowest not, until they are within a
//!    tenth; at most 100 s of steps. The router keeps up with a step when the
//!    depth of its ingress queue (passive queue.declare, twice a second) does
//!    not grow over it: a least-squares slope over 2 % of the rate with more
//!    than 500 messages waiting at the end is growth. Where this bench cannot
//!    publish at a step's rate the search stops: the router sustains at least
//!    the rate found. After each step every message is awaited.
//!    BENCH_SUSTAINED=N takes N instead (0: no row for it).
//! 2. The router idle for 30 s: its CPU, and the broker's (its beam.smp).
//!    Every broker figure below is net of the broker's idle rate.
//! 3. Per rate, ascending: BENCH_SWEEP_RATES (1,10,100,1000) and 80 % of the
//!    sustained rate. 2,000 persistent 512-byte messages or 60 s of them,
//!    whichever comes first (1 and 10 msg/s: 60 s; 100 msg/s: 20 s), through
//!    the router, every one awaited, then the same through kombu. Delays
//!    uniform to the millisecond, half over the short rungs (500..8,000 ms),
//!    half over the shipped ones (8,000..60,000 ms), every 10th exactly a rung
//!    (1, 2, 4, 8, 30, 60 s in turn); BENCH_MAX_DELAY_MS caps them for a
//!    shorter run. kombu rounds each delay up to whole seconds (its design).
//!
//! Lateness: arrival at a consumer of the destination queue minus (publish +
//! requested delay), on the monotonic clock (taken just before the publish,
//! and on arrival), for both designs; early deliveries are counted. CPU from
//! the first publish to the last arrival, in % of one core: the router's
//! process, the broker net of idle, their sum; for kombu the broker's. The
//! ratio is the router's sum over kombu's broker. The publisher and the
//! consumer are this bench, in neither figure.
//!
//! Where the tail comes from: per rate, the messages over 10 ms late (the
//! goal's p99) at the consumer, and from the router's two lateness
//! histograms on /metrics those already over 10 ms when they came back from
//! their last bucket (the broker's dead-lettering and the expired queue) and
//! when the router's delivery was confirmed. A message over 10 ms at the
//! consumer but not at its delivery lost the time after the router.
//!
//! A Markdown table on stdout and in `target/sweep/sweep.md`, the same in
//! `target/sweep/sweep.csv`, and charts against rate (log axes; text with
//! DejaVu or Liberation Sans, or BENCH_PLOT_FONT): `target/sweep/lateness.png`
//! (p50, p99, max) and `target/sweep/cpu.png` (router, router + broker, kombu's
//! broker). Every queue and exchange has a random prefix and is removed at
//! the end, also after a failure.
//!
//! `cargo bench --bench sweep`
//! BENCH_URL (the broker), BENCH_CTL or BENCH_BROKER_PID (its beam.smp),
//! BENCH_BIN (another build of the router), BENCH_QUEUE_TYPE=classic|quorum
//! (`[topology] queue_type` of the router's queues, and kombu's),
//! BENCH_SWEEP_RATES=1,10,100 (instead of 1,10,100,1000), BENCH_SUSTAINED=N,
//! BENCH_MAX_DELAY_MS, BENCH_VENV (kombu's virtualenv).

mod kombu_topology;
#[allow(dead_code)] // the precision bench's CDF charts are not drawn here
mod plot;
mod procfs;
mod routerproc;
mod workload;

use delay_router::broker::probe::Prober;
use delay_router::broker::{close_channel, close_connection};
use delay_router::config::Config;
use delay_router::testkit::consume::{Acks, Consumer};
use futures_util::FutureExt;
use kombu_topology::Topology;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use routerproc::RouterProcess;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::{Rng, env_or, percentile};

/// The ladder: the short rungs and the shipped ladder's first two.
const RUNGS: [&str; 6] = ["1s", "2s", "4s", "8s", "30s", "1m"];
/// Every [`EXACT_EVERY`]th message's delay, in turn: exactly a rung.
const RUNG_MS: [u64; 6] = [1_000, 2_000, 4_000, 8_000, 30_000, 60_000];
const EXACT_EVERY: usize = 10;
/// The other messages' delays, alternately over the short rungs and over
/// the shipped ones (ms, both ends included).
const SHORT_MS: (u64, u64) = (500, 8_000);
const LONG_MS: (u64, u64) = (8_000, 60_000);
const RATES: [u64; 4] = [1, 10, 100, 1_000];
/// Per rate: this many messages or this long a publish, whichever is first.
const MESSAGES: u64 = 2_000;
const PUBLISH_FOR: Duration = Duration::from_secs(60);
/// The share of the sustained rate that gets a row.
const SUSTAINED_SHARE: f64 = 0.8;
const BODY: [u8; 512] = [0; 512];
const SEED: u64 = 0x2545_F491_4F6C_DD1D;

/// How long the last message may take past its delay.
const ARRIVAL_GRACE: Duration = Duration::from_secs(60);
/// Publishes not yet confirmed, at most.
const UNCONFIRMED: usize = 10_000;
/// Longest wait for one broker operation.
const BROKER_LIMIT: Duration = Duration::from_secs(30);
/// Longest wait for the router to stop and its topology to be removed.
const TEARDOWN_LIMIT: Duration = Duration::from_secs(300);
const ROUTER_IDLE: Duration = Duration::from_secs(30);
/// Quiet before the idle measurement, and between two lanes.
const SETTLE: Duration = Duration::from_secs(5);
const BETWEEN_LANES: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(20);
/// The router's counters (benches/routerproc scrapes its /metrics).
const PLACED: &str = "delay_router_messages_placed_total";
const DELIVERED: &str = "delay_router_messages_delivered_total";
/// The router's lateness histograms: how late messages came back from their
/// last bucket (the broker's share), and how late the router delivered them.
const RETURNED: &str = "delay_router_return_lateness_seconds";
const DELIVERY: &str = "delay_router_delivery_lateness_seconds";
/// The lateness goal's p99, ms: each row counts the messages later than this,
/// and where the router's histograms place them.
const GOAL_P99_MS: i64 = 10;
/// Below this broker CPU (% of a core, net) kombu's figure is noise: no ratio.
const MIN_RATIO_BASE_PCT: f64 = 0.05;

// The search for the sustained rate.
const SEARCH_FROM: u64 = 1_000;
const SEARCH_FLOOR: u64 = 100;
const SEARCH_CEILING: u64 = 64_000;
const SEARCH_STEPS: usize = 12;
const SEARCH_STEP: Duration = Duration::from_secs(10);
const SEARCH_BUDGET: Duration = Duration::from_secs(100);
const SEARCH_DELAY_MS: u64 = 1_000;
/// Halving ends when the gap is under this share of the rate not kept up with.
const SEARCH_PRECISION: f64 = 0.1;
/// Rates halfway are rounded down to a multiple of this.
const SEARCH_ROUND: u64 = 100;
const DEPTH_EVERY: Duration = Duration::from_millis(500);
/// Depth samples before this, the ramp up, are not in the slope.
const GROWTH_FROM: Duration = Duration::from_secs(2);
/// Growth: a slope over this share of the rate...
const GROWTH_TOLERANCE: f64 = 0.02;
/// ...and more than this many messages waiting at the end.
const BACKLOG_FLOOR: u32 = 500;
/// A step published at under this share of its rate is this bench's limit.
const PUBLISHER_SHORTFALL: f64 = 0.95;
/// Longest wait for a step's messages after its last publish.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// What the environment asks for.
struct Settings {
    url: String,
    queue_type: String,
    rates: Vec<u64>,
    /// BENCH_SUSTAINED: no search.
    sustained: Option<u64>,
    max_delay_ms: u64,
}

impl Settings {
    fn from_env() -> Self {
        let rates = match std::env::var("BENCH_SWEEP_RATES") {
            Ok(list) => list
                .split(',')
                .map(|r| match r.trim().parse::<u64>() {
                    Ok(rate) if rate > 0 => rate,
                    _ => panic!("BENCH_SWEEP_RATES: {r:?} is not a rate in msg/s"),
                })
                .collect(),
            Err(_) => RATES.to_vec(),
        };
        Self {
            url: std::env::var("BENCH_URL")
                .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
            queue_type: std::env::var("BENCH_QUEUE_TYPE").unwrap_or_else(|_| "classic".into()),
            rates,
            sustained: std::env::var("BENCH_SUSTAINED")
                .ok()
                .map(|n| n.parse().expect("BENCH_SUSTAINED: msg/s")),
            max_delay_ms: env_or("BENCH_MAX_DELAY_MS", LONG_MS.1).clamp(SHORT_MS.0, LONG_MS.1),
        }
    }
}

/// `fut`, which must be done within [`BROKER_LIMIT`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(BROKER_LIMIT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {BROKER_LIMIT:?}"))
}

fn pct(us: u64, over: Duration) -> f64 {
    us as f64 / over.as_micros().max(1) as f64 * 100.0
}

// ---- The configuration ----

/// The base configuration's text without its `[[bucket]]` tables, and the
/// sweep's ladder instead.
fn config_text(base: &str) -> String {
    let mut text = String::new();
    let mut in_bucket = false;
    for line in base.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            in_bucket = trimmed.starts_with("[[bucket]]");
        }
        if !in_bucket {
            text.push_str(line);
            text.push('\n');
        }
    }
    for rung in RUNGS {
        text.push_str(&format!("\n[[bucket]]\nttl = \"{rung}\"\n"));
    }
    text
}

/// Writes the router's configuration file for `prefix`; its path.
fn write_config(prefix: &str) -> String {
    let base = routerproc::config_path();
    let text = config_text(&std::fs::read_to_string(&base).expect("the base configuration"));
    let config = Config::from_toml(&text).expect("the sweep's configuration");
    let labels: Vec<&str> = config
        .ladder
        .rungs()
        .iter()
        .map(|r| r.label.as_str())
        .collect();
    assert_eq!(labels, RUNGS, "the sweep's ladder");
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, text).expect("the configuration file");
    path.to_string_lossy().into_owned()
}

// ---- The workload ----

/// The delays of the messages that are not exactly a rung, capped at
/// `max_delay_ms` (ms, both ends included): over the short rungs, over the
/// shipped ones.
fn ranges(max_delay_ms: u64) -> ((u64, u64), (u64, u64)) {
    let short = (SHORT_MS.0, SHORT_MS.1.min(max_delay_ms));
    let long = if max_delay_ms > LONG_MS.0 {
        (LONG_MS.0, max_delay_ms)
    } else {
        short
    };
    (short, long)
}

/// One rate's messages: their delays, in publish order.
struct Workload {
    rate: u64,
    delays_ms: Vec<u64>,
}

impl Workload {
    fn new(rate: u64, max_delay_ms: u64) -> Self {
        let n = MESSAGES.min(rate * PUBLISH_FOR.as_secs()) as usize;
        let exact: Vec<u64> = RUNG_MS.into_iter().filter(|d| *d <= max_delay_ms).collect();
        let (short, long) = ranges(max_delay_ms);
        let mut rng = Rng(SEED.wrapping_add(rate));
        let mut others = 0;
        let delays_ms = (1..=n)
            .map(|i| {
                if i % EXACT_EVERY == 0 && !exact.is_empty() {
                    return exact[(i / EXACT_EVERY - 1) % exact.len()];
                }
                others += 1;
                let (lo, hi) = if others % 2 == 1 { short } else { long };
                lo + ((hi - lo + 1) as f64 * rng.next_f64()) as u64
            })
            .collect();
        Self { rate, delays_ms }
    }

    fn longest_ms(&self) -> u64 {
        self.delays_ms.iter().copied().max().unwrap_or(0)
    }
}

// ---- Publishing and consuming ----

/// Where a lane publishes.
enum Via<'a> {
    /// The router's exchange; the destination (default exchange, the queue
    /// as routing key) is the `x-original-exchange` header and the publish's
    /// routing key.
    Router { exchange: String, dest: &'a str },
    /// kombu's top level, with the routing key of the delay's whole seconds.
    Kombu(&'a Topology),
}

impl Via<'_> {
    /// The queue the delayed messages arrive at.
    fn queue(&self) -> &str {
        match self {
            Via::Router { dest, .. } => dest,
            Via::Kombu(topology) => &topology.queue,
        }
    }

    async fn publish(
        &self,
        ch: &Channel,
        id: String,
        delay_ms: u64,
    ) -> lapin::Result<PublisherConfirm> {
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.into());
        match self {
            Via::Router { exchange, dest } => {
                let mut h = FieldTable::default();
                h.insert(
                    "x-requested-delay".into(),
                    AMQPValue::LongLongInt(delay_ms as i64),
                );
                h.insert(
                    "x-original-exchange".into(),
                    AMQPValue::LongString(LongString::from("")),
                );
                ch.basic_publish(
                    exchange.as_str().into(),
                    (*dest).into(),
                    BasicPublishOptions::default(),
                    &BODY,
                    props.with_headers(h),
                )
                .await
            }
            // kombu's topology is declared with a key per whole second from 1.
            Via::Kombu(topology) => {
                let seconds = delay_ms.div_ceil(1000).max(1) as usize;
                topology.publish(ch, seconds - 1, &BODY, props).await
            }
        }
    }
}

async fn confirm_channel(conn: &Connection) -> Channel {
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("a channel");
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    ch
}

async fn confirmed(confirm: PublisherConfirm) {
    let confirmation = within("publisher confirm", confirm)
        .await
        .expect("publisher confirm");
    assert!(confirmation.is_ack(), "publish refused");
}

/// Publishes a message per delay, the `i`th (message-id `<tag>-<i>`) at
/// `i / rate` s after `start`, with at most [`UNCONFIRMED`] unconfirmed;
/// returns when each was published (just before its publish) once all are
/// confirmed.
async fn publish_paced(
    ch: &Channel,
    via: &Via<'_>,
    tag: &str,
    delays_ms: &[u64],
    rate: f64,
    start: Instant,
) -> Vec<Instant> {
    let mut sent = Vec::with_capacity(delays_ms.len());
    let mut unconfirmed = VecDeque::new();
    for (i, delay) in delays_ms.iter().enumerate() {
        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate)).into()).await;
        let id = format!("{tag}-{i}");
        sent.push(Instant::now());
        let confirm = within("basic.publish", via.publish(ch, id, *delay))
            .await
            .expect("basic.publish");
        unconfirmed.push_back(confirm);
        if unconfirmed.len() > UNCONFIRMED
            && let Some(oldest) = unconfirmed.pop_front()
        {
            confirmed(oldest).await;
        }
    }
    for confirm in unconfirmed {
        confirmed(confirm).await;
    }
    sent
}

/// What a lane's destination queue delivered, per message of the lane.
struct Arrived {
    /// When message `i` first came.
    at: Vec<Option<Instant>>,
    count: usize,
    duplicates: usize,
}

impl Arrived {
    fn record(&mut self, i: usize, at: Instant) {
        match &mut self.at[i] {
            Some(_) => self.duplicates += 1,
            slot => {
                *slot = Some(at);
                self.count += 1;
            }
        }
    }
}

/// A consumer of a lane's destination queue that records its messages
/// (message-id `<tag>-<i>`; others, a step's or a lane's before, it drops).
struct Collector {
    arrived: Arc<Mutex<Arrived>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn open(conn: &Connection, queue: &str, tag: &str, n: usize) -> Self {
        let mut consumer = within("basic.consume", Consumer::open(conn, queue, Acks::Auto)).await;
        let arrived = Arc::new(Mutex::new(Arrived {
            at: vec![None; n],
            count: 0,
            duplicates: 0,
        }));
        let sink = arrived.clone();
        let prefix = format!("{tag}-");
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    d = consumer.next_within(BROKER_LIMIT) => {
                        let at = Instant::now();
                        let i = d.as_ref().and_then(|d| {
                            d.properties.message_id().as_ref()?.as_str().strip_prefix(&prefix)?.parse().ok()
                        });
                        if let Some(i) = i.filter(|i| *i < n) {
                            sink.lock().unwrap().record(i, at);
                        }
                    }
                }
            }
            consumer.close().await;
        });
        Self {
            arrived,
            stop,
            task,
        }
    }

    fn count(&self) -> usize {
        self.arrived.lock().unwrap().count
    }

    /// Waits until every message has come (`Ok`) or `deadline` (how many came).
    async fn wait_all(&self, deadline: Instant) -> Result<(), usize> {
        let n = self.arrived.lock().unwrap().at.len();
        loop {
            let count = self.count();
            if count == n {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(count);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stops consuming; what came.
    async fn finish(self) -> Arrived {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(BROKER_LIMIT, self.task).await;
        let mut arrived = self.arrived.lock().unwrap();
        Arrived {
            at: std::mem::take(&mut arrived.at),
            count: arrived.count,
            duplicates: arrived.duplicates,
        }
    }
}

// ---- Measuring ----

/// The processes whose CPU is measured.
#[derive(Clone, Copy)]
struct Pids {
    router: u32,
    broker: u32,
}

impl Pids {
    /// CPU so far (µs): the router's, the broker's.
    fn cpu(self) -> (u64, u64) {
        (
            procfs::cpu_and_rss(self.router).0,
            procfs::cpu_and_rss(self.broker).0,
        )
    }
}

/// One design's figures at one rate.
struct Measured {
    /// Lateness per message, ms, sorted.
    late: Vec<i64>,
    /// From the first publish to the last arrival.
    window: Duration,
    router_us: u64,
    broker_us: u64,
    duplicates: usize,
}

impl Measured {
    /// The `p` quantile of lateness, ms.
    fn quantile(&self, p: f64) -> i64 {
        percentile(&self.late, p)
    }

    fn early(&self) -> usize {
        self.late.iter().filter(|l| **l < 0).count()
    }

    fn max(&self) -> i64 {
        self.late.last().copied().unwrap_or(0)
    }
}

/// Publishes `w` through `via` and awaits every message at its destination.
async fn lane(conn: &Connection, via: &Via<'_>, w: &Workload, tag: &str, pids: Pids) -> Measured {
    let n = w.delays_ms.len();
    let collector = Collector::open(conn, via.queue(), tag, n).await;
    let ch = confirm_channel(conn).await;
    let (router0, broker0) = pids.cpu();
    let start = Instant::now();
    let sent = publish_paced(&ch, via, tag, &w.delays_ms, w.rate as f64, start).await;
    let deadline = Instant::now() + Duration::from_millis(w.longest_ms()) + ARRIVAL_GRACE;
    let complete = collector.wait_all(deadline).await;
    let (router1, broker1) = pids.cpu();
    let window = start.elapsed();
    let arrived = collector.finish().await;
    close_channel(&ch, "lane done").await;
    if let Err(count) = complete {
        panic!(
            "{tag}: {count} of {n} messages arrived at {} within {ARRIVAL_GRACE:?} of the longest delay",
            via.queue()
        );
    }
    let mut late: Vec<i64> = arrived
        .at
        .iter()
        .zip(&sent)
        .zip(&w.delays_ms)
        .map(|((at, sent), delay)| {
            let waited = at.expect("arrived").duration_since(*sent);
            waited.as_millis() as i64 - *delay as i64
        })
        .collect();
    late.sort_unstable();
    Measured {
        late,
        window,
        router_us: router1 - router0,
        broker_us: broker1 - broker0,
        duplicates: arrived.duplicates,
    }
}

/// CPU while nothing is published, % of one core.
struct Idle {
    router_pct: f64,
    broker_pct: f64,
}

async fn idle(pids: Pids) -> Idle {
    let (router0, broker0) = pids.cpu();
    let start = Instant::now();
    tokio::time::sleep(ROUTER_IDLE).await;
    let (router1, broker1) = pids.cpu();
    let over = start.elapsed();
    Idle {
        router_pct: pct(router1 - router0, over),
        broker_pct: pct(broker1 - broker0, over),
    }
}

// ---- The sustained rate ----

/// Where the sustained rate came from.
enum Sustained {
    Given(u64),
    /// The highest rate kept up with (None: not even [`SEARCH_FLOOR`]);
    /// `publisher_bound`: this bench could not publish faster.
    Searched {
        rate: Option<u64>,
        publisher_bound: bool,
    },
}

impl Sustained {
    fn rate(&self) -> Option<u64> {
        match self {
            Sustained::Given(n) => Some(*n).filter(|n| *n > 0),
            Sustained::Searched { rate, .. } => *rate,
        }
    }

    fn describe(&self) -> String {
        match self {
            Sustained::Given(n) => format!("{n} msg/s (BENCH_SUSTAINED)"),
            Sustained::Searched {
                rate: None,
                publisher_bound,
            } => format!(
                "not found (no step of {SEARCH_FLOOR} msg/s or more kept up with{})",
                if *publisher_bound {
                    "; this bench could not publish faster"
                } else {
                    ""
                }
            ),
            Sustained::Searched {
                rate: Some(rate),
                publisher_bound: true,
            } => format!(
                "at least {rate} msg/s (this bench could not publish faster; ingress depth bounded, 1 s delays)"
            ),
            Sustained::Searched {
                rate: Some(rate),
                publisher_bound: false,
            } => format!(
                "{rate} msg/s (highest step with the ingress depth bounded, 1 s delays, {SEARCH_STEP:?} steps)"
            ),
        }
    }
}

/// One step of the search.
struct Step {
    achieved: f64,
    /// Ingress depth growth, msg/s.
    slope: f64,
    last_depth: u32,
}

impl Step {
    fn grows(&self) -> bool {
        self.slope > GROWTH_TOLERANCE * self.achieved && self.last_depth > BACKLOG_FLOOR
    }
}

/// The least-squares slope of `samples` (s, depth), per second.
fn slope(samples: &[(f64, u32)]) -> f64 {
    if samples.len() < 2 {
        return 0.0;
    }
    let n = samples.len() as f64;
    let mean_t = samples.iter().map(|(t, _)| t).sum::<f64>() / n;
    let mean_d = samples.iter().map(|(_, d)| f64::from(*d)).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (t, d) in samples {
        sxy += (t - mean_t) * (f64::from(*d) - mean_d);
        sxx += (t - mean_t) * (t - mean_t);
    }
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

/// `queue`'s ready messages every [`DEPTH_EVERY`] from `start` for `over`:
/// (s since start, depth).
async fn depths(
    conn: &Connection,
    queue: &ShortString,
    start: Instant,
    over: Duration,
) -> Vec<(f64, u32)> {
    let mut prober = Prober::new(conn);
    let mut samples = Vec::new();
    let mut at = start + DEPTH_EVERY;
    while at <= start + over {
        tokio::time::sleep_until(at.into()).await;
        let info = prober
            .queue(queue)
            .await
            .unwrap_or_else(|e| panic!("depth of {queue}: {e}"))
            .unwrap_or_else(|| panic!("{queue} is gone"));
        samples.push((at.duration_since(start).as_secs_f64(), info.messages));
        at += DEPTH_EVERY;
    }
    prober.close().await;
    samples
}

/// [`SEARCH_STEP`] of messages delayed [`SEARCH_DELAY_MS`] at `rate`, the
/// ingress depth sampled meanwhile; returns once every message has arrived.
async fn step(
    conn: &Connection,
    via: &Via<'_>,
    ingress: &ShortString,
    rate: u64,
    k: usize,
) -> Step {
    let n = (rate * SEARCH_STEP.as_secs()) as usize;
    let tag = format!("search{k}");
    let delays = vec![SEARCH_DELAY_MS; n];
    let collector = Collector::open(conn, via.queue(), &tag, n).await;
    let ch = confirm_channel(conn).await;
    let start = Instant::now();
    let (sent, samples) = tokio::join!(
        publish_paced(&ch, via, &tag, &delays, rate as f64, start),
        depths(conn, ingress, start, SEARCH_STEP),
    );
    let drained = collector.wait_all(Instant::now() + DRAIN_LIMIT).await;
    collector.finish().await;
    close_channel(&ch, "step done").await;
    if let Err(count) = drained {
        panic!("search at {rate} msg/s: {count} of {n} arrived within {DRAIN_LIMIT:?}");
    }
    let spent = sent[n - 1].duration_since(sent[0]).as_secs_f64();
    let settled: Vec<(f64, u32)> = samples
        .iter()
        .copied()
        .filter(|(t, _)| *t >= GROWTH_FROM.as_secs_f64())
        .collect();
    Step {
        achieved: (n - 1) as f64 / spent.max(f64::EPSILON),
        slope: slope(&settled),
        last_depth: samples.last().map_or(0, |(_, d)| *d),
    }
}

/// The next step's rate: doubled until the router falls behind, then
/// halfway between; None: done.
fn next_rate(kept_up: Option<u64>, fell_behind: Option<u64>) -> Option<u64> {
    match (kept_up, fell_behind) {
        (None, None) => Some(SEARCH_FROM),
        (Some(up), None) => (up < SEARCH_CEILING).then_some(up * 2),
        (up, Some(behind)) => {
            let up = up.unwrap_or(0);
            let mid = (up + behind) / 2 / SEARCH_ROUND * SEARCH_ROUND;
            let close = (behind - up) as f64 <= SEARCH_PRECISION * behind as f64;
            (!close && mid > up && mid >= SEARCH_FLOOR).then_some(mid)
        }
    }
}

async fn search(conn: &Connection, via: &Via<'_>, ingress: &ShortString) -> Sustained {
    println!(
        "sustained rate: steps of {SEARCH_STEP:?}, delays {SEARCH_DELAY_MS} ms, at most {SEARCH_BUDGET:?}"
    );
    let began = Instant::now();
    let (mut kept_up, mut fell_behind) = (None, None);
    let mut publisher_bound = false;
    let mut rate = SEARCH_FROM;
    for k in 0..SEARCH_STEPS {
        if began.elapsed() + SEARCH_STEP > SEARCH_BUDGET {
            break;
        }
        let s = step(conn, via, ingress, rate, k).await;
        let grows = s.grows();
        println!(
            "  {rate:>6} msg/s: published at {:.0} msg/s, ingress depth {:+.0} msg/s, {} at the end: {}",
            s.achieved,
            s.slope,
            s.last_depth,
            if grows { "grows" } else { "bounded" }
        );
        if s.achieved < PUBLISHER_SHORTFALL * rate as f64 {
            publisher_bound = true;
            if !grows {
                let reached = s.achieved as u64 / SEARCH_ROUND * SEARCH_ROUND;
                kept_up = kept_up.max(Some(reached));
            }
            break;
        }
        if grows {
            fell_behind = Some(rate);
        } else {
            kept_up = Some(rate);
        }
        match next_rate(kept_up, fell_behind) {
            Some(next) => rate = next,
            None => break,
        }
    }
    Sustained::Searched {
        rate: kept_up.filter(|r| *r > 0),
        publisher_bound,
    }
}

// ---- The sweep ----

/// One rate: the router's lane and kombu's.
struct Row {
    rate: u64,
    /// Set on the row of [`SUSTAINED_SHARE`] of this sustained rate.
    of_sustained: Option<u64>,
    router: Measured,
    /// The router's bucket placements per delivered message.
    placements: f64,
    over: Over,
    kombu: Measured,
}

/// Messages later than [`GOAL_P99_MS`] through the router, and where: at
/// the consumer; back from their last bucket that late already (the
/// broker's dead-lettering and the expired queue); delivered by the router
/// that late (the two before, plus the router's own time).
struct Over {
    consumer: usize,
    returned: u64,
    delivered: u64,
}

impl Over {
    fn describe(&self) -> String {
        format!(
            "over {GOAL_P99_MS} ms: {} at the consumer, {} back from the bucket, {} delivered by the router",
            self.consumer, self.returned, self.delivered
        )
    }

    fn cell(&self) -> String {
        format!("{} / {} / {}", self.consumer, self.returned, self.delivered)
    }
}

/// How many messages came back from their last bucket, and how many the
/// router delivered, later than [`GOAL_P99_MS`], so far (the histograms'
/// count less their bucket at the goal).
fn over_goal(router: &routerproc::RouterProcess) -> (f64, f64) {
    let le = format!("le=\"{}\"", GOAL_P99_MS as f64 / 1000.0);
    let over = |name: &str| {
        router.scrape(&format!("{name}_count"))
            - router.scrape_labelled(&format!("{name}_bucket"), &le)
    };
    (over(RETURNED), over(DELIVERY))
}

impl Row {
    fn router_pct(&self) -> f64 {
        pct(self.router.router_us, self.router.window)
    }

    fn broker_pct(&self, idle: &Idle) -> f64 {
        pct(self.router.broker_us, self.router.window) - idle.broker_pct
    }

    fn total_pct(&self, idle: &Idle) -> f64 {
        self.router_pct() + self.broker_pct(idle)
    }

    fn kombu_pct(&self, idle: &Idle) -> f64 {
        pct(self.kombu.broker_us, self.kombu.window) - idle.broker_pct
    }

    fn ratio(&self, idle: &Idle) -> Option<f64> {
        let kombu = self.kombu_pct(idle);
        (kombu >= MIN_RATIO_BASE_PCT).then(|| self.total_pct(idle) / kombu)
    }
}

/// Everything measured.
struct Report {
    idle: Idle,
    sustained: Sustained,
    rows: Vec<Row>,
}

/// The rates to run, ascending: `rates` and the share of `sustained`.
fn rates(rates: &[u64], sustained: Option<u64>) -> Vec<(u64, Option<u64>)> {
    let share = sustained
        .map(|s| ((s as f64 * SUSTAINED_SHARE).round() as u64, s))
        .filter(|(r, _)| *r > 0);
    let mut all: Vec<(u64, Option<u64>)> = rates
        .iter()
        .filter(|r| share.is_none_or(|(s, _)| s != **r))
        .map(|r| (*r, None))
        .chain(share.map(|(r, s)| (r, Some(s))))
        .collect();
    all.sort_unstable();
    all.dedup_by_key(|(r, _)| *r);
    all
}

async fn sweep(
    conn: &Connection,
    s: &Settings,
    router: &RouterProcess,
    config: &str,
    dest: &str,
    kombu: &Topology,
    pids: Pids,
) -> Report {
    let ingress = routerproc::rules_of(config, &router.prefix).names.ingress;
    let via_router = Via::Router {
        exchange: router.exchange(),
        dest,
    };
    let sustained = match s.sustained {
        Some(n) => Sustained::Given(n),
        None => search(conn, &via_router, &ingress).await,
    };
    println!("sustained: {}", sustained.describe());
    tokio::time::sleep(SETTLE).await;
    let idle = idle(pids).await;
    println!(
        "idle over {ROUTER_IDLE:?}: router {:.2} %, broker {:.2} % of a core",
        idle.router_pct, idle.broker_pct
    );
    let mut rows = Vec::new();
    for (rate, of_sustained) in rates(&s.rates, sustained.rate()) {
        let w = Workload::new(rate, s.max_delay_ms);
        let counted = (router.scrape(PLACED), router.scrape(DELIVERED));
        let over_before = over_goal(router);
        let routed = lane(conn, &via_router, &w, &format!("r{rate}"), pids).await;
        let placements =
            (router.scrape(PLACED) - counted.0) / (router.scrape(DELIVERED) - counted.1).max(1.0);
        let over_after = over_goal(router);
        let over = Over {
            consumer: routed.late.iter().filter(|l| **l > GOAL_P99_MS).count(),
            returned: (over_after.0 - over_before.0).round() as u64,
            delivered: (over_after.1 - over_before.1).round() as u64,
        };
        tokio::time::sleep(BETWEEN_LANES).await;
        let kombu = lane(conn, &Via::Kombu(kombu), &w, &format!("k{rate}"), pids).await;
        tokio::time::sleep(BETWEEN_LANES).await;
        let row = Row {
            rate,
            of_sustained,
            router: routed,
            placements,
            over,
            kombu,
        };
        println!(
            "  {rate:>6} msg/s, {} messages: router p99 {} ms ({}), {:.2} placements/msg, {:.2} % + broker {:.2} %; kombu p99 {} ms, broker {:.2} %; duplicates {} / {}",
            w.delays_ms.len(),
            row.router.quantile(0.99),
            row.over.describe(),
            row.placements,
            row.router_pct(),
            row.broker_pct(&idle),
            row.kombu.quantile(0.99),
            row.kombu_pct(&idle),
            row.router.duplicates,
            row.kombu.duplicates,
        );
        rows.push(row);
    }
    Report {
        idle,
        sustained,
        rows,
    }
}

/// Starts the router, runs the sweep and, whatever happened, stops the
/// router and removes what it declared.
async fn run(s: &Settings, config: &str, prefix: &str, kombu: &Topology, broker: u32) -> Report {
    let conn = within(
        "connect",
        Connection::connect(&s.url, ConnectionProperties::default()),
    )
    .await
    .expect("the broker");
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("a channel");
    let dest = format!("{prefix}.dest");
    within(
        "queue.declare",
        ch.queue_declare(
            dest.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("the destination queue");
    let started = AssertUnwindSafe(RouterProcess::start_with_config(
        config,
        &s.url,
        prefix,
        &[],
    ))
    .catch_unwind()
    .await;
    let router = match started {
        Ok(router) => router,
        Err(panic) => {
            let rules = routerproc::rules_of(config, prefix);
            let extra = [dest];
            let teardown = delay_router::testkit::teardown::remove_topology(&ch, &rules, &extra);
            let _ = tokio::time::timeout(BROKER_LIMIT, teardown).await;
            std::panic::resume_unwind(panic);
        }
    };
    let pids = Pids {
        router: router.pid(),
        broker,
    };
    let swept = AssertUnwindSafe(sweep(&conn, s, &router, config, &dest, kombu, pids))
        .catch_unwind()
        .await;
    match tokio::time::timeout(TEARDOWN_LIMIT, router.stop_and_remove(&ch, &[dest])).await {
        Ok(0) => {}
        Ok(held) => println!("the router's queues still held {held} messages at the end"),
        Err(_) => println!("the router's topology not removed within {TEARDOWN_LIMIT:?}"),
    }
    close_connection(&conn, "sweep done").await;
    swept.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

// ---- Output ----

fn ms_cells(m: &Measured) -> [String; 3] {
    [
        m.quantile(0.5).to_string(),
        m.quantile(0.99).to_string(),
        m.max().to_string(),
    ]
}

fn ratio_cell(row: &Row, idle: &Idle) -> String {
    row.ratio(idle).map_or("-".into(), |r| format!("{r:.2}"))
}

fn markdown(r: &Report) -> String {
    let mut out = String::from(
        "| rate (msg/s) | messages | p50 ms | p99 ms | max ms | early | over 10 ms: consumer / back from bucket / delivered | router % | broker % (net) | router+broker % | kombu p50 ms | kombu p99 ms | kombu max ms | kombu broker % (net) | ratio |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &r.rows {
        let rate = match row.of_sustained {
            Some(s) => format!("{} ({:.0} % of {s})", row.rate, SUSTAINED_SHARE * 100.0),
            None => row.rate.to_string(),
        };
        let [p50, p99, max] = ms_cells(&row.router);
        let [k50, k99, kmax] = ms_cells(&row.kombu);
        out.push_str(&format!(
            "| {rate} | {} | {p50} | {p99} | {max} | {} | {} | {:.2} | {:.2} | {:.2} | {k50} | {k99} | {kmax} | {:.2} | {} |\n",
            row.router.late.len(),
            row.router.early(),
            row.over.cell(),
            row.router_pct(),
            row.broker_pct(&r.idle),
            row.total_pct(&r.idle),
            row.kombu_pct(&r.idle),
            ratio_cell(row, &r.idle),
        ));
    }
    out
}

fn csv(r: &Report) -> String {
    let mut out = String::from(
        "rate,of_sustained,messages,p50_ms,p99_ms,max_ms,early,router_cpu_pct,broker_cpu_net_pct,router_plus_broker_pct,kombu_p50_ms,kombu_p99_ms,kombu_max_ms,kombu_early,kombu_broker_cpu_net_pct,ratio,router_placements_per_msg,over_goal_consumer,over_goal_returned,over_goal_delivered\n",
    );
    for row in &r.rows {
        let [p50, p99, max] = ms_cells(&row.router);
        let [k50, k99, kmax] = ms_cells(&row.kombu);
        out.push_str(&format!(
            "{},{},{},{p50},{p99},{max},{},{:.3},{:.3},{:.3},{k50},{k99},{kmax},{},{:.3},{},{:.3},{},{},{}\n",
            row.rate,
            row.of_sustained.map_or(String::new(), |s| s.to_string()),
            row.router.late.len(),
            row.router.early(),
            row.router_pct(),
            row.broker_pct(&r.idle),
            row.total_pct(&r.idle),
            row.kombu.early(),
            row.kombu_pct(&r.idle),
            row.ratio(&r.idle).map_or(String::new(), |x| format!("{x:.3}")),
            row.placements,
            row.over.consumer,
            row.over.returned,
            row.over.delivered,
        ));
    }
    out
}

/// What the table is of, above it.
fn context(r: &Report, s: &Settings, kombu: &Topology, broker: u32) -> String {
    let base = routerproc::config_path();
    let base = Path::new(&base)
        .file_name()
        .map_or(base.clone(), |f| f.to_string_lossy().into_owned());
    let (short, long) = ranges(s.max_delay_ms);
    format!(
        "Router: {base} with the ladder {}, {} buckets; kombu {} native delayed delivery, {} queues. \
         Per rate {MESSAGES} persistent 512-byte messages or {PUBLISH_FOR:?} of them, whichever is first; \
         delays to the ms, alternately {}..{} ms and {}..{} ms, every {EXACT_EVERY}th exactly a rung. \
         Lateness: arrival minus (publish + requested delay), ms. CPU: % of one core from the first publish to the last arrival.\n\n\
         Sustained rate: {}. Idle over {ROUTER_IDLE:?}: router {:.2} %, broker (pid {broker}) {:.2} % of a core, subtracted from every broker figure. \
         Ratio: (router + broker) / kombu's broker, where kombu's is at least {MIN_RATIO_BASE_PCT} %.\n",
        RUNGS.join(", "),
        s.queue_type,
        kombu.kombu,
        s.queue_type,
        short.0,
        short.1,
        long.0,
        long.1,
        r.sustained.describe(),
        r.idle.router_pct,
        r.idle.broker_pct,
    )
}

/// `target/sweep`.
fn out_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("sweep")
}

// ---- Charts ----

/// One line of a chart: a value per rate.
struct Line {
    label: &'static str,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

impl Line {
    fn new(
        label: &'static str,
        color: usize,
        dashed: bool,
        rows: &[Row],
        y: impl Fn(&Row) -> f64,
    ) -> Self {
        Self {
            label,
            color: plot::CURVE[color],
            dashed,
            points: rows.iter().map(|r| (r.rate as f64, y(r))).collect(),
        }
    }
}

/// A chart's title and y axis: log scale from `y_floor` (lower values are
/// drawn there).
struct Axes {
    title: String,
    y_desc: &'static str,
    y_floor: f64,
    y_label: fn(&f64) -> String,
}

const LEGEND_ROW: u32 = 22;

/// Whether `v` is 1, 2 or 5 times a power of ten: the ticks labelled on a
/// log axis (the others would run into each other).
fn labelled(v: f64) -> bool {
    let mantissa = v / 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-6)
}

fn fmt_rate(v: &f64) -> String {
    if labelled(*v) {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

fn fmt_pct(v: &f64) -> String {
    if !labelled(*v) {
        return String::new();
    }
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$} %")
}

/// A chart of `lines` against rate, with the legend under it.
fn draw(path: &Path, axes: &Axes, lines: &[Line], text: bool) -> plot::DrawResult {
    let points = || lines.iter().flat_map(|l| l.points.iter().copied());
    if points().next().is_none() {
        return Err("no rate measured".into());
    }
    let x_min = points().map(|(x, _)| x).fold(f64::MAX, f64::min);
    let x_max = points().map(|(x, _)| x).fold(f64::MIN, f64::max);
    let y_max = points()
        .map(|(_, y)| y * 2.0)
        .fold(axes.y_floor * 10.0, f64::max);
    let rows = if text { lines.len() as u32 } else { 0 };
    let (w, h) = plot::SIZE;
    let root = BitMapBackend::new(path, (w, h + 12 + LEGEND_ROW * rows)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(h);
    let mut builder = ChartBuilder::on(&top);
    builder.margin(20);
    if text {
        builder
            .caption(&axes.title, (plot::FONT, 22))
            .x_label_area_size(50)
            .y_label_area_size(70);
    }
    let mut chart = builder.build_cartesian_2d(
        (x_min / 1.5..x_max * 1.5).log_scale(),
        (axes.y_floor..y_max).log_scale(),
    )?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("publish rate, msg/s")
            .y_desc(axes.y_desc)
            .x_label_formatter(&fmt_rate)
            .y_label_formatter(&axes.y_label)
            .label_style((plot::FONT, 14))
            .axis_desc_style((plot::FONT, 15));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    let style = (plot::FONT, 15).into_text_style(&bottom);
    for (k, line) in lines.iter().enumerate() {
        let stroke = line.color.stroke_width(2);
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|(x, y)| (*x, y.max(axes.y_floor)))
            .collect();
        if line.dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, stroke))?;
        } else {
            chart.draw_series(LineSeries::new(points.clone(), stroke))?;
        }
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new(*p, 3, line.color.filled())),
        )?;
        if text {
            let y = 10 + (LEGEND_ROW * k as u32) as i32;
            let x = 84;
            let sample = if line.dashed {
                vec![vec![(x, y), (x + 9, y)], vec![(x + 15, y), (x + 24, y)]]
            } else {
                vec![vec![(x, y), (x + 24, y)]]
            };
            for segment in sample {
                bottom.draw(&PathElement::new(segment, stroke))?;
            }
            bottom.draw(&Text::new(
                line.label,
                (x + 32, y),
                style.pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
    }
    root.present()?;
    Ok(())
}

/// `lateness.png` and `cpu.png` in `dir`: per file its path or what went wrong.
fn charts(dir: &Path, r: &Report, s: &Settings) -> Vec<Result<PathBuf, String>> {
    let text = match plot::load_font() {
        Ok(()) => true,
        Err(why) => {
            println!("charts drawn without text: {why}");
            false
        }
    };
    let rows = &r.rows;
    let lateness = [
        Line::new("router p50", 2, false, rows, |row| {
            row.router.quantile(0.5) as f64
        }),
        Line::new("router p99", 1, false, rows, |row| {
            row.router.quantile(0.99) as f64
        }),
        Line::new("router max", 0, false, rows, |row| row.router.max() as f64),
        Line::new("kombu p50", 2, true, rows, |row| {
            row.kombu.quantile(0.5) as f64
        }),
        Line::new("kombu p99", 1, true, rows, |row| {
            row.kombu.quantile(0.99) as f64
        }),
        Line::new("kombu max", 0, true, rows, |row| row.kombu.max() as f64),
    ];
    let idle = &r.idle;
    let cpu = [
        Line::new("router", 0, false, rows, |row| row.router_pct()),
        Line::new("router + broker (net of idle)", 1, false, rows, |row| {
            row.total_pct(idle)
        }),
        Line::new("kombu: broker (net of idle)", 2, true, rows, |row| {
            row.kombu_pct(idle)
        }),
    ];
    let lateness_axes = Axes {
        title: format!(
            "Lateness against rate: router ({} buckets) and kombu",
            s.queue_type
        ),
        y_desc: "lateness (at or under 1 ms drawn at 1 ms)",
        y_floor: 1.0,
        y_label: plot::fmt_ms,
    };
    let cpu_axes = Axes {
        title: "CPU against rate, % of one core".into(),
        y_desc: "% of one core (at or under 0.01 % drawn there)",
        y_floor: 0.01,
        y_label: fmt_pct,
    };
    vec![
        plot::write_png(&dir.join("lateness.png"), |p| {
            draw(p, &lateness_axes, &lateness, text)
        }),
        plot::write_png(&dir.join("cpu.png"), |p| draw(p, &cpu_axes, &cpu, text)),
    ]
}

/// Prints the table and writes it, the CSV and the charts to [`out_dir`].
fn report(r: &Report, s: &Settings, kombu: &Topology, broker: u32) {
    let context = context(r, s, kombu, broker);
    let table = markdown(r);
    println!();
    println!("{context}");
    println!("{table}");
    let dir = out_dir();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        println!("{}: {e}", dir.display());
        return;
    }
    let mut files = vec![
        write(&dir.join("sweep.md"), &format!("{context}\n{table}")),
        write(&dir.join("sweep.csv"), &csv(r)),
    ];
    files.extend(charts(&dir, r, s));
    for file in files {
        match file {
            Ok(path) => println!("written: {}", path.display()),
            Err(e) => println!("not written: {e}"),
        }
    }
}

fn write(path: &Path, text: &str) -> Result<PathBuf, String> {
    std::fs::write(path, text)
        .map(|()| path.to_path_buf())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let s = Settings::from_env();
    let python = kombu_topology::python();
    let broker = procfs::broker_pid();
    let tag = rand::random::<u32>() & 0xff_ffff;
    let prefix = format!("sweep-{tag:06x}");
    let config = write_config(&prefix);
    // kombu's routing key for every whole second from 1 up to the longest
    // delay (kombu refuses a countdown of 0).
    let countdowns: Vec<u64> = (1..=s.max_delay_ms.div_ceil(1000).max(1)).collect();
    let declared = std::panic::catch_unwind(|| {
        Topology::declare(
            &python,
            &s.url,
            &format!("sweepk{tag:06x}"),
            &s.queue_type,
            &countdowns,
        )
    });
    let kombu = declared.unwrap_or_else(|panic| {
        let _ = std::fs::remove_file(&config);
        std::panic::resume_unwind(panic)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(run(&s, &config, &prefix, &kombu, broker))
    }));
    drop(rt);
    kombu.delete(&python, &s.url);
    let _ = std::fs::remove_file(&config);
    let r = outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    report(&r, &s, &kombu, broker);
}
