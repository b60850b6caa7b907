//! The delayed-message-exchange plugin's contract, served by the router: an
//! exchange publishers already use (`[[delayed_exchange]]`), its `x-delay`
//! header read exactly as the plugin reads it, and the exchange its messages
//! are delivered to when due.
//!
//! The plugin (`rabbit_delayed_message_utils`) reads `x-delay` as integer
//! milliseconds: any AMQP integer type, a string parsed as an integer, a
//! decimal or a float truncated. A delay above 0 and at most
//! [`MAX_PLUGIN_DELAY_MS`] waits; anything else (absent, 0, negative,
//! unreadable, too long) is routed at once. A message that waited arrives
//! with `x-delay` rewritten to minus its delay.

use crate::core::contract::COUNTED;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use std::fmt;
use std::str::FromStr;

/// The plugin's header: how long to wait, in milliseconds.
pub const X_DELAY: &str = "x-delay";

/// The longest delay the plugin waits (2^32 - 1 ms, about 49.7 days).
pub const MAX_PLUGIN_DELAY_MS: u64 = u32::MAX as u64;

/// The `x-delayed-type` of a plugin exchange: how its messages are routed
/// when they are due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayedType {
    Direct,
    Topic,
    Fanout,
    Headers,
}

impl DelayedType {
    /// The exchange type's AMQP name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Topic => "topic",
            Self::Fanout => "fanout",
            Self::Headers => "headers",
        }
    }
}

impl fmt::Display for DelayedType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DelayedType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "direct" => Ok(Self::Direct),
            "topic" => Ok(Self::Topic),
            "fanout" => Ok(Self::Fanout),
            "headers" => Ok(Self::Headers),
            _ => Err("expected direct, topic, fanout or headers (the x-delayed-type)".into()),
        }
    }
}

/// One plugin exchange the router serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedExchange {
    /// The exchange publishers publish to, declared by the router as a plain
    /// fanout exchange bound to its ingress.
    pub name: ShortString,
    /// How messages are routed when due.
    pub kind: DelayedType,
    /// The exchange, of type `kind`, that due messages are published to
    /// with the routing key they were published with; the consumers' queues
    /// are bound to it.
    pub deliver_to: ShortString,
}

impl DelayedExchange {
    /// The delivery exchange's name when the configuration names none.
    pub fn default_deliver_to(name: &str) -> String {
        format!("{name}.delivered")
    }
}

/// How long the plugin would hold a message with these headers: `Some(ms)`
/// for a delay it waits, `None` for a message it routes at once.
pub fn plugin_delay(headers: Option<&FieldTable>) -> Option<u64> {
    let value = headers?.inner().get(X_DELAY)?;
    let ms = integer_delay(value)?;
    u64::try_from(ms)
        .ok()
        .filter(|ms| (1..=MAX_PLUGIN_DELAY_MS).contains(ms))
}

/// `x-delay` read as the plugin reads it: integers as they are, strings as
/// a whole integer (an optional sign and digits), decimals and floats
/// truncated toward zero; `None` when it is none of those.
fn integer_delay(value: &AMQPValue) -> Option<i128> {
    Some(match value {
        AMQPValue::ShortShortInt(v) => i128::from(*v),
        AMQPValue::ShortInt(v) => i128::from(*v),
        AMQPValue::LongInt(v) => i128::from(*v),
        AMQPValue::LongLongInt(v) => i128::from(*v),
        AMQPValue::ShortShortUInt(v) => i128::from(*v),
        AMQPValue::ShortUInt(v) => i128::from(*v),
        AMQPValue::LongUInt(v) => i128::from(*v),
        AMQPValue::Timestamp(v) => i128::from(*v),
        AMQPValue::Float(v) => truncate(f64::from(*v))?,
        AMQPValue::Double(v) => truncate(*v)?,
        AMQPValue::DecimalValue(d) => {
            i128::from(d.value) / 10i128.checked_pow(u32::from(d.scale))?
        }
        AMQPValue::LongString(s) => whole_number(std::str::from_utf8(s.as_bytes()).ok()?)?,
        AMQPValue::ShortString(s) => whole_number(s.as_str())?,
        _ => return None,
    })
}

fn truncate(v: f64) -> Option<i128> {
    // Beyond ±2^100 no delay is near; NaN and infinities are no number.
    v.is_finite()
        .then(|| v.trunc().clamp(-(2f64.powi(100)), 2f64.powi(100)) as i128)
}

/// Erlang's `binary_to_integer`: an optional sign, then digits only.
fn whole_number(s: &str) -> Option<i128> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || digits.len() > 30 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `p` with `x-delay` rewritten to minus `delay_ms`, as the plugin delivers
/// a message that waited.
pub fn rewritten(p: &BasicProperties, delay_ms: u64) -> BasicProperties {
    let mut headers = p.headers().clone().unwrap_or_default();
    headers.insert(X_DELAY.into(), delivered_value(delay_ms));
    p.clone().with_headers(headers)
}

