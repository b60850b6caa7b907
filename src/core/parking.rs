//! Parking: what a parked message looks like, how replay gives the sender's
//! message back, how a parked copy is made to fit one frame, and the
//! contingency a delivery carries for when its destination refuses it. Pure.

use crate::core::contract::{
    Destination, PARK_REASON, PARKED_AT, SAVED_PROPERTIES, TRANSIT, TRANSIT_EXCHANGE,
    TRANSIT_ROUTING_KEY, short_string,
};
use crate::core::envelope::{
    PERSISTENT, Transit, headers_of, leave_transit, rebuild, rebuild_as, save_properties,
    saved_values,
};
use crate::core::reasons::{BrokerReply, ParkReason};
use crate::core::retry::RETRY_HEADERS;
use crate::core::wire;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// In the saved properties of a parked message: the sender's `user-id`.
const SAVED_USER_ID: &str = "user-id";

/// The properties of a parked message: the sender's (as given), plus
/// `x-park-reason`, `x-parked-at`, the destination when known; persistent and
/// without expiration or user-id, the sender's values saved for replay.
pub fn park(
    p: &BasicProperties,
    reason: &ParkReason,
    now_ms: i64,
    destination: Option<&Destination>,
) -> BasicProperties {
    with_reason(&parked(p, now_ms, destination), reason)
}

/// A parked message but for its `x-park-reason` (see [`park`]).
pub fn parked(
    p: &BasicProperties,
    now_ms: i64,
    destination: Option<&Destination>,
) -> BasicProperties {
    let mut h = headers_of(p);
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
    // RabbitMQ takes a user-id only from that user: set aside, so that the
    // router (as another user) can always park it.
    if let Some(user_id) = p.user_id() {
        let mut saved = match h.remove(SAVED_PROPERTIES) {
            Some(AMQPValue::FieldTable(t)) => t,
            _ => FieldTable::default(),
        };
        saved.insert(
            SAVED_USER_ID.into(),
            AMQPValue::LongString(user_id.as_str().into()),
        );
        h.insert(SAVED_PROPERTIES.into(), AMQPValue::FieldTable(saved));
    }
    rebuild_as(p, Some(h), None, Some(PERSISTENT), *p.priority(), None)
}

/// `parked` with its `x-park-reason`.
pub fn with_reason(parked: &BasicProperties, reason: &ParkReason) -> BasicProperties {
    let mut h = headers_of(parked);
    h.insert(
        PARK_REASON.into(),
        AMQPValue::LongString(LongString::from(reason.to_string())),
    );
    parked.clone().with_headers(h.into())
}

/// What replay publishes for a parked message: the sender's message again.
/// Park and retry bookkeeping headers are removed (a replayed message starts
/// with a fresh attempt count), the saved properties restored; every other
/// header, the sender's `x-death` included, stays.
pub fn unpark(p: &BasicProperties) -> BasicProperties {
    // Still in transit, compact: parked by a router of an earlier version,
    // which does not read the compact record ("without the router's transit
    // headers"). The sender's message is what leaving transit gives back.
    if compact_record(p).is_some() {
        return unpark_in_transit(p);
    }
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
            let user_id = match saved.inner().get(SAVED_USER_ID) {
                Some(AMQPValue::LongString(u)) => std::str::from_utf8(u.as_bytes())
                    .ok()
                    .and_then(|u| ShortString::try_new(u).ok()),
                _ => p.user_id().clone(),
            };
            rebuild_as(
                p,
                had_headers.then_some(h),
                expiration,
                delivery_mode,
                *p.priority(),
                user_id,
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
/// [`unpark`] of a message parked in transit: the sender's message as
/// leaving transit restores it, without the park's and retries' headers,
/// with the `user-id` the park set aside.
fn unpark_in_transit(p: &BasicProperties) -> BasicProperties {
    let user_id = match p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(SAVED_PROPERTIES))
    {
        Some(AMQPValue::FieldTable(saved)) => match saved.inner().get(SAVED_USER_ID) {
            Some(AMQPValue::LongString(u)) => std::str::from_utf8(u.as_bytes())
                .ok()
                .and_then(|u| ShortString::try_new(u).ok()),
            _ => None,
        },
        _ => None,
    };
    let mut out = leave_transit(p);
    if let Some(h) = out.headers().as_ref() {
        let mut h = h.inner().clone();
        for k in [PARK_REASON, PARKED_AT].into_iter().chain(RETRY_HEADERS) {
            h.remove(k);
        }
        out = out.with_headers(h.into());
    }
    match user_id {
        Some(u) => out.with_user_id(u),
        None => out,
    }
}

/// Or, for a message parked still in transit by an earlier version, the
/// destination in its compact transit record.
pub fn parked_destination(p: &BasicProperties) -> Option<Destination> {
    let h = p.headers().as_ref()?;
    match (
        short_string(h, TRANSIT_EXCHANGE).ok().flatten(),
        short_string(h, TRANSIT_ROUTING_KEY).ok().flatten(),
    ) {
        (Some(exchange), Some(routing_key)) => Some(Destination {
            exchange,
            routing_key,
        }),
        _ => compact_record(p).map(|t| t.destination),
    }
}

/// The compact transit record `p` carries, when it carries a readable one.
fn compact_record(p: &BasicProperties) -> Option<Transit> {
    match p.headers().as_ref()?.inner().get(TRANSIT)? {
        AMQPValue::LongString(s) => Transit::parse_compact(s.as_bytes()),
        _ => None,
    }
}

/// A parked copy of a message made to fit one content-header frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The parked message but for its `x-park-reason`.
    pub parked: BasicProperties,
    /// Sender headers removed to fit, with their encoded sizes.
    pub removed: Vec<(String, usize)>,
    frame_max: u32,
}

