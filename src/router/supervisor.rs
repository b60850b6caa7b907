//! The supervisor: keeps a broker session alive. A session that ends with a
//! fault is followed by another after a capped, jittered exponential backoff;
//! a topology conflict stops the router, since retrying cannot help.

use super::session;
use super::{RouterError, SessionError, Shared};
use crate::broker::{self, BrokerError};
use crate::config::Config;
use crate::core::decision::Rules;
use crate::core::topology::{QueueType, QueueTypeSetting};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
pub use crate::tuning::{RECONNECT_MIN, RECONNECT_MAX, HEALTHY_SESSION};

/// Runs sessions until `stop`, or until the topology conflicts.
pub async fn supervise(
    config: Config,
    rules: Arc<Rules>,
    shared: Arc<Shared>,
    stop: CancellationToken,
) -> Result<(), RouterError> {
    let mut backoff = RECONNECT_MIN;
    // Routers with the same list of nodes spread over them; after a fault a
    // session starts with the next node.
    let mut node = rand::random::<u64>() as usize % config.urls.len();
    let mut rules = rules;
    // `queue_type = "auto"`: learned once, before the first session; every
    // later session of this process keeps it.
    let mut learn = config.queue_type == QueueTypeSetting::Auto;
    loop {
        let started = Instant::now();
        let outcome = if learn {
            match learn_queue_type(&config, &rules, node).await {
                Ok(learned) => {
                    rules = Arc::new(learned);
                    learn = false;
                    session::run(&config, &rules, &shared, &stop, &mut node).await
                }
                Err(e) => Err(e.into()),
            }
        } else {
            session::run(&config, &rules, &shared, &stop, &mut node).await
        };
        let fault = match outcome {
            Ok(()) => return Ok(()),
            Err(SessionError::Broker(e @ BrokerError::Conflict { .. })) => {
                return Err(RouterError::Topology(e));
            }
            Err(SessionError::Unsupported(why)) => return Err(RouterError::Unsupported(why)),
            Err(fault) => fault,
        };
        shared.stats.record_reconnect();
        shared.health.set_reason(&format!(
            "broker session lost: {}; reconnecting",
            crate::config::redact_text(&fault.to_string())
        ));
        if started.elapsed() >= HEALTHY_SESSION {
            backoff = RECONNECT_MIN;
        }
        node = (node + 1) % config.urls.len();
        let wait = jittered(backoff);
        warn!(error = %fault, retry_in_ms = wait.as_millis() as u64, "broker session lost; reconnecting");
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

/// `rules` with the type of the queues the prefix already has, quorum for a
/// new prefix; on a connection of its own to the node the session would
/// use first.
async fn learn_queue_type(
    config: &Config,
    rules: &Rules,
    node: usize,
) -> Result<Rules, BrokerError> {
    let ca = config.ca_file.as_ref();
    let name = format!("delay-router declare {}", config.prefix);
    let (conn, used) = broker::connect_any(&config.urls, node, ca, &name).await?;
    let (names, strategy, url) = (&rules.names, rules.strategy, &config.urls[used]);
    let learned = broker::declare::auto_queue_type(&conn, url, ca, names, strategy).await;
    broker::close_connection(&conn, "bye").await;
    let (queue_type, existed) = learned?;
    if existed {
        info!(queue_type = %queue_type, "queue_type auto: the prefix's queues exist; keeping their type");
    } else {
        info!(queue_type = %queue_type, "queue_type auto: a new prefix");
    }
    // Classic for a new prefix only with `priority` before RabbitMQ 4.3 (core::compat).
    if queue_type == QueueType::Classic {
        super::warn_classic();
    }
    Ok(rules.clone().with_queue_type(queue_type))
}

/// Half to full of the backoff, so many routers don't reconnect in step.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jitter_stays_within_half_to_full() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_secs(2));
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(2),
                "{d:?}"
            );
        }
    }
}
