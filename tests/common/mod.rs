//! Test harness: a router in-process on a random prefix with a short ladder,
//! a client connection, and removal of everything declared, even on panic.
#![allow(dead_code)]

use delay_router::config::Config;
use delay_router::core::decision::Rules;
use delay_router::core::placement::PlacementStrategy;
use delay_router::core::topology::Names;
use delay_router::router::stats::Stats;
use delay_router::router::{self, RouterError};
#[allow(unused_imports)]
pub use delay_router::testkit::consume::{Acks, Consumer};
#[allow(unused_imports)]
pub use delay_router::testkit::props::{header_int, headers, s};
use lapin::message::Delivery;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub fn url() -> String {
    std::env::var("DELAY_ROUTER_TEST_URL").unwrap_or_else(|_| URL.into())
}

pub fn random_prefix() -> String {
    format!("drt-{:08x}", rand::random::<u32>())
}

/// A configuration for `prefix` with this ladder and extra settings. The
/// test broker's URL goes into the `[amqp]` table, the test's own when
/// `extra` opens one without a `url`; a `url` in `extra` wins (a test that
/// runs the router as another user derives it from [`url`] with [`url_as`]).
pub fn config_toml(prefix: &str, ladder: &[&str], extra: &str) -> String {
    let mut extra = extra.to_owned();
    let url_line = format!("url = \"{}\"", url());
    if extra.contains("[amqp]") {
        if !extra.lines().any(|l| l.trim_start().starts_with("url")) {
            extra = extra.replacen("[amqp]", &format!("[amqp]\n{url_line}"), 1);
        }
    } else {
        extra = format!("[amqp]\n{url_line}\n{extra}");
    }
    // `extra` may open its own [topology] table; the prefix goes into it,
    // and the type DELAY_ROUTER_TEST_QUEUE_TYPE names unless `extra` names
    // one: classic when unset; scripts/test runs the suite on 4.3 with
    // `auto`, the router's default (quorum queues for a new prefix). Tests
    // of one type's behaviour name it.
    let mut topology = format!("[topology]\nprefix = \"{prefix}\"");
    if !extra.contains("queue_type") {
        let t = std::env::var("DELAY_ROUTER_TEST_QUEUE_TYPE").unwrap_or_else(|_| "classic".into());
        topology.push_str(&format!("\nqueue_type = \"{t}\""));
    }
    let mut t = if extra.contains("[topology]") {
        let extra = extra.replacen("[topology]", &topology, 1);
        format!("{extra}\n")
    } else {
        format!("{topology}\n{extra}\n")
    };
    for rung in ladder {
        t.push_str(&format!("[[bucket]]\nttl = \"{rung}\"\n"));
    }
    t
}

/// The type RabbitMQ lists for this queue ("classic", "quorum"), `None`
/// when it does not exist.
pub fn queue_type_of(queue: &str) -> Option<String> {
    rabbitmqctl(&["list_queues", "-q", "name", "type"])
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .find(|(name, _)| *name == queue)
        .map(|(_, t)| t.trim().to_owned())
}

/// Closes every connection whose client properties name this prefix's router
/// (its consume and publish connections), as a broker fault would; returns how many.
pub fn close_router_connections(prefix: &str) -> usize {
    let listing = rabbitmqctl(&["list_connections", "-q", "pid", "client_properties"]);
    let pids: Vec<&str> = listing
        .lines()
        .filter(|l| {
            l.contains(&format!("delay-router consume {prefix}"))
                || l.contains(&format!("delay-router publish {prefix}"))
        })
        .filter_map(|l| l.split('\t').next())
        .collect();
    for pid in &pids {
        rabbitmqctl(&["close_connection", pid, "test: simulated broker fault"]);
    }
    pids.len()
}

/// The router binary Cargo built for the integration tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_delay-router");

