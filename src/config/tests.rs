//! Unit tests of the configuration.

use super::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const SHIPPED: &str = include_str!("../../buckets.toml");

#[test]
fn shipped_file_loads_with_the_documented_ladder() {
    let c = Config::from_toml(SHIPPED).unwrap();
    let labels: Vec<_> = c.ladder.rungs().iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        ["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"]
    );
    assert_eq!(c.prefix, "delay");
    assert_eq!(c.strategy, PlacementStrategy::Cascade);
    assert_eq!(
        c.transit_format,
        crate::core::envelope::TransitFormat::Compact
    );
    assert_eq!((c.prefetch, c.inflight_bytes), (500, 64 << 20));
    assert_eq!(c.url.to_string(), "amqp://guest:***@127.0.0.1:5672/%2f");
}

fn err(text: &str) -> String {
    Config::from_toml(text).unwrap_err().to_string()
}

#[test]
fn invalid_values_name_the_key_and_the_value() {
    assert_eq!(
        err(""),
        "[[bucket]]: the ladder is empty: declare at least one [[bucket]] with a ttl"
    );
    let e = err("[[bucket]]\nttl = \"0s\"");
    assert!(e.contains("\"0s\" is zero"), "{e}");
    let e = err("[[bucket]]\nttl = \"1s\"\n[[bucket]]\nttl = \"1000ms\"");
    assert!(e.contains("\"1s\" and \"1000ms\""), "{e}");
    let e = err("[[bucket]]\nttl = \"1s\"\n[[bucket]]\nttl = \"later\"");
    assert!(e.starts_with("bucket[1].ttl = \"later\""), "{e}");
    let e = err("[[bucket]]\nttl = \"60d\"");
    assert!(e.contains("exceeds RabbitMQ's limit"), "{e}");
    let e = err("[placement]\nstrategy = \"fastest\"\n[[bucket]]\nttl = \"1s\"");
    assert!(
        e.starts_with("placement.strategy = \"fastest\": unknown strategy"),
        "{e}"
    );
    let e = err("[placement]\ndue_within = \"soon\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("placement.due_within = \"soon\""), "{e}");
    let e = err("[placement]\ntransit_format = \"short\"\n[[bucket]]\nttl = \"1s\"");
    assert!(
        e.starts_with(
            "placement.transit_format = \"short\": expected \"compact\" or \"spelled-out\""
        ),
        "{e}"
    );
    let e = err("[topology]\nprefix = \"a b\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("topology.prefix = \"a b\""), "{e}");
    let e = err("[amqp]\nurl = \"http://u:secret@h\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("amqp.url = \"http://u:***@h\""), "{e}");
    assert!(!e.contains("secret"), "{e}");
    let e = err("[amqp]\ninflight_bytes = \"lots\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("amqp.inflight_bytes = \"lots\""), "{e}");
    let e = err("[amqp]\nprefetch = \"0\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("amqp.prefetch = \"0\""), "{e}");
    // A key of an earlier version that no longer exists is named.
    let e = err("[amqp]\ncoalesce = \"20ms\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.contains("unknown field `coalesce`"), "{e}");
    let e = err("[topology]\nqueue_type = \"mirrored\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("topology.queue_type = \"mirrored\""), "{e}");
    let e = err("[topology]\nclassic_queue_version = 3\n[[bucket]]\nttl = \"1s\"");
    assert!(
        e.starts_with("topology.classic_queue_version = \"3\": expected 1 or 2"),
        "{e}"
    );
    let e = err(
        "[topology]\nqueue_type = \"quorum\"\nclassic_queue_version = 2\n[[bucket]]\nttl = \"1s\"",
    );
    assert!(
        e.starts_with("topology.classic_queue_version = \"2\": applies to classic queues only"),
        "{e}"
    );
    let e = err("[placement]\nstratgy = \"round-up\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.contains("stratgy"), "{e}");
}

#[test]
fn the_classic_queue_version_is_unset_unless_configured() {
    let one = "[[bucket]]\nttl = \"1s\"\n";
    assert_eq!(Config::from_toml(one).unwrap().classic_queue_version, None);
    let two = format!("[topology]\nclassic_queue_version = 2\n{one}");
    assert_eq!(
        Config::from_toml(&two).unwrap().classic_queue_version,
        Some(2)
    );
}

#[test]
fn the_queue_type_is_auto_unless_configured() {
    use crate::core::topology::{QueueType, QueueTypeSetting};
    let one = "[[bucket]]\nttl = \"1s\"\n";
    assert_eq!(
        Config::from_toml(one).unwrap().queue_type,
        QueueTypeSetting::Auto
    );
    for (text, setting) in [
        ("auto", QueueTypeSetting::Auto),
        ("classic", QueueTypeSetting::Fixed(QueueType::Classic)),
        ("quorum", QueueTypeSetting::Fixed(QueueType::Quorum)),
    ] {
        let c = Config::from_toml(&format!("[topology]\nqueue_type = \"{text}\"\n{one}")).unwrap();
        assert_eq!(c.queue_type, setting);
    }
    // auto may meet classic queues: their storage version may be set.
    let c = Config::from_toml(&format!("[topology]\nclassic_queue_version = 2\n{one}")).unwrap();
    assert_eq!(c.classic_queue_version, Some(2));
}

