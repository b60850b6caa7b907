//! Topology: the names and arguments of everything the router declares.
//! Pure; `broker` does the declaring.

use crate::core::contract::{DUE_LANE, TRANSIT_LANE};
use crate::core::ladder::{Ladder, Rung};
use crate::core::placement::{PRIORITY_LEVELS, PlacementStrategy};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use std::time::Duration;

/// Names derived from the configured prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub prefix: String,
    /// `<prefix>.router`: users publish here (fanout: any routing key reaches the router).
    pub router_exchange: ShortString,
    /// `<prefix>.ingress`: the router consumes what users published.
    pub ingress: ShortString,
    /// `<prefix>.expired`: the exchange every bucket dead-letters to (fanout),
    /// bound to [`Names::lanes`].
    pub expired_exchange: ShortString,
    /// `<prefix>.lanes`: the buckets' dead-letter exchange (a headers
    /// exchange with no binding of its own): everything goes on to its
    /// alternate exchange [`Names::lanes_later`].
    pub lanes: ShortString,
    /// `<prefix>.lanes.later`: a fanout bound to [`Names::expired`].
    pub lanes_later: ShortString,
    /// `<prefix>.expired`: the queue the router consumes what the buckets
    /// expire from.
    pub expired: ShortString,
    /// `<prefix>.due`: an earlier version's due lane, bound to
    /// [`Names::lanes`]. The router no longer declares it; the janitor
    /// unbinds it and moves what it holds into [`Names::expired`].
    pub due: ShortString,
    /// `<prefix>.parked`: messages that cannot be placed or delivered.
    pub parked: ShortString,
    /// `<prefix>.state`: one message listing the bucket queues this prefix has
    /// declared, so buckets no longer in the ladder are drained and removed.
    pub state: ShortString,
    /// `<prefix>.presence`: the fanout exchange routers announce themselves on;
    /// each listens on an exclusive queue `<prefix>.presence.<instance>`.
    pub presence: ShortString,
    /// `<prefix>.control`: where cancel requests are published (fanout,
    /// bound to [`Names::ingress`]). Its write permission is granted apart
    /// from the router exchange's: a publisher cannot cancel.
    pub control: ShortString,
    /// `<prefix>.cancels`: a stream of tombstones (cancelled message-ids)
    /// every router of the prefix reads at start and follows.
    pub cancels: ShortString,
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
            lanes: n("lanes"),
            lanes_later: n("lanes.later"),
            expired: n("expired"),
            due: n("due"),
            parked: n("parked"),
            state: n("state"),
            presence: n("presence"),
            control: n("control"),
            cancels: n("cancels"),
        }
    }

    /// The router's own queues: ingress, expired, parked, state and the
    /// cancels stream.
    pub fn own_queues(&self) -> [&ShortString; 5] {
        [
            &self.ingress,
            &self.expired,
            &self.parked,
            &self.state,
            &self.cancels,
        ]
    }

    /// The router's own exchanges.
    pub fn own_exchanges(&self) -> [&ShortString; 6] {
        [
            &self.router_exchange,
            &self.control,
            &self.expired_exchange,
            &self.lanes,
            &self.lanes_later,
            &self.presence,
        ]
    }

    /// Whether `queue` is one of the router's own queues (ingress, expired,
    /// parked, state, or a bucket of any strategy, retired ones and the
    /// retired due lane included).
    pub fn owns_queue(&self, queue: &str) -> bool {
        self.own_queues().iter().any(|q| q.as_str() == queue)
            || queue == self.due.as_str()
            || queue
                .strip_prefix(self.prefix.as_str())
                .is_some_and(|rest| {
                    [".bucket.", ".pbucket.", ".presence.", ".waiting."]
                        .iter()
                        .any(|own| rest.starts_with(own))
                })
    }

    /// `<prefix>.waiting.<exchange>`: one token for each message published
    /// to the plugin exchange `exchange` that waits in a bucket; its depth
    /// is that exchange's count of waiting messages.
    pub fn waiting(&self, exchange: &str) -> ShortString {
        format!("{}.waiting.{exchange}", self.prefix).into()
    }

    /// The exclusive queue a router (or `status`) listens on for presence.
    pub fn presence_queue(&self, instance: &str) -> ShortString {
        format!("{}.{instance}", self.presence).into()
    }

    /// `<prefix>.bucket.<label>`; priority buckets (other arguments) are `<prefix>.pbucket.<label>`.
    pub fn bucket(&self, strategy: PlacementStrategy, rung: &Rung) -> ShortString {
        let kind = match strategy {
            PlacementStrategy::Priority => "pbucket",
            PlacementStrategy::RoundUp | PlacementStrategy::Cascade => "bucket",
        };
        format!("{}.{kind}.{}", self.prefix, rung.label).into()
    }

    /// Queue `shard` of a rung: shard 0 is [`Names::bucket`] (the only one
    /// before shards, so a prefix keeps its queues), shard `n` above it is
    /// `<bucket>.<n>` (a label never ends in a dot and a number).
    pub fn bucket_shard(&self, strategy: PlacementStrategy, rung: &Rung, shard: u8) -> ShortString {
        let bucket = self.bucket(strategy, rung);
        if shard == 0 {
            bucket
        } else {
            format!("{bucket}.{shard}").into()
        }
    }

    /// Every bucket queue of a strategy's effective ladder with `shards`
    /// queues a rung, with its rung: rung by rung, shard 0 first.
    pub fn bucket_queues<'a>(
        &self,
        strategy: PlacementStrategy,
        ladder: &'a Ladder,
        shards: u8,
    ) -> Vec<(ShortString, &'a Rung)> {
        ladder
            .rungs()
            .iter()
            .flat_map(|r| (0..shards.max(1)).map(move |s| (self.bucket_shard(strategy, r, s), r)))
            .collect()
    }
}

