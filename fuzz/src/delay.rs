//! The `delay` target: arbitrary bytes as an `x-requested-delay` value.
//!
//! # Input layout
//!
//! Byte 0 picks how the rest is read (mod 3): 0 a long string (any bytes,
//! invalid UTF-8 included), 1 a typed AMQP value in wire format (type tag then
//! value, amq-protocol-types' parse_value; undecodable -> skip), 2 a short
//! string (when valid UTF-8 of at most 255 bytes, else a long string). Valid
//! UTF-8 is also fed to `parse_delay_str` directly.
//!
//! # Checks
//!
//! - Nothing panics.
//! - `parse_delay` agrees with its contract: integers are milliseconds
//!   (negative: `Negative(v)`, beyond `MAX_DELAY`: `TooLong`), strings go to
//!   `parse_delay_str` (invalid UTF-8: `NotUtf8`), other types `WrongType`.
//! - A string of digits is milliseconds; minus digits is `Negative`, or zero
//!   for "-0"; otherwise an accepted string is the humantime duration rounded
//!   up to the millisecond.
//! - An accepted delay is at most `MAX_DELAY`, whole milliseconds, and reads
//!   back the same from its millisecond and humantime forms.
//! - Ladder rules for an accepted delay, every ladder and strategy: the first
//!   placement is the right rung (round-up: smallest at least the delay, else
//!   the top; cascade: largest at most the delay, or a hold shorter than
//!   HOLD_BELOW; priority: round-up's rung with expiration and priority), and
//!   on the shipped ladder the whole sequence of buckets adds up to at least
//!   the delay (cascade: exactly), late by less than one top rung.
//! - Through a plan: an accepted delay is placed with deadline = now + delay
//!   (or delivered/held when that short); a refused one is parked with the
//!   same `InvalidDelay` error.

use crate::plans::{NOW, plans};
use delay_router::core::contract::{
    DelayError, MAX_DELAY, ORIGINAL_EXCHANGE, REQUESTED_DELAY, parse_delay, parse_delay_str,
};
use delay_router::core::decision::Action;
use delay_router::core::envelope::read_transit;
use delay_router::core::placement::{
    HOLD_BELOW, PRIORITY_LEVELS, Placement, PlacementStrategy, ROUND_UP_WITHIN, place,
};
use delay_router::core::reasons::ParkReason;
use delay_router::testkit::decide;
use lapin::BasicProperties;
use lapin::types::parsing::parse_value;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use std::time::Duration;

pub const MODE_LONG_STRING: u8 = 0;
pub const MODE_WIRE: u8 = 1;
pub const MODE_SHORT_STRING: u8 = 2;

/// Bucket hops simulated on the shipped ladder (10 years of 24h rungs is 3,650).
const MAX_SIMULATED_HOPS: usize = 5_000;

/// Decodes an input into the header value, or `None` when undecodable.
pub fn decode(data: &[u8]) -> Option<AMQPValue> {
    let (&mode, rest) = data.split_first()?;
    Some(match mode % 3 {
        MODE_WIRE => parse_value(rest).ok()?.1,
        MODE_SHORT_STRING => match std::str::from_utf8(rest) {
            Ok(s) if s.len() <= 255 => AMQPValue::ShortString(ShortString::from(s)),
            _ => AMQPValue::LongString(LongString::from(rest)),
        },
        _ => AMQPValue::LongString(LongString::from(rest)),
    })
}

/// The fuzz target's body.
pub fn run(data: &[u8]) {
    if let Some(v) = decode(data) {
        check_value(&v);
    }
    if let Some(s) = data.get(1..).and_then(|b| std::str::from_utf8(b).ok()) {
        check_str(s);
    }
}

fn max_ms() -> u128 {
    MAX_DELAY.as_millis()
}

fn integer_ms(v: i128) -> Result<Duration, DelayError> {
    if v < 0 {
        Err(DelayError::Negative(v as i64))
    } else if v as u128 > max_ms() {
        Err(DelayError::TooLong(format!("{v}ms")))
    } else {
        Ok(Duration::from_millis(v as u64))
    }
}

/// `parse_delay` on one value.
pub fn check_value(v: &AMQPValue) {
    let got = parse_delay(v);
    let int = match v {
        AMQPValue::ShortShortInt(i) => Some(i128::from(*i)),
        AMQPValue::ShortInt(i) => Some(i128::from(*i)),
        AMQPValue::LongInt(i) => Some(i128::from(*i)),
        AMQPValue::LongLongInt(i) => Some(i128::from(*i)),
        AMQPValue::ShortShortUInt(i) => Some(i128::from(*i)),
        AMQPValue::ShortUInt(i) => Some(i128::from(*i)),
        AMQPValue::LongUInt(i) => Some(i128::from(*i)),
        _ => None,
    };
    match (v, int) {
        (_, Some(i)) => {
            let want = integer_ms(i);
            match (&got, &want) {
                (Err(DelayError::TooLong(_)), Err(DelayError::TooLong(_))) => {}
                _ => assert_eq!(got, want, "integer {i} as a delay"),
            }
        }
        (AMQPValue::LongString(s), _) => match std::str::from_utf8(s.as_bytes()) {
            Ok(s) => assert_eq!(got, parse_delay_str(s), "long string {s:?}"),
            Err(_) => assert_eq!(got, Err(DelayError::NotUtf8), "invalid UTF-8"),
        },
        (AMQPValue::ShortString(s), _) => {
            assert_eq!(got, parse_delay_str(s.as_str()), "short string {s:?}")
        }
        _ => assert!(
            matches!(got, Err(DelayError::WrongType(_))),
            "{v:?} gave {got:?}"
        ),
    }
    match &got {
        Ok(d) => check_accepted(*d),
        Err(e) => check_refused(e),
    }
    through_plans(v, &got);
}

