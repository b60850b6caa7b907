//! Precision: the same mixed workload through each placement strategy, side by
//! side in one run on the same broker. Per strategy: lateness (delivered minus
//! requested, measured from just before the publish to the router) p50, p90,
//! p99 and max; deliveries early (must be 0); bucket hops per message; and the
//! broker work per message that the hops cost.
//!
//! Workload: BENCH_MESSAGES (default 2000) messages per strategy, delays
//! log-uniform from 200 ms to 60 s, sent evenly over BENCH_SPREAD_SECS (60)
//! seconds; ladder 1s, 2s, 4s, 8s, 16s, 32s.
//!
//! `cargo bench --bench precision`
//! BENCH_URL and BENCH_QUEUE_TYPE (classic, quorum) choose the broker and the
//! queue type (a strategy the connected broker cannot give is left out, as the
//! router would refuse it: `priority` with quorum before RabbitMQ 4.3).
//! BENCH_BASELINE=/path/to/another/delay-router adds two cascade lanes run as
//! processes, this build's binary and that one, to compare two builds.
//!
//! Plots (benches/plot): per lane the lateness CDF with p50, p90 and p99
//! marked, `docs/precision/lateness-<strategy>.png`, and all lanes in
//! `lateness-all.png`; BENCH_PLOT_DIR writes them elsewhere, BENCH_PLOT_FONT
//! names the .ttf for their text (default: DejaVu or Liberation Sans from
//! /usr/share/fonts; none: plots without text). A plot that cannot be
//! written is reported and the bench goes on.

mod plot;
mod workload;

use delay_router::config::Config;
use delay_router::core::compat::{self, Verdict};
use delay_router::core::placement::PlacementStrategy;
use delay_router::router;
use delay_router::router::stats::Stats;
use delay_router::testkit::consume::{Acks, Consumer};
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::{Rng, env_or, percentile};