/// The router binary the long-running tests spawn: `DELAY_ROUTER_TEST_BIN`
/// when set (scripts/test points the chaos test at the release build, the
/// one `scripts/run` runs), else [`BIN`].
pub fn router_bin() -> std::path::PathBuf {
    std::env::var_os("DELAY_ROUTER_TEST_BIN")
        .filter(|p| !p.is_empty())
        .map_or_else(|| BIN.into(), std::path::PathBuf::from)
}

/// Writes a config file for `prefix` to the temp directory.
pub fn write_config(prefix: &str, ladder: &[&str], extra: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{prefix}.toml"));
    std::fs::write(&path, config_toml(prefix, ladder, extra)).unwrap();
    path
}

/// A router process, killed when dropped: a failing test leaves none behind.
pub struct Spawned(pub std::process::Child);

impl Spawned {
    /// SIGKILL, and reap.
    pub fn kill_9(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `delay-router run --config path` as its own process, logs to `log`.
pub fn spawn_binary(path: &std::path::Path, log: &std::path::Path) -> Spawned {
    spawn_binary_logging(path, log, None)
}

/// The router binary with `RUST_LOG` set to `filter` (e.g. to log each
/// decision with its message id).
pub fn spawn_binary_logging(
    path: &std::path::Path,
    log: &std::path::Path,
    filter: Option<&str>,
) -> Spawned {
    let mut command = std::process::Command::new(router_bin());
    if let Some(filter) = filter {
        command.env("RUST_LOG", filter);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Spawned(
        command
            .args(["run", "--config"])
            .arg(path)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

pub struct Harness {
    pub prefix: String,
    pub config: Config,
    pub names: Names,
    pub conn: Connection,
    pub ch: Channel,
    /// What the in-process router counted (sessions, placements, parks).
    pub stats: Arc<Stats>,
    stop: Option<oneshot::Sender<()>>,
    router: Option<JoinHandle<Result<(), RouterError>>>,
    queues: Vec<String>,
    exchanges: Vec<String>,
    cleaned: bool,
}

impl Harness {
    /// A running router on a fresh prefix with this ladder.
    pub async fn start(ladder: &[&str]) -> Self {
        let mut h = Self::new(ladder, "").await;
        h.start_router().await;
        h
    }

    /// Everything but the router.
    pub async fn new(ladder: &[&str], extra: &str) -> Self {
        Self::with_prefix(&random_prefix(), ladder, extra).await
    }

    /// Everything but the router, with built-in settings (no key of
    /// `buckets.toml` sets them) changed by `tune`.
    pub async fn tuned(ladder: &[&str], extra: &str, tune: impl Fn(&mut Config)) -> Self {
        let mut h = Self::new(ladder, extra).await;
        tune(&mut h.config);
        h
    }

    /// Everything but the router, on a prefix the test chose.
    pub async fn with_prefix(prefix: &str, ladder: &[&str], extra: &str) -> Self {
        init_logs();
        let prefix = prefix.to_owned();
        let config = Config::from_toml(&config_toml(&prefix, ladder, extra)).expect("test config");
        let names = Names::new(&prefix);
        let conn = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .expect("test client connects to RabbitMQ on 127.0.0.1:5672");
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let mut queues = every_bucket(&config);
        queues.extend(names.own_queues().map(|q| q.to_string()));
        // An earlier version's due lane, which some tests declare.
        queues.push(names.due.to_string());
        let exchanges = names.own_exchanges().map(|e| e.to_string()).to_vec();
        Self {
            prefix,
            config,
            names,
            conn,
            ch,
            stats: Arc::default(),
            stop: None,
            router: None,
            queues,
            exchanges,
            cleaned: false,
        }
    }

    pub async fn start_router(&mut self) {
        let (tx, rx) = oneshot::channel();
        let config = self.config.clone();
        self.router = Some(tokio::spawn(router::run_with_stats(
            config,
            async move {
                let _ = rx.await;
            },
            self.stats.clone(),
        )));
        self.stop = Some(tx);
        self.wait_consumers().await;
    }

    /// Waits until a router (in-process or the binary) consumes all its queues.
    pub async fn wait_consumers(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let a = self.consumers(self.names.ingress.as_str()).await;
            let b = self.consumers(self.names.expired.as_str()).await;
            if a >= 1 && b >= 1 {
                return;
            }
            assert!(Instant::now() < deadline, "router did not start consuming");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the router, switches to a new ladder and settings on the same
    /// prefix, and starts it again.
    pub async fn restart_with(&mut self, ladder: &[&str], extra: &str) {
        self.restart_tuned(ladder, extra, |_| {}).await;
    }

    /// As [`Harness::restart_with`], with built-in settings changed by `tune`.
    pub async fn restart_tuned(
        &mut self,
        ladder: &[&str],
        extra: &str,
        tune: impl Fn(&mut Config),
    ) {
        self.stop_router().await.expect("router stopped cleanly");
        self.config =
            Config::from_toml(&config_toml(&self.prefix, ladder, extra)).expect("test config");
        tune(&mut self.config);
        self.queues.extend(every_bucket(&self.config));
        self.start_router().await;
    }

    /// Stops the router gracefully and returns its result.
    pub async fn stop_router(&mut self) -> Result<(), RouterError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.router.take() {
            Some(h) => tokio::time::timeout(Duration::from_secs(30), h)
                .await
                .expect("router stops within 30s")
                .expect("router task"),
            None => Ok(()),
        }
    }

    /// A durable queue owned by this test, named `<prefix>.<suffix>`.
    pub async fn queue(&mut self, suffix: &str) -> String {
        let name = format!("{}.{suffix}", self.prefix);
        self.ch
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        self.queues.push(name.clone());
        name
    }

    /// `<prefix>.work`: a work queue whose dead-letter exchange is the router's,
    /// the whole setup of zero-code retries.
    pub async fn work_queue(&mut self) -> String {
        let name = format!("{}.work", self.prefix);
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            s(self.names.router_exchange.as_str()),
        );
        self.ch
            .queue_declare(name.as_str().into(), QueueDeclareOptions::durable(), args)
            .await
            .unwrap();
        self.track_queue(&name);
        name
    }

    /// Deletes at cleanup every bucket a router of this prefix declares on
    /// `ladder`: for a test that runs a router on another ladder than the
    /// harness's (cascade adds rungs that depend on the rungs above).
    pub fn track_ladder(&mut self, ladder: &[&str]) {
        let config =
            Config::from_toml(&config_toml(&self.prefix, ladder, "")).expect("test config");
        self.queues.extend(every_bucket(&config));
    }

    /// Deletes `queue` with the rest at cleanup.
    pub fn track_queue(&mut self, queue: &str) {
        self.queues.push(queue.to_owned());
    }

    /// Deletes `exchange` with the rest at cleanup.
    pub fn track_exchange(&mut self, exchange: &str) {
        self.exchanges.push(exchange.to_owned());
    }

    /// A direct exchange owned by this test, `<prefix>.<suffix>`.
    pub async fn exchange(&mut self, suffix: &str) -> String {
        let name = format!("{}.{suffix}", self.prefix);
        self.ch
            .exchange_declare(
                name.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        self.exchanges.push(name.clone());
        name
    }

    pub async fn bind(&self, queue: &str, exchange: &str, key: &str) {
        self.ch
            .queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// Publishes to the router exchange and waits for the confirm.
    pub async fn publish(&self, routing_key: &str, props: BasicProperties, body: &[u8]) {
        let exchange = self.names.router_exchange.clone();
        self.publish_to(exchange, routing_key, props, body).await;
    }

    /// Publishes to the control exchange (cancel requests) and waits for the confirm.
    pub async fn publish_control(&self, props: BasicProperties, body: &[u8]) {
        let exchange = self.names.control.clone();
        self.publish_to(exchange, "", props, body).await;
    }

    async fn publish_to(
        &self,
        exchange: lapin::types::ShortString,
        routing_key: &str,
        props: BasicProperties,
        body: &[u8],
    ) {
        let c = self
            .ch
            .basic_publish(
                exchange,
                routing_key.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(c.is_ack());
    }

    /// Publishes to the router exchange without waiting: the confirm, to
    /// await later (a publisher that must keep a pace).
    pub async fn publish_unawaited(
        &self,
        routing_key: &str,
        props: BasicProperties,
        body: &[u8],
    ) -> lapin::PublisherConfirm {
        self.ch
            .basic_publish(
                self.names.router_exchange.clone(),
                routing_key.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .unwrap()
    }

    /// Receives `n` messages from `queue` (auto-ack), each with its arrival time,
    /// failing after `within`.
    pub async fn receive(
        &self,
        queue: &str,
        n: usize,
        within: Duration,
    ) -> Vec<(Instant, Delivery)> {
        let mut c = Consumer::open(&self.conn, queue, Acks::Auto).await;
        let got = c.take(n, within).await;
        c.close().await;
        got
    }

    /// Receives from `queue` until `n` distinct message-ids have arrived (at
    /// least once: duplicates are counted, not fatal); returns the duplicates.
    pub async fn receive_distinct(&self, queue: &str, n: usize, within: Duration) -> usize {
        let mut c = Consumer::open(&self.conn, queue, Acks::Auto).await;
        let mut seen = std::collections::BTreeSet::new();
        let got = c
            .until(within, |got| {
                if let Some((_, d)) = got.last() {
                    seen.insert(id(d));
                }
                seen.len() >= n
            })
            .await;
        c.close().await;
        got.len() - n
    }

    /// A queue's state by passive declare; `None` when it does not exist.
    pub async fn passive(&self, queue: &str) -> Option<lapin::Queue> {
        let ch = self.conn.create_channel().await.unwrap();
        let opts = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let r = ch
            .queue_declare(queue.into(), opts, FieldTable::default())
            .await;
        let _ = ch.close(200, "ok".into()).await;
        r.ok()
    }

    /// Ready messages in a queue, which must exist.
    pub async fn depth(&self, queue: &str) -> u32 {
        self.passive(queue)
            .await
            .expect("queue exists")
            .message_count()
    }

    /// Waits until `queue` holds at least `n` ready messages (30 s at most).
    pub async fn wait_depth(&self, queue: &str, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.depth(queue).await < n {
            assert!(Instant::now() < deadline, "{queue} never reached {n}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn exists(&self, queue: &str) -> bool {
        self.passive(queue).await.is_some()
    }

    /// Waits (up to `within`) for what the janitor does with retired,
    /// emptied buckets: a classic one is removed; a quorum one is left in
    /// place, for the operator (RabbitMQ cannot delete a quorum queue only
    /// if it is empty: README, Known limits). The prefix's queues are all
    /// of one type, read off its ingress.
    pub async fn wait_retired(&self, queues: &[&str], within: Duration) {
        let t = queue_type_of(self.names.ingress.as_str()).expect("the ingress exists");
        let deadline = Instant::now() + within;
        for q in queues {
            if t == "quorum" {
                while self.depth(q).await > 0 {
                    assert!(Instant::now() < deadline, "{q} was never emptied");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            } else {
                while self.exists(q).await {
                    assert!(Instant::now() < deadline, "{q} ({t}) was not removed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        if t == "quorum" {
            // Janitor's sweeps after they were emptied leave them.
            tokio::time::sleep(delay_router::router::janitor::SWEEP_EVERY * 2).await;
            for q in queues {
                assert!(self.exists(q).await, "{q} (quorum) was deleted");
            }
        }
    }

    pub async fn consumers(&self, queue: &str) -> u32 {
        self.passive(queue).await.map_or(0, |q| q.consumer_count())
    }

    /// A new client connection, after the broker closed the old one.
    pub async fn reconnect(&mut self) {
        self.conn = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .expect("test client reconnects to RabbitMQ");
        self.ch = self.conn.create_channel().await.unwrap();
        self.ch
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
    }

    /// Stops the router and deletes everything this test declared.
    pub async fn cleanup(mut self) {
        let _ = self.stop_router().await;
        delete_all(&self.conn, &self.queues, &self.exchanges).await;
        self.cleaned = true;
    }
}

async fn delete_all(conn: &Connection, queues: &[String], exchanges: &[String]) {
    for q in queues {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = ch.close(200, "ok".into()).await;
        }
    }
    for e in exchanges {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
                .await;
            let _ = ch.close(200, "ok".into()).await;
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        // A failed test: remove what it declared from a thread with its own runtime.
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let (queues, exchanges) = (self.queues.clone(), self.exchanges.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(conn) = Connection::connect(&url(), ConnectionProperties::default()).await
                {
                    delete_all(&conn, &queues, &exchanges).await;
                }
            });
        })
        .join();
    }
}

/// Every bucket queue any strategy could declare for this ladder.
fn every_bucket(config: &Config) -> Vec<String> {
    [
        PlacementStrategy::RoundUp,
        PlacementStrategy::Cascade,
        PlacementStrategy::Priority,
    ]
    .into_iter()
    .flat_map(|s| {
        // Shards: as many as configured, and a classic rung's default.
        let shards = config.bucket_shards.unwrap_or(1).max(2);
        Rules::new(&config.ladder, s, &config.prefix, "guest")
            .with_bucket_shards(Some(shards))
            .topology()
            .bucket_names()
    })
    .map(|q| q.to_string())
    .collect()
}

pub fn header<'a>(d: &'a Delivery, key: &str) -> Option<&'a AMQPValue> {
    d.properties.headers().as_ref()?.inner().get(key)
}

pub fn header_str(d: &Delivery, key: &str) -> Option<String> {
    match header(d, key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// Properties for a message delayed by `delay` to the default exchange, queue `queue`.
pub fn to_queue(queue: &str, delay: AMQPValue) -> BasicProperties {
    BasicProperties::default().with_headers(headers(&[
        ("x-requested-delay", delay),
        ("x-original-exchange", s("")),
        ("x-original-routing-key", s(queue)),
    ]))
}

/// The numeric message-id tests give their messages.
pub fn id(d: &Delivery) -> usize {
    d.properties
        .message_id()
        .as_ref()
        .expect("message-id")
        .as_str()
        .parse()
        .expect("numeric message-id")
}

/// The `rabbitmqctl` of the broker under test: DELAY_ROUTER_TEST_CTL, a
/// command and its first arguments (`scripts/rabbitmqctl4` for the 4.x
/// node), or `rabbitmqctl`.
pub fn ctl() -> std::process::Command {
    let spec = std::env::var("DELAY_ROUTER_TEST_CTL").unwrap_or_else(|_| "rabbitmqctl".into());
    let mut parts = spec.split_whitespace();
    let mut c = std::process::Command::new(parts.next().unwrap_or("rabbitmqctl"));
    c.args(parts);
    c
}

/// Runs `rabbitmqctl` on the broker under test, failing the test when it fails.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = ctl()
        .args(args)
        .output()
        .expect("rabbitmqctl of the broker under test (DELAY_ROUTER_TEST_CTL)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A setting of RabbitMQ's `rabbit` application, changed on every node of
/// the broker under test until dropped, then put back as it was. It is for
/// settings RabbitMQ reads only from its configuration file, such as how long
/// a quorum queue's dead-letter worker waits for a confirm before it sends
/// again; a process that reads it at start (a queue declared after the
/// change) sees the new value.
pub struct BrokerSetting {
    key: String,
    /// The value as `application:get_env/2` printed it: `{ok,V}` or `undefined`.
    was: String,
}

impl BrokerSetting {
    pub fn set(key: &str, value: &str) -> Self {
        let was = rabbitmqctl(&["eval", &format!("application:get_env(rabbit, {key}).")])
            .trim()
            .to_string();
        let out = rabbitmqctl(&["eval", &Self::on_every_node("set_env", key, Some(value))]);
        assert!(
            out.contains("{[ok") && out.contains("],[]}"),
            "setting {key} to {value} on every node: {out}"
        );
        Self {
            key: key.into(),
            was,
        }
    }

    fn on_every_node(call: &str, key: &str, value: Option<&str>) -> String {
        let args = value.map_or(format!("[rabbit, {key}]"), |v| {
            format!("[rabbit, {key}, {v}]")
        });
        format!("rpc:multicall(application, {call}, {args}).")
    }
}

impl Drop for BrokerSetting {
    fn drop(&mut self) {
        let back = match self
            .was
            .strip_prefix("{ok,")
            .and_then(|v| v.strip_suffix('}'))
        {
            Some(v) => Self::on_every_node("set_env", &self.key, Some(v)),
            None => Self::on_every_node("unset_env", &self.key, None),
        };
        // No panic here: a drop may run while a failed test unwinds.
        if let Err(e) = ctl().args(["eval", &back]).output() {
            eprintln!("putting {} back ({back}): {e}", self.key);
        }
    }
}

/// The test URL with other credentials.
pub fn url_as(user: &str, password: &str) -> String {
    let u = url();
    let rest = u.split_once('@').map_or(u.as_str(), |(_, r)| r);
    let scheme = u.split_once("://").map_or("amqp", |(s, _)| s);
    format!("{scheme}://{user}:{password}@{rest}")
}

/// A broker user made for one test, deleted when dropped.
pub struct BrokerUser {
    pub name: String,
    pub password: String,
}

impl BrokerUser {
    /// A user `<prefix>-<role>` with these configure / write / read regexes.
    pub fn create(prefix: &str, role: &str, perms: [&str; 3]) -> Self {
        let name = format!("{prefix}-{role}");
        let password = format!("pw-{:08x}", rand::random::<u32>());
        rabbitmqctl(&["add_user", &name, &password]);
        rabbitmqctl(&[
            "set_permissions",
            "-p",
            "/",
            &name,
            perms[0],
            perms[1],
            perms[2],
        ]);
        Self { name, password }
    }

    /// Limits what this user may publish to a topic exchange by routing key.
    pub fn topic_permissions(&self, exchange: &str, write: &str) {
        rabbitmqctl(&[
            "set_topic_permissions",
            "-p",
            "/",
            &self.name,
            exchange,
            write,
            ".*",
        ]);
    }

    /// `[amqp] url = ...` for a router running as this user.
    pub fn amqp_url(&self) -> String {
        url_as(&self.name, &self.password)
    }
}

impl Drop for BrokerUser {
    fn drop(&mut self) {
        let _ = ctl().args(["delete_user", &self.name]).output();
    }
}

/// Router logs on stderr when DELAY_ROUTER_TEST_LOG names a filter (e.g.
/// `delay_router=debug`); silent otherwise.
pub fn init_logs() {
    if let Ok(filter) = std::env::var("DELAY_ROUTER_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// A TCP port nothing listens on now (the OS's pick, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET url` with a real HTTP client: status and body, or `None` when
/// nothing answers.
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        let response = agent.get(&url).call().ok()?;
        let status = response.status().as_u16();
        let body = response.into_body().read_to_string().ok()?;
        Some((status, body))
    })
    .await
    .unwrap()
}

/// Scrapes `/metrics` on `port` and parses it with a Prometheus text parser.
pub async fn scrape(port: u16) -> prometheus_parse::Scrape {
    let (status, body) = http_get(&format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("the metrics endpoint answers");
    assert_eq!(status, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("parsable")
}

/// A sample's value: the one named `name` whose labels include `labels`.
pub fn sample(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => Some(*v),
            _ => None,
        })
}