/// Properties in a bucket marked as counted for the plugin exchange
/// `exchange` ([`COUNTED`]): the message holds a token in its waiting queue.
pub fn counted(p: &BasicProperties, exchange: &ShortString) -> BasicProperties {
    let mut headers = p.headers().clone().unwrap_or_default();
    headers.insert(
        COUNTED.into(),
        AMQPValue::LongString(exchange.as_str().into()),
    );
    p.clone().with_headers(headers)
}

/// The plugin exchange a message out of a bucket is counted for, if any.
pub fn counted_for(p: &BasicProperties) -> Option<&[u8]> {
    match p.headers().as_ref()?.inner().get(COUNTED)? {
        AMQPValue::LongString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// `x-delay` on the router exchange, as an alias of `x-requested-delay`:
/// `None` when absent, or when a negative integer, which is what a message
/// the plugin (or the router) delivered carries, not a request.
pub fn alias(headers: &FieldTable) -> Option<&AMQPValue> {
    headers
        .inner()
        .get(X_DELAY)
        .filter(|v| !matches!(integer_delay(v), Some(ms) if ms < 0 && !is_text(v)))
}

fn is_text(v: &AMQPValue) -> bool {
    matches!(v, AMQPValue::LongString(_) | AMQPValue::ShortString(_))
}

/// The `x-delay` a waited message arrives with: minus its delay, as a
/// 32-bit signed integer when it fits (the plugin's `signedint`).
pub fn delivered_value(delay_ms: u64) -> AMQPValue {
    let negative = -i64::try_from(delay_ms).unwrap_or(i64::MAX);
    match i32::try_from(negative) {
        Ok(v) => AMQPValue::LongInt(v),
        Err(_) => AMQPValue::LongLongInt(negative),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{DecimalValue, LongString};

    fn delay(v: AMQPValue) -> Option<u64> {
        let mut h = FieldTable::default();
        h.insert(X_DELAY.into(), v);
        plugin_delay(Some(&h))
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    #[test]
    fn integers_of_every_type_wait_that_many_milliseconds() {
        assert_eq!(delay(AMQPValue::ShortShortInt(5)), Some(5));
        assert_eq!(delay(AMQPValue::ShortInt(300)), Some(300));
        assert_eq!(delay(AMQPValue::LongInt(1_500)), Some(1_500));
        assert_eq!(delay(AMQPValue::LongLongInt(1_500)), Some(1_500));
        assert_eq!(delay(AMQPValue::ShortShortUInt(7)), Some(7));
        assert_eq!(delay(AMQPValue::ShortUInt(7)), Some(7));
        assert_eq!(
            delay(AMQPValue::LongUInt(u32::MAX)),
            Some(MAX_PLUGIN_DELAY_MS)
        );
    }

    #[test]
    fn strings_are_whole_numbers_and_fractions_are_truncated() {
        assert_eq!(delay(text("1500")), Some(1_500));
        assert_eq!(delay(text("+1500")), Some(1_500));
        assert_eq!(delay(AMQPValue::ShortString("42".into())), Some(42));
        assert_eq!(delay(AMQPValue::Double(1_500.9)), Some(1_500));
        assert_eq!(delay(AMQPValue::Float(2.5)), Some(2));
        let d = AMQPValue::DecimalValue(DecimalValue {
            scale: 1,
            value: 15_009,
        });
        assert_eq!(delay(d), Some(1_500));
    }

    #[test]
    fn anything_else_is_routed_at_once() {
        assert_eq!(plugin_delay(None), None);
        assert_eq!(plugin_delay(Some(&FieldTable::default())), None);
        for v in [
            AMQPValue::LongInt(0),
            AMQPValue::LongInt(-5),
            AMQPValue::LongLongInt(MAX_PLUGIN_DELAY_MS as i64 + 1),
            AMQPValue::Double(0.9),
            AMQPValue::Double(f64::NAN),
            AMQPValue::Double(f64::INFINITY),
            AMQPValue::Boolean(true),
            text("soon"),
            text("1.5"),
            text(" 15"),
            text(""),
            text("-"),
            text("-100"),
            AMQPValue::Void,
        ] {
            assert_eq!(delay(v.clone()), None, "{v:?}");
        }
    }

    #[test]
    fn a_waited_message_carries_minus_its_delay() {
        assert_eq!(delivered_value(1_500), AMQPValue::LongInt(-1_500));
        assert_eq!(
            delivered_value(MAX_PLUGIN_DELAY_MS),
            AMQPValue::LongLongInt(-(MAX_PLUGIN_DELAY_MS as i64))
        );
    }

    #[test]
    fn the_type_reads_as_the_plugin_names_it() {
        for t in ["direct", "topic", "fanout", "headers"] {
            assert_eq!(t.parse::<DelayedType>().unwrap().name(), t);
        }
        assert!("x-delayed-message".parse::<DelayedType>().is_err());
    }
}
