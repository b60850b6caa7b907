//! delay-router: delayed retries and delayed delivery for RabbitMQ, without
//! broker plugins, using a ladder of fixed-TTL bucket queues.
//!
//! Users publish to the router exchange with `x-requested-delay`; the router
//! places each message in a bucket whose TTL fits, and when the bucket
//! dead-letters it, publishes it to its original exchange and routing key.
//! Most users run the `delay-router` binary; this crate is for programs
//! that embed the router or talk to it:
//!
//! - [`run`] the router with a [`Config`] loaded from `buckets.toml` and
//!   the environment ([`Config::load`]), until a shutdown future completes
//!   ([`shutdown::signal`]);
//! - [`client`]: "retry this delivery in D", for consumers;
//! - [`contract`]: the header names the router reads and writes;
//! - [`cli`] (the `cli` feature, on by default): the binary's command line.
//!
//! Inside, a pure core decides each delivery's fate once (`core`: the
//! ladder, placement, headers, retry policies; no I/O), the router carries
//! the decisions out (`router`: sessions, pipelines, forwarding, settling,
//! metrics and probes), and `broker` talks to RabbitMQ with a timeout on
//! every await. Those modules are the crate's own; the `testkit` feature
//! (for the project's tests, benches and fuzz targets) makes them
//! reachable, hidden from the documentation.

#![warn(missing_docs)]
// Without `testkit` the inner modules are private, and what only the tests
// reach through them is not dead.
#![cfg_attr(not(feature = "testkit"), allow(dead_code, unused_imports))]

/// The crate's own modules: public only with the `testkit` feature.
macro_rules! internal {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {$(
        $(#[$attr])*
        #[cfg(feature = "testkit")]
        #[doc(hidden)]
        #[allow(missing_docs)]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "testkit"))]
        mod $name;
    )*};
}

internal!(broker, commands, config, core, router, tuning);

#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod shutdown;

#[cfg(feature = "testkit")]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod testkit;
#[cfg(all(test, not(feature = "testkit")))]
mod testkit;

pub use crate::config::{Config, ConfigError, LogFormat};
pub use crate::router::{RouterError, run};

/// The message contract: the headers a sender sets, and those the router
/// writes on what it delivers or parks
/// (`docs/contract.md` says what each means).
pub mod contract {
    pub use crate::core::contract::{
        CANCEL_MESSAGE_ID, DELIVER_AT, ORIGINAL_EXCHANGE, ORIGINAL_ROUTING_KEY, PARK_REASON,
        PARKED_AT, REQUESTED_DELAY,
    };
    pub use crate::core::delayed::X_DELAY;
    pub use crate::core::retry::ATTEMPTS;
}
