//! The envelope: how a message's properties change as it enters a bucket
//! and moves between buckets, and how the sender's original properties are
//! restored exactly on the way out. (A parked message's properties are
//! [`crate::core::parking`]'s.)
//!
//! In a bucket the router overrides `expiration` (removed) and `delivery-mode`
//! (persistent), and the broker adds `x-death` headers. The sender's values are
//! kept in [`SAVED_PROPERTIES`] and [`SAVED_HEADERS`] and put back on delivery.

use crate::core::contract::{
    DEATH_HEADERS, Destination, SAVED_HEADERS, SAVED_PROPERTIES, TRANSIT,
    TRANSIT_DEADLINE, TRANSIT_EXCHANGE, TRANSIT_HEADERS, TRANSIT_HOPS, TRANSIT_LANE,
    TRANSIT_ROUTING_KEY, integer, short_string,
};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use std::collections::BTreeMap;

/// AMQP `delivery-mode` for persistent messages.
pub const PERSISTENT: u8 = 2;

const SAVED_EXPIRATION: &str = "expiration";
const SAVED_DELIVERY_MODE: &str = "delivery-mode";
const SAVED_NO_HEADERS: &str = "no-headers";
const SAVED_NO_DELIVERY_MODE: &str = "no-delivery-mode";
const SAVED_PRIORITY: &str = "priority";
const SAVED_NO_PRIORITY: &str = "no-priority";

/// What the router knows about a message waiting in a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transit {
    /// Where it goes when due.
    pub destination: Destination,
    /// When it is due, in milliseconds since the Unix epoch.
    pub deadline_ms: i64,
    /// Bucket placements so far, this one included.
    pub hops: i64,
}

/// How [`Transit`] is written into a bucket message's headers. Both are
/// read, whichever is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TransitFormat {
    /// One header, [`TRANSIT`]: about 85 bytes and three table entries fewer
    /// per message than the spelled-out four, which the broker decodes and
    /// encodes again at every publish and dead-lettering.
    #[default]
    Compact,
    /// The four headers `x-delay-router-exchange`, `-routing-key`,
    /// `-deadline` and `-hops`, as versions before the compact format wrote
    /// (and read: the only format they read).
    SpelledOut,
}

impl std::str::FromStr for TransitFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "compact" => Ok(Self::Compact),
            "spelled-out" => Ok(Self::SpelledOut),
            _ => Err("expected \"compact\" or \"spelled-out\"".into()),
        }
    }
}

/// The headers that record a [`Transit`], in either format (the lane mark
/// and the saved sender's values are not part of it).
const TRANSIT_RECORD: [&str; 5] = [
    TRANSIT,
    TRANSIT_EXCHANGE,
    TRANSIT_ROUTING_KEY,
    TRANSIT_DEADLINE,
    TRANSIT_HOPS,
];

impl Transit {
    /// The compact format's value: `<deadline> <hops> <n>:<exchange> <routing key>`.
    pub fn compact(&self) -> String {
        let (exchange, key) = (
            self.destination.exchange.as_str(),
            self.destination.routing_key.as_str(),
        );
        // Written by hand: `write!` costs several times the instructions on
        // this per-message path.
        let mut s = String::with_capacity(48 + exchange.len() + key.len());
        push_decimal(&mut s, self.deadline_ms);
        s.push(' ');
        push_decimal(&mut s, self.hops);
        s.push(' ');
        push_decimal(&mut s, i64::try_from(exchange.len()).unwrap_or(i64::MAX));
        s.push(':');
        s.push_str(exchange);
        s.push(' ');
        s.push_str(key);
        s
    }

    /// Reads [`Transit::compact`]'s form; `None` when it is not that.
    pub fn parse_compact(bytes: &[u8]) -> Option<Self> {
        let s = std::str::from_utf8(bytes).ok()?;
        let (deadline, rest) = s.split_once(' ')?;
        let (hops, rest) = rest.split_once(' ')?;
        let (len, rest) = rest.split_once(':')?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        let signed = |t: &str| digits(t.strip_prefix('-').unwrap_or(t));
        if !signed(deadline) || !signed(hops) || !digits(len) {
            return None;
        }
        let len: usize = len.parse().ok()?;
        let exchange = rest.get(..len)?;
        let routing_key = rest.get(len..)?.strip_prefix(' ')?;
        Some(Self {
            destination: Destination {
                exchange: ShortString::try_new(exchange).ok()?,
                routing_key: ShortString::try_new(routing_key).ok()?,
            },
            deadline_ms: deadline.parse().ok()?,
            hops: hops.parse().ok()?,
        })
    }
}

