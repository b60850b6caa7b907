//! Unit tests of the envelope: transit in, hops, exact restore on delivery.

use super::*;
use crate::testkit::props::{dead_letter, sent, transit};

/// What a bucket does to a message when it dead-letters it.
fn broker_dead_letters(p: &BasicProperties) -> BasicProperties {
    dead_letter(p, "delay.bucket.1s", "expired", 0)
}

#[test]
fn in_transit_a_message_is_persistent_without_expiration_and_carries_its_route() {
    let p = enter_transit(&sent(), &transit(), Overrides::default());
    assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
    assert_eq!(*p.expiration(), None);
    assert_eq!(read_transit(&p), Ok(transit()));
    let h = p.headers().as_ref().unwrap();
    assert!(!h.contains_key("x-death"), "sender's x-death is set aside");
}

#[test]
fn leaving_transit_restores_every_sender_property_exactly() {
    let original = sent();
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
        format: TransitFormat::Compact,
    };
    for original in [
        sent(),
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
fn a_quorum_queues_redelivery_counts_are_dropped_and_nothing_else() {
    let mut h = FieldTable::default();
    h.insert("a".into(), AMQPValue::LongInt(1));
    let plain = BasicProperties::default().with_headers(h.clone());
    assert_eq!(without_redelivery_headers(&plain), None);
    assert_eq!(
        without_redelivery_headers(&BasicProperties::default()),
        None
    );
    for counts in [&REDELIVERY_HEADERS[..1], &REDELIVERY_HEADERS[..]] {
        let mut h = h.clone();
        for k in counts {
            h.insert((*k).into(), AMQPValue::LongLongInt(2));
        }
        let counted = BasicProperties::default()
            .with_headers(h)
            .with_message_id("m".into());
        assert_eq!(
            without_redelivery_headers(&counted),
            Some(plain.clone().with_message_id("m".into()))
        );
    }
}

#[test]
fn the_compact_record_is_one_header_and_readable() {
    let p = enter_transit(&sent(), &transit(), Overrides::default());
    let h = p.headers().as_ref().unwrap();
    assert_eq!(
        h.inner().get(TRANSIT),
        Some(&AMQPValue::LongString("1000 1 6:orders eu".into()))
    );
    for k in [
        TRANSIT_EXCHANGE,
        TRANSIT_ROUTING_KEY,
        TRANSIT_DEADLINE,
        TRANSIT_HOPS,
    ] {
        assert!(!h.contains_key(k), "{k} written beside the compact record");
    }
}

#[test]
fn the_spelled_out_format_is_still_written_on_request_and_read() {
    let o = Overrides {
        format: TransitFormat::SpelledOut,
        ..Overrides::default()
    };
    let original = sent();
    let p = enter_transit(&original, &transit(), o);
    let h = p.headers().as_ref().unwrap();
    assert!(!h.contains_key(TRANSIT));
    assert_eq!(
        h.inner().get(TRANSIT_DEADLINE),
        Some(&AMQPValue::LongLongInt(1_000))
    );
    assert_eq!(read_transit(&p), Ok(transit()));
    assert_eq!(leave_transit(&broker_dead_letters(&p)), original);
}

#[test]
fn a_hop_rewrites_an_earlier_versions_record_in_the_configured_format() {
    let original = sent();
    let spelled = Overrides {
        format: TransitFormat::SpelledOut,
        ..Overrides::default()
    };
    let next = Transit {
        hops: 2,
        ..transit()
    };
    // Placed by an earlier version (spelled out), moved on by this one.
    let p = next_hop(
        &broker_dead_letters(&enter_transit(&original, &transit(), spelled)),
        &next,
        Overrides::default(),
    );
    let h = p.headers().as_ref().unwrap();
    assert!(h.contains_key(TRANSIT));
    assert!(!h.contains_key(TRANSIT_EXCHANGE) && !h.contains_key(TRANSIT_HOPS));
    assert_eq!(read_transit(&p), Ok(next.clone()));
    // And back (a router told to write the spelled-out format).
    let p = next_hop(&broker_dead_letters(&p), &next, spelled);
    assert!(!p.headers().as_ref().unwrap().contains_key(TRANSIT));
    assert_eq!(read_transit(&p), Ok(next));
    assert_eq!(leave_transit(&broker_dead_letters(&p)), original);
}

#[test]
fn a_malformed_compact_record_is_refused_by_name() {
    for bad in [
        "",
        "1000",
        "1000 1",
        "1000 1 6:order",
        "1000 1 6:orders",
        "1000 1 6:ordersXeu",
        "x 1 6:orders eu",
        "1000 +1 6:orders eu",
        "1000 1 -6:orders eu",
        "1000 1 99999999999999999999:orders eu",
        "99999999999999999999 1 6:orders eu",
    ] {
        let mut h = FieldTable::default();
        h.insert(TRANSIT.into(), AMQPValue::LongString(bad.into()));
        assert_eq!(
            read_transit(&BasicProperties::default().with_headers(h)),
            Err(TransitError::Malformed(TRANSIT)),
            "{bad:?}"
        );
    }
    let mut h = FieldTable::default();
    h.insert(TRANSIT.into(), AMQPValue::LongLongInt(1));
    assert_eq!(
        read_transit(&BasicProperties::default().with_headers(h)),
        Err(TransitError::Malformed(TRANSIT))
    );
    // A name cut inside a multi-byte character, and one over 255 bytes.
    assert_eq!(Transit::parse_compact("1 1 1:é k".as_bytes()), None);
    let long = format!("1 1 256:{} k", "e".repeat(256));
    assert_eq!(Transit::parse_compact(long.as_bytes()), None);
}

proptest::proptest! {
    #[test]
    fn the_compact_record_round_trips_any_destination(
        exchange in "\\PC{0,40}",
        routing_key in "\\PC{0,60}",
        deadline_ms in proptest::num::i64::ANY,
        hops in proptest::num::i64::ANY,
    ) {
        let t = Transit {
            destination: Destination {
                exchange: exchange.as_str().into(),
                routing_key: routing_key.as_str().into(),
            },
            deadline_ms,
            hops,
        };
        let written = format!(
            "{deadline_ms} {hops} {}:{exchange} {routing_key}",
            exchange.len()
        );
        proptest::prop_assert_eq!(&t.compact(), &written, "the record is what `format!` writes");
        proptest::prop_assert_eq!(Transit::parse_compact(t.compact().as_bytes()), Some(t));
    }

    #[test]
    fn no_bytes_make_the_compact_reader_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
        if let Some(t) = Transit::parse_compact(&bytes) {
            proptest::prop_assert_eq!(Transit::parse_compact(t.compact().as_bytes()), Some(t));
        }
    }
}

#[test]
fn decimals_are_written_as_display_writes_them() {
    for v in [
        0,
        1,
        -1,
        9,
        10,
        -10,
        99,
        100,
        i64::MAX,
        i64::MIN,
        i64::MIN + 1,
    ] {
        let mut s = String::from("x");
        push_decimal(&mut s, v);
        assert_eq!(s, format!("x{v}"));
    }
}

#[test]
fn the_compact_record_is_smaller_on_the_wire() {
    use crate::core::wire::encoded_len;
    let long = Transit {
        destination: Destination {
            exchange: "orders".into(),
            routing_key: "order.created.eu".into(),
        },
        deadline_ms: 1_795_341_600_250,
        hops: 3,
    };
    let placed = |format| {
        let o = Overrides {
            format,
            ..Overrides::default()
        };
        encoded_len(&enter_transit(&sent(), &long, o)).unwrap()
    };
    let (compact, spelled) = (
        placed(TransitFormat::Compact),
        placed(TransitFormat::SpelledOut),
    );
    println!("properties of a placed message: compact {compact} bytes, spelled out {spelled}");
    assert!(spelled - compact >= 80, "{spelled} - {compact}");
}
