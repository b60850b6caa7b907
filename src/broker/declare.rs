//! Declaring the topology: exchanges, queues and bindings, idempotently. A
//! queue that exists with other arguments is a [`BrokerError::Conflict`]
//! saying which queue and what to do.

use super::{BrokerError, PRECONDITION_FAILED, RPC_TIMEOUT, channel, close_channel, timed};
use crate::config::{AmqpUrl, CaFile};
use crate::core::compat;
use crate::core::delayed::DelayedType;
use crate::core::placement::PlacementStrategy;
use crate::core::topology::{
    Names, QUEUE_VERSION_ARGUMENT, QueueType, Topology, TypeClue, ingress_arguments,
    lanes_arguments, type_clue,
};
use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};
use tracing::warn;

/// Declares every exchange, queue and binding of `t`; idempotent.
///
/// What the buckets expire reaches the router through the lanes: the
/// buckets' dead-letter exchange (`expired`) is bound to `lanes`, a headers
/// exchange that passes everything to its alternate exchange `lanes.later`,
/// bound to the `expired` queue. (An earlier version bound a due lane to
/// `lanes`; the router's janitor retires it.) Versions
/// before the lanes bound the `expired` queue to the `expired` exchange
/// directly; that binding is removed once the lanes are in place (both
/// lead to the same queue, so nothing is lost or doubled in between).
///
/// One of the router's own queues that exists with other arguments, as
/// declared by an earlier version (before the quorum delivery limits), is
/// kept as it is, with a warning saying what it lacks and how to upgrade it;
/// so is a classic queue with another `x-queue-version` than configured. A
/// bucket with other arguments is a [`BrokerError::Conflict`].
///
/// Returns the classic queues kept with another `x-queue-version` than
/// configured, for the caller to warn about
/// ([`warn_unversioned`]) once, not at every drift check.
pub async fn declare(conn: &Connection, t: &Topology) -> Result<Vec<ShortString>, BrokerError> {
    let names = &t.names;
    let mut ch = channel(conn).await?;
    let declared = async {
        let none = FieldTable::default;
        exchange(&ch, &names.router_exchange, ExchangeKind::Fanout, none()).await?;
        exchange(&ch, &names.control, ExchangeKind::Fanout, none()).await?;
        exchange(&ch, &names.expired_exchange, ExchangeKind::Fanout, none()).await?;
        exchange(&ch, &names.lanes_later, ExchangeKind::Fanout, none()).await?;
        exchange(
            &ch,
            &names.lanes,
            ExchangeKind::Headers,
            lanes_arguments(names),
        )
        .await?;
        exchange(&ch, &names.presence, ExchangeKind::Fanout, none()).await?;
        for x in &t.delayed {
            exchange(&ch, &x.name, ExchangeKind::Fanout, none()).await?;
            exchange(&ch, &x.deliver_to, delivery_kind(x.kind), none()).await?;
        }
        let mut unversioned = Vec::new();
        for (q, args) in &t.own {
            if declare_or_keep(conn, &mut ch, q, args, &UPGRADED_ARGUMENTS)
                .await?
                .0
            {
                unversioned.push(q.clone());
            }
        }
        let (cancels, args) = &t.cancels;
        queue(&ch, cancels, args.clone()).await?;
        bindings(&ch, t).await?;
        for (q, args) in &t.buckets {
            if declare_or_keep(conn, &mut ch, q, args, &[]).await?.0 {
                unversioned.push(q.clone());
            }
        }
        for (q, args) in &t.waiting {
            queue(&ch, q, args.clone()).await?;
        }
        Ok(unversioned)
    }
    .await;
    close_channel(&ch, "declared").await;
    declared
}

/// Re-asserts the bindings of `t` on a channel of its own, declaring
/// nothing else: what the drift check does when its passive survey found
/// every exchange and queue in place (bindings cannot be checked passively;
/// binding is idempotent).
pub async fn rebind(conn: &Connection, t: &Topology) -> Result<(), BrokerError> {
    let ch = channel(conn).await?;
    let bound = bindings(&ch, t).await;
    close_channel(&ch, "rebound").await;
    bound
}

