//! The decision: what happens to one delivery, decided once.
//!
//! [`Rules::decide`] is a pure function of a delivery (where it came from,
//! the exchange and routing key it was published with, its properties and
//! body), the clock, a random draw and the connection's `frame_max`. It
//! returns the whole [`Plan`]: the message-id stamped at ingress, the one
//! publish to make (to a bucket, the destination or the park) with
//! properties that fit a frame and that the broker takes from the router's
//! user, how long to hold it first, and for a delivery what becomes of it if
//! the destination does not take it ([`Plan::failed`]: NO_ROUTE, a nack, a
//! refusal in the broker's words). The shell carries plans out and never
//! asks the core again.

mod guards;
mod ingress;
mod plan;

pub use plan::{Action, Plan, Waiting};

use crate::core::cancel;
use crate::core::clock::Clock;
use crate::core::contract::{self, Destination};
use crate::core::delayed::{self, DelayedExchange};
use crate::core::envelope::{self, Overrides, Transit, TransitFormat};
use crate::core::identity;
use crate::core::ladder::Ladder;
use crate::core::parking::{self, Failure};
use crate::core::placement::{self, Placement, PlacementStrategy};
use crate::core::reasons::{self, ParkReason};
use crate::core::retry::Policy;
use crate::core::security::AllowList;
use crate::core::topology::{self, Names, QueueType, Topology};
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use std::borrow::Cow;
use std::time::Duration;

/// Which of the router's queues a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `<prefix>.ingress`: published to the router exchange, or dead-lettered
    /// there by a work queue whose consumer rejected it.
    Ingress,
    /// `<prefix>.expired`: dead-lettered by a bucket when its TTL ran out.
    Expired,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Expired => "expired",
        }
    }

    /// Every source, in the order the router consumes them.
    pub const ALL: [Source; 2] = [Source::Ingress, Source::Expired];

    /// The queue this source is.
    pub fn queue(self, names: &Names) -> &ShortString {
        match self {
            Self::Ingress => &names.ingress,
            Self::Expired => &names.expired,
        }
    }
}

/// One delivery as the core sees it.
#[derive(Debug, Clone)]
pub struct Delivery<'a> {
    pub source: Source,
    /// The exchange and routing key it was published with.
    pub exchange: &'a str,
    pub routing_key: &'a ShortString,
    /// Owned when the caller can give them up: the outgoing properties are
    /// then built from them without a copy.
    pub properties: Cow<'a, BasicProperties>,
    pub body: &'a [u8],
}

/// What a decision depends on besides the delivery and the rules.
#[derive(Debug, Clone, Copy)]
pub struct Context<'r> {
    /// Now: deadlines are stamped from it rounded up and compared with it
    /// rounded down ([`Clock`]).
    pub clock: Clock,
    /// A random number in `[0, 1)`, for retry jitter and the choice of a
    /// rung's queue.
    pub unit: f64,
    /// The publishing connection's negotiated frame size.
    pub frame_max: u32,
    /// The delivery's message-id has a live tombstone (expired only).
    pub cancelled: bool,
    /// Under cascade the router times what is left below this itself:
    /// [`placement::HOLD_WITH_ROOM`] while it holds few deliveries,
    /// [`placement::HOLD_BELOW`] when it holds many.
    pub hold_up_to: Duration,
    /// The destinations the broker refused lately: a delivery to one is
    /// parked without a publish.
    pub refused: &'r dyn Refusals,
}

impl Context<'static> {
    /// A decision at `clock` with nothing else known: a unit of 0, a frame of
    /// 128 KiB, no tombstone, holding below [`placement::HOLD_BELOW`], no
    /// refusal remembered.
    pub fn at(clock: Clock) -> Self {
        Self {
            clock,
            unit: 0.0,
            frame_max: 131_072,
            cancelled: false,
            hold_up_to: placement::HOLD_BELOW,
            refused: &NoRefusals,
        }
    }
}

/// What the shell remembers of destinations the broker refused (a missing
/// exchange, a forbidden routing key): an input of the decision, so a burst
/// to a refused destination is parked without costing a channel each.
pub trait Refusals: std::fmt::Debug + Sync {
    /// The refusal of `destination` remembered now, as the failure it stands for.
    fn refusal(&self, destination: &Destination) -> Option<Failure>;
}

/// Nothing refused.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRefusals;

impl Refusals for NoRefusals {
    fn refusal(&self, _: &Destination) -> Option<Failure> {
        None
    }
}

