//! `delay-router cancel ID...`: publishes one cancel request per message-id
//! to the control exchange (`<prefix>.control`), as an application with the
//! right to cancel would. A router turns each into a tombstone in the
//! cancels stream; a message with one of these ids is parked (reason
//! `cancelled`) at its next bucket expiry instead of going on. The requests
//! wait in the ingress queue while no router runs. The command needs what
//! such an application needs: write on the control exchange.

use crate::broker::publish::{Message, Outcome, confirm_channel, publish_once};
use crate::broker::{self, BrokerError, close_channel, close_connection};
use crate::config::Config;
use crate::core::contract::{CANCEL_MESSAGE_ID, DestinationError};
use crate::core::topology::Names;
use crate::router::clock;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::sync::Arc;

/// Why a cancel could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error("message-id {0:?}: {1}")]
    InvalidId(String, DestinationError),
    #[error("message-id must not be empty")]
    EmptyId,
    #[error("the control exchange '{exchange}' did not take the cancel request: {why}")]
    Refused { exchange: String, why: String },
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Publishes one cancel request per id (each confirmed and routed by the
/// broker); returns until when a router keeps their tombstones if it reads
/// them now (ms since the Unix epoch).
pub async fn cancel(config: &Config, ids: &[String]) -> Result<i64, CancelError> {
    for id in ids {
        if id.is_empty() {
            return Err(CancelError::EmptyId);
        }
        if ShortString::try_new(id.as_str()).is_err() {
            let too_long = DestinationError::TooLong {
                header: "message-id",
                len: id.len(),
            };
            return Err(CancelError::InvalidId(id.clone(), too_long));
        }
    }
    let names = Names::new(&config.prefix);
    let ca = config.ca_file.as_ref();
    let (conn, _) = broker::connect_any(&config.urls, 0, ca, "delay-router cancel").await?;
    let sent = request_all(&conn, &names.control, ids).await;
    close_connection(&conn, "cancelled").await;
    sent?;
    let keep_ms = i64::try_from(config.cancel_keep.as_millis()).unwrap_or(i64::MAX);
    Ok(clock::now().up_ms().saturating_add(keep_ms))
}

async fn request_all(
    conn: &lapin::Connection,
    control: &ShortString,
    ids: &[String],
) -> Result<(), CancelError> {
    let ch = confirm_channel(conn).await?;
    let empty = Arc::new(Vec::new());
    let mut sent = Ok(());
    for id in ids {
        let mut headers = FieldTable::default();
        headers.insert(
            CANCEL_MESSAGE_ID.into(),
            AMQPValue::LongString(LongString::from(id.as_str())),
        );
        let properties = BasicProperties::default()
            .with_headers(headers)
            .with_delivery_mode(2);
        let message = Message {
            exchange: control,
            routing_key: &"".into(),
            properties: &properties,
            data: &empty,
        };
        let why = match publish_once(&ch, message).await? {
            Outcome::Confirmed => continue,
            Outcome::Returned => {
                "routed nowhere: run `delay-router declare` (or start the router) first".to_owned()
            }
            Outcome::Nacked => "the broker refused it (basic.nack)".to_owned(),
            Outcome::ChannelClosed(reply) => reply.to_string(),
            Outcome::ChannelGone => "the channel closed".to_owned(),
        };
        sent = Err(CancelError::Refused {
            exchange: control.to_string(),
            why,
        });
        break;
    }
    close_channel(&ch, "bye").await;
    sent
}
