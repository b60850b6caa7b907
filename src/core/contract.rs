//! The message contract: header names in and out, and parsing of what users send.
//!
//! Users set the `x-requested-delay` and `x-original-*` headers; the router owns
//! every header starting with `x-delay-router-` and removes its transit headers
//! before delivery.

use lapin::types::{AMQPValue, FieldTable, ShortString};
use std::time::Duration;

/// In: how long to wait, integer milliseconds or a humantime string.
pub const REQUESTED_DELAY: &str = "x-requested-delay";
/// In: when to deliver, instead of a delay: milliseconds since the Unix
/// epoch (integer or digit string) or an RFC 3339 time. Wins over
/// `x-requested-delay` when both are present.
pub const DELIVER_AT: &str = "x-deliver-at";
/// In, on a message published to the router exchange: cancel the waiting
/// message with this message-id (the message itself is not delayed).
pub const CANCEL_MESSAGE_ID: &str = "x-cancel-message-id";
/// In the cancels stream: the tombstone's end, ms since the Unix epoch.
pub const TOMBSTONE_UNTIL: &str = "x-delay-router-cancel-until";
/// In the cancels stream: a router's catch-up marker, not a tombstone.
pub const TOMBSTONE_MARKER: &str = "x-delay-router-marker";
/// In: destination exchange (`""` is the default exchange).
pub const ORIGINAL_EXCHANGE: &str = "x-original-exchange";
/// In, optional: destination routing key; defaults to the routing key the
/// message was published to the router exchange with.
pub const ORIGINAL_ROUTING_KEY: &str = "x-original-routing-key";
/// Out, on parked messages: why the message was parked, in plain words.
pub const PARK_REASON: &str = "x-park-reason";
/// Out, on parked messages: when it was parked (milliseconds since the Unix epoch).
pub const PARKED_AT: &str = "x-parked-at";

/// Router bookkeeping while a message waits, in one header (the compact
/// format, written by default): `<deadline> <hops> <n>:<exchange> <routing key>`,
/// the deadline in ms since the Unix epoch, `n` the exchange name's length in
/// bytes. Replaces the four spelled-out headers below, which the router still
/// reads (messages placed by earlier versions).
pub const TRANSIT: &str = "x-delay-router";
/// Router bookkeeping while a message waits (spelled-out format): destination exchange.
pub const TRANSIT_EXCHANGE: &str = "x-delay-router-exchange";
/// Router bookkeeping while a message waits: destination routing key.
pub const TRANSIT_ROUTING_KEY: &str = "x-delay-router-routing-key";
/// Router bookkeeping while a message waits: when it is due (ms since the Unix epoch).
pub const TRANSIT_DEADLINE: &str = "x-delay-router-deadline";
/// Router bookkeeping while a message waits: bucket placements so far.
pub const TRANSIT_HOPS: &str = "x-delay-router-hops";
/// Router bookkeeping an earlier version wrote on a message in a bucket:
/// [`DUE_LANE`] sorted it into a due lane (`<prefix>.due`) when it left its
/// bucket. The router writes it no more; it removes it from what it places
/// again and from what it delivers.
pub const TRANSIT_LANE: &str = "delay-router-lane";
/// The value of [`TRANSIT_LANE`] that the retired due lane's binding matched.
pub const DUE_LANE: &str = "due";
/// Router bookkeeping: the sender's headers the broker rewrites in a bucket
/// (`x-death`, `x-first-death-*`, `x-last-death-*`), kept aside until delivery.
pub const SAVED_HEADERS: &str = "x-delay-router-saved-headers";
/// Router bookkeeping: the sender's properties the router overrides in a bucket
/// (`expiration`, `delivery-mode`), kept aside until delivery.
pub const SAVED_PROPERTIES: &str = "x-delay-router-saved-properties";

/// Router bookkeeping: the plugin exchange ([`crate::core::delayed`]) a
/// waiting message was published to. Such a message holds a token in that
/// exchange's waiting queue (`<prefix>.waiting.<exchange>`) from its first
/// bucket until it leaves the buckets; the queue's depth is the exchange's
/// count of waiting messages.
pub const COUNTED: &str = "x-delay-router-counted";

