//! One delivery through the production [`Rules::decide`], for tests, benches
//! and fuzz targets that care about the action and not about building a
//! [`Delivery`] and a [`Context`] each time. Nothing here decides: it only
//! fills in the delivery and calls `decide`.

use crate::core::clock::Clock;
use crate::core::decision::{Action, Context, Delivery, Rules, Source};
use lapin::BasicProperties;
use lapin::types::ShortString;
use std::borrow::Cow;

/// The body every delivery here carries.
pub const BODY: &[u8] = b"body";

/// The action for `p`, published to the router exchange with `routing_key`,
/// read at exactly `now_ms` with the random draw `unit`.
pub fn ingress(
    rules: &Rules,
    routing_key: &ShortString,
    p: &BasicProperties,
    now_ms: i64,
    unit: f64,
) -> Action {
    let cx = Context {
        unit,
        ..Context::at(Clock::at_ms(now_ms))
    };
    from(rules, Source::Ingress, routing_key, p, &cx)
}

/// The action for `p` as a bucket dead-letters it into the expired queue,
/// read at exactly `now_ms`.
pub fn expired(rules: &Rules, p: &BasicProperties, now_ms: i64) -> Action {
    let cx = Context::at(Clock::at_ms(now_ms));
    from(rules, Source::Expired, &"".into(), p, &cx)
}

/// The action for `p` from `source` under `cx`.
pub fn from(
    rules: &Rules,
    source: Source,
    routing_key: &ShortString,
    p: &BasicProperties,
    cx: &Context<'_>,
) -> Action {
    let exchange = match source {
        Source::Ingress => rules.names.router_exchange.as_str(),
        Source::Expired => "",
    };
    let d = Delivery {
        source,
        exchange,
        routing_key,
        properties: Cow::Borrowed(p),
        body: BODY,
    };
    rules.decide(d, cx).action
}
