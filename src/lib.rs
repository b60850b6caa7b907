//! delay-router: delayed retries and delayed delivery for RabbitMQ, without
//! broker plugins, using a ladder of fixed-TTL bucket queues.
//!
//! Users publish to the router exchange with `x-requested-delay`; the router
//! places each message in a bucket whose TTL fits, and when the bucket
//! dead-letters it, publishes it to its original exchange and routing key.
//!
//! Where a message's fate is **decided** — [`core`], pure, no I/O:
//! - [`core::decision`]: [`Rules::decide`](core::decision::Rules::decide), the
//!   one decision per delivery, returning its whole [`Plan`](core::decision::Plan);
//!   its parts: [`core::ladder`], [`core::placement`], [`core::contract`]
//!   (headers in and out), [`core::envelope`] (properties in transit),
//!   [`core::parking`] and [`core::reasons`] (parked messages and why),
//!   [`core::retry`], [`core::identity`] (derived message ids), [`core::wire`]
//!   (frame sizes, what the broker accepts), [`core::topology`] (names and
//!   arguments), [`core::security`] (allow-list, permissions), [`core::glob`];
//!   beside them [`core::compat`]: what the connected broker's version gives
//!   a strategy and queue type; [`core::inflight`]: how many publishes a
//!   pipeline keeps unconfirmed, from the observed confirm latency.
//!
//! Where it is **carried out** — [`router`], the service: supervisor,
//! session, pipelines, forwarding on the main and careful lanes, settling
//! acks, the janitor and the drift watch; its metrics and probes (`stats`,
//! `health`, `endpoint`) and the tombstones of cancelled messages.
//!
//! How it **talks to RabbitMQ** — [`broker`]: connect and close, declare,
//! probe, publish with confirms. Every await has a timeout.
//!
//! What the **command line** does — [`commands`] (`declare`, `status`,
//! `parked`, `permissions`, `cancel`; `run` is [`router::run`]). The binary itself
//! (`src/main.rs`, `src/cli.rs`) only parses arguments and prints; it needs
//! the `cli` feature (default), which brings clap and anyhow.
//!
//! Also: [`config`] (`buckets.toml` and the environment, validated once),
//! [`client`] ("retry this delivery in D" for consumers), [`shutdown`]
//! (signals), and with the `testkit` feature `testkit` (what the tests
//! share).

pub mod broker;
pub mod client;
pub mod commands;
pub mod config;
pub mod core;
pub mod router;
pub mod shutdown;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
