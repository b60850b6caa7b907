//! Stable message ids. A message that arrives without a `message-id` gets one
//! derived from its content: the exchange and routing key it was published
//! with, its encoded properties and its body. The same delivery redelivered
//! after a crash gets the same id, so consumers can de-duplicate what the
//! router sends twice. Pure.
//!
//! A random id drawn at ingress would not do: when the router dies after its
//! publish is confirmed but before its ack reaches the broker, the broker
//! redelivers the ingress message and a second, different id would follow.
//!
//! Two byte-identical messages published without ids (same exchange, routing
//! key, headers and body) get the same id; senders who publish such twins and
//! want both treated as distinct set their own `message-id`.

use crate::core::wire;
use lapin::BasicProperties;
use std::borrow::Cow;
use crate::tuning::HASH_ONE_SHOT_UP_TO as ONE_SHOT_UP_TO;

/// Prefix of ids the router derives.
pub const PREFIX: &str = "dr-";

/// `p` with a `message-id`: the sender's own when it has a non-empty one,
/// else one derived from the message's content.
/// Copied only when they are borrowed and need the id.
pub fn ensure_message_id<'a>(
    p: Cow<'a, BasicProperties>,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
) -> Cow<'a, BasicProperties> {
    match p.message_id() {
        Some(id) if !id.as_str().is_empty() => p,
        _ => {
            let id = derive(&p, exchange, routing_key, body).into();
            Cow::Owned(p.into_owned().with_message_id(id))
        }
    }
}

/// `dr-` and 32 hex digits: the 128-bit XXH3 of the message's content.
///
/// A fingerprint, not a secret: whoever may publish to the router can set
/// any `message-id` anyway, so a cryptographic hash protects nothing here.
/// A fast non-cryptographic hash: the id names a message, it does not
/// authenticate it. Changing the hash gives a message redelivered at
/// ingress across the upgrade a new id.
pub fn derive(p: &BasicProperties, exchange: &str, routing_key: &str, body: &[u8]) -> String {
    let digest = content_hash(p, exchange, routing_key, body, ONE_SHOT_UP_TO).to_be_bytes();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(PREFIX.len() + 32);
    id.push_str(PREFIX);
    for b in digest {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    id
}

/// XXH3-128 of the exchange, routing key and body, each after its length
/// (8 bytes, big-endian), then of the encoded properties after theirs.
fn content_hash(
    p: &BasicProperties,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    one_shot_up_to: usize,
) -> u128 {
    let parts = [exchange.as_bytes(), routing_key.as_bytes(), body];
    let props_len = wire::encoded_len(p);
    if let Some(props_len) = props_len {
        let total = parts.iter().map(|part| 8 + part.len()).sum::<usize>() + 8 + props_len;
        if total <= one_shot_up_to {
            let mut buf = Vec::with_capacity(total);
            for part in parts {
                buf.extend_from_slice(&(part.len() as u64).to_be_bytes());
                buf.extend_from_slice(part);
            }
            buf.extend_from_slice(&(props_len as u64).to_be_bytes());
            wire::write_properties(p, &mut buf);
            return xxhash_rust::xxh3::xxh3_128(&buf);
        }
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in parts {
        h.update(&(part.len() as u64).to_be_bytes());
        h.update(part);
    }
    // Properties the encoder refuses cannot have come off the wire; hash
    // their debug form rather than fail.
    let props = props_len
        .and_then(|_| wire::encode_properties(p))
        .unwrap_or_else(|| format!("{p:?}").into_bytes());
    h.update(&(props.len() as u64).to_be_bytes());
    h.update(&props);
    h.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable};
    use proptest::prelude::*;

    const GOLDEN: &str = "dr-ef3c563ba5d2ce95b2c477cce36d9309";

    fn props(delay: i32) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert("x-requested-delay".into(), AMQPValue::LongInt(delay));
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn a_senders_id_is_kept() {
        let p = props(5).with_message_id("order-17".into());
        let kept = ensure_message_id(Cow::Borrowed(&p), "x", "k", b"body");
        assert!(matches!(kept, Cow::Borrowed(_)), "not copied");
        assert_eq!(*kept, p);
    }

    #[test]
    fn an_empty_id_is_replaced() {
        let p = props(5).with_message_id("".into());
        let id = ensure_message_id(Cow::Borrowed(&p), "x", "k", b"body");
        assert!(
            id.message_id()
                .as_ref()
                .unwrap()
                .as_str()
                .starts_with(PREFIX)
        );
    }

    #[test]
    fn the_same_message_always_gets_the_same_id() {
        let a = ensure_message_id(Cow::Owned(props(5)), "x", "k", b"body");
        let borrowed = props(5);
        let b = ensure_message_id(Cow::Borrowed(&borrowed), "x", "k", b"body");
        assert_eq!(a.message_id(), b.message_id());
        let id = a.message_id().as_ref().unwrap().to_string();
        assert_eq!(id.len(), PREFIX.len() + 32);
    }

    #[test]
    fn any_difference_changes_the_id() {
        let base = derive(&props(5), "x", "k", b"body");
        assert_ne!(base, derive(&props(6), "x", "k", b"body"));
        assert_ne!(base, derive(&props(5), "y", "k", b"body"));
        assert_ne!(base, derive(&props(5), "x", "j", b"body"));
        assert_ne!(base, derive(&props(5), "x", "k", b"bodY"));
        // Lengths are framed: moving a byte between fields changes the id.
        assert_ne!(
            derive(&props(5), "xk", "", b""),
            derive(&props(5), "x", "k", b"")
        );
    }

    #[test]
    fn the_derived_id_of_a_message_does_not_change_between_builds() {
        // A copy a crash produces may be taken by the next version of the
        // router: a change here gives it a second id (say so in CHANGELOG.md).
        assert_eq!(derive(&props(5), "orders", "created", b"body"), GOLDEN);
    }

    #[test]
    fn a_message_larger_than_one_buffer_is_hashed_the_same_way() {
        let body = vec![7u8; 3 * ONE_SHOT_UP_TO];
        let streamed = content_hash(&props(5), "orders", "created", &body, 0);
        let one_shot = content_hash(&props(5), "orders", "created", &body, usize::MAX);
        assert_eq!(streamed, one_shot);
        assert_eq!(
            derive(&props(5), "orders", "created", &body),
            format!("{PREFIX}{streamed:032x}")
        );
    }

    proptest! {
        #[test]
        fn one_buffer_and_a_stream_give_the_same_hash(p in crate::testkit::arbitrary::properties(), ex in ".{0,20}", rk in ".{0,20}", body in prop::collection::vec(any::<u8>(), 0..600)) {
            prop_assert_eq!(
                content_hash(&p, &ex, &rk, &body, 0),
                content_hash(&p, &ex, &rk, &body, usize::MAX)
            );
        }

        #[test]
        fn ids_are_stable_and_well_formed(ex in ".{0,20}", rk in ".{0,20}", body in prop::collection::vec(any::<u8>(), 0..200), d in any::<i32>()) {
            let a = derive(&props(d), &ex, &rk, &body);
            prop_assert_eq!(&a, &derive(&props(d), &ex, &rk, &body));
            prop_assert!(a.starts_with(PREFIX));
            prop_assert!(a[PREFIX.len()..].chars().all(|c| c.is_ascii_hexdigit()));
        }
    }
}
