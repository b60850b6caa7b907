//! Decisions: what the router does with a message arriving at ingress or
//! expiring from a bucket. Pure functions of the message, the plan and the clock.

use crate::contract::{self, Destination, REQUESTED_DELAY};
use crate::envelope::{self, Overrides, Transit};
use crate::ladder::Ladder;
use crate::park::ParkReason;
use crate::placement::{self, Placement, Strategy};
use crate::retry::{self, ATTEMPTS, FIRST_FAILURE, LAST_FAILURE, Policy, Rejection, SOURCE_QUEUE};
use crate::topology::{Names, QueueType};
use crate::wire;
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use lapin::types::{FieldTable, ShortString};
use std::time::Duration;

/// Everything a decision depends on besides the message and the clock.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The strategy's effective ladder (cascade adds finer rungs).
    pub ladder: Ladder,
    pub strategy: Strategy,
    pub names: Names,
    /// The AMQP user the router publishes as; RabbitMQ rejects a `user-id` property that differs.
    pub router_user: String,
    /// Retry policies for rejected messages, first match wins.
    pub policies: Vec<Policy>,
    /// Classic or quorum queues.
    pub queue_type: QueueType,
}

/// A message the router will not place: parked with this reason, the
/// destination when known, and the properties to park it with.
#[derive(Debug)]
struct Refusal {
    reason: ParkReason,
    destination: Option<Destination>,
    properties: BasicProperties,
}

fn refuse(
    reason: ParkReason,
    destination: Option<Destination>,
    p: &BasicProperties,
) -> Box<Refusal> {
    Box::new(Refusal {
        reason,
        destination,
        properties: p.clone(),
    })
}

/// What to do with one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish to a bucket queue (default exchange, routing key = queue).
    Wait {
        queue: ShortString,
        ttl: Duration,
        properties: BasicProperties,
    },
    /// Publish to the destination, `mandatory`, with the sender's properties,
    /// after holding it `after` (cascade's last fraction; zero otherwise).
    Deliver {
        destination: Destination,
        properties: BasicProperties,
        after: Duration,
    },
    /// Publish to the parking queue.
    Park {
        reason: ParkReason,
        properties: BasicProperties,
    },
}

impl Plan {
    /// The plan for a configured ladder and strategy.
    pub fn new(ladder: &Ladder, strategy: Strategy, prefix: &str, router_user: &str) -> Self {
        Self {
            ladder: placement::effective_ladder(strategy, ladder),
            strategy,
            names: Names::new(prefix),
            router_user: router_user.to_owned(),
            policies: Vec::new(),
            queue_type: QueueType::Classic,
        }
    }

