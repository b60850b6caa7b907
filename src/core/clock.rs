//! Now, as a decision reads it: one reading of the wall clock, in
//! nanoseconds since the Unix epoch, seen in whole milliseconds two ways.
//! Deadlines are stamped from it rounded up and compared with it rounded
//! down, so a message is never delivered even a fraction of a millisecond
//! early. How long a message waits is never derived from the difference of
//! the two: a requested delay is placed as it was asked for.

/// One reading of the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Clock {
    unix_nanos: u64,
}

const NANOS_PER_MS: u64 = 1_000_000;

impl Clock {
    /// The clock at `unix_nanos` nanoseconds since the Unix epoch.
    pub const fn from_unix_nanos(unix_nanos: u64) -> Self {
        Self { unix_nanos }
    }

    /// The clock at exactly `ms` milliseconds since the Unix epoch (no
    /// fraction: both readings agree). Negative values read as the epoch.
    pub const fn at_ms(ms: i64) -> Self {
        let ms = if ms < 0 { 0 } else { ms as u64 };
        Self::from_unix_nanos(ms.saturating_mul(NANOS_PER_MS))
    }

    /// Nanoseconds since the Unix epoch.
    pub const fn unix_nanos(self) -> u64 {
        self.unix_nanos
    }

    /// Milliseconds rounded down: a deadline compared with it is never
    /// reached early.
    pub const fn down_ms(self) -> i64 {
        (self.unix_nanos / NANOS_PER_MS) as i64
    }

    /// Milliseconds rounded up: deadlines are stamped from it, so a message
    /// read at 1000.9 ms with a 5 ms delay is due at 1006, not 1005.
    pub const fn up_ms(self) -> i64 {
        self.unix_nanos.div_ceil(NANOS_PER_MS) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_millisecond_reads_the_same_both_ways() {
        let c = Clock::at_ms(1_000);
        assert_eq!((c.down_ms(), c.up_ms()), (1_000, 1_000));
    }

    #[test]
    fn a_fraction_rounds_down_to_compare_and_up_to_stamp() {
        let c = Clock::from_unix_nanos(1_000_000_001);
        assert_eq!((c.down_ms(), c.up_ms()), (1_000, 1_001));
        assert_eq!(Clock::at_ms(-5).down_ms(), 0);
    }
}
