//! Seed inputs, encoded with amq-protocol-types' generators
//! (`generation::gen_field_table`, `gen_value`): written to `seeds/<target>/`
//! by `cargo run --example write_seeds`, replayed by `cargo test`.

use crate::delay::{MODE_LONG_STRING, MODE_SHORT_STRING, MODE_WIRE};
use crate::headers::{
    BYSTANDERS, CLOCK_ANY, CLOCK_NEAR, DELIVERY_MODE, EXPIRATION, NO_HEADERS, PRIORITY, Trailer,
    USER_ID,
};
use lapin::types::generation::{gen_field_table, gen_value};
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};

/// A table in wire format.
pub fn encode_table(t: &FieldTable) -> Vec<u8> {
    cookie_factory::gen_simple(gen_field_table(t), Vec::new()).expect("encodable table")
}

/// A typed value in wire format (type tag, then the value).
pub fn encode_value(v: &AMQPValue) -> Vec<u8> {
    cookie_factory::gen_simple(gen_value(v), Vec::new()).expect("encodable value")
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn death(reason: &str, queue: AMQPValue, count: i64) -> AMQPValue {
    AMQPValue::FieldTable(table(&[
        ("count", AMQPValue::LongLongInt(count)),
        ("reason", s(reason)),
        ("queue", queue),
        ("exchange", s("")),
        (
            "routing-keys",
            AMQPValue::FieldArray(FieldArray::from(vec![s("k")])),
        ),
        ("time", AMQPValue::Timestamp(1_700_000_000)),
    ]))
}

fn array(v: Vec<AMQPValue>) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(v))
}

/// The `x-requested-delay` values seeded, in every form a sender might use.
pub fn delay_values() -> Vec<(&'static str, AMQPValue)> {
    vec![
        ("i8", AMQPValue::ShortShortInt(5)),
        ("i8-neg", AMQPValue::ShortShortInt(-1)),
        ("u8", AMQPValue::ShortShortUInt(200)),
        ("i16", AMQPValue::ShortInt(1500)),
        ("u16", AMQPValue::ShortUInt(65535)),
        ("i32", AMQPValue::LongInt(3_400)),
        ("i32-neg", AMQPValue::LongInt(-5)),
        ("i32-zero", AMQPValue::LongInt(0)),
        ("u32", AMQPValue::LongUInt(u32::MAX)),
        ("i64", AMQPValue::LongLongInt(100_000)),
        ("i64-max-delay", AMQPValue::LongLongInt(315_360_000_000)),
        ("i64-over-max", AMQPValue::LongLongInt(315_360_000_001)),
        ("i64-max", AMQPValue::LongLongInt(i64::MAX)),
        ("i64-min", AMQPValue::LongLongInt(i64::MIN)),
        ("str-5s", s("5s")),
        ("str-digits", s("1500")),
        ("str-neg", s("-1")),
        ("str-neg-zero", s("-0")),
        ("str-frac", s("1.5")),
        ("str-huge", s("99999999999999999999999")),
        ("str-u64-max", s("18446744073709551615")),
        ("str-compound", s("1m 30s")),
        ("str-spaces", s(" 90s ")),
        ("str-us", s("1500us")),
        ("str-ns", s("1ns")),
        ("str-years", s("10years")),
        ("str-huge-unit", s("20000years")),
        ("str-days", s("3650days")),
        ("str-empty", s("")),
        ("str-blank", s("   ")),
        ("str-word", s("soon")),
        ("str-neg-unit", s("-5s")),
        ("str-long", s(&"9".repeat(300))),
        ("str-unicode", s("5\u{00a0}s")),
        (
            "str-non-utf8",
            AMQPValue::LongString(LongString::from(vec![b'5', 0xff, b's'])),
        ),
        ("short-2s", AMQPValue::ShortString("2s".into())),
        ("float", AMQPValue::Float(1.5)),
        ("double", AMQPValue::Double(5000.0)),
        (
            "decimal",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 3,
                value: 5000,
            }),
        ),
        ("timestamp", AMQPValue::Timestamp(5000)),
        ("bool", AMQPValue::Boolean(true)),
        ("void", AMQPValue::Void),
        (
            "bytes",
            AMQPValue::ByteArray(ByteArray::from(b"5s".to_vec())),
        ),
        ("array", array(vec![s("5s")])),
        (
            "table",
            AMQPValue::FieldTable(table(&[("ms", AMQPValue::LongInt(5))])),
        ),
    ]
}

