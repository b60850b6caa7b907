//! The `headers` target: a header table in AMQP wire format, plus a trailer of
//! properties, through `Rules::decide` from ingress and from a bucket under every set of
//! rules.
//!
//! # Input layout
//!
//! ```text
//! field table        u32 length + entries, exactly as in a content header
//!                    (amq-protocol-types' parse_field_table); undecodable -> skip
//! trailer, byte 0    flags: 1 no headers property at all, 2 delivery-mode,
//!                    4 expiration, 8 priority, 16 user-id, 32 bystander
//!                    properties (content-type, message-id, timestamp, ...),
//!                    64 clock = NOW + u32, 128 clock = any i64
//!          byte 1    delivery-mode
//!          byte 2    priority
//!          byte 3    user-id: even "guest" (the router's user), odd "mallory"
//!          4..6      retry jitter unit = u16 / 65536, in [0, 1)
//!          6..10     u32 ms after the clock, the raw message out of a bucket
//!          10..18    clock (see flags 64/128), big-endian
//!          18        n = expiration length (mod 32), then n bytes of expiration
//!          rest      routing key (lossy UTF-8, cut to 255 bytes)
//! ```
//! Missing trailer bytes read as zero: a bare table is a message with headers,
//! no other properties, routing key "" at [`NOW`].
//!
//! # Checks, per plan (three ladders x three strategies)
//!
//! - Nothing panics (no arithmetic overflow either: fuzz builds keep overflow checks).
//! - Park: a non-empty reason, in `x-park-reason`, `x-parked-at` = now,
//!   persistent, no expiration; replaying it (`envelope::unpark`) gives back
//!   the sender's message when the sender kept to the contract.
//! - Wait: ttl > 0 and equal to the TTL of a bucket queue the rules declare;
//!   readable transit headers with the same destination and deadline on
//!   every hop, hops counting one per bucket; persistent; priority buckets carry a priority below
//!   `x-max-priority` and an expiration no longer than the TTL.
//! - Following the message through its buckets (the broker dead-letters it on
//!   time, adding `x-death`): it is never parked, never delivered early, the
//!   destination never changes, and `leave_transit` at any hop — and the
//!   properties delivered — restore the sender's message exactly (retry
//!   counters aside; checked when the sender sent no `x-delay-router-*`
//!   transit headers of its own).
//! - Delivered to the default exchange, the consumer rejects it once: the retry
//!   counts one more attempt, parks when the policy is exhausted or missing.
//! - The raw message as if a bucket expired it: parks with a reason or is
//!   scheduled with readable transit headers.

use crate::plans::{NOW, Named, plans};
use crate::props::{dead_letter, honours_contract, same, sender_view};
use delay_router::core::contract::{PARK_REASON, PARKED_AT, REQUESTED_DELAY, integer};
use delay_router::core::decision::{Action, Rules};
use delay_router::core::envelope::{PERSISTENT, leave_transit, read_transit};
use delay_router::core::identity::ensure_message_id;
use delay_router::core::parking::unpark;
use delay_router::core::placement::{HOLD_BELOW, PRIORITY_LEVELS, PlacementStrategy};
use delay_router::core::reasons::ParkReason;
use delay_router::core::retry::{self, ATTEMPTS};
use delay_router::testkit::decide;
use lapin::BasicProperties;
use lapin::types::parsing::parse_field_table;
use lapin::types::{AMQPValue, LongString, ShortString};
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

pub const NO_HEADERS: u8 = 1;
pub const DELIVERY_MODE: u8 = 2;
pub const EXPIRATION: u8 = 4;
pub const PRIORITY: u8 = 8;
pub const USER_ID: u8 = 16;
pub const BYSTANDERS: u8 = 32;
pub const CLOCK_NEAR: u8 = 64;
pub const CLOCK_ANY: u8 = 128;

/// Placements followed before jumping the clock to the deadline.
pub const MAX_HOPS: i64 = 48;

/// One decoded input.
#[derive(Debug, Clone)]
pub struct Message {
    pub routing_key: ShortString,
    pub properties: BasicProperties,
    pub now_ms: i64,
    /// Retry jitter draw, in `[0, 1)` as the router's RNG gives it.
    pub unit: f64,
    pub later_ms: i64,
}

