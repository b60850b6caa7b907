//! `delay-router declare`: the topology, declared once (idempotent).

use crate::broker::{self, BrokerError, close_connection};
use crate::config::Config;
use crate::core::decision::Rules;

/// Declares the configuration's exchanges, queues and bindings; returns a
/// one-line summary of what exists now.
pub async fn declare(config: &Config) -> Result<String, BrokerError> {
    let ca = config.ca_file.as_ref();
    let (conn, used) = broker::connect_any(&config.urls, 0, ca, "delay-router declare").await?;
    let rules = Rules::from_config(config);
    let declared = broker::declare::declare(&conn, &rules.topology()).await;
    close_connection(&conn, "declared").await;
    broker::declare::warn_unversioned(&declared?);
    let names = &rules.names;
    Ok(format!(
        "declared {} buckets, {}, {}, {}, {} and {} on {}",
        rules.ladder.rungs().len(),
        names.router_exchange,
        names.ingress,
        names.expired,
        names.due,
        names.parked,
        config.urls[used]
    ))
}
