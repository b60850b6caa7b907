//! Settling source deliveries: one `basic.ack` with `multiple` for every run
//! of contiguous deliveries whose replacements are confirmed, as RabbitMQ's
//! shovel does. A delivery is never acked before its own replacement is
//! confirmed. Deliveries settled behind one that is not wait up to
//! [`GAP_WAIT`] for it: confirms come back out of delivery order whenever
//! the replacements went to different queues (two shards of a rung, two
//! rungs), and the gap usually closes within milliseconds, when one
//! `multiple` ack covers them all. A gap that stays open longer (cascade
//! holds its last fraction, up to 2 s, while the delivery stays unacked)
//! has the deliveries settled behind it acked one by one: left unacked,
//! each would be sent twice if the router died meanwhile.
//!
//! At a low rate the settler lingers up to [`ACK_LINGER`] for more settled
//! deliveries before it acks: every frame the router sends costs lapin's I/O
//! thread a wake-up and the runtime another when it is written, so one ack
//! for several deliveries saves both for all but one. At full rate the
//! batch ([`ACK_BATCH`]) fills first and nothing waits.

use crate::broker::{BrokerError, RPC_TIMEOUT, timed};
use lapin::Channel;
use lapin::options::BasicAckOptions;
use std::collections::{BTreeSet, HashSet};
use tokio::sync::mpsc;
use tokio::time::Instant;
pub use crate::tuning::{ACK_LINGER, GAP_WAIT, ACK_BATCH};

/// What the settler learns, in order: a tag was delivered, or its replacement confirmed.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Delivered(u64),
    Settled(u64),
}

/// The acks to send now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Acks {
    /// Ack every delivery up to this tag (`multiple`).
    pub up_to: Option<u64>,
    /// Ack these one by one: settled, but behind an unsettled delivery.
    pub singles: Vec<u64>,
}

/// The ack window: tracks unacked deliveries and answers with the acks that are safe.
#[derive(Debug, Default)]
pub struct AckWindow {
    unacked: BTreeSet<u64>,
    settled: HashSet<u64>,
    /// While settled deliveries wait behind an unsettled one: that one's
    /// tag, and since when it has been in their way.
    gap: Option<(u64, Instant)>,
}

impl Acks {
    pub fn is_empty(&self) -> bool {
        self.up_to.is_none() && self.singles.is_empty()
    }
}

impl AckWindow {
    pub fn apply(&mut self, event: Event) {
        match event {
            Event::Delivered(tag) => {
                self.unacked.insert(tag);
            }
            Event::Settled(tag) => {
                self.settled.insert(tag);
            }
        }
    }

    /// Takes the settled prefix out of the window as one `multiple` ack, and
    /// the deliveries settled behind an unsettled one as single acks once it
    /// has been in their way for [`GAP_WAIT`] (at `now`).
    pub fn advance(&mut self, now: Instant) -> Acks {
        let mut acks = Acks::default();
        while let Some(&first) = self.unacked.first() {
            if !self.settled.remove(&first) {
                break;
            }
            self.unacked.pop_first();
            acks.up_to = Some(first);
        }
        let Some(&first) = self.unacked.first().filter(|_| !self.settled.is_empty()) else {
            self.gap = None;
            return acks;
        };
        let since = match self.gap {
            Some((tag, since)) if tag == first => since,
            _ => {
                self.gap = Some((first, now));
                now
            }
        };
        if now.saturating_duration_since(since) >= GAP_WAIT {
            acks.singles = self.take_settled();
        }
        acks
    }

    /// Every settled delivery at once: the prefix and the rest one by one
    /// (nothing more will settle).
    pub fn flush(&mut self) -> Acks {
        let far = Instant::now() + GAP_WAIT;
        let mut acks = self.advance(far);
        acks.singles.extend(self.take_settled());
        acks
    }

    fn take_settled(&mut self) -> Vec<u64> {
        let mut singles: Vec<u64> = self.settled.drain().collect();
        singles.sort_unstable();
        for tag in &singles {
            self.unacked.remove(tag);
        }
        self.gap = None;
        singles
    }

    /// When the deliveries settled behind a gap are to be acked one by one,
    /// while some wait.
    pub fn singles_due(&self) -> Option<Instant> {
        self.gap
            .filter(|_| !self.settled.is_empty())
            .map(|(_, since)| since + GAP_WAIT)
    }

    /// Deliveries not yet acked.
    pub fn outstanding(&self) -> usize {
        self.unacked.len()
    }

    /// Deliveries settled and not yet acked.
    pub fn settled(&self) -> usize {
        self.settled.len()
    }
}

