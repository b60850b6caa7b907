//! Failover: two routers on one prefix, one of them SIGKILLed while a steady
//! stream of delayed messages flows, and started again later. Measures what
//! the survivor delivers while it is alone, against a reference measured in
//! the same run: the messages due while both routers ran.
//!
//! Groups, by the time a message was due:
//! - both routers: due before the kill (after a warm-up), or from 5 s after
//!   the restart on;
//! - in flight at the kill: due from 1 s before to 1 s after it (the killed
//!   router may hold them unsettled; the broker redelivers them);
//! - the survivor alone: due from 1 s after the kill until the restart.
//!
//! Workload: BENCH_RATE (default 20) messages per second for BENCH_SECONDS
//! (90), delays 0–10 s, ladder 1s/2s/4s/8s, cascade; the kill at a third of
//! the sending, the restart at two thirds.
//!
//! `cargo bench --bench failover`
//! BENCH_URLS (comma-separated; routers get the whole list, the first router
//! starts on the first node and the second on the last) and BENCH_QUEUE_TYPE
//! (classic, quorum; the destination gets the same type) choose the broker,
//! e.g. the 4.3 cluster of `scripts/ensure-rabbitmq4 --nodes 3`:
//! `BENCH_URLS=amqp://guest:guest@127.0.0.1:5682/%2f,amqp://guest:guest@127.0.0.1:5683/%2f,amqp://guest:guest@127.0.0.1:5684/%2f BENCH_QUEUE_TYPE=quorum cargo bench --bench failover`

