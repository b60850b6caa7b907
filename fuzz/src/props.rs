//! Property helpers of the fuzz harness; the general ones come from the
//! crate's test kit.

use delay_router::core::contract::TRANSIT_HEADERS;
use delay_router::core::retry::RETRY_HEADERS;
pub use delay_router::testkit::props::{dead_letter, same, without};
use lapin::BasicProperties;

/// Whether a sender kept to the contract: none of the router's transit
/// headers (`x-delay-router-*` bookkeeping other than the retry counters,
/// which legitimately come back on redelivered messages).
pub fn honours_contract(p: &BasicProperties) -> bool {
    p.headers()
        .as_ref()
        .is_none_or(|h| TRANSIT_HEADERS.iter().all(|k| !h.contains_key(k)))
}

/// What the sender sees of a message: everything but the retry counters,
/// which the router adds or updates on purpose.
pub fn sender_view(p: &BasicProperties) -> BasicProperties {
    without(p, &RETRY_HEADERS)
}
