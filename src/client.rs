//! For consumers that want the explicit path: "retry this delivery in D".
//! Publishes a copy of the delivery (body and every property) to the router
//! exchange with the headers that route it back where it came from.

use crate::broker::BrokerError;
use crate::broker::publish::{Message, Outcome, publish_once};
use crate::core::contract::{ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY, REQUESTED_DELAY, integer};
use crate::core::reasons::BrokerReply;
use crate::core::retry::ATTEMPTS;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, LongString};
use lapin::{BasicProperties, Channel};
use std::sync::Arc;
use std::time::Duration;

/// Why a retry could not be handed to the router.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The publish did not complete (connection, channel or timeout).
    #[error("publishing to the router exchange failed: {0}")]
    Publish(#[from] BrokerError),
    /// The router exchange took the retry but routed it to no queue.
    #[error(
        "the router exchange '{0}' routed the retry nowhere (is the router's topology declared?)"
    )]
    Unroutable(String),
    /// The broker nacked the publish.
    #[error("the broker refused the retry (basic.nack)")]
    Refused,
    /// The broker closed the channel over the publish, in these words.
    #[error("the broker closed the channel over the retry: {0}")]
    ChannelClosed(BrokerReply),
}

/// The properties of a retry of `delivery` in `delay`: every property copied,
/// plus `x-requested-delay`, the delivery's exchange and routing key as the
/// destination, and the attempts header so the router counts this retry.
pub fn retry_properties(delivery: &Delivery, delay: Duration) -> BasicProperties {
    let mut h = delivery.properties.headers().clone().unwrap_or_default();
    let millis = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    h.insert(REQUESTED_DELAY.into(), AMQPValue::LongLongInt(millis));
    h.insert(
        ORIGINAL_EXCHANGE.into(),
        AMQPValue::LongString(LongString::from(delivery.exchange.as_str())),
    );
    h.insert(
        ORIGINAL_ROUTING_KEY.into(),
        AMQPValue::LongString(LongString::from(delivery.routing_key.as_str())),
    );
    let attempts = integer(&h, ATTEMPTS).unwrap_or(0);
    h.insert(ATTEMPTS.into(), AMQPValue::LongLongInt(attempts));
    delivery.properties.clone().with_headers(h)
}

/// Publishes a retry of `delivery` in `delay` to `router_exchange` and, on a
/// channel in confirm mode, waits for the broker to take it. Ack the original
/// delivery only after this returns `Ok`.
pub async fn retry_later(
    ch: &Channel,
    router_exchange: &str,
    delivery: &Delivery,
    delay: Duration,
) -> Result<(), ClientError> {
    let message = Message {
        exchange: &router_exchange.into(),
        routing_key: &delivery.routing_key,
        properties: &retry_properties(delivery, delay),
        data: &Arc::new(delivery.data.clone()),
    };
    match publish_once(ch, message).await? {
        Outcome::Confirmed => Ok(()),
        Outcome::Returned => Err(ClientError::Unroutable(router_exchange.to_owned())),
        Outcome::Nacked => Err(ClientError::Refused),
        Outcome::ChannelClosed(reply) => Err(ClientError::ChannelClosed(reply)),
        Outcome::ChannelGone => Err(ClientError::Publish(BrokerError::other(
            "basic.publish",
            "the channel is closed",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldTable;

    #[test]
    fn a_retry_keeps_every_property_and_points_back_to_the_delivery() {
        let mut h = FieldTable::default();
        h.insert("tenant".into(), AMQPValue::LongString("acme".into()));
        let mut d = Delivery::mock(1, "orders".into(), "eu".into(), false, b"body".to_vec());
        d.properties = BasicProperties::default()
            .with_message_id("m".into())
            .with_headers(h);
        let p = retry_properties(&d, Duration::from_secs(5));
        let h = p.headers().as_ref().unwrap();
        assert_eq!(integer(h, REQUESTED_DELAY), Some(5000));
        assert_eq!(integer(h, ATTEMPTS), Some(0));
        assert_eq!(
            h.inner().get(ORIGINAL_EXCHANGE),
            Some(&AMQPValue::LongString("orders".into()))
        );
        assert_eq!(
            h.inner().get(ORIGINAL_ROUTING_KEY),
            Some(&AMQPValue::LongString("eu".into()))
        );
        assert_eq!(
            h.inner().get("tenant"),
            Some(&AMQPValue::LongString("acme".into()))
        );
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m");
    }
}