/// BENCH_URL names another broker (e.g. the 4.3 node on 5682).
fn url() -> String {
    std::env::var("BENCH_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}
const LADDER: [&str; 6] = ["1s", "2s", "4s", "8s", "16s", "32s"];
const STRATEGIES: [PlacementStrategy; 3] = [
    PlacementStrategy::RoundUp,
    PlacementStrategy::Priority,
    PlacementStrategy::Cascade,
];
const MIN_DELAY_MS: f64 = 200.0;
const MAX_DELAY_MS: f64 = 60_000.0;

/// How a lane's router runs.
enum Runner {
    /// In this process, with its counters readable.
    InProcess {
        stats: Arc<Stats>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<Result<(), router::RouterError>>,
    },
    /// A binary in its own process (killed when dropped).
    Binary(std::process::Child),
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Runner::Binary(child) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A message's publish time, its delay, and its `x-deliver-at` (ms).
type Sent = (Instant, u64, Option<i64>);

struct Lane {
    label: String,
    strategy: PlacementStrategy,
    /// Sends `x-deliver-at` (publish time + delay) instead of the delay.
    deliver_at: bool,
    prefix: String,
    dest: String,
    runner: Runner,
    /// When each was published, its delay, and its `x-deliver-at` (ms).
    sent: Arc<Mutex<HashMap<usize, Sent>>>,
    /// When each arrived, and the wall clock then (ns since the epoch).
    arrived: Arc<Mutex<HashMap<usize, (Instant, u128)>>>,
    /// Consumes the destination; aborted before the queue is deleted.
    collector: tokio::task::JoinHandle<()>,
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_or("BENCH_MESSAGES", 2000) as usize;
    let spread = Duration::from_secs(env_or("BENCH_SPREAD_SECS", 60));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let measured = rt.block_on(async move {
        let url = url();
        // BENCH_QUEUE_TYPE=quorum: every router queue a quorum queue.
        let queue_type = std::env::var("BENCH_QUEUE_TYPE").unwrap_or_else(|_| "classic".into());
        let conn = Connection::connect(&url, ConnectionProperties::default()).await.expect("broker");
        let ch = conn.create_channel().await.unwrap();
        let mut lanes = Vec::new();
        // (label, strategy, binary to run (None: in this process), x-deliver-at)
        let mut setups: Vec<(String, PlacementStrategy, Option<std::path::PathBuf>, bool)> =
            STRATEGIES.iter().map(|s| (s.to_string(), *s, None, false)).collect();
        setups.push(("cascade, x-deliver-at".into(), PlacementStrategy::Cascade, None, true));
        if let Some(baseline) = std::env::var_os("BENCH_BASELINE") {
            let this = std::path::PathBuf::from(env!("CARGO_BIN_EXE_delay-router"));
            setups.push(("cascade, this binary".into(), PlacementStrategy::Cascade, Some(this), false));
            setups.push(("cascade, baseline binary".into(), PlacementStrategy::Cascade, Some(baseline.into()), false));
        }
        for (label, strategy, binary, deliver_at) in setups {
            let prefix = format!("prec-{strategy}-{:06x}", rand::random::<u32>() & 0xff_ffff);
            let mut text = format!("[amqp]\nurl = \"{url}\"\n[topology]\nprefix = \"{prefix}\"\nqueue_type = \"{queue_type}\"\n[placement]\nstrategy = \"{strategy}\"\n");
            for r in LADDER {
                text.push_str(&format!("[[bucket]]\nttl = \"{r}\"\n"));
            }
            let config = match Config::from_toml(&text) {
                Ok(c) => c,
                Err(e) => {
                    println!("{label}: not run ({e})");
                    continue;
                }
            };
            // What the broker cannot give, the router refuses: leave it out.
            let version = delay_router::broker::server::server_info(&config.urls[0], None)
                .await
                .ok()
                .and_then(|i| i.major_minor());
            if let Verdict::Refuse(why) = compat::judge(strategy, delay_router::core::decision::Rules::from_config(&config).queue_type, version) {
                println!("{label}: not run ({why})");
                continue;
            }
            let dest = format!("{prefix}.dest");
            ch.queue_declare(dest.as_str().into(), QueueDeclareOptions::durable(), FieldTable::default()).await.unwrap();
            let runner = match &binary {
                None => {
                    let stats = Arc::new(Stats::default());
                    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                    let task = tokio::spawn(router::run_with_stats(config, async move { let _ = rx.await; }, stats.clone()));
                    Runner::InProcess { stats, stop: Some(tx), task }
                }
                Some(bin) => {
                    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
                    std::fs::write(&path, &text).unwrap();
                    let child = std::process::Command::new(bin)
                        .args(["run", "--config"])
                        .arg(&path)
                        .env("RUST_LOG", "warn")
                        .spawn()
                        .expect("router binary");
                    Runner::Binary(child)
                }
            };
            let arrived = Arc::new(Mutex::new(HashMap::new()));
            let mut consumer = Consumer::open(&conn, &dest, Acks::Auto).await;
            let sink = arrived.clone();
            let collector = tokio::spawn(async move {
                while let Some(d) = consumer.next_within(Duration::from_secs(600)).await {
                    let at = Instant::now();
                    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
                    let id: usize = d.properties.message_id().as_ref().unwrap().as_str().parse().unwrap();
                    sink.lock().unwrap().insert(id, (at, wall));
                }
            });
            lanes.push(Lane { label, strategy, deliver_at, prefix, dest, runner, sent: Default::default(), arrived, collector });
        }
        // Let every router declare and start consuming.
        tokio::time::sleep(Duration::from_secs(3)).await;

        let pub_ch = conn.create_channel().await.unwrap();
        pub_ch.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let start = Instant::now();
        // The wall clock against the monotonic one: `x-deliver-at` is a wall
        // clock time, lateness is measured on the monotonic clock.
        let wall_start = std::time::SystemTime::now();
        let mut confirms = Vec::new();
        for i in 0..n {
            let delay = (MIN_DELAY_MS * (MAX_DELAY_MS / MIN_DELAY_MS).powf(rng.next_f64())).round() as u64;
            let due = start + spread.mul_f64(i as f64 / n as f64);
            tokio::time::sleep_until(due.into()).await;
            for lane in &lanes {
                let mut h = FieldTable::default();
                let t0 = Instant::now();
                let mut header_ms = None;
                if lane.deliver_at {
                    // The time now, rounded up to the millisecond: the
                    // header's time is then at or after t0 + delay.
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
                    let now_ms = now.as_nanos().div_ceil(1_000_000) as i64;
                    header_ms = Some(now_ms + delay as i64);
                    h.insert("x-deliver-at".into(), AMQPValue::LongLongInt(now_ms + delay as i64));
                } else {
                    h.insert("x-requested-delay".into(), AMQPValue::LongLongInt(delay as i64));
                }
                h.insert("x-original-exchange".into(), AMQPValue::LongString(LongString::from("")));
                h.insert("x-original-routing-key".into(), AMQPValue::LongString(LongString::from(lane.dest.as_str())));
                let props = BasicProperties::default().with_delivery_mode(2).with_message_id(i.to_string().into()).with_headers(h);
                let exchange = format!("{}.router", lane.prefix);
                lane.sent.lock().unwrap().insert(i, (t0, delay, header_ms));
                confirms.push(pub_ch.basic_publish(exchange.as_str().into(), "".into(), BasicPublishOptions::default(), b"precision", props).await.unwrap());
            }
        }
        for c in confirms {
            assert!(c.await.unwrap().is_ack());
        }
        let deadline = Instant::now() + Duration::from_secs(180);
        while lanes.iter().any(|l| l.arrived.lock().unwrap().len() < n) {
            assert!(Instant::now() < deadline, "not every message arrived");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let elapsed = start.elapsed();
        let wall_elapsed = wall_start.elapsed().unwrap_or_default();
        let drift_ms = (wall_elapsed.as_secs_f64() - elapsed.as_secs_f64()) * 1000.0;

        println!("{n} messages per strategy, delays log-uniform {MIN_DELAY_MS} ms..{MAX_DELAY_MS} ms, sent over {spread:?}; ladder {}; run {elapsed:.0?}", LADDER.join(", "));
        println!("the wall clock moved {drift_ms:+.1} ms against the monotonic clock over the run");
        println!();
        println!("| strategy | lateness p50 | p90 | p99 | max | early | hops/msg | router publishes/msg | held by router |");
        println!("|---|---|---|---|---|---|---|---|---|");
        let mut measured = Vec::new();
        for lane in &mut lanes {
            let sent = lane.sent.lock().unwrap();
            let arrived = lane.arrived.lock().unwrap();
            let mut late: Vec<i64> = sent
                .iter()
                .map(|(i, (t0, delay, _))| {
                    let waited = arrived[i].0.duration_since(*t0).as_millis() as i64;
                    waited - *delay as i64
                })
                .collect();
            late.sort();
            let early = late.iter().filter(|l| **l < 0).count();
            if early > 0 || lane.deliver_at {
                // Early by the monotonic clock; was any early by the wall
                // clock too, against its `x-deliver-at`?
                let before_header = sent
                    .iter()
                    .filter(|(i, (_, _, h))| h.is_some_and(|h| arrived[i].1 < h as u128 * 1_000_000))
                    .count();
                let by = if early > 0 { format!(", by up to {} ms", -late[0]) } else { String::new() };
                println!("{}: {early} early{by}; {before_header} arrived before their x-deliver-at by the wall clock", lane.label);
            }
            let (hops, counters) = match &lane.runner {
                Runner::InProcess { stats, .. } => {
                    let s = stats.snapshot();
                    let hops = s.placed as f64 / s.delivered.max(1) as f64;
                    (Some(hops), format!("{hops:.2} | {:.2} | {}", hops + 1.0, s.held))
                }
                Runner::Binary(_) => (None, "- | - | -".to_owned()),
            };
            println!(
                "| {} | {} ms | {} ms | {} ms | {} ms | {early} | {counters} |",
                lane.label,
                percentile(&late, 0.5),
                percentile(&late, 0.9),
                percentile(&late, 0.99),
                late[late.len() - 1],
            );
            measured.push(plot::Lateness { label: lane.label.clone(), sorted_ms: late, hops });
        }
        for lane in &mut lanes {
            if let Runner::InProcess { stop, .. } = &mut lane.runner
                && let Some(tx) = stop.take()
            {
                let _ = tx.send(());
            }
        }
        for mut lane in lanes {
            lane.collector.abort();
            match &mut lane.runner {
                Runner::InProcess { task, .. } => task.await.unwrap().unwrap(),
                Runner::Binary(child) => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            let rules = delay_router::core::decision::Rules::new(
                &delay_router::core::ladder::Ladder::from_labels(&LADDER).unwrap(),
                lane.strategy,
                &lane.prefix,
                "guest",
            );
            delay_router::testkit::teardown::remove_topology(&ch, &rules, &[lane.dest.clone()]).await;
        }
        measured
    });

    let dir = match std::env::var_os("BENCH_PLOT_DIR") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/precision"),
    };
    let report = plot::write_all(&dir, &measured);
    println!();
    if let Some(why) = report.no_text {
        println!("plots drawn without text: {why}");
    }
    for file in report.files {
        match file {
            Ok(path) => println!("plot: {}", path.display()),
            Err(e) => println!("plot not written: {e}"),
        }
    }
}