/// Everything a router declares for one configuration: its names, the queue
/// type, its own queues and the bucket queues, each with its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub names: Names,
    pub queue_type: QueueType,
    /// Ingress, expired, parked and state.
    pub own: Vec<(ShortString, FieldTable)>,
    /// The bucket of every rung of the (effective) ladder.
    pub buckets: Vec<(ShortString, FieldTable)>,
    /// The cancels stream and its arguments.
    pub cancels: (ShortString, FieldTable),
    /// The delayed-message-exchange plugin's exchanges the router serves:
    /// each declared as a fanout bound to the ingress queue, and its
    /// delivery exchange of the plugin exchange's type.
    pub delayed: Vec<crate::core::delayed::DelayedExchange>,
    /// The waiting queue of each plugin exchange ([`Names::waiting`]), with
    /// its arguments.
    pub waiting: Vec<(ShortString, FieldTable)>,
}

impl Topology {
    /// The topology of a (strategy's effective) ladder, `shards` queues a rung.
    pub fn new(
        names: &Names,
        strategy: PlacementStrategy,
        queue_type: QueueType,
        ladder: &Ladder,
        shards: u8,
    ) -> Self {
        let buckets = names
            .bucket_queues(strategy, ladder, shards)
            .into_iter()
            .map(|(q, rung)| (q, bucket_arguments(names, strategy, queue_type, rung)))
            .collect();
        let own = [
            &names.ingress,
            &names.expired,
            &names.parked,
            &names.state,
        ]
        .into_iter()
        .map(|q| (q.clone(), own_queue_arguments(names, queue_type, q)))
        .collect();
        Self {
            names: names.clone(),
            queue_type,
            own,
            buckets,
            cancels: (
                names.cancels.clone(),
                cancels_arguments(DEFAULT_CANCEL_KEEP),
            ),
            delayed: Vec::new(),
            waiting: Vec::new(),
        }
    }

    /// The same topology serving the plugin's exchanges `delayed`.
    pub fn with_delayed_exchanges(
        mut self,
        delayed: Vec<crate::core::delayed::DelayedExchange>,
    ) -> Self {
        self.waiting = delayed
            .iter()
            .map(|x| (self.names.waiting(x.name.as_str()), queue_arguments(self.queue_type)))
            .collect();
        self.delayed = delayed;
        self
    }

    /// The plugin exchange whose waiting queue `queue` is.
    pub fn waiting_for(&self, queue: &str) -> Option<&ShortString> {
        self.waiting
            .iter()
            .zip(&self.delayed)
            .find(|((q, _), _)| q.as_str() == queue)
            .map(|(_, x)| &x.name)
    }

