//! `[amqp] coalesce`: the router binary (the park hook is installed by its
//! `main`, not by an in-process router) at a steady 100 messages a second,
//! once without coalescing and once with a 20 ms tick: with it, every
//! message still arrives, none early and none much late, and the router's
//! thread wakes less often per message; and messages with due times (held
//! by the router at their last hop) are no later with it than without.
//! A longer tick (100 ms) is slept whole at that rate: fewer wake-ups than
//! a 20 ms one, and at a few hundred deliveries a second its ticks stay as
//! short as 20 ms ones: the time 4 deliveries take. Coalescing is off
//! unless set.

mod common;
use common::*;

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use std::time::{Duration, Instant};

const N: usize = 200;
const DELAY_MS: i64 = 1500;
/// The ladder's 2 s rung: placed whole, nothing left to hold.
const WHOLE_RUNG_MS: i64 = 2000;

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

/// What one run measured.
struct Run {
    /// Voluntary switches of the router's threads a message.
    switches: f64,
    /// Messages published a second, first to last.
    rate: f64,
    median_late: Duration,
    p90_late: Duration,
    worst_late: Duration,
}

/// Runs N messages through a router process with this `coalesce`, each
/// with a delay of `delay_ms` (`x-requested-delay`) or, when `absolute`,
/// due that long after it is sent (`x-deliver-at`), one every 10 ms.
async fn run(coalesce: &str, absolute: bool, delay_ms: i64) -> Run {
    run_at(
        Some(coalesce),
        absolute,
        delay_ms,
        Duration::from_millis(10),
    )
    .await
}

/// [`run`] with one message every `gap`; `None`: no `coalesce` in the
/// configuration (the default).
async fn run_at(coalesce: Option<&str>, absolute: bool, delay_ms: i64, gap: Duration) -> Run {
    let ladder = ["1s", "2s"];
    let mut h = Harness::new(&ladder, "").await;
    let extra = coalesce.map_or(String::new(), |c| format!("[amqp]\ncoalesce = \"{c}\""));
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
    let mut confirms = Vec::with_capacity(N);
    let publish = async {
        let mut every = tokio::time::interval(gap);
        for (i, at) in sent.iter_mut().enumerate() {
            every.tick().await;
            *at = Instant::now();
            let props = if absolute {
                // The router's hold makes up for any wait in its ingress (a
                // coalescing sleep included): what is late is late at the
                // last hop. Rounded up: never due before `at` + the delay.
                let due_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64
                    + 1
                    + delay_ms;
                BasicProperties::default().with_headers(headers(&[
                    ("x-deliver-at", AMQPValue::LongLongInt(due_ms)),
                    ("x-original-exchange", s("")),
                    ("x-original-routing-key", s(&q)),
                ]))
            } else {
                to_queue(&q, AMQPValue::LongLongInt(delay_ms))
            }
            .with_message_id(i.to_string().into());
            // Confirms are awaited at the end, so the pace is the interval's.
            confirms.push(h.publish_unawaited("k", props, b"steady").await);
        }
        for c in confirms {
            assert!(c.await.unwrap().is_ack());
        }
    };
    let ((), got) = tokio::join!(publish, consumer.take(N, Duration::from_secs(60)));
    let after = voluntary_switches(pid);
    consumer.close().await;

    let delay = Duration::from_millis(delay_ms as u64);
    let mut seen = [false; N];
    let mut late = Vec::with_capacity(N);
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
        late.push(*arrived - due);
    }
    late.sort();
    router.kill_9();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&log);
    h.cleanup().await;
    let spread = sent[N - 1].saturating_duration_since(sent[0]).as_secs_f64();
    Run {
        switches: (after - before) as f64 / N as f64,
        rate: (N - 1) as f64 / spread.max(1e-3),
        median_late: late[late.len() / 2],
        p90_late: late[late.len() * 9 / 10],
        worst_late: late[late.len() - 1],
    }
}

#[tokio::test]
async fn coalescing_wakes_the_router_less_and_keeps_every_message_on_time() {
    // Delays counted from when the router reads them: a coalescing sleep
    // at the ingress adds to them, and saves wake-ups.
    let off = run("0s", false, DELAY_MS).await;
    let on = run("20ms", false, DELAY_MS).await;
    // Due times: every message ends on a hold that makes up for the
    // ingress, and no sleep runs past a held deadline.
    let off_at = run("0s", true, DELAY_MS).await;
    let on_at = run("20ms", true, DELAY_MS).await;
    let line = |r: &Run| {
        format!(
            "{:.2} switches a message, lateness median {:?}, p90 {:?}, worst {:?}",
            r.switches, r.median_late, r.p90_late, r.worst_late
        )
    };
    eprintln!(
        "delays: off {}; 20ms {}\ndue times: off {}; 20ms {}",
        line(&off),
        line(&on),
        line(&off_at),
        line(&on_at)
    );
    // Measured: about 2.2 a message off, 1.2 to 1.7 with a 20 ms tick.
    assert!(
        on.switches < 0.9 * off.switches,
        "coalescing did not cut wake-ups: {:.2} against {:.2} a message",
        on.switches,
        off.switches
    );
    // Measured: the p90 within a millisecond of the one without coalescing
    // (3 ms); 15 ms when sleeps ran past held deadlines.
    assert!(
        on_at.p90_late < off_at.p90_late + Duration::from_millis(6),
        "held messages late: p90 {:?} with coalescing against {:?} without",
        on_at.p90_late,
        off_at.p90_late
    );
    // A tick at the ingress at most; the margin is for a busy machine.
    for r in [&on, &on_at] {
        assert!(
            r.worst_late < Duration::from_secs(1),
            "worst lateness {:?}",
            r.worst_late
        );
    }
}

