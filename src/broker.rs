//! Broker: connecting, declaring the topology and reading queue depths.
//! Every await that talks to RabbitMQ has a timeout from here.

use crate::config::{AmqpUrl, CaFile, redact_text};
use crate::topology::{self, Names, QueueType};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use std::future::Future;
use std::time::Duration;

/// Longest wait for a connection to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one broker RPC (declare, bind, qos, ack, close...).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a publisher confirm.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to {url}: {message}")]
    Connect { url: String, message: String },
    #[error("{what} timed out after {after:?}")]
    Timeout { what: String, after: Duration },
    #[error("{what} failed: {message}")]
    Amqp { what: String, message: String },
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
    fn amqp(what: impl Into<String>, e: lapin::Error) -> Self {
        Self::Amqp {
            what: what.into(),
            message: redact_text(&e.to_string()),
        }
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

/// Opens a connection named after the router, with a timeout.
pub async fn connect(
    url: &AmqpUrl,
    ca_file: Option<&CaFile>,
    name: &str,
) -> Result<Connection, BrokerError> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: ca_file.map(|ca| ca.pem.clone()),
    };
    let runtime = lapin::runtime::default_runtime().map_err(|e| BrokerError::Connect {
        url: url.to_string(),
        message: e.to_string(),
    })?;
    let connecting = Connection::connect_with_config(url.expose(), props, tls, runtime);
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(BrokerError::Connect {
            url: url.to_string(),
            message: redact_text(&e.to_string()),
        }),
        Err(_) => Err(BrokerError::Connect {
            url: url.to_string(),
            message: format!("no answer within {CONNECT_TIMEOUT:?}"),
        }),
    }
}

/// Opens a channel with a timeout.
pub async fn channel(conn: &Connection) -> Result<Channel, BrokerError> {
    timed("channel.open", RPC_TIMEOUT, conn.create_channel()).await
}

/// Turns a PRECONDITION_FAILED on declare into an error that says what to do.
fn declare_error(kind: &'static str, name: &str, e: BrokerError) -> BrokerError {
    match e {
        BrokerError::Amqp { message, .. } if message.contains("PRECONDITION_FAILED") => {
            let detail = message
                .split("PRECONDITION_FAILED - ")
                .nth(1)
                .unwrap_or(&message)
                .trim_end_matches(['"', ')'])
                .to_owned();
            BrokerError::Conflict {
                kind,
                name: name.to_owned(),
                detail,
            }
        }
        other => other,
    }
}

async fn declare_exchange(
    ch: &Channel,
    name: &ShortString,
    kind: ExchangeKind,
) -> Result<(), BrokerError> {
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    timed(
        &format!("exchange.declare {name}"),
        RPC_TIMEOUT,
        ch.exchange_declare(name.clone(), kind, opts, FieldTable::default()),
    )
    .await
    .map_err(|e| declare_error("exchange", name.as_str(), e))
}

async fn declare_queue(
    ch: &Channel,
    name: &ShortString,
    args: FieldTable,
) -> Result<(), BrokerError> {
    timed(
        &format!("queue.declare {name}"),
        RPC_TIMEOUT,
        ch.queue_declare(name.clone(), QueueDeclareOptions::durable(), args),
    )
    .await
    .map(drop)
    .map_err(|e| declare_error("queue", name.as_str(), e))
}

async fn bind(
    ch: &Channel,
    queue: &ShortString,
    exchange: &ShortString,
) -> Result<(), BrokerError> {
    timed(
        &format!("queue.bind {queue} to {exchange}"),
        RPC_TIMEOUT,
        ch.queue_bind(
            queue.clone(),
            exchange.clone(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
}

/// Declares every exchange, queue and binding; idempotent.
pub async fn declare(
    conn: &Connection,
    names: &Names,
    queue_type: QueueType,
    buckets: &[(ShortString, FieldTable)],
) -> Result<(), BrokerError> {
    let plain = topology::queue_arguments(queue_type);
    let ch = channel(conn).await?;
    declare_exchange(&ch, &names.router_exchange, ExchangeKind::Fanout).await?;
    declare_exchange(&ch, &names.expired_exchange, ExchangeKind::Fanout).await?;
    declare_queue(&ch, &names.parked, plain.clone()).await?;
    declare_queue(
        &ch,
        &names.ingress,
        topology::ingress_arguments(names, queue_type),
    )
    .await?;
    bind(&ch, &names.ingress, &names.router_exchange).await?;
    declare_queue(&ch, &names.expired, plain.clone()).await?;
    bind(&ch, &names.expired, &names.expired_exchange).await?;
    declare_queue(&ch, &names.state, plain).await?;
    for (queue, args) in buckets {
        declare_queue(&ch, queue, args.clone()).await?;
    }
    let _ = timed(
        "channel.close",
        RPC_TIMEOUT,
        ch.close(200, "declared".into()),
    )
    .await;
    Ok(())
}

/// Ready messages and consumers of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueInfo {
    pub messages: u32,
    pub consumers: u32,
}

/// A queue's depth and consumers by passive declare: `None` when it does not
/// exist. A missing queue closes the channel, so each probe gets its own.
pub async fn queue_info(
    conn: &Connection,
    queue: &ShortString,
) -> Result<Option<QueueInfo>, BrokerError> {
    let ch = channel(conn).await?;
    let opts = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let result = timed(
        &format!("queue.declare passive {queue}"),
        RPC_TIMEOUT,
        ch.queue_declare(queue.clone(), opts, FieldTable::default()),
    )
    .await;
    match result {
        Ok(q) => {
            let _ = timed("channel.close", RPC_TIMEOUT, ch.close(200, "ok".into())).await;
            Ok(Some(QueueInfo {
                messages: q.message_count(),
                consumers: q.consumer_count(),
            }))
        }
        Err(BrokerError::Amqp { message, .. }) if message.contains("NOT_FOUND") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Ready messages in a queue: `None` when it does not exist.
pub async fn depth(conn: &Connection, queue: &ShortString) -> Result<Option<u32>, BrokerError> {
    Ok(queue_info(conn, queue).await?.map(|i| i.messages))
}

/// Whether an exchange exists, by passive declare on a throwaway channel.
pub async fn exchange_exists(
    conn: &Connection,
    exchange: &ShortString,
) -> Result<bool, BrokerError> {
    if exchange.as_str().is_empty() {
        return Ok(true);
    }
    let ch = channel(conn).await?;
    let opts = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let result = timed(
        &format!("exchange.declare passive {exchange}"),
        RPC_TIMEOUT,
        ch.exchange_declare(
            exchange.clone(),
            ExchangeKind::Direct,
            opts,
            FieldTable::default(),
        ),
    )
    .await;
    match result {
        Ok(()) => {
            let _ = timed("channel.close", RPC_TIMEOUT, ch.close(200, "ok".into())).await;
            Ok(true)
        }
        Err(BrokerError::Amqp { message, .. }) if message.contains("NOT_FOUND") => Ok(false),
        Err(e) => Err(e),
    }
}
