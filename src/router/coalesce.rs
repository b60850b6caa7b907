//! Wake-up coalescing at low and moderate rates (`[amqp] coalesce`, 100 ms
//! unless set; `"0s"` turns it off).
//!
//! At a low steady rate every delivery wakes the router's thread on its own,
//! and on a small virtual machine a wake-up costs far more than the work it
//! does: on this project's 2-core machine a thread that sleeps, reads two
//! sockets and writes two spends 105-160 µs of CPU a wake-up with no work of
//! its own, and the router about 300-340 µs, against about 19 µs a delivery
//! once awake (README, Performance: "What a wake-up costs"). So while
//! deliveries come at a rate where a wake-up would find few of them, the
//! thread, about to wait for the next socket event, sleeps first for a
//! tick ([`tick_at`]): deliveries, confirms and timers that come meanwhile
//! wait in the kernel and are handled together after it, one wake-up for
//! all.
//!
//! The tick is the time [`BATCH`] deliveries take to come at
//! [`GATHER_RATE`] deliveries a second or more (16 ms at 250 a second, 4 ms
//! at 1,000: the lateness stays small where the rate is high), and longer
//! below it, where a wake-up is a larger share of each delivery's cost:
//! `BATCH × GATHER_RATE / rate` deliveries a tick (10 at 100 a second), up
//! to `coalesce`. The rate is counted over [`WINDOW`], except that a sleep
//! which gathers deliveries at [`GATHER_RATE`] or more, and at more than
//! [`ATTACK`] times the rate counted, sets it at once: a burst after a
//! quiet spell gets short ticks after one sleep. And the first tick after
//! a quiet spell is at most [`FIRST_TICK`], each one after it at most twice
//! the one before: the rate a quiet spell leaves counted says nothing of
//! the burst that ends it.
//!
//! It never sleeps at full rate (more than [`MAX_RATE`] deliveries a
//! second: the thread then parks only while it waits for the broker), below
//! one delivery per tick (a sleep would add a wake-up rather than save
//! one), nor idle: a sleep follows only a wake-up that handled a delivery,
//! and the park after it lasts until the next socket event.
//!
//! A sleep never runs past the earliest deadline of the deliveries the
//! router holds itself (the cascade's last fraction, [`holding_for`]): a
//! message whose last hop is a hold leaves on time. One that arrives due
//! from a bucket may wait up to one tick more, and so may one read from the
//! ingress (its delay counts from then).

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
/// At and above this rate of deliveries a second a tick gathers [`BATCH`]
/// deliveries; below it, more in proportion (see [`tick_at`]).
pub const GATHER_RATE: f64 = 250.0;

/// The tick at `rate` deliveries a second, at most `cap`: the time
/// `BATCH × max(1, GATHER_RATE / rate)` deliveries take to come. At 100 a
/// second that is 10 deliveries in 100 ms, at 150 about 7 in 44 ms, at 250
/// or more 4 (16 ms at 250, 4 ms at 1,000). `rate` must be positive.
pub fn tick_at(rate: f64, cap: Duration) -> Duration {
    let gather = BATCH * (GATHER_RATE / rate).max(1.0);
    Duration::try_from_secs_f64(gather / rate).map_or(cap, |t| t.min(cap))
}

/// The longest first tick after a quiet spell (no sleep for a [`WINDOW`]),
/// while the rate counted may be stale: the ticks after it double up to
/// the one the rate asks for.
pub const FIRST_TICK: Duration = Duration::from_millis(20);