/// Sender side handed to the pipeline and its tasks.
pub type Settler = mpsc::UnboundedSender<Event>;

/// Runs until every sender is dropped, acking on `ch` as deliveries settle.
pub async fn run(ch: Channel, mut rx: mpsc::UnboundedReceiver<Event>) -> Result<(), BrokerError> {
    let mut window = AckWindow::default();
    loop {
        let received = match window.singles_due() {
            Some(due) => match tokio::time::timeout_at(due, rx.recv()).await {
                Ok(received) => received.map(Some),
                // Settled deliveries waited long enough behind a gap.
                Err(_) => Some(None),
            },
            None => rx.recv().await.map(Some),
        };
        let acks = match received {
            // Every sender is gone: nothing more will settle.
            None => {
                let acks = window.flush();
                send(&ch, acks).await?;
                return Ok(());
            }
            Some(Some(event)) => {
                window.apply(event);
                while let Ok(event) = rx.try_recv() {
                    window.apply(event);
                }
                if window.settled() == 0 {
                    continue;
                }
                linger(&mut window, &mut rx).await;
                window.advance(Instant::now())
            }
            Some(None) => window.advance(Instant::now()),
        };
        send(&ch, acks).await?;
    }
}

/// Sends `acks` on `ch`.
async fn send(ch: &Channel, acks: Acks) -> Result<(), BrokerError> {
    if acks.is_empty() {
        return Ok(());
    }
    let multiple = acks.up_to.map(|tag| (tag, true));
    let singles = acks.singles.into_iter().map(|tag| (tag, false));
    // All of them at once: awaited one by one, each ack waits for lapin's
    // I/O thread to write the one before, and settled deliveries pile up
    // unacked (each one sent again if the router dies meanwhile).
    let sends = multiple.into_iter().chain(singles).map(|(tag, multiple)| {
        timed(
            "basic.ack",
            RPC_TIMEOUT,
            ch.basic_ack(tag, BasicAckOptions { multiple }),
        )
    });
    futures_util::future::try_join_all(sends).await?;
    Ok(())
}