    /// The same plan declaring queues of `queue_type`.
    pub fn with_queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self
    }

    /// The plan a configuration describes.
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self::new(
            &config.ladder,
            config.strategy,
            &config.prefix,
            config.url.username(),
        )
        .with_policies(config.policies.clone())
        .with_queue_type(config.queue_type)
    }

    /// The same plan with retry policies.
    pub fn with_policies(mut self, policies: Vec<Policy>) -> Self {
        self.policies = policies;
        self
    }

    /// The bucket queues this plan uses, with their declare arguments.
    pub fn bucket_queues(&self) -> Vec<(ShortString, FieldTable)> {
        self.names
            .buckets(self.strategy, &self.ladder)
            .map(|(q, rung)| {
                (
                    q,
                    crate::topology::bucket_arguments(
                        &self.names,
                        self.strategy,
                        self.queue_type,
                        rung,
                    ),
                )
            })
            .collect()
    }

    /// A delivery from the router's own queues as the router should see it:
    /// quorum queues add `x-delivery-count` when they redeliver, which is
    /// removed (`None`: nothing to change).
    pub fn received(&self, p: &BasicProperties) -> Option<BasicProperties> {
        match self.queue_type {
            QueueType::Quorum => envelope::without_delivery_count(p),
            QueueType::Classic => None,
        }
    }

    /// A message published to the router exchange (or dead-lettered into it
    /// by a work queue whose consumer rejected it). `unit` is a random number
    /// in `[0, 1)` for retry jitter.
    pub fn on_ingress(
        &self,
        routing_key: &ShortString,
        p: &BasicProperties,
        now_ms: i64,
        unit: f64,
    ) -> Action {
        match self.admit(routing_key, p, now_ms, unit) {
            Ok((transit, p)) => self.schedule(&p, transit, now_ms, true),
            Err(r) => Action::Park {
                properties: envelope::park(
                    &r.properties,
                    &r.reason,
                    now_ms,
                    r.destination.as_ref(),
                ),
                reason: r.reason,
            },
        }
    }

    fn admit(
        &self,
        routing_key: &ShortString,
        p: &BasicProperties,
        now_ms: i64,
        unit: f64,
    ) -> Result<(Transit, BasicProperties), Box<Refusal>> {
        let empty = FieldTable::default();
        let headers = p.headers().as_ref().unwrap_or(&empty);
        let explicit = headers.inner().get(REQUESTED_DELAY);
        let rejection = match retry::newest_rejection(headers) {
            Ok(r) => r,
            // A sender's odd x-death does not matter when it says what it wants.
            Err(_) if explicit.is_some() => None,
            Err(e) => return Err(refuse(ParkReason::InvalidDeath(e), None, p)),
        };
        let (destination, p, policy_delay) = match rejection {
            Some(rejection) => {
                let (destination, p, delay) = self.retry(&rejection, headers, p, now_ms, unit)?;
                (destination, p, delay)
            }
            None => {
                let destination = contract::requested_destination(headers, routing_key)
                    .map_err(|e| refuse(ParkReason::InvalidDestination(e), None, p))?;
                (destination, count_attempt(p, now_ms), None)
            }
        };
        let park = |reason| refuse(reason, Some(destination.clone()), &p);
        if destination.exchange.as_str() == self.names.router_exchange.as_str() {
            return Err(park(ParkReason::DestinationIsRouter(
                destination.exchange.to_string(),
            )));
        }
        if let Some(user_id) = p.user_id()
            && user_id.as_str() != self.router_user
        {
            return Err(park(ParkReason::UserIdMismatch {
                user_id: user_id.to_string(),
                router_user: self.router_user.clone(),
            }));
        }
        let delay = match (explicit, policy_delay) {
            (Some(v), _) => {
                contract::parse_delay(v).map_err(|e| park(ParkReason::InvalidDelay(e)))?
            }
            (None, Some(d)) => d,
            (None, None) => return Err(park(ParkReason::MissingDelay)),
        };
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        let transit = Transit {
            destination,
            deadline_ms: now_ms.saturating_add(delay_ms),
            hops: 0,
        };
        Ok((transit, p))
    }

    /// The zero-code path: a message a work queue's consumer rejected goes back
    /// to exactly that queue, after its policy's delay, until the policy gives up.
    fn retry(
        &self,
        rejection: &Rejection,
        headers: &FieldTable,
        p: &BasicProperties,
        now_ms: i64,
        unit: f64,
    ) -> Result<(Destination, BasicProperties, Option<Duration>), Box<Refusal>> {
        let queue = ShortString::try_new(rejection.queue.as_str()).map_err(|_| {
            let too_long = contract::DestinationError::TooLong {
                header: "x-death queue",
                len: rejection.queue.len(),
            };
            refuse(ParkReason::InvalidDestination(too_long), None, p)
        })?;
        let destination = Destination {
            exchange: "".into(),
            routing_key: queue,
        };
        let failures = attempts(headers).saturating_add(1);
        let p = record_failure(p, failures, now_ms, Some(&rejection.queue));
        let policy = retry::find(&self.policies, &rejection.queue);
        match policy {
            Some(policy) if policy.exhausted(failures) => Err(refuse(
                ParkReason::RetriesExhausted {
                    queue: rejection.queue.clone(),
                    policy: policy.queue.clone(),
                    attempts: failures,
                    max: policy.max_attempts,
                },
                Some(destination),
                &p,
            )),
            Some(policy) => Ok((destination, p, Some(policy.delay(failures, unit)))),
            None if headers.contains_key(REQUESTED_DELAY) => Ok((destination, p, None)),
            None => Err(refuse(
                ParkReason::NoPolicy(rejection.queue.clone()),
                Some(destination),
                &p,
            )),
        }
    }

    /// Places a message with `transit` in a bucket, or delivers it when due.
    fn schedule(
        &self,
        p: &BasicProperties,
        mut transit: Transit,
        now_ms: i64,
        entering: bool,
    ) -> Action {
        let remaining = Duration::from_millis(
            u64::try_from(transit.deadline_ms.saturating_sub(now_ms)).unwrap_or(0),
        );
        let deliver = |after| Action::Deliver {
            properties: if entering {
                p.clone()
            } else {
                envelope::leave_transit(p)
            },
            destination: transit.destination.clone(),
            after,
        };
        match placement::place(self.strategy, &self.ladder, remaining) {
            None => deliver(Duration::ZERO),
            Some(Placement::Hold(after)) => deliver(after),
            Some(Placement::Bucket {
                rung,
                expiration,
                priority,
            }) => {
                transit.hops += 1;
                let rung = &self.ladder.rungs()[rung];
                let o = Overrides {
                    expiration,
                    priority,
                };
                let properties = if entering {
                    envelope::enter_transit(p, &transit, o)
                } else {
                    envelope::next_hop(p, &transit, o)
                };
                Action::Wait {
                    queue: self.names.bucket(self.strategy, rung),
                    ttl: rung.ttl,
                    properties,
                }
            }
        }
    }

    /// A message a bucket dead-lettered into the router's expired queue.
    pub fn on_expired(&self, p: &BasicProperties, now_ms: i64) -> Action {
        match envelope::read_transit(p) {
            Ok(transit) => self.schedule(p, transit, now_ms, false),
            Err(e) => {
                let reason = ParkReason::NotInTransit(e.to_string());
                Action::Park {
                    properties: envelope::park(p, &reason, now_ms, None),
                    reason,
                }
            }
        }
    }

    /// A message whose delivery failed at the destination: parked with the
    /// sender's properties restored.
    pub fn on_delivery_failed(
        &self,
        delivered: &BasicProperties,
        destination: &Destination,
        reason: ParkReason,
        now_ms: i64,
    ) -> Action {
        Action::Park {
            properties: envelope::park(delivered, &reason, now_ms, Some(destination)),
            reason,
        }
    }
}