/// `parse_delay_str` on one string.
pub fn check_str(s: &str) {
    let got = parse_delay_str(s);
    let t = s.trim();
    if t.is_empty() {
        assert_eq!(got, Err(DelayError::Empty), "{s:?}");
    } else if t.bytes().all(|b| b.is_ascii_digit()) {
        match t.parse::<u128>() {
            Ok(ms) if ms <= max_ms() => {
                assert_eq!(got, Ok(Duration::from_millis(ms as u64)), "digits {t:?}")
            }
            _ => assert!(
                matches!(got, Err(DelayError::TooLong(_))),
                "digits {t:?} gave {got:?}"
            ),
        }
    } else if let Some(rest) = t.strip_prefix('-')
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_digit())
    {
        match t.parse::<i64>() {
            // "-0" is zero, not negative.
            Ok(0) => assert_eq!(got, Ok(Duration::ZERO), "{t:?}"),
            Ok(v) => assert_eq!(got, Err(DelayError::Negative(v)), "{t:?}"),
            Err(_) => assert!(got.is_err(), "{t:?} gave {got:?}"),
        }
    } else if let Ok(d) = got {
        // Not digits: humantime's reading, rounded up to whole milliseconds.
        let h = humantime::parse_duration(t)
            .unwrap_or_else(|e| panic!("{t:?} accepted as {d:?} but humantime refuses it: {e}"));
        assert!(
            d >= h && d - h < Duration::from_millis(1),
            "{t:?}: {d:?} vs humantime's {h:?}"
        );
    }
    match &got {
        Ok(d) => check_accepted(*d),
        Err(e) => check_refused(e),
    }
}

fn check_refused(e: &DelayError) {
    assert!(!e.to_string().is_empty());
    match e {
        DelayError::Negative(v) => assert!(*v < 0, "Negative({v})"),
        DelayError::Unparsable(shown) => {
            assert!(
                shown.chars().count() <= 65,
                "Unparsable shows {} chars",
                shown.chars().count()
            )
        }
        _ => {}
    }
}

/// What every accepted delay must satisfy.
pub fn check_accepted(d: Duration) {
    assert!(d <= MAX_DELAY, "{d:?} beyond MAX_DELAY");
    assert_eq!(
        d.subsec_nanos() % 1_000_000,
        0,
        "{d:?} is not whole milliseconds"
    );
    let ms = d.as_millis().to_string();
    assert_eq!(parse_delay_str(&ms), Ok(d), "{ms} does not read back");
    let human = humantime::format_duration(d).to_string();
    assert_eq!(
        parse_delay_str(&human),
        Ok(d),
        "{human:?} does not read back"
    );
    for named in plans() {
        first_placement(&named.name, named.rules.strategy, &named.rules.ladder, d);
    }
    // Whole sequences on the shipped ladder, where ten years is 3,650 hops.
    for named in plans().iter().filter(|n| n.name.starts_with("shipped/")) {
        simulate(&named.name, named.rules.strategy, &named.rules.ladder, d);
    }
}

