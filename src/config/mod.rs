//! Configuration: `buckets.toml` plus `DELAY_ROUTER__SECTION__KEY` environment
//! overrides, loaded once and validated into domain types.

use crate::core::delayed::{DelayedExchange, DelayedType};
use crate::core::ladder::{Ladder, LadderError, parse_rung};
use crate::core::placement::PlacementStrategy;
use crate::core::retry::Policy;
use crate::core::security::AllowList;
use crate::core::topology::{MAX_PREFIX_LEN, QueueType, QueueTypeSetting};
use lapin::types::ShortString;
use serde::Deserialize;
use std::path::Path;

mod url;
pub use url::{AmqpUrl, CaFile, redact, redact_text};
pub use crate::tuning::{INFLIGHT_BYTES as DEFAULT_INFLIGHT_BYTES, CHECK_INTERVAL as DEFAULT_CHECK_INTERVAL};

/// Environment variable prefix: `DELAY_ROUTER__AMQP__URL` overrides `[amqp] url`.
pub const ENV_PREFIX: &str = "DELAY_ROUTER";
/// The URL used when neither the file nor the environment names one.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Default deliveries in flight per consumer.
pub const DEFAULT_PREFETCH: u16 = 500;

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
    #[serde(default)]
    delayed_exchange: Vec<RawDelayedExchange>,
    #[serde(default)]
    security: RawSecurity,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    log: RawLog,
    #[serde(default)]
    cancel: RawCancel,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCancel {
    keep: Option<String>,
}

/// How the binary writes its log lines to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (colour only when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    allow_destinations: Option<Vec<String>>,
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
    urls: Option<Vec<String>>,
    prefetch: Option<String>,
    ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    prefix: Option<String>,
    queue_type: Option<String>,
    classic_queue_version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    strategy: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDelayedExchange {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    deliver_to: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBucket {
    ttl: String,
}

/// A configuration that cannot be used; every variant names the key and value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read or is not TOML of the expected shape (an
    /// unknown key is named here).
    #[error("cannot read configuration {path}: {message}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong, with any password redacted.
        message: String,
    },
    /// A value that cannot be used.
    #[error("{key} = {value:?}: {message}")]
    Invalid {
        /// `section.key`, or `policy[i].field` in an array of tables.
        key: String,
        /// The value as written (a password redacted).
        value: String,
        /// What is expected instead.
        message: String,
    },
    /// The ladder of `[[bucket]]` rungs is empty or invalid.
    #[error("[[bucket]]: {0}")]
    Ladder(#[from] LadderError),
}

