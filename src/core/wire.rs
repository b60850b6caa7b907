//! Properties as they travel on the wire: their exact encoding (for the
//! content-header frame limit and for stable message ids), and the property
//! values RabbitMQ checks on every publish. Pure.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// RabbitMQ's default `frame_max`, used until a connection says otherwise.
pub const DEFAULT_FRAME_MAX: u32 = 131_072;

/// Bytes of a content-header frame around the encoded properties: frame type,
/// channel and size (7), class id, weight and body size (12), frame end (1).
const HEADER_FRAME_OVERHEAD: usize = 7 + 12 + 1;

/// The properties as AMQP 0-9-1 encodes them (flags, then each property).
/// `None` when a short string is longer than AMQP allows (255 bytes), which
/// lapin's `ShortString` already refuses to hold.
///
/// Written by hand, byte for byte what lapin's encoder writes (a property
/// test holds them equal): its combinators cost several times as much, and
/// every message without an id has its properties encoded for [`derive`](crate::core::identity::derive).
pub fn encode_properties(p: &BasicProperties) -> Option<Vec<u8>> {
    // Sized up front: the length check is also the short-string check.
    let mut out = Vec::with_capacity(encoded_len(p)?);
    write_properties(p, &mut out);
    Some(out)
}

/// Appends [`encode_properties`]' bytes to `out`, for a caller that has
/// checked [`encoded_len`] (a longer short string would be written with
/// its length cut to a byte).
pub(crate) fn write_properties(p: &BasicProperties, out: &mut Vec<u8>) {
    out.extend_from_slice(&p.bitmask().to_be_bytes());
    let short = |out: &mut Vec<u8>, s: &Option<ShortString>| {
        if let Some(s) = s {
            put_short(out, s.as_str());
        }
    };
    short(out, p.content_type());
    short(out, p.content_encoding());
    if let Some(h) = p.headers() {
        put_table(out, h);
    }
    out.extend(*p.delivery_mode());
    out.extend(*p.priority());
    short(out, p.correlation_id());
    short(out, p.reply_to());
    short(out, p.expiration());
    short(out, p.message_id());
    if let Some(t) = p.timestamp() {
        out.extend_from_slice(&t.to_be_bytes());
    }
    short(out, p.kind());
    short(out, p.user_id());
    short(out, p.app_id());
    short(out, p.cluster_id());
}

