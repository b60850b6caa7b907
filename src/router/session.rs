//! One broker session: connect (consuming and publishing on separate
//! connections, as RabbitMQ's shovel does: the broker then parses each on its
//! own process and core), declare the topology, run both pipelines with the
//! janitor and the drift watch beside them, and close. The first fault of any
//! task ends the session.

use super::pipeline::Pipeline;
use super::presence::{self, Announcement};
use super::{SessionError, Shared, drift, janitor, tombstones};
use crate::broker::{self, RPC_TIMEOUT, close_connection, probe};
use crate::config::Config;
use crate::core::compat::{self, Verdict};
use crate::core::decision::{Rules, Source};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{Instrument, debug, error, info, info_span, warn};

/// A fault raised by any task of a session; the first one wins and ends it.
#[derive(Clone, Default)]
pub struct Fault {
    token: CancellationToken,
    first: Arc<Mutex<Option<SessionError>>>,
}

impl Fault {
    /// Records `e` if it is the first, and ends the session.
    pub fn raise(&self, e: SessionError) {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e);
        }
        self.token.cancel();
    }

    /// Completes once a fault is raised.
    pub fn raised(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// The first fault, as text, if one was raised.
    pub fn describe(&self) -> Option<String> {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first
            .as_ref()
            .map(|e| crate::config::redact_text(&e.to_string()))
    }

    fn take(&self) -> Option<SessionError> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Runs one session until `stop` (Ok) or the first fault (Err). It connects
/// to the first of the configured nodes that answers, from `node` on, and
/// leaves in `node` the one it used.
pub async fn run(
    config: &Config,
    rules: &Arc<Rules>,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
    node: &mut usize,
) -> Result<(), SessionError> {
    let urls = &config.urls;
    let ca = config.ca_file.as_ref();
    let name = |role| format!("delay-router {role} {}", config.prefix);
    let (conn, used) = broker::connect_any(urls, *node, ca, &name("consume")).await?;
    *node = used;
    let conn = Arc::new(conn);
    // Publishing on the same node first: one node's fault then costs one
    // reconnect, not two.
    let publish_conn = match broker::connect_any(urls, used, ca, &name("publish")).await {
        Ok((c, _)) => Arc::new(c),
        Err(e) => {
            close_connection(&conn, "bye").await;
            return Err(e.into());
        }
    };
    let (server, version) = match broker::server::server_info(&urls[used], ca).await {
        Ok(info) => (info.to_string(), info.major_minor()),
        Err(e) => (format!("unknown ({e})"), None),
    };
    info!(node = %urls[used], broker = %server, prefix = %rules.names.prefix, strategy = %rules.strategy, "connected");
    match compat::judge(rules.strategy, rules.queue_type, version) {
        Verdict::Fine => {}
        Verdict::Warn(w) => warn!("{w}"),
        Verdict::Refuse(why) => {
            close_connection(&conn, "bye").await;
            close_connection(&publish_conn, "bye").await;
            return Err(SessionError::Unsupported(why));
        }
    }
    let topology = Arc::new(rules.topology());
    let stale = match prepare(&conn, &topology).await {
        Ok(stale) => stale,
        Err(e) => {
            close_connection(&conn, "bye").await;
            close_connection(&publish_conn, "bye").await;
            return Err(e);
        }
    };
    info!(
        rungs = rules.ladder.rungs().len(),
        queues_a_rung = rules.bucket_shards(),
        "topology declared"
    );
    shared.stats.record_session();
    shared
        .stats
        .set_node(Some((&urls[used].to_string(), &server)));
    let me = Announcement {
        instance: shared.instance.clone(),
        host: presence::host_name(),
        pid: std::process::id(),
        since_ms: shared.since_ms,
        consume_node: urls[used].to_string(),
        publish_node: urls[used].to_string(),
        broker: server.clone(),
        strategy: rules.strategy.to_string(),
        queue_type: rules.queue_type.to_string(),
        buckets: topology
            .bucket_names()
            .iter()
            .map(|q| q.to_string())
            .collect(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let fault = Fault::default();
    let halt = CancellationToken::new();
    let live_for = config.check_interval * presence::LIVE_FOR_INTERVALS;
    let announcer = {
        let (conn, names, halt) = (publish_conn.clone(), rules.names.clone(), halt.clone());
        let (shared, every) = (shared.clone(), config.check_interval);
        tokio::spawn(
            async move { presence::run(&conn, &names, &me, &shared.peers, every, halt).await }
                .instrument(info_span!("presence")),
        )
    };
    let janitor = {
        let (conn, topology, halt) = (conn.clone(), topology.clone(), halt.clone());
        let shared = shared.clone();
        tokio::spawn(
            async move {
                let in_use = || shared.peers.buckets_in_use(live_for, &shared.instance);
                let (swept, retired) = tokio::join!(
                    janitor::sweep(&conn, &topology, stale, halt.clone(), in_use),
                    janitor::retire_due_lane(&conn, &topology, halt),
                );
                if let Err(e) = swept {
                    warn!(error = %e, "stale bucket sweep stopped; it resumes on the next start");
                }
                if let Err(e) = retired {
                    warn!(error = %e, "retiring the due lane stopped; it resumes on the next start");
                }
            }
            .instrument(info_span!("janitor")),
        )
    };
    let watcher = {
        let (conn, topology, halt) = (conn.clone(), topology.clone(), halt.clone());
        let (every, stats) = (config.check_interval, shared.stats.clone());
        tokio::spawn(
            async move { drift::watch(&conn, &topology, every, &stats, halt).await }
                .instrument(info_span!("topology")),
        )
    };
    // Every tombstone written so far is known before the first expiry is read.
    let (caught_up, read_all) = tokio::sync::oneshot::channel();
    let follower = {
        let (conn, publish_conn) = (conn.clone(), publish_conn.clone());
        let (names, shared, halt) = (rules.names.clone(), shared.clone(), halt.clone());
        let fault = fault.clone();
        tokio::spawn(
            async move {
                let followed = tombstones::follow(
                    &conn,
                    &publish_conn,
                    &names,
                    &shared.tombstones,
                    &shared.stats,
                    caught_up,
                    halt,
                )
                .await;
                if let Err(e) = followed {
                    fault.raise(SessionError::Cancels(e.to_string()));
                }
            }
            .instrument(info_span!("cancels")),
        )
    };
    shared
        .health
        .expect(&shared.stats, Source::ALL.map(Source::name));
    shared
        .health
        .set_reason("reading the cancels stream before consuming");
    let mut pipelines = Vec::new();
    // Ok(true): read to the end; Ok(false): the session ends anyway.
    let read = tokio::select! {
        read = tokio::time::timeout(tombstones::CATCH_UP_TIMEOUT, read_all) => match read {
            Ok(Ok(())) => Ok(true),
            // The follower stopped; it raised its fault.
            Ok(Err(_)) => Ok(false),
            Err(_) => Err(()),
        },
        () = fault.raised() => Ok(false),
        () = stop.cancelled() => Ok(false),
    };
    match read {
        Ok(true) => {
            for source in Source::ALL {
                let p = Pipeline {
                    source,
                    rules: rules.clone(),
                    conn: conn.clone(),
                    publish_conn: publish_conn.clone(),
                    destinations: shared.destinations.clone(),
                    fault: fault.clone(),
                    stats: shared.stats.clone(),
                    health: shared.health.clone(),
                    tombstones: shared.tombstones.clone(),
                    prefetch: config.prefetch,
                    inflight_bytes: config.inflight_bytes,
                };
                let stop = stop.clone();
                pipelines.push(tokio::spawn(
                    p.run(stop)
                        .instrument(info_span!("pipeline", source = source.name())),
                ));
            }
        }
        Ok(false) => {}
        Err(()) => fault.raise(SessionError::Cancels(format!(
            "not read to its end within {:?}",
            tombstones::CATCH_UP_TIMEOUT
        ))),
    }
    for handle in pipelines {
        if let Err(join) = handle.await {
            fault.raise(SessionError::Task(join.to_string()));
        }
    }
    halt.cancel();
    shared.stats.set_node(None);
    let ending = Instant::now();
    let side = [
        ("janitor", janitor),
        ("topology", watcher),
        ("presence", announcer),
        ("cancels", follower),
    ];
    wind_down(side, RPC_TIMEOUT).await;
    close_connection(&conn, "delay-router stopping").await;
    close_connection(&publish_conn, "delay-router stopping").await;
    debug!(
        took_ms = ending.elapsed().as_millis() as u64,
        "session's side tasks stopped and connections closed"
    );
    match fault.take() {
        Some(e) => Err(e),
        None => {
            info!("stopped cleanly");
            Ok(())
        }
    }
}

/// Waits for a session's side tasks (told to halt) under one deadline for
/// all of them, so a session ends at most `within` after its pipelines, not
/// a deadline per task; a task still running then is aborted, not left to
/// linger into the next session, and named in a warning.
async fn wind_down<const N: usize>(tasks: [(&str, JoinHandle<()>); N], within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    for (name, mut task) in tasks {
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            task.abort();
            warn!(
                task = name,
                within_ms = within.as_millis() as u64,
                "a session task did not stop in time; aborted"
            );
        }
    }
}

/// Reports drift found at start, declares the topology and records the
/// bucket state; returns the stale buckets the janitor should remove.
async fn prepare(
    conn: &lapin::Connection,
    topology: &crate::core::topology::Topology,
) -> Result<Vec<String>, SessionError> {
    // A prefix that ran before has its state queue: anything else missing
    // was deleted since (at a first start everything is missing).
    if let Ok(Some(_)) = probe::queue(conn, &topology.names.state).await
        && let Ok(gone) = drift::missing(conn, topology).await
        && !gone.is_empty()
    {
        error!(missing = %gone.join(", "), "topology drift found at start: declaring the missing exchanges and queues again");
    }
    broker::declare::warn_unversioned(&broker::declare::declare(conn, topology).await?);
    Ok(janitor::record(conn, topology).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn wind_down_shares_one_deadline_and_aborts_what_overruns() {
        let finished = Arc::new(AtomicBool::new(false));
        let quick = {
            let finished = finished.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                finished.store(true, Ordering::SeqCst);
            })
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // Never ends by itself; dropping `tx` inside it tells us it was aborted.
        let stuck = tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        let stuck_too = tokio::spawn(std::future::pending::<()>());
        let started = Instant::now();
        wind_down(
            [("quick", quick), ("stuck", stuck), ("stuck too", stuck_too)],
            Duration::from_millis(300),
        )
        .await;
        let took = started.elapsed();
        assert!(finished.load(Ordering::SeqCst));
        // One deadline for all: two stuck tasks cost 300 ms, not 600.
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_millis(550), "{took:?}");
        assert!(rx.await.is_err(), "the stuck task was aborted");
    }
}
