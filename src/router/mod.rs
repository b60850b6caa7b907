//! The router service: where each delivery's plan is carried out.
//!
//! - [`supervisor`]: keeps a session alive, reconnecting with backoff.
//! - [`session`]: one broker session: connect, declare, run both pipelines,
//!   the [`janitor`] and the [`drift`] watch.
//! - [`pipeline`]: consumes ingress, due or expired, gathers what a
//!   delivery's fate depends on (the clock, tombstones, the hold budget,
//!   remembered refusals) and asks the core for its plan, once.
//! - [`forward`]: carries a plan out on the main or the careful lane, feeds
//!   what the broker answered (a return, a nack, a refusal) back to the plan
//!   (`Plan::failed`, `Plan::checked`), and settles the source delivery.
//! - [`destinations`]: what the router learned about destinations (took a
//!   message, refused one); the decision's `Refusals`.
//! - [`presence`]: the routers of one prefix announce themselves and know of
//!   each other.
//! - [`settle`]: acks source deliveries in bulk once their replacements are confirmed.
//! - [`prefetch`]: the prefetch window, sized to a byte budget.
//! - [`tombstones`]: cancelled message-ids, read from the cancels stream.
//! - [`clock`], [`stats`]: the router's clock and its metrics; [`health`]:
//!   whether it is ready; [`endpoint`]: `/metrics`, `/healthz`, `/readyz`.

pub mod clock;
pub mod destinations;
pub mod drift;
pub mod endpoint;
pub mod forward;
pub mod gate;
pub mod health;
pub mod janitor;
pub mod pipeline;
pub mod prefetch;
pub mod presence;
pub mod session;
pub mod settle;
pub mod stats;
pub mod supervisor;
pub mod tombstones;

use crate::broker::BrokerError;
use crate::config::Config;
use crate::core::decision::Rules;
use crate::core::reasons::BrokerReply;
use crate::core::topology::{QueueType, QueueTypeSetting};
use destinations::Destinations;
use stats::Stats;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How long shutdown waits for in-flight publishes to be confirmed and acked.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

/// Why the router stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The topology conflicts with what exists: retrying cannot help.
    #[error(transparent)]
    Topology(BrokerError),
    /// The connected broker cannot give what the configuration asks.
    #[error("{0}")]
    Unsupported(String),
    /// `[metrics] listen` cannot be served.
    #[error(transparent)]
    Endpoint(#[from] endpoint::EndpointError),
}

/// What ends a session; the supervisor reconnects after it.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("the consumer of {0} was cancelled by the broker")]
    ConsumerCancelled(String),
    #[error("the consumer of {queue} failed: {message}")]
    ConsumerFailed { queue: String, message: String },
    #[error("queue {0} is missing (topology drift); redeclaring")]
    QueueMissing(String),
    #[error("the broker refused (basic.nack) the router's publish to its own queue {0}")]
    OwnPublishNacked(String),
    #[error(
        "the broker refused the router's publish to its own queue {queue} through the default \
         exchange ({reply}); the router's user needs write permission on amq.default (docs/security.md)"
    )]
    OwnPublishRefused { queue: String, reply: BrokerReply },
    #[error("no publish of a message to {queue} was settled after {attempts} attempts")]
    Unsettled { queue: String, attempts: usize },
    #[error("the settler stopped")]
    SettlerStopped,
    /// The session is ending on a fault: a delivery not yet published stays
    /// unpublished (the broker redelivers its source; published now it
    /// could not be acked, and would arrive twice).
    #[error("the session ended before this delivery was published")]
    Abandoned,
    #[error("a pipeline task failed: {0}")]
    Task(String),
    #[error("the cancels stream: {0}")]
    Cancels(String),
    /// The connected broker cannot give what the configuration asks
    /// (core::compat): the router stops.
    #[error("{0}")]
    Unsupported(String),
}

/// What the sessions of one router process share.
#[derive(Debug)]
pub struct Shared {
    pub stats: Arc<Stats>,
    pub destinations: Arc<Destinations>,
    pub peers: presence::Peers,
    pub health: Arc<health::Health>,
    pub tombstones: Arc<tombstones::Tombstones>,
    /// This process among the routers of its prefix.
    pub instance: String,
    pub since_ms: i64,
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
    if config.queue_type == QueueTypeSetting::Fixed(QueueType::Classic) {
        warn_classic();
    }
    let rules = Arc::new(Rules::from_config(&config));
    let stop = CancellationToken::new();
    let health = Arc::new(health::Health::default());
    stats.expect_policies(config.policies.iter().map(|p| p.queue.as_str()));
    stats.expect_delayed_exchanges(
        config
            .delayed_exchanges
            .iter()
            .map(|x| (x.name.as_str(), x.deliver_to.as_str())),
    );
    let server = match config.metrics_listen {
        Some(addr) => {
            let (_, serve) =
                endpoint::bind(addr, stats.clone(), health.clone(), stop.clone()).await?;
            Some(tokio::spawn(serve))
        }
        None => None,
    };
    let logger = tokio::spawn(stats::log_every(stats.clone(), stop.clone()));
    let shared = Arc::new(Shared {
        stats,
        health,
        tombstones: Arc::default(),
        destinations: Arc::new(Destinations::default()),
        peers: presence::Peers::default(),
        instance: presence::new_instance(),
        since_ms: presence::epoch_ms(),
    });
    let supervisor = supervisor::supervise(config, rules, shared, stop.clone());
    tokio::pin!(supervisor);
    let result = tokio::select! {
        result = &mut supervisor => result,
        () = shutdown => {
            info!("shutdown requested: stopping consumers, settling in-flight messages");
            stop.cancel();
            supervisor.await
        }
    };
    stop.cancel();
    let _ = logger.await;
    if let Some(server) = server {
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
    }
    result
}

/// Said once at start when the buckets are classic queues (configured, or
/// found by `queue_type = "auto"`).
fn warn_classic() {
    warn!(
        "queue_type is classic: RabbitMQ dead-letters a classic bucket at most once, and \
         what expires while the broker stops or restarts is dropped; \
         queue_type = \"quorum\" dead-letters at least once (docs/guarantees.md)"
    );
}
