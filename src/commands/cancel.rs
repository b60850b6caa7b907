//! `delay-router cancel ID...`: writes a tombstone per message-id to the
//! cancels stream. Every router of the prefix reads it; a message with one
//! of these ids is parked (reason `cancelled`) at its next bucket expiry
//! instead of going on. Works whether or not a router runs now.

use crate::broker::{self, BrokerError, close_connection};
use crate::config::Config;
use crate::core::cancel;
use crate::core::contract::DestinationError;
use crate::core::decision::Rules;
use crate::router::{clock, tombstones};
use lapin::types::ShortString;

/// Why a cancel could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("message-id {0:?}: {1}")]
    InvalidId(String, DestinationError),
    #[error("message-id must not be empty")]
    EmptyId,
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Writes one tombstone per id (each confirmed by the broker); returns when
/// they stop mattering (ms since the Unix epoch).
pub async fn cancel(config: &Config, ids: &[String]) -> Result<i64, CancelError> {
    let ids = ids
        .iter()
        .map(|id| {
            if id.is_empty() {
                return Err(CancelError::EmptyId);
            }
            ShortString::try_new(id.as_str()).map_err(|_| {
                let too_long = DestinationError::TooLong {
                    header: "message-id",
                    len: id.len(),
                };
                CancelError::InvalidId(id.clone(), too_long)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let rules = Rules::from_config(config);
    let ca = config.ca_file.as_ref();
    let (conn, _) = broker::connect_any(&config.urls, 0, ca, "delay-router cancel").await?;
    let keep_ms = i64::try_from(config.cancel_keep.as_millis()).unwrap_or(i64::MAX);
    let until_ms = clock::stamp_ms().saturating_add(keep_ms);
    let mut written = Ok(());
    for id in &ids {
        written = tombstones::write(&conn, &rules.names, &cancel::tombstone(id, until_ms)).await;
        if written.is_err() {
            break;
        }
    }
    close_connection(&conn, "cancelled").await;
    written?;
    Ok(until_ms)
}