/// A sleep that gathers deliveries at more than this many times the rate
/// seen sets the rate at once (see [`Coalescer::before_park`]).
pub const ATTACK: f64 = 1.5;

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
    /// When the last sleep began and the count then, until the next park.
    slept: Option<(Instant, u64)>,
    /// When the last sleep ended (or will) and the tick it was sized to.
    last_sleep: Option<(Instant, Duration)>,
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
            slept: None,
            last_sleep: None,
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
        // A sleep that gathered far more than the rate said, at a rate where
        // ticks are short: the rate rose (a burst after a quiet spell).
        // Count it from the sleep's start at once, rather than sleep long
        // ticks until the window shows it. Below [`GATHER_RATE`] the ticks
        // are long anyway, and a stall's backlog is no reason to shorten them.
        if let Some((since, base)) = self.slept.take() {
            let took = now.saturating_duration_since(since).as_secs_f64();
            let seen = count.saturating_sub(base) as f64;
            let rate = if took > 0.0 { seen / took } else { 0.0 };
            if rate > ATTACK * self.rate && rate >= GATHER_RATE {
                self.rate = rate;
                self.window_start = since;
                self.window_base = base;
            }
        }
        let fresh = count != self.last_seen;
        self.last_seen = count;
        // At least one delivery a tick on average, and below full rate.
        let worth = self.rate * self.tick.as_secs_f64() >= 1.0 && self.rate <= MAX_RATE;
        if !(fresh && worth) {
            return None;
        }
        // After a quiet spell the rate counted is stale: the first tick is
        // short, and each one after it at most twice the one before.
        let sleep = match self.last_sleep {
            Some((ended, before)) if now.saturating_duration_since(ended) < WINDOW => {
                tick_at(self.rate, self.tick).min(before * 2)
            }
            _ => tick_at(self.rate, self.tick).min(FIRST_TICK),
        };
        let sized = sleep;
        let sleep = match next_hold.map(|at| at.saturating_duration_since(now)) {
            // Cut short by a hold: not worth a wake-up under MIN_SLEEP.
            Some(room) if room < sleep => (room >= MIN_SLEEP).then_some(room),
            _ => Some(sleep),
        };
        if let Some(d) = sleep {
            self.slept = Some((now, count));
            self.last_sleep = Some((now + d, sized));
        }
        sleep
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
    fn a_long_tick_is_slept_whole_at_low_rates_only() {
        // 100 a second under the default 100 ms: 10 a tick, all of it slept.
        let t0 = Instant::now();
        let mut c = Coalescer::new(100 * MS, t0, 0);
        stream(&mut c, t0, 0, 100, 10 * MS);
        assert_eq!(c.before_park(t0 + 1010 * MS, 101, None), Some(100 * MS));
        // 800 a second: the time 4 deliveries take (5 ms), as under 20 ms.
        for cap in [20 * MS, 100 * MS] {
            let mut d = Coalescer::new(cap, t0, 0);
            let step = Duration::from_micros(1250);
            for i in 1..=400u32 {
                d.before_park(t0 + step * i, u64::from(i), None);
            }
            let tick = d.before_park(t0 + step * 401, 401, None).unwrap();
            assert!(tick >= 4 * MS && tick <= 6 * MS, "{cap:?}: {tick:?}");
        }
    }

    #[test]
    fn the_tick_grows_as_the_rate_falls_below_the_gather_rate() {
        let ms = |rate: f64| tick_at(rate, Duration::from_secs(1)).as_secs_f64() * 1e3;
        // 4 deliveries at 250 a second or more.
        assert!((ms(250.0) - 16.0).abs() < 0.01);
        assert!((ms(1000.0) - 4.0).abs() < 0.01);
        // Below: more deliveries a tick as the rate falls.
        assert!((ms(200.0) - 25.0).abs() < 0.01);
        assert!((ms(100.0) - 100.0).abs() < 0.01);
        assert!((ms(50.0) - 400.0).abs() < 0.01);
        // Never past the cap; a 20 ms cap keeps the old default's ticks.
        assert_eq!(tick_at(50.0, 100 * MS), 100 * MS);
        assert_eq!(tick_at(100.0, 20 * MS), 20 * MS);
        assert!((tick_at(400.0, 20 * MS).as_secs_f64() * 1e3 - 10.0).abs() < 0.01);
        // Continuous, and never longer at a higher rate.
        let mut last = f64::INFINITY;
        for r in 10..=3000 {
            let t = ms(f64::from(r));
            assert!(t <= last, "{r}");
            last = t;
        }
        // Absurd rates fall back on the cap rather than panic.
        assert_eq!(tick_at(f64::MIN_POSITIVE, 100 * MS), 100 * MS);
        assert_eq!(tick_at(f64::INFINITY, 100 * MS), Duration::ZERO);
    }

    #[test]
    fn a_burst_after_a_slow_spell_shortens_the_tick_after_one_sleep() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(100 * MS, t0, 0);
        // 20 a second for a second: the window says 20, the tick is 100 ms.
        let mut n = 0;
        let mut at = t0;
        for _ in 0..20 {
            at += 50 * MS;
            n += 1;
            c.before_park(at, n, None);
        }
        at += 50 * MS;
        n += 1;
        assert_eq!(c.before_park(at, n, None), Some(100 * MS));
        // Then 500 a second: the 100 ms sleep gathers 50, and the next tick
        // is the time 4 take (8 ms), not another 100 ms.
        at += 100 * MS;
        n += 50;
        let tick = c.before_park(at, n, None).unwrap();
        assert!(tick >= 7 * MS && tick <= 9 * MS, "{tick:?}");
        // A steady rate's usual spread does not move it (10 a tick at 100 a
        // second, then 13), nor a backlog below the gather rate (20).
        let mut d = Coalescer::new(100 * MS, t0, 0);
        stream(&mut d, t0, 0, 100, 10 * MS);
        let now = t0 + 1010 * MS;
        assert_eq!(d.before_park(now, 101, None), Some(100 * MS));
        assert_eq!(d.before_park(now + 100 * MS, 114, None), Some(100 * MS));
        assert_eq!(d.before_park(now + 200 * MS, 134, None), Some(100 * MS));
    }

    #[test]
    fn after_a_quiet_spell_the_ticks_start_short_and_double() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(100 * MS, t0, 0);
        // 50 a second for a second (100 ms ticks).
        stream(&mut c, t0, 0, 50, 20 * MS);
        let mut at = t0 + 1020 * MS;
        assert_eq!(c.before_park(at, 51, None), Some(100 * MS));
        // A second with nothing to wake for, then 15 at once and 50 a
        // second after them: the window counted over the quiet second says
        // about 12 a second (a 100 ms tick), stale; the ticks start at 20 ms
        // and double.
        at += 1000 * MS;
        let mut n = 66;
        let mut got = vec![c.before_park(at, n, None)];
        for _ in 0..4 {
            at += 20 * MS;
            n += 1;
            got.push(c.before_park(at, n, None));
        }
        let want: Vec<_> = [20, 40, 80, 100, 100]
            .iter()
            .map(|ms: &u32| Some(*ms * MS))
            .collect();
        assert_eq!(got, want);
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