/// The trailer after the table, as the seed writer builds it.
#[derive(Debug, Clone, Default)]
pub struct Trailer {
    pub flags: u8,
    pub delivery_mode: u8,
    pub priority: u8,
    pub user: u8,
    pub unit: u16,
    pub later_ms: u32,
    pub clock: i64,
    pub expiration: Vec<u8>,
    pub routing_key: Vec<u8>,
}

impl Trailer {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.flags, self.delivery_mode, self.priority, self.user];
        out.extend(self.unit.to_be_bytes());
        out.extend(self.later_ms.to_be_bytes());
        out.extend(self.clock.to_be_bytes());
        out.push(self.expiration.len() as u8 % 32);
        out.extend(&self.expiration[..self.expiration.len() % 32]);
        out.extend(&self.routing_key);
        out
    }
}

fn short(bytes: &[u8]) -> ShortString {
    let s = String::from_utf8_lossy(bytes);
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    ShortString::from(&s[..end])
}

/// Decodes an input, or `None` when the table does not parse.
pub fn decode(data: &[u8]) -> Option<Message> {
    let (rest, table) = parse_field_table(data).ok()?;
    let b = |i: usize| rest.get(i).copied().unwrap_or(0);
    let be =
        |from: usize, n: usize| (from..from + n).fold(0u64, |acc, i| (acc << 8) | u64::from(b(i)));
    let flags = b(0);
    let mut p = BasicProperties::default();
    if flags & NO_HEADERS == 0 {
        p = p.with_headers(table);
    }
    if flags & DELIVERY_MODE != 0 {
        p = p.with_delivery_mode(b(1));
    }
    if flags & PRIORITY != 0 {
        p = p.with_priority(b(2));
    }
    if flags & USER_ID != 0 {
        p = p.with_user_id(if b(3) % 2 == 0 { "guest" } else { "mallory" }.into());
    }
    if flags & BYSTANDERS != 0 {
        p = p
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_correlation_id("c-1".into())
            .with_reply_to("replies".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_700_000_000)
            .with_type("order.created".into())
            .with_app_id("shop".into())
            .with_cluster_id("c".into());
    }
    let unit = be(4, 2) as f64 / 65536.0;
    let later_ms = be(6, 4) as i64;
    let clock = be(10, 8);
    let now_ms = if flags & CLOCK_ANY != 0 {
        // Any instant from the epoch to the year 2248: the router's clock
        // reads u64 nanoseconds (to 2554), and every deadline a message
        // followed from here may reach stays inside that range.
        (clock >> 21) as i64
    } else if flags & CLOCK_NEAR != 0 {
        NOW + (clock >> 32) as i64
    } else {
        NOW
    };
    let n = usize::from(b(18)) % 32;
    let tail = rest.get(19..).unwrap_or(&[]);
    let (expiration, routing_key) = tail.split_at(n.min(tail.len()));
    if flags & EXPIRATION != 0 {
        p = p.with_expiration(short(expiration));
    }
    Some(Message {
        routing_key: short(routing_key),
        properties: p,
        now_ms,
        unit,
        later_ms,
    })
}

/// The fuzz target's body.
pub fn run(data: &[u8]) {
    if let Some(m) = decode(data) {
        check(&m);
    }
}

/// Every check for one message, under every set of rules.
pub fn check(m: &Message) {
    for named in plans() {
        let c = Checker::new(named);
        c.ingress(&m.routing_key, &m.properties, m.now_ms, m.unit, 0);
        c.expired_raw(&m.properties, m.now_ms.saturating_add(m.later_ms));
    }
}

struct Checker<'a> {
    name: &'a str,
    rules: &'a Rules,
    buckets: &'a HashMap<ShortString, Duration>,
}

impl<'a> Checker<'a> {
    fn new(named: &'a Named) -> Self {
        Self {
            name: &named.name,
            rules: &named.rules,
            buckets: &named.buckets,
        }
    }