/// A short string: its length in one byte, then its bytes (checked by
/// [`encoded_len`] before anything is written).
fn put_short(out: &mut Vec<u8>, s: &str) {
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// Bytes with a 32-bit length before them.
fn put_long(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

/// What `write` writes, with its length in 32 bits before it.
fn put_with_len(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    write(out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_table(out: &mut Vec<u8>, t: &FieldTable) {
    put_with_len(out, |out| {
        for (k, v) in t.inner() {
            put_short(out, k.as_str());
            put_value(out, v);
        }
    });
}

/// A value: its type's letter (lapin's, which are RabbitMQ's), then the value.
fn put_value(out: &mut Vec<u8>, v: &AMQPValue) {
    out.push(v.get_type().get_id() as u8);
    match v {
        AMQPValue::Void => {}
        AMQPValue::Boolean(b) => out.push(u8::from(*b)),
        AMQPValue::ShortShortInt(i) => out.extend_from_slice(&i.to_be_bytes()),
        AMQPValue::ShortShortUInt(u) => out.push(*u),
        AMQPValue::ShortInt(i) => out.extend_from_slice(&i.to_be_bytes()),
        AMQPValue::ShortUInt(u) => out.extend_from_slice(&u.to_be_bytes()),
        AMQPValue::LongInt(i) => out.extend_from_slice(&i.to_be_bytes()),
        AMQPValue::LongUInt(u) => out.extend_from_slice(&u.to_be_bytes()),
        AMQPValue::LongLongInt(i) => out.extend_from_slice(&i.to_be_bytes()),
        AMQPValue::Float(f) => out.extend_from_slice(&f.to_be_bytes()),
        AMQPValue::Double(d) => out.extend_from_slice(&d.to_be_bytes()),
        AMQPValue::DecimalValue(d) => {
            out.push(d.scale);
            out.extend_from_slice(&d.value.to_be_bytes());
        }
        AMQPValue::Timestamp(t) => out.extend_from_slice(&t.to_be_bytes()),
        AMQPValue::ShortString(s) => put_short(out, s.as_str()),
        AMQPValue::LongString(s) => put_long(out, s.as_bytes()),
        AMQPValue::ByteArray(a) => put_long(out, a.as_slice()),
        AMQPValue::FieldArray(a) => put_with_len(out, |out| {
            for v in a.as_slice() {
                put_value(out, v);
            }
        }),
        AMQPValue::FieldTable(t) => put_table(out, t),
    }
}

/// The size of the content-header frame that carries `p`; `None` when a
/// short string is longer than AMQP allows (255 bytes).
pub fn header_frame_len(p: &BasicProperties) -> Option<usize> {
    encoded_len(p).map(|len| len + HEADER_FRAME_OVERHEAD)
}

/// The length of [`encode_properties`]' output, counted without encoding
/// (every decision checks the frame limit; encoding allocated and copied
/// the whole header table each time).
pub fn encoded_len(p: &BasicProperties) -> Option<usize> {
    let short = |s: &Option<ShortString>| match s {
        None => Some(0),
        Some(s) => short_len(s.as_str()),
    };
    let fixed = |present: bool, len: usize| if present { len } else { 0 };
    let headers = match p.headers() {
        None => 0,
        Some(h) => table_len(h)?,
    };
    let strings = [
        short(p.content_type())?,
        short(p.content_encoding())?,
        short(p.correlation_id())?,
        short(p.reply_to())?,
        short(p.expiration())?,
        short(p.message_id())?,
        short(p.kind())?,
        short(p.user_id())?,
        short(p.app_id())?,
        short(p.cluster_id())?,
    ];
    Some(
        2 + headers
            + strings.iter().sum::<usize>()
            + fixed(p.delivery_mode().is_some(), 1)
            + fixed(p.priority().is_some(), 1)
            + fixed(p.timestamp().is_some(), 8),
    )
}

fn short_len(s: &str) -> Option<usize> {
    (s.len() <= usize::from(u8::MAX)).then_some(1 + s.len())
}

fn table_len(t: &FieldTable) -> Option<usize> {
    t.inner().iter().try_fold(4, |len, (k, v)| {
        Some(len + short_len(k.as_str())? + 1 + value_len(v)?)
    })
}

/// The encoded length of a value, its type byte excluded.
fn value_len(v: &AMQPValue) -> Option<usize> {
    Some(match v {
        AMQPValue::Void => 0,
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::ShortString(s) => short_len(s.as_str())?,
        AMQPValue::LongString(s) => 4 + s.as_bytes().len(),
        AMQPValue::ByteArray(a) => 4 + a.as_slice().len(),
        AMQPValue::FieldArray(a) => a
            .as_slice()
            .iter()
            .try_fold(4, |len, v| Some(len + 1 + value_len(v)?))?,
        AMQPValue::FieldTable(t) => table_len(t)?,
    })
}

/// Whether `p` fits in one content-header frame under `frame_max` (AMQP does
/// not split a header; the broker closes the connection on a larger frame).
/// `frame_max = 0` means no limit, as in AMQP's tune.
pub fn fits(p: &BasicProperties, frame_max: u32) -> bool {
    match header_frame_len(p) {
        None => false,
        Some(_) if frame_max == 0 => true,
        Some(len) => len <= frame_max as usize,
    }
}

/// The header whose removal saves the most bytes, with its encoded size.
pub fn largest_header(
    headers: &std::collections::BTreeMap<lapin::types::ShortString, lapin::types::AMQPValue>,
) -> Option<(lapin::types::ShortString, usize)> {
    headers
        .iter()
        .map(|(k, v)| {
            let mut one = lapin::types::FieldTable::default();
            one.insert(k.clone(), v.clone());
            let size = encode_properties(&BasicProperties::default().with_headers(one))
                .map_or(usize::MAX, |b| b.len());
            (k.clone(), size)
        })
        .max_by_key(|(_, size)| *size)
}

/// A property value RabbitMQ refuses on `basic.publish` (406
/// PRECONDITION_FAILED, closing the channel).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unacceptable {
    #[error(
        "user-id '{user_id}' differs from the router's AMQP user '{router_user}': RabbitMQ refuses to forward it unchanged"
    )]
    UserId {
        user_id: String,
        router_user: String,
    },
    #[error(
        "expiration '{0}' is not a whole number of milliseconds RabbitMQ accepts (digits, an optional sign, not negative)"
    )]
    Expiration(String),
    #[error("delivery-mode {0} is neither 1 (transient) nor 2 (persistent)")]
    DeliveryMode(u8),
}

