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
    /// Messages ready in the queue; `None` when the queue does not exist.
    pub messages: Option<u32>,
}

/// Reads the depth of every queue the configuration names.
pub async fn collect(config: &Config) -> Result<Vec<QueueStatus>, BrokerError> {
    let conn = broker::connect(&config.url, "delay-router status").await?;
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
        let messages = broker::depth(&conn, &queue).await?;
        out.push(QueueStatus {
            role,
            queue: queue.to_string(),
            messages,
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
    let _ = writeln!(s, "broker {}  strategy {}", config.url, config.strategy);
    for r in rows {
        let count = r.messages.map_or_else(
            || "missing (run `delay-router declare`)".to_owned(),
            |n| n.to_string(),
        );
        let _ = writeln!(s, "{:<role_width$}  {:<width$}  {}", r.role, r.queue, count);
    }
    s
}
