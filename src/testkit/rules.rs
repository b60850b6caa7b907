//! Rules the property tests and the fuzz targets run every input through.

use crate::core::decision::Rules;
use crate::core::ladder::Ladder;
use crate::core::placement::PlacementStrategy;
use crate::core::retry::Policy;
use std::time::Duration;

/// Every placement strategy.
pub const STRATEGIES: [PlacementStrategy; 3] = [
    PlacementStrategy::RoundUp,
    PlacementStrategy::Priority,
    PlacementStrategy::Cascade,
];

/// A policy for every queue with jitter and a growing delay: retries take
/// every path (delay, exhaustion) within a few attempts.
pub fn any_queue_policy() -> Policy {
    Policy {
        queue: "*".into(),
        initial: Duration::from_secs(1),
        multiplier: 3.0,
        max_delay: Duration::from_secs(60),
        jitter: 0.5,
        max_attempts: 3,
    }
}

/// The same ladder, prefix, router user and policies under every strategy.
pub fn every_strategy(
    ladder: &Ladder,
    prefix: &str,
    user: &str,
    policies: &[Policy],
) -> Vec<Rules> {
    STRATEGIES
        .into_iter()
        .map(|s| Rules::new(ladder, s, prefix, user).with_policies(policies.to_vec()))
        .collect()
}
