//! The floor: lapin alone moving messages from one queue to another the way
//! the router moves them, with none of the router's own work, so that a
//! bench can say how much of the router's cost is lapin's and the runtime's.
//!
//! The bench binary runs it in a process of its own (itself again, with
//! [`ARG`]), so its CPU, context switches and instructions are measured as
//! the router's are. It does what each router pipeline does on the wire and
//! nothing else: the same runtime (tokio, one thread), the same allocator
//! (the bench sets mimalloc), consuming on one connection and publishing
//! with confirms on another, `basic.qos` at the router's shipped prefetch,
//! each delivery published as it came (its properties and body moved, not
//! looked at; as many in flight as the prefetch lets come), and acks sent
//! once its confirm is back, with `multiple`, when 16 are settled or 100 ms
//! after the first of them, as the router acks. No decision, no headers
//! written, no publish window, no metrics, no logs: one task. Given several
//! destinations (`dst` a comma-separated list: the queues of a rung), it
//! publishes to them in turn, each on a channel of its own, as the router
//! places over a rung's queues.

use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use lapin::message::Delivery;
use lapin::options::*;
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};
use std::process::Command;
use tokio::time::Instant;

/// The argument that makes the bench binary the floor forwarder.
pub const ARG: &str = "--lapin-floor";

/// The router's shipped `prefetch` (`[amqp] prefetch`).
pub const PREFETCH: u16 = delay_router::config::DEFAULT_PREFETCH;

/// The router's ack batch and linger.
use delay_router::router::settle::{ACK_BATCH, ACK_LINGER};

/// The prefetch the floor consumes with: BENCH_PREFETCH (as for the router
/// in the throughput bench), else the router's shipped one.
fn prefetch() -> String {
    std::env::var("BENCH_PREFETCH").unwrap_or_else(|_| PREFETCH.to_string())
}

/// The program and arguments that run the forwarder from `src` to `dst`.
pub fn command(url: &str, src: &str, dst: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the bench's own path"));
    c.args([ARG, url, src, dst, &prefetch()]);
    c
}

/// The same as [`command`], as valgrind's arguments after the tool's own.
#[allow(dead_code)] // not every bench that shares this module runs valgrind
pub fn args(url: &str, src: &str, dst: &str) -> Vec<String> {
    let exe = std::env::current_exe().expect("the bench's own path");
    vec![
        exe.display().to_string(),
        ARG.into(),
        url.into(),
        src.into(),
        dst.into(),
        prefetch(),
    ]
}

/// Runs the forwarder if this process was started as one (and returns
/// true once SIGINT stops it); false otherwise.
pub fn run_if_asked() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let Some(i) = args.iter().position(|a| a == ARG) else {
        return false;
    };
    let [url, src, dst, prefetch] = &args[i + 1..i + 5] else {
        panic!("{ARG} <url> <src> <dst> <prefetch>")
    };
    let prefetch: u16 = prefetch.parse().expect("prefetch");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        tokio::select! {
            () = forward(url, src, dst, prefetch) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
    true
}

async fn connect(url: &str, name: &str) -> Connection {
    Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .expect("broker")
}

async fn forward(url: &str, src: &str, dst: &str, prefetch: u16) {
    let consuming = connect(url, "lapin-floor consume").await;
    // BENCH_FLOOR_ONE_CONNECTION: both channels on one connection (one
    // lapin I/O thread), which the router does not do (README, Flow control).
    let publishing = if std::env::var_os("BENCH_FLOOR_ONE_CONNECTION").is_some() {
        None
    } else {
        Some(connect(url, "lapin-floor publish").await)
    };
    let cch = consuming.create_channel().await.expect("channel");
    cch.basic_qos(prefetch, BasicQosOptions::default())
        .await
        .expect("qos");
    let dsts: Vec<ShortString> = dst.split(',').map(Into::into).collect();
    let mut pchs = Vec::with_capacity(dsts.len());
    for _ in &dsts {
        let pch = publishing
            .as_ref()
            .unwrap_or(&consuming)
            .create_channel()
            .await
            .expect("channel");
        pch.confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm.select");
        pchs.push(pch);
    }
    let mut turn = 0usize;
    let mut deliveries = cch
        .basic_consume(
            src.into(),
            "lapin-floor".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let options = BasicPublishOptions {
        mandatory: std::env::var_os("BENCH_FLOOR_MANDATORY").is_some(),
        ..Default::default()
    };
    // One task: deliveries in, their publishes in flight (each waits for
    // its send, then its confirm; completed in order), acks out.
    let mut in_flight = FuturesOrdered::new();
    let (mut settled, mut last) = (0, 0);
    let mut deadline = Instant::now();
    loop {
        tokio::select! {
            biased;
            Some(tag) = in_flight.next(), if !in_flight.is_empty() => {
                last = tag;
                settled += 1;
                if settled == 1 {
                    deadline = Instant::now() + ACK_LINGER;
                }
                if settled >= ACK_BATCH {
                    ack_to(&cch, last).await;
                    settled = 0;
                }
            }
            () = tokio::time::sleep_until(deadline), if settled > 0 => {
                ack_to(&cch, last).await;
                settled = 0;
            }
            delivery = deliveries.next() => {
                let Some(delivery) = delivery else { break };
                let i = turn % dsts.len();
                turn += 1;
                in_flight.push_back(publish(pchs[i].clone(), dsts[i].clone(), options, delivery.expect("delivery")));
            }
        }
    }
}

/// Publishes `delivery`'s properties and body to `dst` and waits for the
/// broker's confirm; returns its delivery tag.
async fn publish(
    ch: Channel,
    dst: ShortString,
    options: BasicPublishOptions,
    mut delivery: Delivery,
) -> u64 {
    let properties = std::mem::take(&mut delivery.properties);
    let confirm = ch
        .basic_publish("".into(), dst, options, &delivery.data, properties)
        .await
        .expect("publish");
    assert!(
        confirm.await.expect("confirm").is_ack(),
        "the broker nacked a copy"
    );
    delivery.delivery_tag
}

async fn ack_to(ch: &Channel, tag: u64) {
    ch.basic_ack(tag, BasicAckOptions { multiple: true })
        .await
        .expect("ack");
}
