//! The broker: one helper per job, shared by the router, the commands, the
//! janitor and the client. Connecting and closing ([`connect`](mod@connect)), declaring
//! the topology ([`declare`]), asking whether something exists ([`probe`]),
//! and publishing with confirms ([`publish`]). Every await that talks to
//! RabbitMQ has a timeout, and errors keep the AMQP reply code lapin reports.

pub mod connect;
pub mod declare;
pub mod probe;
pub mod publish;
pub mod server;

use crate::config::redact_text;
use crate::core::reasons::BrokerReply;
use lapin::protocol::AMQPErrorKind;
use std::future::Future;
use std::time::Duration;

pub use connect::{channel, close_channel, close_connection, connect, connect_any};

/// Longest wait for a connection to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one broker RPC (declare, bind, qos, ack, close...).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a publisher confirm.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

pub use crate::core::reasons::{ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED};

/// What went wrong talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to {url}: {message}")]
    Connect { url: String, message: String },
    #[error("{what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("{what} failed: {message}")]
    Amqp {
        what: String,
        message: String,
        /// The broker's reply when it closed the channel (a soft error).
        reply: Option<BrokerReply>,
    },
    #[error(
        "{kind} '{name}' already exists with different arguments ({detail}). \
         Drain and delete it (rabbitmqctl delete_queue {name}), or choose another [topology] prefix"
    )]
    Conflict {
        kind: &'static str,
        name: String,
        detail: String,
    },
}

impl BrokerError {
    /// A failed call, named, with the password redacted from lapin's words.
    pub fn amqp(what: impl Into<String>, e: lapin::Error) -> Self {
        Self::Amqp {
            what: what.into(),
            message: redact_text(&e.to_string()),
            reply: channel_reply(&e),
        }
    }

    /// A failed call that lapin did not report as an error.
    pub fn other(what: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Amqp {
            what: what.into(),
            message: message.into(),
            reply: None,
        }
    }

    /// The AMQP reply code of a channel the broker closed, if that is what happened.
    pub fn reply_code(&self) -> Option<u16> {
        match self {
            Self::Amqp {
                reply: Some(reply), ..
            } => Some(reply.code),
            _ => None,
        }
    }
}

/// The broker's reply when `e` is a channel it closed (a soft error: 403,
/// 404, 405, 406...), as lapin reports it; `None` for connection-level errors.
pub fn channel_reply(e: &lapin::Error) -> Option<BrokerReply> {
    match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(_)) => {
            Some(BrokerReply {
                code: amqp.get_id(),
                text: amqp.get_message().to_string(),
            })
        }
        _ => None,
    }
}

/// Runs a broker call with a timeout, naming it in the error.
pub async fn timed<T>(
    what: &str,
    after: Duration,
    fut: impl Future<Output = lapin::Result<T>>,
) -> Result<T, BrokerError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(BrokerError::amqp(what, e)),
        Err(_) => Err(BrokerError::Timeout {
            what: what.into(),
            after,
        }),
    }
}
