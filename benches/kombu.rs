//! Against the broker-only design: the same delayed messages through the
//! router (the shipped `buckets.toml`, cascade) and through kombu's native
//! delayed delivery (Celery's implementation of the NServiceBus topology: 28
//! levels of TTL queues and exchanges, the delay in whole seconds as binary
//! digits in the routing key, no consumer in between), side by side on one
//! broker, in alternating order.
//!
//! Per design: lateness (arrival minus publish time plus requested delay)
//! p50/p90/p99/max and early deliveries; queue waits per message (router:
//! its bucket placements, from its metrics; kombu: the dead-letterings
//! RabbitMQ counted in `x-death`); and CPU per message from the first publish
//! to the last arrival: the broker's (its beam.smp process), the router's
//! (its process), and their sum. The broker's idle rate, measured for a few
//! seconds before each lane, is printed with it, and the net figures
//! subtract it. The publisher and consumer are this bench (the same code for
//! both designs), and their CPU is in neither figure.
//!
//! Workload: BENCH_MESSAGES (10000) persistent messages, delays uniform in
//! 1..60 s to the millisecond (kombu is given the delay rounded up to its
//! whole second), published evenly over BENCH_SPREAD_SECS (20) seconds.
//! BENCH_ROUNDS (2) rounds, each running both designs. BENCH_BASELINE=/path
//! to another delay-router build runs it too in every round, beside the
//! router (BENCH_BIN or the one `cargo bench` built), so that two builds are
//! compared in the same rounds.
//!
//! kombu is installed from PyPI into a virtualenv (BENCH_VENV, default
//! `target/tmp/kombu-venv`) on first use; its code is never part of this
//! repository. `benches/kombu/driver.py` asks kombu to declare its topology
//! and to compute the routing keys (benches/kombu_topology, shared with the
//! sweep bench). The broker's process id comes from
//! `BENCH_CTL eval 'os:getpid().'` (default `rabbitmqctl`), or BENCH_BROKER_PID.
//!
//! `cargo bench --bench kombu`

mod kombu_topology;
mod procfs;
mod routerproc;
mod workload;

use delay_router::testkit::consume::{Acks, Consumer};
use kombu_topology::Topology;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use routerproc::RouterProcess;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::{Rng, env_or, percentile};

const MIN_DELAY_MS: u64 = 1_000;
const MAX_DELAY_MS: u64 = 60_000;
const IDLE_SAMPLE: Duration = Duration::from_secs(5);

fn url() -> String {
    std::env::var("BENCH_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

#[derive(Clone, Copy, PartialEq)]
enum Design {
    Router,
    /// The router built from BENCH_BASELINE.
    Baseline,
    Kombu,
}

impl Design {
    fn name(self) -> &'static str {
        match self {
            Design::Router => "router (cascade, shipped ladder)",
            Design::Baseline => "baseline router (BENCH_BASELINE)",
            Design::Kombu => "kombu native delayed delivery",
        }
    }

    fn is_router(self) -> bool {
        self != Design::Kombu
    }
}

/// One design's figures in one round.
struct Measured {
    design: Design,
    late: Vec<i64>,
    waits_per_msg: f64,
    window: Duration,
    broker_us: u64,
    router_us: u64,
    /// The broker's CPU while idle, µs per second.
    idle_us_per_s: f64,
    router_rss_kib: u64,
}

impl Measured {
    fn per_msg(&self, us: f64) -> f64 {
        us / self.late.len() as f64
    }
    fn broker_net_us(&self) -> f64 {
        self.broker_us as f64 - self.idle_us_per_s * self.window.as_secs_f64()
    }
}

/// Where a lane publishes each message.
enum Target<'a> {
    /// The router's exchange, with the destination (exchange, routing key)
    /// in headers.
    Router {
        exchange: String,
        destination: (String, String),
    },
    /// kombu's top level, with the routing key of each message's countdown.
    Kombu(&'a Topology),
}

struct Workload {
    delays_ms: Vec<u64>,
    spread: Duration,
}

/// Publishes the workload to `target` and collects arrivals from `queue`;
/// returns lateness (ms, sorted), the x-death count per message and the
/// window from first publish to last arrival.
async fn drive(
    conn: &Connection,
    w: &Workload,
    target: &Target<'_>,
    queue: &str,
) -> (Vec<i64>, f64, Duration) {
    let n = w.delays_ms.len();
    let arrived: Arc<Mutex<HashMap<usize, (Instant, i64)>>> = Arc::default();
    let mut consumer = Consumer::open(conn, queue, Acks::Auto).await;
    let sink = arrived.clone();
    let collector = tokio::spawn(async move {
        while let Some(d) = consumer.next_within(Duration::from_secs(600)).await {
            let at = Instant::now();
            let id: usize = d
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .as_str()
                .parse()
                .unwrap();
            sink.lock()
                .unwrap()
                .insert(id, (at, dead_letterings(&d.properties)));
        }
    });
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let start = Instant::now();
    let mut sent = Vec::with_capacity(n);
    let mut confirms = Vec::with_capacity(n);
    for (i, delay) in w.delays_ms.iter().enumerate() {
        tokio::time::sleep_until((start + w.spread.mul_f64(i as f64 / n as f64)).into()).await;
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(i.to_string().into());
        sent.push(Instant::now());
        let confirm = match target {
            Target::Router {
                exchange,
                destination: (dest_exchange, key),
            } => {
                let mut h = FieldTable::default();
                h.insert(
                    "x-requested-delay".into(),
                    AMQPValue::LongLongInt(*delay as i64),
                );
                h.insert(
                    "x-original-exchange".into(),
                    AMQPValue::LongString(LongString::from(dest_exchange.as_str())),
                );
                h.insert(
                    "x-original-routing-key".into(),
                    AMQPValue::LongString(LongString::from(key.as_str())),
                );
                ch.basic_publish(
                    exchange.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &[0u8; 512],
                    props.with_headers(h),
                )
                .await
            }
            Target::Kombu(topology) => topology.publish(&ch, i, &[0u8; 512], props).await,
        };
        confirms.push(confirm.unwrap());
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack(), "publish refused");
    }
    let deadline = Instant::now() + Duration::from_secs(MAX_DELAY_MS / 1000 + 120);
    while arrived.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "not every message arrived");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    collector.abort();
    let _ = ch.close(200, "bye".into()).await;
    let arrived = arrived.lock().unwrap();
    let last = arrived.values().map(|(at, _)| *at).max().unwrap();
    let mut late: Vec<i64> = (0..n)
        .map(|i| arrived[&i].0.duration_since(sent[i]).as_millis() as i64 - w.delays_ms[i] as i64)
        .collect();
    late.sort_unstable();
    let deaths = arrived.values().map(|(_, d)| *d).sum::<i64>() as f64 / n as f64;
    (late, deaths, last.duration_since(start))
}

