//! Topology drift: exchanges and queues the router relies on, deleted while
//! it runs (by an operator, a policy, a script). A classic bucket whose
//! dead-letter exchange is missing drops what expires from it, and a missing
//! router exchange refuses every publish, so the router checks its topology
//! by passive declares at start and every `check_interval`, and repairs what
//! is missing by declaring it again, logging each repair at ERROR.
//!
//! Bindings cannot be checked passively; they are re-asserted at every check
//! (binding is idempotent).

use crate::broker::probe::Prober;
use crate::broker::{BrokerError, declare};
use crate::core::topology::Topology;
use lapin::Connection;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// What is missing, as "exchange NAME" / "queue NAME", by passive declares.
pub async fn missing(conn: &Connection, t: &Topology) -> Result<Vec<String>, BrokerError> {
    let names = &t.names;
    let mut prober = Prober::new(conn);
    let mut gone = Vec::new();
    let found = async {
        for exchange in [
            &names.router_exchange,
            &names.expired_exchange,
            &names.presence,
        ] {
            if !prober.exchange(exchange).await? {
                gone.push(format!("exchange {exchange}"));
            }
        }
        let queues = [&names.ingress, &names.expired, &names.parked, &names.state]
            .into_iter()
            .chain(t.buckets.iter().map(|(q, _)| q));
        for queue in queues {
            if prober.queue(queue).await?.is_none() {
                gone.push(format!("queue {queue}"));
            }
        }
        Ok(())
    }
    .await;
    prober.close().await;
    found.map(|()| gone)
}

/// One check: repairs what is missing (and re-asserts the bindings); returns
/// what was missing.
pub async fn check(conn: &Connection, t: &Topology) -> Result<Vec<String>, BrokerError> {
    let gone = missing(conn, t).await?;
    if !gone.is_empty() {
        error!(
            missing = %gone.join(", "),
            "topology drift: the router's exchanges or queues were deleted; declaring them again \
             (messages a classic bucket expired meanwhile, or that were in a deleted queue, are lost)"
        );
    }
    declare::declare(conn, t).await?;
    if !gone.is_empty() {
        info!(repaired = %gone.join(", "), "topology repaired");
    }
    Ok(gone)
}

/// Checks every `every` until `halt`.
pub async fn watch(conn: &Connection, t: &Topology, every: Duration, halt: CancellationToken) {
    loop {
        tokio::select! {
            () = halt.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(e) = check(conn, t).await {
            warn!(error = %e, "topology check failed; trying again at the next check");
        }
    }
}
