//! A million waiting: BENCH_MESSAGES (1,000,000) persistent 512-byte messages
//! with delays uniform over BENCH_MIN_DELAY_SECS..BENCH_MAX_DELAY_SECS
//! (600..1800, to the millisecond) through the release router on the shipped
//! `buckets.toml` (cascade), with BENCH_QUEUE_TYPE (classic) buckets.
//!
//! Each message carries its due time as `x-deliver-at` (publish time plus its
//! delay; also in the body's first 8 bytes), so the router's own ingress
//! backlog while a million arrive does not count as lateness: lateness is the
//! arrival at the destination queue minus the due time. The bulk is published
//! as fast as the broker confirms (at most 10,000 unconfirmed). Beside it,
//! probes: 10 messages a second with delays of 1..60 s, from the first publish
//! until the bulk has drained, so the router's precision is measured while the
//! million arrive, while they wait and while they drain. A probe sent before
//! the router has placed the burst (its publish, then what is left in the
//! router's ingress queue) waits behind it there.
//!
//! Prints, every minute, what has arrived, the router's RSS and the broker's
//! memory; at the end: lateness p50/p90/p99/max and early deliveries of the
//! bulk (and per 5-minute slice of due times), the probes' lateness by when
//! they were sent (before the burst was placed, after it while the bulk
//! waits) and, for those arriving once the first bulk message is due, while
//! it drains, lost, duplicated and parked messages,
//! router placements and buckets waited in per message, the router's RSS (min/max after the publish, peak)
//! and CPU per message, and the broker's memory per waiting message
//! (`erlang:memory(total)` just before the first is due, minus before the
//! first publish, over the messages). The wait ends when every message has
//! arrived or BENCH_GRACE_SECS (600) after the last is due; what the router's queues
//! still hold then is reported as late, not lost.
//!
//! `cargo bench --bench million` against the Debian broker; for RabbitMQ 4.x,
//! start a node with room for the million (`RMQ4_MEMORY=4GiB
//! scripts/ensure-rabbitmq4 --nodes 1`: the script's default 512 MiB, sized
//! for CI, raises the memory alarm within seconds of the publish), then
//! BENCH_URL=amqp://guest:guest@127.0.0.1:5682/%2f
//! BENCH_CTL=scripts/rabbitmqctl4 BENCH_QUEUE_TYPE=quorum. BENCH_BIN runs
//! another build of the router instead of this one (an A/B in two runs).

mod procfs;
mod routerproc;
mod workload;

use delay_router::testkit::consume::{Acks, Consumer};
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use routerproc::RouterProcess;
use std::collections::VecDeque;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use workload::{Rng, env_or, percentile};

const BODY: usize = 512;
const UNCONFIRMED: usize = 10_000;
const PROBES_PER_SEC: u64 = 10;
const PROBE_MAX_DELAY_MS: u64 = 60_000;
const SLICE: Duration = Duration::from_secs(300);
const MEMORY_EVERY: Duration = Duration::from_secs(15);

