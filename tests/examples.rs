//! The client paths as users run them: the Python (pika) zero-code example,
//! and the Rust client API's explicit "retry this delivery in D".

mod common;
use common::*;
use delay_router::client::retry_later;
use lapin::BasicProperties;
use lapin::options::*;
use lapin::types::FieldTable;
use std::process::Command;
use std::time::{Duration, Instant};

const POLICY: &str =
    "[[policy]]\nqueue = \"*.work\"\ninitial = \"1s\"\nmultiplier = 2.0\nmax_attempts = 5\n";

#[tokio::test]
async fn the_python_zero_code_example_retries_with_backoff_then_succeeds() {
    let python = Command::new("python3").args(["-c", "import pika"]).status();
    assert!(
        python.is_ok_and(|s| s.success()),
        "python3 with pika is needed: scripts/test installs it (python3 -m pip install pika)"
    );
    let mut h = Harness::new(&["1s", "2s"], POLICY).await;
    h.start_router().await;
    let work = format!("{}.work", h.prefix);
    h.track_queue(&work);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/zero_code_retry.py");
    let out = tokio::task::spawn_blocking({
        let (router, work) = (h.names.router_exchange.to_string(), work.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .env("AMQP_URL", url())
                .env("ROUTER_EXCHANGE", router)
                .env("QUEUE", work)
                .env("FAILURES", "2")
                .env("TIMEOUT", "30")
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("delivery 1 attempts=-"), "{stdout}");
    assert!(lines[1].starts_with("delivery 2 attempts=1"), "{stdout}");
    assert!(lines[2].starts_with("delivery 3 attempts=2"), "{stdout}");
    assert_eq!(lines[3], "succeeded after 3 deliveries");
    // "at 1.0s", "at 3.0s": 1 s then 2 s of backoff, never early.
    let at = |l: &str| {
        l.split(" at ")
            .nth(1)
            .unwrap()
            .split('s')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert!(
        at(lines[1]) - at(lines[0]) >= 0.95 && at(lines[2]) - at(lines[1]) >= 1.95,
        "{stdout}"
    );
    h.cleanup().await;
}

#[tokio::test]
async fn the_rust_client_retries_a_delivery_and_the_router_counts_it() {
    let mut h = Harness::start(&["1s", "2s"]).await;
    let q = h.queue("jobs").await;
    let ch = h.conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut hdrs = FieldTable::default();
    hdrs.insert("tenant".into(), s("acme"));
    let original = BasicProperties::default()
        .with_message_id("j1".into())
        .with_headers(hdrs);
    h.ch.basic_publish(
        "".into(),
        q.as_str().into(),
        Default::default(),
        b"job",
        original,
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let mut consumer = Consumer::open(&h.conn, &q, Acks::Manual(10)).await;
    let mut times = Vec::new();
    for attempt in 0..3 {
        let d = consumer.next(Duration::from_secs(15)).await;
        times.push(Instant::now());
        let attempts = header_int(&d.properties, "x-delay-router-attempts");
        assert_eq!(attempts, if attempt == 0 { None } else { Some(attempt) });
        assert_eq!(header_str(&d, "tenant").as_deref(), Some("acme"));
        assert_eq!(d.data, b"job");
        if attempt < 2 {
            retry_later(
                &ch,
                h.names.router_exchange.as_str(),
                &d,
                Duration::from_millis(1500),
            )
            .await
            .unwrap();
        }
        d.acker.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert!(times[1] - times[0] >= Duration::from_millis(1500));
    assert!(times[2] - times[1] >= Duration::from_millis(1500));
    h.cleanup().await;
}
