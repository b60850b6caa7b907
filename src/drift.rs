//! Topology drift: exchanges and queues the router relies on, deleted while
//! it runs (by an operator, a policy, a script). A classic bucket whose
//! dead-letter exchange is missing drops what expires from it, and a missing
//! router exchange refuses every publish, so the router checks its topology
//! by passive declares at start and every `check_interval`, and repairs what
//! is missing by declaring it again, logging each repair at ERROR.
//!
//! Bindings cannot be checked passively; they are re-asserted at every check
//! (binding is idempotent).

use crate::broker::{self, BrokerError, RPC_TIMEOUT, timed};
use crate::topology::{Names, QueueType};
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// One exchange or queue the router needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exchange,
    Queue,
}

fn expected<'a>(
    names: &'a Names,
    buckets: &'a [(ShortString, FieldTable)],
) -> impl Iterator<Item = (Kind, &'a ShortString)> {
    [
        (Kind::Exchange, &names.router_exchange),
        (Kind::Exchange, &names.expired_exchange),
        (Kind::Queue, &names.ingress),
        (Kind::Queue, &names.expired),
        (Kind::Queue, &names.parked),
        (Kind::Queue, &names.state),
    ]
    .into_iter()
    .chain(buckets.iter().map(|(q, _)| (Kind::Queue, q)))
}

/// What is missing, as "exchange NAME" / "queue NAME", by passive declares.
pub async fn missing(
    conn: &Connection,
    names: &Names,
    buckets: &[(ShortString, FieldTable)],
) -> Result<Vec<String>, BrokerError> {
    let mut gone = Vec::new();
    let mut ch: Option<Channel> = None;
    for (kind, name) in expected(names, buckets) {
        // A failed passive declare closes its channel: the next probe opens another.
        let c = match ch.take() {
            Some(c) => c,
            None => broker::channel(conn).await?,
        };
        let probe = match kind {
            Kind::Exchange => timed(
                &format!("exchange.declare passive {name}"),
                RPC_TIMEOUT,
                c.exchange_declare(
                    name.clone(),
                    ExchangeKind::Fanout,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                ),
            )
            .await
            .map(drop),
            Kind::Queue => timed(
                &format!("queue.declare passive {name}"),
                RPC_TIMEOUT,
                c.queue_declare(
                    name.clone(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                ),
            )
            .await
            .map(drop),
        };
        match probe {
            Ok(()) => ch = Some(c),
            Err(BrokerError::Amqp { message, .. }) if message.contains("NOT_FOUND") => {
                let kind = match kind {
                    Kind::Exchange => "exchange",
                    Kind::Queue => "queue",
                };
                gone.push(format!("{kind} {name}"));
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(c) = ch {
        let _ = timed("channel.close", RPC_TIMEOUT, c.close(200, "checked".into())).await;
    }
    Ok(gone)
}

/// One check: repairs what is missing (and re-asserts the bindings); returns
/// what was missing.
pub async fn check(
    conn: &Connection,
    names: &Names,
    queue_type: QueueType,
    buckets: &[(ShortString, FieldTable)],
) -> Result<Vec<String>, BrokerError> {
    let gone = missing(conn, names, buckets).await?;
    if !gone.is_empty() {
        error!(
            missing = %gone.join(", "),
            "topology drift: the router's exchanges or queues were deleted; declaring them again \
             (messages a classic bucket expired meanwhile, or that were in a deleted queue, are lost)"
        );
    }
    broker::declare(conn, names, queue_type, buckets).await?;
    if !gone.is_empty() {
        info!(repaired = %gone.join(", "), "topology repaired");
    }
    Ok(gone)
}

/// Checks every `every` until `halt`.
pub async fn watch(
    conn: &Connection,
    names: &Names,
    queue_type: QueueType,
    buckets: &[(ShortString, FieldTable)],
    every: Duration,
    halt: CancellationToken,
) {
    loop {
        tokio::select! {
            () = halt.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(e) = check(conn, names, queue_type, buckets).await {
            warn!(error = %e, "topology check failed; trying again at the next check");
        }
    }
}