/// Everything a decision depends on from the configuration.
#[derive(Debug, Clone)]
pub struct Rules {
    /// The strategy's effective ladder (cascade adds finer rungs).
    pub ladder: Ladder,
    pub strategy: PlacementStrategy,
    pub names: Names,
    /// The AMQP user the router publishes as.
    pub router_user: String,
    /// Retry policies for rejected messages, first match wins.
    pub policies: Vec<Policy>,
    /// Classic or quorum queues.
    pub queue_type: QueueType,
    /// `x-queue-version` of the classic queues (`None`: the broker's default).
    pub classic_version: Option<u8>,
    /// `[security] allow_destinations`; `None` allows every exchange.
    pub allow: Option<AllowList>,
    /// How long a tombstone lives (`[cancel] keep`).
    pub cancel_keep: Duration,
    /// How transit is written into bucket messages (built in: compact).
    pub transit_format: TransitFormat,
    /// The delayed-message-exchange plugin's exchanges the router serves
    /// (`[[delayed_exchange]]`).
    pub delayed: Vec<DelayedExchange>,
    /// Queues a rung has; `None`: the queue type's default.
    bucket_shards: Option<u8>,
    /// Each rung's bucket queue names, shard 0 first, made by [`Rules::new`]
    /// and again when the queue type or the shards change (not a `format!`
    /// per placement); `ladder`, `strategy` and
    /// `names` are read, never changed after it.
    bucket_queues: Vec<Vec<ShortString>>,
}

impl Rules {
    /// The rules for a configured ladder and strategy.
    pub fn new(
        ladder: &Ladder,
        strategy: PlacementStrategy,
        prefix: &str,
        router_user: &str,
    ) -> Self {
        let ladder = placement::effective_ladder(strategy, ladder);
        let names = Names::new(prefix);
        let mut rules = Self {
            ladder,
            strategy,
            names,
            router_user: router_user.to_owned(),
            policies: Vec::new(),
            queue_type: QueueType::Classic,
            classic_version: None,
            allow: None,
            cancel_keep: topology::DEFAULT_CANCEL_KEEP,
            transit_format: TransitFormat::default(),
            delayed: Vec::new(),
            bucket_shards: None,
            bucket_queues: Vec::new(),
        };
        rules.name_buckets();
        rules
    }

    /// Queues a rung has: as set, else the queue
    /// type's default ([`topology::default_bucket_shards`]).
    pub fn bucket_shards(&self) -> u8 {
        self.bucket_shards
            .unwrap_or_else(|| topology::default_bucket_shards(self.queue_type))
            .max(1)
    }

    fn name_buckets(&mut self) {
        let shards = self.bucket_shards();
        self.bucket_queues = self
            .ladder
            .rungs()
            .iter()
            .map(|r| {
                (0..shards)
                    .map(|s| self.names.bucket_shard(self.strategy, r, s))
                    .collect()
            })
            .collect();
    }

    /// The same rules with `shards` queues a rung (`None`: the queue type's default).
    pub fn with_bucket_shards(mut self, shards: Option<u8>) -> Self {
        self.bucket_shards = shards;
        self.name_buckets();
        self
    }

    /// The same rules writing transit in `format`.
    pub fn with_transit_format(mut self, format: TransitFormat) -> Self {
        self.transit_format = format;
        self
    }

    /// The same rules keeping tombstones for `keep`.
    pub fn with_cancel_keep(mut self, keep: Duration) -> Self {
        self.cancel_keep = keep;
        self
    }

    /// The same rules delivering only to exchanges `allow` lets through.
    pub fn with_allow_list(mut self, allow: Option<AllowList>) -> Self {
        self.allow = allow;
        self
    }

