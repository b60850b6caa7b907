//! Retry policies: which queue's rejected messages are retried, after how
//! long, and how many times before they are parked. Pure.

use crate::core::contract::{integer, type_name};
use crate::core::glob::glob_match;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use std::borrow::Cow;
use std::time::Duration;

/// Out, on retried and delivered messages: failures so far (the router counts them).
pub const ATTEMPTS: &str = "x-delay-router-attempts";
/// Out: when the first failure reached the router (ms since the Unix epoch).
pub const FIRST_FAILURE: &str = "x-delay-router-first-failure";
/// Out: when the latest failure reached the router (ms since the Unix epoch).
pub const LAST_FAILURE: &str = "x-delay-router-last-failure";
/// Out, on parked retries: the queue whose consumer rejected the message.
pub const SOURCE_QUEUE: &str = "x-delay-router-source-queue";

/// Every retry bookkeeping header; replay removes them for a fresh start.
pub const RETRY_HEADERS: [&str; 4] = [ATTEMPTS, FIRST_FAILURE, LAST_FAILURE, SOURCE_QUEUE];

/// One `[[policy]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Glob over the source queue name: `*` any run of characters, `?` one.
    pub queue: String,
    /// Delay before the second delivery.
    pub initial: Duration,
    /// Each next delay is the previous one times this (≥ 1).
    pub multiplier: f64,
    /// Cap on one delay.
    pub max_delay: Duration,
    /// Fraction of each delay drawn at random, in `[0, 1]`: the delay is
    /// uniform in `[d × (1 − jitter), d]`, never longer than the policy's `d`.
    pub jitter: f64,
    /// Deliveries to the consumer, the first included; the last failure parks.
    pub max_attempts: u32,
}

impl Policy {
    /// The delay after failure number `failure` (1 = the first delivery
    /// failed); `unit` is a random number in `[0, 1)`.
    pub fn delay(&self, failure: u32, unit: f64) -> Duration {
        let exp = i32::try_from(failure.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exp);
        let capped = base.min(self.max_delay.as_secs_f64());
        let d = capped * (1.0 - self.jitter * unit.clamp(0.0, 1.0));
        // Whole milliseconds, to the nearest: 1 s × 1.1 is 1,100 ms, not a
        // hair over it (which would wait in the rung above 1,100 ms).
        Duration::from_millis((d.max(0.0) * 1_000.0).round() as u64)
            .max(Duration::from_millis(1))
            .min(self.max_delay)
    }

    /// Whether this failure is the last one allowed.
    pub fn exhausted(&self, failure: u32) -> bool {
        failure >= self.max_attempts
    }
}

/// The first policy whose glob matches `queue`.
pub fn find<'a>(policies: &'a [Policy], queue: &str) -> Option<&'a Policy> {
    policies.iter().find(|p| glob_match(&p.queue, queue))
}

/// The newest `x-death` entry, when it is a rejection: where the message was
/// rejected and how often the broker has seen it rejected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub queue: String,
    pub count: i64,
}

/// Why an `x-death` header cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeathError {
    #[error("x-death is a {0}, not an array of tables")]
    NotAnArray(&'static str),
    #[error("x-death entry {0} is not a table")]
    EntryNotATable(usize),
    #[error("x-death entry {0} has no queue name")]
    NoQueue(usize),
}