    /// A message published to (or dead-lettered into) the router exchange.
    fn ingress(&self, rk: &ShortString, sender: &BasicProperties, now: i64, unit: f64, round: u8) {
        let name = self.name;
        let action = decide::ingress(self.rules, rk, sender, now, unit);
        // What the router forwards is the sender's message with a message-id:
        // its own, else the one derived at ingress.
        let exchange = self.rules.names.router_exchange.as_str();
        let received = sender;
        let stamped = ensure_message_id(Cow::Borrowed(sender), exchange, rk.as_str(), decide::BODY);
        let sender = stamped.as_ref();
        match action {
            // A cancel request on the router exchange is parked as it came,
            // before a message-id is derived.
            Action::Park { reason, properties }
                if matches!(reason, ParkReason::InvalidCancel(_)) =>
            {
                self.parked(&reason, &properties, received, now, "ingress");
            }
            Action::Park { reason, properties } => {
                self.parked(&reason, &properties, sender, now, "ingress");
            }
            // Cancel requests go to the control exchange, not the router's.
            Action::Cancel { .. } => panic!("[{name}] the router exchange wrote a tombstone"),
            Action::Deliver {
                destination,
                properties,
                after,
                ..
            } => {
                // Due now: the sender's message as admitted, unchanged.
                self.assert_restored(sender, &properties, "delivered from ingress");
                self.assert_hold(after, "ingress");
                self.assert_not_router(&destination.exchange, "ingress delivery");
                if round == 0 {
                    self.reject_once(&destination, &properties, now, unit);
                }
            }
            Action::Wait {
                queue,
                ttl,
                properties,
                ..
            } => {
                let transit = read_transit(&properties).unwrap_or_else(|e| {
                    panic!("[{name}] placed at ingress with unreadable transit headers: {e}")
                });
                assert_eq!(transit.hops, 1, "[{name}] first placement is hop 1");
                self.assert_not_router(&transit.destination.exchange, "transit destination");
                self.follow(sender, queue, ttl, properties, transit, now, unit, round);
            }
        }
    }

    /// Follows a placed message bucket by bucket until it is delivered.
    #[allow(clippy::too_many_arguments)]
    fn follow(
        &self,
        sender: &BasicProperties,
        mut queue: ShortString,
        mut ttl: Duration,
        mut properties: BasicProperties,
        first: delay_router::core::envelope::Transit,
        mut t: i64,
        unit: f64,
        round: u8,
    ) {
        let name = self.name;
        let mut hops = 0i64;
        loop {
            assert!(!ttl.is_zero(), "[{name}] hop {hops}: bucket ttl is zero");
            let &declared = self.buckets.get(&queue).unwrap_or_else(|| {
                panic!("[{name}] hop {hops}: placed in {queue:?}, which the rules do not declare")
            });
            hops += 1;
            assert_eq!(
                declared, ttl,
                "[{name}] hop {hops}: ttl differs from {queue}'s"
            );
            let transit = read_transit(&properties)
                .unwrap_or_else(|e| panic!("[{name}] hop {hops}: unreadable transit headers: {e}"));
            assert_eq!(
                transit.destination, first.destination,
                "[{name}] hop {hops}: destination changed"
            );
            assert_eq!(
                transit.deadline_ms, first.deadline_ms,
                "[{name}] hop {hops}: deadline changed"
            );
            assert_eq!(transit.hops, hops, "[{name}] hop count");
            assert_eq!(
                *properties.delivery_mode(),
                Some(PERSISTENT),
                "[{name}] hop {hops}: not persistent in a bucket"
            );
            let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
            let stay = match properties.expiration() {
                Some(e) => {
                    assert_eq!(
                        self.rules.strategy,
                        PlacementStrategy::Priority,
                        "[{name}] expiration {e} set outside the priority strategy"
                    );
                    let ms: u64 = e.as_str().parse().unwrap_or_else(|_| {
                        panic!("[{name}] hop {hops}: expiration {e:?} is not a whole number of ms")
                    });
                    assert!(
                        ms >= 1 && ms <= ttl_ms,
                        "[{name}] hop {hops}: expiration {ms}ms outside 1..={ttl_ms}"
                    );
                    ms
                }
                None => ttl_ms,
            };
            if self.rules.strategy == PlacementStrategy::Priority {
                let pr = properties.priority().unwrap_or_else(|| {
                    panic!("[{name}] hop {hops}: no priority in a priority bucket")
                });
                assert!(
                    pr < PRIORITY_LEVELS,
                    "[{name}] hop {hops}: priority {pr} >= x-max-priority"
                );
            }
            // The broker expires it on time and dead-letters it to the router.
            t = t.saturating_add(i64::try_from(stay).unwrap_or(i64::MAX));
            let expired = dead_letter(&properties, queue.as_str(), "expired", t);
            self.assert_restored(
                sender,
                &leave_transit(&expired),
                &format!("leave_transit at hop {hops}"),
            );
            if hops >= MAX_HOPS {
                // Long delays: skip ahead, as if it had gone round until due.
                t = t.max(first.deadline_ms);
            }
            assert!(
                hops <= MAX_HOPS + 1,
                "[{name}] still placed after the deadline"
            );
            match decide::expired(self.rules, &expired, t) {
                Action::Cancel { .. } => panic!("only Rules::decide writes tombstones"),
                Action::Wait {
                    queue: q,
                    ttl: next_ttl,
                    properties: p,
                    ..
                } => {
                    queue = q;
                    ttl = next_ttl;
                    properties = p;
                }
                Action::Deliver {
                    destination,
                    properties,
                    after,
                    ..
                } => {
                    assert_eq!(
                        destination, first.destination,
                        "[{name}] delivered elsewhere"
                    );
                    self.assert_hold(after, "expiry");
                    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
                    assert!(
                        t.saturating_add(after_ms) >= first.deadline_ms,
                        "[{name}] delivered early: at {t} + {after_ms}ms, due {}",
                        first.deadline_ms
                    );
                    if t >= first.deadline_ms {
                        assert!(after.is_zero(), "[{name}] held {after:?} past the deadline");
                    }
                    self.assert_restored(sender, &properties, "delivered after expiry");
                    if round == 0 {
                        self.reject_once(
                            &destination,
                            &properties,
                            t.saturating_add(after_ms),
                            unit,
                        );
                    }
                    return;
                }
                Action::Park { reason, .. } => {
                    panic!(
                        "[{name}] hop {hops}: a message in transit was parked on expiry: {reason}"
                    )
                }
            }
        }
    }

