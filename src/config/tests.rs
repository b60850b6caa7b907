//! Unit tests of the configuration.

use super::*;
use std::time::Duration;

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
    let e = err("[topology]\nprefix = \"a b\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("topology.prefix = \"a b\""), "{e}");
    let e = err("[amqp]\nurl = \"http://u:secret@h\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("amqp.url = \"http://u:***@h\""), "{e}");
    assert!(!e.contains("secret"), "{e}");
    let e = err("[amqp]\nprefetch = \"0\"\n[[bucket]]\nttl = \"1s\"");
    assert!(e.starts_with("amqp.prefetch = \"0\""), "{e}");
    // A key of an earlier version that no longer exists is named.
    for (section, key) in [
        ("amqp", "coalesce"),
        ("amqp", "inflight_bytes"),
        ("topology", "bucket_shards"),
        ("topology", "check_interval"),
        ("placement", "due_within"),
        ("placement", "transit_format"),
    ] {
        let e = err(&format!(
            "[{section}]\n{key} = \"1\"\n[[bucket]]\nttl = \"1s\""
        ));
        assert!(e.contains(&format!("unknown field `{key}`")), "{e}");
    }
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
fn bucket_shards_follow_the_queue_type_unless_set() {
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
    let mut three = unset.clone();
    three.bucket_shards = Some(3);
    let rules = Rules::from_config(&three).with_queue_type(QueueType::Classic);
    assert_eq!(rules.bucket_shards(), 3);
    assert_eq!(
        rules.topology().bucket_names().len(),
        3 * rules.ladder.rungs().len()
    );
}

/// Every key the configuration accepts, as `section.key` (`bucket[].ttl` for
/// an array of tables), read off the structs serde deserializes.
fn accepted_keys() -> std::collections::BTreeSet<String> {
    use serde_reflection::{ContainerFormat, Format, Samples, Tracer, TracerConfig};
    let mut tracer = Tracer::new(TracerConfig::default());
    tracer
        .trace_type::<RawSettings>(&Samples::new())
        .expect("the configuration's structs can be traced");
    let registry = tracer.registry().expect("every type traced");
    let fields = |name: &str| match registry.get(name) {
        Some(ContainerFormat::Struct(fields)) => fields.clone(),
        other => panic!("{name} is not a struct: {other:?}"),
    };
    let mut keys = std::collections::BTreeSet::new();
    for section in fields("RawSettings") {
        let (array, inner) = match &section.value {
            Format::TypeName(t) => ("", t.clone()),
            Format::Seq(f) => match f.as_ref() {
                Format::TypeName(t) => ("[]", t.clone()),
                other => panic!("{}: {other:?}", section.name),
            },
            other => panic!("{}: {other:?}", section.name),
        };
        for key in fields(&inner) {
            keys.insert(format!("{}{array}.{}", section.name, key.name));
        }
    }
    keys
}

#[test]
fn the_configuration_reference_lists_every_key_and_nothing_else() {
    let page = include_str!("../../docs/configuration.md");
    // A row: | `section.key` | `DELAY_ROUTER__SECTION__KEY` or file only | ...
    let mut documented = std::collections::BTreeSet::new();
    for row in page.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let key = cells[1].trim_matches('`').to_owned();
        let env = cells[2];
        if key.contains("[]") {
            assert_eq!(
                env, "file only",
                "{key}: arrays of tables come from the file"
            );
        } else {
            let expected = format!("`{ENV_PREFIX}__{}`", key.replace('.', "__").to_uppercase());
            assert_eq!(env, expected, "{key}: the environment variable");
        }
        assert!(
            cells.len() >= 6 && !cells[4].is_empty(),
            "{key}: no default"
        );
        assert!(documented.insert(key.clone()), "{key} twice");
    }
    let accepted = accepted_keys();
    let missing: Vec<_> = accepted.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/configuration.md: keys without a row {missing:?}, rows without a key {stale:?}"
    );
}

#[test]
fn every_key_of_the_shipped_file_is_in_the_reference_commented_or_not() {
    let accepted = accepted_keys();
    let mut section = String::new();
    for line in SHIPPED.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
            section = format!("{name}[]");
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else if let Some((key, _)) = line.split_once(" = ") {
            let key = key.trim();
            if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !key.is_empty() {
                let full = format!("{section}.{key}");
                assert!(
                    accepted.contains(&full),
                    "buckets.toml names {full}, not a key"
                );
            }
        }
    }
}

