//! The binary: declare (idempotent, clear conflicts), status, config errors,
//! and `run` stopping gracefully on SIGTERM without losing a message.

mod common;
use common::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `delay-router run` and waits until it consumes.
async fn spawn_run(h: &Harness, path: &std::path::Path) -> std::process::Child {
    let child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    h.wait_consumers().await;
    child
}

fn cli(args: &[&str], path: &std::path::Path) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(path)
        .output()
        .unwrap()
}

#[tokio::test]
async fn declare_twice_is_idempotent_and_status_lists_every_queue() {
    let h = Harness::new(&["1s", "2s", "5s"], "").await;
    let path = write_config(&h.prefix, &["1s", "2s", "5s"], "");
    for _ in 0..2 {
        let out = cli(&["declare"], &path);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for rung in ["1s", "2s", "5s"] {
        assert_eq!(h.depth(&format!("{}.bucket.{rung}", h.prefix)).await, 0);
    }
    h.publish(
        "k",
        to_queue("nowhere", AMQPValue::LongInt(1000)),
        b"waiting",
    )
    .await;
    let out = cli(&["status"], &path);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for line in ["bucket 1s", "bucket 2s", "bucket 5s"] {
        assert!(text.contains(line), "{text}");
    }
    let ingress_line = text.lines().find(|l| l.starts_with("ingress")).unwrap();
    assert!(
        ingress_line.ends_with(" 1"),
        "one message waits in ingress: {text}"
    );
    assert!(!text.contains(":guest@"), "no password in status: {text}");
    assert!(text.contains("router not running"), "{text}");
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}

#[tokio::test]
async fn declare_over_a_conflicting_queue_says_which_queue_and_what_to_do() {
    let h = Harness::new(&["1s"], "").await;
    let bucket = format!("{}.bucket.1s", h.prefix);
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongInt(5000));
    h.ch.queue_declare(bucket.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    let path = write_config(&h.prefix, &["1s"], "");
    let out = cli(&["declare"], &path);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "queue '{bucket}' already exists with different arguments"
        )),
        "{err}"
    );
    assert!(err.contains("x-message-ttl"), "{err}");
    assert!(err.contains("delete_queue"), "{err}");
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}

#[test]
fn invalid_configuration_exits_non_zero_naming_key_and_value() {
    let dir = std::env::temp_dir().join(format!("drt-cfg-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "[[bucket]]\nttl = \"1s\"\n[[bucket]]\nttl = \"1000ms\"\n",
            "\"1s\" and \"1000ms\"",
        ),
        ("[[bucket]]\nttl = \"0s\"\n", "\"0s\" is zero"),
        (
            "[[bucket]]\nttl = \"fortnightish\"\n",
            "bucket[0].ttl = \"fortnightish\"",
        ),
        (
            "[[bucket]]\nttl = \"60 days\"\n",
            "exceeds RabbitMQ's limit",
        ),
        (
            "[placement]\nstrategy = \"nearest\"\n[[bucket]]\nttl = \"1s\"\n",
            "placement.strategy = \"nearest\"",
        ),
        ("", "the ladder is empty"),
        ("[[bucket]]\nttl = 5\n", "bucket"),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let path = dir.join(format!("{i}.toml"));
        std::fs::write(&path, text).unwrap();
        for cmd in ["run", "declare", "status"] {
            let out = cli(&[cmd], &path);
            assert!(!out.status.success(), "{cmd} accepted {text:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(expected), "{cmd} {text:?}: {err}");
        }
    }
    let out = Command::new(BIN)
        .args(["status", "--config"])
        .arg(dir.join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_password_never_appears_in_errors() {
    let path = std::env::temp_dir().join(format!("drt-pw-{}.toml", rand::random::<u32>()));
    std::fs::write(&path, "[[bucket]]\nttl = \"1s\"\n").unwrap();
    let out = Command::new(BIN)
        .args(["status", "--config"])
        .arg(&path)
        .env(
            "DELAY_ROUTER__AMQP__URL",
            "amqp://guest:s3cr3t-pw@127.0.0.1:1/%2f",
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("guest:***@127.0.0.1:1"), "{all}");
    assert!(!all.contains("s3cr3t-pw"), "{all}");
    std::fs::remove_file(path).unwrap();
}

#[tokio::test]
async fn sigterm_stops_run_cleanly_and_loses_nothing() {
    const N: usize = 200;
    let mut h = Harness::new(&["1s", "2s"], "").await;
    let dest = h.queue("dest").await;
    let path = write_config(&h.prefix, &["1s", "2s"], "");
    let mut child = spawn_run(&h, &path).await;
    let status = cli(&["status"], &path);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("router running: 1 router(s) consuming"),
        "{text}"
    );
    for i in 0..N {
        let props = to_queue(&dest, AMQPValue::LongInt(((i % 3) * 700) as i32))
            .with_message_id(i.to_string().into());
        h.publish("k", props, b"m").await;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert!(
        status.0.success(),
        "exit status {:?}: {}",
        status.0,
        status.1
    );
    assert!(status.1.contains("stopped cleanly"), "{}", status.1);
    // Whatever was left resumes with a new router: every message arrives once.
    h.start_router().await;
    let got = h.receive(&dest, N, Duration::from_secs(30)).await;
    let mut ids: Vec<usize> = got.iter().map(|(_, d)| id(d)).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), N);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.depth(&dest).await, 0, "no duplicates");
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}

#[tokio::test]
async fn the_priority_strategy_warns_at_start_what_the_broker_gives() {
    // Classic buckets, whose priorities the warning describes.
    const EXTRA: &str =
        "[topology]\nqueue_type = \"classic\"\n[placement]\nstrategy = \"priority\"";
    let mut h = Harness::new(&["1s"], EXTRA).await;
    let path = write_config(&h.prefix, &["1s"], EXTRA);
    let child = spawn_run(&h, &path).await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The warning names the broker the router connected to.
    let info = delay_router::broker::server::server_info(&h.config.urls[0], None)
        .await
        .unwrap();
    let (major, minor) = info.major_minor().unwrap();
    let said = format!("strategy \"priority\" with classic buckets on RabbitMQ {major}.{minor}:");
    assert!(err.contains(&said), "{said} not in {err}");
    assert!(err.contains("Use \"cascade\" for exact delays"), "{err}");
    h.start_router().await; // so cleanup sees a router to stop
    std::fs::remove_file(path).unwrap();
    h.cleanup().await;
}
