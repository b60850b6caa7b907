//! Arrival: a message published to the router exchange, or rejected by a
//! work queue's consumer (the zero-code retry path), admitted with a
//! destination and a deadline, or refused with a reason.

use super::{Action, Rules};
use crate::core::clock::Clock;
use crate::core::contract::{
    self, DELIVER_AT, DeliverAtError, Destination, MAX_DELAY, REQUESTED_DELAY,
};
use crate::core::delayed::{self, DelayedExchange};
use crate::core::envelope::Transit;
use crate::core::parking;
use crate::core::reasons::ParkReason;
use crate::core::retry::{self, Rejection};
use crate::core::wire;
use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};
use std::borrow::Cow;
use std::time::Duration;

/// A retry policy's delay for this attempt, and the policy's name.
type PolicyDelay = (Duration, String);

/// A message the router will place: where it goes and by when, how long it
/// waits from now, the properties it travels with, and the retry policy
/// that scheduled it.
struct Admitted<'a> {
    transit: Transit,
    wait: Duration,
    properties: Cow<'a, BasicProperties>,
    policy: Option<String>,
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

impl Rules {
    /// A message published to the router exchange (or dead-lettered into it
    /// by a work queue whose consumer rejected it), read at `clock`, with the
    /// retry policy that scheduled it. `unit` is a random number in `[0, 1)`
    /// for retry jitter. Deadlines are stamped from the clock rounded up. Where the message
    /// waits is decided from the delay as requested (a retry policy's delay,
    /// `x-requested-delay`), never from clock arithmetic: a delay equal to a
    /// rung gets that rung. An `x-deliver-at` waits from the clock rounded
    /// down, so a hold never ends before it even by a fraction of a
    /// millisecond.
    pub(super) fn admit_and_schedule(
        &self,
        routing_key: &ShortString,
        p: &BasicProperties,
        clock: Clock,
        unit: f64,
        hold_up_to: Duration,
    ) -> (Action, Option<String>) {
        let now_ms = clock.up_ms();
        match self.admit(routing_key, p, clock, unit) {
            Ok(Admitted {
                transit,
                wait,
                properties,
                policy,
            }) => {
                let action = self.schedule(&properties, transit, wait, true, hold_up_to, unit);
                (self.publishable(action, now_ms), policy)
            }
            Err(r) => {
                let park = Action::Park {
                    properties: parking::park(
                        &r.properties,
                        &r.reason,
                        now_ms,
                        r.destination.as_ref(),
                    ),
                    reason: r.reason,
                };
                (park, None)
            }
        }
    }

    /// A message published to one of the plugin's exchanges: it waits as
    /// the plugin would have it wait ([`delayed::plugin_delay`]), or goes at
    /// once, to the delivery exchange with the routing key it was published
    /// with. Its other headers mean nothing here: the plugin read none.
    pub(super) fn admit_delayed(
        &self,
        plugin: &DelayedExchange,
        routing_key: &ShortString,
        p: &BasicProperties,
        clock: Clock,
        unit: f64,
        hold_up_to: Duration,
    ) -> Action {
        let now_ms = clock.up_ms();
        let destination = Destination {
            exchange: plugin.deliver_to.clone(),
            routing_key: routing_key.clone(),
        };
        if let Err(e) = wire::acceptable(p, &self.router_user) {
            let reason = ParkReason::Unacceptable(e);
            return Action::Park {
                properties: parking::park(p, &reason, now_ms, Some(&destination)),
                reason,
            };
        }
        let (properties, wait) = match delayed::plugin_delay(p.headers().as_ref()) {
            Some(ms) => (
                Cow::Owned(delayed::rewritten(p, ms)),
                Duration::from_millis(ms),
            ),
            None => (Cow::Borrowed(p), Duration::ZERO),
        };
        let ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
        let transit = Transit {
            destination,
            deadline_ms: now_ms.saturating_add(ms),
            hops: 0,
        };
        let mut action = self.schedule(&properties, transit, wait, true, hold_up_to, unit);
        // Counted while it waits in the buckets: its token goes to the
        // exchange's waiting queue once the bucket has it.
        if let Action::Wait { properties, .. } = &mut action {
            *properties = delayed::counted(properties, &plugin.name);
        }
        self.publishable(action, now_ms)
    }