/// How many times RabbitMQ dead-lettered the message (the sum of `x-death` counts).
fn dead_letterings(p: &BasicProperties) -> i64 {
    let Some(AMQPValue::FieldArray(deaths)) = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-death").cloned())
    else {
        return 0;
    };
    deaths
        .as_slice()
        .iter()
        .filter_map(|d| match d {
            AMQPValue::FieldTable(t) => match t.inner().get("count") {
                Some(AMQPValue::LongLongInt(c)) => Some(*c),
                Some(AMQPValue::LongInt(c)) => Some(i64::from(*c)),
                _ => None,
            },
            _ => None,
        })
        .sum()
}

async fn idle_rate(broker: u32) -> f64 {
    let (before, _) = procfs::cpu_and_rss(broker);
    let t = Instant::now();
    tokio::time::sleep(IDLE_SAMPLE).await;
    let (after, _) = procfs::cpu_and_rss(broker);
    (after - before) as f64 / t.elapsed().as_secs_f64()
}

async fn kombu_lane(conn: &Connection, w: &Workload, python: &Path, broker: u32) -> Measured {
    let url = url();
    let prefix = format!("kombu{:06x}", rand::random::<u32>() & 0xff_ffff);
    let countdowns: Vec<u64> = w.delays_ms.iter().map(|d| d.div_ceil(1000)).collect();
    let topology = Topology::declare(python, &url, &prefix, "classic", &countdowns);
    let target = Target::Kombu(&topology);
    let idle = idle_rate(broker).await;
    let (b0, _) = procfs::cpu_and_rss(broker);
    let (late, waits, window) = drive(conn, w, &target, &topology.queue).await;
    let (b1, _) = procfs::cpu_and_rss(broker);
    topology.delete(python, &url);
    println!("  (kombu {})", topology.kombu);
    Measured {
        design: Design::Kombu,
        late,
        waits_per_msg: waits,
        window,
        broker_us: b1 - b0,
        router_us: 0,
        idle_us_per_s: idle,
        router_rss_kib: 0,
    }
}