    /// The destination queue's consumer rejects a delivered message once and
    /// the queue dead-letters it to the router (zero-code retries).
    fn reject_once(
        &self,
        destination: &delay_router::core::contract::Destination,
        delivered: &BasicProperties,
        now: i64,
        unit: f64,
    ) {
        if !destination.exchange.as_str().is_empty() {
            return;
        }
        let name = self.name;
        let queue = destination.routing_key.as_str();
        let rejected = dead_letter(delivered, queue, "rejected", now);
        let before = rejected
            .headers()
            .as_ref()
            .and_then(|h| integer(h, ATTEMPTS))
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        let failures = before.saturating_add(1);
        let policy = retry::find(&self.rules.policies, queue);
        let explicit = rejected
            .headers()
            .as_ref()
            .is_some_and(|h| h.contains_key(REQUESTED_DELAY));
        let counted = |p: &BasicProperties, what: &str| {
            let n = p.headers().as_ref().and_then(|h| integer(h, ATTEMPTS));
            assert_eq!(
                n,
                Some(i64::from(failures)),
                "[{name}] retry of {queue}: attempts on {what}"
            );
        };
        match decide::ingress(self.rules, &destination.routing_key, &rejected, now, unit) {
            Action::Cancel { .. } => panic!("only Rules::decide writes tombstones"),
            Action::Park { reason, properties } => match (&reason, policy) {
                (ParkReason::RetriesExhausted { attempts, .. }, Some(pol)) => {
                    assert_eq!(*attempts, failures, "[{name}] exhausted count");
                    assert!(
                        pol.exhausted(failures),
                        "[{name}] parked as exhausted at {failures} < {}",
                        pol.max_attempts
                    );
                    counted(&properties, "the parked message");
                }
                (ParkReason::NoPolicy(q), None) => {
                    assert_eq!(q, queue);
                    assert!(
                        !explicit,
                        "[{name}] NoPolicy although x-requested-delay is set"
                    );
                }
                (ParkReason::InvalidDelay(_), _) => assert!(explicit),
                (ParkReason::InvalidDestination(_), _) => assert!(queue.len() > 255),
                (ParkReason::Unacceptable(_), _) => {}
                (other, _) => panic!("[{name}] retry of {queue} parked: {other}"),
            },
            Action::Deliver { properties, .. } => {
                if let Some(pol) = policy {
                    assert!(
                        !pol.exhausted(failures),
                        "[{name}] retried past max_attempts"
                    );
                }
                counted(&properties, "the redelivery");
            }
            Action::Wait { properties, .. } => {
                if let Some(pol) = policy {
                    assert!(
                        !pol.exhausted(failures),
                        "[{name}] retried past max_attempts"
                    );
                }
                counted(&properties, "the waiting message");
            }
        }
        // And the same checks as any other ingress, without rejecting again.
        self.ingress(&destination.routing_key, &rejected, now, unit, 1);
    }

