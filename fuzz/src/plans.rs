//! The plans every input is run through: three ladders, each under the three
//! placement strategies.

use delay_router::core::decision::Rules;
use delay_router::core::ladder::Ladder;
use delay_router::core::retry::Policy;
use lapin::types::ShortString;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

/// The clock of tests/fuzz_core.rs (2027-01-15), milliseconds since the Unix epoch.
pub const NOW: i64 = 1_800_000_000_000;

/// The AMQP user the router publishes as.
pub const ROUTER_USER: &str = "guest";

pub use delay_router::testkit::rules::STRATEGIES;

/// One set of rules and a short name for panic messages.
#[derive(Debug)]
pub struct Named {
    pub name: String,
    pub rules: Rules,
    /// The bucket queues the plan declares, with their TTL.
    pub buckets: HashMap<ShortString, Duration>,
}

/// A prefix of the longest length config accepts (`MAX_PREFIX_LEN`), so
/// bucket names come close to AMQP's 255-byte limit.
pub fn long_prefix() -> String {
    let mut p = "o".repeat(delay_router::core::topology::MAX_PREFIX_LEN - 2);
    p.push_str("_:");
    p
}

fn ladders() -> Vec<(&'static str, String, Ladder, Vec<Policy>)> {
    let fuzz_core = delay_router::testkit::rules::any_queue_policy();
    // buckets.toml's ladder and its commented example policy.
    let shipped = Policy {
        queue: "orders.*".into(),
        initial: Duration::from_secs(1),
        multiplier: 2.0,
        max_delay: Duration::from_secs(3600),
        jitter: 0.1,
        max_attempts: 5,
    };
    // Extremes config::validate_policy still accepts.
    let extreme = vec![
        Policy {
            queue: "a?c*".into(),
            initial: Duration::from_nanos(1),
            multiplier: 1e300,
            max_delay: delay_router::core::contract::MAX_DELAY,
            jitter: 1.0,
            max_attempts: u32::MAX,
        },
        Policy {
            queue: "*".into(),
            initial: Duration::from_millis(1),
            multiplier: 1.0,
            max_delay: Duration::from_millis(1),
            jitter: 0.0,
            max_attempts: 1,
        },
    ];
    vec![
        (
            "fuzz_core",
            "fz".to_string(),
            Ladder::from_labels(&["1s", "2s", "5s"]).unwrap(),
            vec![fuzz_core],
        ),
        (
            "shipped",
            "delay".to_string(),
            Ladder::from_labels(&["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"])
                .unwrap(),
            vec![shipped],
        ),
        (
            // Rungs below HOLD_BELOW, an odd millisecond count, the 49-day TTL limit.
            "odd",
            long_prefix(),
            Ladder::from_labels(&["1ms", "7ms", "300ms", "1001ms", "49days"]).unwrap(),
            extreme,
        ),
    ]
}

/// Every plan, built once.
pub fn plans() -> &'static [Named] {
    static PLANS: OnceLock<Vec<Named>> = OnceLock::new();
    PLANS.get_or_init(|| {
        let mut out = Vec::new();
        for (name, prefix, ladder, policies) in ladders() {
            for s in STRATEGIES {
                let rules =
                    Rules::new(&ladder, s, &prefix, ROUTER_USER).with_policies(policies.clone());
                let buckets = rules
                    .names
                    .bucket_queues(rules.strategy, &rules.ladder, rules.bucket_shards())
                    .into_iter()
                    .map(|(q, r)| (q, r.ttl))
                    .collect();
                out.push(Named {
                    name: format!("{name}/{s}"),
                    rules,
                    buckets,
                });
            }
        }
        out
    })
}