    /// The same rules declaring queues of `queue_type` (and, unless
    /// configured, its number of queues a rung).
    pub fn with_queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self.name_buckets();
        self
    }

    /// The same rules declaring classic queues with `x-queue-version`.
    pub fn with_classic_version(mut self, version: Option<u8>) -> Self {
        self.classic_version = version;
        self
    }

    /// The same rules serving the plugin's exchanges `delayed`.
    pub fn with_delayed_exchanges(mut self, delayed: Vec<DelayedExchange>) -> Self {
        self.delayed = delayed;
        self
    }

    /// The same rules with retry policies.
    pub fn with_policies(mut self, policies: Vec<Policy>) -> Self {
        self.policies = policies;
        self
    }

    /// The rules a configuration describes. With `queue_type = "auto"` they
    /// declare quorum queues, what a new prefix gets: whoever declares
    /// (the router's supervisor, `delay-router declare`) first asks the
    /// broker what an existing prefix has
    /// (`broker::declare::existing_queue_type`) and sets it with
    /// [`Rules::with_queue_type`].
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self::new(
            &config.ladder,
            config.strategy,
            &config.prefix,
            config.url.username(),
        )
        .with_policies(config.policies.clone())
        .with_delayed_exchanges(config.delayed_exchanges.clone())
        .with_bucket_shards(config.bucket_shards)
        .with_queue_type(config.queue_type.fixed().unwrap_or(QueueType::Quorum))
        .with_classic_version(config.classic_queue_version)
        .with_allow_list(config.allow_destinations.clone())
        .with_cancel_keep(config.cancel_keep)
        .with_transit_format(config.transit_format)
    }

    /// What these rules declare.
    pub fn topology(&self) -> Topology {
        Topology::new(
            &self.names,
            self.strategy,
            self.queue_type,
            &self.ladder,
            self.bucket_shards(),
        )
        .with_cancel_keep(self.cancel_keep)
        .with_classic_version(self.classic_version)
        .with_delayed_exchanges(self.delayed.clone())
    }

    /// The whole plan for one delivery (see the module documentation).
    pub fn decide(&self, d: Delivery<'_>, cx: &Context) -> Plan {
        // Quorum queues add x-delivery-count (and from 4.0 x-acquired-count)
        // when they redeliver; they count that queue's deliveries, not the
        // sender's, so they go.
        let props = match self.queue_type {
            QueueType::Quorum => match envelope::without_redelivery_headers(&d.properties) {
                Some(received) => Cow::Owned(received),
                None => d.properties,
            },
            QueueType::Classic => d.properties,
        };
        let mut retry_policy = None;
        let mut waiting = None;
        let action = match d.source {
            Source::Ingress => match self.delayed.iter().find(|x| x.name.as_str() == d.exchange) {
                Some(plugin) => {
                    let sender = identity::ensure_message_id(
                        props,
                        d.exchange,
                        d.routing_key.as_str(),
                        d.body,
                    );
                    let action = self.admit_delayed(
                        plugin,
                        d.routing_key,
                        &sender,
                        cx.clock,
                        cx.unit,
                        cx.hold_up_to,
                    );
                    let action = self.within_frame(
                        action,
                        || sender.into_owned(),
                        cx.clock.down_ms(),
                        cx.frame_max,
                    );
                    if matches!(action, Action::Wait { .. }) {
                        waiting = Some(Waiting::Enter(self.names.waiting(plugin.name.as_str())));
                    }
                    action
                }
                None => match self.cancel_request(&props, d.exchange, cx.clock.up_ms()) {
                    Some(action) => action,
                    None => {
                        let sender = identity::ensure_message_id(
                            props,
                            d.exchange,
                            d.routing_key.as_str(),
                            d.body,
                        );
                        let (action, policy) = self.admit_and_schedule(
                            d.routing_key,
                            &sender,
                            cx.clock,
                            cx.unit,
                            cx.hold_up_to,
                        );
                        retry_policy = policy;
                        self.within_frame(
                            action,
                            || sender.into_owned(),
                            cx.clock.down_ms(),
                            cx.frame_max,
                        )
                    }
                },
            },
            Source::Expired => {
                // Only a router serving plugin exchanges looks for the mark.
                let counted = (!self.delayed.is_empty())
                    .then(|| delayed::counted_for(&props))
                    .flatten()
                    .and_then(|name| self.delayed.iter().find(|x| x.name.as_str().as_bytes() == name));
                let action = if cx.cancelled {
                    cancelled(&props, cx.clock.down_ms())
                } else {
                    self.expired_holding(&props, cx.clock.down_ms(), cx.hold_up_to, cx.unit)
                };
                let sender = || envelope::sender_properties(&props);
                let action = self.within_frame(action, sender, cx.clock.down_ms(), cx.frame_max);
                // Delivered or parked, it leaves the buckets and its count.
                if let Some(x) = counted
                    && matches!(action, Action::Deliver { .. } | Action::Park { .. })
                {
                    waiting = Some(Waiting::Leave(self.names.waiting(x.name.as_str())));
                }
                action
            }
        };
        Plan {
            action,
            decided_ms: cx.clock.down_ms(),
            frame_max: cx.frame_max,
            retry_policy,
            waiting,
        }
        .checked(cx.refused)
    }

    /// A message published to the control exchange: a tombstone for the
    /// stream, or parked when it is no cancel request or its id is
    /// unreadable. A cancel request published anywhere else is parked: only
    /// those who may write to the control exchange cancel. `None` for other
    /// messages. A message a work queue rejected (it has `x-death`) is never
    /// one: it goes on as a retry whatever its headers say.
    fn cancel_request(&self, p: &BasicProperties, exchange: &str, now_ms: i64) -> Option<Action> {
        let refused = |why: String| {
            let reason = ParkReason::InvalidCancel(why);
            Action::Park {
                properties: parking::park(p, &reason, now_ms, None),
                reason,
            }
        };
        let control = self.names.control.as_str();
        let empty = FieldTable::default();
        let headers = p.headers().as_ref().unwrap_or(&empty);
        let on_control = exchange == control;
        let request = match contract::cancel_request(headers) {
            None if on_control => {
                return Some(refused(format!(
                    "a message on the control exchange '{control}' without {}",
                    contract::CANCEL_MESSAGE_ID
                )));
            }
            None => return None,
            Some(_) if !on_control && headers.contains_key("x-death") => return None,
            Some(_) if !on_control => {
                return Some(refused(format!(
                    "cancel requests go to the control exchange '{control}', not '{}'",
                    reasons::exchange_label(exchange)
                )));
            }
            Some(request) => request,
        };
        Some(match request {
            Ok(id) if id.as_str().is_empty() => {
                refused(format!("{} is empty", contract::CANCEL_MESSAGE_ID))
            }
            Ok(message_id) => {
                let keep_ms = i64::try_from(self.cancel_keep.as_millis()).unwrap_or(i64::MAX);
                Action::Cancel {
                    properties: cancel::tombstone(&message_id, now_ms.saturating_add(keep_ms)),
                    message_id,
                }
            }
            Err(e) => refused(e.to_string()),
        })
    }

    /// Places a message with `transit` in a bucket (the rung's queue that
    /// `unit`, in `[0, 1)`, picks among its shards), or delivers it when due.
    /// `remaining` is how long it still has to wait: at ingress the delay
    /// as requested, after a bucket the time to its deadline.
    fn schedule(
        &self,
        p: &BasicProperties,
        mut transit: Transit,
        remaining: Duration,
        entering: bool,
        hold_up_to: Duration,
        unit: f64,
    ) -> Action {
        let deliver = |after| Action::Deliver {
            properties: if entering {
                p.clone()
            } else {
                envelope::leave_transit(p)
            },
            destination: transit.destination.clone(),
            after,
            due_ms: transit.deadline_ms,
            hops: u32::try_from(transit.hops.max(0)).unwrap_or(u32::MAX),
        };
        match placement::place_or_hold(self.strategy, &self.ladder, remaining, hold_up_to) {
            None => deliver(Duration::ZERO),
            Some(Placement::Hold(after)) => deliver(after),
            Some(Placement::Bucket {
                rung,
                expiration,
                priority,
            }) => {
                // The hops come from headers a sender could have written.
                transit.hops = transit.hops.saturating_add(1);
                let shards = &self.bucket_queues[rung];
                // `as` saturates: a unit out of range still names a shard.
                let shard = ((unit * shards.len() as f64) as usize).min(shards.len() - 1);
                let queue = shards[shard].clone();
                let rung = &self.ladder.rungs()[rung];
                debug_assert_eq!(
                    queue,
                    self.names.bucket_shard(self.strategy, rung, shard as u8)
                );
                let ttl = rung.ttl;
                let o = Overrides {
                    expiration,
                    priority,
                    format: self.transit_format,
                };
                let properties = if entering {
                    envelope::enter_transit(p, &transit, o)
                } else {
                    envelope::next_hop(p, &transit, o)
                };
                Action::Wait {
                    queue,
                    shard: shard as u8,
                    ttl,
                    properties,
                }
            }
        }
    }

    /// A message a bucket dead-lettered into the router's expired queue: on to the next bucket, held for what is left below
    /// `hold_up_to`, or delivered.
    fn expired_holding(
        &self,
        p: &BasicProperties,
        now_ms: i64,
        hold_up_to: Duration,
        unit: f64,
    ) -> Action {
        match envelope::read_transit(p) {
            Ok(transit) => {
                let remaining = time_to(transit.deadline_ms, now_ms);
                let action = self.schedule(p, transit, remaining, false, hold_up_to, unit);
                self.publishable(action, now_ms)
            }
            Err(e) => {
                let reason = ParkReason::NotInTransit(e.to_string());
                Action::Park {
                    properties: parking::park(p, &reason, now_ms, None),
                    reason,
                }
            }
        }
    }
}

/// The time from `now_ms` to `deadline_ms`; zero once it has passed.
fn time_to(deadline_ms: i64, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(deadline_ms.saturating_sub(now_ms)).unwrap_or(0))
}

/// A message whose message-id was cancelled, out of a bucket: parked with
/// the reason, its destination kept (`parked replay` can still send it).
fn cancelled(p: &BasicProperties, now_ms: i64) -> Action {
    let id = p.message_id().as_ref().map_or("", |id| id.as_str());
    let reason = ParkReason::Cancelled(id.to_owned());
    let destination = envelope::read_transit(p).ok().map(|t| t.destination);
    Action::Park {
        properties: parking::park(
            &envelope::sender_properties(p),
            &reason,
            now_ms,
            destination.as_ref(),
        ),
        reason,
    }
}

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod frame_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod rung_tests;
#[cfg(test)]
mod tests;
