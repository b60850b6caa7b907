//! Lazy confirms: when to let the publish connection's confirms wait for a
//! wake-up the router has anyway. Pure.
//!
//! At a low rate each forwarded message woke the router twice: once for its
//! delivery, once for the confirm of its replacement, a millisecond later
//! (README, Performance: "Lazy confirms"). A confirm that is not needed at
//! once can wait: while only a few publishes are unconfirmed, the publish
//! connection's socket reports itself readable only once far more bytes wait
//! than a few confirms make (`SO_RCVLOWAT`), so their confirms stay in the
//! kernel until the router goes eager again — at the next publish past
//! [`LAZY_UP_TO`], at an urgent publish, or [`LAZY_FOR`] after the lazy period
//! began — and are read then, in a wake-up that was happening anyway or in
//! one wake-up for all of them.
//!
//! Nothing is published later: only confirms are read later, so only acks of
//! source deliveries (which linger up to 100 ms anyway) and the freeing of
//! the publish window wait. The socket is eager whenever nothing is
//! unconfirmed, so replies to the connection's other requests (channel
//! opens, declares) never wait for a timer.

use std::time::Duration;

/// The most publishes unconfirmed while the socket is lazy: one more and it
/// is eager until everything is confirmed. Well under the publish window's
/// floor (32), so a lazy socket never holds the window shut.
pub const LAZY_UP_TO: usize = 8;

/// A pipeline lets its publishes be lazy only with a publish window of at
/// least this many (the window's floor, 32, unless the prefetch is
/// smaller): with a smaller prefetch, as for messages of megabytes, the
/// broker sends the next delivery only once one is acked, so every confirm
/// is awaited.
pub const LAZY_WINDOW: usize = 32;

/// The longest a lazy period lasts: then the socket is eager until
/// everything is confirmed. Half the settler's linger, so an ack waits at
/// most half as long again as it did.
pub const LAZY_FOR: Duration = Duration::from_millis(50);

/// A change to make to the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Report readable only past the lazy threshold; this is lazy period
    /// `n`, which ends at the latest [`LAZY_FOR`] from now.
    Lazy(u64),
    /// Report readable on any byte.
    Eager,
}

/// The publish connection's unconfirmed publishes and its socket's mode.
#[derive(Debug, Default, Clone)]
pub struct Pacing {
    unconfirmed: usize,
    lazy: bool,
    /// Lazy periods begun so far (the current one, while lazy).
    period: u64,
}

impl Pacing {
    /// A publish is sent; `urgent` when its answer must not wait (a publish
    /// awaited before the next one is sent). Returns whether its confirm may
    /// be read late (its latency then says nothing of the broker's), and the
    /// change to make to the socket, if any.
    pub fn sent(&mut self, urgent: bool) -> (bool, Option<Change>) {
        self.unconfirmed += 1;
        if urgent || self.unconfirmed > LAZY_UP_TO {
            return (false, self.eager());
        }
        if self.unconfirmed == 1 && !self.lazy {
            self.lazy = true;
            self.period += 1;
            return (true, Some(Change::Lazy(self.period)));
        }
        (self.lazy, None)
    }

    /// A publish was answered (or given up on).
    pub fn answered(&mut self) -> Option<Change> {
        self.unconfirmed = self.unconfirmed.saturating_sub(1);
        if self.unconfirmed == 0 {
            self.eager()
        } else {
            None
        }
    }

    /// Lazy period `period` reached [`LAZY_FOR`].
    pub fn expired(&mut self, period: u64) -> Option<Change> {
        if period == self.period {
            self.eager()
        } else {
            None
        }
    }

    /// Publishes sent and not answered.
    pub fn unconfirmed(&self) -> usize {
        self.unconfirmed
    }

    /// Whether the socket is lazy now.
    pub fn is_lazy(&self) -> bool {
        self.lazy
    }

