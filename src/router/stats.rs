//! What the router has done since it started: Prometheus metrics (served by
//! [`endpoint`](super::endpoint) at `/metrics`), logged once a minute, and
//! readable by embedders through [`Stats::snapshot`] (the precision
//! benchmark reads hops).
//!
//! Every metric is named `delay_router_…`; docs/operating.md lists them.

use crate::core::decision::Action;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// How often the counters are logged (when they changed).
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// Lateness histogram bounds, seconds: 1 ms to 1 h.
pub const LATENESS_BUCKETS: [f64; 20] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, 3600.0,
];
/// Publish-confirm latency bounds, seconds: 100 µs to 30 s.
pub const CONFIRM_BUCKETS: [f64; 15] = [
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0, 30.0,
];
/// Hops per delivered message.
pub const HOP_BUCKETS: [f64; 10] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0];

/// Sample names of the families with labels, which a scrape shows only
/// once they have a child (a retry of a policy, the first poll of a bucket).
const LABELLED: [&str; 7] = [
    "delay_router_retries_total",
    "delay_router_delayed_exchange_messages_total",
    "delay_router_delayed_exchange_waiting",
    "delay_router_bucket_messages",
    "delay_router_queue_messages",
    "delay_router_connected_node",
    "delay_router_messages_parked_total",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DelayedLabel {
    exchange: String,
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExchangeLabel {
    exchange: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabel {
    bucket: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
    broker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// The router's metrics; cheap to update from any task.
#[derive(Debug)]
pub struct Stats {
    registry: Registry,
    received: Counter,
    placed: Counter,
    delivered: Counter,
    held: Counter,
    parked: Family<ReasonLabel, Counter>,
    cancelled: Counter,
    cancel_requests: Counter,
    retries: Family<PolicyLabel, Counter>,
    delayed: Family<DelayedLabel, Counter>,
    /// Each plugin exchange's delivery exchange and its own name.
    delayed_names: std::sync::OnceLock<Vec<(String, String)>>,
    waiting: Family<ExchangeLabel, Gauge>,
    miscounts: Counter,
    sessions: Counter,
    reconnects: Counter,
    suspects: Counter,
    abandoned: Counter,
    refusals: Counter,
    lateness: Histogram,
    returned_late: Histogram,
    hops: Histogram,
    confirm: Histogram,
    in_flight: Gauge,
    holding: Gauge,
    publish_window: Gauge,
    tombstones: Gauge,
    ready: Gauge,
    buckets: Family<BucketLabel, Gauge>,
    queues: Family<QueueLabel, Gauge>,
    node: Family<NodeLabel, Gauge>,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

/// A copy of the main counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Messages taken from ingress.
    pub received: u64,
    /// Bucket placements (hops), every strategy.
    pub placed: u64,
    /// Messages delivered to their destination.
    pub delivered: u64,
    /// Of those, how many the router held for the last fraction first (cascade).
    pub held: u64,
    /// Messages parked, every reason.
    pub parked: u64,
    /// Messages removed at a bucket expiry because they were cancelled.
    pub cancelled: u64,
    /// Broker sessions opened: 1 while the router never had to reconnect.
    pub sessions: u64,
    /// Publishes in flight on a channel the broker closed, sent again one at a time.
    pub suspects: u64,
    /// Publishes the broker refused by closing the channel, each parked.
    pub refusals: u64,
}

fn histogram(bounds: &[f64]) -> Histogram {
    Histogram::new(bounds.iter().copied())
}

impl Stats {
    pub fn new() -> Self {
        let s = Self {
            registry: Registry::default(),
            received: Counter::default(),
            placed: Counter::default(),
            delivered: Counter::default(),
            held: Counter::default(),
            parked: Family::default(),
            cancelled: Counter::default(),
            cancel_requests: Counter::default(),
            retries: Family::default(),
            delayed: Family::default(),
            delayed_names: std::sync::OnceLock::new(),
            waiting: Family::default(),
            miscounts: Counter::default(),
            sessions: Counter::default(),
            reconnects: Counter::default(),
            suspects: Counter::default(),
            abandoned: Counter::default(),
            refusals: Counter::default(),
            lateness: histogram(&LATENESS_BUCKETS),
            returned_late: histogram(&LATENESS_BUCKETS),
            hops: histogram(&HOP_BUCKETS),
            confirm: histogram(&CONFIRM_BUCKETS),
            in_flight: Gauge::default(),
            holding: Gauge::default(),
            publish_window: Gauge::default(),
            tombstones: Gauge::default(),
            ready: Gauge::default(),
            buckets: Family::default(),
            queues: Family::default(),
            node: Family::default(),
        };
        // Every reason class from zero: a rate over it exists before the first park.
        for class in crate::core::reasons::CLASSES {
            drop(s.parked.get_or_create(&ReasonLabel { reason: class }));
        }
        s.register()
    }

    fn register(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "delay_router_messages_received",
            "Messages taken from ingress (published to the router exchange or rejected by a work queue)",
            self.received.clone(),
        );
        r.register(
            "delay_router_messages_placed",
            "Bucket placements (one per hop)",
            self.placed.clone(),
        );
        r.register(
            "delay_router_messages_delivered",
            "Messages delivered to their destination (confirmed by the broker)",
            self.delivered.clone(),
        );
        r.register(
            "delay_router_messages_held",
            "Delivered messages the router held in memory for the last fraction of their delay",
            self.held.clone(),
        );
        r.register(
            "delay_router_messages_parked",
            "Messages parked, by reason class",
            self.parked.clone(),
        );
        r.register(
            "delay_router_messages_cancelled",
            "Messages removed at a bucket expiry because their message-id was cancelled (parked with reason cancelled)",
            self.cancelled.clone(),
        );
        r.register(
            "delay_router_cancel_requests",
            "Cancel requests (x-cancel-message-id) this router took from ingress and wrote to the cancels stream",
            self.cancel_requests.clone(),
        );
        r.register(
            "delay_router_retries",
            "Rejected messages scheduled for another attempt, by retry policy",
            self.retries.clone(),
        );
        r.register(
            "delay_router_delayed_exchange_messages",
            "Messages of each delayed-message-exchange plugin exchange the router serves: \
             received (taken from publishers) and delivered (to its delivery exchange)",
            self.delayed.clone(),
        );
        r.register(
            "delay_router_delayed_exchange_waiting",
            "Messages published to each delayed-message-exchange plugin exchange that wait in the \
             buckets: the depth of its waiting queue, as last polled",
            self.waiting.clone(),
        );
        r.register(
            "delay_router_waiting_miscounts",
            "Changes to a plugin exchange's waiting count this router could not make (a token \
             not published, not taken, or none to take): how far the counts may be off",
            self.miscounts.clone(),
        );
        r.register(
            "delay_router_sessions",
            "Broker sessions opened (connected and topology declared)",
            self.sessions.clone(),
        );
        r.register(
            "delay_router_reconnects",
            "Broker sessions lost and reconnected",
            self.reconnects.clone(),
        );
        r.register(
            "delay_router_publishes_resent",
            "Publishes in flight on a channel the broker closed, sent again one at a time",
            self.suspects.clone(),
        );
        r.register(
            "delay_router_deliveries_abandoned",
            "Deliveries left unpublished when a broker session ended on a fault (the broker redelivers them)",
            self.abandoned.clone(),
        );
        r.register(
            "delay_router_publishes_refused",
            "Deliveries the broker refused by closing the channel (each parked)",
            self.refusals.clone(),
        );
        r.register_with_unit(
            "delay_router_delivery_lateness",
            "Delivery time minus due time of delivered messages",
            Unit::Seconds,
            self.lateness.clone(),
        );
        r.register_with_unit(
            "delay_router_return_lateness",
            "How late a message due for delivery came back from its last bucket: the router took it this long after its due time (the broker's share of delivery lateness)",
            Unit::Seconds,
            self.returned_late.clone(),
        );
        r.register(
            "delay_router_delivery_hops",
            "Bucket placements per delivered message",
            self.hops.clone(),
        );
        r.register_with_unit(
            "delay_router_publish_confirm",
            "Time from publish to broker confirm",
            Unit::Seconds,
            self.confirm.clone(),
        );
        r.register(
            "delay_router_in_flight_messages",
            "Source deliveries taken and not yet settled",
            self.in_flight.clone(),
        );
        r.register(
            "delay_router_publish_window_messages",
            "Publishes the pipelines let be unconfirmed at once now, sized from confirm latency",
            self.publish_window.clone(),
        );
        r.register(
            "delay_router_holding_messages",
            "Messages the router holds in memory now for the last fraction of their delay",
            self.holding.clone(),
        );
        r.register(
            "delay_router_tombstones",
            "Cancelled message-ids this router knows (from the cancels stream), not yet expired",
            self.tombstones.clone(),
        );
        r.register(
            "delay_router_ready",
            "1 while the router consumes ingress and expired, 0 otherwise",
            self.ready.clone(),
        );
        r.register(
            "delay_router_bucket_messages",
            "Messages waiting in each bucket queue, polled every check_interval",
            self.buckets.clone(),
        );
        r.register(
            "delay_router_queue_messages",
            "Messages in the router's ingress, expired and parked queues, polled every check_interval",
            self.queues.clone(),
        );
        r.register(
            "delay_router_connected_node",
            "1 for the broker node the router is connected to (label node, broker version)",
            self.node.clone(),
        );
        let build: Family<VersionLabel, Gauge> = Family::default();
        build
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register("delay_router_build_info", "The router's version", build);
        self
    }

    /// The metrics in the text exposition format (OpenMetrics).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Starts the retry counter of each policy at zero, so a rate over it
    /// exists before the first retry.
    pub fn expect_policies<'a>(&self, policies: impl IntoIterator<Item = &'a str>) {
        for policy in policies {
            drop(self.retries.get_or_create(&PolicyLabel {
                policy: policy.to_owned(),
            }));
        }
    }

    /// Starts the counters of each plugin exchange (`name`, delivery
    /// exchange) at zero, and learns which deliveries are theirs. The first
    /// call counts; a configuration does not change while the process runs.
    pub fn expect_delayed_exchanges<'a>(
        &self,
        exchanges: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        let names: Vec<(String, String)> = exchanges
            .into_iter()
            .map(|(name, to)| (to.to_owned(), name.to_owned()))
            .collect();
        for (_, name) in &names {
            for event in ["received", "delivered"] {
                drop(self.delayed.get_or_create(&DelayedLabel {
                    exchange: name.clone(),
                    event,
                }));
            }
        }
        let _ = self.delayed_names.set(names);
    }

    /// Counts a message taken from ingress that was published to `exchange`
    /// (one of the plugin's exchanges, or any other, not counted).
    pub fn record_received_from(&self, exchange: &str) {
        let Some(names) = self.delayed_names.get() else {
            return;
        };
        if names.iter().any(|(_, name)| name == exchange) {
            self.delayed
                .get_or_create(&DelayedLabel {
                    exchange: exchange.to_owned(),
                    event: "received",
                })
                .inc();
        }
    }

    /// Every sample name a scrape can show (a counter's `_total`, a
    /// histogram's `_bucket`, `_sum` and `_count`), whether or not it has
    /// a sample yet: what dashboards and alert rules may query.
    pub fn exported_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for line in self.encode().lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => names.push(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.push(format!("{name}{suffix}"));
                    }
                }
                _ => names.push(name.to_owned()),
            }
        }
        // Label families appear once they have a child.
        for name in LABELLED {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        names
    }

    /// Counts one confirmed publish; `now_ms` is when the broker had it: its
    /// confirm's arrival, or the publish when the confirm was read lazily.
    pub fn record(&self, action: &Action, now_ms: i64) {
        match action {
            Action::Wait { .. } => {
                self.placed.inc();
            }
            Action::Deliver {
                after,
                due_ms,
                hops,
                destination,
                ..
            } => {
                if !after.is_zero() {
                    self.held.inc();
                }
                self.delivered.inc();
                if let Some(names) = self.delayed_names.get()
                    && let Some((_, name)) = names
                        .iter()
                        .find(|(to, _)| destination.exchange.as_str() == to)
                {
                    self.delayed
                        .get_or_create(&DelayedLabel {
                            exchange: name.clone(),
                            event: "delivered",
                        })
                        .inc();
                }
                let late_ms = now_ms.saturating_sub(*due_ms).max(0);
                self.lateness.observe(late_ms as f64 / 1000.0);
                self.hops.observe(f64::from(*hops));
            }
            Action::Park { reason, .. } => {
                let class = reason.class();
                self.parked
                    .get_or_create(&ReasonLabel { reason: class })
                    .inc();
                if class == crate::core::reasons::CANCELLED {
                    self.cancelled.inc();
                }
            }
            Action::Cancel { .. } => {
                self.cancel_requests.inc();
            }
        }
    }

    /// Counts a message taken from ingress.
    pub fn record_received(&self) {
        self.received.inc();
    }

    /// A message due for delivery taken from a bucket `late_ms` after its due
    /// time (0 when it came back in time, to be held for the rest).
    pub fn record_return(&self, late_ms: i64) {
        self.returned_late.observe(late_ms.max(0) as f64 / 1000.0);
    }

    /// Counts a retry scheduled by `policy`.
    pub fn record_retry(&self, policy: &str) {
        self.retries
            .get_or_create(&PolicyLabel {
                policy: policy.to_owned(),
            })
            .inc();
    }

    /// Counts a session that connected and declared its topology.
    pub fn record_session(&self) {
        self.sessions.inc();
    }

    /// Counts a lost session the supervisor reconnects after.
    pub fn record_reconnect(&self) {
        self.reconnects.inc();
    }

    /// Counts a change to a waiting count that could not be made.
    pub fn record_miscount(&self) {
        self.miscounts.inc();
    }

    /// A plugin exchange's count of waiting messages, as last polled.
    pub fn set_waiting(&self, exchange: &str, messages: u32) {
        self.waiting
            .get_or_create(&ExchangeLabel {
                exchange: exchange.to_owned(),
            })
            .set(i64::from(messages));
    }

    /// Counts a publish caught on a channel the broker closed.
    pub fn record_suspect(&self) {
        self.suspects.inc();
    }

    /// Counts a delivery left unpublished because its session ended on a fault.
    pub fn record_abandoned(&self) {
        self.abandoned.inc();
    }

    /// Counts a publish the broker refused by closing the channel.
    pub fn record_refusal(&self) {
        self.refusals.inc();
    }

    /// Records how long the broker took to confirm a publish.
    pub fn record_confirm(&self, took: Duration) {
        self.confirm.observe(took.as_secs_f64());
    }

    /// A source delivery taken (+1) or settled (-1).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    /// A pipeline's limit on unconfirmed publishes changed by `delta`.
    pub fn publish_window(&self, delta: i64) {
        self.publish_window.inc_by(delta);
    }

    /// A message the router starts (+1) or stops (-1) holding in memory.
    pub fn holding(&self, delta: i64) {
        self.holding.inc_by(delta);
    }

    /// How many tombstones the router knows.
    pub fn set_tombstones(&self, n: usize) {
        self.tombstones.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Whether every consumer of the router consumes.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// A bucket's depth, as last polled.
    pub fn set_bucket_depth(&self, bucket: &str, messages: u32) {
        self.buckets
            .get_or_create(&BucketLabel {
                bucket: bucket.to_owned(),
            })
            .set(i64::from(messages));
    }

    /// One of the router's own queues' depth, as last polled.
    pub fn set_queue_depth(&self, queue: &str, role: &'static str, messages: u32) {
        self.queues
            .get_or_create(&QueueLabel {
                queue: queue.to_owned(),
                role,
            })
            .set(i64::from(messages));
    }

    /// The node the router is connected to now (`None`: none).
    pub fn set_node(&self, node: Option<(&str, &str)>) {
        self.node.clear();
        if let Some((node, broker)) = node {
            self.node
                .get_or_create(&NodeLabel {
                    node: node.to_owned(),
                    broker: broker.to_owned(),
                })
                .set(1);
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        let parked = {
            // Families are read through their encoding; sum the classes.
            let mut total = 0;
            for class in crate::core::reasons::CLASSES {
                if let Some(c) = self.parked.get(&ReasonLabel { reason: class }) {
                    total += c.get();
                }
            }
            total
        };
        Snapshot {
            received: self.received.get(),
            placed: self.placed.get(),
            delivered: self.delivered.get(),
            held: self.held.get(),
            parked,
            cancelled: self.cancelled.get(),
            sessions: self.sessions.get(),
            suspects: self.suspects.get(),
            refusals: self.refusals.get(),
        }
    }
}

/// Logs the counters every [`LOG_EVERY`] when they changed, until `stop`.
pub async fn log_every(stats: Arc<Stats>, stop: CancellationToken) {
    let mut last = Snapshot::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(LOG_EVERY) => {}
        }
        let now = stats.snapshot();
        if now != last {
            info!(
                received = now.received,
                placed = now.placed,
                delivered = now.delivered,
                held = now.held,
                parked = now.parked,
                cancelled = now.cancelled,
                refused = now.refusals,
                resent = now.suspects,
                sessions = now.sessions,
                "figures since start"
            );
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_exported_with_its_exact_name() {
        let names = Stats::new().exported_names();
        for name in [
            "delay_router_messages_received_total",
            "delay_router_messages_delivered_total",
            "delay_router_messages_parked_total",
            "delay_router_delivery_lateness_seconds_bucket",
            "delay_router_delivery_lateness_seconds_count",
            "delay_router_return_lateness_seconds_count",
            "delay_router_bucket_messages",
            "delay_router_ready",
            "delay_router_build_info",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
    }
}
