//! The router service: a supervisor that keeps a session alive, and per source
//! queue a pipeline that consumes, decides, publishes with confirms and acks
//! the source only once the publish that replaces it is confirmed.

use crate::broker::{self, BrokerError, CONFIRM_TIMEOUT, RPC_TIMEOUT, timed};
use crate::config::Config;
use crate::contract::Destination;
use crate::decision::{Action, Plan};
use crate::drift;
use crate::envelope;
use crate::identity;
use crate::janitor;
use crate::park::{ParkReason, exchange_label};
use crate::placement::Strategy;
use crate::settle;
use crate::stats::{self, Stats};
use crate::topology::Names;
use crate::window::Window;
use dashmap::DashMap;
use futures_util::StreamExt;
use lapin::Confirmation;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, info_span, warn};

/// How long a destination exchange known to exist is trusted before probing again.
pub const EXCHANGE_CACHE_TTL: Duration = Duration::from_secs(10);
/// How long shutdown waits for in-flight publishes to be confirmed and acked.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);
/// First and longest wait between reconnect attempts.
pub const RECONNECT_MIN: Duration = Duration::from_millis(200);
pub const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A session that lived this long resets the reconnect backoff.
pub const HEALTHY_SESSION: Duration = Duration::from_secs(30);

/// Said at start when the priority strategy is configured: the router cannot
/// read the broker's version (lapin does not expose it), so it says what each
/// version gives.
pub const PRIORITY_WARNING: &str = "strategy \"priority\": on RabbitMQ before 4.3 a priority queue \
expires only at the head of its highest non-empty priority level, so a message can wait past its own \
TTL behind longer ones of higher priority (measured on 3.10: up to the bucket's TTL); quorum queues \
refuse x-max-priority before 4.0. Use \"cascade\" for exact delays (see README, Precision)";

/// Why the router stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The topology conflicts with what exists: retrying cannot help.
    #[error(transparent)]
    Topology(BrokerError),
}

/// Which queue a pipeline consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Ingress,
    Expired,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Expired => "expired",
        }
    }
}

/// Milliseconds since the Unix epoch by the router's clock, rounded down: a
/// deadline compared with it is never reached early.
pub fn now_ms() -> i64 {
    epoch_ms(false)
}

/// Milliseconds since the Unix epoch, rounded up: deadlines are stamped from it,
/// so a message received at 1000.9 ms with a 5 ms delay is due at 1006, not 1005.
pub fn stamp_ms() -> i64 {
    epoch_ms(true)
}

fn epoch_ms(up: bool) -> i64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let ms = if up {
        nanos.div_ceil(1_000_000)
    } else {
        nanos / 1_000_000
    };
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Runs the router until `shutdown` completes, reconnecting after broker faults.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RouterError> {
    run_with_stats(config, shutdown, Arc::default()).await
}

/// As [`run`], counting what it does in `stats`.
pub async fn run_with_stats(
    config: Config,
    shutdown: impl Future<Output = ()>,
    stats: Arc<Stats>,
) -> Result<(), RouterError> {
    let plan = Arc::new(Plan::from_config(&config));
    if plan.strategy == Strategy::Priority {
        warn!("{PRIORITY_WARNING}");
    }
    let stop = CancellationToken::new();
    let logger = tokio::spawn(log_stats(stats.clone(), stop.clone()));
    let supervisor = supervise(config, plan, stats, stop.clone());
    tokio::pin!(supervisor);
    tokio::select! {
        result = &mut supervisor => return result,
        () = shutdown => info!("shutdown requested: stopping consumers, settling in-flight messages"),
    }
    stop.cancel();
    let result = supervisor.await;
    let _ = logger.await;
    result
}

async fn log_stats(stats: Arc<Stats>, stop: CancellationToken) {
    let mut last = stats::Snapshot::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(stats::LOG_EVERY) => {}
        }
        let now = stats.snapshot();
        if now != last {
            info!(
                placed = now.placed,
                delivered = now.delivered,
                held = now.held,
                parked = now.parked,
                "figures since start"
            );
            last = now;
        }
    }
}

