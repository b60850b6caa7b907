//! A consumer that retries failed jobs through delay-router (the explicit path).
//!
//! With the router running (`scripts/run`), this declares `example.jobs`,
//! publishes one job, fails it twice by asking for a retry in 2 s, and
//! succeeds the third time:
//!
//!     cargo run --example retry_consumer
//!
//! Env: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f), ROUTER_EXCHANGE (delay.router).

use delay_router::client::retry_later;
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let router = std::env::var("ROUTER_EXCHANGE").unwrap_or_else(|_| "delay.router".into());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "example.jobs".into());
    let conn = Connection::connect(&url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await?;
    ch.basic_publish(
        "".into(),
        queue.as_str().into(),
        BasicPublishOptions::default(),
        b"job-1",
        BasicProperties::default().with_delivery_mode(2),
    )
    .await?
    .await?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "example".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let start = Instant::now();
    let mut attempt = 0;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        attempt += 1;
        println!(
            "{:>6.1}s attempt {attempt}: {}",
            start.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&delivery.data)
        );
        if attempt < 3 {
            // The third-party API answered 503: try again in 2 seconds.
            retry_later(&ch, &router, &delivery, Duration::from_secs(2)).await?;
        } else {
            println!("done");
        }
        delivery.ack(BasicAckOptions::default()).await?;
        if attempt == 3 {
            break;
        }
    }
    conn.close(200, "bye".into()).await?;
    Ok(())
}