/// Whether RabbitMQ takes `p` from a publisher authenticated as `user`:
/// `user-id` must name that user, `expiration` must read as a non-negative
/// integer (Erlang's `string:to_integer` with nothing left over), and
/// `delivery-mode` must be 1 or 2 (0, 3 and 255 are refused).
pub fn acceptable(p: &BasicProperties, user: &str) -> Result<(), Unacceptable> {
    if let Some(id) = p.user_id()
        && id.as_str() != user
    {
        return Err(Unacceptable::UserId {
            user_id: id.to_string(),
            router_user: user.to_owned(),
        });
    }
    if let Some(e) = p.expiration()
        && !valid_expiration(e.as_str())
    {
        return Err(Unacceptable::Expiration(e.to_string()));
    }
    match *p.delivery_mode() {
        None | Some(1) | Some(2) => Ok(()),
        Some(m) => Err(Unacceptable::DeliveryMode(m)),
    }
}

/// RabbitMQ's rule for `expiration`: an optional sign, then digits and
/// nothing else, not negative (`"+5"` and `"-0"` pass, `" 5"` and `"-1"` do not).
pub fn valid_expiration(e: &str) -> bool {
    let (negative, digits) = match e.as_bytes().first() {
        Some(b'-') => (true, &e[1..]),
        Some(b'+') => (false, &e[1..]),
        _ => (false, e),
    };
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (!negative || digits.bytes().all(|b| b == b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{AMQPValue, FieldTable, LongString};

    fn with_pad(n: usize) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(
            "pad".into(),
            AMQPValue::LongString(LongString::from("p".repeat(n))),
        );
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn encoding_counts_every_byte() {
        // Flags only.
        assert_eq!(
            encode_properties(&BasicProperties::default())
                .unwrap()
                .len(),
            2
        );
        // Flags, table length (4), key (1 + 3), type (1), string length (4) + 10.
        assert_eq!(
            encode_properties(&with_pad(10)).unwrap().len(),
            2 + 4 + 4 + 1 + 4 + 10
        );
    }

    proptest::proptest! {
        /// The counted length is the encoded one, for any properties.
        #[test]
        fn the_counted_length_is_the_encoded_one(
            p in crate::testkit::arbitrary::properties(),
            timestamp in proptest::option::of(proptest::prelude::any::<u64>()),
            id in proptest::option::of("[a-z0-9-]{0,40}"),
            kind in proptest::option::of("[a-z/.]{0,20}"),
        ) {
            let mut p = p;
            if let Some(t) = timestamp {
                p = p.with_timestamp(t);
            }
            if let Some(id) = id {
                p = p.with_message_id(id.as_str().into()).with_app_id("app".into());
            }
            if let Some(kind) = kind {
                p = p.with_type(kind.as_str().into()).with_content_type(kind.as_str().into());
            }
            proptest::prop_assert_eq!(encoded_len(&p), encode_properties(&p).map(|b| b.len()));
        }

        /// The hand-written encoder writes what lapin's writes, for any
        /// properties (the derived message-id hashes these bytes).
        #[test]
        fn the_encoding_is_lapins(
            p in crate::testkit::arbitrary::properties(),
            timestamp in proptest::option::of(proptest::prelude::any::<u64>()),
            strings in proptest::collection::vec(proptest::option::of(".{0,40}"), 8),
        ) {
            let mut p = p;
            if let Some(t) = timestamp {
                p = p.with_timestamp(t);
            }
            let s = |i: usize| strings[i].as_deref().map(ShortString::from);
            let set = |p: BasicProperties, v: Option<ShortString>, f: fn(BasicProperties, ShortString) -> BasicProperties| match v {
                Some(v) => f(p, v),
                None => p,
            };
            p = set(p, s(0), BasicProperties::with_content_type);
            p = set(p, s(1), BasicProperties::with_content_encoding);
            p = set(p, s(2), BasicProperties::with_correlation_id);
            p = set(p, s(3), BasicProperties::with_reply_to);
            p = set(p, s(4), BasicProperties::with_message_id);
            p = set(p, s(5), BasicProperties::with_type);
            p = set(p, s(6), BasicProperties::with_app_id);
            p = set(p, s(7), BasicProperties::with_cluster_id);
            let lapins = cookie_factory::gen_simple(
                lapin::protocol::basic::gen_properties(&p),
                Vec::new(),
            )
            .unwrap();
            proptest::prop_assert_eq!(encode_properties(&p), Some(lapins));
        }
    }

    #[test]
    fn the_longest_short_strings_encode_as_lapins_do() {
        let long = "x".repeat(255);
        let p = BasicProperties::default()
            .with_message_id(long.as_str().into())
            .with_app_id(long.as_str().into());
        let lapins =
            cookie_factory::gen_simple(lapin::protocol::basic::gen_properties(&p), Vec::new())
                .unwrap();
        assert_eq!(encode_properties(&p), Some(lapins));
    }

    #[test]
    fn the_frame_limit_is_the_brokers() {
        // The broker refused a 131,219-byte header payload against frame_max
        // 131,072 ("frame_too_large,131219,131064"): the payload may be at
        // most frame_max - 8, and the payload is 12 bytes plus the properties.
        let base = header_frame_len(&with_pad(0)).unwrap();
        let largest = DEFAULT_FRAME_MAX as usize - base;
        assert!(fits(&with_pad(largest), DEFAULT_FRAME_MAX));
        assert!(!fits(&with_pad(largest + 1), DEFAULT_FRAME_MAX));
        assert!(fits(&with_pad(largest + 1), 0));
    }

    /// What RabbitMQ does with each value: the refused ones close the
    /// channel with 406 (tests/bad_input.rs publishes them).
    #[test]
    fn expirations_follow_the_brokers_rule() {
        for ok in ["0", "+5", "-0", "00012", "4294967295", "4294967296"] {
            assert!(valid_expiration(ok), "{ok}");
        }
        for bad in ["", " 5", "5 ", "abc", "-1", "+", "-", "1e5", "5ms"] {
            assert!(!valid_expiration(bad), "{bad}");
        }
    }

    #[test]
    fn the_user_id_must_be_the_publishers_and_the_mode_1_or_2() {
        let p = BasicProperties::default().with_user_id("bob".into());
        assert!(acceptable(&p, "bob").is_ok());
        assert!(matches!(
            acceptable(&p, "router"),
            Err(Unacceptable::UserId { .. })
        ));
        for (mode, ok) in [(0, false), (1, true), (2, true), (3, false)] {
            let p = BasicProperties::default().with_delivery_mode(mode);
            assert_eq!(acceptable(&p, "r").is_ok(), ok, "{mode}");
        }
        let p = BasicProperties::default().with_expiration("soon".into());
        assert_eq!(
            acceptable(&p, "r"),
            Err(Unacceptable::Expiration("soon".into()))
        );
    }
}
