//! What the connected broker gives a configuration, by its version: the
//! `priority` strategy is only as good as the broker's expiry of priority
//! queues. The version is the one the broker states in AMQP's
//! `server-properties` (read by `broker::server`); this module only judges it.
//!
//! What RabbitMQ does (tests/strategies.rs shows it): a classic priority queue, on 3.10 and on 4.3
//! alike, expires only at the head of its highest non-empty priority level
//! and arms its expiry timer for the first message, so five messages of
//! 2–12 s left all at 12 s. A 4.3 quorum queue keeps a FIFO per priority
//! level and expires at the head of every level: the same five left at 3, 8
//! and 12 s, one time per level. Quorum queues refuse `x-max-priority` and
//! before 4.0 ignore a message's priority.

use crate::core::placement::PlacementStrategy;
use crate::core::topology::QueueType;

/// The first RabbitMQ whose quorum queues expire at the head of every
/// priority level (measured on 4.3.6; 4.0–4.2 have two levels and were not
/// measured, so they are refused).
pub const QUORUM_PRIORITY_SINCE: (u32, u32) = (4, 3);

/// What to say, or do, about a configuration on a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to say.
    Fine,
    /// Runs, but the user should know this (logged at WARN at each connect).
    Warn(String),
    /// Cannot work on this broker: the router stops with this reason.
    Refuse(String),
}

/// Judges `strategy` on `queue_type` buckets for a broker stating `version`
/// (`None`: it did not say, or not as `major.minor`).
pub fn judge(
    strategy: PlacementStrategy,
    queue_type: QueueType,
    version: Option<(u32, u32)>,
) -> Verdict {
    if strategy != PlacementStrategy::Priority {
        return Verdict::Fine;
    }
    let shown = version.map_or_else(
        || "an unknown version".to_owned(),
        |(a, b)| format!("{a}.{b}"),
    );
    match queue_type {
        QueueType::Classic => Verdict::Warn(format!(
            "strategy \"priority\" with classic buckets on RabbitMQ {shown}: a classic priority queue \
             expires only at the head of its highest non-empty priority level, so a message can wait \
             past its own TTL behind longer ones (up to the bucket's TTL, on 3.10 and 4.3 alike). \
             Use \"cascade\" for exact delays, or quorum buckets on RabbitMQ 4.3 or later \
             (docs/concepts.md)"
        )),
        QueueType::Quorum if version.is_some_and(|v| v >= QUORUM_PRIORITY_SINCE) => Verdict::Fine,
        QueueType::Quorum => Verdict::Refuse(format!(
            "strategy \"priority\" with queue_type \"quorum\" needs RabbitMQ {}.{} or later, whose \
             quorum queues expire at the head of every priority level; the broker is {shown}. \
             Use \"cascade\", or classic buckets",
            QUORUM_PRIORITY_SINCE.0, QUORUM_PRIORITY_SINCE.1
        )),
    }
}

/// The queue type `queue_type = "auto"` gives a new prefix: quorum, unless
/// this broker refuses `strategy` on quorum buckets (`priority` before
/// [`QUORUM_PRIORITY_SINCE`]), where it is classic.
pub fn new_prefix_queue_type(
    strategy: PlacementStrategy,
    version: Option<(u32, u32)>,
) -> QueueType {
    match judge(strategy, QueueType::Quorum, version) {
        Verdict::Refuse(_) => QueueType::Classic,
        Verdict::Fine | Verdict::Warn(_) => QueueType::Quorum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PlacementStrategy::*;

    #[test]
    fn a_new_prefix_gets_quorum_unless_the_broker_refuses_the_strategy_on_it() {
        for v in [
            None,
            Some((3, 10)),
            Some((4, 2)),
            Some((4, 3)),
            Some((5, 0)),
        ] {
            assert_eq!(new_prefix_queue_type(Cascade, v), QueueType::Quorum);
            assert_eq!(new_prefix_queue_type(RoundUp, v), QueueType::Quorum);
        }
        for v in [None, Some((3, 10)), Some((4, 2))] {
            assert_eq!(new_prefix_queue_type(Priority, v), QueueType::Classic);
        }
        assert_eq!(
            new_prefix_queue_type(Priority, Some((4, 3))),
            QueueType::Quorum
        );
    }

    #[test]
    fn only_priority_is_judged() {
        for s in [RoundUp, Cascade] {
            for q in [QueueType::Classic, QueueType::Quorum] {
                for v in [None, Some((3, 10)), Some((4, 3))] {
                    assert_eq!(judge(s, q, v), Verdict::Fine);
                }
            }
        }
    }

    #[test]
    fn classic_priority_buckets_are_warned_about_on_every_version() {
        for v in [None, Some((3, 10)), Some((4, 3)), Some((5, 0))] {
            let Verdict::Warn(w) = judge(Priority, QueueType::Classic, v) else {
                panic!("no warning for {v:?}");
            };
            assert!(w.contains("highest non-empty priority level"), "{w}");
        }
        let Verdict::Warn(w) = judge(Priority, QueueType::Classic, Some((4, 3))) else {
            unreachable!()
        };
        assert!(w.contains("RabbitMQ 4.3:"), "names the broker: {w}");
    }

    #[test]
    fn quorum_priority_buckets_need_4_3() {
        assert_eq!(
            judge(Priority, QueueType::Quorum, Some((4, 3))),
            Verdict::Fine
        );
        assert_eq!(
            judge(Priority, QueueType::Quorum, Some((5, 1))),
            Verdict::Fine
        );
        for v in [None, Some((3, 10)), Some((4, 0)), Some((4, 2))] {
            let Verdict::Refuse(r) = judge(Priority, QueueType::Quorum, v) else {
                panic!("not refused on {v:?}");
            };
            assert!(r.contains("needs RabbitMQ 4.3 or later"), "{r}");
        }
    }
}
