//! A pipeline: consumes one of the router's queues (ingress or expired),
//! asks the core for each delivery's [`Plan`](crate::core::decision::Plan)
//! and hands it to [`forward`](super::forward), which runs concurrently
//! (bounded by the prefetch window). Source deliveries are acked by the
//! [`settle`] task once their replacement is confirmed.

use super::destinations::Destinations;
use super::forward::{Forwarder, Lanes, Pending};
use super::gate::PublishGate;
use super::health::Health;
use super::prefetch::PrefetchWindow;
use super::session::Fault;
use super::stats::Stats;
use super::tombstones::Tombstones;
use super::{SHUTDOWN_GRACE, SessionError, clock, settle};
use crate::broker::{self, BrokerError, RPC_TIMEOUT, close_channel, timed};
use crate::core::decision::{Action, Context, Delivery, Rules, Source};
use crate::core::placement::{HOLD_BELOW, HOLD_WITH_ROOM, PlacementStrategy};
use crate::core::reasons::exchange_label;
use futures_util::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, Consumer};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info, warn};
pub use crate::tuning::HOLD_ROOM;

/// One source queue's consumer and what it needs.
pub struct Pipeline {
    pub source: Source,
    pub rules: Arc<Rules>,
    pub conn: Arc<Connection>,
    pub publish_conn: Arc<Connection>,
    pub destinations: Arc<Destinations>,
    pub fault: Fault,
    pub stats: Arc<Stats>,
    pub health: Arc<Health>,
    pub tombstones: Arc<Tombstones>,
    pub prefetch: u16,
    pub inflight_bytes: u64,
}

impl Pipeline {
    /// Deliveries this pipeline's window has beyond `prefetch` for holds:
    /// [`HOLD_ROOM`] on the expired queue of a cascade router, else none.
    fn hold_room(&self) -> u16 {
        match (self.source, self.rules.strategy) {
            (Source::Expired, PlacementStrategy::Cascade) => HOLD_ROOM,
            _ => 0,
        }
    }

    /// Consumes until `stop` or a fault (which it raises when it is its own).
    pub async fn run(self, stop: CancellationToken) {
        if let Err(e) = self.consume(stop).await {
            self.fault.raise(e);
        }
    }

    async fn consume(&self, stop: CancellationToken) -> Result<(), SessionError> {
        let queue = self.source.queue(&self.rules.names).clone();
        let consume_ch = broker::channel(&self.conn).await?;
        let lanes =
            Arc::new(Lanes::open(self.publish_conn.clone(), self.rules.bucket_shards()).await?);
        // One consumer at a time takes new deliveries; after a resize of the
        // window the one before drains what it was sent (SelectAll drops it
        // when the broker confirms its cancel). RabbitMQ applies `basic.qos`
        // only to consumers started after it, so resizing means a new consumer.
        let mut consumers = futures_util::stream::SelectAll::new();
        let mut generation = 0u32;
        let mut tag = consumer_tag(self.source, generation);
        let room = self.hold_room();
        let window_max = self.prefetch.saturating_add(room);
        consumers.push(subscribe(&consume_ch, &queue, &tag, window_max).await?);
        info!(queue = %queue, prefetch = window_max, hold_room = room, "consuming");
        self.health.consuming(&self.stats, self.source.name());
        let tracker = TaskTracker::new();
        let mut window = PrefetchWindow::new(window_max, self.inflight_bytes);
        let (settler, settled) = tokio::sync::mpsc::unbounded_channel();
        let abandoned = CancellationToken::new();
        let acks = {
            let (ch, fault) = (consume_ch.clone(), self.fault.clone());
            let abandoned = abandoned.clone();
            tokio::spawn(
                async move {
                    if let Err(e) = settle::run(ch, settled).await {
                        // No ack can be sent: publish nothing more.
                        abandoned.cancel();
                        fault.raise(e.into());
                    }
                }
                .in_current_span(),
            )
        };
        let forwarder = Arc::new(Forwarder {
            rules: self.rules.clone(),
            lanes: lanes.clone(),
            destinations: self.destinations.clone(),
            settler,
            stats: self.stats.clone(),
            gate: PublishGate::new(self.prefetch, self.stats.clone()),
            source: self.source,
            abandoned: abandoned.clone(),
            holding: Default::default(),
        });
        // Made once, not at every delivery: each one registers with its
        // token when first polled and leaves it when dropped.
        let stopped = stop.cancelled();
        let faulted = self.fault.raised();
        tokio::pin!(stopped, faulted);
        let outcome = loop {
            tokio::select! {
                biased;
                () = &mut stopped => break Ok(()),
                () = &mut faulted => break Ok(()),
                next = consumers.next() => match next {
                    Some(Ok(delivery)) => {
                        if let Some(count) = window.observe(delivery.data.len()) {
                            info!(prefetch = count, mean_bytes = delivery.data.len(), "resizing the prefetch window to the byte budget");
                            generation = generation.wrapping_add(1);
                            let old = std::mem::replace(&mut tag, consumer_tag(self.source, generation));
                            forwarder.gate.set_max(count.min(self.prefetch));
                            match subscribe(&consume_ch, &queue, &tag, count).await {
                                Ok(consumer) => consumers.push(consumer),
                                Err(e) => break Err(e.into()),
                            }
                            if let Err(e) = timed(
                                "basic.cancel",
                                RPC_TIMEOUT,
                                consume_ch.basic_cancel(old, BasicCancelOptions::default()),
                            )
                            .await
                            {
                                break Err(e.into());
                            }
                        }
                        let cap = hold_cap(window.current(), self.prefetch);
                        if let Err(e) = self.handle(delivery, &forwarder, &tracker, cap) {
                            break Err(e);
                        }
                    }
                    Some(Err(e)) => break Err(SessionError::ConsumerFailed {
                        queue: queue.to_string(),
                        message: crate::config::redact_text(&e.to_string()),
                    }),
                    None => break Err(SessionError::ConsumerCancelled(queue.to_string())),
                }
            }
        };
        let why = match &outcome {
            Ok(()) if stop.is_cancelled() => "stopping".to_owned(),
            Ok(()) => match self.fault.describe() {
                Some(fault) => format!("broker session lost: {fault}"),
                None => "broker session ending".to_owned(),
            },
            Err(e) => format!("broker session lost: {e}"),
        };
        self.health.stopped(&self.stats, self.source.name(), &why);
        // On a fault the deliveries not yet published stay so: their sources
        // come back from the broker, and a publish now could not be acked
        // (each one would arrive twice). A clean stop finishes them.
        if !(outcome.is_ok() && stop.is_cancelled()) {
            abandoned.cancel();
        }
        // Only a clean stop hands the consumer back: after a fault the
        // connection is going (or gone), and closing it cancels the consumer
        // without waiting on a broker that may not answer.
        if outcome.is_ok() && stop.is_cancelled() {
            let _ = timed(
                "basic.cancel",
                RPC_TIMEOUT,
                consume_ch.basic_cancel(tag, BasicCancelOptions::default()),
            )
            .await;
        }
        tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
            .await
            .is_err()
        {
            warn!("in-flight messages not settled in time; the broker will redeliver them");
        }
        drop(forwarder);
        if tokio::time::timeout(RPC_TIMEOUT, acks).await.is_err() {
            warn!("final acks not sent in time; the broker will redeliver those messages");
        }
        // Unsettled deliveries return to their queue when the channel closes.
        lanes.close().await;
        close_channel(&consume_ch, "bye").await;
        outcome
    }

