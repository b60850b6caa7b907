//! `delay-router declare`: the topology, declared once (idempotent).

use crate::broker::{self, BrokerError, close_connection};
use crate::config::Config;
use crate::core::decision::Rules;
use crate::core::topology::QueueTypeSetting;

/// Declares the configuration's exchanges, queues and bindings; returns a
/// one-line summary of what exists now.
pub async fn declare(config: &Config) -> Result<String, BrokerError> {
    let ca = config.ca_file.as_ref();
    let (conn, used) = broker::connect_any(&config.urls, 0, ca, "delay-router declare").await?;
    let mut rules = Rules::from_config(config);
    if config.queue_type == QueueTypeSetting::Auto {
        let (names, strategy) = (&rules.names, rules.strategy);
        let url = &config.urls[used];
        match broker::declare::auto_queue_type(&conn, url, ca, names, strategy).await {
            Ok((t, _)) => rules = rules.with_queue_type(t),
            Err(e) => {
                close_connection(&conn, "refused").await;
                return Err(e);
            }
        }
    }
    let declared = broker::declare::declare(&conn, &rules.topology()).await;
    close_connection(&conn, "declared").await;
    broker::declare::warn_unversioned(&declared?);
    let names = &rules.names;
    Ok(format!(
        "declared {} {} buckets ({} queues a rung), {}, {}, {}, {} and {} on {}",
        rules.ladder.rungs().len(),
        rules.queue_type,
        rules.bucket_shards(),
        names.router_exchange,
        names.ingress,
        names.expired,
        names.due,
        names.parked,
        config.urls[used]
    ))
}
