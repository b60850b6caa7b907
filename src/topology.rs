//! Topology: the names and arguments of everything the router declares.
//! Pure; `broker` does the declaring.

use crate::ladder::{Ladder, Rung};
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
        }
    }

    /// `<prefix>.bucket.<label>`.
    pub fn bucket(&self, rung: &Rung) -> ShortString {
        format!("{}.bucket.{}", self.prefix, rung.label).into()
    }

    /// Every bucket queue of a ladder, with its rung.
    pub fn buckets<'a>(
        &'a self,
        ladder: &'a Ladder,
    ) -> impl Iterator<Item = (ShortString, &'a Rung)> + 'a {
        ladder.rungs().iter().map(|r| (self.bucket(r), r))
    }
}

/// Arguments of a bucket queue: its TTL and the dead-letter exchange leading to the router.
pub fn bucket_arguments(names: &Names, rung: &Rung) -> FieldTable {
    let mut args = FieldTable::default();
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

/// Arguments of the ingress queue: what expires or is rejected there is parked, not dropped.
pub fn ingress_arguments(names: &Names) -> FieldTable {
    let mut args = FieldTable::default();
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