    /// Decides a delivery's plan and starts carrying it out.
    fn handle(
        &self,
        delivery: lapin::message::Delivery,
        forwarder: &Arc<Forwarder>,
        tracker: &TaskTracker,
        hold_cap: usize,
    ) -> Result<(), SessionError> {
        let now = clock::now();
        let now_ms = now.down_ms();
        let cancelled = match self.source {
            Source::Ingress => {
                self.stats.record_received();
                self.stats.record_received_from(delivery.exchange.as_str());
                false
            }
            Source::Expired => {
                !self.tombstones.is_empty()
                    && delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .is_some_and(|id| self.tombstones.is_cancelled(id.as_str(), now_ms))
            }
        };
        let cx = Context {
            clock: now,
            unit: rand::random::<f64>(),
            frame_max: self.publish_conn.configuration().frame_max(),
            cancelled,
            hold_up_to: hold_up_to(forwarder.holding(), hold_cap),
            refused: forwarder.destinations.as_ref(),
        };
        let d = Delivery {
            source: self.source,
            exchange: delivery.exchange.as_str(),
            routing_key: &delivery.routing_key,
            properties: Cow::Owned(delivery.properties),
            body: &delivery.data,
        };
        forwarder.delivered(delivery.delivery_tag)?;
        let plan = self.rules.decide(d, &cx);
        if let (Source::Expired, Action::Deliver { due_ms, .. }) =
            (self.source, &plan.action)
        {
            self.stats.record_return(now_ms - due_ms);
        }
        forwarder.hold(&plan);
        log_decision(&plan.action, delivery.redelivered);
        // A cancel request's tombstone carries no body.
        let data = match plan.action {
            Action::Cancel { .. } => Vec::new(),
            _ => delivery.data,
        };
        let pending = Pending {
            tag: delivery.delivery_tag,
            data: Arc::new(data),
            plan,
        };
        let forwarder = forwarder.clone();
        let fault = self.fault.clone();
        let stats = self.stats.clone();
        stats.in_flight(1);
        // Boxed: the future is large, and tokio moves it several times
        // on its way into the task.
        tracker.spawn(Box::pin(
            async move {
                match forwarder.forward(pending).await {
                    Ok(()) => {}
                    // The session is ending on a fault; the broker redelivers it.
                    Err(SessionError::Abandoned) => stats.record_abandoned(),
                    // Confirmed, but the consuming channel is gone: the source
                    // comes back and is sent again (one line per session, from
                    // the settler's own error, is enough).
                    Err(e @ SessionError::SettlerStopped) => {
                        debug!("replacement confirmed, source not acked: the settler stopped");
                        fault.raise(e);
                    }
                    Err(e) => {
                        error!(error = %e, "publish not confirmed; the source message stays unacked and will be redelivered");
                        fault.raise(e);
                    }
                }
                stats.in_flight(-1);
            }
            .in_current_span(),
        ));
        Ok(())
    }
}