async fn router_lane(
    conn: &Connection,
    ch: &Channel,
    w: &Workload,
    broker: u32,
    design: Design,
) -> Measured {
    let url = url();
    let prefix = format!("kbench-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let dest = format!("{prefix}.dest");
    ch.queue_declare(
        dest.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let router = match (design, std::env::var_os("BENCH_BASELINE")) {
        (Design::Baseline, Some(bin)) => {
            let config = routerproc::config_path();
            RouterProcess::start_binary(bin.as_ref(), &config, &url, &prefix, &[]).await
        }
        _ => RouterProcess::start(&url, &prefix, &[]).await,
    };
    let target = Target::Router {
        exchange: router.exchange(),
        destination: (String::new(), dest.clone()),
    };
    let idle = idle_rate(broker).await;
    let (b0, _) = procfs::cpu_and_rss(broker);
    let (r0, _) = procfs::cpu_and_rss(router.pid());
    let (late, _, window) = drive(conn, w, &target, &dest).await;
    let (b1, _) = procfs::cpu_and_rss(broker);
    let (r1, rss) = procfs::cpu_and_rss(router.pid());
    let placed = router.scrape("delay_router_messages_placed_total");
    let delivered = router.scrape("delay_router_messages_delivered_total");
    router.stop_and_remove(ch, &[dest]).await;
    Measured {
        design,
        late,
        waits_per_msg: placed / delivered.max(1.0),
        window,
        broker_us: b1 - b0,
        router_us: r1 - r0,
        idle_us_per_s: idle,
        router_rss_kib: rss,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_or("BENCH_MESSAGES", 10_000) as usize;
    let rounds = env_or("BENCH_ROUNDS", 2);
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let w = Workload {
        delays_ms: (0..n)
            .map(|_| MIN_DELAY_MS + ((MAX_DELAY_MS - MIN_DELAY_MS) as f64 * rng.next_f64()) as u64)
            .collect(),
        spread: Duration::from_secs(env_or("BENCH_SPREAD_SECS", 20)),
    };
    let python = kombu_topology::python();
    let broker = procfs::broker_pid();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let results = rt.block_on(async {
        let conn = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .expect("broker");
        let ch = conn.create_channel().await.unwrap();
        let mut results = Vec::new();
        let baseline = std::env::var_os("BENCH_BASELINE").is_some();
        for round in 0..rounds {
            let mut order = vec![Design::Kombu, Design::Router];
            if baseline {
                order.push(Design::Baseline);
            }
            if round % 2 == 1 {
                order.reverse();
            }
            for design in order {
                println!("round {}: {}", round + 1, design.name());
                let m = match design {
                    Design::Router | Design::Baseline => {
                        router_lane(&conn, &ch, &w, broker, design).await
                    }
                    Design::Kombu => kombu_lane(&conn, &w, &python, broker).await,
                };
                results.push((round + 1, m));
            }
        }
        results
    });
    println!();
    println!(
        "{n} persistent 512-byte messages, delays uniform {MIN_DELAY_MS}..{MAX_DELAY_MS} ms, published over {:?}; broker pid {broker}",
        w.spread
    );
    println!();
    println!(
        "| round | design | lateness p50 | p90 | p99 | max | early | queue waits/msg | broker CPU/msg | router CPU/msg | total CPU/msg | net of broker idle | broker idle | router peak RSS |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (round, m) in &results {
        let early = m.late.iter().filter(|l| **l < 0).count();
        let total = m.per_msg((m.broker_us + m.router_us) as f64);
        let net = m.per_msg(m.broker_net_us() + m.router_us as f64);
        println!(
            "| {round} | {} | {} ms | {} ms | {} ms | {} ms | {early} | {:.2} | {:.0} µs | {} | {:.0} µs | {:.0} µs | {:.1}% of a core | {} |",
            m.design.name(),
            percentile(&m.late, 0.5),
            percentile(&m.late, 0.9),
            percentile(&m.late, 0.99),
            m.late[m.late.len() - 1],
            m.waits_per_msg,
            m.per_msg(m.broker_us as f64),
            if m.design.is_router() {
                format!("{:.0} µs", m.per_msg(m.router_us as f64))
            } else {
                "-".into()
            },
            total,
            net,
            m.idle_us_per_s / 10_000.0,
            if m.design.is_router() {
                format!("{:.1} MiB", m.router_rss_kib as f64 / 1024.0)
            } else {
                "-".into()
            },
        );
    }
    // Per round: one design's figure over another's.
    let ratio = |over: Design, under: Design, f: &dyn Fn(&Measured) -> f64| {
        let mut r: Vec<f64> = (1..=rounds)
            .filter_map(|round| {
                let of = |d: Design| {
                    results
                        .iter()
                        .find(|(r, m)| *r == round && m.design == d)
                        .map(|(_, m)| f(m))
                };
                Some(of(over)? / of(under)?)
            })
            .collect();
        r.sort_by(|a, b| a.total_cmp(b));
        r
    };
    let total = |m: &Measured| m.per_msg((m.broker_us + m.router_us) as f64);
    let net = |m: &Measured| m.per_msg(m.broker_net_us() + m.router_us as f64);
    println!();
    println!(
        "router / kombu, CPU per delayed message, per round: total {:.2?}, net of broker idle {:.2?}",
        ratio(Design::Router, Design::Kombu, &total),
        ratio(Design::Router, Design::Kombu, &net)
    );
    if results.iter().any(|(_, m)| m.design == Design::Baseline) {
        println!(
            "baseline / kombu, per round: total {:.2?}, net {:.2?}; router / baseline, per round: total {:.2?}, net {:.2?}",
            ratio(Design::Baseline, Design::Kombu, &total),
            ratio(Design::Baseline, Design::Kombu, &net),
            ratio(Design::Router, Design::Baseline, &total),
            ratio(Design::Router, Design::Baseline, &net)
        );
    }
}
