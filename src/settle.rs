//! Settling source deliveries in bulk: one `basic.ack` with `multiple` for
//! every run of contiguous deliveries whose replacements are confirmed, as
//! RabbitMQ's shovel does. A delivery is never acked before its own
//! replacement is confirmed: the ack stops at the first unsettled tag.

use crate::broker::{RPC_TIMEOUT, timed};
use lapin::Channel;
use lapin::options::BasicAckOptions;
use std::collections::{HashSet, VecDeque};
use tokio::sync::mpsc;

/// What the settler learns, in order: a tag was delivered, or its replacement confirmed.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Delivered(u64),
    Settled(u64),
}

/// Tracks delivered tags and answers with the highest tag safe to ack with `multiple`.
#[derive(Debug, Default)]
pub struct Window {
    delivered: VecDeque<u64>,
    settled: HashSet<u64>,
}

impl Window {
    pub fn apply(&mut self, event: Event) {
        match event {
            Event::Delivered(tag) => self.delivered.push_back(tag),
            Event::Settled(tag) => {
                self.settled.insert(tag);
            }
        }
    }

    /// Pops the settled prefix; returns its last tag, if any.
    pub fn advance(&mut self) -> Option<u64> {
        let mut last = None;
        while let Some(&front) = self.delivered.front() {
            if !self.settled.remove(&front) {
                break;
            }
            self.delivered.pop_front();
            last = Some(front);
        }
        last
    }

    /// Deliveries not yet acked.
    pub fn outstanding(&self) -> usize {
        self.delivered.len()
    }
}

/// Sender side handed to the pipeline and its tasks.
pub type Settler = mpsc::UnboundedSender<Event>;

/// Runs until every sender is dropped, acking on `ch` as runs of tags settle.
pub async fn run(ch: Channel, mut rx: mpsc::UnboundedReceiver<Event>) -> Result<(), String> {
    let mut window = Window::default();
    while let Some(event) = rx.recv().await {
        window.apply(event);
        while let Ok(event) = rx.try_recv() {
            window.apply(event);
        }
        if let Some(tag) = window.advance() {
            timed(
                "basic.ack",
                RPC_TIMEOUT,
                ch.basic_ack(tag, BasicAckOptions { multiple: true }),
            )
            .await
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn acks_stop_at_the_first_unsettled_delivery() {
        let mut w = Window::default();
        for t in 1..=5 {
            w.apply(Event::Delivered(t));
        }
        w.apply(Event::Settled(2));
        assert_eq!(w.advance(), None);
        w.apply(Event::Settled(1));
        assert_eq!(w.advance(), Some(2));
        w.apply(Event::Settled(5));
        w.apply(Event::Settled(4));
        assert_eq!(w.advance(), None);
        w.apply(Event::Settled(3));
        assert_eq!(w.advance(), Some(5));
        assert_eq!(w.outstanding(), 0);
    }

    proptest! {
        #[test]
        fn an_acked_tag_is_always_settled(order in Just((1u64..=50).collect::<Vec<_>>()).prop_shuffle()) {
            let mut w = Window::default();
            for t in 1..=50 {
                w.apply(Event::Delivered(t));
            }
            let mut settled = HashSet::new();
            let mut acked_up_to = 0;
            for t in order {
                w.apply(Event::Settled(t));
                settled.insert(t);
                if let Some(up_to) = w.advance() {
                    prop_assert!((acked_up_to + 1..=up_to).all(|x| settled.contains(&x)));
                    acked_up_to = up_to;
                }
            }
            prop_assert_eq!(acked_up_to, 50);
        }
    }
}