/// The consumer tag of a pipeline's `generation`th consumer (one more per
/// resize of the window).
fn consumer_tag(source: Source, generation: u32) -> ShortString {
    match generation {
        0 => format!("delay-router-{}", source.name()).into(),
        n => format!("delay-router-{}-{n}", source.name()).into(),
    }
}

/// Starts a consumer of `queue` on `ch` with a window of `prefetch` deliveries.
async fn subscribe(
    ch: &Channel,
    queue: &ShortString,
    tag: &ShortString,
    prefetch: u16,
) -> Result<Consumer, BrokerError> {
    timed(
        "basic.qos",
        RPC_TIMEOUT,
        ch.basic_qos(prefetch, BasicQosOptions::default()),
    )
    .await?;
    timed(
        &format!("basic.consume {queue}"),
        RPC_TIMEOUT,
        ch.basic_consume(
            queue.clone(),
            tag.clone(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
}

/// How much of a cascade's last fraction the router times itself: up to
/// [`HOLD_WITH_ROOM`] while it holds fewer than `cap` deliveries
/// ([`hold_cap`]), so held deliveries never stall the consumer; else only
/// what no bucket can time ([`HOLD_BELOW`]).
fn hold_up_to(holding: usize, cap: usize) -> Duration {
    if holding < cap {
        HOLD_WITH_ROOM
    } else {
        HOLD_BELOW
    }
}

/// How many deliveries a pipeline may hold with a window of `window`
/// deliveries, `prefetch` of them for the flow: what the window has beyond
/// `prefetch` (the hold room, [`HOLD_ROOM`] on the expired queue), and at least
/// half of it (a window shrunk to the byte budget, or a pipeline without
/// room), so that the flow keeps at least half of the window.
fn hold_cap(window: u16, prefetch: u16) -> usize {
    let window = usize::from(window);
    window.saturating_sub(usize::from(prefetch)).max(window / 2)
}

/// One line per decision; the message id (the sender's, or the one derived
/// at ingress) lets an operator follow a message through the buckets.
fn log_decision(action: &Action, redelivered: bool) {
    let id = action
        .properties()
        .message_id()
        .as_ref()
        .map_or("", |id| id.as_str());
    match action {
        Action::Wait { queue, ttl, .. } => debug!(
            message_id = id,
            redelivered,
            bucket = %queue,
            ttl_ms = ttl.as_millis() as u64,
            "placed"
        ),
        Action::Deliver {
            destination, after, ..
        } => debug!(
            message_id = id,
            redelivered,
            exchange = exchange_label(destination.exchange.as_str()),
            routing_key = %destination.routing_key,
            hold_ms = after.as_millis() as u64,
            "delivering"
        ),
        Action::Park { reason, .. } => {
            warn!(message_id = id, redelivered, reason = %reason, "parking message")
        }
        Action::Cancel { message_id, .. } => {
            info!(message_id = %message_id, redelivered, "cancel requested: writing a tombstone")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expired_queue_holds_up_to_its_room_and_the_flow_keeps_the_prefetch() {
        let window = 500 + HOLD_ROOM;
        assert_eq!(hold_cap(window, 500), usize::from(HOLD_ROOM));
        assert_eq!(hold_up_to(1_999, hold_cap(window, 500)), HOLD_WITH_ROOM);
        assert_eq!(hold_up_to(2_000, hold_cap(window, 500)), HOLD_BELOW);
    }

    #[test]
    fn without_room_a_pipeline_holds_up_to_half_of_its_window() {
        assert_eq!(hold_cap(500, 500), 250);
        assert_eq!(hold_up_to(249, hold_cap(500, 500)), HOLD_WITH_ROOM);
        assert_eq!(hold_up_to(250, hold_cap(500, 500)), HOLD_BELOW);
    }

    #[test]
    fn a_window_shrunk_to_the_byte_budget_keeps_half_for_the_flow() {
        // 64 MiB of 100 KiB messages: 655 deliveries, 500 of them the prefetch.
        assert_eq!(hold_cap(655, 500), 327);
        assert_eq!(hold_cap(1, 500), 0);
        assert_eq!(hold_cap(u16::MAX, u16::MAX), usize::from(u16::MAX) / 2);
    }
}
