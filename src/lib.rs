//! delay-router: delayed retries and delayed delivery for RabbitMQ, without
//! broker plugins, using a ladder of fixed-TTL bucket queues.
//!
//! Users publish to the router exchange with `x-requested-delay`; the router
//! places each message in a bucket whose TTL fits, and when the bucket
//! dead-letters it, publishes it to its original exchange and routing key.
//!
//! The pure core (no I/O; unit- and property-tested):
//! - [`ladder`]: the bucket rungs, validated and sorted.
//! - [`placement`]: which rung a message waits on for the time it has left.
//! - [`contract`]: header names, and parsing of `x-requested-delay` and the destination.
//! - [`envelope`]: how properties change in transit and are restored exactly on delivery.
//! - [`park`]: why a message was parked, in words.
//! - [`retry`]: retry policies, backoff with jitter, reading `x-death` rejections.
//! - [`decision`]: what to do with a message at ingress or when a bucket expires it.
//! - [`identity`]: stable message ids for messages that arrive without one.
//! - [`wire`]: properties as encoded on the wire, and the header frame limit.
//! - [`topology`]: names and arguments of everything declared.
//! - [`window`]: the prefetch window, sized to a byte budget from observed message sizes.
//! - [`config`]: `buckets.toml` plus environment overrides, validated once.
//!
//! The shell (talks to RabbitMQ; every await has a timeout):
//! - [`broker`]: connecting, declaring, queue depths.
//! - [`router`]: supervisor, sessions and the confirm-then-ack pipelines.
//! - [`drift`]: checks the topology periodically and repairs what was deleted.
//! - [`janitor`]: drains and removes buckets no longer in the ladder.
//! - [`settle`]: acking source deliveries in bulk once their replacements are confirmed.
//! - [`stats`]: counters of placements, deliveries, holds and parks.
//! - [`status`]: the `status` report.
//! - [`parked`]: `parked list|replay|purge`.
//! - [`client`]: "retry this delivery in D" for consumers (the explicit path).
//! - [`shutdown`], [`cli`]: signals and the command line.

pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod contract;
pub mod decision;
pub mod drift;
pub mod envelope;
pub mod identity;
pub mod janitor;
pub mod ladder;
pub mod park;
pub mod parked;
pub mod placement;
pub mod retry;
pub mod router;
pub mod settle;
pub mod shutdown;
pub mod stats;
pub mod status;
pub mod topology;
pub mod window;
pub mod wire;
