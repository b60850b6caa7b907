//! The envelope: how a message's properties change as it enters a bucket,
//! moves between buckets, is delivered or is parked — and how the sender's
//! original properties are restored exactly on the way out.
//!
//! In a bucket the router overrides `expiration` (removed) and `delivery-mode`
//! (persistent), and the broker adds `x-death` headers. The sender's values are
//! kept in [`SAVED_PROPERTIES`] and [`SAVED_HEADERS`] and put back on delivery.

use crate::contract::{
    DEATH_HEADERS, Destination, PARK_REASON, PARKED_AT, SAVED_HEADERS, SAVED_PROPERTIES,
    TRANSIT_DEADLINE, TRANSIT_EXCHANGE, TRANSIT_HEADERS, TRANSIT_HOPS, TRANSIT_ROUTING_KEY,
    integer, short_string,
};
use crate::park::ParkReason;
use crate::retry::RETRY_HEADERS;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
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

type Headers = BTreeMap<ShortString, AMQPValue>;

fn headers_of(props: &BasicProperties) -> Headers {
    props
        .headers()
        .as_ref()
        .map(|h| h.inner().clone())
        .unwrap_or_default()
}

/// Rebuilds properties with new headers, expiration and delivery mode, every
/// other property copied unchanged (lapin's properties have no setters to clear a field).
fn rebuild(
    p: &BasicProperties,
    headers: Option<Headers>,
    expiration: Option<ShortString>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
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
    copy!(user_id, with_user_id);
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
    out
}

/// What a placement strategy sets on a message in a bucket besides the transit headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Per-message TTL.
    pub expiration: Option<std::time::Duration>,
    /// Message priority in a priority bucket.
    pub priority: Option<u8>,
}

impl Overrides {
    fn expiration(&self) -> Option<ShortString> {
        self.expiration
            .map(|d| ShortString::from(d.as_millis().max(1).to_string()))
    }
}

