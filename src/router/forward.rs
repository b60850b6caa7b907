//! Carrying out one plan: hold it if the plan says so, publish it, and settle
//! the source delivery once the broker has taken the replacement. A delivery
//! the destination does not take (NO_ROUTE, a nack, a channel closed over it,
//! a refusal remembered from an earlier message) becomes the park the plan
//! says ([`Plan::failed`]). Only faults of the connection, or of the router's
//! own queues, end the session.
//!
//! Each pipeline publishes on two lanes. The **main lane** pipelines
//! publishes to destinations known to take messages (the default exchange,
//! an exchange that confirmed a publish lately). The **careful lane**
//! publishes one message at a time on a channel of its own: a destination not
//! known yet, and every message that was in flight on a main channel the
//! broker closed ("suspects"). A channel the broker closes on the careful
//! lane has exactly one possible cause.

use super::SessionError;
use super::destinations::Destinations;
use super::gate::PublishGate;
use super::settle::{self, Settler};
use super::stats::Stats;
use crate::broker::publish::{Message, Outcome, Publisher};
use crate::broker::{self, BrokerError, RPC_TIMEOUT, timed};
use crate::core::decision::{Action, Plan, Rules, Source, Waiting};
use crate::core::envelope::PERSISTENT;
use crate::core::parking::Failure;
use crate::core::reasons::exchange_label;
use lapin::options::BasicGetOptions;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Connection};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use crate::tuning::MAX_PUBLISHES_PER_MESSAGE;

/// The two lanes of one pipeline.
pub struct Lanes {
    /// The main lane: a channel for each queue of a rung. RabbitMQ confirms
    /// with one `multiple` ack only what is below a channel's oldest
    /// unconfirmed publish; placements drawn over a rung's queues on one
    /// channel were confirmed by about one frame each, as each queue synced
    /// in turn. A shard's placements on a channel of their own confirm in
    /// order. Deliveries and parks take the first.
    main: Vec<Publisher>,
    careful: Publisher,
    /// Held for the whole of one careful publish, so the careful channel
    /// never has two publishes in flight.
    careful_turn: tokio::sync::Mutex<()>,
    /// Takes tokens from the plugin exchanges' waiting queues; opened at the
    /// first counted message that leaves, again after a failure.
    tokens: tokio::sync::Mutex<Option<Channel>>,
    conn: Arc<Connection>,
}

impl Lanes {
    /// Lanes with `shards` main channels (at least one).
    pub async fn open(conn: Arc<Connection>, shards: u8) -> Result<Self, BrokerError> {
        let mut main = Vec::with_capacity(usize::from(shards.max(1)));
        for _ in 0..shards.max(1) {
            main.push(Publisher::open(conn.clone()).await?);
        }
        Ok(Self {
            main,
            careful: Publisher::open(conn.clone()).await?,
            careful_turn: tokio::sync::Mutex::new(()),
            tokens: tokio::sync::Mutex::new(None),
            conn,
        })
    }

    /// Takes one token from `queue` (a waiting queue): whether there was one.
    async fn take_token(&self, queue: &ShortString) -> Result<bool, BrokerError> {
        let mut slot = self.tokens.lock().await;
        let ch = match slot.as_ref().filter(|ch| ch.status().connected()) {
            Some(ch) => ch.clone(),
            None => slot.insert(broker::channel(&self.conn).await?).clone(),
        };
        let taken = timed(
            "basic.get (a waiting queue's token)",
            RPC_TIMEOUT,
            ch.basic_get(queue.clone(), BasicGetOptions { no_ack: true }),
        )
        .await;
        if taken.is_err() {
            *slot = None;
        }
        Ok(taken?.is_some())
    }

    /// The main channel an action publishes on.
    fn main_for(&self, action: &Action) -> &Publisher {
        let shard = match action {
            Action::Wait { shard, .. } => usize::from(*shard),
            _ => 0,
        };
        &self.main[shard % self.main.len()]
    }

    pub async fn close(&self) {
        for main in &self.main {
            main.close().await;
        }
        self.careful.close().await;
    }
}

/// A source delivery and its plan.
pub struct Pending {
    pub tag: u64,
    pub data: Arc<Vec<u8>>,
    pub plan: Plan,
}

