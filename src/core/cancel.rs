//! Cancelling a waiting message by its message-id: the tombstone records
//! written to `<prefix>.cancels` (a stream every router reads at start and
//! follows), and reading them back. Pure.
//!
//! A tombstone is an empty message with two headers: `x-cancel-message-id`
//! and `x-delay-router-cancel-until` (when it stops mattering, ms since the
//! Unix epoch). A router also writes a catch-up marker
//! (`x-delay-router-marker`) at each start and reads the stream until it
//! sees it: every tombstone written before then is known before it consumes
//! a bucket's expiries.

use crate::core::contract::{self, CANCEL_MESSAGE_ID, TOMBSTONE_MARKER, TOMBSTONE_UNTIL};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

/// One record of the cancels stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Messages with this message-id are removed at their next expiry, until `until_ms`.
    Tombstone { message_id: String, until_ms: i64 },
    /// A router's catch-up marker.
    Marker(String),
}

/// The properties of a tombstone for `message_id`, alive until `until_ms`.
pub fn tombstone(message_id: &ShortString, until_ms: i64) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(
        CANCEL_MESSAGE_ID.into(),
        AMQPValue::LongString(LongString::from(message_id.as_str())),
    );
    h.insert(TOMBSTONE_UNTIL.into(), AMQPValue::LongLongInt(until_ms));
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(h)
}

/// The properties of a catch-up marker with `token`.
pub fn marker(token: &str) -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(
        TOMBSTONE_MARKER.into(),
        AMQPValue::LongString(LongString::from(token)),
    );
    BasicProperties::default().with_headers(h)
}

/// Reads a record of the cancels stream; `None` for anything else (a
/// message someone published there by hand is ignored).
pub fn read(p: &BasicProperties) -> Option<Record> {
    let h = p.headers().as_ref()?;
    if let Ok(Some(token)) = contract::short_string(h, TOMBSTONE_MARKER) {
        return Some(Record::Marker(token.to_string()));
    }
    let id = contract::short_string(h, CANCEL_MESSAGE_ID).ok()??;
    if id.as_str().is_empty() {
        return None;
    }
    Some(Record::Tombstone {
        message_id: id.to_string(),
        until_ms: contract::integer(h, TOMBSTONE_UNTIL).unwrap_or(i64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tombstones_and_markers_read_back() {
        let p = tombstone(&"order-7".into(), 1_000);
        assert_eq!(
            read(&p),
            Some(Record::Tombstone {
                message_id: "order-7".into(),
                until_ms: 1_000
            })
        );
        assert_eq!(read(&marker("t1")), Some(Record::Marker("t1".into())));
        assert_eq!(read(&BasicProperties::default()), None);
        assert_eq!(read(&tombstone(&"".into(), 5)), None);
    }
}
