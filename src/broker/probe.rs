//! Asking the broker whether an exchange or queue exists, and how many
//! messages and consumers a queue has, by passive declare. A probe of
//! something missing closes its channel (404), so the prober opens another
//! for the next one; passive declares need no permission.

use super::{BrokerError, NOT_FOUND, RPC_TIMEOUT, channel, close_channel, timed};
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

/// Ready messages and consumers of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueInfo {
    pub messages: u32,
    pub consumers: u32,
}

/// Probes on one connection, reusing a channel until a probe closes it.
pub struct Prober<'a> {
    conn: &'a Connection,
    ch: Option<Channel>,
}

impl<'a> Prober<'a> {
    pub fn new(conn: &'a Connection) -> Self {
        Self { conn, ch: None }
    }

    async fn channel(&mut self) -> Result<Channel, BrokerError> {
        match &self.ch {
            Some(ch) if ch.status().connected() => Ok(ch.clone()),
            _ => {
                let ch = channel(self.conn).await?;
                self.ch = Some(ch.clone());
                Ok(ch)
            }
        }
    }

    /// A queue's depth and consumers; `None` when it does not exist.
    pub async fn queue(&mut self, name: &ShortString) -> Result<Option<QueueInfo>, BrokerError> {
        let ch = self.channel().await?;
        let opts = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let probe = timed(
            &format!("queue.declare passive {name}"),
            RPC_TIMEOUT,
            ch.queue_declare(name.clone(), opts, FieldTable::default()),
        )
        .await;
        missing_is_none(probe.map(|q| QueueInfo {
            messages: q.message_count(),
            consumers: q.consumer_count(),
        }))
    }

    /// Whether an exchange exists; the default exchange always does.
    pub async fn exchange(&mut self, name: &ShortString) -> Result<bool, BrokerError> {
        if name.as_str().is_empty() {
            return Ok(true);
        }
        let ch = self.channel().await?;
        let opts = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let probe = timed(
            &format!("exchange.declare passive {name}"),
            RPC_TIMEOUT,
            ch.exchange_declare(
                name.clone(),
                ExchangeKind::Direct,
                opts,
                FieldTable::default(),
            ),
        )
        .await;
        Ok(missing_is_none(probe)?.is_some())
    }

    /// Closes the channel in use.
    pub async fn close(self) {
        if let Some(ch) = self.ch {
            close_channel(&ch, "probed").await;
        }
    }
}

fn missing_is_none<T>(probe: Result<T, BrokerError>) -> Result<Option<T>, BrokerError> {
    match probe {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.reply_code() == Some(NOT_FOUND) => Ok(None),
        Err(e) => Err(e),
    }
}

/// One queue's depth and consumers; `None` when it does not exist.
pub async fn queue(
    conn: &Connection,
    name: &ShortString,
) -> Result<Option<QueueInfo>, BrokerError> {
    let mut p = Prober::new(conn);
    let info = p.queue(name).await;
    p.close().await;
    info
}

/// Ready messages in one queue; `None` when it does not exist.
pub async fn depth(conn: &Connection, name: &ShortString) -> Result<Option<u32>, BrokerError> {
    Ok(queue(conn, name).await?.map(|i| i.messages))
}