    fn eager(&mut self) -> Option<Change> {
        std::mem::take(&mut self.lazy).then_some(Change::Eager)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_first_publish_begins_a_lazy_period_and_its_confirm_ends_it() {
        let mut p = Pacing::default();
        assert_eq!(p.sent(false), (true, Some(Change::Lazy(1))));
        assert!(p.is_lazy());
        assert_eq!(p.answered(), Some(Change::Eager));
        assert!(!p.is_lazy());
        assert_eq!(p.sent(false), (true, Some(Change::Lazy(2))));
    }

    #[test]
    fn one_publish_past_the_limit_makes_the_socket_eager_until_all_are_confirmed() {
        let mut p = Pacing::default();
        for _ in 0..LAZY_UP_TO {
            assert!(p.sent(false).0);
        }
        assert_eq!(p.sent(false), (false, Some(Change::Eager)));
        // Fewer unconfirmed again: still eager, no new period.
        assert_eq!(p.answered(), None);
        assert_eq!(p.sent(false), (false, None));
        for _ in 0..=LAZY_UP_TO {
            assert_eq!(p.answered(), None);
        }
        assert_eq!(p.unconfirmed(), 0);
        assert_eq!(p.sent(false), (true, Some(Change::Lazy(2))));
    }

    #[test]
    fn an_urgent_publish_makes_the_socket_eager() {
        let mut p = Pacing::default();
        p.sent(false);
        assert_eq!(p.sent(true), (false, Some(Change::Eager)));
        let mut q = Pacing::default();
        assert_eq!(q.sent(true), (false, None));
        assert!(!q.is_lazy());
    }

    #[test]
    fn only_the_current_period_expires() {
        let mut p = Pacing::default();
        p.sent(false);
        p.answered();
        p.sent(false);
        assert_eq!(p.expired(1), None);
        assert!(p.is_lazy());
        assert_eq!(p.expired(2), Some(Change::Eager));
        assert_eq!(p.expired(2), None);
        // Eager until everything is confirmed, however many go out.
        assert_eq!(p.sent(false), (false, None));
    }

    #[test]
    fn an_answer_with_nothing_unconfirmed_changes_nothing() {
        let mut p = Pacing::default();
        assert_eq!(p.answered(), None);
        assert_eq!(p.unconfirmed(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Sent(bool),
        Answered,
        Expired,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<bool>().prop_map(Op::Sent),
            Just(Op::Answered),
            Just(Op::Expired),
        ]
    }

    proptest! {
        /// Whatever happens: never lazy with nothing or too much unconfirmed;
        /// the changes reported are exactly the mode's transitions; a lazy
        /// publish is reported only while lazy.
        #[test]
        fn the_mode_follows_the_rules(ops in proptest::collection::vec(op(), 0..200)) {
            let mut p = Pacing::default();
            let mut lazy = false;
            let mut outstanding = 0usize;
            for op in ops {
                let change = match op {
                    Op::Sent(urgent) => {
                        outstanding += 1;
                        let (late, change) = p.sent(urgent);
                        prop_assert_eq!(late, p.is_lazy());
                        if urgent { prop_assert!(!p.is_lazy()); }
                        change
                    }
                    Op::Answered => {
                        outstanding = outstanding.saturating_sub(1);
                        p.answered()
                    }
                    Op::Expired => {
                        let change = p.expired(p.period);
                        prop_assert!(!p.is_lazy());
                        change
                    }
                };
                match change {
                    Some(Change::Lazy(_)) => prop_assert!(!lazy && p.is_lazy()),
                    Some(Change::Eager) => prop_assert!(lazy && !p.is_lazy()),
                    None => prop_assert_eq!(lazy, p.is_lazy()),
                }
                lazy = p.is_lazy();
                prop_assert_eq!(p.unconfirmed(), outstanding);
                if p.is_lazy() {
                    prop_assert!((1..=LAZY_UP_TO).contains(&p.unconfirmed()));
                }
            }
        }
    }
}