async fn supervise(
    config: Config,
    plan: Arc<Plan>,
    stats: Arc<Stats>,
    stop: CancellationToken,
) -> Result<(), RouterError> {
    let mut backoff = RECONNECT_MIN;
    loop {
        let started = Instant::now();
        match session(&config, &plan, &stats, &stop).await {
            Ok(()) => return Ok(()),
            Err(SessionError::Fatal(e)) => return Err(RouterError::Topology(e)),
            Err(SessionError::Transient(message)) => {
                if started.elapsed() >= HEALTHY_SESSION {
                    backoff = RECONNECT_MIN;
                }
                let wait = jittered(backoff);
                warn!(error = %message, retry_in_ms = wait.as_millis() as u64, "broker session lost; reconnecting");
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(wait) => {}
                }
                backoff = (backoff * 2).min(RECONNECT_MAX);
            }
        }
    }
}

/// Half to full of the backoff, so many routers don't reconnect in step.
fn jittered(d: Duration) -> Duration {
    let f = 0.5 + rand::random::<f64>() / 2.0;
    d.mul_f64(f)
}

enum SessionError {
    Fatal(BrokerError),
    Transient(String),
}

impl From<BrokerError> for SessionError {
    fn from(e: BrokerError) -> Self {
        match e {
            BrokerError::Conflict { .. } => Self::Fatal(e),
            other => Self::Transient(other.to_string()),
        }
    }
}

/// A fault raised by any task of a session; the first one wins.
#[derive(Clone, Default)]
struct Fault {
    token: CancellationToken,
    first: Arc<Mutex<Option<String>>>,
}

impl Fault {
    fn raise(&self, message: String) {
        if let Ok(mut first) = self.first.lock()
            && first.is_none()
        {
            *first = Some(message);
        }
        self.token.cancel();
    }
    fn message(&self) -> String {
        self.first
            .lock()
            .ok()
            .and_then(|f| f.clone())
            .unwrap_or_else(|| "unknown fault".into())
    }
}

/// One session's life: connect, declare, run both pipelines, settle on stop.
/// Consuming and publishing use separate connections, as RabbitMQ's shovel
/// does: the broker then parses each on its own process and core.
async fn session(
    config: &Config,
    plan: &Arc<Plan>,
    stats: &Arc<Stats>,
    stop: &CancellationToken,
) -> Result<(), SessionError> {
    let conn = broker::connect(
        &config.url,
        config.ca_file.as_ref(),
        &format!("delay-router consume {}", config.prefix),
    )
    .await?;
    let publish_conn = match broker::connect(
        &config.url,
        config.ca_file.as_ref(),
        &format!("delay-router publish {}", config.prefix),
    )
    .await
    {
        Ok(c) => Arc::new(c),
        Err(e) => {
            let _ = timed(
                "connection.close",
                RPC_TIMEOUT,
                conn.close(200, "bye".into()),
            )
            .await;
            return Err(e.into());
        }
    };
    info!(url = %config.url, prefix = %plan.names.prefix, strategy = %plan.strategy, "connected");
    let buckets = plan.bucket_queues();
    let current: Vec<ShortString> = buckets.iter().map(|(q, _)| q.clone()).collect();
    // A prefix that ran before has its state queue: anything else missing
    // was deleted since (at a first start everything is missing).
    if let Ok(Some(_)) = broker::depth(&conn, &plan.names.state).await
        && let Ok(gone) = drift::missing(&conn, &plan.names, &buckets).await
        && !gone.is_empty()
    {
        error!(missing = %gone.join(", "), "topology drift found at start: declaring the missing exchanges and queues again");
    }
    let declared = match broker::declare(&conn, &plan.names, plan.queue_type, &buckets).await {
        Ok(()) => janitor::record(&conn, &plan.names, &current).await,
        Err(e) => Err(e),
    };
    let stale = match declared {
        Ok(stale) => stale,
        Err(e) => {
            close_both(&conn, &publish_conn).await;
            return Err(e.into());
        }
    };
    info!(buckets = plan.ladder.rungs().len(), "topology declared");
    let conn = Arc::new(conn);
    let fault = Fault::default();
    let exchanges = Arc::new(DashMap::new());
    let mut pipelines = Vec::new();
    // Drains and removes buckets no longer in use while the session lives.
    let halt = CancellationToken::new();
    let janitor = {
        let (conn, plan, halt) = (conn.clone(), plan.clone(), halt.clone());
        tokio::spawn(
            async move {
                if let Err(e) = janitor::sweep(&conn, &plan.names, &current, stale, halt).await {
                    warn!(error = %e, "stale bucket sweep stopped; it resumes on the next start");
                }
            }
            .instrument(info_span!("janitor")),
        )
    };
    let watcher = {
        let (conn, plan, halt) = (conn.clone(), plan.clone(), halt.clone());
        let every = config.check_interval;
        tokio::spawn(
            async move {
                drift::watch(&conn, &plan.names, plan.queue_type, &buckets, every, halt).await;
            }
            .instrument(info_span!("topology")),
        )
    };
    for source in [Source::Ingress, Source::Expired] {
        let p = Pipeline {
            source,
            plan: plan.clone(),
            conn: conn.clone(),
            publish_conn: publish_conn.clone(),
            exchanges: exchanges.clone(),
            fault: fault.clone(),
            stats: stats.clone(),
            prefetch: config.prefetch,
            inflight_bytes: config.inflight_bytes,
        };
        let stop = stop.clone();
        pipelines.push(tokio::spawn(
            async move { p.run(stop).await }
                .instrument(info_span!("pipeline", source = source.name())),
        ));
    }
    let mut result = Ok(());
    for handle in pipelines {
        match handle.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                fault.raise(e.clone());
                if result.is_ok() {
                    result = Err(SessionError::Transient(e));
                }
            }
            Err(join) => {
                fault.raise(join.to_string());
                result = Err(SessionError::Transient(format!(
                    "pipeline task failed: {join}"
                )));
            }
        }
    }
    halt.cancel();
    let _ = tokio::time::timeout(RPC_TIMEOUT, janitor).await;
    let _ = tokio::time::timeout(RPC_TIMEOUT, watcher).await;
    if result.is_ok() && fault.token.is_cancelled() {
        result = Err(SessionError::Transient(fault.message()));
    }
    close_both(&conn, &publish_conn).await;
    if result.is_ok() {
        info!("stopped cleanly");
    }
    result
}

