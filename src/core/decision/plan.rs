//! The plan: what the shell publishes for one delivery, and what becomes of
//! a delivery its destination does not take.

use crate::core::contract::Destination;
use crate::core::parking::{self, Failure};
use crate::core::reasons::ParkReason;
use crate::core::topology::Names;
use lapin::BasicProperties;
use lapin::types::ShortString;
use std::time::Duration;

/// What to do with one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish to a bucket queue (default exchange, routing key = queue).
    Wait {
        queue: ShortString,
        /// Which of the rung's queues `queue` is (0: the first): the shell
        /// publishes each shard's placements on a channel of its own.
        shard: u8,
        ttl: Duration,
        properties: BasicProperties,
    },
    /// Publish to the destination, `mandatory`, with the sender's properties,
    /// after holding it `after` (cascade's last fraction; zero otherwise).
    Deliver {
        destination: Destination,
        properties: BasicProperties,
        after: Duration,
        /// When it was due (ms since the Unix epoch), for the lateness figure.
        due_ms: i64,
        /// Bucket placements it took.
        hops: u32,
    },
    /// Write a tombstone for `message_id` to the cancels stream (a cancel
    /// request taken from ingress); the request itself goes nowhere else.
    Cancel {
        message_id: ShortString,
        properties: BasicProperties,
    },
    /// Publish to the parking queue.
    Park {
        reason: ParkReason,
        properties: BasicProperties,
    },
}

impl Action {
    /// The properties this action publishes with.
    pub fn properties(&self) -> &BasicProperties {
        match self {
            Self::Wait { properties, .. }
            | Self::Deliver { properties, .. }
            | Self::Park { properties, .. }
            | Self::Cancel { properties, .. } => properties,
        }
    }

    /// Where this action publishes: exchange and routing key.
    pub fn route(&self, names: &Names) -> (ShortString, ShortString) {
        match self {
            Self::Wait { queue, .. } => ("".into(), queue.clone()),
            Self::Deliver { destination, .. } => (
                destination.exchange.clone(),
                destination.routing_key.clone(),
            ),
            Self::Park { .. } => ("".into(), names.parked.clone()),
            Self::Cancel { .. } => ("".into(), names.cancels.clone()),
        }
    }
}

/// The whole plan for one delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub action: Action,
    /// When it was decided (ms since the Unix epoch, rounded down): a park
    /// after a failure is recorded at this time.
    pub decided_ms: i64,
    /// The publishing connection's frame size it was fitted to.
    pub frame_max: u32,
    /// The retry policy that scheduled this attempt (zero-code retries).
    pub retry_policy: Option<String>,
    /// What the action changes in a plugin exchange's count of waiting
    /// messages, once the broker has taken it.
    pub waiting: Option<Waiting>,
}

/// A change to a plugin exchange's count of waiting messages: its waiting
/// queue ([`Names::waiting`]) holds one token for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// A message from the plugin exchange entered its first bucket: publish
    /// a token to this queue.
    Enter(ShortString),
    /// A counted message left the buckets (delivered or parked): take a
    /// token from this queue.
    Leave(ShortString),
}

impl Plan {
    /// The plan, its delivery parked instead when `refused` remembers a
    /// refusal of its destination. [`Rules::decide`](super::Rules::decide)
    /// ends with it; the shell asks it again before publishing once more,
    /// since other deliveries may have learned a refusal meanwhile.
    pub fn checked(mut self, refused: &dyn super::Refusals) -> Self {
        if let Action::Deliver { destination, .. } = &self.action
            && let Some(failure) = refused.refusal(destination)
        {
            self.action = self.failed(failure);
        }
        self
    }

    /// What becomes of a delivery its destination did not take: parked with
    /// the reason for `failure`, the destination recorded for replay, within
    /// the frame. Only a delivery can fail so; other actions come back as
    /// they are. Pure: the same plan and failure give the same park.
    pub fn failed(&self, failure: Failure) -> Action {
        match &self.action {
            Action::Deliver {
                destination,
                properties,
                ..
            } => {
                let (reason, properties) = parking::refused_delivery(
                    properties,
                    destination,
                    failure,
                    self.decided_ms,
                    self.frame_max,
                );
                Action::Park { reason, properties }
            }
            other => other.clone(),
        }
    }
}
