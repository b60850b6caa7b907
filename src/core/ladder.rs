//! The ladder: the fixed-TTL bucket rungs a router places messages on.
//!
//! Every bucket queue holds messages of a single TTL, so RabbitMQ's head-only
//! expiry never makes one message wait behind another.

use std::time::Duration;

/// RabbitMQ accepts `x-message-ttl` values up to 2^32 - 1 milliseconds.
pub const MAX_TTL: Duration = Duration::from_millis(u32::MAX as u64);

/// One rung of the ladder: a bucket TTL and the name it was written with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rung {
    /// The TTL as written in the configuration, whitespace removed (`30s`, `1m30s`).
    /// It names the bucket queue: `<prefix>.bucket.<label>`.
    pub label: String,
    /// The bucket's `x-message-ttl`.
    pub ttl: Duration,
}

/// Why a list of rungs is not a ladder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LadderError {
    #[error("the ladder is empty: declare at least one [[bucket]] with a ttl")]
    Empty,
    #[error("bucket ttl \"{label}\" is zero: every rung must be at least 1ms")]
    Zero { label: String },
    #[error("bucket ttl \"{label}\" is not a whole number of milliseconds")]
    SubMillisecond { label: String },
    #[error(
        "bucket ttl \"{label}\" exceeds RabbitMQ's limit for x-message-ttl (4294967295ms, about 49 days)"
    )]
    TooLong { label: String },
    #[error(
        "bucket ttls \"{first}\" and \"{second}\" are the same duration: each rung must be distinct"
    )]
    Duplicate { first: String, second: String },
}

/// A validated ladder: at least one rung, sorted ascending, distinct, each
/// a whole number of milliseconds in `1ms..=MAX_TTL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    rungs: Vec<Rung>,
}

impl Ladder {
    /// Validates and sorts the rungs.
    pub fn new(mut rungs: Vec<Rung>) -> Result<Self, LadderError> {
        if rungs.is_empty() {
            return Err(LadderError::Empty);
        }
        for rung in &rungs {
            if rung.ttl.is_zero() {
                return Err(LadderError::Zero {
                    label: rung.label.clone(),
                });
            }
            if rung.ttl.subsec_nanos() % 1_000_000 != 0 {
                return Err(LadderError::SubMillisecond {
                    label: rung.label.clone(),
                });
            }
            if rung.ttl > MAX_TTL {
                return Err(LadderError::TooLong {
                    label: rung.label.clone(),
                });
            }
        }
        rungs.sort_by_key(|r| r.ttl);
        if let Some(pair) = rungs.windows(2).find(|w| w[0].ttl == w[1].ttl) {
            return Err(LadderError::Duplicate {
                first: pair[0].label.clone(),
                second: pair[1].label.clone(),
            });
        }
        Ok(Self { rungs })
    }

    /// Parses humantime labels (`["1s", "2s", "5s"]`) into a ladder.
    pub fn from_labels<S: AsRef<str>>(labels: &[S]) -> Result<Self, String> {
        let rungs = labels
            .iter()
            .map(|l| parse_rung(l.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(rungs).map_err(|e| e.to_string())
    }

    /// The rungs, shortest first.
    pub fn rungs(&self) -> &[Rung] {
        &self.rungs
    }

    /// The shortest rung.
    pub fn smallest(&self) -> &Rung {
        &self.rungs[0]
    }

    /// The longest rung.
    pub fn top(&self) -> &Rung {
        &self.rungs[self.rungs.len() - 1]
    }

    /// Index of the smallest rung whose TTL is at least `delay`, or the top
    /// rung when the delay is longer than every rung.
    pub fn round_up(&self, delay: Duration) -> usize {
        self.rungs
            .partition_point(|r| r.ttl < delay)
            .min(self.rungs.len() - 1)
    }

    /// Index of the largest rung whose TTL is at most `delay`, if any.
    pub fn round_down(&self, delay: Duration) -> Option<usize> {
        self.rungs
            .partition_point(|r| r.ttl <= delay)
            .checked_sub(1)
    }
}

/// Parses one rung label as written in the configuration.
pub fn parse_rung(written: &str) -> Result<Rung, String> {
    let label: String = written.split_whitespace().collect();
    let ttl = humantime::parse_duration(written.trim())
        .map_err(|e| format!("\"{written}\" is not a duration ({e})"))?;
    Ok(Rung { label, ttl })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(labels: &[&str]) -> Ladder {
        Ladder::from_labels(labels).unwrap()
    }

    #[test]
    fn rungs_are_sorted_and_labels_keep_the_written_form() {
        let l = ladder(&["5m", "30s", "1m 30s"]);
        let labels: Vec<_> = l.rungs().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["30s", "1m30s", "5m"]);
        assert_eq!(l.smallest().ttl, Duration::from_secs(30));
        assert_eq!(l.top().ttl, Duration::from_secs(300));
    }

    #[test]
    fn invalid_ladders_are_refused_with_the_offending_value() {
        assert_eq!(Ladder::new(vec![]), Err(LadderError::Empty));
        let e = Ladder::from_labels(&["0s"]).unwrap_err();
        assert!(e.contains("\"0s\" is zero"), "{e}");
        let e = Ladder::from_labels(&["60s", "1m"]).unwrap_err();
        assert!(e.contains("\"60s\" and \"1m\""), "{e}");
        let e = Ladder::from_labels(&["50days"]).unwrap_err();
        assert!(e.contains("exceeds RabbitMQ's limit"), "{e}");
        let e = Ladder::from_labels(&["1500us"]).unwrap_err();
        assert!(e.contains("whole number of milliseconds"), "{e}");
        let e = Ladder::from_labels(&["soon"]).unwrap_err();
        assert!(e.contains("\"soon\" is not a duration"), "{e}");
    }

    #[test]
    fn round_up_picks_the_smallest_rung_at_least_the_delay() {
        let l = ladder(&["1s", "2s", "5s"]);
        assert_eq!(l.round_up(Duration::from_millis(1)), 0);
        assert_eq!(l.round_up(Duration::from_millis(1000)), 0);
        assert_eq!(l.round_up(Duration::from_millis(1001)), 1);
        assert_eq!(l.round_up(Duration::from_millis(5000)), 2);
        assert_eq!(l.round_up(Duration::from_secs(60)), 2);
    }

    #[test]
    fn round_down_picks_the_largest_rung_at_most_the_delay() {
        let l = ladder(&["1s", "2s", "5s"]);
        assert_eq!(l.round_down(Duration::from_millis(999)), None);
        assert_eq!(l.round_down(Duration::from_millis(1000)), Some(0));
        assert_eq!(l.round_down(Duration::from_millis(4999)), Some(1));
        assert_eq!(l.round_down(Duration::from_secs(60)), Some(2));
    }
}