fn text(v: Option<&AMQPValue>) -> Option<String> {
    match v? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// Reads the newest `x-death` entry if its reason is `rejected`. RabbitMQ keeps
/// the entry it updated last at the front.
pub fn newest_rejection(headers: &FieldTable) -> Result<Option<Rejection>, DeathError> {
    let entries = match headers.inner().get("x-death") {
        None => return Ok(None),
        Some(AMQPValue::FieldArray(a)) => a.as_slice(),
        Some(other) => return Err(DeathError::NotAnArray(type_name(other))),
    };
    let Some(first) = entries.first() else {
        return Ok(None);
    };
    let AMQPValue::FieldTable(entry) = first else {
        return Err(DeathError::EntryNotATable(0));
    };
    if text(entry.inner().get("reason")).as_deref() != Some("rejected") {
        return Ok(None);
    }
    let queue = text(entry.inner().get("queue")).ok_or(DeathError::NoQueue(0))?;
    let count = integer(entry, "count").unwrap_or(1);
    Ok(Some(Rejection { queue, count }))
}

/// Failures counted so far by the router's own header.
pub fn attempts(headers: &FieldTable) -> u32 {
    integer(headers, ATTEMPTS)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

/// Records failure number `failures` on the message itself: these headers stay
/// on delivery, so the next failure counts on from them.
pub fn record_failure(
    p: &BasicProperties,
    failures: u32,
    now_ms: i64,
    queue: Option<&str>,
) -> BasicProperties {
    let mut h = p.headers().clone().unwrap_or_default();
    h.insert(ATTEMPTS.into(), AMQPValue::LongLongInt(i64::from(failures)));
    if integer(&h, FIRST_FAILURE).is_none() {
        h.insert(FIRST_FAILURE.into(), AMQPValue::LongLongInt(now_ms));
    }
    h.insert(LAST_FAILURE.into(), AMQPValue::LongLongInt(now_ms));
    if let Some(queue) = queue {
        h.insert(SOURCE_QUEUE.into(), AMQPValue::LongString(queue.into()));
    }
    p.clone().with_headers(h)
}

/// The explicit path counts a retry when the message carries the attempts
/// header (the client API sets it); plain delayed messages stay untouched.
pub fn count_attempt(p: &BasicProperties, now_ms: i64) -> Cow<'_, BasicProperties> {
    match p.headers() {
        Some(h) if h.contains_key(ATTEMPTS) => Cow::Owned(record_failure(
            p,
            attempts(h).saturating_add(1),
            now_ms,
            None,
        )),
        _ => Cow::Borrowed(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldArray;
    use proptest::prelude::*;

    fn policy() -> Policy {
        Policy {
            queue: "orders.*".into(),
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(5),
            jitter: 0.0,
            max_attempts: 4,
        }
    }

    #[test]
    fn delays_grow_by_the_multiplier_up_to_the_cap() {
        let p = policy();
        let d: Vec<_> = (1..=5).map(|f| p.delay(f, 0.5).as_millis()).collect();
        assert_eq!(d, [1000, 2000, 4000, 5000, 5000]);
        assert!(!p.exhausted(3));
        assert!(p.exhausted(4));
    }

    #[test]
    fn the_first_matching_policy_wins() {
        let ps = [
            Policy {
                queue: "a".into(),
                ..policy()
            },
            Policy {
                queue: "*".into(),
                ..policy()
            },
        ];
        assert_eq!(find(&ps, "a").unwrap().queue, "a");
        assert_eq!(find(&ps, "b").unwrap().queue, "*");
    }

    fn death(reason: &str, queue: &str, count: i64) -> AMQPValue {
        let mut t = FieldTable::default();
        t.insert("reason".into(), AMQPValue::LongString(reason.into()));
        t.insert("queue".into(), AMQPValue::LongString(queue.into()));
        t.insert("count".into(), AMQPValue::LongLongInt(count));
        AMQPValue::FieldTable(t)
    }

    #[test]
    fn only_a_newest_rejection_counts() {
        let mut h = FieldTable::default();
        assert_eq!(newest_rejection(&h), Ok(None));
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                death("rejected", "orders.eu", 2),
                death("expired", "b", 1),
            ])),
        );
        assert_eq!(
            newest_rejection(&h),
            Ok(Some(Rejection {
                queue: "orders.eu".into(),
                count: 2
            }))
        );
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                death("expired", "b", 1),
                death("rejected", "a", 1),
            ])),
        );
        assert_eq!(newest_rejection(&h), Ok(None));
        h.insert("x-death".into(), AMQPValue::LongInt(3));
        assert_eq!(
            newest_rejection(&h),
            Err(DeathError::NotAnArray("signed integer"))
        );
        h.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongInt(1)])),
        );
        assert_eq!(newest_rejection(&h), Err(DeathError::EntryNotATable(0)));
    }

    proptest! {
        #[test]
        fn jitter_stays_within_its_bounds(failure in 1u32..20, jitter in 0.0f64..=1.0, unit in 0.0f64..1.0) {
            let p = Policy { jitter, ..policy() };
            let exact = Policy { jitter: 0.0, ..policy() }.delay(failure, 0.0).as_secs_f64();
            let d = p.delay(failure, unit).as_secs_f64();
            prop_assert!(d <= exact + 1e-9);
            // Rounded to the nearest millisecond.
            prop_assert!(d >= (exact * (1.0 - jitter) - 0.0005 - 1e-9).max(0.001 - 1e-9));
        }
    }
}