#[test]
fn policies_are_validated_naming_the_field() {
    let base = "[[bucket]]\nttl = \"1s\"\n[[policy]]\nqueue = \"orders.*\"\ninitial = \"1s\"\nmax_attempts = 4\n";
    let c = Config::from_toml(&format!(
        "{base}multiplier = 2.0\nmax_delay = \"1h\"\njitter = 0.1\n"
    ))
    .unwrap();
    assert_eq!(c.policies.len(), 1);
    assert_eq!(c.policies[0].max_delay, Duration::from_secs(3600));
    for (extra, expected) in [
        ("multiplier = 0.5\n", "policy[0].multiplier = \"0.5\""),
        ("jitter = 1.5\n", "policy[0].jitter = \"1.5\""),
        ("max_delay = \"100ms\"\n", "policy[0].max_delay"),
    ] {
        let e = err(&format!("{base}{extra}"));
        assert!(e.starts_with(expected), "{e}");
    }
    let e = err(
        "[[bucket]]\nttl = \"1s\"\n[[policy]]\nqueue = \"q\"\ninitial = \"soon\"\nmax_attempts = 1\n",
    );
    assert!(e.starts_with("policy[0].initial = \"soon\""), "{e}");
    let e = err(
        "[[bucket]]\nttl = \"1s\"\n[[policy]]\nqueue = \"q\"\ninitial = \"1s\"\nmax_attempts = 0\n",
    );
    assert!(e.starts_with("policy[0].max_attempts"), "{e}");
}

