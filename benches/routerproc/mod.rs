//! The release router as a bench runs it: the shipped `buckets.toml` with a
//! prefix, a metrics port and overrides from the environment; scraped over
//! HTTP; stopped with SIGTERM; and everything it declared removed.

use delay_router::config::Config;
use delay_router::core::decision::Rules;
use lapin::Channel;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const SHIPPED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/buckets.toml");
/// How long a router may take to stop after SIGTERM before it is killed.
const STOP_LIMIT: Duration = Duration::from_secs(120);

/// The configuration the router runs on: the shipped one, or BENCH_CONFIG
/// (another ladder, e.g. a scaled-down one for a quicker experiment).
pub fn config_path() -> String {
    std::env::var("BENCH_CONFIG").unwrap_or_else(|_| SHIPPED.to_owned())
}

/// The rules of the configuration the router runs on, under `prefix`.
#[allow(dead_code)] // not every bench that shares this module reads it
pub fn rules(prefix: &str) -> Rules {
    rules_of(&config_path(), prefix)
}

/// The rules of the configuration file `config`, under `prefix`.
pub fn rules_of(config: &str, prefix: &str) -> Rules {
    let mut config = Config::from_toml(&std::fs::read_to_string(config).unwrap()).unwrap();
    config.prefix = prefix.to_owned();
    Rules::new(&config.ladder, config.strategy, prefix, "guest")
}

/// A router process on the shipped configuration (or another file).
pub struct RouterProcess {
    pub child: Child,
    pub port: u16,
    pub prefix: String,
    /// The configuration file it runs on.
    config: String,
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
    #[allow(dead_code)] // not every bench that shares this module calls it
    pub async fn start(url: &str, prefix: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with_config(&config_path(), url, prefix, env).await
    }

    /// [`RouterProcess::start`] on the configuration file `config`.
    pub async fn start_with_config(
        config: &str,
        url: &str,
        prefix: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let bin = std::env::var_os("BENCH_BIN").map_or_else(
            || std::path::PathBuf::from(env!("CARGO_BIN_EXE_delay-router")),
            std::path::PathBuf::from,
        );
        Self::start_binary(&bin, config, url, prefix, env).await
    }

    /// [`RouterProcess::start_with_config`] with the binary `bin`.
    pub async fn start_binary(
        bin: &std::path::Path,
        config: &str,
        url: &str,
        prefix: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let port = free_port();
        let child = Command::new(bin)
            .args(["run", "--config", config])
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
            if Instant::now() >= ready {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
                panic!("the router never became ready");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            child,
            port,
            prefix: prefix.to_owned(),
            config: config.to_owned(),
        }
    }

    /// The exchange senders publish to.
    pub fn exchange(&self) -> String {
        format!("{}.router", self.prefix)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The router's /metrics page, or nothing when it does not answer.
    fn metrics(&self) -> String {
        ureq::get(&format!("http://127.0.0.1:{}/metrics", self.port))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default()
    }

    /// The first sample named exactly `name` (no labels) on /metrics, or 0.
    pub fn scrape(&self, name: &str) -> f64 {
        let body = self.metrics();
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// The sample of `name` whose labels are exactly `labels` (as printed,
    /// e.g. `le="0.01"`), or 0.
    #[allow(dead_code)] // not every bench that shares this module reads it
    pub fn scrape_labelled(&self, name: &str, labels: &str) -> f64 {
        let body = self.metrics();
        let prefix = format!("{name}{{{labels}}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0.0)
    }

    /// SIGTERM, wait (SIGKILL after [`STOP_LIMIT`]), then delete what the
    /// router declared and `extra_queues`; returns how many messages the
    /// router's own queues and buckets still held (waiting, not lost).
    pub async fn stop_and_remove(mut self, ch: &Channel, extra_queues: &[String]) -> u64 {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + STOP_LIMIT;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            println!("the router did not stop within {STOP_LIMIT:?}: killed");
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        delay_router::testkit::teardown::remove_topology(
            ch,
            &rules_of(&self.config, &self.prefix),
            extra_queues,
        )
        .await
    }
}
