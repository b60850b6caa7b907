//! Presence: the routers of one prefix know of each other. Each announces
//! itself on the fanout exchange `<prefix>.presence` when its session starts,
//! every `check_interval`, and when asked (a probe), and listens on an
//! exclusive queue of its own. What it hears is kept in [`Peers`]: the janitor
//! never removes a bucket a live peer uses (two ladders on one prefix are
//! both kept while both run), and `status` lists every router with the node
//! each of its connections uses and the broker's version.

use crate::broker::{self, BrokerError, RPC_TIMEOUT, close_channel, timed};
use crate::core::contract::integer;
use crate::core::topology::Names;
use dashmap::DashMap;
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
pub use crate::tuning::LIVE_FOR_INTERVALS;

/// The header that marks a presence message: `heartbeat` or `probe`.
pub const KIND: &str = "x-delay-router-presence";

/// One router as it announces itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announcement {
    /// Random per process: tells two routers on one host apart.
    pub instance: String,
    pub host: String,
    pub pid: u32,
    /// When the process started, ms since the Unix epoch.
    pub since_ms: i64,
    /// The node each connection uses (URLs, password redacted).
    pub consume_node: String,
    pub publish_node: String,
    /// The broker as it describes itself (`RabbitMQ 4.3.6`).
    pub broker: String,
    pub strategy: String,
    pub queue_type: String,
    /// The bucket queues this router places into.
    pub buckets: Vec<String>,
    /// The router's own version.
    pub version: String,
}

