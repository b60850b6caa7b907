//! `delay-router status`: one line per bucket, then ingress, expired and parked depths.

use crate::broker::{self, BrokerError, RPC_TIMEOUT, timed};
use crate::config::Config;
use crate::decision::Plan;
use lapin::types::ShortString;
use std::fmt::Write;

/// One queue's line in the status report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStatus {
    pub role: String,
    pub queue: String,
    /// Messages ready and consumers; `None` when the queue does not exist.
    pub info: Option<broker::QueueInfo>,
}

/// Reads the depth of every queue the configuration names.
pub async fn collect(config: &Config) -> Result<Vec<QueueStatus>, BrokerError> {
    let conn = broker::connect(&config.url, config.ca_file.as_ref(), "delay-router status").await?;
    let plan = Plan::from_config(config);
    let names = &plan.names;
    let mut queues: Vec<(String, ShortString)> = names
        .buckets(plan.strategy, &plan.ladder)
        .map(|(q, rung)| (format!("bucket {}", rung.label), q))
        .collect();
    queues.push(("ingress".into(), names.ingress.clone()));
    queues.push(("expired".into(), names.expired.clone()));
    queues.push(("parked".into(), names.parked.clone()));
    let mut out = Vec::with_capacity(queues.len());
    for (role, queue) in queues {
        let info = broker::queue_info(&conn, &queue).await?;
        out.push(QueueStatus {
            role,
            queue: queue.to_string(),
            info,
        });
    }
    let _ = timed(
        "connection.close",
        RPC_TIMEOUT,
        conn.close(200, "status done".into()),
    )
    .await;
    Ok(out)
}

/// Renders the report as aligned text.
pub fn render(config: &Config, rows: &[QueueStatus]) -> String {
    let width = rows.iter().map(|r| r.queue.len()).max().unwrap_or(0);
    let role_width = rows.iter().map(|r| r.role.len()).max().unwrap_or(0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "broker {}  strategy {}  queues {}",
        config.url, config.strategy, config.queue_type
    );
    let _ = writeln!(s, "router {}", router_state(rows));
    for r in rows {
        let count = r.info.map_or_else(
            || "missing (run `delay-router declare`)".to_owned(),
            |i| i.messages.to_string(),
        );
        let _ = writeln!(s, "{:<role_width$}  {:<width$}  {}", r.role, r.queue, count);
    }
    s
}

/// Whether a router consumes this prefix: the ingress and expired queues' consumers.
pub fn router_state(rows: &[QueueStatus]) -> String {
    let consumers = |role: &str| {
        rows.iter()
            .find(|r| r.role == role)
            .and_then(|r| r.info)
            .map_or(0, |i| i.consumers)
    };
    match (consumers("ingress"), consumers("expired")) {
        (0, 0) => "not running: nothing consumes ingress or expired".to_owned(),
        (i, e) if i == e => format!("running: {i} router(s) consuming"),
        (i, e) => format!("partly running: {i} consumer(s) on ingress, {e} on expired"),
    }
}