/// Every transit header; none of them reaches the destination.
pub const TRANSIT_HEADERS: [&str; 9] = [
    TRANSIT,
    TRANSIT_EXCHANGE,
    TRANSIT_ROUTING_KEY,
    TRANSIT_DEADLINE,
    TRANSIT_HOPS,
    TRANSIT_LANE,
    SAVED_HEADERS,
    SAVED_PROPERTIES,
    COUNTED,
];

/// Headers RabbitMQ adds or updates when a bucket dead-letters a message.
pub const DEATH_HEADERS: [&str; 7] = [
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
];

/// The longest delay accepted: about ten years. Longer is parked as invalid.
pub const MAX_DELAY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Why an `x-requested-delay` value is not a delay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DelayError {
    #[error("x-requested-delay is negative ({0})")]
    Negative(i64),
    #[error("x-requested-delay is empty")]
    Empty,
    #[error(
        "x-requested-delay \"{0}\" is neither a whole number of milliseconds nor a duration such as \"90s\" or \"1m 30s\""
    )]
    Unparsable(String),
    #[error("x-requested-delay is not valid UTF-8")]
    NotUtf8,
    #[error(
        "x-requested-delay has type {0}; expected an integer number of milliseconds or a duration string"
    )]
    WrongType(&'static str),
    #[error("x-requested-delay {0} exceeds the maximum accepted delay of 10 years")]
    TooLong(String),
}

/// Parses an `x-requested-delay` header value.
pub fn parse_delay(value: &AMQPValue) -> Result<Duration, DelayError> {
    let millis = match value {
        AMQPValue::ShortShortInt(v) => signed(i64::from(*v))?,
        AMQPValue::ShortInt(v) => signed(i64::from(*v))?,
        AMQPValue::LongInt(v) => signed(i64::from(*v))?,
        AMQPValue::LongLongInt(v) => signed(*v)?,
        AMQPValue::ShortShortUInt(v) => u64::from(*v),
        AMQPValue::ShortUInt(v) => u64::from(*v),
        AMQPValue::LongUInt(v) => u64::from(*v),
        AMQPValue::LongString(s) => {
            return parse_delay_str(
                std::str::from_utf8(s.as_bytes()).map_err(|_| DelayError::NotUtf8)?,
            );
        }
        AMQPValue::ShortString(s) => return parse_delay_str(s.as_str()),
        other => return Err(DelayError::WrongType(type_name(other))),
    };
    bounded(Duration::from_millis(millis), || format!("{millis}ms"))
}

fn signed(v: i64) -> Result<u64, DelayError> {
    u64::try_from(v).map_err(|_| DelayError::Negative(v))
}

fn bounded(d: Duration, shown: impl FnOnce() -> String) -> Result<Duration, DelayError> {
    if d > MAX_DELAY {
        Err(DelayError::TooLong(shown()))
    } else {
        Ok(d)
    }
}

/// Why an `x-deliver-at` value is not a time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliverAtError {
    #[error("x-deliver-at is negative ({0})")]
    Negative(i64),
    #[error("x-deliver-at is empty")]
    Empty,
    #[error(
        "x-deliver-at \"{0}\" is neither milliseconds since the Unix epoch nor an RFC 3339 time such as \"2026-11-22T10:00:00.250Z\""
    )]
    Unparsable(String),
    #[error("x-deliver-at is not valid UTF-8")]
    NotUtf8,
    #[error(
        "x-deliver-at has type {0}; expected an integer (ms since the Unix epoch) or an RFC 3339 string"
    )]
    WrongType(&'static str),
    #[error("x-deliver-at {0} is more than 10 years ahead")]
    TooFar(String),
}

/// Parses an `x-deliver-at` header value into ms since the Unix epoch
/// (a sub-millisecond fraction rounds up: never early).
pub fn parse_deliver_at(value: &AMQPValue) -> Result<i64, DeliverAtError> {
    let ms = match value {
        AMQPValue::LongString(s) => {
            let s = std::str::from_utf8(s.as_bytes()).map_err(|_| DeliverAtError::NotUtf8)?;
            return parse_deliver_at_str(s);
        }
        AMQPValue::ShortString(s) => return parse_deliver_at_str(s.as_str()),
        AMQPValue::Timestamp(v) => {
            // AMQP timestamps are seconds.
            let secs = i64::try_from(*v).map_err(|_| DeliverAtError::TooFar(v.to_string()))?;
            secs.saturating_mul(1000)
        }
        v => match integer_value(v) {
            Some(ms) => ms,
            None => return Err(DeliverAtError::WrongType(type_name(v))),
        },
    };
    if ms < 0 {
        return Err(DeliverAtError::Negative(ms));
    }
    Ok(ms)
}