fn first_placement(
    name: &str,
    s: PlacementStrategy,
    ladder: &delay_router::core::ladder::Ladder,
    d: Duration,
) {
    let rungs = ladder.rungs();
    let Some(p) = place(s, ladder, d) else {
        assert!(d.is_zero(), "[{name}] {d:?} not placed");
        return;
    };
    assert!(!d.is_zero(), "[{name}] a due message was placed");
    match (s, p) {
        (
            PlacementStrategy::RoundUp,
            Placement::Bucket {
                rung,
                expiration,
                priority,
            },
        ) => {
            assert!(
                rungs[rung].ttl >= d || rung == rungs.len() - 1,
                "[{name}] {d:?} in {}",
                rungs[rung].label
            );
            assert!(
                rung == 0 || rungs[rung - 1].ttl < d,
                "[{name}] {d:?} fits a smaller rung than {}",
                rungs[rung].label
            );
            assert_eq!((expiration, priority), (None, None), "[{name}]");
        }
        (
            PlacementStrategy::Priority,
            Placement::Bucket {
                rung,
                expiration,
                priority,
            },
        ) => {
            assert_eq!(
                rung,
                ladder.round_up(d),
                "[{name}] {d:?}: not round-up's rung"
            );
            let ttl = rungs[rung].ttl;
            if d >= ttl {
                assert_eq!((expiration, priority), (None, Some(0)), "[{name}] {d:?}");
            } else {
                assert_eq!(expiration, Some(d), "[{name}] {d:?}: expiration");
                assert!(
                    priority.is_some_and(|p| p < PRIORITY_LEVELS),
                    "[{name}] priority {priority:?}"
                );
            }
        }
        (
            PlacementStrategy::Cascade,
            Placement::Bucket {
                rung,
                expiration,
                priority,
            },
        ) => {
            // The largest rung the time left fills, give or take the tolerance.
            let fill = d + ROUND_UP_WITHIN;
            assert!(
                rungs[rung].ttl <= fill,
                "[{name}] {d:?} in the longer {}",
                rungs[rung].label
            );
            assert!(
                rung + 1 == rungs.len() || rungs[rung + 1].ttl > fill,
                "[{name}] {d:?}: a longer rung than {} still fits",
                rungs[rung].label
            );
            assert_eq!((expiration, priority), (None, None), "[{name}]");
        }
        (PlacementStrategy::Cascade, Placement::Hold(h)) => {
            assert_eq!(h, d, "[{name}] holds {h:?} of {d:?}");
            assert!(
                d < HOLD_BELOW || d < ladder.smallest().ttl,
                "[{name}] holds {d:?}"
            );
        }
        (s, p) => panic!("[{name}] {s} placed {d:?} as {p:?}"),
    }
}

fn simulate(
    name: &str,
    s: PlacementStrategy,
    ladder: &delay_router::core::ladder::Ladder,
    d: Duration,
) {
    let (mut left, mut waited, mut hops) = (d, Duration::ZERO, 0);
    while let Some(p) = place(s, ladder, left) {
        let wait = match p {
            Placement::Hold(h) => h,
            Placement::Bucket {
                rung, expiration, ..
            } => {
                let ttl = ladder.rungs()[rung].ttl;
                expiration.map_or(ttl, |e| e.min(ttl))
            }
        };
        assert!(!wait.is_zero(), "[{name}] {d:?}: a zero wait");
        waited += wait;
        left = left.saturating_sub(wait);
        hops += 1;
        assert!(
            hops <= MAX_SIMULATED_HOPS,
            "[{name}] {d:?}: more than {MAX_SIMULATED_HOPS} hops"
        );
    }
    assert!(
        waited >= d,
        "[{name}] {d:?}: delivered early, after {waited:?}"
    );
    if s == PlacementStrategy::Cascade {
        assert!(
            waited <= d + ROUND_UP_WITHIN,
            "[{name}] {d:?}: cascade waited {waited:?}"
        );
    } else {
        assert!(
            waited < d + ladder.top().ttl,
            "[{name}] {d:?}: waited {waited:?}"
        );
    }
}

/// The value as a sender's `x-requested-delay`, through every plan's ingress.
fn through_plans(v: &AMQPValue, parsed: &Result<Duration, DelayError>) {
    let mut h = FieldTable::default();
    h.insert(REQUESTED_DELAY.into(), v.clone());
    h.insert(
        ORIGINAL_EXCHANGE.into(),
        AMQPValue::LongString("orders".into()),
    );
    let p = BasicProperties::default().with_headers(h);
    for named in plans() {
        let (name, rules) = (&named.name, &named.rules);
        let action = decide::ingress(rules, &"k".into(), &p, NOW, 0.5);
        match (parsed, action) {
            (Err(e), Action::Park { reason, .. }) => {
                assert_eq!(reason, ParkReason::InvalidDelay(e.clone()), "[{name}]")
            }
            (Ok(d), Action::Deliver { after, .. }) => {
                match place(rules.strategy, &rules.ladder, *d) {
                    None => assert!(after.is_zero(), "[{name}]"),
                    Some(Placement::Hold(h)) => assert_eq!(after, h, "[{name}]"),
                    Some(other) => {
                        panic!("[{name}] {d:?} delivered at ingress, placement says {other:?}")
                    }
                }
            }
            (
                Ok(d),
                Action::Wait {
                    queue, properties, ..
                },
            ) => {
                let Some(Placement::Bucket { rung, .. }) = place(rules.strategy, &rules.ladder, *d)
                else {
                    panic!("[{name}] {d:?} placed in {queue} at ingress")
                };
                // One of the rung's queues (the draw picks among its shards).
                let rung = &rules.ladder.rungs()[rung];
                assert!(
                    (0..rules.bucket_shards())
                        .any(|s| queue == rules.names.bucket_shard(rules.strategy, rung, s)),
                    "[{name}] {queue}"
                );
                let t = read_transit(&properties).expect("transit headers");
                assert_eq!(
                    t.deadline_ms,
                    NOW + d.as_millis() as i64,
                    "[{name}] deadline of {d:?}"
                );
            }
            (parsed, action) => {
                panic!("[{name}] {v:?} parsed as {parsed:?} but ingress gave {action:?}")
            }
        }
    }
}
