//! The deployment files under `deploy/` agree with the code (no broker
//! needed): every metric the Grafana dashboard and the Prometheus rules
//! query is one the router exports, every panel has a query, the required
//! alerts exist, the container image runs as non-root with the shipped
//! configuration and environment overrides the config loader accepts, and
//! the systemd unit leaves the router its shutdown grace.
//!
//! The tools made for each file (hadolint, promtool, systemd-analyze) run in
//! `scripts/check-deploy`.

use delay_router::config::{Config, LogFormat};
use delay_router::router::SHUTDOWN_GRACE;
use delay_router::router::stats::Stats;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

const ALERTS: &str = "deploy/prometheus/alerts.yml";
const ALERT_TESTS: &str = "deploy/prometheus/alerts_test.yml";
const DASHBOARD: &str = "deploy/grafana/delay-router.json";
const DOCKERFILE: &str = "deploy/Dockerfile";
const UNIT: &str = "deploy/delay-router.service";

const REQUIRED_ALERTS: [&str; 7] = [
    "DelayRouterDown",
    "DelayRouterNotReady",
    "DelayRouterLatenessHigh",
    "DelayRouterParkGrowing",
    "DelayRouterBucketDepthHigh",
    "DelayRouterIngressBacklog",
    "DelayRouterReconnecting",
];

/// Metrics a query may name that the router does not export.
const FOREIGN_METRICS: [&str; 1] = ["up"];

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

fn exported() -> BTreeSet<String> {
    Stats::new().exported_names().into_iter().collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every `delay_router_…` identifier in `text` (outside none: label values
/// like `delay.ingress` or the job `delay-router` do not match).
fn router_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut before: Option<char> = None;
    while let Some(at) = rest.find("delay_router_") {
        let prev = rest[..at].chars().next_back().or(before);
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !prev.is_some_and(is_ident) {
            out.push(tail[..len].to_owned());
        }
        before = tail[..len].chars().next_back();
        rest = &tail[len..];
    }
    out
}

/// The metric names a PromQL expression selects: identifiers left once
/// strings, label matchers, ranges, numbers, function calls and the
/// label lists of `by`/`without`/`on`/`ignoring`/`group_*` are taken out.
fn promql_metrics(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 10] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
    ];
    // Aggregations may put their `by (...)` before the parenthesis.
    const AGGREGATIONS: [&str; 12] = [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    // After a keyword that takes a label list, the next (...) is labels.
    let mut labels_next = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += if chars[i] == '\\' { 2 } else { 1 };
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if labels_next => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                i += 1;
                labels_next = false;
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric()
                        || chars[i] == '.'
                        || ((chars[i] == '+' || chars[i] == '-')
                            && matches!(chars[i - 1], 'e' | 'E')))
                {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let lower = word.to_ascii_lowercase();
                if KEYWORDS.contains(&lower.as_str()) {
                    labels_next = matches!(
                        lower.as_str(),
                        "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                    ) && chars.get(j) == Some(&'(');
                } else if chars.get(j) != Some(&'(') && !AGGREGATIONS.contains(&lower.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The `expr:` values of a Prometheus rule file, plain or block scalars.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(value) = trimmed.strip_prefix("expr:") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let value = value.trim();
        if value.starts_with('>') || value.starts_with('|') {
            let block: Vec<&str> = lines[n + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect();
            exprs.push(block.join(" ").trim().to_owned());
        } else {
            exprs.push(value.trim_matches(|c| c == '"' || c == '\'').to_owned());
        }
    }
    exprs
}

fn alert_names(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(nested) = p.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON")
}

/// Every PromQL query of the dashboard: targets, and the variables' queries.
fn dashboard_queries(d: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push(e.to_owned());
            }
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["query"]["query"].as_str().or(v["definition"].as_str()) {
            // label_values(SELECTOR, label): check the selector's metric.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.rsplit_once(','))
                .map_or(q, |(sel, _)| sel);
            if v["type"] == "query" {
                out.push(inner.to_owned());
            }
        }
    }
    out
}

fn assert_known(what: &str, names: impl IntoIterator<Item = String>, exported: &BTreeSet<String>) {
    for name in names {
        assert!(
            exported.contains(&name) || FOREIGN_METRICS.contains(&name.as_str()),
            "{what} names `{name}`, which the router does not export; it exports: {exported:?}"
        );
    }
}

#[test]
fn the_scanners_find_metric_names_and_nothing_else() {
    assert_eq!(
        promql_metrics(
            r#"histogram_quantile(0.99, sum by (job, le) (rate(delay_router_x_bucket{job=~"$job", le!="1e6"}[$__rate_interval]))) > 1e6 and on (job) up == 0"#
        ),
        BTreeSet::from(["delay_router_x_bucket".to_owned(), "up".to_owned()])
    );
    assert_eq!(
        router_names(
            r#"delay_router_a{queue="delay.ingress", job="delay-router"} + xdelay_router_b"#
        ),
        ["delay_router_a"]
    );
    let yaml = "      - alert: A\n        expr: up == 0\n      - alert: B\n        expr: >-\n          sum(\n            delay_router_ready)\n        for: 2m\n";
    assert_eq!(rule_exprs(yaml), ["up == 0", "sum( delay_router_ready)"]);
    assert_eq!(alert_names(yaml), ["A", "B"]);
}

