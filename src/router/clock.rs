//! The router's clock, in milliseconds since the Unix epoch. Deadlines are
//! stamped rounded up and compared rounded down, so a message is never
//! delivered even a fraction of a millisecond early.

use crate::core::clock::Clock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, as a decision reads it.
pub fn now() -> Clock {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Clock::from_unix_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Now, rounded down: a deadline compared with it is never reached early.
pub fn now_ms() -> i64 {
    epoch_ms(false)
}

/// Now, rounded up: deadlines are stamped from it, so a message received at
/// 1000.9 ms with a 5 ms delay is due at 1006, not 1005.
pub fn stamp_ms() -> i64 {
    epoch_ms(true)
}

fn epoch_ms(up: bool) -> i64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let ms = if up {
        nanos.div_ceil(1_000_000)
    } else {
        nanos / 1_000_000
    };
    i64::try_from(ms).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_never_behind_the_clock() {
        let (down, up) = (now_ms(), stamp_ms());
        assert!(up >= down && up - down <= 2, "{down} {up}");
    }
}
