//! Topology: the names and arguments of everything the router declares.
//! Pure; `broker` does the declaring.

use crate::ladder::{Ladder, Rung};
use crate::placement::{PRIORITY_LEVELS, Strategy};
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// Names derived from the configured prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub prefix: String,
    /// `<prefix>.router`: users publish here (fanout: any routing key reaches the router).
    pub router_exchange: ShortString,
    /// `<prefix>.ingress`: the router consumes what users published.
    pub ingress: ShortString,
    /// `<prefix>.expired`: the exchange every bucket dead-letters to.
    pub expired_exchange: ShortString,
    /// `<prefix>.expired`: the queue the router consumes expired messages from.
    pub expired: ShortString,
    /// `<prefix>.parked`: messages that cannot be placed or delivered.
    pub parked: ShortString,
    /// `<prefix>.state`: one message listing the bucket queues this prefix has
    /// declared, so buckets no longer in the ladder are drained and removed.
    pub state: ShortString,
}

/// Longest prefix accepted, leaving room for `.bucket.<label>` within AMQP's 255 bytes.
pub const MAX_PREFIX_LEN: usize = 128;

impl Names {
    /// Names for a prefix; the caller has checked it (see `config`).
    pub fn new(prefix: &str) -> Self {
        let n = |suffix: &str| ShortString::from(format!("{prefix}.{suffix}"));
        Self {
            prefix: prefix.to_owned(),
            router_exchange: n("router"),
            ingress: n("ingress"),
            expired_exchange: n("expired"),
            expired: n("expired"),
            parked: n("parked"),
            state: n("state"),
        }
    }

    /// `<prefix>.bucket.<label>`; priority buckets (other arguments) are `<prefix>.pbucket.<label>`.
    pub fn bucket(&self, strategy: Strategy, rung: &Rung) -> ShortString {
        let kind = match strategy {
            Strategy::Priority => "pbucket",
            Strategy::RoundUp | Strategy::Cascade => "bucket",
        };
        format!("{}.{kind}.{}", self.prefix, rung.label).into()
    }

    /// Every bucket queue of a ladder, with its rung.
    pub fn buckets<'a>(
        &'a self,
        strategy: Strategy,
        ladder: &'a Ladder,
    ) -> impl Iterator<Item = (ShortString, &'a Rung)> + 'a {
        ladder
            .rungs()
            .iter()
            .map(move |r| (self.bucket(strategy, r), r))
    }
}

/// Arguments of a bucket queue: its TTL and the dead-letter exchange leading to the router.
pub fn bucket_arguments(
    names: &Names,
    strategy: Strategy,
    queue_type: QueueType,
    rung: &Rung,
) -> FieldTable {
    let mut args = queue_arguments(queue_type);
    if queue_type == QueueType::Quorum {
        // The broker retries dead-lettering until the target confirms.
        args.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
    }
    if strategy == Strategy::Priority {
        args.insert(
            "x-max-priority".into(),
            AMQPValue::LongLongInt(i64::from(PRIORITY_LEVELS - 1)),
        );
    }
    let ttl = u32::try_from(rung.ttl.as_millis()).unwrap_or(u32::MAX);
    args.insert(
        "x-message-ttl".into(),
        AMQPValue::LongLongInt(i64::from(ttl)),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(names.expired_exchange.as_str().into()),
    );
    args
}

/// The kind of queue every router queue is declared as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// Classic queues: a bucket dead-letters at most once.
    #[default]
    Classic,
    /// Replicated quorum queues; buckets dead-letter at least once.
    Quorum,
}

impl std::str::FromStr for QueueType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "classic" => Ok(Self::Classic),
            "quorum" => Ok(Self::Quorum),
            other => Err(format!(
                "unknown queue type \"{other}\"; expected classic or quorum"
            )),
        }
    }
}

impl std::fmt::Display for QueueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Classic => "classic",
            Self::Quorum => "quorum",
        })
    }
}

/// Arguments every router queue of this type carries.
pub fn queue_arguments(queue_type: QueueType) -> FieldTable {
    let mut args = FieldTable::default();
    if queue_type == QueueType::Quorum {
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
    }
    args
}

/// Arguments of the ingress queue: what expires or is rejected there is parked, not dropped.
pub fn ingress_arguments(names: &Names, queue_type: QueueType) -> FieldTable {
    let mut args = queue_arguments(queue_type);
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(names.parked.as_str().into()),
    );
    args
}

/// Bucket queues recorded in the state message that the current ladder no
/// longer has: they keep dead-lettering into the router until empty, and are
/// then deleted.
pub fn stale_buckets(recorded: &[String], current: &[ShortString]) -> Vec<String> {
    let mut stale: Vec<String> = recorded
        .iter()
        .filter(|q| !current.iter().any(|c| c.as_str() == q.as_str()))
        .cloned()
        .collect();
    stale.sort();
    stale.dedup();
    stale
}

/// The state message body: one bucket queue name a line.
pub fn render_state(buckets: &[String]) -> Vec<u8> {
    buckets.join("\n").into_bytes()
}

/// Parses a state message body; lines that are not names of this prefix's buckets are ignored.
pub fn parse_state(prefix: &str, body: &[u8]) -> Vec<String> {
    let bucket = format!("{prefix}.bucket.");
    let pbucket = format!("{prefix}.pbucket.");
    String::from_utf8_lossy(body)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(&bucket) || l.starts_with(&pbucket))
        .filter(|l| ShortString::try_new(*l).is_ok())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_rungs_and_other_strategies_buckets_are_stale() {
        let names = Names::new("p");
        let ladder = Ladder::from_labels(&["1s", "2s"]).unwrap();
        let current: Vec<_> = names
            .buckets(Strategy::RoundUp, &ladder)
            .map(|(q, _)| q)
            .collect();
        let recorded = parse_state(
            "p",
            b"p.bucket.1s\np.bucket.5s\np.pbucket.1s\nother.bucket.1s\njunk",
        );
        assert_eq!(
            stale_buckets(&recorded, &current),
            ["p.bucket.5s", "p.pbucket.1s"]
        );
        assert_eq!(parse_state("p", &render_state(&recorded)), recorded);
    }

    #[test]
    fn quorum_buckets_dead_letter_at_least_once() {
        let names = Names::new("p");
        let rung = &Ladder::from_labels(&["1s"]).unwrap().rungs()[0].clone();
        let args = bucket_arguments(&names, Strategy::Cascade, QueueType::Quorum, rung);
        for key in [
            "x-queue-type",
            "x-dead-letter-strategy",
            "x-overflow",
            "x-message-ttl",
            "x-dead-letter-exchange",
        ] {
            assert!(args.contains_key(key), "{key}");
        }
        assert!(ingress_arguments(&names, QueueType::Quorum).contains_key("x-queue-type"));
        assert!(!ingress_arguments(&names, QueueType::Classic).contains_key("x-queue-type"));
    }

    #[test]
    fn priority_buckets_have_their_own_names_and_max_priority() {
        let names = Names::new("p");
        let rung = &Ladder::from_labels(&["1s"]).unwrap().rungs()[0].clone();
        assert_eq!(
            names.bucket(Strategy::Priority, rung).as_str(),
            "p.pbucket.1s"
        );
        assert_eq!(
            names.bucket(Strategy::Cascade, rung).as_str(),
            "p.bucket.1s"
        );
        assert!(
            bucket_arguments(&names, Strategy::Priority, QueueType::Classic, rung)
                .contains_key("x-max-priority")
        );
        assert!(
            !bucket_arguments(&names, Strategy::RoundUp, QueueType::Classic, rung)
                .contains_key("x-max-priority")
        );
    }
}
