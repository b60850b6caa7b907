//! The delayed-message-exchange plugin itself beside the router: the same
//! publisher, the same `x-delay` values, the same consumer, once through
//! the plugin's exchange and once through the router serving that exchange;
//! then the cut-over of docs/migrating-from-the-plugin.md, step by step,
//! with messages waiting in both.
//!
//! These need a broker with the plugin enabled (RabbitMQ 3.x: the plugin
//! cannot run on 4.3), so they are `#[ignore]`d and run by hand:
//!
//! ```text
//! rabbitmq-plugins enable rabbitmq_delayed_message_exchange rabbitmq_management
//! cargo build --release && DELAY_ROUTER_PROMISE_BIN=target/release/delay-router \
//!   cargo test --test plugin_cutover -- --ignored --nocapture --test-threads 1
//! ```
//!
//! Like the promise tests, they see the router only from outside.

#[path = "promises/harness.rs"]
#[allow(dead_code)]
mod harness;

use harness::*;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{AMQPValue, DecimalValue, FieldTable};
use lapin::{BasicProperties, ExchangeKind};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const SHORT: [&str; 4] = ["1s", "2s", "4s", "8s"];

/// Declares `name` as the plugin's exchange, of `x-delayed-type` `kind`.
async fn plugin_exchange(c: &Client, name: &str, kind: &str) {
    let args = table(&[("x-delayed-type", text(kind))]);
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    c.ch.exchange_declare(
        name.into(),
        ExchangeKind::Custom("x-delayed-message".into()),
        opts,
        args,
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "declaring an x-delayed-message exchange failed ({e}): enable the plugin \
                 (rabbitmq-plugins enable rabbitmq_delayed_message_exchange)"
        )
    });
}

/// `[[delayed_exchange]]` entries, each delivering to `deliver_to`.
fn served(names: &[&str], deliver_to: &str) -> String {
    names
        .iter()
        .map(|n| {
            format!(
                "[[delayed_exchange]]\nname = \"{n}\"\ntype = \"topic\"\ndeliver_to = \"{deliver_to}\"\n"
            )
        })
        .collect()
}

/// The `x-delay` values a plugin user's publisher may send.
fn cases() -> Vec<(&'static str, Option<AMQPValue>)> {
    vec![
        ("long", Some(AMQPValue::LongInt(1_500))),
        ("longlong", Some(AMQPValue::LongLongInt(1_500))),
        ("short", Some(AMQPValue::ShortInt(1_500))),
        ("digits", Some(text("1500"))),
        ("float", Some(AMQPValue::Double(1_500.9))),
        (
            "decimal",
            Some(AMQPValue::DecimalValue(DecimalValue {
                scale: 1,
                value: 15_009,
            })),
        ),
        ("absent", None),
        ("zero", Some(AMQPValue::LongInt(0))),
        ("negative", Some(AMQPValue::LongInt(-5_000))),
        ("words", Some(text("soon"))),
        ("too-long", Some(AMQPValue::LongLongInt(4_294_967_296))),
    ]
}

/// What became of one case: after how long it arrived and with what
/// `x-delay`, or the broker's words when the publish failed.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Arrived {
        waited_ms: i64,
        x_delay: Option<AMQPValue>,
    },
    Refused(String),
}

/// Publishes every case to `exchange` with key `eu.created`, each on a
/// connection of its own (a case may cost the publisher its connection),
/// and receives what arrives on `queue`.
async fn run_cases(exchange: &str, queue: &str) -> BTreeMap<String, Seen> {
    let mut sent = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for (id, delay) in cases() {
        let mut headers = FieldTable::default();
        if let Some(v) = delay {
            headers.insert("x-delay".into(), v);
        }
        let p = BasicProperties::default()
            .with_message_id(id.into())
            .with_headers(headers);
        let publisher = Client::connect().await;
        let at = Instant::now();
        match Client::try_publish_on(&publisher.ch, exchange, "eu.created", p, id.as_bytes()).await
        {
            Ok(()) => {
                sent.insert(id.to_owned(), at);
            }
            Err(e) => {
                seen.insert(id.to_owned(), Seen::Refused(e));
            }
        }
        let _ = publisher.conn.close(200, "ok".into()).await;
    }
    let c = Client::connect().await;
    for a in c.receive(queue, sent.len(), Duration::from_secs(20)).await {
        let id = message_id(&a);
        let arrived = Seen::Arrived {
            waited_ms: a.at.duration_since(sent[&id]).as_millis() as i64,
            x_delay: header(&a.delivery, "x-delay"),
        };
        seen.insert(id, arrived);
    }
    seen
}