/// The bindings between the router's exchanges and queues, and the removal
/// of the binding that versions before the lanes made: sent at once, one
/// round trip for all (a failure closes the channel and fails the ones
/// sent behind it, so the first failure in order is the cause).
async fn bindings(ch: &Channel, t: &Topology) -> Result<(), BrokerError> {
    let names = &t.names;
    let none = FieldTable::default;
    // The plugin's exchanges: everything published to one goes to ingress.
    for x in &t.delayed {
        bind(ch, &names.ingress, &x.name, none()).await?;
    }
    let lanes_bind_what = format!(
        "exchange.bind {} to {}",
        names.lanes, names.expired_exchange
    );
    let old_unbind_what = format!(
        "queue.unbind {} from {}",
        names.expired, names.expired_exchange
    );
    let (ingress, control, expired, lanes, old) = futures_util::join!(
        bind(ch, &names.ingress, &names.router_exchange, none()),
        bind(ch, &names.ingress, &names.control, none()),
        bind(ch, &names.expired, &names.lanes_later, none()),
        timed(
            &lanes_bind_what,
            RPC_TIMEOUT,
            ch.exchange_bind(
                names.lanes.clone(),
                names.expired_exchange.clone(),
                "".into(),
                ExchangeBindOptions::default(),
                none(),
            ),
        ),
        // Before the lanes: the expired queue straight on the exchange.
        timed(
            &old_unbind_what,
            RPC_TIMEOUT,
            ch.queue_unbind(
                names.expired.clone(),
                names.expired_exchange.clone(),
                "".into(),
                none(),
            ),
        ),
    );
    ingress?;
    control?;
    expired?;
    lanes?;
    old?;
    Ok(())
}

/// The type of an existing prefix's queues, read off its ingress queue;
/// `None` for a new prefix (no ingress). What `queue_type = "auto"` adopts.
///
/// AMQP tells a queue's type only by refusing a declare that names another:
/// the ingress is declared (it exists, so nothing is created) with the
/// arguments a quorum ingress of this version has. Accepted: quorum. Refused
/// over `x-queue-type`: classic. Refused over another argument the declare
/// sent (an earlier version's queue without it): declared again without it,
/// so at most once per argument. Refused over anything else: a
/// [`BrokerError::Conflict`] saying to set the type.
pub async fn existing_queue_type(
    conn: &Connection,
    names: &Names,
) -> Result<Option<QueueType>, BrokerError> {
    let q = &names.ingress;
    if super::probe::queue(conn, q).await?.is_none() {
        return Ok(None);
    }
    let mut args = ingress_arguments(names, QueueType::Quorum);
    loop {
        let ch = channel(conn).await?;
        let declared = queue(&ch, q, args.clone()).await;
        close_channel(&ch, "probed").await;
        let detail = match declared {
            Ok(()) => return Ok(Some(QueueType::Quorum)),
            Err(BrokerError::Conflict { detail, .. }) => detail,
            Err(e) => return Err(e),
        };
        match type_clue(&detail, &args) {
            TypeClue::NotQuorum => return Ok(Some(QueueType::Classic)),
            TypeClue::Without(arg) => args = without(&args, &arg),
            TypeClue::Unknown => {
                return Err(BrokerError::Conflict {
                    kind: "queue",
                    name: q.to_string(),
                    detail: format!(
                        "{detail}; queue_type = \"auto\" cannot tell the type of the queues of \
                         prefix {}: set [topology] queue_type to \"classic\" or \"quorum\"",
                        names.prefix
                    ),
                });
            }
        }
    }
}

/// What `queue_type = "auto"` declares for `names` on the broker at `url`
/// (`conn` a connection to it): the type of the prefix's queues, and `true`,
/// when they exist ([`existing_queue_type`]); else the type for a new
/// prefix ([`compat::new_prefix_queue_type`], by the version the broker
/// states), and `false`.
pub async fn auto_queue_type(
    conn: &Connection,
    url: &AmqpUrl,
    ca: Option<&CaFile>,
    names: &Names,
    strategy: PlacementStrategy,
) -> Result<(QueueType, bool), BrokerError> {
    if let Some(t) = existing_queue_type(conn, names).await? {
        return Ok((t, true));
    }
    let version = super::server::server_info(url, ca)
        .await
        .ok()
        .and_then(|i| i.major_minor());
    Ok((compat::new_prefix_queue_type(strategy, version), false))
}

/// Arguments of the router's own queues that later versions added: a queue
/// declared without them by an earlier version is kept.
const UPGRADED_ARGUMENTS: [&str; 3] = [
    "x-delivery-limit",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
];

