//! Asking the broker whether an exchange or queue exists, and how many
//! messages and consumers a queue has, by passive declare. A probe of
//! something missing closes its channel (404), so the prober opens another
//! for the next one; passive declares need no permission.
//!
//! [`all_present`] sends every probe of a survey at once on one channel, so
//! that the topology check costs one round trip instead of one a name (an
//! idle router with the shipped ladder sent about 95 one after another every
//! 5 s, each answer a wake-up of its own); [`Prober`] asks one by one, which
//! names what is missing.

use super::{BrokerError, NOT_FOUND, RPC_TIMEOUT, channel, close_channel, timed};
use futures_util::future::join_all;
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

/// Passive declares of `exchanges` and `queues`, all sent at once on one
/// channel. `Some` with each queue's depth and consumers, in order, when
/// every one exists; `None` when one does not: its 404 closes the channel,
/// which fails the probes sent behind it, so only a [`Prober`] can name
/// what is missing. The default exchange (`""`) always exists.
pub async fn all_present(
    conn: &Connection,
    exchanges: &[&ShortString],
    queues: &[&ShortString],
) -> Result<Option<Vec<QueueInfo>>, BrokerError> {
    let ch = channel(conn).await?;
    let named: Vec<&ShortString> = exchanges
        .iter()
        .copied()
        .filter(|e| !e.as_str().is_empty())
        .collect();
    let exchange_probes = join_all(named.iter().map(|name| {
        let opts = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        ch.exchange_declare(
            (*name).clone(),
            ExchangeKind::Direct,
            opts,
            FieldTable::default(),
        )
    }));
    let queue_probes = join_all(queues.iter().map(|name| {
        let opts = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        ch.queue_declare((*name).clone(), opts, FieldTable::default())
    }));
    let answers = tokio::time::timeout(RPC_TIMEOUT, async {
        futures_util::join!(exchange_probes, queue_probes)
    })
    .await;
    let Ok((exchange_answers, queue_answers)) = answers else {
        close_channel(&ch, "probed").await;
        return Err(BrokerError::Timeout {
            what: format!("{} passive declares at once", named.len() + queues.len()),
            after: RPC_TIMEOUT,
        });
    };
    close_channel(&ch, "probed").await;
    let mut first_error = None;
    let mut missing = false;
    let mut note = |what: String, e: lapin::Error| {
        let e = BrokerError::amqp(what, e);
        if e.reply_code() == Some(NOT_FOUND) {
            missing = true;
        } else if first_error.is_none() {
            first_error = Some(e);
        }
    };
    for (name, answer) in named.iter().zip(exchange_answers) {
        if let Err(e) = answer {
            note(format!("exchange.declare passive {name}"), e);
        }
    }
    let mut infos = Vec::with_capacity(queues.len());
    for (name, answer) in queues.iter().zip(queue_answers) {
        match answer {
            Ok(q) => infos.push(QueueInfo {
                messages: q.message_count(),
                consumers: q.consumer_count(),
            }),
            Err(e) => note(format!("queue.declare passive {name}"), e),
        }
    }
    // A 404 explains the probes it failed behind it.
    if missing {
        return Ok(None);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Some(infos)),
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