fn put_transit(h: &mut Headers, t: &Transit) {
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

fn remove_death(h: &mut Headers) {
    for k in DEATH_HEADERS {
        h.remove(k);
    }
}

/// Moves the sender's `expiration` and non-persistent `delivery-mode` aside,
/// so the message is persistent and never expires on its own while stored.
/// Nothing is written when nothing differs (no expiration, persistent, has
/// headers): the common case costs the broker no extra header bytes.
fn save_properties(p: &BasicProperties, h: &mut Headers, overrides_priority: bool) {
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
    save_properties(p, &mut h, o.priority.is_some());
    put_transit(&mut h, transit);
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

/// Reads the router's transit headers from a message a bucket expired.
pub fn read_transit(p: &BasicProperties) -> Result<Transit, TransitError> {
    let empty = FieldTable::default();
    let h = p.headers().as_ref().unwrap_or(&empty);
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
    let mut h = headers_of(p);
    remove_death(&mut h);
    put_transit(&mut h, transit);
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

/// The header a quorum queue adds to a message it delivers again.
pub const DELIVERY_COUNT: &str = "x-delivery-count";

/// `p` without `x-delivery-count`, or `None` when it has none. The router's
/// own quorum queues add it when they redeliver (after a crash or a lost
/// connection); it describes that queue, not the message, so it must neither
/// reach the destination nor change the message's derived id.
pub fn without_delivery_count(p: &BasicProperties) -> Option<BasicProperties> {
    let h = p.headers().as_ref()?;
    if !h.contains_key(DELIVERY_COUNT) {
        return None;
    }
    let mut h = h.inner().clone();
    h.remove(DELIVERY_COUNT);
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
    let mut h = headers_of(p);
    remove_death(&mut h);
    let saved_headers = h.remove(SAVED_HEADERS);
    let saved_props = h.remove(SAVED_PROPERTIES);
    for k in TRANSIT_HEADERS {
        h.remove(k);
    }
    if let Some(AMQPValue::FieldTable(saved)) = saved_headers {
        for (k, v) in saved.inner() {
            h.insert(k.clone(), v.clone());
        }
    }
    match &saved_props {
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

fn saved_values(saved: &FieldTable) -> (Option<ShortString>, Option<u8>, bool) {
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

/// The properties of a parked message: the sender's (as given), plus
/// `x-park-reason`, `x-parked-at`, the destination when known; persistent and
/// without expiration, the sender's values saved for replay.
pub fn park(
    p: &BasicProperties,
    reason: &ParkReason,
    now_ms: i64,
    destination: Option<&Destination>,
) -> BasicProperties {
    let mut h = headers_of(p);
    h.insert(
        PARK_REASON.into(),
        AMQPValue::LongString(LongString::from(reason.to_string())),
    );
    h.insert(PARKED_AT.into(), AMQPValue::LongLongInt(now_ms));
    if let Some(d) = destination {
        h.insert(
            TRANSIT_EXCHANGE.into(),
            AMQPValue::LongString(d.exchange.as_str().into()),
        );
        h.insert(
            TRANSIT_ROUTING_KEY.into(),
            AMQPValue::LongString(d.routing_key.as_str().into()),
        );
    }
    // Saved when replay would otherwise not restore them exactly (a message
    // without headers gets some here).
    if p.expiration().is_some() || *p.delivery_mode() != Some(PERSISTENT) || p.headers().is_none() {
        save_properties(p, &mut h, false);
    }
    rebuild(p, Some(h), None, Some(PERSISTENT), *p.priority())
}

/// What replay publishes for a parked message: the sender's message again.
/// Park and retry bookkeeping headers are removed (a replayed message starts
/// with a fresh attempt count), the saved properties restored; every other
/// header, the sender's `x-death` included, stays.
pub fn unpark(p: &BasicProperties) -> BasicProperties {
    let mut h = headers_of(p);
    for k in [
        PARK_REASON,
        PARKED_AT,
        TRANSIT_EXCHANGE,
        TRANSIT_ROUTING_KEY,
    ]
    .into_iter()
    .chain(RETRY_HEADERS)
    {
        h.remove(k);
    }
    match h.remove(SAVED_PROPERTIES) {
        Some(AMQPValue::FieldTable(saved)) => {
            let (expiration, delivery_mode, had_headers) = saved_values(&saved);
            rebuild(
                p,
                had_headers.then_some(h),
                expiration,
                delivery_mode,
                *p.priority(),
            )
        }
        _ => rebuild(
            p,
            Some(h),
            p.expiration().clone(),
            *p.delivery_mode(),
            *p.priority(),
        ),
    }
}

/// The destination a parked message recorded, when the router knew it.
pub fn parked_destination(p: &BasicProperties) -> Option<Destination> {
    let h = p.headers().as_ref()?;
    Some(Destination {
        exchange: short_string(h, TRANSIT_EXCHANGE).ok()??,
        routing_key: short_string(h, TRANSIT_ROUTING_KEY).ok()??,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldArray;

    fn sender_props() -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(
            "x-requested-delay".into(),
            AMQPValue::LongString("5s".into()),
        );
        h.insert("app".into(), AMQPValue::LongInt(7));
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString("w".into())])),
        );
        h.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("work".into()),
        );
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(h)
            .with_delivery_mode(1)
            .with_priority(3)
            .with_correlation_id("c-1".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_700_000_000)
            .with_type("order.created".into())
            .with_user_id("guest".into())
            .with_app_id("shop".into())
    }

    fn transit() -> Transit {
        Transit {
            destination: Destination {
                exchange: "orders".into(),
                routing_key: "eu".into(),
            },
            deadline_ms: 1_000,
            hops: 1,
        }
    }

    /// What a bucket does to a message when it dead-letters it.
    fn broker_dead_letters(p: &BasicProperties) -> BasicProperties {
        let mut h = headers_of(p);
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
                "bucket".into(),
            )])),
        );
        h.insert(
            "x-first-death-reason".into(),
            AMQPValue::LongString("expired".into()),
        );
        h.insert(
            "x-first-death-queue".into(),
            AMQPValue::LongString("delay.bucket.1s".into()),
        );
        rebuild(p, Some(h), None, *p.delivery_mode(), *p.priority())
    }

    #[test]
    fn in_transit_a_message_is_persistent_without_expiration_and_carries_its_route() {
        let p = enter_transit(&sender_props(), &transit(), Overrides::default());
        assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
        assert_eq!(*p.expiration(), None);
        assert_eq!(read_transit(&p), Ok(transit()));
        let h = p.headers().as_ref().unwrap();
        assert!(!h.contains_key("x-death"), "sender's x-death is set aside");
    }

    #[test]
    fn leaving_transit_restores_every_sender_property_exactly() {
        let original = sender_props();
        let mut p = enter_transit(&original, &transit(), Overrides::default());
        p = broker_dead_letters(&p);
        p = next_hop(
            &p,
            &Transit {
                hops: 2,
                ..transit()
            },
            Overrides::default(),
        );
        p = broker_dead_letters(&p);
        assert_eq!(read_transit(&p).unwrap().hops, 2);
        assert_eq!(leave_transit(&p), original);
    }

    #[test]
    fn every_combination_of_saved_properties_round_trips() {
        for mode in [None, Some(1), Some(2)] {
            for expiration in [None, Some("5000")] {
                for headers in [None, Some(FieldTable::default())] {
                    let mut p = BasicProperties::default().with_app_id("a".into());
                    if let Some(m) = mode {
                        p = p.with_delivery_mode(m);
                    }
                    if let Some(e) = expiration {
                        p = p.with_expiration(e.into());
                    }
                    if let Some(h) = headers.clone() {
                        p = p.with_headers(h);
                    }
                    let back = leave_transit(&broker_dead_letters(&enter_transit(
                        &p,
                        &transit(),
                        Overrides::default(),
                    )));
                    assert_eq!(back, p, "{mode:?} {expiration:?} {headers:?}");
                }
            }
        }
    }

    #[test]
    fn strategy_overrides_are_undone_on_delivery() {
        let o = Overrides {
            expiration: Some(std::time::Duration::from_millis(1500)),
            priority: Some(9),
        };
        for original in [
            sender_props(),
            BasicProperties::default().with_headers(FieldTable::default()),
        ] {
            let p = enter_transit(&original, &transit(), o);
            assert_eq!(p.expiration().as_ref().map(|e| e.as_str()), Some("1500"));
            assert_eq!(*p.priority(), Some(9));
            let p = next_hop(
                &broker_dead_letters(&p),
                &transit(),
                Overrides {
                    priority: Some(4),
                    ..o
                },
            );
            assert_eq!(*p.priority(), Some(4));
            assert_eq!(leave_transit(&broker_dead_letters(&p)), original);
        }
        // Entered under round-up, placed again under priority after a switch.
        let original = BasicProperties::default().with_headers(FieldTable::default());
        let p = enter_transit(&original, &transit(), Overrides::default());
        let p = next_hop(&broker_dead_letters(&p), &transit(), o);
        assert_eq!(leave_transit(&broker_dead_letters(&p)), original);
    }

    #[test]
    fn a_sender_without_headers_gets_none_back() {
        let original = BasicProperties::default().with_message_id("m".into());
        let p = broker_dead_letters(&enter_transit(&original, &transit(), Overrides::default()));
        assert_eq!(leave_transit(&p), original);
        let empty = BasicProperties::default().with_headers(FieldTable::default());
        let p = broker_dead_letters(&enter_transit(&empty, &transit(), Overrides::default()));
        assert_eq!(leave_transit(&p), empty);
    }

    #[test]
    fn incoming_transit_headers_are_replaced_not_trusted() {
        let mut h = FieldTable::default();
        h.insert(
            TRANSIT_EXCHANGE.into(),
            AMQPValue::LongString("evil".into()),
        );
        h.insert(TRANSIT_DEADLINE.into(), AMQPValue::LongLongInt(0));
        let p = enter_transit(
            &BasicProperties::default().with_headers(h),
            &transit(),
            Overrides::default(),
        );
        assert_eq!(read_transit(&p), Ok(transit()));
    }

    #[test]
    fn a_message_without_transit_headers_is_refused() {
        assert_eq!(
            read_transit(&BasicProperties::default()),
            Err(TransitError::Malformed(TRANSIT_EXCHANGE))
        );
    }

    #[test]
    fn unparking_gives_back_the_sender_message_without_bookkeeping() {
        let original = sender_props();
        let d = transit().destination;
        let parked = park(&original, &ParkReason::MissingDelay, 42, Some(&d));
        assert_eq!(parked_destination(&parked), Some(d));
        assert_eq!(unpark(&parked), original);
        let mut h = headers_of(&original);
        h.insert(crate::retry::ATTEMPTS.into(), AMQPValue::LongLongInt(4));
        let retried = rebuild(
            &original,
            Some(h),
            original.expiration().clone(),
            *original.delivery_mode(),
            *original.priority(),
        );
        assert_eq!(
            unpark(&park(&retried, &ParkReason::MissingDelay, 42, None)),
            original
        );
        assert_eq!(
            parked_destination(&park(&original, &ParkReason::MissingDelay, 42, None)),
            None
        );
    }

    #[test]
    fn parked_messages_keep_the_sender_view_plus_the_reason() {
        let p = park(
            &sender_props(),
            &ParkReason::MissingDelay,
            42,
            Some(&transit().destination),
        );
        let h = p.headers().as_ref().unwrap();
        assert_eq!(
            h.inner().get(PARK_REASON),
            Some(&AMQPValue::LongString(
                ParkReason::MissingDelay.to_string().into()
            ))
        );
        assert_eq!(h.inner().get(PARKED_AT), Some(&AMQPValue::LongLongInt(42)));
        assert_eq!(h.inner().get("app"), Some(&AMQPValue::LongInt(7)));
        assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
        assert_eq!(*p.expiration(), None);
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
    }

    #[test]
    fn a_quorum_queues_delivery_count_is_dropped_and_nothing_else() {
        let mut h = FieldTable::default();
        h.insert("a".into(), AMQPValue::LongInt(1));
        let plain = BasicProperties::default().with_headers(h.clone());
        assert_eq!(without_delivery_count(&plain), None);
        assert_eq!(without_delivery_count(&BasicProperties::default()), None);
        h.insert(DELIVERY_COUNT.into(), AMQPValue::LongLongInt(2));
        let counted = BasicProperties::default()
            .with_headers(h)
            .with_message_id("m".into());
        assert_eq!(
            without_delivery_count(&counted),
            Some(plain.with_message_id("m".into()))
        );
    }

    #[test]
    fn a_message_without_headers_is_replayed_without_headers() {
        let sent = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_message_id("m".into());
        let parked = park(&sent, &ParkReason::MissingDelay, 1, None);
        assert_eq!(unpark(&parked), sent);
    }
}
