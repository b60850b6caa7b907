//! The prefetch window: as many deliveries in flight as `prefetch` allows, but
//! no more than about `inflight_bytes` of them. RabbitMQ has no byte-based
//! prefetch, so the router watches message sizes and lowers (or raises back)
//! its `basic.qos` count to fit.

pub use crate::tuning::{RESIZE_EVERY, RESIZE_FACTOR};

/// The prefetch window: chooses the prefetch count from observed message sizes.
#[derive(Debug, Clone)]
pub struct PrefetchWindow {
    max_count: u16,
    max_bytes: u64,
    mean_size: f64,
    current: u16,
    seen: u64,
}

impl PrefetchWindow {
    /// Starts at `max_count`, assuming small messages until it sees otherwise.
    pub fn new(max_count: u16, max_bytes: u64) -> Self {
        Self {
            max_count,
            max_bytes,
            mean_size: 0.0,
            current: max_count,
            seen: 0,
        }
    }

    /// The prefetch count in force.
    pub fn current(&self) -> u16 {
        self.current
    }

    /// The count that keeps `max_bytes` in flight at the observed mean size.
    pub fn target(&self) -> u16 {
        if self.mean_size < 1.0 {
            return self.max_count;
        }
        let fit = (self.max_bytes as f64 / self.mean_size).floor();
        fit.clamp(1.0, f64::from(self.max_count)) as u16
    }

    /// Records a delivery of `size` bytes; returns a new prefetch count when
    /// the window should change. A message that alone would overflow the
    /// budget at the current count triggers an immediate shrink.
    pub fn observe(&mut self, size: usize) -> Option<u16> {
        let size = size.max(1) as f64;
        self.seen += 1;
        // Exponential moving average over about the last 64 messages.
        self.mean_size = if self.seen == 1 {
            size
        } else {
            self.mean_size + (size - self.mean_size) / 64.0
        };
        let urgent = size * f64::from(self.current) > 4.0 * self.max_bytes as f64;
        if urgent {
            self.mean_size = self.mean_size.max(size);
        }
        if !urgent && self.seen % RESIZE_EVERY != 0 {
            return None;
        }
        let target = self.target();
        let (a, b) = (f64::from(target), f64::from(self.current));
        if target != self.current && (a / b >= RESIZE_FACTOR || b / a >= RESIZE_FACTOR || urgent) {
            self.current = target;
            Some(target)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_messages_keep_the_full_count() {
        let mut w = PrefetchWindow::new(5000, 64 * MIB);
        for _ in 0..10_000 {
            assert_eq!(w.observe(512), None);
        }
        assert_eq!(w.current(), 5000);
    }

    #[test]
    fn one_huge_message_shrinks_the_window_at_once() {
        let mut w = PrefetchWindow::new(5000, 64 * MIB);
        assert_eq!(w.observe(16 * MIB as usize), Some(4));
        assert_eq!(w.current(), 4);
    }

    #[test]
    fn the_window_grows_back_when_messages_get_small_again() {
        let mut w = PrefetchWindow::new(5000, 64 * MIB);
        w.observe(16 * MIB as usize);
        let mut grew = None;
        for _ in 0..5000 {
            if let Some(n) = w.observe(512) {
                grew = Some(n);
            }
        }
        assert_eq!(grew, Some(5000));
    }

    #[test]
    fn steady_large_messages_fit_the_byte_budget() {
        let mut w = PrefetchWindow::new(5000, 64 * MIB);
        for _ in 0..1024 {
            w.observe(MIB as usize);
        }
        assert_eq!(w.current(), 64);
        assert!(u64::from(w.current()) * MIB <= 64 * MIB);
    }
}