/// Declares queue `q`; if it exists with other arguments and the broker
/// names one of `kept` (an argument a later version added), keeps it as it
/// is, with a warning saying what it lacks and how to upgrade it. A classic
/// queue whose only difference is its `x-queue-version` (none, 1 or 2: the
/// one that declares without complaint is found by declaring again) is kept
/// and reported to the caller, who warns once for them all. A refused declare
/// closes the channel: `ch` is then a new one.
async fn declare_or_keep(
    conn: &Connection,
    ch: &mut Channel,
    q: &ShortString,
    args: &FieldTable,
    kept: &[&str],
) -> Result<Kept, BrokerError> {
    let base = without(args, QUEUE_VERSION_ARGUMENT);
    let wanted = args.inner().get(QUEUE_VERSION_ARGUMENT).cloned();
    // The configured version first, then the others.
    let mut versions = vec![wanted.clone()];
    for other in [None, Some(2), Some(1)].map(|v| v.map(AMQPValue::LongLongInt)) {
        if other != wanted {
            versions.push(other);
        }
    }
    let mut versions = versions.into_iter().peekable();
    loop {
        let version = versions.next().unwrap_or(None);
        let mut attempt = base.clone();
        if let Some(v) = &version {
            attempt.insert(QUEUE_VERSION_ARGUMENT.into(), v.clone());
        }
        let other_version = version != wanted;
        match queue(ch, q, attempt).await {
            // Which argument differs is only in the broker's words.
            Err(BrokerError::Conflict { detail, .. })
                if kept.iter().any(|a| detail.contains(a))
                    || (detail.contains(QUEUE_VERSION_ARGUMENT) && versions.peek().is_some()) =>
            {
                // The refused declare closed the channel.
                close_channel(ch, "conflict").await;
                *ch = channel(conn).await?;
                if detail.contains(QUEUE_VERSION_ARGUMENT) && versions.peek().is_some() {
                    continue;
                }
                warn!(
                    queue = %q,
                    difference = %detail,
                    "kept as it was declared before: a quorum queue without the delivery limit and \
                     dead-letter target of this version may drop a message delivered too often \
                     (RabbitMQ 4's default limit); drain and delete it to have it declared anew"
                );
                if super::probe::queue(conn, q).await?.is_none() {
                    return Err(BrokerError::other(
                        format!("queue.declare {q}"),
                        "it vanished",
                    ));
                }
                return Ok(Kept(other_version));
            }
            other => return other.map(|()| Kept(other_version)),
        }
    }
}

/// `args` without `key` (lapin's tables only grow).
fn without(args: &FieldTable, key: &str) -> FieldTable {
    let mut rest = FieldTable::default();
    for (k, v) in args.inner() {
        if k.as_str() != key {
            rest.insert(k.clone(), v.clone());
        }
    }
    rest
}

/// Whether [`declare_or_keep`] kept a classic queue with another
/// `x-queue-version` than configured.
struct Kept(bool);

/// One warning for the classic queues kept with another `x-queue-version`
/// than configured.
pub fn warn_unversioned(queues: &[ShortString]) {
    if queues.is_empty() {
        return;
    }
    let names: Vec<&str> = queues.iter().map(|q| q.as_str()).collect();
    warn!(
        queues = %names.join(" "),
        "{} classic queues kept as declared before, with another x-queue-version than \
         [topology] classic_queue_version asks for: RabbitMQ refuses to change a queue's \
         arguments. On RabbitMQ 3.10-3.13 a policy converts them in place: rabbitmqctl \
         set_policy <name> '<pattern matching them>' '{{\"queue-version\":2}}' --apply-to \
         queues (this warning stays: the router cannot see a policy). Or drain and delete them \
         to have them declared anew at the next start; from RabbitMQ 4.0 every classic queue \
         is version 2 whatever its argument says",
        names.len()
    );
}

/// Turns a PRECONDITION_FAILED on declare into an error that says what to do.
fn conflict(kind: &'static str, name: &str, e: BrokerError) -> BrokerError {
    match e {
        BrokerError::Amqp {
            reply: Some(reply), ..
        } if reply.code == PRECONDITION_FAILED => BrokerError::Conflict {
            kind,
            name: name.to_owned(),
            detail: reply
                .text
                .strip_prefix("PRECONDITION_FAILED - ")
                .unwrap_or(&reply.text)
                .to_owned(),
        },
        other => other,
    }
}

/// The exchange type a plugin exchange's messages are routed by when due.
fn delivery_kind(kind: DelayedType) -> ExchangeKind {
    match kind {
        DelayedType::Direct => ExchangeKind::Direct,
        DelayedType::Topic => ExchangeKind::Topic,
        DelayedType::Fanout => ExchangeKind::Fanout,
        DelayedType::Headers => ExchangeKind::Headers,
    }
}

async fn exchange(
    ch: &Channel,
    name: &ShortString,
    kind: ExchangeKind,
    args: FieldTable,
) -> Result<(), BrokerError> {
    let opts = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    timed(
        &format!("exchange.declare {name}"),
        RPC_TIMEOUT,
        ch.exchange_declare(name.clone(), kind, opts, args),
    )
    .await
    .map_err(|e| conflict("exchange", name.as_str(), e))
}

async fn queue(ch: &Channel, name: &ShortString, args: FieldTable) -> Result<(), BrokerError> {
    timed(
        &format!("queue.declare {name}"),
        RPC_TIMEOUT,
        ch.queue_declare(name.clone(), QueueDeclareOptions::durable(), args),
    )
    .await
    .map(drop)
    .map_err(|e| conflict("queue", name.as_str(), e))
}

async fn bind(
    ch: &Channel,
    queue: &ShortString,
    exchange: &ShortString,
    args: FieldTable,
) -> Result<(), BrokerError> {
    timed(
        &format!("queue.bind {queue} to {exchange}"),
        RPC_TIMEOUT,
        ch.queue_bind(
            queue.clone(),
            exchange.clone(),
            "".into(),
            QueueBindOptions::default(),
            args,
        ),
    )
    .await
}