/// The most queues a rung may have ([`Config::bucket_shards`]).
pub const MAX_BUCKET_SHARDS: u8 = 16;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The first of [`Config::urls`]: its user and virtual host are every
    /// node's.
    pub url: AmqpUrl,
    /// The nodes to connect to (`[amqp] urls`, or the one `url`): the router
    /// uses one that answers, and another when that one goes away.
    pub urls: Vec<AmqpUrl>,
    /// Extra CA certificates trusted for `amqps://`.
    pub ca_file: Option<CaFile>,
    /// `[amqp] prefetch`: deliveries in flight per consumer.
    pub prefetch: u16,
    /// `[topology] prefix`: every name the router declares starts with it.
    pub prefix: String,
    /// `[placement] strategy`.
    pub strategy: PlacementStrategy,
    /// `[topology] queue_type`: classic, quorum, or auto (the default): the
    /// type the prefix's queues already have, quorum for a new prefix.
    pub queue_type: QueueTypeSetting,
    /// `[topology] classic_queue_version`: `x-queue-version` of every classic
    /// queue the router declares; `None` declares none (the broker's default).
    /// A key because the broker refuses to redeclare a queue with another
    /// version than it was declared with.
    pub classic_queue_version: Option<u8>,
    /// Built in, not a key: how often the router checks its topology and
    /// repairs what is missing.
    pub check_interval: std::time::Duration,
    /// Built in, not a key: bytes in flight per consumer; the prefetch window
    /// shrinks to fit large messages.
    pub inflight_bytes: u64,
    /// Built in, not a key: how the router's bookkeeping is written into
    /// bucket messages (both formats are always read).
    pub transit_format: crate::core::envelope::TransitFormat,
    /// Built in, not a key: queues per rung; `None`: the queue type's default
    /// (`core::topology::default_bucket_shards`).
    pub bucket_shards: Option<u8>,
    /// `[[bucket]]`: the ladder of bucket TTLs.
    pub ladder: Ladder,
    /// Retry policies, first match wins.
    pub policies: Vec<Policy>,
    /// `[[delayed_exchange]]`: the delayed-message-exchange plugin's
    /// exchanges the router serves in its place.
    pub delayed_exchanges: Vec<DelayedExchange>,
    /// `[security] allow_destinations`: `None` allows every exchange the
    /// router's user may write.
    pub allow_destinations: Option<AllowList>,
    /// `[metrics] listen`: where `/metrics`, `/healthz` and `/readyz` are
    /// served; `None` (absent or `""`) serves nothing.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `[log] format`.
    pub log_format: LogFormat,
    /// `[cancel] keep`: how long a tombstone lives.
    pub cancel_keep: std::time::Duration,
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
                    .list_separator(",")
                    .with_list_parse_key("security.allow_destinations")
                    .with_list_parse_key("amqp.urls")
                    .try_parsing(true)
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
        let urls = validate_urls(raw.amqp.url, raw.amqp.urls)?;
        let url = urls[0].clone();
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
        let ca_file = match raw.amqp.ca_file {
            None => None,
            Some(path) if !urls.iter().all(AmqpUrl::is_tls) => {
                return Err(invalid(
                    "amqp.ca_file",
                    &path,
                    "a CA file is for TLS: amqp.url must start with amqps://".into(),
                ));
            }
            Some(path) => Some(CaFile::read(&path).map_err(|m| invalid("amqp.ca_file", &path, m))?),
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
            .parse::<PlacementStrategy>()
            .map_err(|m| invalid("placement.strategy", &strategy_raw, m))?;
        let queue_type_raw = raw.topology.queue_type.unwrap_or_else(|| "auto".into());
        let queue_type = queue_type_raw
            .parse::<QueueTypeSetting>()
            .map_err(|m| invalid("topology.queue_type", &queue_type_raw, m))?;
        let classic_queue_version = match raw.topology.classic_queue_version {
            None => None,
            Some(raw_version) => {
                let key = "topology.classic_queue_version";
                let version = match raw_version.trim() {
                    "1" => 1,
                    "2" => 2,
                    _ => {
                        return Err(invalid(
                            key,
                            &raw_version,
                            "expected 1 or 2 (RabbitMQ's classic queue storage versions)".into(),
                        ));
                    }
                };
                if queue_type == QueueTypeSetting::Fixed(QueueType::Quorum) {
                    return Err(invalid(
                        key,
                        &raw_version,
                        format!("applies to classic queues only; queue_type is \"{queue_type}\""),
                    ));
                }
                Some(version)
            }
        };
        // `priority` with quorum buckets depends on the broker's version: the
        // router judges it once connected (core::compat).
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
        let delayed_exchanges = validate_delayed_exchanges(&raw.delayed_exchange, &prefix)?;
        let allow_destinations = match raw.security.allow_destinations {
            None => None,
            Some(patterns) => {
                let shown = format!("{patterns:?}");
                let list = AllowList::new(patterns)
                    .map_err(|e| invalid("security.allow_destinations", &shown, e.to_string()))?;
                if !policies.is_empty() && !list.allows("") {
                    return Err(invalid(
                        "security.allow_destinations",
                        &shown,
                        "must allow \"\" (the default exchange) when a [[policy]] is set: \
                         retries return to their queue through the default exchange"
                            .into(),
                    ));
                }
                Some(list)
            }
        };
        let metrics_listen = match raw.metrics.listen.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(v) => Some(v.parse::<std::net::SocketAddr>().map_err(|_| {
                invalid(
                    "metrics.listen",
                    v,
                    "expected an address and port such as \"127.0.0.1:9464\", or \"\" to serve no metrics".into(),
                )
            })?),
        };
        let log_format = match raw.log.format.as_deref().map(str::trim) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(invalid(
                    "log.format",
                    other,
                    "expected \"text\" or \"json\"".into(),
                ));
            }
        };
        let cancel_keep = match raw.cancel.keep {
            None => crate::core::topology::DEFAULT_CANCEL_KEEP,
            Some(v) => humantime::parse_duration(v.trim())
                .ok()
                .filter(|d| *d >= std::time::Duration::from_secs(1))
                .ok_or_else(|| {
                    invalid(
                        "cancel.keep",
                        &v,
                        "expected a duration of at least 1s, such as \"7d\"".into(),
                    )
                })?,
        };
        Ok(Self {
            metrics_listen,
            log_format,
            cancel_keep,
            url,
            urls,
            ca_file,
            prefetch,
            prefix,
            strategy,
            queue_type,
            classic_queue_version,
            check_interval: DEFAULT_CHECK_INTERVAL,
            inflight_bytes: DEFAULT_INFLIGHT_BYTES,
            transit_format: crate::core::envelope::TransitFormat::default(),
            bucket_shards: None,
            ladder,
            policies,
            delayed_exchanges,
            allow_destinations,
        })
    }
}