    /// Every exchange the router declares: its own, then each plugin
    /// exchange and its delivery exchange.
    pub fn exchanges(&self) -> Vec<&ShortString> {
        let mut all: Vec<&ShortString> = self.names.own_exchanges().to_vec();
        for x in &self.delayed {
            all.push(&x.name);
            all.push(&x.deliver_to);
        }
        all
    }

    /// The same topology keeping tombstones for `keep`.
    pub fn with_cancel_keep(mut self, keep: Duration) -> Self {
        self.cancels.1 = cancels_arguments(keep);
        self
    }

    /// The same topology with `x-queue-version` on every classic queue
    /// (`None`: no argument, the broker's default version).
    pub fn with_classic_version(mut self, version: Option<u8>) -> Self {
        let Some(version) = version.filter(|_| self.queue_type == QueueType::Classic) else {
            return self;
        };
        for (_, args) in self.own.iter_mut().chain(self.buckets.iter_mut()) {
            args.insert(
                QUEUE_VERSION_ARGUMENT.into(),
                AMQPValue::LongLongInt(i64::from(version)),
            );
        }
        self
    }

    /// The bucket queue names.
    pub fn bucket_names(&self) -> Vec<ShortString> {
        self.buckets.iter().map(|(q, _)| q.clone()).collect()
    }
}

/// Queues a rung has unless a test sets another number
/// ([`CLASSIC_BUCKET_SHARDS`](crate::tuning::CLASSIC_BUCKET_SHARDS),
/// [`QUORUM_BUCKET_SHARDS`](crate::tuning::QUORUM_BUCKET_SHARDS)).
pub fn default_bucket_shards(queue_type: QueueType) -> u8 {
    match queue_type {
        QueueType::Classic => crate::tuning::CLASSIC_BUCKET_SHARDS,
        QueueType::Quorum => crate::tuning::QUORUM_BUCKET_SHARDS,
    }
}

/// Arguments of a bucket queue: its TTL and the dead-letter exchange leading to the router.
pub fn bucket_arguments(
    names: &Names,
    strategy: PlacementStrategy,
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
    // Quorum queues refuse x-max-priority; from 4.3 they keep a FIFO per
    // message priority without it (see core::compat).
    if strategy == PlacementStrategy::Priority && queue_type == QueueType::Classic {
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

/// `[topology] queue_type`: one type for every router queue, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueTypeSetting {
    /// The type the prefix's queues already have (an upgrade keeps them as
    /// they are), quorum for a new prefix: learned from the broker once,
    /// when the router first connects (`broker::declare::existing_queue_type`).
    #[default]
    Auto,
    /// This type; a prefix declared with the other one is a conflict.
    Fixed(QueueType),
}

impl QueueTypeSetting {
    /// The type this setting names, `None` for `auto`.
    pub fn fixed(self) -> Option<QueueType> {
        match self {
            Self::Auto => None,
            Self::Fixed(t) => Some(t),
        }
    }
}

impl std::str::FromStr for QueueTypeSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            other => other.parse().map(Self::Fixed).map_err(|_| {
                format!("unknown queue type \"{other}\"; expected auto, classic or quorum")
            }),
        }
    }
}

impl std::fmt::Display for QueueTypeSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(t) => t.fmt(f),
        }
    }
}

/// What a refused `queue.declare` of an existing queue, with the arguments
/// a quorum queue of the router has, says about the queue's type. RabbitMQ
/// tells a queue's type over AMQP only this way: it names the first
/// argument that differs, `x-queue-type` once every argument it checks
/// before that one agrees ("received 'quorum' but current is 'classic'" on
/// 4.x, "received the value 'quorum' ... but current is none" on 3.x).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeClue {
    /// The broker named `x-queue-type`, or `x-queue-version` (which only
    /// classic queues have): the queue is not a quorum queue.
    NotQuorum,
    /// The broker named this argument of the declare: declare again without it.
    Without(String),
    /// The broker named no argument, or one the declare did not send: the
    /// refusal says nothing of the type.
    Unknown,
}

/// Reads a refused declare's words (`detail`, the broker's reply text) for
/// a declare that sent `sent`.
pub fn type_clue(detail: &str, sent: &FieldTable) -> TypeClue {
    let Some(rest) = detail.split_once("inequivalent arg '").map(|(_, r)| r) else {
        return TypeClue::Unknown;
    };
    let Some((arg, _)) = rest.split_once('\'') else {
        return TypeClue::Unknown;
    };
    match arg {
        "x-queue-type" | QUEUE_VERSION_ARGUMENT => TypeClue::NotQuorum,
        a if sent.contains_key(a) => TypeClue::Without(a.to_owned()),
        _ => TypeClue::Unknown,
    }
}

