//! What a user has: the `delay-router` binary, a configuration file, a
//! RabbitMQ client (lapin) and `rabbitmqctl`. Nothing from the
//! `delay_router` crate: these tests see the router only from outside.
//!
//! The binary is `DELAY_ROUTER_PROMISE_BIN` when set (point it at any
//! build), else `DELAY_ROUTER_TEST_BIN` (scripts/test: the release build),
//! else the one Cargo built for the tests. The broker is
//! `DELAY_ROUTER_TEST_URL` (default 127.0.0.1:5672), its CLI
//! `DELAY_ROUTER_TEST_CTL` (default `rabbitmqctl`).

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn binary() -> PathBuf {
    ["DELAY_ROUTER_PROMISE_BIN", "DELAY_ROUTER_TEST_BIN"]
        .iter()
        .find_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()))
        .map_or_else(|| env!("CARGO_BIN_EXE_delay-router").into(), PathBuf::from)
}

pub fn url() -> String {
    std::env::var("DELAY_ROUTER_TEST_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The bucket type the suite runs this broker with (scripts/test: classic
/// on 3.10, the router's default on 4.3).
pub fn queue_type() -> String {
    std::env::var("DELAY_ROUTER_TEST_QUEUE_TYPE").unwrap_or_else(|_| "classic".into())
}

/// `rabbitmqctl` for the test broker, its output on success.
pub fn ctl(args: &[&str]) -> String {
    let program = std::env::var("DELAY_ROUTER_TEST_CTL").unwrap_or_else(|_| "rabbitmqctl".into());
    let out = Command::new(&program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on `port`: the status, or `None` when nothing answers.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let text = http_get(port, path).await?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// `GET path` on `port`: the whole response, or `None` when nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .ok()
        .flatten()
}

/// A header's value as text (strings) or a number.
pub fn header(d: &Delivery, key: &str) -> Option<AMQPValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(key).cloned())
}

pub fn header_text(d: &Delivery, key: &str) -> Option<String> {
    match header(d, key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        other => Some(format!("{other:?}")),
    }
}

pub fn text(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// Headers from pairs.
pub fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

/// A router process on a prefix of its own, killed when dropped; the
/// prefix's queues and exchanges are removed by [`Router::remove`].
pub struct Router {
    pub prefix: String,
    pub metrics_port: u16,
    pub config: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Router {
    /// The router on `ladder` with `extra` configuration (TOML tables after
    /// `[amqp]` and `[topology]`), started and ready.
    pub async fn start(ladder: &[&str], extra: &str) -> Self {
        let prefix = format!("drp-{:08x}", rand::random::<u32>());
        let r = Self::on(&prefix, ladder, extra);
        r.wait_ready(Duration::from_secs(60)).await;
        r
    }

    /// The router on `prefix`, started (not yet ready).
    pub fn on(prefix: &str, ladder: &[&str], extra: &str) -> Self {
        Self::on_url(prefix, &url(), ladder, extra)
    }

    /// The router on `prefix` connecting to `url` (another user), started.
    pub fn on_url(prefix: &str, url: &str, ladder: &[&str], extra: &str) -> Self {
        Self::on_url_typed(prefix, url, &queue_type(), ladder, extra)
    }

    /// The router on `prefix` with buckets of `queue_type`, started.
    pub fn on_typed(prefix: &str, queue_type: &str, ladder: &[&str], extra: &str) -> Self {
        Self::on_url_typed(prefix, &url(), queue_type, ladder, extra)
    }

    fn on_url_typed(
        prefix: &str,
        url: &str,
        queue_type: &str,
        ladder: &[&str],
        extra: &str,
    ) -> Self {
        let metrics_port = free_port();
        let dir = std::env::temp_dir();
        let config = dir.join(format!("{prefix}.toml"));
        let log = dir.join(format!("{prefix}.log"));
        let mut toml = format!(
            "[amqp]\nurl = \"{url}\"\n[topology]\nprefix = \"{prefix}\"\nqueue_type = \"{queue_type}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n{extra}\n",
        );
        for rung in ladder {
            toml.push_str(&format!("[[bucket]]\nttl = \"{rung}\"\n"));
        }
        std::fs::write(&config, toml).unwrap();
        let mut r = Self {
            prefix: prefix.to_owned(),
            metrics_port,
            config,
            log,
            child: None,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(&self.log).unwrap();
        let child = Command::new(binary())
            .args(["run", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary().display()));
        self.child = Some(child);
    }

    /// The router's own name for one of its exchanges or queues.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    pub async fn ready(&self) -> Option<u16> {
        http_status(self.metrics_port, "/readyz").await
    }

    pub async fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.ready().await != Some(200) {
            assert!(
                Instant::now() < deadline,
                "the router did not become ready within {within:?}; its log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for the process to leave (SIGKILL after 30 s).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill_9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same router again (after [`Router::stop`] or a kill).
    pub async fn restart(&mut self) {
        self.spawn();
        self.wait_ready(Duration::from_secs(60)).await;
    }

    /// Starts the same router again without waiting for it to be ready.
    pub fn restart_unready(&mut self) {
        self.spawn();
    }

    /// Stops the router and deletes every queue and exchange of its prefix.
    pub async fn remove(mut self, client: &Client) {
        self.stop();
        let prefix = format!("{}.", self.prefix);
        let mine = |listing: String| -> Vec<String> {
            listing
                .lines()
                .map(|l| l.trim().to_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        };
        for q in mine(ctl(&["list_queues", "-q", "--no-table-headers", "name"])) {
            client.delete_queue(&q).await;
        }
        for e in mine(ctl(&["list_exchanges", "-q", "--no-table-headers", "name"])) {
            client.delete_exchange(&e).await;
        }
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_file(&self.log);
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.kill_9();
    }
}

/// A user's connection: a channel in confirm mode, and the names it declared.
pub struct Client {
    pub conn: Connection,
    pub ch: Channel,
}

/// A message as it arrived, and when.
pub struct Arrival {
    pub at: Instant,
    pub at_ms: i64,
    pub delivery: Delivery,
}

impl Client {
    pub async fn connect() -> Self {
        Self::connect_to(&url()).await
    }

    /// A connection once the broker answers again (after a restart),
    /// trying for `within`.
    pub async fn connect_within(within: Duration) -> Self {
        let deadline = Instant::now() + within;
        loop {
            match Connection::connect(&url(), ConnectionProperties::default()).await {
                Ok(conn) => {
                    let ch = Self::channel_of(&conn).await;
                    return Self { conn, ch };
                }
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "RabbitMQ did not answer within {within:?}: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    pub async fn connect_to(url: &str) -> Self {
        let conn = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("the test client connects to RabbitMQ");
        let ch = Self::channel_of(&conn).await;
        Self { conn, ch }
    }

    async fn channel_of(conn: &Connection) -> Channel {
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        ch
    }

    /// A channel of its own (one a broker error may close).
    pub async fn channel(&self) -> Channel {
        Self::channel_of(&self.conn).await
    }

    pub async fn exchange(&self, name: &str, kind: ExchangeKind) {
        let opts = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        self.ch
            .exchange_declare(name.into(), kind, opts, FieldTable::default())
            .await
            .unwrap();
    }

    /// A durable queue bound to `exchange` with `key` (none for `""`).
    pub async fn queue(&self, name: &str, args: FieldTable, exchange: &str, key: &str) {
        let opts = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        self.ch
            .queue_declare(name.into(), opts, args)
            .await
            .unwrap();
        if !exchange.is_empty() {
            self.ch
                .queue_bind(
                    name.into(),
                    exchange.into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
    }

    /// Publishes and waits for the broker's confirm; `Err` with the
    /// broker's words when it refuses (the channel is then closed).
    pub async fn try_publish_on(
        ch: &Channel,
        exchange: &str,
        key: &str,
        props: BasicProperties,
        body: &[u8],
    ) -> Result<(), String> {
        let confirm = ch
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .map_err(|e| e.to_string())?;
        let c = tokio::time::timeout(Duration::from_secs(10), confirm)
            .await
            .map_err(|_| "no confirm within 10 s".to_owned())?
            .map_err(|e| e.to_string())?;
        if c.is_ack() {
            Ok(())
        } else {
            Err("nacked".into())
        }
    }

    pub async fn publish(&self, exchange: &str, key: &str, props: BasicProperties, body: &[u8]) {
        Self::try_publish_on(&self.ch, exchange, key, props, body)
            .await
            .unwrap_or_else(|e| panic!("publish to '{exchange}': {e}"));
    }

    /// Receives `n` messages from `queue` (acked), each with its arrival
    /// time; fewer when `within` runs out.
    pub async fn receive(&self, queue: &str, n: usize, within: Duration) -> Vec<Arrival> {
        let mut c = self.consume(queue).await;
        let got = c.take(n, within).await;
        c.close().await;
        got
    }

    /// A consumer of `queue`. A task of its own takes each delivery as it
    /// comes and notes when: arrival times do not depend on when the test
    /// reads them.
    pub async fn consume(&self, queue: &str) -> Consumer {
        let ch = self.conn.create_channel().await.unwrap();
        let tag = format!("promise-{:08x}", rand::random::<u32>());
        let mut inner = ch
            .basic_consume(
                queue.into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("consume {queue}: {e}"));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = inner.next().await {
                let arrival = Arrival {
                    at: Instant::now(),
                    at_ms: now_ms(),
                    delivery,
                };
                if tx.send(arrival).is_err() {
                    break;
                }
            }
        });
        Consumer { ch, arrivals: rx }
    }

    /// Ready messages in `queue`, `None` when it does not exist.
    pub async fn depth(&self, queue: &str) -> Option<u32> {
        self.passive(queue).await.map(|q| q.message_count())
    }

    /// Consumers of `queue` (0 when it does not exist).
    pub async fn consumers(&self, queue: &str) -> u32 {
        self.passive(queue).await.map_or(0, |q| q.consumer_count())
    }

    async fn passive(&self, queue: &str) -> Option<lapin::Queue> {
        let ch = self.conn.create_channel().await.ok()?;
        let opts = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = ch
            .queue_declare(queue.into(), opts, FieldTable::default())
            .await
            .ok();
        let _ = ch.close(200, "ok".into()).await;
        q
    }

    pub async fn delete_queue(&self, queue: &str) {
        let ch = self.conn.create_channel().await.unwrap();
        let _ = ch
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
        let _ = ch.close(200, "ok".into()).await;
    }

    pub async fn delete_exchange(&self, exchange: &str) {
        let ch = self.conn.create_channel().await.unwrap();
        let _ = ch
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await;
        let _ = ch.close(200, "ok".into()).await;
    }
}

/// A consumer that acks (or rejects) what it takes.
pub struct Consumer {
    ch: Channel,
    arrivals: tokio::sync::mpsc::UnboundedReceiver<Arrival>,
}

impl Consumer {
    /// The next delivery within `within`, acked.
    pub async fn next(&mut self, within: Duration) -> Option<Arrival> {
        let a = self.next_unacked(within).await?;
        a.delivery.ack(BasicAckOptions::default()).await.unwrap();
        Some(a)
    }

    /// The next delivery within `within`, not acked: the caller settles it.
    pub async fn next_unacked(&mut self, within: Duration) -> Option<Arrival> {
        tokio::time::timeout(within, self.arrivals.recv())
            .await
            .ok()
            .flatten()
    }

    /// Up to `n` deliveries within `within` in all, acked.
    pub async fn take(&mut self, n: usize, within: Duration) -> Vec<Arrival> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(a) => got.push(a),
                None => break,
            }
        }
        got
    }

    pub async fn close(self) {
        let _ = self.ch.close(200, "ok".into()).await;
    }
}

/// The `q`-quantile of sorted values.
pub fn quantile(sorted: &[i64], q: f64) -> i64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The message-id an arrival carries (empty when none).
pub fn message_id(a: &Arrival) -> String {
    a.delivery
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// A header's value as an integer, whatever AMQP integer type carries it.
pub fn integer(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        _ => None,
    }
}
