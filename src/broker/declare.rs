//! Declaring the topology: exchanges, queues and bindings, idempotently. A
//! queue that exists with other arguments is a [`BrokerError::Conflict`]
//! saying which queue and what to do.

use super::{BrokerError, PRECONDITION_FAILED, RPC_TIMEOUT, channel, close_channel, timed};
use crate::core::topology::{Topology, due_binding, lanes_arguments};
use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};
use tracing::warn;

/// Declares every exchange, queue and binding of `t`; idempotent.
///
/// What the buckets expire reaches the router through the lanes: the
/// buckets' dead-letter exchange (`expired`) is bound to `lanes`, which
/// sorts what is due soon into the `due` queue and passes the rest to its
/// alternate exchange `lanes.later`, bound to the `expired` queue. Versions
/// before the lanes bound the `expired` queue to the `expired` exchange
/// directly; that binding is removed once the lanes are in place (both
/// lead to the same queue, so nothing is lost or doubled in between but a
/// due message, which may then reach both lanes once).
///
/// One of the router's own queues that exists with other arguments, as
/// declared by an earlier version (before the quorum delivery limits), is
/// kept as it is, with a warning saying what it lacks and how to upgrade it.
/// A bucket with other arguments is a [`BrokerError::Conflict`].
pub async fn declare(conn: &Connection, t: &Topology) -> Result<(), BrokerError> {
    let names = &t.names;
    let mut ch = channel(conn).await?;
    let declared = async {
        let none = FieldTable::default;
        exchange(&ch, &names.router_exchange, ExchangeKind::Fanout, none()).await?;
        exchange(&ch, &names.expired_exchange, ExchangeKind::Fanout, none()).await?;
        exchange(&ch, &names.lanes_later, ExchangeKind::Fanout, none()).await?;
        exchange(&ch, &names.lanes, ExchangeKind::Headers, lanes_arguments(names)).await?;
        exchange(&ch, &names.presence, ExchangeKind::Fanout, none()).await?;
        for (q, args) in &t.own {
            match queue(&ch, q, args.clone()).await {
                // Which argument differs is only in the broker's words.
                Err(BrokerError::Conflict { detail, .. })
                    if UPGRADED_ARGUMENTS.iter().any(|a| detail.contains(a)) =>
                {
                    warn!(
                        queue = %q,
                        difference = %detail,
                        "kept as it was declared before: a quorum queue without the delivery limit and \
                         dead-letter target of this version may drop a message delivered too often \
                         (RabbitMQ 4's default limit); drain and delete it to have it declared anew"
                    );
                    // The refused declare closed the channel.
                    close_channel(&ch, "conflict").await;
                    ch = channel(conn).await?;
                    if super::probe::queue(conn, q).await?.is_none() {
                        return Err(BrokerError::other(format!("queue.declare {q}"), "it vanished"));
                    }
                }
                other => other?,
            }
        }
        let (cancels, args) = &t.cancels;
        queue(&ch, cancels, args.clone()).await?;
        bind(&ch, &names.ingress, &names.router_exchange, none()).await?;
        bind(&ch, &names.expired, &names.lanes_later, none()).await?;
        bind(&ch, &names.due, &names.lanes, due_binding()).await?;
        timed(
            &format!("exchange.bind {} to {}", names.lanes, names.expired_exchange),
            RPC_TIMEOUT,
            ch.exchange_bind(
                names.lanes.clone(),
                names.expired_exchange.clone(),
                "".into(),
                ExchangeBindOptions::default(),
                none(),
            ),
        )
        .await?;
        // Before the lanes: the expired queue straight on the exchange.
        timed(
            &format!("queue.unbind {} from {}", names.expired, names.expired_exchange),
            RPC_TIMEOUT,
            ch.queue_unbind(
                names.expired.clone(),
                names.expired_exchange.clone(),
                "".into(),
                none(),
            ),
        )
        .await?;
        for (q, args) in &t.buckets {
            queue(&ch, q, args.clone()).await?;
        }
        Ok(())
    }
    .await;
    close_channel(&ch, "declared").await;
    declared
}

/// Arguments of the router's own queues that this version added: a queue
/// declared without them by an earlier version is kept.
const UPGRADED_ARGUMENTS: [&str; 3] = [
    "x-delivery-limit",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
];

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