/// How long tombstones live by default: a cancel protects a message due
/// within this time after it (`[cancel] keep`).
pub const DEFAULT_CANCEL_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// Arguments of the cancels stream: a stream (replicated in a cluster, read
/// by every router without consuming it away), whose segments older than
/// `keep` the broker removes. Small segments, so retention removes old
/// tombstones in small steps.
pub fn cancels_arguments(keep: Duration) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("stream".into()),
    );
    args.insert(
        "x-max-age".into(),
        AMQPValue::LongString(format!("{}s", keep.as_secs().max(1)).into()),
    );
    args.insert(
        "x-stream-max-segment-size-bytes".into(),
        AMQPValue::LongLongInt(4 * 1024 * 1024),
    );
    args
}

/// The argument naming a classic queue's storage version (RabbitMQ 3.10 and
/// later; version 2 is the only one from 4.0). Declared only when
/// `[topology] classic_queue_version` is set: RabbitMQ refuses to redeclare
/// a classic queue with another version than it was declared with (also when
/// the argument is left out), so the router declares only what the user chose.
pub const QUEUE_VERSION_ARGUMENT: &str = "x-queue-version";

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

/// Deliveries of one message a quorum ingress or expired queue allows before
/// it dead-letters it into the park: RabbitMQ 4's default, made explicit so
/// that 3.x behaves the same. A message redelivered this often (a router
/// crashing on it again and again) is parked with `x-death` reason
/// `delivery_limit`, never dropped.
pub const DELIVERY_LIMIT: i64 = 20;

/// The delivery limit of the park and the state queue: reading them
/// (`parked list` returns what it read) must never dead-letter anything.
pub const NO_DELIVERY_LIMIT: i64 = 1_000_000;

/// Arguments of the router's own queues (not the buckets). What expires in
/// ingress, or is delivered too often there or in expired (quorum), is
/// dead-lettered into the park, never dropped.
pub fn own_queue_arguments(
    names: &Names,
    queue_type: QueueType,
    queue: &ShortString,
) -> FieldTable {
    let mut args = queue_arguments(queue_type);
    let to_park = queue == &names.ingress || queue == &names.expired;
    if to_park && (queue == &names.ingress || queue_type == QueueType::Quorum) {
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(names.parked.as_str().into()),
        );
    }
    if queue_type == QueueType::Quorum {
        let limit = if to_park {
            DELIVERY_LIMIT
        } else {
            NO_DELIVERY_LIMIT
        };
        args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
    }
    args
}

/// Arguments of [`Names::lanes`]: what no binding takes (everything, once
/// an earlier version's due lane is unbound) goes on to
/// [`Names::lanes_later`], so nothing a bucket expires is dropped.
pub fn lanes_arguments(names: &Names) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "alternate-exchange".into(),
        AMQPValue::LongString(names.lanes_later.as_str().into()),
    );
    args
}

/// The binding of an earlier version's due lane ([`Names::due`]) to
/// [`Names::lanes`]: messages whose lane header said [`DUE_LANE`]. Only the
/// same arguments unbind it.
pub fn retired_due_binding() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-match".into(), AMQPValue::LongString("all".into()));
    args.insert(TRANSIT_LANE.into(), AMQPValue::LongString(DUE_LANE.into()));
    args
}

/// Arguments of the ingress queue.
pub fn ingress_arguments(names: &Names, queue_type: QueueType) -> FieldTable {
    own_queue_arguments(names, queue_type, &names.ingress)
}

/// A bucket's name split into its rung's bucket and its laps: `(b, n)` for
/// `b.x<n>` (n ≥ 2), `(name, 1)` otherwise.
///
/// The previous version kept a rung's multiples as a chain: `<bucket>.x4`
/// dead-lettered through the default exchange into `.x3`, then `.x2`, then
/// the bucket. This version declares none, so after an upgrade they are
/// stale; the janitor still has to remove them top lap first.
fn lap_parts(name: &str) -> (&str, u32) {
    match name.rsplit_once(".x") {
        Some((base, digits)) => match digits.parse::<u32>() {
            Ok(n) if n >= 2 && n.to_string() == digits => (base, n),
            _ => (name, 1),
        },
        None => (name, 1),
    }
}

