//! Why a message is parked: a typed reason, rendered to words once for
//! `x-park-reason`. Pure.

use crate::core::contract::{DelayError, DeliverAtError, Destination, DestinationError};
use crate::core::retry::DeathError;
use crate::core::wire::Unacceptable;
use std::fmt;

/// The broker's answer when it closed a channel over a publish: the AMQP
/// reply code and its words (`ACCESS_REFUSED - cannot publish to internal exchange ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerReply {
    pub code: u16,
    pub text: String,
}

impl fmt::Display for BrokerReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.text)
    }
}

/// AMQP 404: the exchange does not exist.
pub const NOT_FOUND: u16 = 404;
/// AMQP 403: the user may not publish there (permissions, an internal exchange).
pub const ACCESS_REFUSED: u16 = 403;
/// AMQP 406: a property the broker refuses, a declare with other arguments.
pub const PRECONDITION_FAILED: u16 = 406;

/// How long ago a refusal was learned, when a message is parked from memory.
fn remembered(ms: &Option<u64>) -> String {
    match ms {
        None => String::new(),
        Some(ms) => format!(" (remembered from a refusal {ms} ms earlier)"),
    }
}

/// Why the router parked a message instead of delaying or delivering it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParkReason {
    #[error(
        "missing x-requested-delay header (or x-deliver-at): the router cannot tell how long to wait"
    )]
    MissingDelay,
    #[error("invalid delay: {0}")]
    InvalidDelay(DelayError),
    /// `x-delay` on the router exchange, read as `x-requested-delay` is.
    #[error("invalid delay: x-delay (read on the router exchange as x-requested-delay): {0}")]
    InvalidXDelay(DelayError),
    #[error("invalid delivery time: {0}")]
    InvalidDeliverAt(DeliverAtError),
    /// Its message-id was cancelled (`delay-router cancel`, or a message
    /// with `x-cancel-message-id`); removed at a bucket expiry.
    #[error("invalid cancel request: {0}")]
    InvalidCancel(String),
    #[error("cancelled: message-id '{0}' was cancelled before it was due")]
    Cancelled(String),
    #[error("invalid destination: {0}")]
    InvalidDestination(DestinationError),
    #[error(
        "destination is the router exchange '{0}' itself: delivering there would delay the message forever"
    )]
    DestinationIsRouter(String),
    #[error(
        "destination is the router's own {kind} '{name}': delivering there would loop or corrupt the router's state"
    )]
    OwnDestination { kind: &'static str, name: String },
    #[error(
        "destination exchange '{exchange}' is not allowed: [security] allow_destinations = {allowed}"
    )]
    NotAllowed { exchange: String, allowed: String },
    /// A property the broker would refuse from the router's user.
    #[error("{0}")]
    Unacceptable(Unacceptable),
    #[error(
        "destination exchange '{exchange}' does not exist (the broker answered {reply}){}",
        remembered(.remembered_ms)
    )]
    ExchangeNotFound {
        exchange: String,
        reply: BrokerReply,
        remembered_ms: Option<u64>,
    },
    #[error(
        "the broker refused the router's publish to exchange '{exchange}' with routing key '{routing_key}': {reply}{}",
        remembered(.remembered_ms)
    )]
    PublishRefused {
        exchange: String,
        routing_key: String,
        reply: BrokerReply,
        remembered_ms: Option<u64>,
    },
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
    Nacked(String),
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

/// The reason class of cancelled messages.
pub const CANCELLED: &str = "cancelled";

/// Every reason class ([`ParkReason::class`]), the `reason` label of
/// `delay_router_messages_parked_total`.
pub const CLASSES: [&str; 17] = [
    "missing_delay",
    "invalid_delay",
    "invalid_deliver_at",
    CANCELLED,
    "invalid_cancel",
    "no_destination",
    "not_allowed",
    "unacceptable",
    "exchange_not_found",
    "refused",
    "unroutable",
    "nacked",
    "not_in_transit",
    "no_policy",
    "max_attempts",
    "invalid_death",
    "too_large",
];

impl ParkReason {
    /// A short stable class of this reason, for metrics: one of [`CLASSES`].
    pub fn class(&self) -> &'static str {
        match self {
            Self::MissingDelay => "missing_delay",
            Self::InvalidDelay(_) | Self::InvalidXDelay(_) => "invalid_delay",
            Self::InvalidDeliverAt(_) => "invalid_deliver_at",
            Self::Cancelled(_) => CANCELLED,
            Self::InvalidCancel(_) => "invalid_cancel",
            Self::InvalidDestination(_)
            | Self::DestinationIsRouter(_)
            | Self::OwnDestination { .. } => "no_destination",
            Self::NotAllowed { .. } => "not_allowed",
            Self::Unacceptable(_) => "unacceptable",
            Self::ExchangeNotFound { .. } => "exchange_not_found",
            Self::PublishRefused { .. } => "refused",
            Self::NoRoute { .. } => "unroutable",
            Self::Nacked(_) => "nacked",
            Self::NotInTransit(_) => "not_in_transit",
            Self::NoPolicy(_) => "no_policy",
            Self::RetriesExhausted { .. } => "max_attempts",
            Self::InvalidDeath(_) => "invalid_death",
            Self::HeadersTooLarge { .. } => "too_large",
            Self::HeadersRemoved { reason, .. } => reason.class(),
        }
    }

    /// The broker closed the channel over a publish to `destination`:
    /// 404 says the exchange does not exist, anything else is a refusal in
    /// the broker's words. `remembered_ms`: learned from an earlier message.
    pub fn refused(
        destination: &Destination,
        reply: BrokerReply,
        remembered_ms: Option<u64>,
    ) -> Self {
        let exchange = exchange_label(destination.exchange.as_str()).to_owned();
        if reply.code == NOT_FOUND {
            Self::ExchangeNotFound {
                exchange,
                reply,
                remembered_ms,
            }
        } else {
            Self::PublishRefused {
                exchange,
                routing_key: destination.routing_key.to_string(),
                reply,
                remembered_ms,
            }
        }
    }
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
    fn every_class_is_listed() {
        let reasons = [
            ParkReason::MissingDelay,
            ParkReason::Cancelled("x".into()),
            ParkReason::NoPolicy("q".into()),
            ParkReason::HeadersRemoved {
                reason: Box::new(ParkReason::Nacked("e".into())),
                frame_max: 4096,
                removed: vec![],
            },
        ];
        for r in reasons {
            assert!(CLASSES.contains(&r.class()), "{}", r.class());
        }
        let mut unique = CLASSES.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), CLASSES.len());
    }

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

    #[test]
    fn a_refusal_names_the_destination_and_the_brokers_words() {
        let d = Destination {
            exchange: "amq.rabbitmq.trace".into(),
            routing_key: "k".into(),
        };
        let reply = BrokerReply {
            code: ACCESS_REFUSED,
            text: "ACCESS_REFUSED - cannot publish to internal exchange".into(),
        };
        assert_eq!(
            ParkReason::refused(&d, reply, Some(12)).to_string(),
            "the broker refused the router's publish to exchange 'amq.rabbitmq.trace' with \
             routing key 'k': 403 ACCESS_REFUSED - cannot publish to internal exchange \
             (remembered from a refusal 12 ms earlier)"
        );
        let missing = BrokerReply {
            code: NOT_FOUND,
            text: "NOT_FOUND - no exchange 'x' in vhost '/'".into(),
        };
        assert!(
            ParkReason::refused(&d, missing, None)
                .to_string()
                .starts_with("destination exchange 'amq.rabbitmq.trace' does not exist")
        );
    }
}
