//! Configuration: `buckets.toml` plus `DELAY_ROUTER__SECTION__KEY` environment
//! overrides, loaded once and validated into domain types.

use crate::ladder::{Ladder, LadderError, parse_rung};
use crate::placement::Strategy;
use crate::retry::Policy;
use crate::topology::{MAX_PREFIX_LEN, QueueType};
use crate::window::parse_bytes;
use lapin::uri::AMQPUri;
use serde::Deserialize;
use std::{fmt, path::Path, str::FromStr};

/// Environment variable prefix: `DELAY_ROUTER__AMQP__URL` overrides `[amqp] url`.
pub const ENV_PREFIX: &str = "DELAY_ROUTER";
/// The URL used when neither the file nor the environment names one.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Default deliveries in flight per consumer.
pub const DEFAULT_PREFETCH: u16 = 5000;
/// Default bytes in flight per consumer: the window shrinks for large messages.
pub const DEFAULT_INFLIGHT_BYTES: u64 = 64 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    #[serde(default)]
    amqp: RawAmqp,
    #[serde(default)]
    topology: RawTopology,
    #[serde(default)]
    placement: RawPlacement,
    #[serde(default)]
    bucket: Vec<RawBucket>,
    #[serde(default)]
    policy: Vec<RawPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    queue: String,
    initial: String,
    multiplier: Option<f64>,
    max_delay: Option<String>,
    jitter: Option<f64>,
    max_attempts: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAmqp {
    url: Option<String>,
    prefetch: Option<String>,
    inflight_bytes: Option<String>,
    ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    prefix: Option<String>,
    queue_type: Option<String>,
    check_interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    strategy: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    ttl: String,
}

/// A configuration that cannot be used; every variant names the key and value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration {path}: {message}")]
    Read { path: String, message: String },
    #[error("{key} = {value:?}: {message}")]
    Invalid {
        key: String,
        value: String,
        message: String,
    },
    #[error("[[bucket]]: {0}")]
    Ladder(#[from] LadderError),
}

/// The AMQP URL, parsed; its `Display` never shows the password.
#[derive(Clone)]
pub struct AmqpUrl {
    raw: String,
    uri: AMQPUri,
}

impl AmqpUrl {
    /// Parses a URL; the error never repeats the password.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let uri = AMQPUri::from_str(raw)
            .map_err(|_| format!("not a valid amqp:// or amqps:// URL ({})", redact(raw)))?;
        Ok(Self {
            raw: raw.to_owned(),
            uri,
        })
    }
    /// The full URL, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.raw
    }
    /// Whether the URL asks for TLS (`amqps://`).
    pub fn is_tls(&self) -> bool {
        self.uri.scheme == lapin::uri::AMQPScheme::AMQPS
    }
    /// The user name the router authenticates as.
    pub fn username(&self) -> &str {
        &self.uri.authority.userinfo.username
    }
}

impl fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.raw))
    }
}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmqpUrl({self})")
    }
}

/// Replaces the password of a URL (`scheme://user:password@host`) with `***`.
pub fn redact(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return raw.to_owned();
    };
    let rest = &raw[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &raw[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => raw.to_owned(),
    }
}

/// A CA certificate (PEM) trusted for `amqps://`, besides the system's roots.
#[derive(Clone)]
pub struct CaFile {
    pub path: String,
    pub pem: String,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CaFile({})", self.path)
    }
}

impl CaFile {
    /// Reads and checks a PEM file of certificates.
    pub fn read(path: &str) -> Result<Self, String> {
        let pem = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err("expected PEM certificates (-----BEGIN CERTIFICATE-----)".into());
        }
        Ok(Self {
            path: path.to_owned(),
            pem,
        })
    }
}

/// Default period of the topology check (passive declares, repair on drift).
pub const DEFAULT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub url: AmqpUrl,
    /// Extra CA certificates trusted for `amqps://`.
    pub ca_file: Option<CaFile>,
    /// How often the router checks its topology and repairs what is missing.
    pub check_interval: std::time::Duration,
    pub prefetch: u16,
    pub inflight_bytes: u64,
    pub prefix: String,
    pub strategy: Strategy,
    pub queue_type: QueueType,
    pub ladder: Ladder,
    /// Retry policies, first match wins.
    pub policies: Vec<Policy>,
}