/// What forwarding needs, shared by one pipeline's tasks.
pub struct Forwarder {
    pub rules: Arc<Rules>,
    pub lanes: Arc<Lanes>,
    pub destinations: Arc<Destinations>,
    pub settler: Settler,
    pub stats: Arc<Stats>,
    /// Publishes unconfirmed at once, sized from confirm latency.
    pub gate: PublishGate,
    /// The queue this pipeline consumes.
    pub source: Source,
    /// Cancelled when the session ends on a fault: nothing more is published.
    pub abandoned: CancellationToken,
    /// Deliveries held now (see [`Forwarder::hold`]).
    pub holding: AtomicUsize,
}

impl Forwarder {
    /// Deliveries this pipeline times itself now (cascade's last fraction).
    pub fn holding(&self) -> usize {
        self.holding.load(Ordering::Relaxed)
    }

    /// Counts a plan the router will hold before it is forwarded.
    pub fn hold(&self, plan: &Plan) {
        if let Action::Deliver { after, .. } = &plan.action
            && !after.is_zero()
        {
            self.holding.fetch_add(1, Ordering::Relaxed);
            self.stats.holding(1);
        }
    }

    /// Tells the settler a delivery arrived (before its replacement is published).
    pub fn delivered(&self, tag: u64) -> Result<(), SessionError> {
        self.settler
            .send(settle::Event::Delivered(tag))
            .map_err(|_| SessionError::SettlerStopped)
    }

    /// Tells the settler a delivery's replacement is confirmed: ack it.
    pub fn settled(&self, tag: u64) -> Result<(), SessionError> {
        self.settler
            .send(settle::Event::Settled(tag))
            .map_err(|_| SessionError::SettlerStopped)
    }

    /// Publishes the plan's message until the broker has it, then settles
    /// the source delivery.
    pub async fn forward(&self, mut pending: Pending) -> Result<(), SessionError> {
        if let Action::Deliver { after, .. } = &pending.plan.action
            && !after.is_zero()
        {
            // Cascade's last fraction: timed here while the delivery stays
            // unacked (counted by `hold`, when it was decided).
            tokio::time::sleep(*after).await;
            self.holding.fetch_sub(1, Ordering::Relaxed);
            self.stats.holding(-1);
        }
        // In flight on a main channel the broker closed: it may be the cause.
        let mut suspect = false;
        for _ in 0..MAX_PUBLISHES_PER_MESSAGE {
            // A refusal learned since the decision (during a hold, or from an
            // earlier attempt) is an input of the plan, as it was of the
            // decision.
            pending.plan = self.checked(pending.plan);
            let careful = suspect || self.unverified(&pending.plan.action);
            let turn = if careful {
                let turn = self.lanes.careful_turn.lock().await;
                // Earlier careful publishes may have settled the question:
                // the destination took one, or refused one (the delivery is
                // then a park, which is no longer unverified).
                pending.plan = self.checked(pending.plan);
                if !suspect && !self.unverified(&pending.plan.action) {
                    continue;
                }
                Some(turn)
            } else {
                None
            };
            let lane = if careful {
                &self.lanes.careful
            } else {
                self.lanes.main_for(&pending.plan.action)
            };
            let (exchange, routing_key) = pending.plan.action.route(&self.rules.names);
            let message = Message {
                exchange: &exchange,
                routing_key: &routing_key,
                properties: pending.plan.action.properties(),
                data: &pending.data,
            };
            let entry = self.gate.enter().await;
            if self.abandoned.is_cancelled() {
                return Err(SessionError::Abandoned);
            }
            let sent = std::time::Instant::now();
            let outcome = lane.publish(message).await?;
            let took = sent.elapsed();
            let confirmed_ms = super::clock::now_ms();
            self.stats.record_confirm(took);
            if matches!(
                outcome,
                Outcome::Confirmed | Outcome::Returned | Outcome::Nacked
            ) {
                entry.answered(took);
            }
            drop(entry);
            drop(turn);
            let action = &pending.plan.action;
            let own = || routing_key.to_string();
            match (outcome, action) {
                (Outcome::Confirmed, action) => {
                    if let Action::Deliver { destination, .. } = action {
                        self.destinations.verify(&destination.exchange);
                    }
                    self.stats.record(action, confirmed_ms);
                    if let Some(policy) = &pending.plan.retry_policy {
                        self.stats.record_retry(policy);
                    }
                    // Before the ack: a router that stops in between leaves
                    // the delivery unacked, and the broker's redelivery
                    // changes the count again (one off at worst), never not.
                    if let Some(waiting) = &pending.plan.waiting {
                        self.count(waiting).await?;
                    }
                    return self.settled(pending.tag);
                }
                (Outcome::Returned, Action::Deliver { .. }) => {
                    self.fail(&mut pending.plan, Failure::Returned)
                }
                (Outcome::Nacked, Action::Deliver { .. }) => {
                    self.fail(&mut pending.plan, Failure::Nacked)
                }
                (Outcome::ChannelClosed(_) | Outcome::ChannelGone, _) if !careful => {
                    self.stats.record_suspect();
                    suspect = true;
                }
                (Outcome::ChannelClosed(reply), Action::Deliver { destination, .. }) => {
                    warn!(
                        exchange = exchange_label(destination.exchange.as_str()),
                        routing_key = %destination.routing_key,
                        reply = %reply,
                        "the broker refused a delivery: parking it"
                    );
                    self.stats.record_refusal();
                    self.destinations.refuse(destination, &reply);
                    let failure = Failure::Refused {
                        reply,
                        remembered_ms: None,
                    };
                    self.fail(&mut pending.plan, failure);
                }
                (Outcome::ChannelClosed(reply), _) => {
                    return Err(SessionError::OwnPublishRefused {
                        queue: own(),
                        reply,
                    });
                }
                // The careful channel was closing already: publish again.
                (Outcome::ChannelGone, _) => {}
                (Outcome::Returned, _) => return Err(SessionError::QueueMissing(own())),
                (Outcome::Nacked, _) => return Err(SessionError::OwnPublishNacked(own())),
            }
        }
        Err(SessionError::Unsettled {
            queue: pending.plan.action.route(&self.rules.names).1.to_string(),
            attempts: MAX_PUBLISHES_PER_MESSAGE,
        })
    }