/// Appends `v` in decimal, as `Display` writes it.
fn push_decimal(s: &mut String, v: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = v.unsigned_abs();
    loop {
        at -= 1;
        // n % 10 < 10: the cast cannot truncate.
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        s.push('-');
    }
    s.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// A header table as lapin keeps it.
pub type Headers = BTreeMap<ShortString, AMQPValue>;

pub(crate) fn headers_of(props: &BasicProperties) -> Headers {
    props
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default()
}

/// The headers of `props` but those `drop` names, the rest copied. Cheaper
/// than copying all and removing some: the bucket's death headers (a nested
/// table) are never copied, and each key is looked at once.
fn headers_except(props: &BasicProperties, drop: impl Fn(&str) -> bool) -> Headers {
    props
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .filter(|(k, _)| !drop(k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Rebuilds properties with new headers, expiration, delivery mode and
/// priority, every other property copied unchanged (lapin's properties have
/// no setters that clear a field).
pub fn rebuild(
    p: &BasicProperties,
    headers: Option<Headers>,
    expiration: Option<ShortString>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
) -> BasicProperties {
    rebuild_as(
        p,
        headers,
        expiration,
        delivery_mode,
        priority,
        p.user_id().clone(),
    )
}

/// As [`rebuild`], with `user_id` set (or removed) too.
pub(crate) fn rebuild_as(
    p: &BasicProperties,
    headers: Option<Headers>,
    expiration: Option<ShortString>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
    user_id: Option<ShortString>,
) -> BasicProperties {
    let mut out = BasicProperties::default();
    macro_rules! copy {
        ($get:ident, $set:ident) => {
            if let Some(v) = p.$get().clone() {
                out = out.$set(v);
            }
        };
    }
    copy!(content_type, with_content_type);
    copy!(content_encoding, with_content_encoding);
    copy!(correlation_id, with_correlation_id);
    copy!(reply_to, with_reply_to);
    copy!(message_id, with_message_id);
    copy!(timestamp, with_timestamp);
    copy!(kind, with_type);
    copy!(app_id, with_app_id);
    copy!(cluster_id, with_cluster_id);
    if let Some(h) = headers {
        out = out.with_headers(FieldTable::from(h));
    }
    if let Some(e) = expiration {
        out = out.with_expiration(e);
    }
    if let Some(m) = delivery_mode {
        out = out.with_delivery_mode(m);
    }
    if let Some(p) = priority {
        out = out.with_priority(p);
    }
    if let Some(u) = user_id {
        out = out.with_user_id(u);
    }
    out
}

/// What a placement sets on a message in a bucket besides where it goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Per-message TTL.
    pub expiration: Option<std::time::Duration>,
    /// Message priority in a priority bucket.
    pub priority: Option<u8>,
    /// How the transit record is written.
    pub format: TransitFormat,
}

impl Overrides {
    fn expiration(&self) -> Option<ShortString> {
        self.expiration
            .map(|d| ShortString::from(d.as_millis().max(1).to_string()))
    }
}

/// Writes the transit record into `h`, which holds none (either format).
fn put_transit(h: &mut Headers, t: &Transit, o: Overrides) {
    match o.format {
        TransitFormat::Compact => {
            h.insert(TRANSIT.into(), AMQPValue::LongString(t.compact().into()));
        }
        TransitFormat::SpelledOut => {
            h.insert(
                TRANSIT_EXCHANGE.into(),
                AMQPValue::LongString(t.destination.exchange.as_str().into()),
            );
            h.insert(
                TRANSIT_ROUTING_KEY.into(),
                AMQPValue::LongString(t.destination.routing_key.as_str().into()),
            );
            h.insert(
                TRANSIT_DEADLINE.into(),
                AMQPValue::LongLongInt(t.deadline_ms),
            );
            h.insert(TRANSIT_HOPS.into(), AMQPValue::LongLongInt(t.hops));
        }
    }
    // An earlier version's lane mark, on a message it placed.
    h.remove(TRANSIT_LANE);
}

/// Moves the sender's `expiration` and non-persistent `delivery-mode` aside,
/// so the message is persistent and never expires on its own while stored.
/// Nothing is written when nothing differs (no expiration, persistent, has
/// headers): the common case costs the broker no extra header bytes.
pub(crate) fn save_properties(p: &BasicProperties, h: &mut Headers, overrides_priority: bool) {
    let mut saved = FieldTable::default();
    if overrides_priority {
        match *p.priority() {
            Some(v) => saved.insert(SAVED_PRIORITY.into(), AMQPValue::ShortShortUInt(v)),
            None => saved.insert(SAVED_NO_PRIORITY.into(), AMQPValue::Boolean(true)),
        };
    }
    if let Some(e) = p.expiration() {
        saved.insert(
            SAVED_EXPIRATION.into(),
            AMQPValue::LongString(e.as_str().into()),
        );
    }
    match *p.delivery_mode() {
        Some(PERSISTENT) => {}
        Some(m) => {
            saved.insert(SAVED_DELIVERY_MODE.into(), AMQPValue::ShortShortUInt(m));
        }
        None => {
            saved.insert(SAVED_NO_DELIVERY_MODE.into(), AMQPValue::Boolean(true));
        }
    }
    if p.headers().is_none() {
        saved.insert(SAVED_NO_HEADERS.into(), AMQPValue::Boolean(true));
    }
    if !saved.inner().is_empty() {
        h.insert(SAVED_PROPERTIES.into(), AMQPValue::FieldTable(saved));
    }
}

/// The properties a message has in its first bucket: the sender's, with the
/// transit headers added, death headers and expiration set aside, persistent.
pub fn enter_transit(p: &BasicProperties, transit: &Transit, o: Overrides) -> BasicProperties {
    let mut h = headers_of(p);
    // Most messages carry neither: one look at each key instead of fourteen
    // lookups in the table.
    if h.keys().any(|k| {
        let k = k.as_str();
        TRANSIT_HEADERS.contains(&k) || DEATH_HEADERS.contains(&k)
    }) {
        for k in TRANSIT_HEADERS {
            h.remove(k);
        }
        let mut saved = FieldTable::default();
        for k in DEATH_HEADERS {
            if let Some(v) = h.remove(k) {
                saved.insert(k.into(), v);
            }
        }
        if !saved.inner().is_empty() {
            h.insert(SAVED_HEADERS.into(), AMQPValue::FieldTable(saved));
        }
    }
    save_properties(p, &mut h, o.priority.is_some());
    put_transit(&mut h, transit, o);
    rebuild(
        p,
        Some(h),
        o.expiration(),
        Some(PERSISTENT),
        o.priority.or(*p.priority()),
    )
}

/// Why the transit headers of an expired message cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitError {
    #[error("{0} is missing or malformed")]
    Malformed(&'static str),
}

/// Reads the router's transit headers from a message a bucket expired: the
/// compact record when there is one, else the spelled-out headers.
pub fn read_transit(p: &BasicProperties) -> Result<Transit, TransitError> {
    let empty = FieldTable::default();
    let h = p.headers().as_ref().unwrap_or(&empty);
    if let Some(v) = h.inner().get(TRANSIT) {
        return match v {
            AMQPValue::LongString(s) => Transit::parse_compact(s.as_bytes()),
            _ => None,
        }
        .ok_or(TransitError::Malformed(TRANSIT));
    }
    let exchange = short_string(h, TRANSIT_EXCHANGE)
        .ok()
        .flatten()
        .ok_or(TransitError::Malformed(TRANSIT_EXCHANGE))?;
    let routing_key = short_string(h, TRANSIT_ROUTING_KEY)
        .ok()
        .flatten()
        .ok_or(TransitError::Malformed(TRANSIT_ROUTING_KEY))?;
    let deadline_ms =
        integer(h, TRANSIT_DEADLINE).ok_or(TransitError::Malformed(TRANSIT_DEADLINE))?;
    let hops = integer(h, TRANSIT_HOPS).unwrap_or(1);
    Ok(Transit {
        destination: Destination {
            exchange,
            routing_key,
        },
        deadline_ms,
        hops,
    })
}

/// The properties for another bucket placement: the broker's death headers
/// from the last bucket dropped, the transit headers updated.
/// A message that entered transit under one strategy may be placed by another
/// (after a strategy switch); a priority it did not have saved is then saved
/// as absent-or-current, which is what the sender set.
pub fn next_hop(p: &BasicProperties, transit: &Transit, o: Overrides) -> BasicProperties {
    // The record is written anew, in `o`'s format (a message placed by
    // an earlier version, or under the other format, changes to it).
    let mut h = headers_except(p, |k| {
        DEATH_HEADERS.contains(&k) || TRANSIT_RECORD.contains(&k)
    });
    put_transit(&mut h, transit, o);
    if o.priority.is_some() {
        let saved = match h.get(SAVED_PROPERTIES) {
            Some(AMQPValue::FieldTable(t)) => t.clone(),
            _ => FieldTable::default(),
        };
        if !saved.contains_key(SAVED_PRIORITY) && !saved.contains_key(SAVED_NO_PRIORITY) {
            let mut saved = saved;
            match *p.priority() {
                Some(v) => saved.insert(SAVED_PRIORITY.into(), AMQPValue::ShortShortUInt(v)),
                None => saved.insert(SAVED_NO_PRIORITY.into(), AMQPValue::Boolean(true)),
            };
            h.insert(SAVED_PROPERTIES.into(), AMQPValue::FieldTable(saved));
        }
    }
    rebuild(
        p,
        Some(h),
        o.expiration(),
        Some(PERSISTENT),
        o.priority.or(*p.priority()),
    )
}

/// Headers a quorum queue adds to a message it delivers again: the failed
/// deliveries (`x-delivery-count`, 3.10 and later) and, from RabbitMQ 4.0,
/// every delivery (`x-acquired-count`).
pub const REDELIVERY_HEADERS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// `p` without the [`REDELIVERY_HEADERS`], or `None` when it has none. The
/// router's own quorum queues add them when they redeliver (after a crash or
/// a lost connection); they describe that queue, not the message, so they
/// must neither reach the destination nor change the message's derived id.
pub fn without_redelivery_headers(p: &BasicProperties) -> Option<BasicProperties> {
    let h = p.headers().as_ref()?;
    if !REDELIVERY_HEADERS.iter().any(|k| h.contains_key(k)) {
        return None;
    }
    let mut h = h.inner().clone();
    for k in REDELIVERY_HEADERS {
        h.remove(k);
    }
    Some(p.clone().with_headers(h.into()))
}

/// The sender's properties of a message coming out of a bucket: restored when
/// it is in transit, as they are otherwise.
pub fn sender_properties(p: &BasicProperties) -> BasicProperties {
    if read_transit(p).is_ok() {
        leave_transit(p)
    } else {
        p.clone()
    }
}

/// The sender's properties, restored exactly: transit and bucket death headers
/// removed, saved headers and properties put back.
pub fn leave_transit(p: &BasicProperties) -> BasicProperties {
    let saved_headers = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(SAVED_HEADERS));
    let saved_props = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(SAVED_PROPERTIES));
    let mut h = headers_except(p, |k| {
        DEATH_HEADERS.contains(&k) || TRANSIT_HEADERS.contains(&k)
    });
    if let Some(AMQPValue::FieldTable(saved)) = saved_headers {
        for (k, v) in saved.inner() {
            h.insert(k.clone(), v.clone());
        }
    }
    match saved_props {
        Some(AMQPValue::FieldTable(saved)) => {
            let (expiration, delivery_mode, had_headers) = saved_values(saved);
            let priority = match saved.inner().get(SAVED_PRIORITY) {
                Some(AMQPValue::ShortShortUInt(v)) => Some(*v),
                _ if saved.contains_key(SAVED_NO_PRIORITY) => None,
                _ => *p.priority(),
            };
            rebuild(
                p,
                had_headers.then_some(h),
                expiration,
                delivery_mode,
                priority,
            )
        }
        // Nothing was saved: the sender's message was persistent, without
        // expiration, with headers — as it is in the bucket.
        _ => rebuild(p, Some(h), None, Some(PERSISTENT), *p.priority()),
    }
}

pub(crate) fn saved_values(saved: &FieldTable) -> (Option<ShortString>, Option<u8>, bool) {
    let expiration = match saved.inner().get(SAVED_EXPIRATION) {
        Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes())
            .ok()
            .and_then(|s| ShortString::try_new(s).ok()),
        _ => None,
    };
    let delivery_mode = match saved.inner().get(SAVED_DELIVERY_MODE) {
        Some(AMQPValue::ShortShortUInt(m)) => Some(*m),
        _ if saved.inner().contains_key(SAVED_NO_DELIVERY_MODE) => None,
        _ => Some(PERSISTENT),
    };
    let had_headers = !matches!(
        saved.inner().get(SAVED_NO_HEADERS),
        Some(AMQPValue::Boolean(true))
    );
    (expiration, delivery_mode, had_headers)
}

#[cfg(test)]
mod tests;