#[tokio::test]
#[ignore = "needs a broker with the delayed-message-exchange plugin"]
async fn the_plugin_and_the_router_read_x_delay_alike() {
    let c = Client::connect().await;
    let prefix = format!("drp-{:08x}", rand::random::<u32>());
    // The plugin.
    let plugin = format!("{prefix}.plugin.delayed");
    plugin_exchange(&c, &plugin, "topic").await;
    let plugin_q = format!("{prefix}.plugin.inbox");
    c.queue(&plugin_q, FieldTable::default(), &plugin, "eu.*")
        .await;
    let by_plugin = run_cases(&plugin, &plugin_q).await;
    // The router serving an exchange of that kind.
    let served_name = format!("{prefix}.orders.delayed");
    let delivered = format!("{served_name}.delivered");
    let r = Router::on(&prefix, &SHORT, &served(&[&served_name], &delivered));
    r.wait_ready(Duration::from_secs(60)).await;
    let router_q = r.name("inbox");
    c.queue(&router_q, FieldTable::default(), &delivered, "eu.*")
        .await;
    let by_router = run_cases(&served_name, &router_q).await;

    println!("| x-delay | plugin | delay-router |\n|---|---|---|");
    let show = |s: Option<&Seen>| match s {
        None => "lost".to_owned(),
        Some(Seen::Arrived { waited_ms, x_delay }) => {
            let header = match (x_delay, x_delay.as_ref().and_then(integer)) {
                (None, _) => "no x-delay".to_owned(),
                (_, Some(n)) => format!("x-delay {n}"),
                (Some(v), None) => format!("x-delay {v:?}"),
            };
            format!("after {waited_ms} ms, {header}")
        }
        Some(Seen::Refused(e)) => format!("publish failed: {e}"),
    };
    let mut differ = Vec::new();
    for (id, delay) in cases() {
        let (p, r) = (by_plugin.get(id), by_router.get(id));
        println!("| {id} ({delay:?}) | {} | {} |", show(p), show(r));
        // The router takes every publish and loses nothing.
        let Some(Seen::Arrived {
            waited_ms: router_waited,
            x_delay: router_header,
        }) = r
        else {
            differ.push(format!("{id}: the router gave {}", show(r)));
            continue;
        };
        match p {
            Some(Seen::Arrived { waited_ms, x_delay }) => {
                // Waited alike (a second of slack: the router's rungs), or
                // routed at once alike.
                let waits = |ms: i64| ms >= 1_000;
                if waits(*waited_ms) != waits(*router_waited)
                    || (waited_ms - router_waited).abs() > 1_000
                {
                    differ.push(format!(
                        "{id}: waited {waited_ms} ms by the plugin, {router_waited} ms by the router"
                    ));
                }
                // Routed at once: the header as published, by both. Delayed:
                // the router writes minus the delay as an integer; the plugin
                // did so from RabbitMQ 3.13, and before it the consumer saw
                // the header as published (the rewrite never reached it).
                let plugin_ok = if waits(*waited_ms) {
                    x_delay == &delay || x_delay.as_ref().and_then(integer) == Some(-1_500)
                } else {
                    x_delay == &delay
                };
                let router_ok = if waits(*router_waited) {
                    router_header.as_ref().and_then(integer) == Some(-1_500)
                } else {
                    router_header == &delay
                };
                if !plugin_ok || !router_ok {
                    differ.push(format!(
                        "{id}: x-delay {x_delay:?} from the plugin, {router_header:?} from the router"
                    ));
                }
            }
            // A value that cost the plugin's publisher its connection: the
            // router's reading of it is a promise of its own
            // (tests/promises.rs).
            Some(Seen::Refused(_)) => {}
            other => differ.push(format!("{id}: the plugin gave {}", show(other))),
        }
    }
    c.delete_queue(&plugin_q).await;
    c.delete_exchange(&plugin).await;
    r.remove(&c).await;
    assert!(
        differ.is_empty(),
        "the router differs from the plugin:\n{}",
        differ.join("\n")
    );
}