use delay_router::config::Config;
use delay_router::testkit::consume::{Acks, Consumer};
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LADDER: [&str; 4] = ["1s", "2s", "4s", "8s"];
const MAX_DELAY_MS: u64 = 10_000;
/// Messages due in the first seconds are left out of the reference: the
/// routers' first decisions include connection warm-up.
const WARM_UP: Duration = Duration::from_secs(5);

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn urls() -> Vec<String> {
    std::env::var("BENCH_URLS")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
        .split(',')
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect()
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A router binary, killed when dropped.
struct Router(std::process::Child);

impl Router {
    fn start(config: &std::path::Path) -> Router {
        Router(
            std::process::Command::new(env!("CARGO_BIN_EXE_delay-router"))
                .args(["run", "--config"])
                .arg(config)
                .env("RUST_LOG", "warn,lapin=off")
                .spawn()
                .expect("the router binary"),
        )
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill(); // SIGKILL
        let _ = self.0.wait();
    }
}

/// The config of router `k`: the whole list, rotated so that router 0 starts
/// on the first node and router 1 on the last.
fn write_config(prefix: &str, urls: &[String], queue_type: &str, k: usize) -> std::path::PathBuf {
    let mut rotated = urls.to_vec();
    if k == 1 {
        rotated.rotate_right(1);
    }
    let list: Vec<String> = rotated.iter().map(|u| format!("\"{u}\"")).collect();
    let mut text = format!(
        "[amqp]\nurls = [{}]\n[topology]\nprefix = \"{prefix}\"\nqueue_type = \"{queue_type}\"\n[placement]\nstrategy = \"cascade\"\n",
        list.join(", ")
    );
    for r in LADDER {
        text.push_str(&format!("[[bucket]]\nttl = \"{r}\"\n"));
    }
    Config::from_toml(&text).expect("a valid configuration");
    let path = std::env::temp_dir().join(format!("{prefix}-{k}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rate = env_or("BENCH_RATE", 20).max(1);
    let seconds = env_or("BENCH_SECONDS", 90).max(30);
    let n = (rate * seconds) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let urls = urls();
        let queue_type = std::env::var("BENCH_QUEUE_TYPE").unwrap_or_else(|_| "classic".into());
        let prefix = format!("failover-{:06x}", rand::random::<u32>() & 0xff_ffff);
        let configs: Vec<_> = (0..2)
            .map(|k| write_config(&prefix, &urls, &queue_type, k))
            .collect();
        let config = Config::load(&configs[0]).unwrap();
        let conn = Connection::connect(&urls[0], ConnectionProperties::default())
            .await
            .expect("broker");
        let ch = conn.create_channel().await.unwrap();
        let dest = format!("{prefix}.dest");
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString(LongString::from(queue_type.as_str())));
        ch.queue_declare(dest.as_str().into(), QueueDeclareOptions::durable(), args)
            .await
            .unwrap();

        let mut a = Some(Router::start(&configs[0]));
        let _b = Router::start(&configs[1]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let running = delay_router::commands::status::collect(&config)
                .await
                .map_or(0, |s| s.routers.len());
            if running == 2 {
                break;
            }
            assert!(Instant::now() < deadline, "two routers did not start");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }

        let arrived: Arc<Mutex<HashMap<usize, Vec<Instant>>>> = Arc::default();
        let mut consumer = Consumer::open(&conn, &dest, Acks::Auto).await;
        let sink = arrived.clone();
        let collector = tokio::spawn(async move {
            while let Some(d) = consumer.next_within(Duration::from_secs(3600)).await {
                let at = Instant::now();
                let id: usize = d.properties.message_id().as_ref().unwrap().as_str().parse().unwrap();
                sink.lock().unwrap().entry(id).or_default().push(at);
            }
        });

        // The publisher, paced, with confirms.
        let sent: Arc<Mutex<HashMap<usize, (Instant, u64)>>> = Arc::default();
        let publisher = {
            let sent = sent.clone();
            let exchange = format!("{prefix}.router");
            let dest = dest.clone();
            let ch = conn.create_channel().await.unwrap();
            ch.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
            tokio::spawn(async move {
                let start = Instant::now();
                let mut confirms = Vec::new();
                for i in 0..n {
                    let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(due.into()).await;
                    let delay = (i as u64 * 7_919) % (MAX_DELAY_MS + 1);
                    let mut h = FieldTable::default();
                    h.insert("x-requested-delay".into(), AMQPValue::LongLongInt(delay as i64));
                    h.insert("x-original-exchange".into(), AMQPValue::LongString(LongString::from("")));
                    h.insert("x-original-routing-key".into(), AMQPValue::LongString(LongString::from(dest.as_str())));
                    let props = BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(i.to_string().into())
                        .with_headers(h);
                    sent.lock().unwrap().insert(i, (Instant::now(), delay));
                    confirms.push(
                        ch.basic_publish(exchange.as_str().into(), "".into(), BasicPublishOptions::default(), b"failover", props)
                            .await
                            .unwrap(),
                    );
                }
                for c in confirms {
                    assert!(c.await.unwrap().is_ack(), "a publish to the router exchange was refused");
                }
            })
        };
        let began = Instant::now();
        let sending = Duration::from_secs(seconds);
        tokio::time::sleep_until((began + sending / 3).into()).await;
        let killed = Instant::now();
        drop(a.take()); // SIGKILL
        tokio::time::sleep_until((began + sending * 2 / 3).into()).await;
        let restarted = Instant::now();
        a = Some(Router::start(&configs[0]));
        publisher.await.unwrap();

        let deadline = Instant::now() + Duration::from_secs(120);
        while arrived.lock().unwrap().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let sent = sent.lock().unwrap().clone();
        let arrived = arrived.lock().unwrap().clone();

        let second = Duration::from_secs(1);
        let mut both = Vec::new();
        let mut in_flight = Vec::new();
        let mut alone = Vec::new();
        let mut early = 0;
        for (i, (t0, delay)) in &sent {
            let Some(copies) = arrived.get(i) else { continue };
            let first = *copies.iter().min().unwrap();
            let lateness = first.duration_since(*t0).as_millis() as i64 - *delay as i64;
            if lateness < 0 {
                early += 1;
            }
            let due = *t0 + Duration::from_millis(*delay);
            if due + second >= killed && due <= killed + second {
                in_flight.push(lateness);
            } else if due > killed + second && due <= restarted {
                alone.push(lateness);
            } else if (due >= began + WARM_UP && due < killed) || due >= restarted + 5 * second {
                both.push(lateness);
            }
        }
        let lost = sent.keys().filter(|i| !arrived.contains_key(i)).count();
        let duplicated: usize = arrived.values().map(|c| c.len() - 1).sum();
        println!(
            "{n} messages at {rate}/s over {seconds} s, delays 0–{MAX_DELAY_MS} ms, ladder {}, cascade, {queue_type} queues, {} node(s); \
             one of two routers SIGKILLed at {:.0} s, restarted at {:.0} s",
            LADDER.join(", "),
            urls.len(),
            (killed - began).as_secs_f64(),
            (restarted - began).as_secs_f64(),
        );
        println!("lost {lost}, early {early}, duplicated {duplicated}");
        println!();
        println!("| messages due | messages | lateness p50 | p90 | p99 | max |");
        println!("|---|---|---|---|---|---|");
        for (label, mut late) in [
            ("both routers running (reference)", both.clone()),
            ("in flight at the kill (±1 s)", in_flight),
            ("the survivor alone", alone.clone()),
        ] {
            late.sort_unstable();
            println!(
                "| {label} | {} | {} ms | {} ms | {} ms | {} ms |",
                late.len(),
                percentile(&late, 0.5),
                percentile(&late, 0.9),
                percentile(&late, 0.99),
                late.last().copied().unwrap_or(0),
            );
        }
        both.sort_unstable();
        alone.sort_unstable();
        println!();
        println!(
            "the survivor alone / both routers: p50 {:.2}, p99 {:.2}",
            percentile(&alone, 0.5) as f64 / percentile(&both, 0.5).max(1) as f64,
            percentile(&alone, 0.99) as f64 / percentile(&both, 0.99).max(1) as f64,
        );
        drop(a);
        drop(_b);
        collector.abort();

        // Remove what the bench declared.
        let rules = delay_router::core::decision::Rules::from_config(&config);
        delay_router::testkit::teardown::remove_topology(&ch, &rules, &[dest]).await;
        for path in configs {
            let _ = std::fs::remove_file(path);
        }
        assert_eq!(lost, 0, "messages lost");
        assert_eq!(early, 0, "messages early");
    });
}
