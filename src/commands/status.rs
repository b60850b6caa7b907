//! `delay-router status`: the node it asked and the broker's version, every
//! running router of the prefix with the node each of its connections uses,
//! then one line per bucket, the ingress, expired and parked depths, and the
//! messages waiting for each plugin exchange (`[[delayed_exchange]]`).

use crate::broker::probe::{Prober, QueueInfo};
use crate::broker::{self, BrokerError, close_connection, server};
use crate::config::Config;
use crate::core::decision::Rules;
use crate::core::topology::QueueTypeSetting;
use crate::router::presence::{self, Announcement, epoch_ms};
use lapin::types::ShortString;
use std::fmt::Write;
use std::time::Duration;

/// How long `status` listens for routers answering its probe.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);

/// What `status` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The node asked, and the broker as it describes itself.
    pub node: String,
    pub broker: String,
    /// The routers of the prefix that answered.
    pub routers: Vec<Announcement>,
    pub queues: Vec<QueueStatus>,
}

/// One queue's line in the status report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStatus {
    pub role: String,
    pub queue: String,
    /// Messages ready and consumers; `None` when the queue does not exist.
    pub info: Option<QueueInfo>,
}

/// Asks a node of the configuration for the routers and every queue's depth.
pub async fn collect(config: &Config) -> Result<Status, BrokerError> {
    let ca = config.ca_file.as_ref();
    let (conn, used) = broker::connect_any(&config.urls, 0, ca, "delay-router status").await?;
    let broker = match server::server_info(&config.urls[used], ca).await {
        Ok(info) => info.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let mut rules = Rules::from_config(config);
    // Under `queue_type = "auto"` the queues a rung has depend on the type
    // the prefix's queues have.
    if config.queue_type == QueueTypeSetting::Auto
        && let Ok(Some(t)) = broker::declare::existing_queue_type(&conn, &rules.names).await
    {
        rules = rules.with_queue_type(t);
    }
    let names = &rules.names;
    let mut queues: Vec<(String, ShortString)> = names
        .bucket_queues(rules.strategy, &rules.ladder, rules.bucket_shards())
        .into_iter()
        .map(|(q, rung)| (format!("bucket {}", rung.label), q))
        .collect();
    queues.push(("ingress".into(), names.ingress.clone()));
    queues.push(("expired".into(), names.expired.clone()));
    queues.push(("parked".into(), names.parked.clone()));
    // Each plugin exchange's waiting messages: its waiting queue's depth.
    for x in &rules.delayed {
        queues.push((
            format!("waiting {}", x.name),
            names.waiting(x.name.as_str()),
        ));
    }
    let mut prober = Prober::new(&conn);
    let mut out = Vec::with_capacity(queues.len());
    let mut failed = None;
    for (role, queue) in queues {
        match prober.queue(&queue).await {
            Ok(info) => out.push(QueueStatus {
                role,
                queue: queue.to_string(),
                info,
            }),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    prober.close().await;
    let routers = match failed {
        Some(_) => Ok(Vec::new()),
        None => presence::probe(&conn, names, PROBE_WAIT).await,
    };
    close_connection(&conn, "status done").await;
    if let Some(e) = failed {
        return Err(e);
    }
    Ok(Status {
        node: config.urls[used].to_string(),
        broker,
        routers: routers?,
        queues: out,
    })
}

/// Renders the report as aligned text.
pub fn render(config: &Config, status: &Status) -> String {
    let rows = &status.queues;
    let width = rows.iter().map(|r| r.queue.len()).max().unwrap_or(0);
    let role_width = rows.iter().map(|r| r.role.len()).max().unwrap_or(0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "broker {} ({})  strategy {}  queues {}",
        status.node,
        status.broker,
        config.strategy,
        queue_type(config.queue_type, &status.routers)
    );
    let _ = writeln!(s, "router {}", router_state(rows));
    let now = epoch_ms();
    for r in &status.routers {
        let up = humantime::format_duration(Duration::from_secs(
            u64::try_from((now - r.since_ms).max(0) / 1000).unwrap_or(0),
        ));
        let _ = writeln!(
            s,
            "  {} on {} (pid {}, up {up}, {} {}): consumes from {}, publishes to {}, {}",
            r.instance,
            r.host,
            r.pid,
            r.strategy,
            r.queue_type,
            r.consume_node,
            r.publish_node,
            r.broker
        );
    }
    for r in rows {
        let count = r.info.map_or_else(
            || "missing (run `delay-router declare`)".to_owned(),
            |i| i.messages.to_string(),
        );
        let _ = writeln!(s, "{:<role_width$}  {:<width$}  {}", r.role, r.queue, count);
    }
    s
}

/// The configured queue type; for `auto`, also the type the running routers
/// learned from the broker and declare (each announces it).
fn queue_type(setting: QueueTypeSetting, routers: &[Announcement]) -> String {
    if setting != QueueTypeSetting::Auto {
        return setting.to_string();
    }
    let mut learned: Vec<&str> = routers
        .iter()
        .map(|r| r.queue_type.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    learned.sort_unstable();
    learned.dedup();
    if learned.is_empty() {
        "auto".to_owned()
    } else {
        format!("auto: {} (the running routers')", learned.join(", "))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::topology::QueueType;

    fn announcing(queue_type: &str) -> Announcement {
        Announcement {
            queue_type: queue_type.into(),
            ..Announcement::default()
        }
    }

    #[test]
    fn auto_shows_what_the_running_routers_declare() {
        let two = [announcing("quorum"), announcing("quorum")];
        assert_eq!(
            queue_type(QueueTypeSetting::Auto, &two),
            "auto: quorum (the running routers')"
        );
        let mixed = [announcing("quorum"), announcing("classic")];
        assert_eq!(
            queue_type(QueueTypeSetting::Auto, &mixed),
            "auto: classic, quorum (the running routers')"
        );
        assert_eq!(queue_type(QueueTypeSetting::Auto, &[]), "auto");
        assert_eq!(
            queue_type(QueueTypeSetting::Auto, &[announcing("")]),
            "auto",
            "an earlier version's announcement names no type"
        );
        assert_eq!(
            queue_type(QueueTypeSetting::Fixed(QueueType::Classic), &two),
            "classic"
        );
    }
}
