//! Why a message was parked: a typed reason, rendered to words once for `x-park-reason`.

use crate::contract::{DelayError, DestinationError};
use crate::retry::DeathError;

/// Why the router parked a message instead of delaying or delivering it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParkReason {
    #[error("missing x-requested-delay header: the router cannot tell how long to wait")]
    MissingDelay,
    #[error("invalid delay: {0}")]
    InvalidDelay(DelayError),
    #[error("invalid destination: {0}")]
    InvalidDestination(DestinationError),
    #[error(
        "destination is the router exchange '{0}' itself: delivering there would delay the message forever"
    )]
    DestinationIsRouter(String),
    #[error(
        "user-id '{user_id}' differs from the router's AMQP user '{router_user}': RabbitMQ refuses to forward it unchanged"
    )]
    UserIdMismatch {
        user_id: String,
        router_user: String,
    },
    #[error("destination exchange '{0}' does not exist")]
    ExchangeNotFound(String),
    #[error(
        "unroutable: no queue is bound to exchange '{exchange}' with routing key '{routing_key}' (NO_ROUTE)"
    )]
    NoRoute {
        exchange: String,
        routing_key: String,
    },
    #[error(
        "the broker refused the message at exchange '{0}' (basic.nack), e.g. a full queue with overflow reject-publish"
    )]
    Refused(String),
    #[error(
        "arrived from a bucket without the router's transit headers ({0}); was it published straight to a bucket?"
    )]
    NotInTransit(String),
    #[error(
        "rejected by queue '{0}', which no [[policy]] matches, and no x-requested-delay says how long to wait"
    )]
    NoPolicy(String),
    #[error(
        "gave up after {attempts} attempts: policy \"{policy}\" allows {max} deliveries to queue '{queue}'"
    )]
    RetriesExhausted {
        queue: String,
        policy: String,
        attempts: u32,
        max: u32,
    },
    #[error("cannot read x-death: {0}")]
    InvalidDeath(DeathError),
    #[error(
        "header table too large: {bytes} bytes of content header with the router's headers, over the connection's frame_max of {frame_max} (AMQP cannot split a header across frames)"
    )]
    HeadersTooLarge { bytes: usize, frame_max: u32 },
    #[error(
        "{reason}; the parked copy did not fit in a {frame_max}-byte frame either, so the router removed these sender headers: {}",
        removed_list(.removed)
    )]
    HeadersRemoved {
        reason: Box<ParkReason>,
        frame_max: u32,
        /// Header names and their encoded sizes.
        removed: Vec<(String, usize)>,
    },
}

fn removed_list(removed: &[(String, usize)]) -> String {
    removed
        .iter()
        .map(|(name, bytes)| format!("'{name}' ({bytes} bytes)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Renders an exchange name for humans: the default exchange has no name.
pub fn exchange_label(name: &str) -> &str {
    if name.is_empty() {
        "(default exchange)"
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_plain_words() {
        assert_eq!(
            ParkReason::InvalidDelay(DelayError::Negative(-5)).to_string(),
            "invalid delay: x-requested-delay is negative (-5)"
        );
        assert_eq!(
            ParkReason::NoRoute {
                exchange: "orders".into(),
                routing_key: "eu".into()
            }
            .to_string(),
            "unroutable: no queue is bound to exchange 'orders' with routing key 'eu' (NO_ROUTE)"
        );
    }
}
