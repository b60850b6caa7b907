//! Wake-up coalescing at low and moderate rates (`[amqp] coalesce`, off
//! unless set).
//!
//! At a low steady rate every delivery wakes the router's thread on its own,
//! and on a small virtual machine the wake-up (a context switch, cold
//! caches) costs more than the work it does (README, CPU per message). So
//! while deliveries come at a rate where a wake-up would find one or two of
//! them, the thread, about to wait for the next socket event, sleeps first
//! for as long as [`BATCH`] deliveries take to come at the rate seen, at
//! most `[amqp] coalesce`: deliveries, confirms and timers that come
//! meanwhile wait in the kernel and are handled together after it, one
//! wake-up for all.
//!
//! It never sleeps at full rate (more than [`MAX_RATE`] deliveries a
//! second: the thread then parks only while it waits for the broker), below
//! one delivery per `coalesce` (a sleep would add a wake-up rather than
//! save one), nor idle: a sleep follows only a wake-up that handled a
//! delivery, and the park after it lasts until the next socket event.
//!
//! A message may then wait up to one tick more at each hop (the cascade
//! makes up for it on every hop but the last); the tick shrinks as the rate
//! grows (4 ms at 1,000 deliveries a second).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Above this rate of deliveries a second the thread never coalesces.
pub const MAX_RATE: f64 = 2000.0;
/// The deliveries a tick is sized to gather, at the rate seen.
pub const BATCH: f64 = 4.0;
/// How long the rate is counted over before it is reconsidered.
pub const WINDOW: Duration = Duration::from_millis(250);

/// Deliveries handled by this process, for the park hook.
static DELIVERIES: AtomicU64 = AtomicU64::new(0);
/// The tick in microseconds (0: off), set once the configuration is read.
static TICK_MICROS: AtomicU64 = AtomicU64::new(0);

/// Sets the tick of [`park_hook`] (zero turns coalescing off).
pub fn set_tick(tick: Duration) {
    let micros = u64::try_from(tick.as_micros()).unwrap_or(u64::MAX);
    TICK_MICROS.store(micros, Ordering::Relaxed);
}

/// Counts one delivery (every pipeline calls it for each).
pub fn delivered() {
    DELIVERIES.fetch_add(1, Ordering::Relaxed);
}

/// Whether a park should be preceded by a sleep, and how long: from the
/// rate seen over the last [`WINDOW`] and whether deliveries came since the
/// last park. Pure: the caller passes the count and the time.
#[derive(Debug, Clone)]
pub struct Coalescer {
    tick: Duration,
    window_start: Instant,
    window_base: u64,
    rate: f64,
    last_seen: u64,
}

impl Coalescer {
    /// A coalescer whose sleeps last at most `tick`.
    pub fn new(tick: Duration, now: Instant, count: u64) -> Self {
        Self {
            tick,
            window_start: now,
            window_base: count,
            rate: 0.0,
            last_seen: count,
        }
    }

    /// The thread is about to park with `count` deliveries handled so far:
    /// how long to sleep first (none: park at once).
    pub fn before_park(&mut self, now: Instant, count: u64) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= WINDOW {
            self.rate = count.saturating_sub(self.window_base) as f64 / elapsed.as_secs_f64();
            self.window_start = now;
            self.window_base = count;
        }
        let fresh = count != self.last_seen;
        self.last_seen = count;
        // At least one delivery a tick on average, and below full rate.
        let worth = self.rate * self.tick.as_secs_f64() >= 1.0 && self.rate <= MAX_RATE;
        if !(fresh && worth) {
            return None;
        }
        Some(self.tick.min(Duration::from_secs_f64(BATCH / self.rate)))
    }
}

thread_local! {
    static COALESCER: RefCell<Option<Coalescer>> = const { RefCell::new(None) };
}

/// The runtime's `on_thread_park` hook: coalesces with the tick
/// [`set_tick`] set (none until then).
pub fn park_hook() {
    let tick = Duration::from_micros(TICK_MICROS.load(Ordering::Relaxed));
    if tick.is_zero() {
        return;
    }
    {
        let now = Instant::now();
        let count = DELIVERIES.load(Ordering::Relaxed);
        let sleep = COALESCER.with(|c| {
            c.borrow_mut()
                .get_or_insert_with(|| Coalescer::new(tick, now, count))
                .before_park(now, count)
        });
        if let Some(d) = sleep {
            std::thread::sleep(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Parks after each of `n` deliveries `gap` apart; the sleeps asked for.
    fn stream(c: &mut Coalescer, start: Instant, first: u64, n: u64, gap: Duration) -> usize {
        (1..=n)
            .filter(|i| {
                let at = start + gap * u32::try_from(*i).unwrap();
                c.before_park(at, first + i).is_some()
            })
            .count()
    }

    #[test]
    fn a_steady_low_rate_coalesces_once_a_window_has_shown_it() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        // 100 a second: 2 a tick. The first window (250 ms) does not sleep;
        // the others sleep the whole tick (4 take 40 ms).
        let sleeps = stream(&mut c, t0, 0, 100, 10 * MS);
        assert!((70..=80).contains(&sleeps), "{sleeps}");
        assert_eq!(c.before_park(t0 + 1010 * MS, 101), Some(20 * MS));
    }

    #[test]
    fn the_tick_shrinks_as_the_rate_grows() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        // 1000 a second: 4 deliveries take 4 ms.
        let step = Duration::from_millis(1);
        for i in 1..=300u32 {
            c.before_park(t0 + step * i, u64::from(i));
        }
        let tick = c.before_park(t0 + step * 301, 301).unwrap();
        assert!(tick >= 3 * MS && tick <= 5 * MS, "{tick:?}");
    }

    #[test]
    fn full_rate_never_coalesces() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        // 5000 a second, a park after each.
        let sleeps = stream(&mut c, t0, 0, 5000, Duration::from_micros(200));
        assert_eq!(sleeps, 0);
    }

    #[test]
    fn a_rate_below_one_a_tick_does_not() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        let sleeps = stream(&mut c, t0, 0, 50, 100 * MS);
        assert_eq!(sleeps, 0);
    }

    #[test]
    fn a_park_with_nothing_new_never_sleeps() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        stream(&mut c, t0, 0, 100, 10 * MS);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(c.before_park(later, 100), None);
        assert_eq!(c.before_park(later + MS, 100), None);
    }

    #[test]
    fn a_zero_tick_is_off() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::ZERO, t0, 0);
        assert_eq!(stream(&mut c, t0, 0, 100, 10 * MS), 0);
    }
}