impl Fitted {
    /// The reason to park with: `base`, naming the removed headers if any.
    pub fn reason(&self, base: ParkReason) -> ParkReason {
        if self.removed.is_empty() {
            base
        } else {
            ParkReason::HeadersRemoved {
                reason: Box::new(base),
                frame_max: self.frame_max,
                removed: self.removed.clone(),
            }
        }
    }

    /// The parked properties with `reason`.
    pub fn properties(&self, reason: &ParkReason) -> BasicProperties {
        with_reason(&self.parked, reason)
    }
}

/// Parks `sender` so that the copy, with a reason as long as `reason`, fits
/// a frame of `frame_max` bytes: AMQP cannot split a header, and the broker
/// closes the connection on a larger frame. With the destination headers
/// when they fit, else without, else with the sender's largest headers
/// removed one by one (each named in the reason).
pub fn fit(
    sender: &BasicProperties,
    reason: &ParkReason,
    now_ms: i64,
    destination: Option<&Destination>,
    frame_max: u32,
) -> Fitted {
    let fitted = |parked, removed| Fitted {
        parked,
        removed,
        frame_max,
    };
    for destination in [destination, None] {
        let parked = parked(sender, now_ms, destination);
        if wire::fits(&with_reason(&parked, reason), frame_max) {
            return fitted(parked, Vec::new());
        }
    }
    let mut headers = headers_of(sender);
    let mut removed = Vec::new();
    while let Some((name, size)) = wire::largest_header(&headers) {
        headers.remove(&name);
        removed.push((name.to_string(), size));
        let parked = parked(
            &sender.clone().with_headers(headers.clone().into()),
            now_ms,
            None,
        );
        let f = fitted(parked, removed.clone());
        if wire::fits(&f.properties(&f.reason(reason.clone())), frame_max) || headers.is_empty() {
            return f;
        }
    }
    // No headers at all and still too large: cannot happen for properties
    // that arrived in a frame (their other fields are at most a few KB).
    fitted(parked(sender, now_ms, None), removed)
}

/// Why a delivery's destination did not take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Routed nowhere (`mandatory`: NO_ROUTE).
    Returned,
    /// Refused with `basic.nack`.
    Nacked,
    /// The broker closed the channel over the publish (or did so for this
    /// destination `remembered_ms` ago).
    Refused {
        reply: BrokerReply,
        remembered_ms: Option<u64>,
    },
}

/// Parks a delivery its destination did not take: the sender's message (as
/// delivered) with the reason for `failure`, the destination recorded for
/// replay, fitted to a frame of `frame_max` bytes.
pub fn refused_delivery(
    sender: &BasicProperties,
    destination: &Destination,
    failure: Failure,
    now_ms: i64,
    frame_max: u32,
) -> (ParkReason, BasicProperties) {
    let reason = failure_reason(destination, failure);
    let fitted = fit(sender, &reason, now_ms, Some(destination), frame_max);
    let reason = fitted.reason(reason);
    let properties = fitted.properties(&reason);
    (reason, properties)
}

fn failure_reason(d: &Destination, failure: Failure) -> ParkReason {
    let exchange = crate::core::reasons::exchange_label(d.exchange.as_str()).to_owned();
    match failure {
        Failure::Returned => ParkReason::NoRoute {
            exchange,
            routing_key: d.routing_key.to_string(),
        },
        Failure::Nacked => ParkReason::Nacked(exchange),
        Failure::Refused {
            reply,
            remembered_ms,
        } => ParkReason::refused(d, reply, remembered_ms),
    }
}

#[cfg(test)]
mod tests;
