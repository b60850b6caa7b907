//! The release router as a bench runs it: the shipped `buckets.toml` with a
//! prefix, a metrics port and overrides from the environment; scraped over
//! HTTP; stopped with SIGTERM; and everything it declared removed.

use delay_router::config::Config;
use delay_router::core::decision::Rules;
use lapin::Channel;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/buckets.toml");

/// The configuration the router runs on: the shipped one, or BENCH_CONFIG
/// (another ladder, e.g. a scaled-down one for a quicker experiment).
pub fn config_path() -> String {
    std::env::var("BENCH_CONFIG").unwrap_or_else(|_| SHIPPED.to_owned())
}

/// The rules of the configuration the router runs on, under `prefix`.
pub fn rules(prefix: &str) -> Rules {
    let mut config = Config::from_toml(&std::fs::read_to_string(config_path()).unwrap()).unwrap();
    config.prefix = prefix.to_owned();
    Rules::new(&config.ladder, config.strategy, prefix, "guest")
}

/// A router process on the shipped configuration.
pub struct RouterProcess {
    pub child: Child,
    pub port: u16,
    pub prefix: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RouterProcess {
    /// Starts the router (`CARGO_BIN_EXE_delay-router`, or the binary in
    /// `BENCH_BIN`: another build, to compare) on `url` with `prefix` and the
    /// extra `DELAY_ROUTER__*` overrides in `env`, and waits until `/readyz`
    /// answers.
    pub async fn start(url: &str, prefix: &str, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let bin = std::env::var_os("BENCH_BIN").map_or_else(
            || std::path::PathBuf::from(env!("CARGO_BIN_EXE_delay-router")),
            std::path::PathBuf::from,
        );
        let child = Command::new(bin)
            .args(["run", "--config", &config_path()])
            .env("DELAY_ROUTER__AMQP__URL", url)
            .env("DELAY_ROUTER__TOPOLOGY__PREFIX", prefix)
            .env("DELAY_ROUTER__METRICS__LISTEN", format!("127.0.0.1:{port}"))
            // BENCH_ROUTER_LOG: the router's RUST_LOG (its log goes to stderr).
            .env(
                "RUST_LOG",
                std::env::var("BENCH_ROUTER_LOG")
                    .unwrap_or_else(|_| "warn,lapin::channel=off".to_owned()),
            )
            // Classic buckets unless BENCH_QUEUE_TYPE says otherwise (the
            // figures in README are with classic buckets unless they say
            // quorum); `env` may name it too.
            .env(
                "DELAY_ROUTER__TOPOLOGY__QUEUE_TYPE",
                std::env::var("BENCH_QUEUE_TYPE").unwrap_or_else(|_| "classic".to_owned()),
            )
            .envs(env.iter().copied())
            .spawn()
            .expect("router binary");
        let ready = Instant::now() + Duration::from_secs(60);
        while ureq::get(&format!("http://127.0.0.1:{port}/readyz"))
            .call()
            .is_err()
        {
            assert!(Instant::now() < ready, "the router never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            child,
            port,
            prefix: prefix.to_owned(),
        }
    }

    /// The exchange senders publish to.
    pub fn exchange(&self) -> String {
        format!("{}.router", self.prefix)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first sample named exactly `name` (no labels) on /metrics, or 0.
    pub fn scrape(&self, name: &str) -> f64 {
        let body = ureq::get(&format!("http://127.0.0.1:{}/metrics", self.port))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// SIGTERM, wait, then delete what the router declared and `extra_queues`;
    /// returns how many messages the router's own queues and buckets still
    /// held (waiting, not lost).
    pub async fn stop_and_remove(mut self, ch: &Channel, extra_queues: &[String]) -> u64 {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        delay_router::testkit::teardown::remove_topology(ch, &rules(&self.prefix), extra_queues)
            .await
    }
}