/// Whether a value has a field type on the wire (short strings do not).
fn on_the_wire(v: &AMQPValue) -> bool {
    !matches!(v, AMQPValue::ShortString(_))
}

/// Seeds for the `headers` target: (file name, bytes).
pub fn headers() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |name: &str, t: FieldTable, trailer: Option<Trailer>| {
        let mut bytes = encode_table(&t);
        if let Some(tr) = trailer {
            bytes.extend(tr.encode());
        }
        out.push((name.to_string(), bytes));
    };
    let rk = |k: &str| Trailer {
        routing_key: k.as_bytes().to_vec(),
        ..Trailer::default()
    };
    // Every delay form a header table can carry on the wire (short strings
    // cannot: amq-protocol-types and RabbitMQ give them no field type).
    for (name, v) in delay_values() {
        if !on_the_wire(&v) {
            continue;
        }
        add(
            &format!("delay-{name}"),
            table(&[
                ("x-requested-delay", v.clone()),
                ("x-original-exchange", s("orders")),
            ]),
            Some(rk("eu")),
        );
    }
    for (name, v) in [
        ("5s", s("5s")),
        ("3400", AMQPValue::LongInt(3_400)),
        ("100s", s("100s")),
        ("1d", s("1d 2h 3m 4s 5ms")),
        ("10y", s("10years")),
        ("200ms", AMQPValue::LongInt(200)),
    ] {
        add(
            &format!("default-exchange-{name}"),
            table(&[
                ("x-requested-delay", v),
                ("x-original-exchange", s("")),
                ("x-original-routing-key", s("jobs")),
            ]),
            None,
        );
    }
    // Destinations.
    let dest = |name: &str, ex: Option<AMQPValue>, key: Option<AMQPValue>| {
        let mut pairs = vec![("x-requested-delay", s("2s"))];
        if let Some(ex) = ex {
            pairs.push(("x-original-exchange", ex));
        }
        if let Some(key) = key {
            pairs.push(("x-original-routing-key", key));
        }
        (format!("dest-{name}"), table(&pairs))
    };
    for (name, t) in [
        dest("missing", None, None),
        dest("router-fz", Some(s("fz.router")), None),
        dest("router-delay", Some(s("delay.router")), None),
        dest("wrong-type", Some(AMQPValue::LongInt(3)), None),
        dest(
            "key-wrong-type",
            Some(s("orders")),
            Some(AMQPValue::Boolean(false)),
        ),
        dest("exchange-256", Some(s(&"e".repeat(256))), None),
        dest("key-255", Some(s("")), Some(s(&"k".repeat(255)))),
        dest("key-256", Some(s("")), Some(s(&"k".repeat(256)))),
        dest(
            "non-utf8",
            Some(AMQPValue::LongString(LongString::from(vec![0xc3, 0x28]))),
            None,
        ),
        dest("key-unicode", Some(s("")), Some(s("ключ.é"))),
    ] {
        add(&name, t, Some(rk("k")));
    }
    // Zero-code retries: x-death as RabbitMQ writes it.
    let retry = |name: &str, deaths: AMQPValue, extra: &[(&str, AMQPValue)]| {
        let mut pairs = vec![("x-death", deaths)];
        pairs.extend(extra.iter().cloned());
        (format!("retry-{name}"), table(&pairs))
    };
    for (name, t) in [
        retry(
            "orders",
            array(vec![death("rejected", s("orders.eu"), 1)]),
            &[],
        ),
        retry(
            "any-queue",
            array(vec![death("rejected", s("work"), 2)]),
            &[],
        ),
        retry(
            "attempts-2",
            array(vec![
                death("rejected", s("orders.eu"), 2),
                death("expired", s("delay.bucket.1s"), 1),
            ]),
            &[
                ("x-delay-router-attempts", AMQPValue::LongLongInt(2)),
                (
                    "x-delay-router-first-failure",
                    AMQPValue::LongLongInt(1_799_999_000_000),
                ),
                (
                    "x-delay-router-last-failure",
                    AMQPValue::LongLongInt(1_799_999_990_000),
                ),
                ("x-delay-router-source-queue", s("orders.eu")),
                ("x-first-death-queue", s("orders.eu")),
                ("x-first-death-reason", s("rejected")),
                ("x-first-death-exchange", s("")),
            ],
        ),
        retry(
            "attempts-max",
            array(vec![death("rejected", s("orders.eu"), 9)]),
            &[(
                "x-delay-router-attempts",
                AMQPValue::LongLongInt(u32::MAX as i64),
            )],
        ),
        retry(
            "attempts-neg",
            array(vec![death("rejected", s("abc"), 1)]),
            &[("x-delay-router-attempts", AMQPValue::LongInt(-1))],
        ),
        retry(
            "explicit-wins",
            array(vec![death("rejected", s("billing"), 1)]),
            &[("x-requested-delay", s("7s"))],
        ),
        retry(
            "explicit-bad",
            array(vec![death("rejected", s("billing"), 1)]),
            &[("x-requested-delay", s("-7"))],
        ),
        retry(
            "expired-first",
            array(vec![
                death("expired", s("q"), 1),
                death("rejected", s("orders.eu"), 1),
            ]),
            &[
                ("x-original-exchange", s("o")),
                ("x-requested-delay", s("1s")),
            ],
        ),
        retry(
            "no-queue",
            array(vec![AMQPValue::FieldTable(table(&[(
                "reason",
                s("rejected"),
            )]))]),
            &[],
        ),
        retry(
            "queue-256",
            array(vec![death("rejected", s(&"q".repeat(256)), 1)]),
            &[],
        ),
        retry("entry-not-table", array(vec![s("rejected")]), &[]),
        retry(
            "empty-array",
            array(vec![]),
            &[
                ("x-original-exchange", s("o")),
                ("x-requested-delay", s("1s")),
            ],
        ),
        retry("not-array", AMQPValue::LongInt(3), &[]),
        retry(
            "not-array-explicit",
            s("x"),
            &[
                ("x-original-exchange", s("o")),
                ("x-requested-delay", s("1s")),
            ],
        ),
    ] {
        add(&name, t, Some(rk("k")));
    }
    // A sender spoofing the router's transit headers.
    let mut saved = FieldTable::default();
    saved.insert("expiration".into(), s("5"));
    saved.insert("no-headers".into(), AMQPValue::Boolean(true));
    add(
        "spoofed-transit",
        table(&[
            ("x-requested-delay", s("1s")),
            ("x-original-exchange", s("o")),
            ("x-delay-router-exchange", s("evil")),
            ("x-delay-router-routing-key", s("k")),
            ("x-delay-router-deadline", AMQPValue::LongLongInt(i64::MAX)),
            ("x-delay-router-hops", AMQPValue::LongLongInt(-1)),
            (
                "x-delay-router-saved-properties",
                AMQPValue::FieldTable(saved.clone()),
            ),
            (
                "x-delay-router-saved-headers",
                AMQPValue::FieldTable(table(&[("x-death", s("d"))])),
            ),
        ]),
        Some(rk("k")),
    );
    // As if from a bucket: what the decision reads out of the expired queue.
    add(
        "in-transit",
        table(&[
            ("x-delay-router-exchange", s("orders")),
            ("x-delay-router-routing-key", s("eu")),
            (
                "x-delay-router-deadline",
                AMQPValue::LongLongInt(1_800_000_003_400),
            ),
            ("x-delay-router-hops", AMQPValue::LongLongInt(1)),
            (
                "x-delay-router-saved-properties",
                AMQPValue::FieldTable(saved),
            ),
            (
                "x-death",
                array(vec![death("expired", s("fz.bucket.5s"), 1)]),
            ),
        ]),
        Some(Trailer {
            later_ms: 3_400,
            ..rk("k")
        }),
    );
    // The same, in the compact format (this version's default).
    add(
        "in-transit-compact",
        table(&[
            ("x-delay-router", s("1800000003400 1 6:orders eu")),
            (
                "x-death",
                array(vec![death("expired", s("fz.bucket.5s"), 1)]),
            ),
        ]),
        Some(Trailer {
            later_ms: 3_400,
            ..rk("k")
        }),
    );
    // The most hops the headers can say, and a deadline so far off the
    // message goes to a bucket again: one more hop must not overflow (found
    // by the fuzzer in CI, 2026-11-28).
    add(
        "in-transit-hops-max",
        table(&[
            ("x-delay-router-exchange", s("orders")),
            ("x-delay-router-routing-key", s("eu")),
            ("x-delay-router-deadline", AMQPValue::LongLongInt(i64::MAX)),
            ("x-delay-router-hops", AMQPValue::LongLongInt(i64::MAX)),
            (
                "x-death",
                array(vec![death("expired", s("fz.bucket.5s"), 1)]),
            ),
        ]),
        Some(Trailer {
            later_ms: 3_400,
            ..rk("k")
        }),
    );
    add(
        "spoofed-compact",
        table(&[
            ("x-requested-delay", s("1s")),
            ("x-original-exchange", s("o")),
            ("x-delay-router", s("-1 -1 4:evil k")),
        ]),
        Some(rk("k")),
    );
    add(
        "parked",
        table(&[
            ("x-park-reason", s("missing x-requested-delay header")),
            ("x-parked-at", AMQPValue::LongLongInt(1)),
            ("x-original-exchange", s("o")),
        ]),
        None,
    );
    // Properties in the trailer.
    let ok = || {
        table(&[
            ("x-requested-delay", s("3s")),
            ("x-original-exchange", s("orders")),
            ("app", AMQPValue::LongInt(7)),
        ])
    };
    let props = |flags: u8| Trailer {
        flags,
        delivery_mode: 1,
        priority: 3,
        user: 0,
        unit: 40_000,
        later_ms: 5_000,
        clock: 0,
        expiration: b"60000".to_vec(),
        routing_key: b"eu".to_vec(),
    };
    add(
        "props-all",
        ok(),
        Some(props(
            DELIVERY_MODE | EXPIRATION | PRIORITY | USER_ID | BYSTANDERS,
        )),
    );
    add("props-transient", ok(), Some(props(DELIVERY_MODE)));
    add(
        "props-persistent",
        ok(),
        Some(Trailer {
            delivery_mode: 2,
            ..props(DELIVERY_MODE | BYSTANDERS)
        }),
    );
    add("props-priority", ok(), Some(props(PRIORITY)));
    add("props-expiration", ok(), Some(props(EXPIRATION)));
    add(
        "props-mallory",
        ok(),
        Some(Trailer {
            user: 1,
            ..props(USER_ID)
        }),
    );
    add(
        "props-no-headers",
        FieldTable::default(),
        Some(props(NO_HEADERS | DELIVERY_MODE)),
    );
    add(
        "props-no-headers-persistent",
        FieldTable::default(),
        Some(Trailer {
            delivery_mode: 2,
            ..props(NO_HEADERS | DELIVERY_MODE)
        }),
    );
    add(
        "props-clock-near",
        ok(),
        Some(Trailer {
            clock: 0x0000_ffff_0000_0000,
            ..props(CLOCK_NEAR)
        }),
    );
    add(
        "props-clock-max",
        ok(),
        Some(Trailer {
            clock: i64::MAX - 1000,
            ..props(CLOCK_ANY)
        }),
    );
    add(
        "props-clock-negative",
        ok(),
        Some(Trailer {
            clock: -5_000,
            ..props(CLOCK_ANY)
        }),
    );
    add("empty-table", FieldTable::default(), None);
    // Every value type, nested, under arbitrary names.
    add(
        "all-types",
        table(&[
            ("x-requested-delay", AMQPValue::LongInt(1_200)),
            ("x-original-exchange", s("o")),
            ("b", AMQPValue::Boolean(true)),
            ("f", AMQPValue::Float(1.0)),
            ("d", AMQPValue::Double(-0.0)),
            (
                "D",
                AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 7 }),
            ),
            ("T", AMQPValue::Timestamp(u64::MAX)),
            ("x", AMQPValue::ByteArray(ByteArray::from(vec![0, 1, 2]))),
            ("V", AMQPValue::Void),
            (
                "A",
                array(vec![AMQPValue::FieldTable(table(&[(
                    "n",
                    array(vec![AMQPValue::Void]),
                )]))]),
            ),
        ]),
        Some(props(PRIORITY | EXPIRATION)),
    );
    // A cancel request on the router exchange: parked as it came, without
    // the message-id the router derives for what it forwards.
    add(
        "cancel-on-router",
        table(&[("x-cancel-message-id", s("order-7-reminder"))]),
        Some(rk("eu")),
    );
    add(
        "cancel-on-router-with-delay",
        table(&[
            ("x-cancel-message-id", s("order-7-reminder")),
            ("x-requested-delay", s("2s")),
            ("x-original-exchange", s("orders")),
        ]),
        None,
    );
    out
}

