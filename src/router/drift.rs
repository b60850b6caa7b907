//! Topology drift: exchanges and queues the router relies on, deleted while
//! it runs (by an operator, a policy, a script). A classic bucket whose
//! dead-letter exchange is missing drops what expires from it, and a missing
//! router exchange refuses every publish, so the router checks its topology
//! by passive declares at start and every `check_interval` (all sent at
//! once, [`probe::all_present`]; one by one only when one is missing, to
//! name it), and repairs what is missing by declaring it again, logging
//! each repair at ERROR.
//!
//! Bindings cannot be checked passively; they are re-asserted at every check
//! (binding is idempotent). Arguments cannot be checked passively either: a
//! queue deleted and declared again with other arguments between two checks
//! passes the survey. So when the survey finds everything, a check binds
//! again and declares nothing else, and every [`FULL_EVERY`]th check declares
//! the whole topology again (which refuses, loudly, a queue whose arguments
//! differ). A check that declared everything every time would double an
//! idle router's round trips.

use super::stats::Stats;
use crate::broker::probe::{self, Prober};
use crate::broker::{BrokerError, declare};
use crate::core::topology::Topology;
use lapin::Connection;
use lapin::types::ShortString;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
pub use crate::tuning::FULL_EVERY;

/// What is missing, as "exchange NAME" / "queue NAME", by passive declares.
pub async fn missing(conn: &Connection, t: &Topology) -> Result<Vec<String>, BrokerError> {
    survey(conn, t, None).await
}

/// As [`missing`], recording each queue's depth in `stats` when given.
pub async fn survey(
    conn: &Connection,
    t: &Topology,
    stats: Option<&Stats>,
) -> Result<Vec<String>, BrokerError> {
    let names = &t.names;
    let exchanges = t.exchanges();
    let queues: Vec<&ShortString> = names
        .own_queues()
        .into_iter()
        .chain(t.buckets.iter().map(|(q, _)| q))
        .chain(t.waiting.iter().map(|(q, _)| q))
        .collect();
    if let Some(infos) = probe::all_present(conn, &exchanges, &queues).await? {
        if let Some(stats) = stats {
            for (queue, info) in queues.iter().zip(&infos) {
                record_depth(stats, t, queue, info.messages);
            }
        }
        return Ok(Vec::new());
    }
    // Something is missing: one by one, to name it.
    let mut prober = Prober::new(conn);
    let mut gone = Vec::new();
    let found = async {
        for exchange in t.exchanges() {
            if !prober.exchange(exchange).await? {
                gone.push(format!("exchange {exchange}"));
            }
        }
        let queues = names
            .own_queues()
            .into_iter()
            .chain(t.buckets.iter().map(|(q, _)| q))
            .chain(t.waiting.iter().map(|(q, _)| q));
        for queue in queues {
            match prober.queue(queue).await? {
                None => gone.push(format!("queue {queue}")),
                Some(info) => {
                    if let Some(stats) = stats {
                        record_depth(stats, t, queue, info.messages);
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    prober.close().await;
    found.map(|()| gone)
}

/// A polled depth, as a bucket gauge, a plugin exchange's waiting count or
/// one of the router's own queues'.
fn record_depth(stats: &Stats, t: &Topology, queue: &ShortString, messages: u32) {
    let names = &t.names;
    if let Some(exchange) = t.waiting_for(queue.as_str()) {
        stats.set_waiting(exchange.as_str(), messages);
        return;
    }
    let role = if queue == &names.ingress {
        "ingress"
    } else if queue == &names.expired {
        "expired"
    } else if queue == &names.parked {
        "parked"
    } else if queue == &names.state || queue == &names.cancels {
        // The state queue holds one record; a stream's count is its length.
        return;
    } else {
        stats.set_bucket_depth(queue.as_str(), messages);
        return;
    };
    stats.set_queue_depth(queue.as_str(), role, messages);
}

/// One check: repairs what is missing and re-asserts the bindings; with
/// `full`, declares the whole topology again even if nothing is missing.
/// Returns what was missing.
pub async fn check(
    conn: &Connection,
    t: &Topology,
    stats: Option<&Stats>,
    full: bool,
) -> Result<Vec<String>, BrokerError> {
    let gone = survey(conn, t, stats).await?;
    if gone.is_empty() && !full {
        declare::rebind(conn, t).await?;
        return Ok(gone);
    }
    if !gone.is_empty() {
        error!(
            missing = %gone.join(", "),
            "topology drift: the router's exchanges or queues were deleted; declaring them again \
             (messages a classic bucket expired meanwhile, or that were in a deleted queue, are lost)"
        );
    }
    // Queues kept without x-queue-version were reported at connect.
    declare::declare(conn, t).await?;
    if !gone.is_empty() {
        info!(repaired = %gone.join(", "), "topology repaired");
    }
    Ok(gone)
}

/// Checks every `every` until `halt`, recording the depths in `stats`
/// (the first right away, declaring everything, as every [`FULL_EVERY`]th).
pub async fn watch(
    conn: &Connection,
    t: &Topology,
    every: Duration,
    stats: &Stats,
    halt: CancellationToken,
) {
    let mut first = true;
    let mut round: u32 = 0;
    loop {
        if !first {
            tokio::select! {
                () = halt.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
        first = false;
        let full = round % FULL_EVERY == 0;
        round = round.wrapping_add(1);
        if let Err(e) = check(conn, t, Some(stats), full).await {
            warn!(error = %e, "topology check failed; trying again at the next check");
        }
    }
}