/// The string form: digits (ms since the epoch) or RFC 3339.
pub fn parse_deliver_at_str(s: &str) -> Result<i64, DeliverAtError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DeliverAtError::Empty);
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<i64>()
            .map_err(|_| DeliverAtError::TooFar(format!("\"{}\"", shorten(t))));
    }
    if let Some(rest) = t.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(DeliverAtError::Negative(t.parse().unwrap_or(i64::MIN)));
    }
    let at = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        .map_err(|_| DeliverAtError::Unparsable(shorten(t)))?;
    let nanos = at.unix_timestamp_nanos();
    if nanos < 0 {
        return Err(DeliverAtError::Negative(
            i64::try_from(nanos / 1_000_000).unwrap_or(i64::MIN),
        ));
    }
    i64::try_from((nanos + 999_999) / 1_000_000)
        .map_err(|_| DeliverAtError::TooFar(format!("\"{}\"", shorten(t))))
}

fn integer_value(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::ShortShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::ShortShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

/// Reads `x-cancel-message-id`: the message-id to cancel, when present.
pub fn cancel_request(headers: &FieldTable) -> Option<Result<ShortString, DestinationError>> {
    headers.inner().get(CANCEL_MESSAGE_ID)?;
    Some(short_string(headers, CANCEL_MESSAGE_ID).map(|id| id.unwrap_or_default()))
}

/// Parses the string form: a run of ASCII digits (milliseconds) or a humantime duration.
pub fn parse_delay_str(s: &str) -> Result<Duration, DelayError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(DelayError::Empty);
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        let millis: u64 = t
            .parse()
            .map_err(|_| DelayError::TooLong(format!("\"{t}\"")))?;
        return bounded(Duration::from_millis(millis), || format!("\"{t}\""));
    }
    if let Some(rest) = t.strip_prefix('-')
        && rest.bytes().all(|b| b.is_ascii_digit())
        && let Ok(v) = t.parse::<i64>()
        && !rest.is_empty()
    {
        // "-0" is zero, not negative.
        return if v == 0 {
            Ok(Duration::ZERO)
        } else {
            Err(DelayError::Negative(v))
        };
    }
    let d = humantime::parse_duration(t).map_err(|_| DelayError::Unparsable(shorten(t)))?;
    // Sub-millisecond parts would make the deadline arithmetic lie; round up.
    let millis = d.as_nanos().div_ceil(1_000_000);
    let millis = u64::try_from(millis).map_err(|_| DelayError::TooLong(format!("\"{t}\"")))?;
    bounded(Duration::from_millis(millis), || format!("\"{t}\""))
}

fn shorten(s: &str) -> String {
    const SHOWN: usize = 64;
    match s.char_indices().nth(SHOWN) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// The AMQP type of a value, in words, for error messages.
pub fn type_name(v: &AMQPValue) -> &'static str {
    match v {
        AMQPValue::Boolean(_) => "boolean",
        AMQPValue::ShortShortInt(_)
        | AMQPValue::ShortInt(_)
        | AMQPValue::LongInt(_)
        | AMQPValue::LongLongInt(_) => "signed integer",
        AMQPValue::ShortShortUInt(_) | AMQPValue::ShortUInt(_) | AMQPValue::LongUInt(_) => {
            "unsigned integer"
        }
        AMQPValue::Float(_) | AMQPValue::Double(_) => "floating point",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) | AMQPValue::LongString(_) => "string",
        AMQPValue::FieldArray(_) => "array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "table",
        AMQPValue::ByteArray(_) => "byte array",
        AMQPValue::Void => "void",
    }
}

/// Where a message goes when its delay is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// Exchange name; empty for the default exchange.
    pub exchange: ShortString,
    /// Routing key.
    pub routing_key: ShortString,
}