fn text(h: &FieldTable, key: &str) -> Option<String> {
    match h.inner().get(key)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

impl Announcement {
    /// The headers that carry it, as a message of `kind`.
    pub fn to_headers(&self, kind: &str) -> FieldTable {
        let mut h = FieldTable::default();
        let mut put = |k: &str, v: &str| {
            h.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
        };
        put(KIND, kind);
        put("instance", &self.instance);
        put("host", &self.host);
        put("consume-node", &self.consume_node);
        put("publish-node", &self.publish_node);
        put("broker", &self.broker);
        put("strategy", &self.strategy);
        put("queue-type", &self.queue_type);
        put("version", &self.version);
        h.insert("pid".into(), AMQPValue::LongLongInt(i64::from(self.pid)));
        h.insert("since".into(), AMQPValue::LongLongInt(self.since_ms));
        let buckets = self
            .buckets
            .iter()
            .map(|b| AMQPValue::LongString(b.as_str().into()))
            .collect::<Vec<_>>();
        h.insert(
            "buckets".into(),
            AMQPValue::FieldArray(FieldArray::from(buckets)),
        );
        h
    }

    /// Reads one back; `None` for anything else.
    pub fn from_headers(h: &FieldTable) -> Option<Self> {
        let buckets = match h.inner().get("buckets") {
            Some(AMQPValue::FieldArray(a)) => a
                .as_slice()
                .iter()
                .filter_map(|v| match v {
                    AMQPValue::LongString(s) => {
                        Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
                    }
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Some(Self {
            instance: text(h, "instance")?,
            host: text(h, "host").unwrap_or_default(),
            pid: integer(h, "pid")
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0),
            since_ms: integer(h, "since").unwrap_or(0),
            consume_node: text(h, "consume-node").unwrap_or_default(),
            publish_node: text(h, "publish-node").unwrap_or_default(),
            broker: text(h, "broker").unwrap_or_default(),
            strategy: text(h, "strategy").unwrap_or_default(),
            queue_type: text(h, "queue-type").unwrap_or_default(),
            buckets,
            version: text(h, "version").unwrap_or_default(),
        })
    }
}

/// A new instance name: 8 random hex digits.
pub fn new_instance() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// This host's name (Linux), or `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// Now, ms since the Unix epoch.
pub fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The routers heard lately, shared by the sessions of one process.
#[derive(Debug, Default)]
pub struct Peers {
    heard: DashMap<String, (Announcement, Instant)>,
}

impl Peers {
    /// Records an announcement; returns whether this router is new.
    pub fn note(&self, a: Announcement) -> bool {
        self.heard
            .insert(a.instance.clone(), (a, Instant::now()))
            .is_none()
    }

    /// Every router heard within `within`, `except` one instance.
    pub fn live(&self, within: Duration, except: &str) -> Vec<Announcement> {
        self.heard.retain(|_, (_, at)| at.elapsed() < within * 2);
        let mut live: Vec<Announcement> = self
            .heard
            .iter()
            .filter(|e| e.key() != except && e.value().1.elapsed() < within)
            .map(|e| e.value().0.clone())
            .collect();
        live.sort_by(|a, b| a.instance.cmp(&b.instance));
        live
    }

    /// The buckets routers heard within `within` (other than `except`) use.
    pub fn buckets_in_use(&self, within: Duration, except: &str) -> BTreeSet<String> {
        self.live(within, except)
            .into_iter()
            .flat_map(|a| a.buckets)
            .collect()
    }
}

/// Announces `me` and listens for peers until `halt`, on `conn`. A fault
/// (the node lost the exclusive queue, a channel closed) is retried every
/// second: presence is what keeps concurrent routers from deleting each
/// other's buckets.
pub async fn run(
    conn: &Connection,
    names: &Names,
    me: &Announcement,
    peers: &Peers,
    every: Duration,
    halt: CancellationToken,
) {
    while !halt.is_cancelled() {
        if let Err(e) = listen_and_announce(conn, names, me, peers, every, &halt).await {
            warn!(error = %e, "presence interrupted; listening again in 1 s");
            tokio::select! {
                () = halt.cancelled() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn listen_and_announce(
    conn: &Connection,
    names: &Names,
    me: &Announcement,
    peers: &Peers,
    every: Duration,
    halt: &CancellationToken,
) -> Result<(), BrokerError> {
    let ch = broker::channel(conn).await?;
    // A queue of its own each time: an exclusive queue of a connection that
    // died with its node may linger under the old name.
    let queue = names.presence_queue(&format!("{}-{}", me.instance, new_instance()));
    let listening = listen(&ch, names, &queue).await;
    let mut consumer = match listening {
        Ok(c) => c,
        Err(e) => {
            close_channel(&ch, "presence").await;
            return Err(e);
        }
    };
    let announce = |kind: &'static str| publish(&ch, names, me.to_headers(kind), every);
    let result = async {
        announce("heartbeat").await?;
        // Ask who else runs, so the janitor knows before its first sweep.
        announce("probe").await?;
        loop {
            tokio::select! {
                () = halt.cancelled() => return Ok(()),
                () = tokio::time::sleep(every) => announce("heartbeat").await?,
                next = consumer.next() => {
                    let Some(Ok(d)) = next else {
                        return Err(BrokerError::other("presence", "the consumer ended"));
                    };
                    let Some(h) = d.properties.headers().as_ref() else { continue };
                    let Some(peer) = Announcement::from_headers(h) else { continue };
                    if peer.instance == me.instance {
                        continue;
                    }
                    if text(h, KIND).as_deref() == Some("probe") {
                        announce("heartbeat").await?;
                    }
                    // Probes from `status` carry no buckets: not a router.
                    if peer.buckets.is_empty() {
                        continue;
                    }
                    if peers.note(peer.clone()) {
                        debug!(peer = %peer.instance, host = %peer.host, "another router on this prefix");
                        if peer.buckets != me.buckets {
                            warn!(
                                peer = %peer.instance,
                                host = %peer.host,
                                its_buckets = %peer.buckets.join(","),
                                "another router on this prefix uses another ladder or strategy: \
                                 the buckets of both are kept while both run"
                            );
                        }
                    }
                }
            }
        }
    }
    .await;
    close_channel(&ch, "presence").await;
    result
}

async fn listen(
    ch: &Channel,
    names: &Names,
    queue: &ShortString,
) -> Result<lapin::Consumer, BrokerError> {
    let opts = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..Default::default()
    };
    timed(
        &format!("queue.declare {queue}"),
        RPC_TIMEOUT,
        ch.queue_declare(queue.clone(), opts, FieldTable::default()),
    )
    .await?;
    timed(
        &format!("queue.bind {queue}"),
        RPC_TIMEOUT,
        ch.queue_bind(
            queue.clone(),
            names.presence.clone(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await?;
    let opts = BasicConsumeOptions {
        no_ack: true,
        exclusive: true,
        ..Default::default()
    };
    timed(
        "basic.consume presence",
        RPC_TIMEOUT,
        ch.basic_consume(
            queue.clone(),
            "presence".into(),
            opts,
            FieldTable::default(),
        ),
    )
    .await
}

/// Publishes one presence message; it expires after [`LIVE_FOR_INTERVALS`]
/// intervals, so nobody hears a stale one.
async fn publish(
    ch: &Channel,
    names: &Names,
    headers: FieldTable,
    every: Duration,
) -> Result<(), BrokerError> {
    let ttl = (every * LIVE_FOR_INTERVALS).as_millis().max(1);
    let props = BasicProperties::default()
        .with_headers(headers)
        .with_expiration(ttl.to_string().into());
    timed(
        "basic.publish presence",
        RPC_TIMEOUT,
        ch.basic_publish(
            names.presence.clone(),
            "".into(),
            BasicPublishOptions::default(),
            b"",
            props,
        ),
    )
    .await
    .map(drop)
}

/// The routers that answer a probe within `wait` (for `status`), each once.
pub async fn probe(
    conn: &Connection,
    names: &Names,
    wait: Duration,
) -> Result<Vec<Announcement>, BrokerError> {
    let ch = broker::channel(conn).await?;
    let me = Announcement {
        instance: format!("status-{}", new_instance()),
        host: host_name(),
        pid: std::process::id(),
        since_ms: epoch_ms(),
        consume_node: String::new(),
        publish_node: String::new(),
        broker: String::new(),
        strategy: String::new(),
        queue_type: String::new(),
        buckets: Vec::new(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let queue = names.presence_queue(&me.instance);
    let heard = Peers::default();
    let result = async {
        let mut consumer = listen(&ch, names, &queue).await?;
        publish(&ch, names, me.to_headers("probe"), wait).await?;
        let deadline = tokio::time::Instant::now() + wait;
        while let Ok(Some(Ok(d))) = tokio::time::timeout_at(deadline, consumer.next()).await {
            if let Some(a) = d
                .properties
                .headers()
                .as_ref()
                .and_then(Announcement::from_headers)
                && !a.buckets.is_empty()
            {
                heard.note(a);
            }
        }
        Ok(heard.live(wait * 2, &me.instance))
    }
    .await;
    close_channel(&ch, "probed").await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(instance: &str, buckets: &[&str]) -> Announcement {
        Announcement {
            instance: instance.into(),
            host: "h".into(),
            pid: 7,
            since_ms: 1,
            consume_node: "amqp://u:***@n1:5672/%2f".into(),
            publish_node: "amqp://u:***@n1:5672/%2f".into(),
            broker: "RabbitMQ 4.3.6".into(),
            strategy: "cascade".into(),
            queue_type: "quorum".into(),
            buckets: buckets.iter().map(|b| b.to_string()).collect(),
            version: "0.1.0".into(),
        }
    }

    #[test]
    fn an_announcement_reads_back_from_its_headers() {
        let a = router("abc", &["p.bucket.1s", "p.bucket.2s"]);
        let h = a.to_headers("heartbeat");
        assert_eq!(Announcement::from_headers(&h), Some(a));
        assert_eq!(text(&h, KIND).as_deref(), Some("heartbeat"));
        assert_eq!(Announcement::from_headers(&FieldTable::default()), None);
    }

    #[test]
    fn live_peers_and_their_buckets_exclude_oneself() {
        let peers = Peers::default();
        assert!(peers.note(router("me", &["p.bucket.1s"])));
        assert!(peers.note(router("other", &["p.bucket.5s"])));
        assert!(!peers.note(router("other", &["p.bucket.5s"])));
        let live = peers.live(Duration::from_secs(10), "me");
        assert_eq!(live.len(), 1);
        assert_eq!(
            peers.buckets_in_use(Duration::from_secs(10), "me"),
            BTreeSet::from(["p.bucket.5s".to_string()])
        );
        assert!(peers.live(Duration::ZERO, "me").is_empty());
    }
}