fn url() -> String {
    std::env::var("BENCH_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `BENCH_CTL eval EXPR` (default `rabbitmqctl`), trimmed; `None` on failure.
fn ctl_eval(expr: &str) -> Option<String> {
    let ctl = std::env::var("BENCH_CTL").unwrap_or_else(|_| "rabbitmqctl".into());
    let mut parts = ctl.split_whitespace();
    let out = Command::new(parts.next()?)
        .args(parts)
        .args(["eval", expr])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The broker node's total memory in bytes.
async fn broker_memory() -> Option<u64> {
    tokio::task::spawn_blocking(|| ctl_eval("erlang:memory(total).")?.parse().ok())
        .await
        .ok()
        .flatten()
}

/// The router's resident set now, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A message due at `due_ms`; its body starts with the due time and the send
/// time (ms since the Unix epoch, little-endian).
fn message(id: String, due_ms: i64, dest: &str) -> (Vec<u8>, BasicProperties) {
    let mut body = vec![0u8; BODY];
    body[..8].copy_from_slice(&due_ms.to_le_bytes());
    body[8..16].copy_from_slice(&epoch_ms().to_le_bytes());
    let mut h = FieldTable::default();
    h.insert("x-deliver-at".into(), AMQPValue::LongLongInt(due_ms));
    h.insert(
        "x-original-exchange".into(),
        AMQPValue::LongString(LongString::from("")),
    );
    h.insert(
        "x-original-routing-key".into(),
        AMQPValue::LongString(LongString::from(dest)),
    );
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(id.into())
        .with_headers(h);
    (body, props)
}

/// `<prefix>.` of one of the router's queue names.
fn prefix_of(queue: &str) -> &str {
    queue.find('.').map_or("", |i| &queue[..=i])
}

/// What the destination queue has delivered.
struct Arrivals {
    /// Per bulk message, lateness in ms; `i32::MIN` until it arrives.
    bulk: Vec<i32>,
    bulk_arrived: usize,
    duplicates: usize,
    /// Probes: (arrival, lateness ms, sent at ms since the Unix epoch).
    probes: Vec<(Instant, i64, i64)>,
}

/// Per minute: (seconds since the first publish, router RSS KiB, broker bytes, bulk arrived).
type Sample = (u64, u64, Option<u64>, usize);

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_or("BENCH_MESSAGES", 1_000_000) as usize;
    let min_ms = env_or("BENCH_MIN_DELAY_SECS", 600) * 1000;
    let max_ms = env_or("BENCH_MAX_DELAY_SECS", 1800) * 1000;
    let queue_type = std::env::var("BENCH_QUEUE_TYPE").unwrap_or_else(|_| "classic".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(n, min_ms, max_ms, &queue_type));
}

async fn run(n: usize, min_ms: u64, max_ms: u64, queue_type: &str) {
    let url = url();
    let version = ctl_eval("rabbit_misc:version().").unwrap_or_else(|| "?".into());
    let conn = Arc::new(
        Connection::connect(&url, ConnectionProperties::default())
            .await
            .expect("broker"),
    );
    let ch = conn.create_channel().await.unwrap();
    let prefix = format!("million-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let dest = format!("{prefix}.dest");
    ch.queue_declare(
        dest.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let router = RouterProcess::start(
        &url,
        &prefix,
        &[("DELAY_ROUTER__TOPOLOGY__QUEUE_TYPE", queue_type)],
    )
    .await;
    let pid = router.pid();
    let baseline_memory = broker_memory().await;
    let (cpu0, _) = procfs::cpu_and_rss(pid);

    let arrivals = Arc::new(Mutex::new(Arrivals {
        bulk: vec![i32::MIN; n],
        bulk_arrived: 0,
        duplicates: 0,
        probes: Vec::new(),
    }));
    let mut consumer = Consumer::open(&conn, &dest, Acks::Auto).await;
    let sink = arrivals.clone();
    let collector = tokio::spawn(async move {
        while let Some(d) = consumer.next_within(Duration::from_secs(3600)).await {
            let now = epoch_ms();
            let at = Instant::now();
            let due = i64::from_le_bytes(d.data[..8].try_into().unwrap());
            let sent = i64::from_le_bytes(d.data[8..16].try_into().unwrap());
            let id = d.properties.message_id().as_ref().unwrap().as_str();
            let mut a = sink.lock().unwrap();
            if let Some(i) = id.strip_prefix('m') {
                let i: usize = i.parse().unwrap();
                if a.bulk[i] == i32::MIN {
                    a.bulk[i] = (now - due) as i32;
                    a.bulk_arrived += 1;
                } else {
                    a.duplicates += 1;
                }
            } else {
                a.probes.push((at, now - due, sent));
            }
        }
    });

    let start = Instant::now();
    let first_due = start + Duration::from_millis(min_ms);
    let drained = Arc::new(AtomicBool::new(false));

    // Probes, from the first publish until the bulk has drained.
    let probe_ch = conn.create_channel().await.unwrap();
    probe_ch
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let (probe_stop, probe_exchange, probe_dest) =
        (drained.clone(), router.exchange(), dest.clone());
    let probes_sent = Arc::new(AtomicUsize::new(0));
    let probes_count = probes_sent.clone();
    let prober = tokio::spawn(async move {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / PROBES_PER_SEC));
        let mut k = 0usize;
        while !probe_stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let delay = 1000 + ((PROBE_MAX_DELAY_MS - 1000) as f64 * rng.next_f64()) as i64;
            let (body, props) = message(format!("p{k}"), epoch_ms() + delay, &probe_dest);
            let confirm = probe_ch
                .basic_publish(
                    probe_exchange.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
                .unwrap();
            assert!(confirm.await.unwrap().is_ack(), "probe refused");
            k += 1;
            probes_count.store(k, Ordering::Relaxed);
        }
    });

    // Samples: RSS every second, broker memory every 15 s, a line a minute.
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let rss_seen: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let (sampler_stop, sampled, rss_log, progress) = (
        drained.clone(),
        samples.clone(),
        rss_seen.clone(),
        arrivals.clone(),
    );
    let sampler = tokio::spawn(async move {
        let mut memory = None;
        let mut last_memory = Instant::now() - MEMORY_EVERY;
        let mut last_line = Instant::now();
        while !sampler_stop.load(Ordering::Relaxed) {
            let rss = rss_kib(pid);
            rss_log.lock().unwrap().push((Instant::now(), rss));
            if last_memory.elapsed() >= MEMORY_EVERY {
                last_memory = Instant::now();
                memory = broker_memory().await;
            }
            let arrived = progress.lock().unwrap().bulk_arrived;
            let t = start.elapsed().as_secs();
            sampled.lock().unwrap().push((t, rss, memory, arrived));
            if last_line.elapsed() >= Duration::from_secs(60) {
                last_line = Instant::now();
                println!(
                    "  t={t:>5}s  bulk arrived {arrived:>8}  router RSS {:.1} MiB  broker {:.0} MiB",
                    rss as f64 / 1024.0,
                    memory.unwrap_or(0) as f64 / (1 << 20) as f64
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    // Where the backlog sits: the depth of the router's queues every
    // BENCH_DEPTH_SECS (15; 0: never).
    let depth_every = env_or("BENCH_DEPTH_SECS", 15);
    let depths = (depth_every > 0).then(|| {
        let rules = routerproc::rules(&prefix);
        let names = &rules.names;
        let mut queues = vec![names.ingress.clone(), names.expired.clone()];
        queues.extend(rules.topology().bucket_names());
        let (stop, conn) = (drained.clone(), conn.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut line = format!("  depths t={:>5}s", start.elapsed().as_secs());
                for q in &queues {
                    let d = delay_router::broker::probe::depth(&conn, q).await;
                    if let Ok(Some(d)) = d
                        && d > 0
                    {
                        let short = q
                            .as_str()
                            .strip_prefix(prefix_of(q.as_str()))
                            .unwrap_or(q.as_str());
                        line.push_str(&format!("  {short} {d}"));
                    }
                }
                println!("{line}");
                tokio::time::sleep(Duration::from_secs(depth_every)).await;
            }
        })
    });

    // The bulk.
    let pub_ch = conn.create_channel().await.unwrap();
    pub_ch
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut due_ms = Vec::with_capacity(n);
    let mut pending: VecDeque<lapin::PublisherConfirm> = VecDeque::with_capacity(UNCONFIRMED);
    let exchange = router.exchange();
    let t0 = epoch_ms();
    for i in 0..n {
        let delay = min_ms + ((max_ms - min_ms) as f64 * rng.next_f64()) as u64;
        let due = epoch_ms() + delay as i64;
        due_ms.push(due);
        let (body, props) = message(format!("m{i}"), due, &dest);
        if pending.len() == UNCONFIRMED {
            let c = pending.pop_front().unwrap();
            assert!(c.await.unwrap().is_ack(), "publish refused");
        }
        pending.push_back(
            pub_ch
                .basic_publish(
                    exchange.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
                .unwrap(),
        );
    }
    for c in pending {
        assert!(c.await.unwrap().is_ack(), "publish refused");
    }
    let published_in = start.elapsed();
    println!(
        "published and confirmed {n} in {:.1} s ({:.0} msg/s)",
        published_in.as_secs_f64(),
        n as f64 / published_in.as_secs_f64()
    );
    // The burst is placed once the router's ingress queue has no message
    // ready: until then a probe waits behind it there.
    let ingress = routerproc::rules(&prefix).names.ingress.clone();
    while Instant::now() < first_due - Duration::from_secs(5)
        && !matches!(
            delay_router::broker::probe::depth(&conn, &ingress).await,
            Ok(Some(0))
        )
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let placed_in = start.elapsed();
    // The broker's memory with everything waiting: just before the first is due.
    tokio::time::sleep_until((first_due - Duration::from_secs(5)).into()).await;
    let waiting_memory = broker_memory().await;
    let waiting_rss = rss_kib(pid);

    let grace = Duration::from_secs(env_or("BENCH_GRACE_SECS", 600));
    let deadline = start + published_in + Duration::from_millis(max_ms) + grace;
    while arrivals.lock().unwrap().bulk_arrived < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained_at = Instant::now();
    // Late duplicates and the last probes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    drained.store(true, Ordering::Relaxed);
    let _ = prober.await;
    tokio::time::sleep(Duration::from_millis(PROBE_MAX_DELAY_MS + 5_000)).await;
    let _ = sampler.await;
    if let Some(depths) = depths {
        let _ = depths.await;
    }
    collector.abort();
    let (cpu1, peak_kib) = procfs::cpu_and_rss(pid);
    let placed = router.scrape("delay_router_messages_placed_total");
    // Buckets waited in (each lap of a chain counts) per delivered message.
    let waits = router.scrape("delay_router_delivery_hops_sum")
        / router.scrape("delay_router_delivery_hops_count").max(1.0);
    let delivered = router.scrape("delay_router_messages_delivered_total");
    let parked = ch
        .queue_declare(
            format!("{prefix}.parked").as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map(|q| q.message_count())
        .unwrap_or(u32::MAX);
    // Still in the router's queues at the deadline: late, not lost.
    let still_waiting = router.stop_and_remove(&ch, &[dest]).await as usize;

    let a = arrivals.lock().unwrap();
    let lost = (n - a.bulk_arrived).saturating_sub(still_waiting);
    let mut late: Vec<i64> = a
        .bulk
        .iter()
        .filter(|l| **l != i32::MIN)
        .map(|l| i64::from(*l))
        .collect();
    late.sort_unstable();
    let probes_sent = probes_sent.load(Ordering::Relaxed);
    // Probes by phase: sent before the burst was placed (its publish and
    // the ingress backlog it left); sent after that and arrived before the
    // first bulk message was due; arrived after that.
    let placed_at = t0 + placed_in.as_millis() as i64;
    let phase = |arrived: Instant, sent: i64| {
        if sent <= placed_at {
            0
        } else if arrived < first_due {
            1
        } else {
            2
        }
    };
    let split = |which: u8| {
        let mut v: Vec<i64> = a
            .probes
            .iter()
            .filter(|(at, _, sent)| phase(*at, *sent) == which)
            .map(|(_, l, _)| *l)
            .collect();
        v.sort_unstable();
        v
    };
    let (probe_publish, probe_wait, probe_drain) = (split(0), split(1), split(2));
    let rss = rss_seen.lock().unwrap();
    let after_publish: Vec<u64> = rss
        .iter()
        .filter(|(at, _)| *at >= start + published_in)
        .map(|(_, r)| *r)
        .collect();
    let mib = |k: u64| k as f64 / 1024.0;
    let q = |v: &[i64], p: f64| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            format!("{} ms", percentile(v, p))
        }
    };

    println!();
    println!(
        "RabbitMQ {version}, {queue_type} buckets; {n} persistent {BODY}-byte messages, delays uniform {}..{} s, cascade on the shipped ladder",
        min_ms / 1000,
        max_ms / 1000
    );
    println!();
    println!(
        "| published in | bulk lateness p50 | p90 | p99 | max | early | lost | duplicated | parked | probes p99 sent before the burst was placed | sent after, while waiting | while draining | placements/msg | bucket waits/msg | router RSS after publish (min–max) | router peak RSS | router CPU/msg | broker memory per waiting message |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let memory_per_msg = match (baseline_memory, waiting_memory) {
        (Some(b), Some(w)) => format!("{:.0} B", (w as f64 - b as f64) / n as f64),
        _ => "?".into(),
    };
    println!(
        "| {:.0} s | {} | {} | {} | {} | {} | {lost} | {} | {parked} | {} ({} probes) | {} ({} probes) | {} ({} probes) | {:.2} | {:.2} | {:.1}–{:.1} MiB | {:.1} MiB | {:.0} µs | {memory_per_msg} |",
        published_in.as_secs_f64(),
        q(&late, 0.5),
        q(&late, 0.9),
        q(&late, 0.99),
        late.last().map_or("-".into(), |m| format!("{m} ms")),
        late.iter().filter(|l| **l < 0).count(),
        a.duplicates,
        q(&probe_publish, 0.99),
        probe_publish.len(),
        q(&probe_wait, 0.99),
        probe_wait.len(),
        q(&probe_drain, 0.99),
        probe_drain.len(),
        placed / delivered.max(1.0),
        waits,
        mib(after_publish.iter().copied().min().unwrap_or(0)),
        mib(after_publish.iter().copied().max().unwrap_or(0)),
        mib(peak_kib),
        (cpu1 - cpu0) as f64 / n as f64,
    );
    println!();
    println!(
        "the router's ingress emptied {:.0} s after the first publish (the burst placed)",
        placed_in.as_secs_f64()
    );
    println!(
        "not arrived by the deadline but still in the router's queues {still_waiting}; probes sent {probes_sent}, arrived {}; router RSS just before the first due {:.1} MiB; broker memory {} before, {} with all waiting; drained {:.0} s after the first publish",
        a.probes.len(),
        mib(waiting_rss),
        baseline_memory.map_or("?".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        )),
        waiting_memory.map_or("?".into(), |b| format!(
            "{:.0} MiB",
            b as f64 / (1 << 20) as f64
        )),
        drained_at.duration_since(start).as_secs_f64()
    );
    println!();
    println!("bulk lateness by due time (from the first publish):");
    println!("| due | messages | p50 | p99 | max | early |");
    println!("|---|---|---|---|---|---|");
    let slices = (max_ms / SLICE.as_millis() as u64 + 1) as usize;
    let mut by_slice: Vec<Vec<i64>> = vec![Vec::new(); slices];
    for (i, l) in a.bulk.iter().enumerate() {
        if *l != i32::MIN {
            let s = ((due_ms[i] - t0).max(0) as u128 / SLICE.as_millis()) as usize;
            by_slice[s.min(slices - 1)].push(i64::from(*l));
        }
    }
    for (s, v) in by_slice.iter_mut().enumerate() {
        if v.is_empty() {
            continue;
        }
        v.sort_unstable();
        println!(
            "| {}–{} min | {} | {} | {} | {} ms | {} |",
            s * 5,
            s * 5 + 5,
            v.len(),
            q(v, 0.5),
            q(v, 0.99),
            v.last().unwrap(),
            v.iter().filter(|l| **l < 0).count()
        );
    }
    println!();
    let samples = samples.lock().unwrap();
    let minutes: Vec<String> = samples
        .iter()
        .filter(|(t, ..)| t % 120 == 0)
        .map(|(t, rss, mem, _)| {
            format!(
                "{}m {:.0}/{:.0}",
                t / 60,
                mib(*rss),
                mem.unwrap_or(0) as f64 / (1 << 20) as f64
            )
        })
        .collect();
    println!(
        "every 2 minutes, router RSS / broker memory (MiB): {}",
        minutes.join(", ")
    );
    assert_eq!(lost, 0, "messages lost");
}