/// The plugin's count of what its exchange holds, from the management API.
fn messages_delayed(exchange: &str) -> Option<i64> {
    let out = std::process::Command::new("curl")
        .args(["-sfu", "guest:guest"])
        .arg(format!(
            "http://127.0.0.1:15672/api/exchanges/%2f/{exchange}"
        ))
        .output()
        .ok()?;
    let body = String::from_utf8_lossy(&out.stdout);
    let at = body.find("\"messages_delayed\":")? + "\"messages_delayed\":".len();
    body[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

/// Publishes `n` messages `<phase>-<i>` to `exchange`, `x-delay` from
/// `from_ms` in steps of `step_ms`; returns (id, sent at ms, delay).
async fn publish_phase(
    c: &Client,
    exchange: &str,
    phase: &str,
    n: i64,
    from_ms: i64,
    step_ms: i64,
) -> Vec<(String, i64, i64)> {
    let mut sent = Vec::new();
    for i in 0..n {
        let id = format!("{phase}-{i}");
        let delay = from_ms + i * step_ms;
        let p = BasicProperties::default()
            .with_message_id(id.as_str().into())
            .with_headers(table(&[("x-delay", AMQPValue::LongInt(delay as i32))]));
        let at = now_ms();
        c.publish(exchange, "eu.created", p, id.as_bytes()).await;
        sent.push((id, at, delay));
    }
    sent
}

#[tokio::test]
#[ignore = "needs a broker with the delayed-message-exchange and management plugins"]
async fn the_cut_over_from_the_plugin_loses_nothing_and_delivers_nothing_early() {
    let c = Client::connect().await;
    let prefix = format!("drp-{:08x}", rand::random::<u32>());
    let old = format!("{prefix}.orders.delayed");
    let next = format!("{old}.next");
    let delivered = format!("{old}.delivered");
    let inbox = format!("{prefix}.orders.eu");
    // Before: the application on the plugin.
    plugin_exchange(&c, &old, "topic").await;
    c.queue(&inbox, FieldTable::default(), &old, "eu.*").await;
    // The consumer notes each arrival as it comes.
    let mut consumer = c.consume(&inbox).await;
    let mut sent = publish_phase(&c, &old, "plugin", 20, 3_000, 250).await;
    assert_eq!(messages_delayed(&old), Some(20), "the plugin holds them");
    // 1. The router with a new name, delivering where the old one will.
    let mut r = Router::on(&prefix, &SHORT, &served(&[&next], &delivered));
    r.wait_ready(Duration::from_secs(60)).await;
    // 2. The consumer's queue bound to the new path too.
    c.queue(&inbox, FieldTable::default(), &delivered, "eu.*")
        .await;
    // 3. Publishers switched to the new name; publish code unchanged.
    sent.extend(publish_phase(&c, &next, "next", 20, 1_000, 150).await);
    // 4. The plugin's exchange drains.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = messages_delayed(&old);
        if held == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "the plugin still holds {held:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // 5. Its exchange deleted, its name given to the router beside the new one.
    c.delete_exchange(&old).await;
    r.stop();
    let toml = std::fs::read_to_string(&r.config).unwrap();
    let toml = toml.replace(
        &served(&[&next], &delivered),
        &served(&[&next, &old], &delivered),
    );
    std::fs::write(&r.config, toml).unwrap();
    r.restart().await;
    // A publisher still on the old name reaches the router.
    sent.extend(publish_phase(&c, &old, "old", 20, 1_000, 100).await);

    let got = consumer.take(sent.len() + 5, Duration::from_secs(15)).await;
    consumer.close().await;
    let mut count = BTreeMap::<String, usize>::new();
    let mut early = Vec::new();
    let mut header_wrong = Vec::new();
    let mut late = Vec::new();
    for a in &got {
        let id = message_id(a);
        *count.entry(id.clone()).or_default() += 1;
        let (_, at, delay) = sent.iter().find(|s| s.0 == id).unwrap();
        let lateness = a.at_ms - (at + delay);
        if lateness < 0 {
            early.push(format!("{id}: {lateness} ms"));
        }
        late.push(lateness);
        // The router writes minus the delay; the plugin before RabbitMQ
        // 3.13 delivered it as published.
        let x_delay = header(&a.delivery, "x-delay").as_ref().and_then(integer);
        let by_plugin_before_3_13 = id.starts_with("plugin-") && x_delay == Some(*delay);
        if x_delay != Some(-delay) && !by_plugin_before_3_13 {
            header_wrong.push(format!("{id}: {x_delay:?}"));
        }
    }
    late.sort_unstable();
    let missing: Vec<_> = sent
        .iter()
        .filter(|s| !count.contains_key(&s.0))
        .map(|s| s.0.clone())
        .collect();
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).collect();
    println!(
        "cut-over: {} sent, {} received, {} missing, {} twice, {} early; lateness p50 {} p99 {} max {} ms",
        sent.len(),
        got.len(),
        missing.len(),
        twice.len(),
        early.len(),
        quantile(&late, 0.5),
        quantile(&late, 0.99),
        late.last().copied().unwrap_or(0)
    );
    c.delete_queue(&inbox).await;
    r.remove(&c).await;
    assert!(missing.is_empty(), "lost in the cut-over: {missing:?}");
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    assert!(early.is_empty(), "early: {early:?}");
    assert!(
        header_wrong.is_empty(),
        "x-delay not minus the delay: {header_wrong:?}"
    );
}
