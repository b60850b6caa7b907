//! The tuning constants: values the project chose by measuring, not
//! decisions a user makes (those are `buckets.toml`'s keys), with one line
//! of why each. What each buys and what deciding it measured is in
//! `docs/mechanisms.md`; the modules that use them re-export them.

use std::time::Duration;

// Cascade placement (core::placement).

/// Below this a cascade message is timed by the router, not a bucket: no rung is that fine.
pub const HOLD_BELOW: Duration = Duration::from_millis(250);
/// While it has room, the router times up to this much itself: each finer hop it saves costs the broker five operations.
pub const HOLD_WITH_ROOM: Duration = Duration::from_secs(2);
/// The step of the cascade's grid of rungs under a minute: what a grid rung leaves is held, not placed again.
pub const GRID: Duration = HOLD_WITH_ROOM;
/// The grid stops below this (or below the second rung): a minute in 2 s steps is 29 queues.
pub const GRID_BELOW: Duration = Duration::from_secs(60);
/// A step may end this much after the deadline, so a hop's few ms of lateness do not cost five finer hops.
pub const ROUND_UP_WITHIN: Duration = Duration::from_millis(10);
/// Most laps of a rung one added bucket holds: five days on a 24 h top rung, within the default cancel keep.
pub const MAX_LAPS: u32 = 5;
/// Most laps where a rung's multiples reach two rungs up (`1m` to `29m` on the shipped ladder).
pub const MAX_REACH_LAPS: u32 = 30;
/// Queues a classic rung has: a classic queue's process paces a drain, and two place faster than one.
pub const CLASSIC_BUCKET_SHARDS: u8 = 2;
/// Queues a quorum rung has: one already places as fast as the shovel, and each is a Raft group on every node.
pub const QUORUM_BUCKET_SHARDS: u8 = 1;

// Holding, acking and the publish window (router).

/// Deliveries the expired queue's window has beyond `prefetch` for holds (cascade): room for a burst coming due at once, each held unacked.
pub const HOLD_ROOM: u16 = 2_000;
/// Bytes in flight per consumer: the prefetch window shrinks for large messages.
pub const INFLIGHT_BYTES: u64 = 64 << 20;
/// Deliveries between two reconsiderations of the prefetch window.
pub const RESIZE_EVERY: u64 = 256;
/// The prefetch window changes only by this factor or more (each change is a `basic.qos`).
pub const RESIZE_FACTOR: f64 = 1.5;
/// The longest a settled delivery waits for others to share its ack (a crash meanwhile resends them, same ids).
pub const ACK_LINGER: Duration = Duration::from_millis(100);
/// The longest settled deliveries wait behind an unsettled one: acks in runs cost the source queue less.
pub const GAP_WAIT: Duration = Duration::from_millis(20);
/// Settled deliveries acked at once without lingering: it bounds what a crash sends twice beyond those in flight.
pub const ACK_BATCH: usize = 16;
/// Unconfirmed publishes grow while a round's mean confirm latency is below this many times the base.
pub const GROW_BELOW: f64 = 2.0;
/// Unconfirmed publishes shrink while a round's mean confirm latency is above this many times the base.
pub const SHRINK_ABOVE: f64 = 4.0;
/// The fewest unconfirmed publishes allowed (never above the prefetch window).
pub const FLOOR: usize = 32;
/// The fewest confirms a round averages, so small limits still get a steady mean.
pub const MIN_ROUND: usize = 32;
/// The base latency is the lowest round mean of this many rounds: it follows a broker that slowed for good, slowly.
pub const BASE_ROUNDS: u32 = 256;
/// Publishes one message may take before the session gives up on it (placement, park, careful retry, spare).
pub const MAX_PUBLISHES_PER_MESSAGE: usize = 10;

// What the router remembers of destinations (router::destinations).

/// A refusal is remembered this long: a burst to a missing exchange costs one channel, not one each.
pub const REFUSAL_MEMORY: Duration = Duration::from_secs(5);
/// An exchange that confirmed a publish stays on the main lane this long.
pub const VERIFIED_FOR: Duration = Duration::from_secs(60);
/// Remembered refusals beyond which the expired ones are pruned on insert.
pub const REFUSALS_PRUNE_ABOVE: usize = 1_000;

// Upkeep: the topology check, stale buckets, presence, cancels.

/// The topology check's period (passive declares, repair on drift).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// Every this many checks the whole topology is declared again: what finds a queue re-created with other arguments.
pub const FULL_EVERY: u32 = 12;
/// How often stale buckets are checked for emptiness.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// A router is live while heard within this many check intervals.
pub const LIVE_FOR_INTERVALS: u32 = 3;
/// Stream records of the cancels stream in flight to a router.
pub const CANCELS_PREFETCH: u16 = 2_000;
/// Cancels stream records acknowledged together.
pub const CANCELS_ACK_EVERY: u64 = 500;

// Reconnecting (router::supervisor).

/// The first wait between reconnect attempts.
pub const RECONNECT_MIN: Duration = Duration::from_millis(200);
/// The longest wait between reconnect attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A session that lived this long resets the reconnect backoff.
pub const HEALTHY_SESSION: Duration = Duration::from_secs(30);

// The message-id (core::identity).

/// Content up to this size is hashed in one call from one buffer: XXH3's streaming state costs more than one copy.
pub const HASH_ONE_SHOT_UP_TO: usize = 16 * 1024;
