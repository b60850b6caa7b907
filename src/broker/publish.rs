//! Publishing with confirms: a [`Publisher`] pipelines publishes on a
//! confirm-mode channel it owns, reopens the channel after the broker closes
//! it, and answers each publish with its own [`Outcome`] — returns included,
//! which AMQP does not tie to a publish (see `Returns`).
//! [`publish_once`] is the one-message form, for callers that await each
//! publish on a channel of their own.

use super::{BrokerError, CONFIRM_TIMEOUT, RPC_TIMEOUT, channel, close_channel, timed};
use crate::core::reasons::BrokerReply;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use std::collections::HashMap;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

/// How the broker answered one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Confirmed and routed.
    Confirmed,
    /// Confirmed, but routed nowhere (`mandatory`: NO_ROUTE).
    Returned,
    /// Refused with `basic.nack` (e.g. a full queue with reject-publish).
    Nacked,
    /// The broker closed the channel with this reply while the publish was
    /// in flight. On the careful lane the publish caused it.
    ChannelClosed(BrokerReply),
    /// The channel was already closing: the publish was not sent.
    ChannelGone,
}

/// One message to publish, `mandatory`, on a lane.
pub struct Message<'a> {
    pub exchange: &'a ShortString,
    pub routing_key: &'a ShortString,
    pub properties: &'a BasicProperties,
    pub data: &'a Arc<Vec<u8>>,
}

impl Message<'_> {
    /// What identifies a returned message as this one: where it went, its
    /// id and its body. Two messages alike in all four are routed alike.
    fn fingerprint(&self) -> u64 {
        fingerprint(
            self.exchange.as_str(),
            self.routing_key.as_str(),
            self.properties.message_id().as_ref().map(|m| m.as_str()),
            self.data,
        )
    }
}

fn fingerprint(exchange: &str, routing_key: &str, id: Option<&str>, body: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (exchange, routing_key, id, body).hash(&mut h);
    h.finish()
}

/// Returned messages of one channel not yet claimed by their publish.
///
/// AMQP's `basic.return` names no delivery tag, and lapin hands it to
/// whichever pending confirm completes next, which under pipelining (and
/// `multiple` acks) is often another publish's. The broker sends a return
/// before the ack of its own publish, so the confirm that carries it
/// completes no later than that ack. The lane's actor therefore puts every
/// carried return here before it answers any publish of the same batch, and
/// each publish looks for its own return by content.
#[derive(Debug, Default)]
struct Returns(Mutex<HashMap<u64, usize>>);

impl Returns {
    fn add(&self, key: u64) {
        *self.lock().entry(key).or_default() += 1;
    }