/// The laps of a bucket queue: `n` for an earlier version's chain
/// `<bucket>.x<n>`, else 1.
pub fn laps_of(name: &str) -> u32 {
    lap_parts(name).1
}

/// Whether bucket `upstream` dead-letters, directly or down its chain, into
/// bucket `downstream`: a later lap of the same rung's chain. A stale
/// bucket is removed only once nothing upstream of it is left, or what
/// still waits there would be dead-lettered into a queue that is gone.
pub fn feeds_into(upstream: &str, downstream: &str) -> bool {
    let (a, n) = lap_parts(upstream);
    let (b, m) = lap_parts(downstream);
    a == b && n > m
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
    use crate::core::placement;

    #[test]
    fn removed_rungs_and_other_strategies_buckets_are_stale() {
        let names = Names::new("p");
        let ladder = Ladder::from_labels(&["1s", "2s"]).unwrap();
        let current: Vec<_> = names
            .bucket_queues(PlacementStrategy::RoundUp, &ladder, 1)
            .into_iter()
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
    fn cascade_declares_its_added_rungs_as_buckets_and_the_janitor_knows_old_chains() {
        let names = Names::new("p");
        let ladder = placement::effective_ladder(
            PlacementStrategy::Cascade,
            &Ladder::from_labels(&["1s", "3s", "10s"]).unwrap(),
        );
        let t = Topology::new(
            &names,
            PlacementStrategy::Cascade,
            QueueType::Quorum,
            &ladder,
            1,
        );
        let queues: Vec<_> = t.buckets.iter().map(|(q, _)| q.as_str()).collect();
        // 500ms and 250ms below 1s; 1s fits twice below 3s, 3s three times
        // below 10s; the top five times.
        assert_eq!(
            queues,
            [
                "p.bucket.250ms",
                "p.bucket.500ms",
                "p.bucket.1s",
                "p.bucket.2s",
                "p.bucket.3s",
                "p.bucket.6s",
                "p.bucket.9s",
                "p.bucket.10s",
                "p.bucket.20s",
                "p.bucket.30s",
                "p.bucket.40s",
                "p.bucket.50s",
            ]
        );
        for (q, a) in &t.buckets {
            // Every bucket dead-letters to the router's lanes, a quorum bucket at least once.
            assert_eq!(
                a.inner().get("x-dead-letter-exchange"),
                Some(&AMQPValue::LongString("p.expired".into())),
                "{q}"
            );
            assert_eq!(
                a.inner().get("x-dead-letter-strategy"),
                Some(&AMQPValue::LongString("at-least-once".into())),
                "{q}"
            );
        }
        let args = &t
            .buckets
            .iter()
            .find(|(n, _)| n.as_str() == "p.bucket.9s")
            .unwrap()
            .1;
        assert_eq!(
            args.inner().get("x-message-ttl"),
            Some(&AMQPValue::LongLongInt(9000))
        );
        // The previous version's chains, which the janitor drains top lap first.
        assert_eq!(laps_of("p.bucket.3s.x3"), 3);
        assert_eq!(laps_of("p.bucket.3s"), 1);
        assert!(feeds_into("p.bucket.3s.x3", "p.bucket.3s.x2"));
        assert!(feeds_into("p.bucket.3s.x2", "p.bucket.3s"));
        assert!(!feeds_into("p.bucket.3s", "p.bucket.3s.x2"));
        assert!(!feeds_into("p.bucket.3s.x2", "p.bucket.10s"));
        assert!(!feeds_into("p.bucket.3s.x02", "p.bucket.3s"));
        assert!(!feeds_into("p.bucket.3s.x1", "p.bucket.3s"));
        // Other strategies add no rungs.
        let user = Ladder::from_labels(&["1s", "3s", "10s"]).unwrap();
        let plain = Topology::new(
            &names,
            PlacementStrategy::RoundUp,
            QueueType::Classic,
            &placement::effective_ladder(PlacementStrategy::RoundUp, &user),
            1,
        );
        assert_eq!(plain.buckets.len(), 3);
    }

    #[test]
    fn a_rung_of_several_shards_keeps_its_first_queue_and_numbers_the_others() {
        let names = Names::new("p");
        let ladder = Ladder::from_labels(&["1s", "3s"]).unwrap();
        let t = Topology::new(
            &names,
            PlacementStrategy::RoundUp,
            QueueType::Classic,
            &ladder,
            3,
        );
        let queues: Vec<_> = t.buckets.iter().map(|(q, _)| q.as_str()).collect();
        assert_eq!(
            queues,
            [
                "p.bucket.1s",
                "p.bucket.1s.1",
                "p.bucket.1s.2",
                "p.bucket.3s",
                "p.bucket.3s.1",
                "p.bucket.3s.2"
            ]
        );
        // Every shard of a rung has the rung's arguments.
        for (q, a) in &t.buckets {
            let ttl = if q.as_str().starts_with("p.bucket.1s") {
                1000
            } else {
                3000
            };
            assert_eq!(
                a.inner().get("x-message-ttl"),
                Some(&AMQPValue::LongLongInt(ttl)),
                "{q}"
            );
        }
        // Shards are the router's own queues, recorded in the state, and
        // never taken for an earlier version's laps.
        for q in &queues {
            assert!(names.owns_queue(q), "{q}");
            assert_eq!(laps_of(q), 1, "{q}");
        }
        let recorded = parse_state(
            "p",
            &render_state(
                &t.bucket_names()
                    .iter()
                    .map(|q| q.to_string())
                    .collect::<Vec<_>>(),
            ),
        );
        assert_eq!(recorded, queues);
        // Fewer shards: the ones above retire like a removed rung.
        let one = Topology::new(
            &names,
            PlacementStrategy::RoundUp,
            QueueType::Classic,
            &ladder,
            1,
        );
        assert_eq!(
            stale_buckets(&recorded, &one.bucket_names()),
            [
                "p.bucket.1s.1",
                "p.bucket.1s.2",
                "p.bucket.3s.1",
                "p.bucket.3s.2"
            ]
        );
        assert_eq!(default_bucket_shards(QueueType::Classic), 2);
        assert_eq!(default_bucket_shards(QueueType::Quorum), 1);
    }

    #[test]
    fn quorum_buckets_dead_letter_at_least_once() {
        let names = Names::new("p");
        let rung = &Ladder::from_labels(&["1s"]).unwrap().rungs()[0].clone();
        let args = bucket_arguments(&names, PlacementStrategy::Cascade, QueueType::Quorum, rung);
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
    fn what_a_quorum_queue_delivers_too_often_goes_to_the_park() {
        let names = Names::new("p");
        let args = |q, t| own_queue_arguments(&names, t, q);
        let limit = |a: &FieldTable| a.inner().get("x-delivery-limit").cloned();
        let dlx = |a: &FieldTable| a.inner().get("x-dead-letter-routing-key").cloned();
        let park = Some(AMQPValue::LongString("p.parked".into()));
        for q in [&names.ingress, &names.expired] {
            let quorum = args(q, QueueType::Quorum);
            assert_eq!(limit(&quorum), Some(AMQPValue::LongLongInt(DELIVERY_LIMIT)));
            assert_eq!(dlx(&quorum), park);
        }
        for q in [&names.parked, &names.state] {
            let quorum = args(q, QueueType::Quorum);
            assert_eq!(
                limit(&quorum),
                Some(AMQPValue::LongLongInt(NO_DELIVERY_LIMIT))
            );
            assert_eq!(dlx(&quorum), None);
        }
        // Classic queues have no delivery limit; ingress parks what expires.
        assert_eq!(dlx(&args(&names.ingress, QueueType::Classic)), park);
        assert_eq!(
            args(&names.expired, QueueType::Classic),
            FieldTable::default()
        );
        assert_eq!(limit(&args(&names.ingress, QueueType::Classic)), None);
    }

    #[test]
    fn classic_queues_carry_the_configured_version_and_quorum_queues_none() {
        let names = Names::new("p");
        let ladder = Ladder::from_labels(&["1s", "3s"]).unwrap();
        let version = |a: &FieldTable| a.inner().get(QUEUE_VERSION_ARGUMENT).cloned();
        for (queue_type, configured, expected) in [
            (QueueType::Classic, Some(2), Some(AMQPValue::LongLongInt(2))),
            (QueueType::Classic, Some(1), Some(AMQPValue::LongLongInt(1))),
            (QueueType::Classic, None, None),
            (QueueType::Quorum, Some(2), None),
        ] {
            let t = Topology::new(&names, PlacementStrategy::Cascade, queue_type, &ladder, 1)
                .with_classic_version(configured);
            assert_eq!(t.buckets.len(), 2);
            assert!(!t.own.is_empty());
            for (q, args) in t.buckets.iter().chain(&t.own) {
                assert_eq!(version(args), expected, "{queue_type} {configured:?} {q}");
            }
            // The cancels stream is a stream whatever the buckets are.
            assert_eq!(version(&t.cancels.1), None);
        }
    }

    #[test]
    fn priority_buckets_have_their_own_names_and_max_priority() {
        let names = Names::new("p");
        let rung = &Ladder::from_labels(&["1s"]).unwrap().rungs()[0].clone();
        assert_eq!(
            names.bucket(PlacementStrategy::Priority, rung).as_str(),
            "p.pbucket.1s"
        );
        assert_eq!(
            names.bucket(PlacementStrategy::Cascade, rung).as_str(),
            "p.bucket.1s"
        );
        assert!(
            bucket_arguments(
                &names,
                PlacementStrategy::Priority,
                QueueType::Classic,
                rung
            )
            .contains_key("x-max-priority")
        );
        assert!(
            !bucket_arguments(&names, PlacementStrategy::RoundUp, QueueType::Classic, rung)
                .contains_key("x-max-priority")
        );
        assert!(
            !bucket_arguments(&names, PlacementStrategy::Priority, QueueType::Quorum, rung)
                .contains_key("x-max-priority"),
            "quorum queues refuse x-max-priority"
        );
    }

    #[test]
    fn a_refused_declare_tells_the_type_only_when_it_names_the_type() {
        let names = Names::new("p");
        let sent = ingress_arguments(&names, QueueType::Quorum);
        let q = "for queue 'p.ingress' in vhost '/'";
        // RabbitMQ 3.10.8 and 4.3.6, the queue declared classic by the router.
        for detail in [
            format!(
                "inequivalent arg 'x-queue-type' {q}: received the value 'quorum' of type 'longstr' but current is none"
            ),
            format!(
                "inequivalent arg 'x-queue-type' {q}: received 'quorum' but current is 'classic'"
            ),
            format!(
                "inequivalent arg 'x-queue-version' {q}: received none but current is the value '2' of type 'signedint'"
            ),
        ] {
            assert_eq!(type_clue(&detail, &sent), TypeClue::NotQuorum, "{detail}");
        }
        // An argument the declare sent: leave it out and ask again.
        let detail = format!(
            "inequivalent arg 'x-delivery-limit' {q}: received the value '20' of type 'signedint' but current is none"
        );
        assert_eq!(
            type_clue(&detail, &sent),
            TypeClue::Without("x-delivery-limit".into())
        );
        // One it did not send, or no argument at all: no clue.
        for detail in [
            format!("inequivalent arg 'x-max-length' {q}: received none but current is the value '5' of type 'long'"),
            "inequivalent arg 'durable' for queue 'p.ingress': received 'true' but current is 'false'".into(),
            "queue 'p.ingress' in vhost '/' in exclusive use".into(),
            "inequivalent arg 'x-queue-type".into(),
        ] {
            assert_eq!(type_clue(&detail, &sent), TypeClue::Unknown, "{detail}");
        }
    }

    #[test]
    fn queue_type_setting_reads_auto_and_both_types() {
        for (text, setting) in [
            ("auto", QueueTypeSetting::Auto),
            ("classic", QueueTypeSetting::Fixed(QueueType::Classic)),
            ("quorum", QueueTypeSetting::Fixed(QueueType::Quorum)),
        ] {
            assert_eq!(text.parse::<QueueTypeSetting>(), Ok(setting));
            assert_eq!(setting.to_string(), text);
        }
        assert_eq!(QueueTypeSetting::default(), QueueTypeSetting::Auto);
        assert_eq!(QueueTypeSetting::Auto.fixed(), None);
        let e = "mirrored".parse::<QueueTypeSetting>().unwrap_err();
        assert!(e.contains("expected auto, classic or quorum"), "{e}");
    }
}