/// Takes more events for up to [`ACK_LINGER`], until [`ACK_BATCH`]
/// deliveries are settled or every sender is gone.
async fn linger(window: &mut AckWindow, rx: &mut mpsc::UnboundedReceiver<Event>) {
    let until = tokio::time::Instant::now() + ACK_LINGER;
    while window.settled() < ACK_BATCH {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(event)) => window.apply(event),
            Ok(None) | Err(_) => return,
        }
        while let Ok(event) = rx.try_recv() {
            window.apply(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[test]
    fn the_settled_prefix_is_acked_with_multiple_the_rest_one_by_one_after_the_gap_wait() {
        let t0 = Instant::now();
        let mut w = AckWindow::default();
        for t in 1..=5 {
            w.apply(Event::Delivered(t));
        }
        w.apply(Event::Settled(2));
        w.apply(Event::Settled(4));
        // 1 is in the way: 2 and 4 wait for it.
        assert_eq!(w.advance(t0), Acks::default());
        assert_eq!(w.singles_due(), Some(t0 + GAP_WAIT));
        assert_eq!(w.advance(t0 + GAP_WAIT / 2), Acks::default());
        // 1 was too slow: they go one by one.
        assert_eq!(
            w.advance(t0 + GAP_WAIT),
            Acks {
                up_to: None,
                singles: vec![2, 4]
            }
        );
        assert_eq!(w.singles_due(), None);
        w.apply(Event::Settled(1));
        assert_eq!(
            w.advance(t0 + GAP_WAIT),
            Acks {
                up_to: Some(1),
                singles: vec![]
            }
        );
        w.apply(Event::Settled(5));
        w.apply(Event::Settled(3));
        assert_eq!(
            w.advance(t0 + GAP_WAIT),
            Acks {
                up_to: Some(5),
                singles: vec![]
            }
        );
        assert_eq!(w.outstanding(), 0);
    }

    #[test]
    fn a_gap_closed_in_time_makes_one_ack_of_all() {
        let t0 = Instant::now();
        let mut w = AckWindow::default();
        for t in 1..=100 {
            w.apply(Event::Delivered(t));
        }
        // Two queues' confirms: the odd tags first, then the even ones.
        for t in (1..=100).filter(|t| t % 2 == 1) {
            w.apply(Event::Settled(t));
        }
        let first = w.advance(t0);
        assert_eq!(first.up_to, Some(1));
        assert!(first.singles.is_empty());
        for t in (1..=100).filter(|t| t % 2 == 0) {
            w.apply(Event::Settled(t));
        }
        assert_eq!(
            w.advance(t0 + GAP_WAIT / 2),
            Acks {
                up_to: Some(100),
                singles: vec![]
            }
        );
        assert_eq!(w.outstanding(), 0);
        assert_eq!(w.singles_due(), None);
    }

    #[test]
    fn a_new_gap_waits_afresh_and_a_flush_takes_everything() {
        let t0 = Instant::now();
        let mut w = AckWindow::default();
        for t in 1..=4 {
            w.apply(Event::Delivered(t));
        }
        w.apply(Event::Settled(2));
        assert!(w.advance(t0).is_empty());
        // 1 settles just before its wait is over; 3 is the gap now.
        w.apply(Event::Settled(1));
        w.apply(Event::Settled(4));
        let t1 = t0 + GAP_WAIT - Duration::from_millis(1);
        assert_eq!(w.advance(t1).up_to, Some(2));
        assert_eq!(w.singles_due(), Some(t1 + GAP_WAIT));
        assert!(w.advance(t0 + GAP_WAIT).is_empty());
        assert_eq!(
            w.flush(),
            Acks {
                up_to: None,
                singles: vec![4]
            }
        );
        assert_eq!(w.outstanding(), 1);
    }

    fn settled_window(n: u64) -> AckWindow {
        let mut w = AckWindow::default();
        for t in 1..=n {
            w.apply(Event::Delivered(t));
            w.apply(Event::Settled(t));
        }
        w
    }

    #[tokio::test]
    async fn a_few_settled_deliveries_wait_for_company_up_to_the_linger() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut w = settled_window(1);
        let feeder = tokio::spawn(async move {
            tokio::time::sleep(ACK_LINGER / 2).await;
            tx.send(Event::Delivered(2)).unwrap();
            tx.send(Event::Settled(2)).unwrap();
            // Keep the channel open past the linger.
            tokio::time::sleep(ACK_LINGER * 10).await;
        });
        let start = tokio::time::Instant::now();
        linger(&mut w, &mut rx).await;
        let took = start.elapsed();
        assert!(took >= ACK_LINGER, "{took:?}");
        assert!(took < ACK_LINGER * 5, "{took:?}");
        assert_eq!(
            w.advance(Instant::now()),
            Acks {
                up_to: Some(2),
                singles: vec![]
            }
        );
        feeder.abort();
    }

    #[tokio::test]
    async fn a_full_batch_is_acked_without_waiting() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut w = settled_window(ACK_BATCH as u64);
        let start = tokio::time::Instant::now();
        linger(&mut w, &mut rx).await;
        assert!(start.elapsed() < ACK_LINGER / 2);
        drop(tx);
    }

    #[tokio::test]
    async fn the_last_sender_gone_ends_the_linger() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
        let mut w = settled_window(1);
        drop(tx);
        let start = tokio::time::Instant::now();
        linger(&mut w, &mut rx).await;
        assert!(start.elapsed() < ACK_LINGER / 2);
        assert_eq!(w.advance(Instant::now()).up_to, Some(1));
    }

    proptest! {
        /// Every ack is safe (only settled tags, none twice, a `multiple` ack
        /// names an unacked tag) and every settled tag is acked once it has
        /// waited [`GAP_WAIT`] at most.
        #[test]
        fn acks_are_safe_and_prompt(
            order in Just((1u64..=50).collect::<Vec<_>>()).prop_shuffle(),
            steps in proptest::collection::vec(0u64..30, 50),
        ) {
            let mut w = AckWindow::default();
            for t in 1..=50 {
                w.apply(Event::Delivered(t));
            }
            let mut settled = HashSet::new();
            let mut acked = BTreeSet::new();
            let mut now = Instant::now();
            for (t, step) in order.into_iter().zip(steps) {
                w.apply(Event::Settled(t));
                settled.insert(t);
                now += Duration::from_millis(step);
                let mut acks = w.advance(now);
                if let Some(due) = w.singles_due() {
                    prop_assert!(due <= now + GAP_WAIT);
                    // What waits is acked by its due time.
                    let later = w.advance(due);
                    prop_assert!(later.up_to.is_none());
                    acks.singles.extend(later.singles);
                    now = due;
                }
                if let Some(up_to) = acks.up_to {
                    prop_assert!(!acked.contains(&up_to));
                    for x in 1..=up_to {
                        prop_assert!(settled.contains(&x));
                        acked.insert(x);
                    }
                }
                for x in acks.singles {
                    prop_assert!(settled.contains(&x));
                    prop_assert!(acked.insert(x), "acked twice: {}", x);
                }
                prop_assert_eq!(&acked, &settled.iter().copied().collect::<BTreeSet<_>>());
            }
            prop_assert_eq!(acked.len(), 50);
        }
    }
}