#[test]
fn environment_overrides_the_file() {
    let dir = std::env::temp_dir().join(format!("delay-router-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("buckets.toml");
    std::fs::write(&path, SHIPPED).unwrap();
    let env = [
        (
            "DELAY_ROUTER__AMQP__URL".to_string(),
            "amqp://bob:pw@example:5673/v".to_string(),
        ),
        (
            "DELAY_ROUTER__TOPOLOGY__PREFIX".to_string(),
            "other".to_string(),
        ),
        ("DELAY_ROUTER__AMQP__PREFETCH".to_string(), "50".to_string()),
        (
            "DELAY_ROUTER__TOPOLOGY__CLASSIC_QUEUE_VERSION".to_string(),
            "2".to_string(),
        ),
        ("UNRELATED".to_string(), "x".to_string()),
    ];
    let c = Config::load_with_env(&path, env).unwrap();
    assert_eq!(c.url.username(), "bob");
    assert_eq!(c.url.to_string(), "amqp://bob:***@example:5673/v");
    assert_eq!(c.prefix, "other");
    assert_eq!(c.prefetch, 50);
    assert_eq!(c.classic_queue_version, Some(2));
    assert_eq!(c.ladder.smallest().ttl, Duration::from_secs(30));
    let bad = [(
        "DELAY_ROUTER__PLACEMENT__STRATEGY".to_string(),
        "soonest".to_string(),
    )];
    let e = Config::load_with_env(&path, bad).unwrap_err().to_string();
    assert!(e.starts_with("placement.strategy = \"soonest\""), "{e}");
    let missing = Config::load_with_env(&dir.join("nope.toml"), [])
        .unwrap_err()
        .to_string();
    assert!(missing.contains("nope.toml: no such file"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_allow_list_is_checked_and_must_let_retries_through_the_default_exchange() {
    let c = Config::from_toml(
        "[security]\nallow_destinations = [\"orders\", \"billing.*\", \"\"]\n[[bucket]]\nttl = \"1s\"",
    )
    .unwrap();
    let allow = c.allow_destinations.unwrap();
    assert!(allow.allows("billing.eu") && allow.allows("") && !allow.allows("x"));
    assert!(
        Config::from_toml(SHIPPED)
            .unwrap()
            .allow_destinations
            .is_none()
    );
    let e = err("[security]\nallow_destinations = []\n[[bucket]]\nttl = \"1s\"");
    assert!(
        e.starts_with("security.allow_destinations = \"[]\": an empty list allows no destination"),
        "{e}"
    );
    let policy = "[[policy]]\nqueue = \"q\"\ninitial = \"1s\"\nmax_attempts = 2\n";
    let e = err(&format!(
        "[security]\nallow_destinations = [\"orders\"]\n[[bucket]]\nttl = \"1s\"\n{policy}"
    ));
    assert!(
        e.contains("must allow \"\" (the default exchange) when a [[policy]] is set"),
        "{e}"
    );
    let ok = format!(
        "[security]\nallow_destinations = [\"orders\", \"\"]\n[[bucket]]\nttl = \"1s\"\n{policy}"
    );
    assert!(Config::from_toml(&ok).is_ok());
}

#[test]
fn the_allow_list_can_come_from_the_environment_as_a_comma_separated_list() {
    let dir = std::env::temp_dir().join(format!("delay-router-allow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("buckets.toml");
    std::fs::write(&path, SHIPPED).unwrap();
    let env = [(
        "DELAY_ROUTER__SECURITY__ALLOW_DESTINATIONS".to_string(),
        "orders,billing.*".to_string(),
    )];
    let c = Config::load_with_env(&path, env).unwrap();
    let allow = c.allow_destinations.unwrap();
    assert_eq!(allow.patterns(), ["orders", "billing.*"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn redaction_hides_only_the_password() {
    assert_eq!(
        redact("amqps://u:p@h:5671/v?x=1"),
        "amqps://u:***@h:5671/v?x=1"
    );
    assert_eq!(redact("amqp://h"), "amqp://h");
    assert_eq!(redact("amqp://u@h"), "amqp://u@h");
    assert_eq!(redact("amqp://u:p:q@h/a@b"), "amqp://u:***@h/a@b");
}

#[test]
fn byte_sizes_parse_with_units() {
    assert_eq!(parse_bytes("64MiB"), Ok(64 * MIB));
    assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
    assert_eq!(parse_bytes("4096"), Ok(4096));
    assert_eq!(parse_bytes("2MB"), Ok(2_000_000));
    assert!(parse_bytes("0").is_err());
    assert!(parse_bytes("lots").is_err());
    assert!(
        parse_bytes("5 parsecs")
            .unwrap_err()
            .contains("unknown unit")
    );
}

#[test]
fn several_nodes_are_one_url_list_of_one_user_and_virtual_host() {
    let c = Config::from_toml(
        "[amqp]\nurls = [\"amqp://u:p@n1:5672/v\", \"amqp://u:p@n2:5672/v\"]\n[[bucket]]\nttl = \"1s\"",
    )
    .unwrap();
    assert_eq!(c.urls.len(), 2);
    assert_eq!(c.url.to_string(), "amqp://u:***@n1:5672/v");
    let e = err("[amqp]\nurl = \"amqp://n1\"\nurls = [\"amqp://n2\"]\n[[bucket]]\nttl = \"1s\"");
    assert!(e.contains("set url or urls, not both"), "{e}");
    let e = err("[amqp]\nurls = []\n[[bucket]]\nttl = \"1s\"");
    assert!(e.contains("list at least one URL"), "{e}");
    let e = err(
        "[amqp]\nurls = [\"amqp://u:p@n1/v\", \"amqp://w:secret@n2/v\"]\n[[bucket]]\nttl = \"1s\"",
    );
    assert!(e.contains("same user and virtual host"), "{e}");
    assert!(!e.contains("secret"), "{e}");
    assert_eq!(
        Config::from_toml("[[bucket]]\nttl = \"1s\"")
            .unwrap()
            .urls
            .len(),
        1,
        "the default URL"
    );
}

#[test]
fn the_node_list_can_come_from_the_environment() {
    let dir = std::env::temp_dir().join(format!("delay-router-urls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("buckets.toml");
    std::fs::write(&path, "[[bucket]]\nttl = \"1s\"\n").unwrap();
    let env = [(
        "DELAY_ROUTER__AMQP__URLS".to_string(),
        "amqp://u:p@n1:5682/%2f,amqp://u:p@n2:5683/%2f".to_string(),
    )];
    let c = Config::load_with_env(&path, env).unwrap();
    let shown: Vec<String> = c.urls.iter().map(|u| u.to_string()).collect();
    assert_eq!(
        shown,
        ["amqp://u:***@n1:5682/%2f", "amqp://u:***@n2:5683/%2f"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bucket_shards_follow_the_queue_type_unless_configured() {
    use crate::core::decision::Rules;
    use crate::core::topology::QueueType;
    let one = "[[bucket]]\nttl = \"1s\"\n";
    let unset = Config::from_toml(one).unwrap();
    assert_eq!(unset.bucket_shards, None);
    let rules = Rules::from_config(&unset);
    assert_eq!(rules.bucket_shards(), 1, "auto: quorum for a new prefix");
    assert_eq!(
        rules
            .clone()
            .with_queue_type(QueueType::Classic)
            .bucket_shards(),
        2
    );
    let three = Config::from_toml(&format!("[topology]\nbucket_shards = 3\n{one}")).unwrap();
    assert_eq!(three.bucket_shards, Some(3));
    let rules = Rules::from_config(&three).with_queue_type(QueueType::Classic);
    assert_eq!(rules.bucket_shards(), 3);
    assert_eq!(
        rules.topology().bucket_names().len(),
        3 * rules.ladder.rungs().len()
    );
    let e = err("[topology]\nbucket_shards = 0\n[[bucket]]\nttl = \"1s\"");
    assert!(
        e.starts_with("topology.bucket_shards = \"0\": expected a whole number from 1 to 16"),
        "{e}"
    );
}
