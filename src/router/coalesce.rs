//! Wake-up coalescing at low and moderate rates (`[amqp] coalesce`, 20 ms
//! unless set; `"0s"` turns it off).
//!
//! At a low steady rate every delivery wakes the router's thread on its own,
//! and on a small virtual machine the wake-up (a context switch, cold
//! caches) costs more than the work it does (README, CPU per message). So
//! while deliveries come at a rate where a wake-up would find one or two of
//! them, the thread, about to wait for the next socket event, sleeps first
//! for `[amqp] coalesce`, or as long as [`batch`] deliveries take to come
//! at the rate seen when that is shorter: deliveries, confirms and timers
//! that come
//! meanwhile wait in the kernel and are handled together after it, one
//! wake-up for all. The wake-up, on caches gone cold, costs far more than
//! the deliveries it handles, so the CPU an event falls as the tick grows
//! (README, Performance: "The tick the setting asks for").
//!
//! It never sleeps at full rate (more than [`MAX_RATE`] deliveries a
//! second: the thread then parks only while it waits for the broker), below
//! one delivery per `coalesce` (a sleep would add a wake-up rather than
//! save one), nor idle: a sleep follows only a wake-up that handled a
//! delivery, and the park after it lasts until the next socket event.
//!
//! A sleep never runs past the earliest deadline of the deliveries the
//! router holds itself (the cascade's last fraction, [`holding_for`]): a
//! message whose last hop is a hold leaves on time. One that arrives due
//! from a bucket may wait up to one tick more (the cascade makes up for it
//! on every hop but the last).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Above this rate of deliveries a second the thread never coalesces.
pub const MAX_RATE: f64 = 2000.0;
/// The fewest deliveries a tick is sized to gather, at the rate seen.
pub const BATCH: f64 = 4.0;
/// Up to this rate of deliveries a second a tick of 20 ms or longer is
/// slept whole (see [`batch`]).
pub const FULL_TICK_RATE: f64 = 200.0;

/// The deliveries a `tick` is sized to gather: [`BATCH`], or as many as
/// come in the tick at [`FULL_TICK_RATE`] when that is more (4 under the
/// default 20 ms, 16 under 80 ms). Above that rate a wake-up finds many
/// deliveries anyway, and the lateness buys less: the tick shrinks in
/// proportion (a fifth at 1,000 a second).
pub fn batch(tick: Duration) -> f64 {
    BATCH.max(tick.as_secs_f64() * FULL_TICK_RATE)
}

/// How long the rate is counted over before it is reconsidered.
pub const WINDOW: Duration = Duration::from_millis(250);

/// Deliveries handled by this process, for the park hook.
static DELIVERIES: AtomicU64 = AtomicU64::new(0);
/// The tick in microseconds (0: off), set once the configuration is read.
static TICK_MICROS: AtomicU64 = AtomicU64::new(0);

/// A sleep a hold cuts shorter than this is not worth a wake-up of its
/// own: park at once.
pub const MIN_SLEEP: Duration = Duration::from_millis(1);

/// Deadlines of the deliveries held now (how many at each), while
/// coalescing is on: a sleep ends at the earliest.
static HOLDS: Mutex<BTreeMap<Instant, u32>> = Mutex::new(BTreeMap::new());

/// A held delivery's deadline, counted until this is dropped.
#[must_use = "the deadline counts only while the guard lives"]
pub struct HoldGuard(Option<Instant>);