#[test]
fn every_metric_the_alert_rules_query_is_exported() {
    let exported = exported();
    let yaml = read(ALERTS);
    let exprs = rule_exprs(&yaml);
    assert_eq!(
        exprs.len(),
        alert_names(&yaml).len(),
        "one expr per alert in {ALERTS}"
    );
    for expr in &exprs {
        let metrics = promql_metrics(expr);
        assert!(!metrics.is_empty(), "{ALERTS}: no metric in `{expr}`");
        assert_known(&format!("{ALERTS} `{expr}`"), metrics, &exported);
        assert_known(ALERTS, router_names(expr), &exported);
    }
    // Anything else that looks like a router metric (comments included).
    assert_known(ALERTS, router_names(&yaml), &exported);
    // The unit tests' input series too, or a misspelled series would make a
    // test pass for nothing.
    assert_known(ALERT_TESTS, router_names(&read(ALERT_TESTS)), &exported);
}

#[test]
fn the_required_alerts_are_defined() {
    let names = alert_names(&read(ALERTS));
    for required in REQUIRED_ALERTS {
        assert!(
            names.iter().any(|n| n == required),
            "{ALERTS} has no alert {required} (it has {names:?})"
        );
    }
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "an alert name repeats: {names:?}"
    );
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    let exported = exported();
    let d = dashboard();
    let queries = dashboard_queries(&d);
    assert!(
        queries.len() > 10,
        "{DASHBOARD}: only {} queries",
        queries.len()
    );
    for q in &queries {
        let metrics = promql_metrics(q);
        assert!(!metrics.is_empty(), "{DASHBOARD}: no metric in `{q}`");
        assert_known(&format!("{DASHBOARD} `{q}`"), metrics, &exported);
    }
    assert_known(DASHBOARD, router_names(&read(DASHBOARD)), &exported);
}

#[test]
fn every_dashboard_panel_has_a_query_on_the_chosen_data_source() {
    let d = dashboard();
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for var in ["datasource", "job", "instance"] {
        assert!(vars.contains(&var), "{DASHBOARD}: no ${var} variable");
    }
    let mut ids = BTreeSet::new();
    let all = panels(&d);
    assert!(all.len() > 10, "{DASHBOARD}: only {} panels", all.len());
    for p in all {
        let title = p["title"].as_str().unwrap_or("(untitled)");
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "{title}: id repeats"
        );
        assert!(p["gridPos"]["w"].as_u64().is_some(), "{title}: no gridPos");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{title}: data source"
        );
        let targets = p["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert!(
            !targets.is_empty(),
            "{DASHBOARD}: panel {title} has no target"
        );
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: a target without expr");
            assert!(
                t["refId"].as_str().is_some(),
                "{title}: a target without refId"
            );
        }
    }
}

/// `KEY=value` pairs of the Dockerfile's ENV instructions (continuations joined).
fn dockerfile_env(dockerfile: &str) -> Vec<(String, String)> {
    let joined = dockerfile.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ENV "))
        .flat_map(|rest| {
            rest.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        })
        .collect()
}

#[test]
fn the_image_runs_as_non_root_with_the_shipped_configuration() {
    let dockerfile = read(DOCKERFILE);
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let user = instructions
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the Dockerfile sets USER");
    let uid = user.trim().split(':').next().unwrap_or_default();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "the last USER is `{user}`: a numeric, non-zero UID is wanted"
    );
    let last_from = instructions
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("FROM");
    assert!(
        instructions[last_from].starts_with("FROM debian:bookworm-slim"),
        "runtime stage: {}",
        instructions[last_from]
    );
    assert!(
        instructions[last_from..].contains(&"COPY buckets.toml /etc/delay-router/buckets.toml"),
        "the image ships buckets.toml as /etc/delay-router/buckets.toml"
    );
    assert!(dockerfile.contains("cargo build --release --locked"));
    assert!(instructions.contains(&r#"ENTRYPOINT ["delay-router"]"#));
    assert!(instructions.contains(&r#"CMD ["run", "--config", "/etc/delay-router/buckets.toml"]"#));
    assert!(instructions.contains(&"EXPOSE 9464"));

    // The ENV overrides are ones the config loader takes, with their effect.
    let env = dockerfile_env(&dockerfile);
    assert!(
        env.iter().all(|(k, _)| k.starts_with("DELAY_ROUTER__")),
        "{env:?}"
    );
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("buckets.toml");
    let config = Config::load_with_env(&shipped, env.clone())
        .unwrap_or_else(|e| panic!("buckets.toml with the image's environment {env:?}: {e}"));
    assert_eq!(
        config.metrics_listen,
        Some("0.0.0.0:9464".parse().unwrap()),
        "inside a container /metrics must listen on every interface"
    );
    assert_eq!(config.log_format, LogFormat::Json);
}

#[test]
fn the_systemd_unit_leaves_the_router_its_shutdown_grace() {
    let unit = read(UNIT);
    let value = |key: &str| {
        unit.lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .next_back()
            .map(str::trim)
            .unwrap_or_else(|| panic!("{UNIT}: no {key}="))
    };
    assert_eq!(
        value("ExecStart"),
        "/usr/local/bin/delay-router run --config /etc/delay-router/buckets.toml"
    );
    let stop = humantime::parse_duration(value("TimeoutStopSec")).expect("TimeoutStopSec");
    assert!(
        stop > SHUTDOWN_GRACE,
        "TimeoutStopSec {stop:?} must exceed the shutdown grace {SHUTDOWN_GRACE:?}"
    );
    assert_eq!(value("KillSignal"), "SIGTERM");
    assert_eq!(value("Restart"), "on-failure");
    for hardening in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "CapabilityBoundingSet=",
        "MemoryDenyWriteExecute=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter=@system-service",
    ] {
        assert!(
            unit.lines().any(|l| l.trim() == hardening),
            "{UNIT}: no {hardening}"
        );
    }
    // The router reads /proc/sys/kernel/hostname for `status`.
    assert!(
        !unit.lines().any(|l| l.trim().starts_with("ProcSubset=pid")),
        "ProcSubset=pid hides /proc/sys/kernel/hostname"
    );
}