    /// Carries out a change to a plugin exchange's count of waiting
    /// messages. A token that cannot be published or taken is a count off by
    /// one, logged; the message itself is already where its plan put it.
    async fn count(&self, waiting: &Waiting) -> Result<(), SessionError> {
        match waiting {
            Waiting::Enter(queue) => {
                let message = Message {
                    exchange: &ShortString::from(""),
                    routing_key: queue,
                    properties: &BasicProperties::default().with_delivery_mode(PERSISTENT),
                    data: &Arc::new(Vec::new()),
                };
                let outcome = self.lanes.main[0].publish(message).await?;
                if outcome != Outcome::Confirmed {
                    self.stats.record_miscount();
                    warn!(queue = %queue, outcome = ?outcome, "a waiting message was not counted: its token was not taken");
                }
            }
            Waiting::Leave(queue) => match self.lanes.take_token(queue).await {
                Ok(true) => {}
                Ok(false) => {
                    self.stats.record_miscount();
                    debug!(queue = %queue, "a counted message left with no token to take: the count was already low");
                }
                Err(e) => {
                    self.stats.record_miscount();
                    warn!(queue = %queue, error = %e, "a message that left is still counted: its token could not be taken");
                }
            },
        }
        Ok(())
    }

    /// The plan's delivery becomes the park the plan says for `failure`.
    fn fail(&self, plan: &mut Plan, failure: Failure) {
        plan.action = plan.failed(failure);
        self.log_park(plan);
    }

    fn log_park(&self, plan: &Plan) {
        if let Action::Park { reason, .. } = &plan.action {
            warn!(reason = %reason, "parking message");
        }
    }

    /// The plan, parked instead if its destination was refused lately.
    fn checked(&self, plan: Plan) -> Plan {
        let parks = |p: &Plan| matches!(p.action, Action::Park { .. });
        let was_parked = parks(&plan);
        let plan = plan.checked(self.destinations.as_ref());
        if !was_parked && parks(&plan) {
            self.log_park(&plan);
        }
        plan
    }

    /// A delivery to an exchange that has not confirmed a publish lately.
    fn unverified(&self, action: &Action) -> bool {
        matches!(action, Action::Deliver { destination, .. }
            if !self.destinations.is_verified(destination.exchange.as_str()))
    }
}
