//! `amqps://`: the router connects over TLS (rustls) trusting the CA named by
//! `[amqp] ca_file`, and refuses a broker whose certificate it cannot verify,
//! without showing the password. scripts/ensure-rabbitmq-tls gives the local
//! broker an AMQPS listener (5671; DELAY_ROUTER_TEST_TLS_PORT) with a throwaway CA.

mod common;
use common::*;
use lapin::types::AMQPValue;
use std::process::Command;
use std::time::Duration;

/// The AMQPS port of the broker under test: DELAY_ROUTER_TEST_TLS_PORT or 5671.
fn tls_port() -> String {
    std::env::var("DELAY_ROUTER_TEST_TLS_PORT").unwrap_or_else(|_| "5671".into())
}

/// Starts (once per machine) the broker's TLS listener; returns the CA path.
/// For another broker than the default, DELAY_ROUTER_TEST_CTL and
/// DELAY_ROUTER_TEST_BROKER_ROOT say how to reach it and where its files are.
fn tls_ca() -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ensure-rabbitmq-tls");
    let mut cmd = Command::new(script);
    cmd.args(["--port", &tls_port()]);
    if let Ok(ctl) = std::env::var("DELAY_ROUTER_TEST_CTL") {
        cmd.args(["--rabbitmqctl", &ctl]);
    }
    if let Ok(root) = std::env::var("DELAY_ROUTER_TEST_BROKER_ROOT") {
        cmd.args(["--broker-root", &root]);
    }
    let out = cmd.output().expect("run scripts/ensure-rabbitmq-tls");
    assert!(
        out.status.success(),
        "scripts/ensure-rabbitmq-tls failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Whether the broker sees this prefix's router connections over TLS.
fn router_connections_use_tls(prefix: &str) -> Vec<bool> {
    rabbitmqctl(&["list_connections", "-q", "ssl", "client_properties"])
        .lines()
        .filter(|l| {
            l.contains(&format!("delay-router consume {prefix}"))
                || l.contains(&format!("delay-router publish {prefix}"))
        })
        .map(|l| l.starts_with("true"))
        .collect()
}

#[tokio::test]
async fn the_router_works_over_amqps_with_its_ca_file() {
    let ca = tls_ca();
    let port = tls_port();
    let extra =
        format!("[amqp]\nurl = \"amqps://guest:guest@localhost:{port}/%2f\"\nca_file = \"{ca}\"\n");
    let mut h = Harness::new(&["1s", "2s"], &extra).await;
    h.start_router().await;
    assert_eq!(router_connections_use_tls(&h.prefix), vec![true, true]);
    let q = h.queue("dest").await;
    h.publish(
        "k",
        to_queue(&q, AMQPValue::LongInt(1200)).with_message_id("0".into()),
        b"tls",
    )
    .await;
    let got = h.receive(&q, 1, Duration::from_secs(15)).await;
    assert_eq!(got[0].1.data, b"tls");
    h.cleanup().await;
}

/// `delay-router declare` on a config with this `[amqp]` table: (exit code, stderr).
fn declare_with(prefix: &str, amqp: &str) -> (Option<i32>, String) {
    let path = std::env::temp_dir().join(format!("{prefix}-tls.toml"));
    std::fs::write(&path, config_toml(prefix, &["1s"], amqp)).unwrap();
    let out = Command::new(BIN)
        .args(["declare", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn an_unverifiable_certificate_is_refused_without_leaking_the_password() {
    tls_ca();
    let h = Harness::new(&["1s"], "").await;
    // No ca_file: the throwaway CA is not among the system's roots.
    let port = tls_port();
    let (code, stderr) = declare_with(
        &h.prefix,
        &format!("[amqp]\nurl = \"amqps://guest:s3cret-pw@localhost:{port}/%2f\"\n"),
    );
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("invalid peer certificate"), "{stderr}");
    assert!(
        stderr.contains(&format!("amqps://guest:***@localhost:{port}")),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");

    // A ca_file with a plain amqp:// URL is a configuration error.
    let (code, stderr) = declare_with(
        &h.prefix,
        &format!("[amqp]\nurl = \"{URL}\"\nca_file = \"/nonexistent.pem\"\n"),
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("amqp.ca_file"), "{stderr}");
    h.cleanup().await;
}
