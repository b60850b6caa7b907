//! Consuming from a real broker in tests: one helper instead of a loop per
//! test. Every wait has a deadline; a test helper panics with what it saw.

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use std::time::{Duration, Instant};

/// Who acknowledges what a [`Consumer`] receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// The broker, on delivery (`no_ack`).
    Auto,
    /// The test, with `delivery.acker`; at most this many unacked at once.
    Manual(u16),
}

/// A consumer on a channel of its own.
pub struct Consumer {
    ch: Channel,
    queue: String,
    stream: lapin::Consumer,
}

impl Consumer {
    /// Starts consuming `queue`.
    pub async fn open(conn: &Connection, queue: &str, acks: Acks) -> Self {
        let ch = conn
            .create_channel()
            .await
            .expect("a channel to consume on");
        if let Acks::Manual(prefetch) = acks {
            ch.basic_qos(prefetch, BasicQosOptions::default())
                .await
                .expect("basic.qos");
        }
        let opts = BasicConsumeOptions {
            no_ack: acks == Acks::Auto,
            ..Default::default()
        };
        let tag = format!("test-{:08x}", rand::random::<u32>());
        let stream = ch
            .basic_consume(
                queue.into(),
                tag.as_str().into(),
                opts,
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("consume {queue}: {e}"));
        Self {
            ch,
            queue: queue.to_owned(),
            stream,
        }
    }

    /// The next delivery within `within`, `None` after it.
    pub async fn next_within(&mut self, within: Duration) -> Option<Delivery> {
        match tokio::time::timeout(within, self.stream.next()).await {
            Ok(Some(Ok(d))) => Some(d),
            Ok(other) => panic!("consumer of {} ended: {other:?}", self.queue),
            Err(_) => None,
        }
    }

    /// The next delivery, which must come within `within`.
    pub async fn next(&mut self, within: Duration) -> Delivery {
        let queue = self.queue.clone();
        self.next_within(within)
            .await
            .unwrap_or_else(|| panic!("nothing from {queue} within {within:?}"))
    }

    /// Deliveries, each with its arrival time, until `done` says so; panics
    /// after `within` with how many came.
    pub async fn until(
        &mut self,
        within: Duration,
        mut done: impl FnMut(&[(Instant, Delivery)]) -> bool,
    ) -> Vec<(Instant, Delivery)> {
        let deadline = tokio::time::Instant::now() + within;
        let mut got = Vec::new();
        while !done(&got) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_within(left).await {
                Some(d) => got.push((Instant::now(), d)),
                None => panic!(
                    "{} message(s) from {} within {within:?}, not enough",
                    got.len(),
                    self.queue
                ),
            }
        }
        got
    }

    /// Exactly the next `n` deliveries, within `within`.
    pub async fn take(&mut self, n: usize, within: Duration) -> Vec<(Instant, Delivery)> {
        self.until(within, |got| got.len() >= n).await
    }

    /// Whatever arrives within `quiet` of the last delivery.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Delivery> {
        let mut got = Vec::new();
        while let Some(d) = self.next_within(quiet).await {
            got.push(d);
        }
        got
    }

    /// Stops consuming; unacked deliveries go back to the queue.
    pub async fn close(self) {
        crate::broker::close_channel(&self.ch, "done").await;
    }
}