impl Action {
    /// The properties this action publishes with.
    pub fn properties(&self) -> &BasicProperties {
        match self {
            Self::Wait { properties, .. }
            | Self::Deliver { properties, .. }
            | Self::Park { properties, .. } => properties,
        }
    }
}

impl Plan {
    /// Keeps `action` within one content-header frame of `frame_max` bytes.
    /// AMQP cannot split a header, and the broker closes the whole connection
    /// on a larger frame, so publishing such a message would fail on every
    /// redelivery. A message whose headers no longer fit once the router adds
    /// its own is parked from `sender` (the sender's properties, as they
    /// arrived) with a reason; if even that copy does not fit, the sender's
    /// largest headers are removed, each named in the reason.
    pub fn within_frame(
        &self,
        action: Action,
        sender: impl FnOnce() -> BasicProperties,
        now_ms: i64,
        frame_max: u32,
    ) -> Action {
        if wire::fits(action.properties(), frame_max) {
            return action;
        }
        let sender = &sender();
        let bytes = wire::header_frame_len(action.properties()).unwrap_or(usize::MAX);
        let too_large = ParkReason::HeadersTooLarge { bytes, frame_max };
        let (reason, destination) = match action {
            Action::Park {
                reason, properties, ..
            } => (reason, envelope::parked_destination(&properties)),
            Action::Deliver { destination, .. } => (too_large, Some(destination)),
            Action::Wait { properties, .. } => (
                too_large,
                envelope::read_transit(&properties)
                    .ok()
                    .map(|t| t.destination),
            ),
        };
        for destination in [destination.as_ref(), None] {
            let properties = envelope::park(sender, &reason, now_ms, destination);
            if wire::fits(&properties, frame_max) {
                return Action::Park { reason, properties };
            }
        }
        let mut headers = sender
            .headers()
            .as_ref()
            .map(|h| h.inner().clone())
            .unwrap_or_default();
        let mut removed = Vec::new();
        while let Some((name, size)) = largest_header(&headers) {
            headers.remove(&name);
            removed.push((name.to_string(), size));
            let reason = ParkReason::HeadersRemoved {
                reason: Box::new(reason.clone()),
                frame_max,
                removed: removed.clone(),
            };
            let properties = envelope::park(
                &sender.clone().with_headers(headers.clone().into()),
                &reason,
                now_ms,
                None,
            );
            if wire::fits(&properties, frame_max) || headers.is_empty() {
                return Action::Park { reason, properties };
            }
        }
        // No headers at all and still too large: cannot happen for properties
        // that arrived in a frame (their other fields are at most a few KB).
        let reason = ParkReason::HeadersRemoved {
            reason: Box::new(reason),
            frame_max,
            removed,
        };
        Action::Park {
            properties: envelope::park(sender, &reason, now_ms, None),
            reason,
        }
    }
}