impl Config {
    /// Loads `path` (which must exist) with environment overrides, and validates it.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// As [`Config::load`], with the environment given explicitly (for tests).
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        if !path.is_file() {
            return Err(ConfigError::Read {
                path: path.display().to_string(),
                message: "no such file".into(),
            });
        }
        let env: config::Map<String, String> = env.into_iter().collect();
        let raw: RawSettings = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator("__")
                    .separator("__")
                    .source(Some(env)),
            )
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::Read {
                path: path.display().to_string(),
                message: redact_text(&e.to_string()),
            })?;
        Self::validate(raw)
    }

    /// Parses configuration text (no environment), for tests and tools.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let raw: RawSettings = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::Read {
                path: "(inline)".into(),
                message: redact_text(&e.to_string()),
            })?;
        Self::validate(raw)
    }

    fn validate(raw: RawSettings) -> Result<Self, ConfigError> {
        let invalid = |key: &str, value: &str, message: String| ConfigError::Invalid {
            key: key.into(),
            value: value.into(),
            message,
        };
        let url_raw = raw.amqp.url.unwrap_or_else(|| DEFAULT_URL.into());
        let url =
            AmqpUrl::parse(&url_raw).map_err(|m| invalid("amqp.url", &redact(&url_raw), m))?;
        let prefetch = match raw.amqp.prefetch {
            None => DEFAULT_PREFETCH,
            Some(p) => p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    invalid(
                        "amqp.prefetch",
                        &p,
                        "expected a whole number from 1 to 65535".into(),
                    )
                })?,
        };
        let inflight_bytes = match raw.amqp.inflight_bytes {
            None => DEFAULT_INFLIGHT_BYTES,
            Some(b) => parse_bytes(&b).map_err(|m| invalid("amqp.inflight_bytes", &b, m))?,
        };
        let ca_file = match raw.amqp.ca_file {
            None => None,
            Some(path) if !url.is_tls() => {
                return Err(invalid(
                    "amqp.ca_file",
                    &path,
                    "a CA file is for TLS: amqp.url must start with amqps://".into(),
                ));
            }
            Some(path) => Some(CaFile::read(&path).map_err(|m| invalid("amqp.ca_file", &path, m))?),
        };
        let check_interval = match raw.topology.check_interval {
            None => DEFAULT_CHECK_INTERVAL,
            Some(v) => humantime::parse_duration(v.trim())
                .ok()
                .filter(|d| *d >= std::time::Duration::from_millis(100))
                .ok_or_else(|| {
                    invalid(
                        "topology.check_interval",
                        &v,
                        "expected a duration of at least 100ms, such as \"5s\"".into(),
                    )
                })?,
        };
        let prefix = raw.topology.prefix.unwrap_or_else(|| "delay".into());
        if prefix.is_empty()
            || prefix.len() > MAX_PREFIX_LEN
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
        {
            return Err(invalid(
                "topology.prefix",
                &prefix,
                format!("expected 1 to {MAX_PREFIX_LEN} characters from A-Z a-z 0-9 . - _ :"),
            ));
        }
        let strategy_raw = raw.placement.strategy.unwrap_or_else(|| "cascade".into());
        let strategy = strategy_raw
            .parse::<Strategy>()
            .map_err(|m| invalid("placement.strategy", &strategy_raw, m))?;
        let queue_type_raw = raw.topology.queue_type.unwrap_or_else(|| "classic".into());
        let queue_type = queue_type_raw
            .parse::<QueueType>()
            .map_err(|m| invalid("topology.queue_type", &queue_type_raw, m))?;
        if queue_type == QueueType::Quorum && strategy == Strategy::Priority {
            return Err(invalid(
                "placement.strategy",
                "priority",
                "cannot be used with topology.queue_type = \"quorum\": quorum queues refuse \
                 x-max-priority before RabbitMQ 4.0, and before 4.3 do not expire every priority level; \
                 use cascade"
                    .into(),
            ));
        }
        let rungs = raw
            .bucket
            .iter()
            .enumerate()
            .map(|(i, b)| {
                parse_rung(&b.ttl).map_err(|m| invalid(&format!("bucket[{i}].ttl"), &b.ttl, m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ladder = Ladder::new(rungs)?;
        let policies = raw
            .policy
            .iter()
            .enumerate()
            .map(|(i, p)| validate_policy(i, p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            url,
            ca_file,
            check_interval,
            prefetch,
            inflight_bytes,
            prefix,
            strategy,
            queue_type,
            ladder,
            policies,
        })
    }
}

fn validate_policy(i: usize, p: &RawPolicy) -> Result<Policy, ConfigError> {
    let invalid = |field: &str, value: String, message: &str| ConfigError::Invalid {
        key: format!("policy[{i}].{field}"),
        value,
        message: message.into(),
    };
    let duration = |field: &str, v: &str| {
        humantime::parse_duration(v.trim())
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(
                    field,
                    v.into(),
                    "expected a positive duration such as \"1s\" or \"5m\"",
                )
            })
    };
    if p.queue.trim().is_empty() {
        return Err(invalid(
            "queue",
            p.queue.clone(),
            "expected a queue name or glob such as \"orders.*\"",
        ));
    }
    let initial = duration("initial", &p.initial)?;
    let multiplier = p.multiplier.unwrap_or(1.0);
    if !(multiplier.is_finite() && multiplier >= 1.0) {
        return Err(invalid(
            "multiplier",
            multiplier.to_string(),
            "expected a number of at least 1.0",
        ));
    }
    let max_delay = match &p.max_delay {
        Some(v) => duration("max_delay", v)?,
        None => crate::contract::MAX_DELAY,
    };
    if max_delay < initial {
        return Err(invalid(
            "max_delay",
            format!("{max_delay:?}"),
            "must not be shorter than initial",
        ));
    }
    let jitter = p.jitter.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&jitter) {
        return Err(invalid(
            "jitter",
            jitter.to_string(),
            "expected a fraction from 0.0 to 1.0",
        ));
    }
    if p.max_attempts == 0 {
        return Err(invalid(
            "max_attempts",
            "0".into(),
            "expected at least 1 (deliveries, the first included)",
        ));
    }
    Ok(Policy {
        queue: p.queue.trim().to_owned(),
        initial,
        multiplier,
        max_delay,
        jitter,
        max_attempts: p.max_attempts,
    })
}

