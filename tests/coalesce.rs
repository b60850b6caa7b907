//! `[amqp] coalesce`: the router binary (the park hook is installed by its
//! `main`, not by an in-process router) at a steady 100 messages a second,
//! once without coalescing and once with a 20 ms tick: with it, every
//! message still arrives, none early and none much late, and the router's
//! thread wakes far less often per message.

mod common;
use common::*;

use lapin::types::AMQPValue;
use std::time::{Duration, Instant};

const N: usize = 200;
const DELAY_MS: i64 = 1500;

/// Voluntary context switches of every thread of `pid`: each time one went
/// to sleep waiting (for the network, a timer, or a coalescing tick).
fn voluntary_switches(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the router's /proc entry")
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Runs N messages through a router process with this `coalesce`; returns
/// its voluntary switches per message and the worst lateness.
async fn run(coalesce: &str) -> (f64, Duration) {
    let ladder = ["1s", "2s"];
    let mut h = Harness::new(&ladder, "").await;
    let extra = format!("[amqp]\ncoalesce = \"{coalesce}\"");
    let path = write_config(&h.prefix, &ladder, &extra);
    let log = std::env::temp_dir().join(format!("{}.log", h.prefix));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    let q = h.queue("dest").await;
    let mut consumer = delay_router::testkit::consume::Consumer::open(
        &h.conn,
        &q,
        delay_router::testkit::consume::Acks::Auto,
    )
    .await;
    let pid = router.0.id();
    let before = voluntary_switches(pid);

    let mut sent = vec![Instant::now(); N];
    let publish = async {
        let mut every = tokio::time::interval(Duration::from_millis(10));
        for (i, at) in sent.iter_mut().enumerate() {
            every.tick().await;
            *at = Instant::now();
            let props = to_queue(&q, AMQPValue::LongLongInt(DELAY_MS))
                .with_message_id(i.to_string().into());
            h.publish("k", props, b"steady").await;
        }
    };
    let ((), got) = tokio::join!(publish, consumer.take(N, Duration::from_secs(60)));
    let after = voluntary_switches(pid);
    consumer.close().await;

    let delay = Duration::from_millis(DELAY_MS as u64);
    let mut seen = [false; N];
    let mut worst = Duration::ZERO;
    for (arrived, d) in &got {
        let i = id(d);
        assert!(i < N, "unknown message id {i}");
        assert!(!seen[i], "message {i} arrived twice");
        seen[i] = true;
        let due = sent[i] + delay;
        assert!(
            *arrived >= due,
            "message {i} arrived {:?} early",
            due - *arrived
        );
        worst = worst.max(*arrived - due);
    }
    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
    ((after - before) as f64 / N as f64, worst)
}

#[tokio::test]
async fn coalescing_wakes_the_router_less_and_keeps_every_message_on_time() {
    let (off, off_late) = run("0s").await;
    let (on, on_late) = run("20ms").await;
    eprintln!(
        "voluntary switches a message: off {off:.2} (worst lateness {off_late:?}), \
         20ms {on:.2} (worst {on_late:?})"
    );
    // Measured: about 1.2 a delivery off, 0.3 with a 20 ms tick.
    assert!(
        on < 0.75 * off,
        "coalescing did not cut wake-ups: {on:.2} against {off:.2} a message"
    );
    // A tick adds at most 20 ms at the last hop; the margin is for a busy machine.
    assert!(
        on_late < Duration::from_secs(1),
        "worst lateness {on_late:?}"
    );
}
