//! Unit tests of parking: the parked copy, replay, fitting a frame, a refused delivery.

use super::*;
use crate::core::envelope::headers_of;
use crate::testkit::props::{s, sent, transit, with_headers};

#[test]
fn unparking_gives_back_the_sender_message_without_bookkeeping() {
    let original = sent();
    let d = transit().destination;
    let parked = park(&original, &ParkReason::MissingDelay, 42, Some(&d));
    assert_eq!(parked_destination(&parked), Some(d));
    assert_eq!(unpark(&parked), original);
    let mut h = headers_of(&original);
    h.insert(
        crate::core::retry::ATTEMPTS.into(),
        AMQPValue::LongLongInt(4),
    );
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
        &sent(),
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
    assert_eq!(h.inner().get("tenant"), Some(&s("acme")));
    assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
    assert_eq!(*p.expiration(), None);
    assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("msg-1"));
}

#[test]
fn a_message_without_headers_is_replayed_without_headers() {
    let sent = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id("m".into());
    let parked = park(&sent, &ParkReason::MissingDelay, 1, None);
    assert_eq!(unpark(&parked), sent);
}

#[test]
fn a_parked_copy_sets_the_user_id_aside_so_the_router_may_publish_it() {
    let p = park(&sent(), &ParkReason::MissingDelay, 1, None);
    assert_eq!(*p.user_id(), None);
    assert!(crate::core::wire::acceptable(&p, "router").is_ok());
    assert_eq!(
        unpark(&p).user_id().as_ref().map(|u| u.as_str()),
        Some("guest")
    );
}

#[test]
fn a_refused_delivery_is_parked_with_the_destination_and_the_brokers_words() {
    let d = transit().destination;
    let reply = BrokerReply {
        code: crate::core::reasons::ACCESS_REFUSED,
        text: "ACCESS_REFUSED - access to exchange 'orders' refused".into(),
    };
    let failure = Failure::Refused {
        reply,
        remembered_ms: None,
    };
    let (reason, p) = refused_delivery(&sent(), &d, failure, 7, 131_072);
    let text = reason.to_string();
    assert!(
        text.contains("exchange 'orders' with routing key 'eu'"),
        "{text}"
    );
    assert!(
        text.contains("403 ACCESS_REFUSED - access to exchange"),
        "{text}"
    );
    assert_eq!(parked_destination(&p), Some(d.clone()));
    assert_eq!(unpark(&p), sent());
    let (reason, _) = refused_delivery(&sent(), &d, Failure::Returned, 7, 131_072);
    assert!(matches!(reason, ParkReason::NoRoute { .. }));
    let (reason, _) = refused_delivery(&sent(), &d, Failure::Nacked, 7, 131_072);
    assert!(matches!(reason, ParkReason::Nacked(_)));
}

#[test]
fn a_parked_copy_too_large_for_the_frame_loses_its_largest_header_by_name() {
    let big = with_headers(sent(), &[("pad", s(&"p".repeat(10_000)))]);
    let d = transit().destination;
    let (reason, p) = refused_delivery(&big, &d, Failure::Returned, 7, 8_192);
    assert!(crate::core::wire::fits(&p, 8_192));
    let text = reason.to_string();
    assert!(text.starts_with("unroutable: no queue is bound"), "{text}");
    assert!(
        text.contains("removed these sender headers: 'pad' ("),
        "{text}"
    );
    let (_, fits_as_is) = refused_delivery(&big, &d, Failure::Returned, 7, 131_072);
    assert!(headers_of(&fits_as_is).contains_key("pad"));
}

/// During an upgrade, a router of an earlier version reads only the
/// spelled-out record and parks a compact one as not in transit; replay by
/// this version still finds the destination and the sender's message.
#[test]
fn a_compact_message_an_earlier_version_parked_is_replayed_as_sent() {
    use crate::core::envelope::{Overrides, enter_transit};
    use crate::testkit::props::dead_letter;
    let original = sent();
    let in_bucket = dead_letter(
        &enter_transit(&original, &transit(), Overrides::default()),
        "delay.bucket.1s",
        "expired",
        0,
    );
    let reason = ParkReason::NotInTransit("x-delay-router-exchange is missing".into());
    let parked = park(&in_bucket, &reason, 42, None);
    assert_eq!(parked_destination(&parked), Some(transit().destination));
    assert_eq!(unpark(&parked), original);
}