/// Counts a delivery the router holds for `after` from now (nothing when
/// coalescing is off): no coalescing sleep runs past its deadline while the
/// guard lives.
pub fn holding_for(after: Duration) -> HoldGuard {
    if TICK_MICROS.load(Ordering::Relaxed) == 0 {
        return HoldGuard(None);
    }
    let Some(deadline) = Instant::now().checked_add(after) else {
        return HoldGuard(None);
    };
    *holds().entry(deadline).or_insert(0) += 1;
    HoldGuard(Some(deadline))
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(deadline) = self.0
            && let Entry::Occupied(mut e) = holds().entry(deadline)
        {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

fn holds() -> std::sync::MutexGuard<'static, BTreeMap<Instant, u32>> {
    HOLDS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The earliest deadline of a held delivery, if any.
fn next_hold() -> Option<Instant> {
    holds().first_key_value().map(|(at, _)| *at)
}

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

    /// The thread is about to park with `count` deliveries handled so far
    /// and the earliest held delivery due at `next_hold`: how long to sleep
    /// first (none: park at once).
    pub fn before_park(
        &mut self,
        now: Instant,
        count: u64,
        next_hold: Option<Instant>,
    ) -> Option<Duration> {
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
        let sleep = self
            .tick
            .min(Duration::from_secs_f64(batch(self.tick) / self.rate));
        match next_hold.map(|at| at.saturating_duration_since(now)) {
            // Cut short by a hold: not worth a wake-up under MIN_SLEEP.
            Some(room) if room < sleep => (room >= MIN_SLEEP).then_some(room),
            _ => Some(sleep),
        }
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
        let next = next_hold();
        let sleep = COALESCER.with(|c| {
            c.borrow_mut()
                .get_or_insert_with(|| Coalescer::new(tick, now, count))
                .before_park(now, count, next)
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
                c.before_park(at, first + i, None).is_some()
            })
            .count()
    }

    #[test]
    fn a_steady_low_rate_coalesces_once_a_window_has_shown_it() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        // 100 a second: 2 a tick. The first window (250 ms) does not sleep;
        // the others sleep the whole tick.
        let sleeps = stream(&mut c, t0, 0, 100, 10 * MS);
        assert!((70..=80).contains(&sleeps), "{sleeps}");
        assert_eq!(c.before_park(t0 + 1010 * MS, 101, None), Some(20 * MS));
    }

    #[test]
    fn the_tick_shrinks_as_the_rate_grows() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        // 1000 a second: a fifth of the tick (4 deliveries take 4 ms).
        let step = Duration::from_millis(1);
        for i in 1..=300u32 {
            c.before_park(t0 + step * i, u64::from(i), None);
        }
        let tick = c.before_park(t0 + step * 301, 301, None).unwrap();
        assert!(tick >= 3 * MS && tick <= 5 * MS, "{tick:?}");
    }

    #[test]
    fn a_longer_tick_is_slept_whole_up_to_the_full_tick_rate() {
        // 100 a second under an 80 ms tick: 8 a tick, all of it slept.
        let t0 = Instant::now();
        let mut c = Coalescer::new(80 * MS, t0, 0);
        stream(&mut c, t0, 0, 100, 10 * MS);
        assert_eq!(c.before_park(t0 + 1010 * MS, 101, None), Some(80 * MS));
        // 800 a second: a quarter of it (16 deliveries take 20 ms).
        let mut d = Coalescer::new(80 * MS, t0, 0);
        let step = Duration::from_micros(1250);
        for i in 1..=400u32 {
            d.before_park(t0 + step * i, u64::from(i), None);
        }
        let tick = d.before_park(t0 + step * 401, 401, None).unwrap();
        assert!(tick >= 18 * MS && tick <= 22 * MS, "{tick:?}");
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
        assert_eq!(c.before_park(later, 100, None), None);
        assert_eq!(c.before_park(later + MS, 100, None), None);
    }

    #[test]
    fn a_tick_under_a_millisecond_still_sleeps_without_a_hold() {
        let t0 = Instant::now();
        let tick = Duration::from_micros(900);
        let mut c = Coalescer::new(tick, t0, 0);
        // 1,900 a second (above 2,000 it would not sleep at all).
        let gap = Duration::from_micros(526);
        for i in 1..=600u32 {
            c.before_park(t0 + gap * i, u64::from(i), None);
        }
        assert_eq!(c.before_park(t0 + gap * 601, 601, None), Some(tick));
    }

    #[test]
    fn a_zero_tick_is_off() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::ZERO, t0, 0);
        assert_eq!(stream(&mut c, t0, 0, 100, 10 * MS), 0);
    }

    #[test]
    fn a_sleep_ends_at_the_earliest_held_deadline() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        stream(&mut c, t0, 0, 100, 10 * MS);
        let now = t0 + 1010 * MS;
        assert_eq!(c.before_park(now, 101, Some(now + 7 * MS)), Some(7 * MS));
        // Later than the tick: the tick.
        assert_eq!(c.before_park(now, 102, Some(now + 90 * MS)), Some(20 * MS));
    }

    #[test]
    fn a_hold_due_within_a_millisecond_or_past_parks_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(20 * MS, t0, 0);
        stream(&mut c, t0, 0, 100, 10 * MS);
        let now = t0 + 1010 * MS;
        let soon = now + Duration::from_micros(400);
        assert_eq!(c.before_park(now, 101, Some(soon)), None);
        assert_eq!(c.before_park(now, 102, Some(t0)), None);
    }

    #[test]
    fn hold_guards_count_while_they_live() {
        // The registry is the process's: other tests run beside this one, so
        // only deadlines far from theirs are looked at.
        set_tick(20 * MS);
        let far = Duration::from_secs(3600 * 24 * 365);
        let a = holding_for(far);
        let at = a.0.expect("counted while coalescing is on");
        let count = || holds().get(&at).copied();
        assert_eq!(count(), Some(1));
        let b = HoldGuard(Some(at));
        *holds().entry(at).or_insert(0) += 1;
        assert_eq!(count(), Some(2));
        drop(a);
        assert_eq!(count(), Some(1));
        drop(b);
        assert_eq!(count(), None);
        assert!(
            holding_for(Duration::MAX).0.is_none(),
            "no deadline that far"
        );
    }
}