#[test]
fn environment_variables_reach_every_scalar_key() {
    // One scalar key per section, set from the environment only.
    let dir = std::env::temp_dir().join(format!("dr-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("buckets.toml");
    std::fs::write(&path, "[[bucket]]\nttl = \"1s\"\n").unwrap();
    let env = [
        ("DELAY_ROUTER__AMQP__PREFETCH", "7"),
        ("DELAY_ROUTER__TOPOLOGY__PREFIX", "envtest"),
        ("DELAY_ROUTER__TOPOLOGY__QUEUE_TYPE", "classic"),
        ("DELAY_ROUTER__TOPOLOGY__CLASSIC_QUEUE_VERSION", "2"),
        ("DELAY_ROUTER__PLACEMENT__STRATEGY", "round-up"),
        ("DELAY_ROUTER__METRICS__LISTEN", "127.0.0.1:9999"),
        ("DELAY_ROUTER__LOG__FORMAT", "json"),
        ("DELAY_ROUTER__CANCEL__KEEP", "2d"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let c = Config::load_with_env(&path, env).unwrap();
    assert_eq!(c.prefetch, 7);
    assert_eq!(c.prefix, "envtest");
    assert_eq!(c.queue_type.to_string(), "classic");
    assert_eq!(c.classic_queue_version, Some(2));
    assert_eq!(c.strategy, PlacementStrategy::RoundUp);
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9999".parse().unwrap()));
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.cancel_keep, Duration::from_secs(2 * 86_400));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn delayed_exchanges_name_the_plugins_exchange_its_type_and_a_delivery_exchange() {
    use crate::core::delayed::DelayedType;
    let c = Config::from_toml(
        "[[bucket]]\nttl = \"1s\"\n\
         [[delayed_exchange]]\nname = \"orders.delayed\"\ntype = \"topic\"\n\
         [[delayed_exchange]]\nname = \"mail.later\"\ntype = \"direct\"\ndeliver_to = \"mail\"\n",
    )
    .unwrap();
    let x = &c.delayed_exchanges;
    assert_eq!(x.len(), 2);
    assert_eq!(
        (x[0].name.as_str(), x[0].kind, x[0].deliver_to.as_str()),
        (
            "orders.delayed",
            DelayedType::Topic,
            "orders.delayed.delivered"
        )
    );
    assert_eq!(x[1].deliver_to.as_str(), "mail");
    let bad = |entry: &str| err(&format!("[[bucket]]\nttl = \"1s\"\n{entry}"));
    let e = bad("[[delayed_exchange]]\nname = \"o\"\ntype = \"x-delayed-message\"");
    assert!(
        e.starts_with("delayed_exchange[0].type = \"x-delayed-message\""),
        "{e}"
    );
    let e = bad("[[delayed_exchange]]\nname = \"amq.direct\"\ntype = \"direct\"");
    assert!(e.contains("belong to the broker"), "{e}");
    let e = bad("[[delayed_exchange]]\nname = \"delay.router\"\ntype = \"direct\"");
    assert!(e.contains("the router's own exchange"), "{e}");
    let e = bad("[[delayed_exchange]]\nname = \"\"\ntype = \"direct\"");
    assert!(e.contains("1 to 255 bytes"), "{e}");
    let e = bad("[[delayed_exchange]]\nname = \"a\"\ntype = \"direct\"\ndeliver_to = \"a\"");
    assert!(e.contains("named twice"), "{e}");
    // Two names may share a delivery exchange of one type (a cut-over).
    let shared = "[[delayed_exchange]]\nname = \"a\"\ntype = \"topic\"\ndeliver_to = \"d\"\n\
                  [[delayed_exchange]]\nname = \"b\"\ntype = \"topic\"\ndeliver_to = \"d\"";
    assert!(Config::from_toml(&format!("[[bucket]]\nttl = \"1s\"\n{shared}")).is_ok());
    let e = bad(&shared.replace(
        "\"topic\"\ndeliver_to = \"d\"\n[",
        "\"direct\"\ndeliver_to = \"d\"\n[",
    ));
    assert!(
        e.contains("of type direct, not topic") || e.contains("of type topic, not direct"),
        "{e}"
    );
    let e = bad(
        "[[delayed_exchange]]\nname = \"a\"\ntype = \"direct\"\n[[delayed_exchange]]\nname = \"a.delivered\"\ntype = \"direct\"",
    );
    assert!(e.contains("named twice"), "{e}");
    // The waiting queue, <prefix>.waiting.<name>, must fit AMQP's 255 bytes.
    let long = "x".repeat(255 - "delay.waiting.".len());
    let fits = format!("[[bucket]]\nttl = \"1s\"\n[[delayed_exchange]]\nname = \"{long}\"\ntype = \"direct\"\ndeliver_to = \"d\"");
    assert!(Config::from_toml(&fits).is_ok());
    let e = bad(&format!("[[delayed_exchange]]\nname = \"{long}x\"\ntype = \"direct\"\ndeliver_to = \"d\""));
    assert!(e.contains("longer than AMQP's 255 bytes"), "{e}");
    let e = bad("[[delayed_exchange]]\nname = \"a\"\ntype = \"direct\"\nttl = \"1s\"");
    assert!(e.contains("unknown field `ttl`"), "{e}");
}