/// The header whose removal saves the most bytes, with its encoded size.
fn largest_header(
    headers: &std::collections::BTreeMap<ShortString, AMQPValue>,
) -> Option<(ShortString, usize)> {
    headers
        .iter()
        .map(|(k, v)| {
            let mut one = FieldTable::default();
            one.insert(k.clone(), v.clone());
            let size = wire::encode_properties(&BasicProperties::default().with_headers(one))
                .map_or(usize::MAX, |b| b.len());
            (k.clone(), size)
        })
        .max_by_key(|(_, size)| *size)
}

/// Failures counted so far by the router's own header.
fn attempts(headers: &FieldTable) -> u32 {
    contract::integer(headers, ATTEMPTS)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

/// Records failure number `failures` on the message itself: these headers stay
/// on delivery, so the next failure counts on from them.
fn record_failure(
    p: &BasicProperties,
    failures: u32,
    now_ms: i64,
    queue: Option<&str>,
) -> BasicProperties {
    let mut h = p.headers().clone().unwrap_or_default();
    h.insert(ATTEMPTS.into(), AMQPValue::LongLongInt(i64::from(failures)));
    if contract::integer(&h, FIRST_FAILURE).is_none() {
        h.insert(FIRST_FAILURE.into(), AMQPValue::LongLongInt(now_ms));
    }
    h.insert(LAST_FAILURE.into(), AMQPValue::LongLongInt(now_ms));
    if let Some(queue) = queue {
        h.insert(SOURCE_QUEUE.into(), AMQPValue::LongString(queue.into()));
    }
    p.clone().with_headers(h)
}

/// The explicit path counts a retry when the message carries the attempts
/// header (the client API sets it); plain delayed messages stay untouched.
fn count_attempt(p: &BasicProperties, now_ms: i64) -> BasicProperties {
    match p.headers() {
        Some(h) if h.contains_key(ATTEMPTS) => {
            record_failure(p, attempts(h).saturating_add(1), now_ms, None)
        }
        _ => p.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY};
    use crate::envelope::read_transit;
    use lapin::types::AMQPValue;

    fn plan() -> Plan {
        plan_for(Strategy::RoundUp)
    }

    fn plan_for(strategy: Strategy) -> Plan {
        Plan::new(
            &Ladder::from_labels(&["1s", "2s", "5s"]).unwrap(),
            strategy,
            "t",
            "guest",
        )
    }

    fn props(pairs: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut h = FieldTable::default();
        for (k, v) in pairs {
            h.insert((*k).into(), v.clone());
        }
        BasicProperties::default().with_headers(h)
    }

    fn s(v: &str) -> AMQPValue {
        AMQPValue::LongString(v.into())
    }

    const NOW: i64 = 1_000_000;

    #[test]
    fn ingress_places_in_the_round_up_bucket_with_a_deadline() {
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(1500)),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        let Action::Wait {
            queue,
            ttl,
            properties,
        } = plan().on_ingress(&"eu".into(), &p, NOW, 0.0)
        else {
            panic!("expected a bucket")
        };
        assert_eq!(queue.as_str(), "t.bucket.2s");
        assert_eq!(ttl, Duration::from_secs(2));
        let t = read_transit(&properties).unwrap();
        assert_eq!(t.deadline_ms, NOW + 1500);
        assert_eq!(
            (
                t.destination.exchange.as_str(),
                t.destination.routing_key.as_str()
            ),
            ("orders", "eu")
        );
    }

    #[test]
    fn expiry_before_the_deadline_goes_round_again_and_after_it_delivers() {
        let p = props(&[
            ("x-requested-delay", s("7s")),
            (ORIGINAL_EXCHANGE, s("")),
            (ORIGINAL_ROUTING_KEY, s("jobs")),
        ]);
        let plan = plan();
        let Action::Wait {
            queue, properties, ..
        } = plan.on_ingress(&"x".into(), &p, NOW, 0.0)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.5s");
        let Action::Wait {
            queue, properties, ..
        } = plan.on_expired(&properties, NOW + 5_000)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.2s");
        assert_eq!(read_transit(&properties).unwrap().hops, 2);
        let Action::Deliver {
            destination,
            properties,
            after,
        } = plan.on_expired(&properties, NOW + 7_000)
        else {
            panic!()
        };
        assert_eq!(after, Duration::ZERO);
        assert_eq!(destination.routing_key.as_str(), "jobs");
        assert_eq!(properties, p);
    }

    #[test]
    fn zero_delay_delivers_at_once_unchanged() {
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(0)),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        assert!(
            matches!(plan().on_ingress(&"eu".into(), &p, NOW, 0.0), Action::Deliver { properties, .. } if properties == p)
        );
    }

    #[test]
    fn cascade_goes_down_the_ladder_and_holds_the_last_fraction() {
        let plan = plan_for(Strategy::Cascade);
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(3_400)),
            (ORIGINAL_EXCHANGE, s("o")),
        ]);
        let Action::Wait {
            queue, properties, ..
        } = plan.on_ingress(&"k".into(), &p, NOW, 0.0)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.2s");
        let Action::Wait {
            queue, properties, ..
        } = plan.on_expired(&properties, NOW + 2_003)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.1s");
        let Action::Wait {
            queue, properties, ..
        } = plan.on_expired(&properties, NOW + 3_010)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.250ms");
        let Action::Deliver {
            after, properties, ..
        } = plan.on_expired(&properties, NOW + 3_262)
        else {
            panic!()
        };
        assert_eq!(after, Duration::from_millis(138));
        assert_eq!(properties, p);
        // Finer rungs below 1s: 500ms, 250ms.
        let Action::Wait { queue, .. } = plan.on_ingress(
            &"k".into(),
            &props(&[
                ("x-requested-delay", AMQPValue::LongInt(700)),
                (ORIGINAL_EXCHANGE, s("o")),
            ]),
            NOW,
            0.0,
        ) else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.bucket.500ms");
    }

    /// The README's example: 100 s on the shipped ladder.
    #[test]
    fn cascade_on_the_shipped_ladder_matches_the_documented_example() {
        let shipped = crate::config::Config::from_toml(include_str!("../buckets.toml")).unwrap();
        let plan = Plan::new(&shipped.ladder, Strategy::Cascade, "delay", "guest");
        let p = props(&[
            ("x-requested-delay", s("100s")),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        let (mut action, mut now, mut path) =
            (plan.on_ingress(&"k".into(), &p, NOW, 0.0), NOW, vec![]);
        while let Action::Wait {
            queue,
            ttl,
            properties,
        } = action
        {
            path.push(queue.to_string());
            now += ttl.as_millis() as i64;
            action = plan.on_expired(&properties, now);
        }
        assert_eq!(
            path,
            [
                "delay.bucket.1m",
                "delay.bucket.30s",
                "delay.bucket.7500ms",
                "delay.bucket.1875ms",
                "delay.bucket.468ms"
            ]
        );
        assert!(
            matches!(action, Action::Deliver { after, .. } if after == Duration::from_millis(157))
        );
    }

    #[test]
    fn priority_sets_expiration_and_priority_and_restores_the_sender_values() {
        let plan = plan_for(Strategy::Priority);
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(1_200)),
            (ORIGINAL_EXCHANGE, s("o")),
        ])
        .with_priority(1);
        let Action::Wait {
            queue, properties, ..
        } = plan.on_ingress(&"k".into(), &p, NOW, 0.0)
        else {
            panic!()
        };
        assert_eq!(queue.as_str(), "t.pbucket.2s");
        assert_eq!(properties.expiration().as_ref().unwrap().as_str(), "1200");
        assert_eq!(*properties.priority(), Some(7));
        let Action::Deliver { properties, .. } =
            plan.on_expired(&properties.with_expiration("0".into()), NOW + 1_200)
        else {
            panic!()
        };
        assert_eq!(properties.priority(), &Some(1));
    }

    fn rejected_by(queue: &str, extra: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut entry = FieldTable::default();
        entry.insert("reason".into(), s("rejected"));
        entry.insert("queue".into(), s(queue));
        entry.insert("count".into(), AMQPValue::LongLongInt(1));
        let mut pairs = vec![(
            "x-death",
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(entry)].into()),
        )];
        pairs.extend(extra.iter().cloned());
        props(&pairs)
    }

    fn retry_plan() -> Plan {
        let policy = Policy {
            queue: "orders.*".into(),
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(60),
            jitter: 0.0,
            max_attempts: 3,
        };
        plan_for(Strategy::Cascade).with_policies(vec![policy])
    }

    fn header_i64(p: &BasicProperties, key: &str) -> Option<i64> {
        contract::integer(p.headers().as_ref()?, key)
    }

    #[test]
    fn a_rejected_message_returns_to_exactly_its_queue_after_the_policy_delay() {
        let plan = retry_plan();
        let p = rejected_by("orders.eu", &[]);
        let Action::Wait { properties, .. } = plan.on_ingress(&"eu".into(), &p, NOW, 0.0) else {
            panic!()
        };
        let t = read_transit(&properties).unwrap();
        assert_eq!(
            t.destination,
            Destination {
                exchange: "".into(),
                routing_key: "orders.eu".into()
            }
        );
        assert_eq!(t.deadline_ms, NOW + 1_000);
        // The second failure waits twice as long and counts on.
        let Action::Deliver { properties, .. } = plan.on_expired(&properties, NOW + 1_000) else {
            panic!()
        };
        assert_eq!(header_i64(&properties, ATTEMPTS), Some(1));
        let Action::Wait { properties, .. } =
            plan.on_ingress(&"eu".into(), &properties, NOW + 5_000, 0.0)
        else {
            panic!()
        };
        let t = read_transit(&properties).unwrap();
        assert_eq!(t.deadline_ms, NOW + 5_000 + 2_000);
        let delivered = envelope::leave_transit(&properties);
        assert_eq!(header_i64(&delivered, ATTEMPTS), Some(2));
        assert_eq!(header_i64(&delivered, FIRST_FAILURE), Some(NOW));
        assert_eq!(header_i64(&delivered, LAST_FAILURE), Some(NOW + 5_000));
        // The third failure is the last one allowed.
        match plan.on_ingress(&"eu".into(), &delivered, NOW + 9_000, 0.0) {
            Action::Park { reason, properties } => {
                assert_eq!(
                    reason.to_string(),
                    "gave up after 3 attempts: policy \"orders.*\" allows 3 deliveries to queue 'orders.eu'"
                );
                assert_eq!(header_i64(&properties, ATTEMPTS), Some(3));
                assert_eq!(header_i64(&properties, FIRST_FAILURE), Some(NOW));
            }
            other => panic!("expected park, got {other:?}"),
        }
    }

    #[test]
    fn no_policy_parks_and_an_explicit_delay_wins() {
        let plan = retry_plan();
        assert!(matches!(
            plan.on_ingress(&"k".into(), &rejected_by("billing", &[]), NOW, 0.0),
            Action::Park { reason: ParkReason::NoPolicy(q), .. } if q == "billing"
        ));
        let p = rejected_by("orders.eu", &[("x-requested-delay", s("7s"))]);
        let Action::Wait { properties, .. } = plan.on_ingress(&"k".into(), &p, NOW, 0.0) else {
            panic!()
        };
        assert_eq!(read_transit(&properties).unwrap().deadline_ms, NOW + 7_000);
    }

    #[test]
    fn plain_delayed_messages_get_no_attempt_headers() {
        let p = props(&[("x-requested-delay", s("1s")), (ORIGINAL_EXCHANGE, s("o"))]);
        let Action::Wait { properties, .. } = retry_plan().on_ingress(&"k".into(), &p, NOW, 0.0)
        else {
            panic!()
        };
        assert_eq!(header_i64(&properties, ATTEMPTS), None);
    }

    fn park_reason(p: &BasicProperties) -> ParkReason {
        match plan().on_ingress(&"rk".into(), p, NOW, 0.0) {
            Action::Park { reason, .. } => reason,
            other => panic!("expected park, got {other:?}"),
        }
    }

    #[test]
    fn bad_input_is_parked_with_a_reason() {
        assert_eq!(
            park_reason(&props(&[(ORIGINAL_EXCHANGE, s("o"))])),
            ParkReason::MissingDelay
        );
        assert!(matches!(
            park_reason(&props(&[
                (ORIGINAL_EXCHANGE, s("o")),
                ("x-requested-delay", s("-3"))
            ])),
            ParkReason::InvalidDelay(_)
        ));
        assert!(matches!(
            park_reason(&props(&[("x-requested-delay", s("3s"))])),
            ParkReason::InvalidDestination(_)
        ));
        assert!(matches!(
            park_reason(&props(&[
                ("x-requested-delay", s("3s")),
                (ORIGINAL_EXCHANGE, s("t.router"))
            ])),
            ParkReason::DestinationIsRouter(_)
        ));
        let p = props(&[("x-requested-delay", s("3s")), (ORIGINAL_EXCHANGE, s("o"))])
            .with_user_id("mallory".into());
        assert!(matches!(park_reason(&p), ParkReason::UserIdMismatch { .. }));
        assert!(matches!(
            park_reason(&BasicProperties::default()),
            ParkReason::InvalidDestination(_)
        ));
    }

    #[test]
    fn expired_without_transit_headers_is_parked() {
        assert!(matches!(
            plan().on_expired(&BasicProperties::default(), NOW),
            Action::Park {
                reason: ParkReason::NotInTransit(_),
                ..
            }
        ));
    }

    fn padded(pad: usize) -> BasicProperties {
        props(&[
            ("x-requested-delay", AMQPValue::LongInt(300)),
            (ORIGINAL_EXCHANGE, s("")),
            (ORIGINAL_ROUTING_KEY, s("work")),
            ("pad", s(&"p".repeat(pad))),
        ])
        .with_message_id("m-1".into())
    }

    /// The largest pad with which the sender's own message fits the frame.
    fn largest_pad(frame_max: u32) -> usize {
        frame_max as usize - wire::header_frame_len(&padded(0)).unwrap()
    }

    #[test]
    fn a_message_that_fits_is_left_alone() {
        let plan = plan_for(Strategy::Cascade);
        let p = padded(100_000);
        let a = plan.on_ingress(&"k".into(), &p, NOW, 0.0);
        assert_eq!(plan.within_frame(a.clone(), || p.clone(), NOW, 131_072), a);
    }

    #[test]
    fn headers_too_large_with_the_routers_are_parked_with_the_largest_removed() {
        let plan = plan_for(Strategy::Cascade);
        let p = padded(largest_pad(131_072));
        assert!(wire::fits(&p, 131_072), "the sender's message fits");
        let a = plan.on_ingress(&"k".into(), &p, NOW, 0.0);
        assert!(
            !wire::fits(a.properties(), 131_072),
            "with transit it does not"
        );
        let Action::Park { reason, properties } = plan.within_frame(a, || p.clone(), NOW, 131_072)
        else {
            panic!("expected a park")
        };
        assert!(wire::fits(&properties, 131_072));
        let text = reason.to_string();
        assert!(text.starts_with("header table too large"), "{text}");
        assert!(
            text.contains("removed these sender headers: 'pad' ("),
            "{text}"
        );
        let h = properties.headers().as_ref().unwrap();
        assert!(!h.contains_key("pad"));
        assert!(h.contains_key(ORIGINAL_ROUTING_KEY), "other headers stay");
        assert_eq!(properties.message_id(), p.message_id());
    }

    #[test]
    fn an_oversized_park_keeps_its_own_reason() {
        let plan = plan_for(Strategy::Cascade);
        let p = padded(largest_pad(131_072)).with_user_id("mallory".into());
        let a = plan.on_ingress(&"k".into(), &p, NOW, 0.0);
        let Action::Park { reason, .. } = plan.within_frame(a, || p.clone(), NOW, 131_072) else {
            panic!("expected a park")
        };
        assert!(
            reason.to_string().starts_with("user-id 'mallory'"),
            "{reason}"
        );
    }

    proptest::proptest! {
        #[test]
        fn whatever_the_headers_the_result_fits(
            pad in 0usize..140_000,
            extra in 0usize..3,
            frame_max in proptest::sample::select(vec![4_096u32, 8_192, 131_072]),
            strategy in proptest::sample::select(vec![Strategy::RoundUp, Strategy::Priority, Strategy::Cascade]),
        ) {
            let plan = plan_for(strategy);
            let mut p = padded(pad.min(largest_pad(frame_max)));
            let mut h = p.headers().clone().unwrap();
            for i in 0..extra {
                h.insert(format!("more-{i}").as_str().into(), s(&"q".repeat(pad / 3)));
            }
            p = p.with_headers(h);
            let a = plan.on_ingress(&"k".into(), &p, NOW, 0.0);
            let out = plan.within_frame(a, || p.clone(), NOW, frame_max);
            proptest::prop_assert!(wire::fits(out.properties(), frame_max));
        }
    }
}
