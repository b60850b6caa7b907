//! What 100,000 tombstones cost: the router binary (release) on a fresh
//! prefix whose cancels stream holds 0 or BENCH_TOMBSTONES tombstones, in
//! alternating rounds. Each round measures the start (connect, declare, read
//! the whole stream: until both consumers are up), then moves BENCH_MESSAGES
//! messages at about 1,000/s through one 2 s bucket hop each (none of them
//! cancelled: every expiry looks its message-id up among the tombstones) and
//! reports their lateness (from the publish) and the router's CPU per message
//! (utime + stime from /proc, ingress and expiry together).
//! Also the lookup itself, in process, on a map of that size.
//!
//! cargo bench --bench cancel     # env: BENCH_TOMBSTONES=100000 BENCH_MESSAGES=5000 BENCH_ROUNDS=2

mod procfs;

use delay_router::config::Config;
use delay_router::core::decision::Rules;
use delay_router::router::tombstones::Tombstones;
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use procfs::cpu_and_rss;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A router binary, killed when dropped.
struct Router(std::process::Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Round {
    tombstones: usize,
    start_ms: u128,
    p50: i64,
    p99: i64,
    max: i64,
    cpu_us_per_msg: f64,
    rss_kib: u64,
}

async fn declare(ch: &lapin::Channel, queue: &str) {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
}

async fn round(conn: &Connection, tombstones: usize, messages: usize) -> Round {
    let prefix = format!("bc-{:08x}", rand::random::<u32>());
    let text = format!(
        "[amqp]\nurl = \"{URL}\"\n[topology]\nprefix = \"{prefix}\"\nqueue_type = \"classic\"\n[cancel]\nkeep = \"1h\"\n\
         [[bucket]]\nttl = \"1s\"\n[[bucket]]\nttl = \"2s\"\n"
    );
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, &text).unwrap();
    let bin = env!("CARGO_BIN_EXE_delay-router");
    let ok = std::process::Command::new(bin)
        .args(["declare", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let cancels = format!("{prefix}.cancels");
    let until = epoch_ms() + 3_600_000;
    let mut pending = Vec::new();
    for i in 0..tombstones {
        let mut h = FieldTable::default();
        h.insert(
            "x-cancel-message-id".into(),
            AMQPValue::LongString(LongString::from(format!("t{i}"))),
        );
        h.insert(
            "x-delay-router-cancel-until".into(),
            AMQPValue::LongLongInt(until),
        );
        let c = ch
            .basic_publish(
                "".into(),
                cancels.as_str().into(),
                BasicPublishOptions::default(),
                b"",
                BasicProperties::default().with_headers(h),
            )
            .await
            .unwrap();
        pending.push(c);
        if pending.len() >= 5_000 {
            for c in pending.drain(..) {
                c.await.unwrap();
            }
        }
    }
    for c in pending.drain(..) {
        c.await.unwrap();
    }
    let dest = format!("{prefix}.dest");
    declare(&ch, &dest).await;

    let started = Instant::now();
    let router = Router(
        std::process::Command::new(bin)
            .args(["run", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn,lapin=off")
            .spawn()
            .unwrap(),
    );
    let expired = format!("{prefix}.expired");
    loop {
        let probe = conn.create_channel().await.unwrap();
        let q = probe
            .queue_declare(
                expired.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        let _ = probe.close(200, "ok".into()).await;
        if q.is_ok_and(|q| q.consumer_count() >= 1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the router never consumed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start_ms = started.elapsed().as_millis();
    let (cpu_before, _) = cpu_and_rss(router.0.id());

    let consume = conn.create_channel().await.unwrap();
    let mut consumer = consume
        .basic_consume(
            dest.as_str().into(),
            "bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Arrivals are timed as they come, beside the publishing.
    let collector = tokio::spawn(async move {
        let mut late = Vec::with_capacity(messages);
        while late.len() < messages {
            let d = tokio::time::timeout(Duration::from_secs(60), consumer.next())
                .await
                .expect("every message arrives")
                .unwrap()
                .unwrap();
            let due = d.properties.timestamp().unwrap_or(0) as i64;
            late.push(epoch_ms() - due);
        }
        late
    });
    let router_exchange = format!("{prefix}.router");
    for i in 0..messages {
        // Exactly the 2 s rung: one hop.
        let due = epoch_ms() + 2_000;
        let mut h = FieldTable::default();
        h.insert("x-requested-delay".into(), AMQPValue::LongLongInt(2_000));
        h.insert(
            "x-original-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        h.insert(
            "x-original-routing-key".into(),
            AMQPValue::LongString(dest.as_str().into()),
        );
        let p = BasicProperties::default()
            .with_headers(h)
            .with_message_id(format!("m{i}").into())
            .with_timestamp(due as u64);
        ch.basic_publish(
            router_exchange.as_str().into(),
            "".into(),
            BasicPublishOptions::default(),
            b"payload",
            p,
        )
        .await
        .unwrap();
        if i % 100 == 99 {
            // About 1,000 msg/s: on 2 cores the router is not the bottleneck.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut late = collector.await.unwrap();
    let (cpu_after, rss_kib) = cpu_and_rss(router.0.id());
    drop(router);
    late.sort_unstable();
    let rules = Rules::from_config(&Config::from_toml(&text).unwrap());
    delay_router::testkit::teardown::remove_topology(&ch, &rules, &[dest]).await;
    std::fs::remove_file(path).ok();
    Round {
        tombstones,
        start_ms,
        p50: percentile(&late, 0.5),
        p99: percentile(&late, 0.99),
        max: *late.last().unwrap(),
        cpu_us_per_msg: (cpu_after - cpu_before) as f64 / messages as f64,
        rss_kib,
    }
}

/// ns per lookup in a map of `n` tombstones (misses and hits).
fn lookup_ns(n: usize) -> (f64, f64) {
    let t = Tombstones::default();
    for i in 0..n {
        t.insert(format!("t{i}"), i64::MAX);
    }
    let probes: Vec<String> = (0..100_000).map(|i| format!("m{i}")).collect();
    let hits: Vec<String> = (0..100_000).map(|i| format!("t{}", i % n.max(1))).collect();
    let time = |keys: &[String]| {
        let started = Instant::now();
        let mut found = 0usize;
        for _ in 0..10 {
            for k in keys {
                found += usize::from(t.is_cancelled(std::hint::black_box(k), 0));
            }
        }
        std::hint::black_box(found);
        started.elapsed().as_nanos() as f64 / (keys.len() * 10) as f64
    };
    (time(&probes), if n == 0 { 0.0 } else { time(&hits) })
}

fn main() {
    let tombstones = env_or("BENCH_TOMBSTONES", 100_000);
    let messages = env_or("BENCH_MESSAGES", 5_000);
    let rounds = env_or("BENCH_ROUNDS", 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let conn = Connection::connect(URL, ConnectionProperties::default()).await.expect("RabbitMQ on 127.0.0.1:5672");
        let mut results = Vec::new();
        for r in 0..rounds {
            // Alternate who goes first.
            let order = if r % 2 == 0 { [0, tombstones] } else { [tombstones, 0] };
            for n in order {
                let got = round(&conn, n, messages).await;
                println!(
                    "round {r}: {:>7} tombstones: start {:>5} ms, lateness p50 {} / p99 {} / max {} ms, router CPU {:.1} µs/msg, peak RSS {} MiB",
                    got.tombstones, got.start_ms, got.p50, got.p99, got.max, got.cpu_us_per_msg, got.rss_kib / 1024
                );
                results.push(got);
            }
        }
        let median = |n: usize, f: &dyn Fn(&Round) -> f64| {
            let mut v: Vec<f64> = results.iter().filter(|r| r.tombstones == n).map(f).collect();
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        println!("\n| tombstones | start (read the stream) | lateness p50 | p99 | router CPU per message | peak RSS |");
        println!("|---:|---:|---:|---:|---:|---:|");
        for n in [0, tombstones] {
            println!(
                "| {n} | {:.0} ms | {:.0} ms | {:.0} ms | {:.1} µs | {:.0} MiB |",
                median(n, &|r| r.start_ms as f64),
                median(n, &|r| r.p50 as f64),
                median(n, &|r| r.p99 as f64),
                median(n, &|r| r.cpu_us_per_msg),
                median(n, &|r| r.rss_kib as f64 / 1024.0),
            );
        }
        let ratio = median(tombstones, &|r| r.cpu_us_per_msg) / median(0, &|r| r.cpu_us_per_msg);
        println!("router CPU per message, {tombstones} tombstones / none: {ratio:.2}");
        let _ = conn.close(200, "bye".into()).await;
    });
    let (miss0, _) = lookup_ns(0);
    let (miss, hit) = lookup_ns(tombstones);
    println!(
        "lookup per expiry (in process): empty map {miss0:.0} ns; {tombstones} tombstones: miss {miss:.0} ns, hit {hit:.0} ns"
    );
}