#[tokio::test]
async fn a_longer_tick_is_slept_whole_and_wakes_the_router_less() {
    // About 100 deliveries a second (the publishes take 2 s, as long as
    // the delay): a 20 ms tick gathers 2 of them, a 100 ms one 10. Before
    // 235eb91 every tick was cut to the time 4 deliveries take (40 ms
    // here): 0.48 of the default's wake-ups a message, measured, where the
    // whole tick gives 0.24. The delay is a whole rung: the last hop is
    // the bucket, no hold whose deadline would end the sleeps.
    let default = run("20ms", false, WHOLE_RUNG_MS).await;
    let longer = run("100ms", false, WHOLE_RUNG_MS).await;
    eprintln!(
        "20ms: {:.2} switches a message, lateness median {:?}, worst {:?}; 100ms: {:.2}, median {:?}, worst {:?}",
        default.switches,
        default.median_late,
        default.worst_late,
        longer.switches,
        longer.median_late,
        longer.worst_late
    );
    assert!(
        longer.switches < 0.4 * default.switches,
        "a 100 ms tick was not slept whole: {:.2} switches a message against {:.2} at 20 ms",
        longer.switches,
        default.switches
    );
    // Two ticks at most (the ingress, the last hop); the margin is for a
    // busy machine. None early, lost or twice: `run` asserts it.
    assert!(
        longer.worst_late < Duration::from_secs(1),
        "worst lateness {:?}",
        longer.worst_late
    );
}

#[tokio::test]
async fn a_100ms_tick_sleeps_long_at_low_rates_and_briefly_at_higher_ones() {
    // About 100 deliveries a second: the default's tick is 100 ms there,
    // against a 20 ms one's 20.
    let twenty = run("20ms", false, WHOLE_RUNG_MS).await;
    let default = run_at(
        Some("100ms"),
        false,
        WHOLE_RUNG_MS,
        Duration::from_millis(10),
    )
    .await;
    // 400 messages a second for half a second: 400 deliveries a second
    // while they are placed, and again 2 s later while they are forwarded.
    // 4 deliveries take 10 ms, the tick under either setting. Before the
    // default was 100 ms, `"100ms"` slept as long as 20 deliveries take
    // (50 ms here).
    let gap = Duration::from_micros(2500);
    let twenty_fast = run_at(Some("20ms"), false, WHOLE_RUNG_MS, gap).await;
    let default_fast = run_at(Some("100ms"), false, WHOLE_RUNG_MS, gap).await;
    let line = |r: &Run| {
        format!(
            "{:.0} messages/s, {:.2} switches a message, lateness median {:?}, p90 {:?}, worst {:?}",
            r.rate, r.switches, r.median_late, r.p90_late, r.worst_late
        )
    };
    eprintln!(
        "about 100/s: 20ms {}; default {}\nabout 400/s: 20ms {}; default {}",
        line(&twenty),
        line(&default),
        line(&twenty_fast),
        line(&default_fast)
    );
    assert!(
        default.switches < 0.4 * twenty.switches,
        "the default did not sleep its 100 ms at 100 deliveries a second: {:.2} switches a message against {:.2} at 20 ms",
        default.switches,
        twenty.switches
    );
    // Below 250 deliveries a second the default's ticks are longer by
    // design: the comparison needs the pace.
    for r in [&twenty_fast, &default_fast] {
        assert!(
            r.rate > 300.0,
            "the publisher kept {:.0} messages a second, not 400",
            r.rate
        );
    }
    // Two 10 ms ticks at most (the ingress, the last hop) and the broker's
    // own expiry under either; 50 ms ticks would put the p90 near 100 ms.
    assert!(
        default_fast.p90_late < twenty_fast.p90_late + Duration::from_millis(40),
        "the default's ticks grew at 400 deliveries a second: p90 {:?} against {:?} at 20 ms",
        default_fast.p90_late,
        twenty_fast.p90_late
    );
    for r in [&default, &default_fast] {
        assert!(
            r.worst_late < Duration::from_secs(1),
            "worst lateness {:?}",
            r.worst_late
        );
    }
}