/// Redacts anything that looks like a URL with a password inside free text.
pub fn redact_text(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                redact(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SHIPPED: &str = include_str!("../buckets.toml");

    #[test]
    fn shipped_file_loads_with_the_documented_ladder() {
        let c = Config::from_toml(SHIPPED).unwrap();
        let labels: Vec<_> = c.ladder.rungs().iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["30s", "1m", "5m", "30m", "1h", "3h", "6h", "12h", "24h"]
        );
        assert_eq!(c.prefix, "delay");
        assert_eq!(c.strategy, Strategy::Cascade);
        assert_eq!((c.prefetch, c.inflight_bytes), (5000, 64 << 20));
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
        let e = err("[amqp]\ninflight_bytes = \"lots\"\n[[bucket]]\nttl = \"1s\"");
        assert!(e.starts_with("amqp.inflight_bytes = \"lots\""), "{e}");
        let e = err("[amqp]\nprefetch = \"0\"\n[[bucket]]\nttl = \"1s\"");
        assert!(e.starts_with("amqp.prefetch = \"0\""), "{e}");
        let e = err("[topology]\nqueue_type = \"mirrored\"\n[[bucket]]\nttl = \"1s\"");
        assert!(e.starts_with("topology.queue_type = \"mirrored\""), "{e}");
        let e = err(
            "[topology]\nqueue_type = \"quorum\"\n[placement]\nstrategy = \"priority\"\n[[bucket]]\nttl = \"1s\"",
        );
        assert!(
            e.contains("cannot be used with topology.queue_type = \"quorum\""),
            "{e}"
        );
        let e = err("[placement]\nstratgy = \"round-up\"\n[[bucket]]\nttl = \"1s\"");
        assert!(e.contains("stratgy"), "{e}");
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
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let c = Config::load_with_env(&path, env).unwrap();
        assert_eq!(c.url.username(), "bob");
        assert_eq!(c.url.to_string(), "amqp://bob:***@example:5673/v");
        assert_eq!(c.prefix, "other");
        assert_eq!(c.prefetch, 50);
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
    fn redaction_hides_only_the_password() {
        assert_eq!(
            redact("amqps://u:p@h:5671/v?x=1"),
            "amqps://u:***@h:5671/v?x=1"
        );
        assert_eq!(redact("amqp://h"), "amqp://h");
        assert_eq!(redact("amqp://u@h"), "amqp://u@h");
        assert_eq!(redact("amqp://u:p:q@h/a@b"), "amqp://u:***@h/a@b");
    }
}