/// `[amqp] url` or `urls` (not both): at least one, each a valid URL, all
/// with the same user and virtual host (nodes of one cluster).
fn validate_urls(
    url: Option<String>,
    urls: Option<Vec<String>>,
) -> Result<Vec<AmqpUrl>, ConfigError> {
    let invalid = |key: &str, value: String, message: &str| ConfigError::Invalid {
        key: key.into(),
        value,
        message: message.into(),
    };
    let (key, raw) = match (url, urls) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "amqp.urls",
                "(and amqp.url)".into(),
                "set url or urls, not both",
            ));
        }
        (Some(u), None) => ("amqp.url", vec![u]),
        (None, Some(us)) if us.is_empty() => {
            return Err(invalid("amqp.urls", "[]".into(), "list at least one URL"));
        }
        (None, Some(us)) => ("amqp.urls", us),
        (None, None) => ("amqp.url", vec![DEFAULT_URL.to_owned()]),
    };
    let urls = raw
        .iter()
        .map(|u| {
            AmqpUrl::parse(u.trim()).map_err(|m| ConfigError::Invalid {
                key: key.into(),
                value: redact(u),
                message: m,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let first = &urls[0];
    if let Some(other) = urls
        .iter()
        .find(|u| u.username() != first.username() || u.vhost() != first.vhost())
    {
        return Err(invalid(
            key,
            other.to_string(),
            "every URL must name the same user and virtual host as the first (nodes of one cluster)",
        ));
    }
    Ok(urls)
}

/// `[[delayed_exchange]]`: names AMQP takes, none of them the router's own
/// or `amq.*`, each used once.
fn validate_delayed_exchanges(
    raw: &[RawDelayedExchange],
    prefix: &str,
) -> Result<Vec<DelayedExchange>, ConfigError> {
    let mut names = std::collections::BTreeSet::new();
    let mut targets = std::collections::BTreeMap::<String, DelayedType>::new();
    let own = crate::core::topology::Names::new(prefix);
    let mut all = Vec::with_capacity(raw.len());
    for (i, x) in raw.iter().enumerate() {
        let invalid = |field: &str, value: &str, message: String| ConfigError::Invalid {
            key: format!("delayed_exchange[{i}].{field}"),
            value: value.into(),
            message,
        };
        let mut name_of = |field: &str, v: &str| {
            let v = v.trim();
            if v.is_empty() || v.len() > 255 {
                return Err(invalid(
                    field,
                    v,
                    "expected an exchange name of 1 to 255 bytes".into(),
                ));
            }
            if v.starts_with("amq.") {
                return Err(invalid(
                    field,
                    v,
                    "amq.* exchanges belong to the broker".into(),
                ));
            }
            if own.own_exchanges().iter().any(|e| e.as_str() == v) {
                return Err(invalid(field, v, "the router's own exchange".into()));
            }
            // A name is served once, and is no one's delivery exchange; a
            // delivery exchange may serve several names, of one type.
            let clash = match field {
                "name" => !names.insert(v.to_owned()) || targets.contains_key(v),
                _ => names.contains(v),
            };
            if clash {
                return Err(invalid(
                    field,
                    v,
                    "named twice among the delayed exchanges".into(),
                ));
            }
            ShortString::try_new(v.to_owned())
                .map_err(|_| invalid(field, v, "not a valid exchange name".into()))
        };
        let name = name_of("name", &x.name)?;
        if format!("{prefix}.waiting.{name}").len() > 255 {
            return Err(invalid(
                "name",
                name.as_str(),
                format!(
                    "its waiting queue {}.waiting.<name> would be longer than AMQP's 255 bytes: \
                     a shorter name or prefix",
                    prefix
                ),
            ));
        }
        let kind = x
            .kind
            .parse::<DelayedType>()
            .map_err(|m| invalid("type", &x.kind, m))?;
        let deliver_to = match &x.deliver_to {
            Some(d) => name_of("deliver_to", d)?,
            None => name_of(
                "deliver_to",
                &DelayedExchange::default_deliver_to(name.as_str()),
            )?,
        };
        match targets.insert(deliver_to.to_string(), kind) {
            Some(other) if other != kind => {
                return Err(invalid(
                    "deliver_to",
                    deliver_to.as_str(),
                    format!("delivers for another delayed exchange of type {other}, not {kind}"),
                ));
            }
            _ => {}
        }
        all.push(DelayedExchange {
            name,
            kind,
            deliver_to,
        });
    }
    Ok(all)
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
        None => crate::core::contract::MAX_DELAY,
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

#[cfg(test)]
mod tests;
