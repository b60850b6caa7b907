//! The design card's rule, proven on the production decision: a message
//! waits in the smallest bucket at least as long as the delay it asked for
//! (round-up, priority), or begins with the largest rung it fills (cascade),
//! whatever the sub-millisecond phase of the clock that read it.

use super::*;
use crate::core::contract::ORIGINAL_EXCHANGE;
use crate::core::ladder::Ladder;
use crate::core::placement::{HOLD_BELOW, ROUND_UP_WITHIN};
use crate::core::retry::Policy;
use crate::testkit::props::{props, s};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use proptest::prelude::*;

/// Rungs from 250 ms to a few hours, some a millisecond apart.
fn ladders() -> impl Strategy<Value = Ladder> {
    prop::collection::btree_set(250u64..20_000_000, 1..8).prop_map(|ms| {
        let labels: Vec<String> = ms.iter().map(|m| format!("{m}ms")).collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        Ladder::from_labels(&labels).unwrap()
    })
}

/// A reading of the clock anywhere within a millisecond.
fn clocks() -> impl Strategy<Value = Clock> {
    (1_700_000_000_000u64..1_900_000_000_000, 0u64..1_000_000)
        .prop_map(|(ms, phase)| Clock::from_unix_nanos(ms * 1_000_000 + phase))
}

fn ingress(rules: &Rules, p: &BasicProperties, clock: Clock) -> Action {
    let cx = Context::at(clock);
    let d = Delivery {
        source: Source::Ingress,
        exchange: "t.router",
        routing_key: &"eu".into(),
        properties: Cow::Borrowed(p),
        body: b"body",
    };
    rules.decide(d, &cx).action
}

/// The rung a delay must wait in under `strategy` on the strategy's own
/// ladder; `None` where it is timed by the router or delivered at once.
fn rule(strategy: PlacementStrategy, ladder: &Ladder, delay: Duration) -> Option<Duration> {
    let rungs = ladder.rungs();
    match strategy {
        PlacementStrategy::RoundUp | PlacementStrategy::Priority => Some(
            rungs
                .iter()
                .find(|r| r.ttl >= delay)
                .unwrap_or(rungs.last().unwrap())
                .ttl,
        ),
        PlacementStrategy::Cascade if delay < HOLD_BELOW => None,
        PlacementStrategy::Cascade => rungs
            .iter()
            .rev()
            .find(|r| r.ttl <= delay + ROUND_UP_WITHIN)
            .map(|r| r.ttl),
    }
}

fn waits_in(action: &Action) -> Option<Duration> {
    match action {
        Action::Wait { ttl, .. } => Some(*ttl),
        Action::Deliver { .. } => None,
        other => panic!("neither placed nor held: {other:?}"),
    }
}

/// Delays equal to, just under and just over each rung.
fn around(ladder: &Ladder) -> Vec<Duration> {
    let ms = Duration::from_millis(1);
    ladder
        .rungs()
        .iter()
        .flat_map(|r| [r.ttl - ms, r.ttl, r.ttl + ms])
        .collect()
}

proptest! {
    #[test]
    fn a_requested_delay_waits_in_the_rung_the_rule_gives(ladder in ladders(), clock in clocks(), as_text: bool) {
        for rules in crate::testkit::rules::every_strategy(&ladder, "t", "guest", &[]) {
            for delay in around(&rules.ladder) {
                let ms = delay.as_millis() as i64;
                let value = if as_text {
                    AMQPValue::LongString(LongString::from(ms.to_string()))
                } else {
                    AMQPValue::LongLongInt(ms)
                };
                let p = props(&[("x-requested-delay", value), (ORIGINAL_EXCHANGE, s("orders"))]);
                let action = ingress(&rules, &p, clock);
                prop_assert_eq!(
                    waits_in(&action),
                    rule(rules.strategy, &rules.ladder, delay),
                    "{:?}, delay {:?}, clock {:?}", rules.strategy, delay, clock
                );
            }
        }
    }

    #[test]
    fn an_x_deliver_at_one_rung_ahead_waits_in_that_rung(ladder in ladders(), clock in clocks()) {
        for rules in crate::testkit::rules::every_strategy(&ladder, "t", "guest", &[]) {
            for rung in rules.ladder.rungs() {
                let at = clock.down_ms() + rung.ttl.as_millis() as i64;
                let p = props(&[("x-deliver-at", AMQPValue::LongLongInt(at)), (ORIGINAL_EXCHANGE, s("orders"))]);
                prop_assert_eq!(
                    waits_in(&ingress(&rules, &p, clock)),
                    rule(rules.strategy, &rules.ladder, rung.ttl),
                    "{:?}, rung {}, clock {:?}", rules.strategy, rung.label, clock
                );
            }
        }
    }

    #[test]
    fn a_retry_waits_in_the_rung_its_policy_gives(ladder in ladders(), clock in clocks(), failures in 1u32..5) {
        for rules in crate::testkit::rules::every_strategy(&ladder, "t", "guest", &[]) {
            for delay in around(&rules.ladder) {
                // A policy whose delay for this attempt is exactly `delay`.
                let policy = Policy {
                    queue: "work".into(),
                    initial: delay / 2u32.pow(failures - 1),
                    multiplier: 2.0,
                    max_delay: Duration::from_secs(1 << 40),
                    jitter: 0.0,
                    max_attempts: u32::MAX,
                };
                if policy.delay(failures, 0.0) != delay {
                    continue;
                }
                let rules = rules.clone().with_policies(vec![policy]);
                let p = rejected_by("work", failures - 1);
                prop_assert_eq!(
                    waits_in(&ingress(&rules, &p, clock)),
                    rule(rules.strategy, &rules.ladder, delay),
                    "{:?}, delay {:?}, failure {}, clock {:?}", rules.strategy, delay, failures, clock
                );
            }
        }
    }
}

/// A message the consumer of `queue` rejected, after `earlier` failures
/// the router counted before.
fn rejected_by(queue: &str, earlier: u32) -> BasicProperties {
    let mut death = FieldTable::default();
    death.insert("reason".into(), s("rejected"));
    death.insert("queue".into(), s(queue));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    death.insert("exchange".into(), s(""));
    let mut headers = vec![(
        "x-death",
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
    )];
    if earlier > 0 {
        headers.push((
            crate::core::retry::ATTEMPTS,
            AMQPValue::LongLongInt(i64::from(earlier)),
        ));
    }
    props(&headers)
}

#[test]
fn a_delay_equal_to_a_rung_waits_in_that_rung_under_round_up() {
    let ladder = Ladder::from_labels(&["1s", "2s", "4s", "8s"]).unwrap();
    let rules = Rules::new(&ladder, PlacementStrategy::RoundUp, "t", "guest");
    // Read at 0.9 ms past a millisecond: stamped one later than compared.
    let clock = Clock::from_unix_nanos(1_800_000_000_000_900_000);
    for ms in [1_000, 2_000, 4_000] {
        let p = props(&[
            ("x-requested-delay", AMQPValue::LongInt(ms)),
            (ORIGINAL_EXCHANGE, s("orders")),
        ]);
        assert_eq!(
            waits_in(&ingress(&rules, &p, clock)),
            Some(Duration::from_millis(ms as u64))
        );
    }
}