    /// The raw input as if a bucket had expired it: whatever it carries.
    fn expired_raw(&self, p: &BasicProperties, now: i64) {
        let name = self.name;
        match decide::expired(self.rules, p, now) {
            Action::Cancel { .. } => panic!("only Rules::decide writes tombstones"),
            Action::Park { reason, properties } => {
                // Anything may be written into a bucket by hand: transit
                // headers missing, or naming the router's own queues, or
                // saved properties the broker would refuse from the router.
                assert!(
                    matches!(
                        reason,
                        ParkReason::NotInTransit(_)
                            | ParkReason::Unacceptable(_)
                            | ParkReason::OwnDestination { .. }
                            | ParkReason::DestinationIsRouter(_)
                    ),
                    "[{name}] expiry parked: {reason}"
                );
                self.parked(&reason, &properties, p, now, "expiry");
            }
            Action::Wait {
                queue,
                ttl,
                properties,
                ..
            } => {
                assert!(!ttl.is_zero(), "[{name}] expiry: ttl zero");
                assert_eq!(
                    self.buckets.get(&queue).copied(),
                    Some(ttl),
                    "[{name}] expiry: undeclared bucket {queue}"
                );
                assert!(
                    read_transit(&properties).is_ok(),
                    "[{name}] expiry: unreadable transit headers"
                );
            }
            Action::Deliver { after, .. } => self.assert_hold(after, "raw expiry"),
        }
    }

    fn parked(
        &self,
        reason: &ParkReason,
        parked: &BasicProperties,
        sender: &BasicProperties,
        now: i64,
        at: &str,
    ) {
        let name = self.name;
        let words = reason.to_string();
        assert!(!words.is_empty(), "[{name}] {at}: park without a reason");
        let h = parked
            .headers()
            .as_ref()
            .unwrap_or_else(|| panic!("[{name}] {at}: parked without headers"));
        assert_eq!(
            h.inner().get(PARK_REASON),
            Some(&AMQPValue::LongString(LongString::from(words.clone()))),
            "[{name}] {at}: x-park-reason"
        );
        assert_eq!(
            h.inner().get(PARKED_AT),
            Some(&AMQPValue::LongLongInt(now)),
            "[{name}] {at}: x-parked-at"
        );
        assert_eq!(
            *parked.delivery_mode(),
            Some(PERSISTENT),
            "[{name}] {at}: parked not persistent"
        );
        assert_eq!(
            *parked.expiration(),
            None,
            "[{name}] {at}: parked with an expiration"
        );
        // Replay gives back the sender's message (retry counters start afresh).
        let owns_park_headers = sender
            .headers()
            .as_ref()
            .is_some_and(|h| h.contains_key(PARK_REASON) || h.contains_key(PARKED_AT));
        if at == "ingress" && honours_contract(sender) && !owns_park_headers {
            let (replayed, sent) = (sender_view(&unpark(parked)), sender_view(sender));
            if !same(&replayed, &sent) {
                assert_eq!(
                    replayed, sent,
                    "[{name}] replaying a message parked at ingress ({words}) does not give back the sender's message"
                );
            }
        }
    }

    /// The sender's message, retry counters aside, when it kept to the contract.
    fn assert_restored(&self, sender: &BasicProperties, out: &BasicProperties, what: &str) {
        if honours_contract(sender) {
            let (out, sender) = (sender_view(out), sender_view(sender));
            if !same(&out, &sender) {
                assert_eq!(
                    out, sender,
                    "[{}] {what}: not the sender's message",
                    self.name
                );
            }
        }
    }

    /// Only cascade holds the last fraction, shorter than HOLD_BELOW or the smallest rung.
    fn assert_hold(&self, after: Duration, at: &str) {
        if after.is_zero() {
            return;
        }
        let name = self.name;
        assert_eq!(
            self.rules.strategy,
            PlacementStrategy::Cascade,
            "[{name}] {at}: held {after:?} outside cascade"
        );
        assert!(
            after < HOLD_BELOW || after < self.rules.ladder.smallest().ttl,
            "[{name}] {at}: held {after:?}, a bucket's worth"
        );
    }

    fn assert_not_router(&self, exchange: &ShortString, what: &str) {
        assert_ne!(
            exchange.as_str(),
            self.rules.names.router_exchange.as_str(),
            "[{}] {what} is the router exchange",
            self.name
        );
    }
}