    /// Takes one return of this message, if there is one.
    fn claim(&self, message: &Message<'_>) -> bool {
        let mut returns = self.lock();
        if returns.is_empty() {
            return false;
        }
        let key = message.fingerprint();
        match returns.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                returns.remove(&key);
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, usize>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What the lane's actor answers for one publish.
enum Answer {
    Ack(Arc<Returns>),
    Nack(Arc<Returns>),
    Closed(BrokerReply),
    Gone,
    Fault(BrokerError),
}

struct Request {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
    data: Arc<Vec<u8>>,
    answer: oneshot::Sender<Answer>,
}

enum Command {
    Publish(Box<Request>),
    Close(oneshot::Sender<()>),
}

/// A confirm-mode channel owned by one actor task, reopened after the broker
/// closes it. Publishes are pipelined; each gets its own outcome.
pub struct Publisher {
    commands: mpsc::UnboundedSender<Command>,
}

impl Publisher {
    /// Opens the publisher's first channel and starts its actor.
    pub async fn open(conn: Arc<Connection>) -> Result<Self, BrokerError> {
        let generation = Generation::open(&conn).await?;
        let (commands, rx) = mpsc::unbounded_channel();
        tokio::spawn(actor(conn, generation, rx).in_current_span());
        Ok(Self { commands })
    }

    /// Publishes `mandatory` and waits for the broker's answer. An error is
    /// a connection-level fault (the session ends and reconnects).
    pub async fn publish(&self, message: Message<'_>) -> Result<Outcome, BrokerError> {
        let (answer, rx) = oneshot::channel();
        let request = Request {
            exchange: message.exchange.clone(),
            routing_key: message.routing_key.clone(),
            properties: message.properties.clone(),
            data: message.data.clone(),
            answer,
        };
        let stopped = || BrokerError::other("basic.publish", "the publisher stopped");
        self.commands
            .send(Command::Publish(Box::new(request)))
            .map_err(|_| stopped())?;
        let within = RPC_TIMEOUT + CONFIRM_TIMEOUT;
        let answer = match tokio::time::timeout(within, rx).await {
            Err(_) => return Err(timeout("basic.publish and its confirm", within)),
            Ok(Err(_)) => return Err(stopped()),
            Ok(Ok(answer)) => answer,
        };
        Ok(match answer {
            Answer::Ack(returns) if returns.claim(&message) => Outcome::Returned,
            Answer::Ack(_) => Outcome::Confirmed,
            Answer::Nack(returns) => {
                returns.claim(&message);
                Outcome::Nacked
            }
            Answer::Closed(reply) => Outcome::ChannelClosed(reply),
            Answer::Gone => Outcome::ChannelGone,
            Answer::Fault(e) => return Err(e),
        })
    }

    /// Closes the channel once every publish sent before is answered.
    pub async fn close(&self) {
        let (done, rx) = oneshot::channel();
        if self.commands.send(Command::Close(done)).is_ok() {
            let _ = tokio::time::timeout(RPC_TIMEOUT, rx).await;
        }
    }
}

/// One channel of a publisher and the returns seen on it.
struct Generation {
    ch: Channel,
    returns: Arc<Returns>,
}

impl Generation {
    async fn open(conn: &Connection) -> Result<Self, BrokerError> {
        Ok(Self {
            ch: confirm_channel(conn).await?,
            returns: Arc::default(),
        })
    }
}

/// A publish sent (or not) and who awaits its answer.
type Sent = (
    oneshot::Sender<Answer>,
    Arc<Returns>,
    lapin::Result<lapin::PublisherConfirm>,
);
type Confirmed = (
    oneshot::Sender<Answer>,
    Arc<Returns>,
    lapin::Result<Confirmation>,
);
type Pending<T> = FuturesUnordered<Pin<Box<dyn Future<Output = T> + Send>>>;

/// The publisher's actor: sends each publish (in order, so every publish is known
/// here before the broker can confirm it), keeps its confirm, and answers
/// batch by batch, returns first.
async fn actor(
    conn: Arc<Connection>,
    mut generation: Generation,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut sends: Pending<Sent> = FuturesUnordered::new();
    let mut confirms: Pending<Confirmed> = FuturesUnordered::new();
    let mut closing: Option<oneshot::Sender<()>> = None;
    let mut stopping = false;
    loop {
        tokio::select! {
            biased;
            batch = next_batch(&mut sends, &mut confirms), if !(sends.is_empty() && confirms.is_empty()) => {
                for (_, returns, result) in &batch {
                    if let Ok(Confirmation::Ack(Some(r)) | Confirmation::Nack(Some(r))) = result {
                        returns.add(fingerprint(
                            r.delivery.exchange.as_str(),
                            r.delivery.routing_key.as_str(),
                            r.delivery.properties.message_id().as_ref().map(|m| m.as_str()),
                            &r.delivery.data,
                        ));
                    }
                }
                for (answer_to, returns, result) in batch {
                    let answer = match result {
                        Ok(Confirmation::Ack(_)) => Answer::Ack(returns),
                        Ok(Confirmation::Nack(_)) => Answer::Nack(returns),
                        Ok(Confirmation::NotRequested) => Answer::Fault(BrokerError::other(
                            "basic.publish",
                            "the channel is not in confirm mode",
                        )),
                        Err(e) => failed(&conn, e),
                    };
                    let _ = answer_to.send(answer);
                }
            }
            command = commands.recv(), if !stopping && closing.is_none() => match command {
                Some(Command::Publish(request)) => {
                    if !generation.ch.status().connected() {
                        match Generation::open(&conn).await {
                            Ok(g) => generation = g,
                            Err(e) => {
                                let _ = request.answer.send(Answer::Fault(e));
                                continue;
                            }
                        }
                    }
                    sends.push(send(&generation, *request));
                }
                Some(Command::Close(done)) => closing = Some(done),
                None => stopping = true,
            },
            else => {}
        }
        if sends.is_empty() && confirms.is_empty() && (stopping || closing.is_some()) {
            break;
        }
    }
    close_channel(&generation.ch, "bye").await;
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

fn send(generation: &Generation, request: Request) -> Pin<Box<dyn Future<Output = Sent> + Send>> {
    let ch = generation.ch.clone();
    let returns = generation.returns.clone();
    Box::pin(async move {
        let opts = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let Request {
            exchange,
            routing_key,
            properties,
            data,
            answer,
        } = request;
        let sent = ch
            .basic_publish(exchange, routing_key, opts, &data, properties)
            .await;
        (answer, returns, sent)
    })
}

/// Waits until at least one publish is confirmed (or failed), then takes
/// every confirm that is complete by now: first every finished send (its
/// confirm may already be complete), then every complete confirm. Sends are
/// only woken when done and confirms only when complete, so draining with
/// `now_or_never` finds them all.
async fn next_batch(
    sends: &mut Pending<Sent>,
    confirms: &mut Pending<Confirmed>,
) -> Vec<Confirmed> {
    std::future::poll_fn(|cx| {
        let mut batch = Vec::new();
        while let Poll::Ready(Some((answer, returns, sent))) = sends.poll_next_unpin(cx) {
            match sent {
                Ok(confirm) => confirms.push(Box::pin(async move {
                    let result = confirm.await;
                    (answer, returns, result)
                })),
                Err(e) => batch.push((answer, returns, Err(e))),
            }
        }
        while let Poll::Ready(Some(confirmed)) = confirms.poll_next_unpin(cx) {
            batch.push(confirmed);
        }
        if batch.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(batch)
        }
    })
    .await
}

/// A failed publish: the channel's fate when the connection lives on,
/// otherwise a fault.
fn failed(conn: &Connection, e: lapin::Error) -> Answer {
    if let Some(reply) = super::channel_reply(&e) {
        return Answer::Closed(reply);
    }
    let channel_only = matches!(
        e.kind(),
        lapin::ErrorKind::InvalidChannelState(..) | lapin::ErrorKind::InvalidChannel(_)
    );
    if channel_only && conn.status().connected() {
        return Answer::Gone;
    }
    Answer::Fault(BrokerError::amqp("basic.publish", e))
}

fn timeout(what: &str, after: Duration) -> BrokerError {
    BrokerError::Timeout {
        what: what.into(),
        after,
    }
}

/// A channel in confirm mode.
pub async fn confirm_channel(conn: &Connection) -> Result<Channel, BrokerError> {
    let ch = channel(conn).await?;
    timed(
        "confirm.select",
        RPC_TIMEOUT,
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await?;
    Ok(ch)
}

/// Publishes one message `mandatory` on `ch` and awaits the broker's answer.
/// With publisher confirms on `ch`, a return and a nack are reported; without
/// them, sent is all that is known ([`Outcome::Confirmed`]). The caller must
/// not have other publishes in flight on `ch`: the return would not be tied
/// to this one.
pub async fn publish_once(ch: &Channel, message: Message<'_>) -> Result<Outcome, BrokerError> {
    let opts = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let publish = ch.basic_publish(
        message.exchange.clone(),
        message.routing_key.clone(),
        opts,
        message.data.as_slice(),
        message.properties.clone(),
    );
    let confirm = match tokio::time::timeout(RPC_TIMEOUT, publish).await {
        Err(_) => return Err(timeout("basic.publish", RPC_TIMEOUT)),
        Ok(Err(e)) => return channel_outcome(e),
        Ok(Ok(confirm)) => confirm,
    };
    match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
        Err(_) => Err(timeout("publisher confirm", CONFIRM_TIMEOUT)),
        Ok(Err(e)) => channel_outcome(e),
        Ok(Ok(Confirmation::Ack(Some(_)))) => Ok(Outcome::Returned),
        Ok(Ok(Confirmation::Ack(None) | Confirmation::NotRequested)) => Ok(Outcome::Confirmed),
        Ok(Ok(Confirmation::Nack(_))) => Ok(Outcome::Nacked),
    }
}

fn channel_outcome(e: lapin::Error) -> Result<Outcome, BrokerError> {
    match super::channel_reply(&e) {
        Some(reply) => Ok(Outcome::ChannelClosed(reply)),
        None => Err(BrokerError::amqp("basic.publish", e)),
    }
}