    fn admit<'a>(
        &self,
        routing_key: &ShortString,
        p: &'a BasicProperties,
        clock: Clock,
        unit: f64,
    ) -> Result<Admitted<'a>, Box<Refusal>> {
        let now_ms = clock.up_ms();
        let empty = FieldTable::default();
        let headers = p.headers().as_ref().unwrap_or(&empty);
        let requested = headers.inner().get(REQUESTED_DELAY);
        // The plugin's header stands in for x-requested-delay when that is
        // absent, and the message arrives with it rewritten as the plugin
        // would.
        let alias = match requested {
            Some(_) => None,
            None => delayed::alias(headers),
        };
        let explicit = requested.or(alias);
        let rejection = match retry::newest_rejection(headers) {
            Ok(r) => r,
            // A sender's odd x-death does not matter when it says what it wants.
            Err(_) if explicit.is_some() => None,
            Err(e) => return Err(refuse(ParkReason::InvalidDeath(e), None, p)),
        };
        // x-deliver-at counts for messages published to the router; a
        // rejected message's time is past, its policy or delay decides.
        let mut deliver_at = None;
        let (destination, mut p, policy_delay) = match rejection {
            Some(rejection) => {
                let (destination, p, delay) = self.retry(&rejection, headers, p, now_ms, unit)?;
                (destination, Cow::Owned(p), delay)
            }
            None => {
                let destination = contract::requested_destination(headers, routing_key)
                    .map_err(|e| refuse(ParkReason::InvalidDestination(e), None, p))?;
                deliver_at = headers.inner().get(DELIVER_AT);
                (destination, retry::count_attempt(p, now_ms), None)
            }
        };
        let policy = policy_delay.as_ref().map(|(_, name)| name.clone());
        let policy_delay = policy_delay.map(|(d, _)| d);
        let park = |reason| refuse(reason, Some(destination.clone()), &p);
        self.check_destination(&destination).map_err(park)?;
        // What the broker checked on the sender's publish holds, except a
        // user-id: the router publishes as its own user.
        wire::acceptable(&p, &self.router_user).map_err(|e| park(ParkReason::Unacceptable(e)))?;
        let after = |delay: Duration| {
            // A fraction of a millisecond counts as a whole one: never early.
            let ms = i64::try_from(delay.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX);
            (now_ms.saturating_add(ms), delay)
        };
        let (deadline_ms, wait) = match (deliver_at, explicit, policy_delay) {
            (Some(v), _, _) => {
                let at = contract::parse_deliver_at(v)
                    .map_err(|e| park(ParkReason::InvalidDeliverAt(e)))?;
                let max_ms = i64::try_from(MAX_DELAY.as_millis()).unwrap_or(i64::MAX);
                if at.saturating_sub(now_ms) > max_ms {
                    let shown = DeliverAtError::TooFar(at.to_string());
                    return Err(park(ParkReason::InvalidDeliverAt(shown)));
                }
                // A time in the past is due now.
                let wait = u64::try_from(at.saturating_sub(clock.down_ms())).unwrap_or(0);
                (at.max(now_ms), Duration::from_millis(wait))
            }
            (None, Some(v), _) if alias.is_some() => {
                let delay =
                    contract::parse_delay(v).map_err(|e| park(ParkReason::InvalidXDelay(e)))?;
                let ms = u64::try_from(delay.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
                p = Cow::Owned(delayed::rewritten(&p, ms));
                after(delay)
            }
            (None, Some(v), _) => {
                after(contract::parse_delay(v).map_err(|e| park(ParkReason::InvalidDelay(e)))?)
            }
            (None, None, Some(d)) => after(d),
            (None, None, None) => return Err(park(ParkReason::MissingDelay)),
        };
        let transit = Transit {
            destination,
            deadline_ms,
            hops: 0,
        };
        Ok(Admitted {
            transit,
            wait,
            properties: p,
            policy,
        })
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
    ) -> Result<(Destination, BasicProperties, Option<PolicyDelay>), Box<Refusal>> {
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
        let failures = retry::attempts(headers).saturating_add(1);
        let p = retry::record_failure(p, failures, now_ms, Some(&rejection.queue));
        match retry::find(&self.policies, &rejection.queue) {
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
            Some(policy) => Ok((
                destination,
                p,
                Some((policy.delay(failures, unit), policy.queue.clone())),
            )),
            None if headers.contains_key(REQUESTED_DELAY) => Ok((destination, p, None)),
            None => Err(refuse(
                ParkReason::NoPolicy(rejection.queue.clone()),
                Some(destination),
                &p,
            )),
        }
    }
}