async fn close_both(a: &Connection, b: &Connection) {
    for conn in [a, b] {
        let _ = timed(
            "connection.close",
            RPC_TIMEOUT,
            conn.close(200, "delay-router stopping".into()),
        )
        .await;
    }
}

struct Pipeline {
    stats: Arc<Stats>,
    source: Source,
    plan: Arc<Plan>,
    conn: Arc<Connection>,
    publish_conn: Arc<Connection>,
    exchanges: Arc<DashMap<ShortString, Instant>>,
    fault: Fault,
    prefetch: u16,
    inflight_bytes: u64,
}

/// How a source delivery ends once its replacement publish is settled.
struct Pending {
    tag: u64,
    data: Vec<u8>,
    action: Action,
    frame_max: u32,
}

impl Pipeline {
    async fn run(self, stop: CancellationToken) -> Result<(), String> {
        let queue = match self.source {
            Source::Ingress => self.plan.names.ingress.clone(),
            Source::Expired => self.plan.names.expired.clone(),
        };
        let consume_ch = broker::channel(&self.conn)
            .await
            .map_err(|e| e.to_string())?;
        timed(
            "basic.qos",
            RPC_TIMEOUT,
            consume_ch.basic_qos(self.prefetch, BasicQosOptions::default()),
        )
        .await
        .map_err(|e| e.to_string())?;
        let publish_ch = broker::channel(&self.publish_conn)
            .await
            .map_err(|e| e.to_string())?;
        timed(
            "confirm.select",
            RPC_TIMEOUT,
            publish_ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .map_err(|e| e.to_string())?;
        let tag: ShortString = format!("delay-router-{}", self.source.name()).into();
        let mut consumer = timed(
            &format!("basic.consume {queue}"),
            RPC_TIMEOUT,
            consume_ch.basic_consume(
                queue.clone(),
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
        info!(queue = %queue, prefetch = self.prefetch, "consuming");
        let tracker = TaskTracker::new();
        let mut window = Window::new(self.prefetch, self.inflight_bytes);
        let (settler, settled) = tokio::sync::mpsc::unbounded_channel();
        let acks = {
            let (ch, fault) = (consume_ch.clone(), self.fault.clone());
            tokio::spawn(
                async move {
                    if let Err(e) = settle::run(ch, settled).await {
                        fault.raise(format!("acking source deliveries failed: {e}"));
                    }
                }
                .in_current_span(),
            )
        };
        let outcome = loop {
            tokio::select! {
                () = stop.cancelled() => break Ok(()),
                () = self.fault.token.cancelled() => break Err(self.fault.message()),
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        if let Some(count) = window.observe(delivery.data.len()) {
                            info!(prefetch = count, mean_bytes = delivery.data.len(), "resizing the prefetch window to the byte budget");
                            if let Err(e) = timed("basic.qos", RPC_TIMEOUT, consume_ch.basic_qos(count, BasicQosOptions::default())).await {
                                break Err(e.to_string());
                            }
                        }
                        if let Err(e) = self.handle(delivery, &publish_ch, &tracker, &settler).await {
                            self.fault.raise(e.clone());
                            break Err(e);
                        }
                    }
                    Some(Err(e)) => break Err(format!("consumer of {queue} failed: {e}")),
                    None => break Err(format!("consumer of {queue} was cancelled by the broker")),
                }
            }
        };
        if outcome.is_ok() {
            let _ = timed(
                "basic.cancel",
                RPC_TIMEOUT,
                consume_ch.basic_cancel(tag, BasicCancelOptions::default()),
            )
            .await;
        }
        tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
            .await
            .is_err()
        {
            warn!("in-flight messages not settled in time; the broker will redeliver them");
        }
        drop(settler);
        if tokio::time::timeout(RPC_TIMEOUT, acks).await.is_err() {
            warn!("final acks not sent in time; the broker will redeliver those messages");
        }
        // Unsettled deliveries return to their queue when the channel closes.
        let _ = timed(
            "channel.close",
            RPC_TIMEOUT,
            publish_ch.close(200, "bye".into()),
        )
        .await;
        let _ = timed(
            "channel.close",
            RPC_TIMEOUT,
            consume_ch.close(200, "bye".into()),
        )
        .await;
        outcome
    }

    async fn handle(
        &self,
        delivery: lapin::message::Delivery,
        publish_ch: &Channel,
        tracker: &TaskTracker,
        settler: &settle::Settler,
    ) -> Result<(), String> {
        let received = self.plan.received(&delivery.properties);
        let props = received.as_ref().unwrap_or(&delivery.properties);
        // The sender's properties as they arrived: what a parked copy keeps.
        let (mut action, stamped) = match self.source {
            Source::Ingress => {
                let sender = identity::ensure_message_id(
                    props,
                    delivery.exchange.as_str(),
                    delivery.routing_key.as_str(),
                    &delivery.data,
                );
                let action = self.plan.on_ingress(
                    &delivery.routing_key,
                    &sender,
                    stamp_ms(),
                    rand::random::<f64>(),
                );
                (action, Some(sender))
            }
            Source::Expired => (self.plan.on_expired(props, now_ms()), None),
        };
        let sender = stamped.as_ref().unwrap_or(props);
        let now = now_ms();
        if let Action::Deliver {
            destination,
            properties,
            ..
        } = &action
            && !self.exchange_exists(&destination.exchange).await?
        {
            let reason = ParkReason::ExchangeNotFound(destination.exchange.to_string());
            action = self
                .plan
                .on_delivery_failed(properties, destination, reason, now);
        }
        let action = self.plan.within_frame(
            action,
            || envelope::sender_properties(sender),
            now,
            self.frame_max(),
        );
        log_action(&action);
        let _ = settler.send(settle::Event::Delivered(delivery.delivery_tag));
        let pending = Pending {
            tag: delivery.delivery_tag,
            data: delivery.data,
            action,
            frame_max: self.frame_max(),
        };
        // Publish, confirm and ack run concurrently (bounded by the prefetch
        // window): awaiting each publish here would cost a round trip to
        // lapin's IO thread per message.
        let (plan, ch, fault) = (self.plan.clone(), publish_ch.clone(), self.fault.clone());
        let stats = self.stats.clone();
        let settler = settler.clone();
        tracker.spawn(
            async move {
                if let Err(e) = forward(&plan, &ch, pending, &settler, &stats).await {
                    error!(error = %e, "publish not confirmed; the source message stays unacked and will be redelivered");
                    fault.raise(e);
                }
            }
            .in_current_span(),
        );
        Ok(())
    }

    /// The publish connection's negotiated frame size.
    fn frame_max(&self) -> u32 {
        self.publish_conn.configuration().frame_max()
    }

    async fn exchange_exists(&self, exchange: &ShortString) -> Result<bool, String> {
        if exchange.as_str().is_empty() {
            return Ok(true);
        }
        if let Some(seen) = self.exchanges.get(exchange)
            && seen.elapsed() < EXCHANGE_CACHE_TTL
        {
            return Ok(true);
        }
        let exists = broker::exchange_exists(&self.publish_conn, exchange)
            .await
            .map_err(|e| e.to_string())?;
        if exists {
            self.exchanges.insert(exchange.clone(), Instant::now());
        } else {
            self.exchanges.remove(exchange);
        }
        Ok(exists)
    }
}

fn log_action(action: &Action) {
    match action {
        Action::Wait { queue, ttl, .. } => {
            debug!(bucket = %queue, ttl_ms = ttl.as_millis() as u64, "placed")
        }
        Action::Deliver { destination, .. } => debug!(
            exchange = exchange_label(destination.exchange.as_str()),
            routing_key = %destination.routing_key,
            "delivering"
        ),
        Action::Park { reason, .. } => warn!(reason = %reason, "parking message"),
    }
}

type Confirm = lapin::PublisherConfirm;

/// Publishes an action's message, `mandatory` so an unroutable one comes back.
async fn publish(
    ch: &Channel,
    names: &Names,
    action: &Action,
    data: &[u8],
) -> Result<Confirm, String> {
    let (exchange, routing_key, properties): (ShortString, ShortString, &BasicProperties) =
        match action {
            Action::Wait {
                queue, properties, ..
            } => ("".into(), queue.clone(), properties),
            Action::Deliver {
                destination,
                properties,
                ..
            } => (
                destination.exchange.clone(),
                destination.routing_key.clone(),
                properties,
            ),
            Action::Park { properties, .. } => ("".into(), names.parked.clone(), properties),
        };
    let opts = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    timed(
        "basic.publish",
        RPC_TIMEOUT,
        ch.basic_publish(exchange, routing_key, opts, data, properties.clone()),
    )
    .await
    .map_err(|e| e.to_string())
}

/// Publishes an action's message, waits for its confirm and settles the source
/// delivery: acked when the replacement is safely routed; a delivery the
/// destination cannot take is parked first; anything else is a fault.
async fn forward(
    plan: &Plan,
    ch: &Channel,
    pending: Pending,
    settler: &settle::Settler,
    stats: &Stats,
) -> Result<(), String> {
    if let Action::Deliver { after, .. } = &pending.action
        && !after.is_zero()
    {
        // Cascade's last fraction: timed here while the delivery stays unacked.
        tokio::time::sleep(*after).await;
    }
    let confirm = publish(ch, &plan.names, &pending.action, &pending.data).await?;
    let confirmation = wait_confirm(confirm).await?;
    let failure = match (&pending.action, confirmation) {
        (_, Confirmation::Ack(None)) => None,
        (Action::Deliver { destination, .. }, Confirmation::Ack(Some(_))) => Some((
            destination,
            ParkReason::NoRoute {
                exchange: exchange_label(destination.exchange.as_str()).to_owned(),
                routing_key: destination.routing_key.to_string(),
            },
        )),
        (Action::Deliver { destination, .. }, Confirmation::Nack(_)) => Some((
            destination,
            ParkReason::Refused(exchange_label(destination.exchange.as_str()).to_owned()),
        )),
        (Action::Wait { queue, .. }, Confirmation::Ack(Some(_))) => {
            return Err(format!(
                "bucket queue {queue} is missing (topology drift); redeclaring"
            ));
        }
        (Action::Park { .. }, Confirmation::Ack(Some(_))) => {
            return Err(format!(
                "parking queue {} is missing (topology drift); redeclaring",
                plan.names.parked
            ));
        }
        (_, other) => return Err(format!("broker did not accept the publish: {other:?}")),
    };
    match failure {
        Some((destination, reason)) => {
            park_after_delivery(plan, ch, &pending, destination, reason).await?;
            stats.record_parked();
        }
        None => stats.record(&pending.action),
    }
    settler
        .send(settle::Event::Settled(pending.tag))
        .map_err(|_| "settler stopped".to_owned())
}

async fn park_after_delivery(
    plan: &Plan,
    ch: &Channel,
    pending: &Pending,
    destination: &Destination,
    reason: ParkReason,
) -> Result<(), String> {
    let Action::Deliver { properties, .. } = &pending.action else {
        return Ok(());
    };
    let now = now_ms();
    let action = plan.on_delivery_failed(properties, destination, reason, now);
    let action = plan.within_frame(action, || properties.clone(), now, pending.frame_max);
    log_action(&action);
    let confirm = publish(ch, &plan.names, &action, &pending.data).await?;
    match wait_confirm(confirm).await? {
        Confirmation::Ack(None) => Ok(()),
        other => Err(format!("parking failed: {other:?}")),
    }
}

async fn wait_confirm(confirm: Confirm) -> Result<Confirmation, String> {
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("publisher confirm failed: {e}")),
        Err(_) => Err(format!(
            "publisher confirm timed out after {CONFIRM_TIMEOUT:?}"
        )),
    }
}
