//! What counting a plugin exchange's waiting messages costs: the same
//! delayed messages through one router, published to a `[[delayed_exchange]]`
//! (counted: a token published when a message enters its first bucket, one
//! taken when it leaves) and to the router exchange with the same `x-delay`
//! and the delivery exchange as destination (not counted; otherwise the same
//! path), in alternating order, in the same rounds.
//!
//! Per lane: router and broker CPU per message from the first publish to the
//! last arrival (their processes, from /proc; the broker's idle rate over a
//! few seconds before the lane subtracted), and the waiting count at the end
//! (0 when every token was taken back) and the router's miscounts.
//!
//! Workload: BENCH_MESSAGES (5000) persistent messages of 512 bytes, `x-delay`
//! uniform in 1..6 s, published evenly over BENCH_SPREAD_SECS (10) seconds,
//! on a 1 s / 2 s / 4 s / 8 s ladder (cascade, classic buckets unless
//! BENCH_QUEUE_TYPE says otherwise); BENCH_ROUNDS (3) rounds. The router is
//! the one `cargo bench` built, or BENCH_BIN.
//!
//! `cargo bench --bench plugin_count`

mod procfs;
mod routerproc;
mod workload;

use delay_router::testkit::consume::{Acks, Consumer};
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use routerproc::RouterProcess;
use std::time::{Duration, Instant};
use workload::{Rng, env_or, percentile};

const IDLE_SAMPLE: Duration = Duration::from_secs(3);

fn url() -> String {
    std::env::var("BENCH_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

#[derive(Clone, Copy, PartialEq)]
enum Lane {
    Counted,
    Uncounted,
}

struct Measured {
    router_us: f64,
    broker_us: f64,
    waiting_left: f64,
    miscounts: f64,
}

async fn idle_rate(broker: u32) -> f64 {
    let (before, _) = procfs::cpu_and_rss(broker);
    let t = Instant::now();
    tokio::time::sleep(IDLE_SAMPLE).await;
    let (after, _) = procfs::cpu_and_rss(broker);
    (after - before) as f64 / t.elapsed().as_secs_f64()
}

async fn lane(
    conn: &Connection,
    ch: &Channel,
    lane: Lane,
    delays: &[u64],
    spread: Duration,
    broker: u32,
) -> Measured {
    let prefix = format!("pcount-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let plugin = format!("{prefix}.orders");
    let delivered = format!("{plugin}.delivered");
    let config = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(
        &config,
        format!(
            "[[bucket]]\nttl = \"1s\"\n[[bucket]]\nttl = \"2s\"\n[[bucket]]\nttl = \"4s\"\n\
             [[bucket]]\nttl = \"8s\"\n[[delayed_exchange]]\nname = \"{plugin}\"\ntype = \"direct\"\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let router = RouterProcess::start_with_config(&config, &url(), &prefix, &[]).await;
    let inbox = format!("{prefix}.inbox");
    ch.queue_declare(
        inbox.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        inbox.as_str().into(),
        delivered.as_str().into(),
        "k".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let mut consumer = Consumer::open(conn, &inbox, Acks::Auto).await;
    let idle = idle_rate(broker).await;
    let (b0, _) = procfs::cpu_and_rss(broker);
    let (r0, _) = procfs::cpu_and_rss(router.pid());
    let t0 = Instant::now();
    let n = delays.len();
    let mut confirms = Vec::with_capacity(n);
    for (i, delay) in delays.iter().enumerate() {
        tokio::time::sleep_until((t0 + spread.mul_f64(i as f64 / n as f64)).into()).await;
        let mut h = FieldTable::default();
        h.insert("x-delay".into(), AMQPValue::LongLongInt(*delay as i64));
        let (exchange, key) = match lane {
            Lane::Counted => (plugin.clone(), "k"),
            Lane::Uncounted => {
                h.insert(
                    "x-original-exchange".into(),
                    AMQPValue::LongString(LongString::from(delivered.as_str())),
                );
                h.insert(
                    "x-original-routing-key".into(),
                    AMQPValue::LongString(LongString::from("k")),
                );
                (router.exchange(), "")
            }
        };
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(i.to_string().into())
            .with_headers(h);
        let confirm = ch
            .basic_publish(
                exchange.as_str().into(),
                key.into(),
                BasicPublishOptions::default(),
                &[0u8; 512],
                props,
            )
            .await
            .unwrap();
        confirms.push(confirm);
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack(), "publish refused");
    }
    let got = consumer.take(n, Duration::from_secs(60)).await;
    assert_eq!(got.len(), n, "every message arrives");
    let window = t0.elapsed().as_secs_f64();
    let (b1, _) = procfs::cpu_and_rss(broker);
    let (r1, _) = procfs::cpu_and_rss(router.pid());
    consumer.close().await;
    let miscounts = router.scrape("delay_router_waiting_miscounts_total");
    let waiting = format!("{prefix}.waiting.{plugin}");
    let left = ch
        .queue_declare(
            waiting.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_or(f64::NAN, |q| f64::from(q.message_count()));
    router.stop_and_remove(ch, &[inbox, waiting]).await;
    for x in [&plugin, &delivered] {
        let _ = ch
            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = std::fs::remove_file(&config);
    Measured {
        router_us: (r1 - r0) as f64 / n as f64,
        broker_us: ((b1 - b0) as f64 - idle * window) / n as f64,
        waiting_left: left,
        miscounts,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n = env_or("BENCH_MESSAGES", 5_000) as usize;
    let rounds = env_or("BENCH_ROUNDS", 3);
    let spread = Duration::from_secs(env_or("BENCH_SPREAD_SECS", 10));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let delays: Vec<u64> = (0..n)
        .map(|_| 1_000 + (5_000.0 * rng.next_f64()) as u64)
        .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let conn = Connection::connect(&url(), ConnectionProperties::default()).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let broker = procfs::broker_pid();
        println!("{n} messages, x-delay 1-6 s, over {} s, {rounds} rounds", spread.as_secs());
        let mut ratios = Vec::new();
        for round in 0..rounds {
            let order = if round % 2 == 0 { [Lane::Counted, Lane::Uncounted] } else { [Lane::Uncounted, Lane::Counted] };
            let mut by = [None, None];
            for l in order {
                let m = lane(&conn, &ch, l, &delays, spread, broker).await;
                let name = if l == Lane::Counted { "counted  " } else { "uncounted" };
                println!(
                    "round {round} {name}: router {:6.1} µs/msg, broker {:6.1} µs/msg, sum {:6.1}, waiting left {}, miscounts {}",
                    m.router_us, m.broker_us, m.router_us + m.broker_us, m.waiting_left, m.miscounts
                );
                by[usize::from(l == Lane::Uncounted)] = Some(m);
            }
            let (c, u) = (by[0].take().unwrap(), by[1].take().unwrap());
            ratios.push(((c.router_us + c.broker_us) / (u.router_us + u.broker_us) * 1000.0) as i64);
        }
        ratios.sort_unstable();
        println!(
            "counted / uncounted, router + broker CPU a message: median {:.2} (min {:.2}, max {:.2})",
            percentile(&ratios, 0.5) as f64 / 1000.0,
            ratios[0] as f64 / 1000.0,
            ratios[ratios.len() - 1] as f64 / 1000.0
        );
    });
}