/// Why a destination header cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error(
        "no destination: the x-original-exchange header is missing (use \"\" for the default exchange)"
    )]
    Missing,
    #[error("{header} must be a string, got {kind}")]
    WrongType {
        header: &'static str,
        kind: &'static str,
    },
    #[error("{header} is not valid UTF-8")]
    NotUtf8 { header: &'static str },
    #[error("{header} is longer than AMQP's 255-byte limit ({len} bytes)")]
    TooLong { header: &'static str, len: usize },
}

/// Reads a string header into an AMQP short string.
pub fn short_string(
    headers: &FieldTable,
    header: &'static str,
) -> Result<Option<ShortString>, DestinationError> {
    let bytes: &[u8] = match headers.inner().get(header) {
        None => return Ok(None),
        Some(AMQPValue::LongString(s)) => s.as_bytes(),
        Some(AMQPValue::ShortString(s)) => s.as_str().as_bytes(),
        Some(other) => {
            return Err(DestinationError::WrongType {
                header,
                kind: type_name(other),
            });
        }
    };
    let s = std::str::from_utf8(bytes).map_err(|_| DestinationError::NotUtf8 { header })?;
    ShortString::try_new(s)
        .map(Some)
        .map_err(|_| DestinationError::TooLong {
            header,
            len: s.len(),
        })
}

/// The destination a sender asked for: `x-original-exchange`, and
/// `x-original-routing-key` or else the routing key used to reach the router.
pub fn requested_destination(
    headers: &FieldTable,
    routing_key: &ShortString,
) -> Result<Destination, DestinationError> {
    let exchange = short_string(headers, ORIGINAL_EXCHANGE)?.ok_or(DestinationError::Missing)?;
    let routing_key =
        short_string(headers, ORIGINAL_ROUTING_KEY)?.unwrap_or_else(|| routing_key.clone());
    Ok(Destination {
        exchange,
        routing_key,
    })
}

/// Reads an integer header of any AMQP integer type as `i64`.
pub fn integer(headers: &FieldTable, header: &str) -> Option<i64> {
    match headers.inner().get(header)? {
        AMQPValue::Timestamp(v) => i64::try_from(*v).ok(),
        v => integer_value(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliver_at_reads_epoch_milliseconds_and_rfc3339() {
        let ms = 1_795_341_600_250; // 2026-11-22T10:00:00.250Z
        assert_eq!(parse_deliver_at(&AMQPValue::LongLongInt(ms)), Ok(ms));
        assert_eq!(
            parse_deliver_at(&AMQPValue::LongString(ms.to_string().into())),
            Ok(ms)
        );
        let s = |t: &str| parse_deliver_at(&AMQPValue::LongString(t.into()));
        assert_eq!(s("2026-11-22T10:00:00.250Z"), Ok(ms));
        assert_eq!(s("2026-11-22T11:00:00.250+01:00"), Ok(ms));
        // A sub-millisecond fraction rounds up: never early.
        assert_eq!(s("2026-11-22T10:00:00.2500001Z"), Ok(ms + 1));
        assert!(matches!(s("tomorrow"), Err(DeliverAtError::Unparsable(_))));
        assert!(matches!(s(" "), Err(DeliverAtError::Empty)));
        assert!(matches!(s("-5"), Err(DeliverAtError::Negative(-5))));
        assert!(matches!(
            s("1969-12-31T23:59:59Z"),
            Err(DeliverAtError::Negative(_))
        ));
        assert!(matches!(
            s("99999999999999999999999"),
            Err(DeliverAtError::TooFar(_))
        ));
        assert!(matches!(
            parse_deliver_at(&AMQPValue::Boolean(true)),
            Err(DeliverAtError::WrongType("boolean"))
        ));
        assert!(matches!(
            parse_deliver_at(&AMQPValue::LongInt(-1)),
            Err(DeliverAtError::Negative(-1))
        ));
    }
    use lapin::types::LongString;

    fn s(v: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(v))
    }

    #[test]
    fn every_integer_type_is_milliseconds() {
        let ms = Duration::from_millis;
        assert_eq!(parse_delay(&AMQPValue::ShortShortInt(5)), Ok(ms(5)));
        assert_eq!(parse_delay(&AMQPValue::ShortShortUInt(5)), Ok(ms(5)));
        assert_eq!(parse_delay(&AMQPValue::ShortInt(500)), Ok(ms(500)));
        assert_eq!(parse_delay(&AMQPValue::ShortUInt(500)), Ok(ms(500)));
        assert_eq!(parse_delay(&AMQPValue::LongInt(1500)), Ok(ms(1500)));
        assert_eq!(parse_delay(&AMQPValue::LongUInt(1500)), Ok(ms(1500)));
        assert_eq!(parse_delay(&AMQPValue::LongLongInt(90_000)), Ok(ms(90_000)));
        assert_eq!(parse_delay(&AMQPValue::LongInt(0)), Ok(ms(0)));
    }

    #[test]
    fn strings_are_digits_or_humantime() {
        let ms = Duration::from_millis;
        assert_eq!(parse_delay(&s("1500")), Ok(ms(1500)));
        assert_eq!(parse_delay(&s(" 90s ")), Ok(ms(90_000)));
        assert_eq!(parse_delay(&s("1m 30s")), Ok(ms(90_000)));
        assert_eq!(parse_delay(&s("250ms")), Ok(ms(250)));
        assert_eq!(parse_delay(&s("1500us")), Ok(ms(2)));
        assert_eq!(
            parse_delay(&AMQPValue::ShortString("2s".into())),
            Ok(ms(2000))
        );
    }

    #[test]
    fn bad_delays_say_what_is_wrong() {
        assert_eq!(
            parse_delay(&AMQPValue::LongInt(-5)),
            Err(DelayError::Negative(-5))
        );
        assert_eq!(parse_delay(&s("-5")), Err(DelayError::Negative(-5)));
        assert_eq!(parse_delay(&s("-0")), Ok(Duration::ZERO));
        assert_eq!(parse_delay(&s("-000")), Ok(Duration::ZERO));
        assert_eq!(parse_delay(&s("  ")), Err(DelayError::Empty));
        assert!(matches!(
            parse_delay(&s("soon")),
            Err(DelayError::Unparsable(_))
        ));
        assert!(matches!(
            parse_delay(&s("-5s")),
            Err(DelayError::Unparsable(_))
        ));
        assert_eq!(
            parse_delay(&AMQPValue::Double(1.5)),
            Err(DelayError::WrongType("floating point"))
        );
        assert_eq!(
            parse_delay(&AMQPValue::Boolean(true)),
            Err(DelayError::WrongType("boolean"))
        );
        assert_eq!(
            parse_delay(&AMQPValue::LongString(LongString::from(vec![0xff, 0xfe]))),
            Err(DelayError::NotUtf8)
        );
        assert!(matches!(
            parse_delay(&AMQPValue::LongLongInt(i64::MAX)),
            Err(DelayError::TooLong(_))
        ));
        assert!(matches!(
            parse_delay(&s("99999999999999999999999")),
            Err(DelayError::TooLong(_))
        ));
        assert!(matches!(
            parse_delay(&s("20000years")),
            Err(DelayError::TooLong(_)) | Err(DelayError::Unparsable(_))
        ));
    }

    #[test]
    fn destination_defaults_the_routing_key_and_checks_types() {
        let rk: ShortString = "jobs".into();
        let mut h = FieldTable::default();
        assert_eq!(
            requested_destination(&h, &rk),
            Err(DestinationError::Missing)
        );
        h.insert(ORIGINAL_EXCHANGE.into(), s(""));
        assert_eq!(
            requested_destination(&h, &rk),
            Ok(Destination {
                exchange: "".into(),
                routing_key: "jobs".into()
            })
        );
        h.insert(ORIGINAL_ROUTING_KEY.into(), s("orders.eu"));
        assert_eq!(
            requested_destination(&h, &rk).unwrap().routing_key.as_str(),
            "orders.eu"
        );
        h.insert(ORIGINAL_ROUTING_KEY.into(), s(&"k".repeat(256)));
        assert!(matches!(
            requested_destination(&h, &rk),
            Err(DestinationError::TooLong { len: 256, .. })
        ));
        h.insert(ORIGINAL_EXCHANGE.into(), AMQPValue::LongInt(3));
        assert!(matches!(
            requested_destination(&h, &rk),
            Err(DestinationError::WrongType { .. })
        ));
    }
}