/// Seeds for the `delay` target: (file name, bytes).
pub fn delay() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, v) in delay_values() {
        if on_the_wire(&v) {
            let mut bytes = vec![MODE_WIRE];
            bytes.extend(encode_value(&v));
            out.push((format!("wire-{name}"), bytes));
        }
        if let AMQPValue::ShortString(text) = &v {
            let mut bytes = vec![MODE_SHORT_STRING];
            bytes.extend(text.as_str().as_bytes());
            out.push((format!("short-{name}"), bytes));
        }
        if let AMQPValue::LongString(text) = &v {
            let mut bytes = vec![MODE_LONG_STRING];
            bytes.extend(text.as_bytes());
            out.push((format!("raw-{name}"), bytes));
            if let Ok(t) = std::str::from_utf8(text.as_bytes())
                && t.len() <= 255
            {
                let mut bytes = vec![MODE_SHORT_STRING];
                bytes.extend(t.as_bytes());
                out.push((format!("short-{name}"), bytes));
            }
        }
    }
    // Humantime's other units and spellings.
    for (i, t) in [
        "1 hour",
        "2weeks",
        "3months",
        "1y",
        "1msec",
        "1usec",
        "1nsec",
        "5min",
        "2hrs",
        "1sec",
        "500 ms",
        "1h30m",
        "0s",
        "0",
        "00000000000000000000000001",
        "315360000000",
        "315360000001",
        "9999999999999999999years",
        "1e3",
        "+5",
        "5S",
        "1h 1h 1h",
    ]
    .iter()
    .enumerate()
    {
        let mut bytes = vec![MODE_LONG_STRING];
        bytes.extend(t.as_bytes());
        out.push((format!("unit-{i:02}"), bytes));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_headers_seed_decodes_and_passes() {
        for (name, bytes) in headers() {
            let m =
                crate::headers::decode(&bytes).unwrap_or_else(|| panic!("{name} does not decode"));
            eprintln!("seed {name}");
            crate::headers::check(&m);
        }
    }

    #[test]
    fn every_delay_seed_decodes_and_passes() {
        for (name, bytes) in delay() {
            assert!(
                crate::delay::decode(&bytes).is_some(),
                "{name} does not decode"
            );
            eprintln!("seed {name}");
            crate::delay::run(&bytes);
        }
    }

    /// The committed files are what this module writes (run the example to refresh).
    #[test]
    fn committed_seeds_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        for (target, seeds) in [("headers", headers()), ("delay", delay())] {
            for (name, bytes) in seeds {
                let path = dir.join(target).join(&name);
                let on_disk =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert_eq!(
                    on_disk,
                    bytes,
                    "{} is stale: cargo run --example write_seeds",
                    path.display()
                );
            }
        }
    }
}
