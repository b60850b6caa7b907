//! The deployment files under `deploy/` agree with the code (no broker
//! needed): every metric the Grafana dashboard and the Prometheus rules
//! query is one the router exports, every panel has a query, the required
//! alerts exist, the container image runs as non-root with the shipped
//! configuration and environment overrides the config loader accepts, the
//! systemd unit leaves the router its shutdown grace, and the Kubernetes
//! manifests use the ports, probe paths, environment variables, config keys,
//! user and grace period the code has.
//!
//! The tools made for each file (hadolint, promtool, systemd-analyze) run in
//! `scripts/check-deploy`; kubectl kustomize, yamllint and
//! kubernetes-validate in `scripts/check-kubernetes`; the image is built and
//! run in `scripts/check-image`.

use delay_router::broker::RPC_TIMEOUT;
use delay_router::config::{Config, ENV_PREFIX, LogFormat};
use delay_router::router::SHUTDOWN_GRACE;
use delay_router::router::health::Health;
use delay_router::router::stats::Stats;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const ALERTS: &str = "deploy/prometheus/alerts.yml";
const ALERT_TESTS: &str = "deploy/prometheus/alerts_test.yml";
const DASHBOARD: &str = "deploy/grafana/delay-router.json";
const DOCKERFILE: &str = "deploy/Dockerfile";
const UNIT: &str = "deploy/delay-router.service";
const K8S_KUSTOMIZATION: &str = "deploy/kubernetes/kustomization.yaml";
const K8S_DEPLOYMENT: &str = "deploy/kubernetes/deployment.yaml";
const K8S_SERVICE: &str = "deploy/kubernetes/service.yaml";
const K8S_PDB: &str = "deploy/kubernetes/poddisruptionbudget.yaml";
const K8S_PODMONITOR: &str = "deploy/kubernetes/podmonitor.yaml";
const K8S_SECRET_EXAMPLE: &str = "deploy/kubernetes/amqp-secret.example.yaml";
const K8S_BUCKETS: &str = "deploy/kubernetes/buckets.toml";

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
    // The runtime stage is Debian 12 slim unless a build argument says
    // otherwise, and takes the binary from the builder stage unless one
    // names a prebuilt image (scripts/check-image).
    assert_eq!(
        instructions[last_from], "FROM ${BASE}",
        "runtime stage: {}",
        instructions[last_from]
    );
    for arg in [
        "ARG BASE=debian:bookworm-slim",
        "ARG BINARY_FROM=builder",
        "FROM ${BINARY_FROM} AS binary",
    ] {
        assert!(
            instructions[..last_from].contains(&arg),
            "{DOCKERFILE}: no `{arg}` before the runtime stage"
        );
    }
    assert!(
        instructions
            .iter()
            .any(|l| l.starts_with("FROM rust:") && l.ends_with(" AS builder")),
        "{DOCKERFILE}: no builder stage"
    );
    for file in [
        "/usr/local/bin/delay-router",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        assert!(
            instructions[last_from..]
                .contains(&format!("COPY --from=binary {file} {file}").as_str()),
            "{DOCKERFILE}: the runtime stage does not copy {file} from the binary stage"
        );
    }
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

// ------------------------------------------------------------- Kubernetes

/// A one-document YAML manifest as JSON values, read with the config crate's
/// YAML reader (the project has no YAML crate of its own).
fn yaml(path: &str) -> Value {
    config::Config::builder()
        .add_source(config::File::from_str(
            &read(path),
            config::FileFormat::Yaml,
        ))
        .build()
        .and_then(|c| c.try_deserialize::<Value>())
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn str_at<'a>(v: &'a Value, pointer: &str, what: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{what}: no string at {pointer}"))
}

fn u64_at(v: &Value, pointer: &str, what: &str) -> u64 {
    v.pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{what}: no whole number at {pointer}"))
}

/// The Deployment's only container, the router.
fn router_container(deployment: &Value) -> &Value {
    let containers = deployment
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .expect("spec.template.spec.containers");
    assert_eq!(containers.len(), 1, "{K8S_DEPLOYMENT}: one container");
    &containers[0]
}

/// The container's environment as the pod gets it: literal values, and
/// secretKeyRef values taken from the example Secret (which must hold them).
fn k8s_env(container: &Value) -> Vec<(String, String)> {
    let secret = yaml(K8S_SECRET_EXAMPLE);
    container["env"]
        .as_array()
        .expect("the container has env")
        .iter()
        .map(|e| {
            let name = str_at(e, "/name", K8S_DEPLOYMENT).to_owned();
            let value = match (e.get("value"), e.pointer("/valueFrom/secretKeyRef")) {
                (Some(v), None) => v
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: the value must be a string"))
                    .to_owned(),
                (None, Some(r)) => {
                    let (sname, key) = (str_at(r, "/name", &name), str_at(r, "/key", &name));
                    assert_eq!(
                        str_at(&secret, "/metadata/name", K8S_SECRET_EXAMPLE),
                        sname,
                        "{name} reads the Secret {sname}, which {K8S_SECRET_EXAMPLE} does not make"
                    );
                    str_at(&secret, &format!("/stringData/{key}"), K8S_SECRET_EXAMPLE).to_owned()
                }
                _ => panic!("{name}: expected a value or a secretKeyRef"),
            };
            (name, value)
        })
        .collect()
}

/// The pod template's labels, which selectors must match.
fn pod_labels(deployment: &Value) -> serde_json::Map<String, Value> {
    deployment
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object)
        .expect("spec.template.metadata.labels")
        .clone()
}

fn assert_selects_pods(what: &str, selector: &Value, labels: &serde_json::Map<String, Value>) {
    let wanted = selector
        .as_object()
        .unwrap_or_else(|| panic!("{what}: no matchLabels"));
    assert!(!wanted.is_empty(), "{what}: an empty selector");
    for (k, v) in wanted {
        assert_eq!(
            labels.get(k),
            Some(v),
            "{what} selects {k}={v}, which the router pods do not have: {labels:?}"
        );
    }
}

/// The CMD of the Dockerfile, as a list of strings.
fn dockerfile_cmd() -> Vec<String> {
    let dockerfile = read(DOCKERFILE);
    let cmd = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("CMD "))
        .next_back()
        .expect("CMD");
    serde_json::from_str(cmd).expect("CMD in JSON form")
}

#[test]
fn the_kubernetes_ladder_is_the_shipped_buckets_toml() {
    assert_eq!(
        read(K8S_BUCKETS),
        read("buckets.toml"),
        "{K8S_BUCKETS} differs from buckets.toml: kustomize reads no file outside its folder, \
         so it keeps a copy; copy buckets.toml over it"
    );
    // The ConfigMap made from it is the one the pod mounts where the
    // router's --config points.
    let kustomization = yaml(K8S_KUSTOMIZATION);
    let generated = kustomization["configMapGenerator"]
        .as_array()
        .expect("configMapGenerator");
    assert_eq!(generated.len(), 1, "{K8S_KUSTOMIZATION}: one ConfigMap");
    let files: Vec<&str> = generated[0]["files"]
        .as_array()
        .expect("configMapGenerator files")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(files, ["buckets.toml"]);
    let configmap = str_at(&generated[0], "/name", K8S_KUSTOMIZATION);
    let deployment = yaml(K8S_DEPLOYMENT);
    let volumes = deployment
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .expect("volumes");
    let volume = volumes
        .iter()
        .find(|v| v.pointer("/configMap/name").and_then(Value::as_str) == Some(configmap))
        .unwrap_or_else(|| panic!("{K8S_DEPLOYMENT}: no volume of the ConfigMap {configmap}"));
    let container = router_container(&deployment);
    let mount = container["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the ConfigMap's volume is mounted");
    assert_eq!(mount["readOnly"], true);
    let args: Vec<String> =
        serde_json::from_value(container["args"].clone()).expect("args: strings");
    let cmd = dockerfile_cmd();
    assert_eq!(args, cmd, "the container's args are the image's CMD");
    let config_path = args
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("args: --config PATH");
    assert_eq!(
        Path::new(config_path),
        Path::new(str_at(mount, "/mountPath", K8S_DEPLOYMENT)).join("buckets.toml"),
        "--config names the mounted buckets.toml"
    );
    // The example Secret holds a placeholder password: it is not applied
    // with the base.
    assert!(
        kustomization["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .all(|r| r
                .as_str()
                .is_some_and(|r| r.ends_with(".yaml") && !r.contains("secret"))),
        "{K8S_KUSTOMIZATION}: the example Secret is not a resource (no password in the base)"
    );
}

#[test]
fn every_kubernetes_environment_variable_is_a_config_key_the_loader_reads() {
    let deployment = yaml(K8S_DEPLOYMENT);
    let env = k8s_env(router_container(&deployment));
    let prefix = format!("{ENV_PREFIX}__");
    for (name, _) in &env {
        assert!(
            name.starts_with(&prefix),
            "{K8S_DEPLOYMENT}: {name} is not a configuration variable ({prefix}SECTION__KEY)"
        );
    }
    let buckets = Path::new(env!("CARGO_MANIFEST_DIR")).join(K8S_BUCKETS);
    // The loader refuses a key it does not know, so that each variable
    // loads proves it names a key; a misspelt one fails.
    assert!(
        Config::load_with_env(
            &buckets,
            [("DELAY_ROUTER__METRICS__LISTN".into(), "0.0.0.0:9464".into())]
        )
        .is_err(),
        "the loader accepts an unknown key: this test would prove nothing"
    );
    for (name, value) in &env {
        Config::load_with_env(&buckets, [(name.clone(), value.clone())])
            .unwrap_or_else(|e| panic!("{K8S_DEPLOYMENT}: {name}={value}: {e}"));
    }
    let file = Config::load_with_env(&buckets, []).expect("the ConfigMap's buckets.toml");
    let config = Config::load_with_env(&buckets, env.clone())
        .unwrap_or_else(|e| panic!("{K8S_BUCKETS} with the pod's environment: {e}"));
    // Each one has its effect over the file's value.
    let secret = yaml(K8S_SECRET_EXAMPLE);
    assert_eq!(
        config.url.expose(),
        str_at(&secret, "/stringData/url", K8S_SECRET_EXAMPLE)
    );
    assert_ne!(config.url.expose(), file.url.expose());
    assert_eq!(file.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!(
        config.metrics_listen,
        Some("0.0.0.0:9464".parse().unwrap()),
        "in a pod /metrics must listen on every interface"
    );
    assert_eq!(file.log_format, LogFormat::Text);
    assert_eq!(config.log_format, LogFormat::Json);
    assert!(
        env.iter().any(|(k, _)| k == "DELAY_ROUTER__AMQP__URL"),
        "the AMQP URL comes from the Secret"
    );
    // What the image sets, the manifest repeats with the same values.
    for (k, v) in dockerfile_env(&read(DOCKERFILE)) {
        assert!(
            env.contains(&(k.clone(), v.clone())),
            "{DOCKERFILE} sets {k}={v}; {K8S_DEPLOYMENT} does not say the same"
        );
    }
}

#[test]
fn kubernetes_probes_service_and_podmonitor_use_the_routers_port_and_paths() {
    let deployment = yaml(K8S_DEPLOYMENT);
    let container = router_container(&deployment);
    let buckets = Path::new(env!("CARGO_MANIFEST_DIR")).join(K8S_BUCKETS);
    let config = Config::load_with_env(&buckets, k8s_env(container)).expect("config");
    let listen = config.metrics_listen.expect("the pod serves /metrics");
    let ports = container["ports"].as_array().expect("ports");
    assert_eq!(ports.len(), 1, "{K8S_DEPLOYMENT}: one port");
    let port_name = str_at(&ports[0], "/name", K8S_DEPLOYMENT);
    assert_eq!(
        u64_at(&ports[0], "/containerPort", K8S_DEPLOYMENT),
        u64::from(listen.port()),
        "containerPort is the port [metrics] listen gives the router"
    );
    assert!(
        read(DOCKERFILE)
            .lines()
            .any(|l| l.trim() == format!("EXPOSE {}", listen.port())),
        "{DOCKERFILE} exposes another port"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = container
            .pointer(&format!("/{probe}/httpGet"))
            .unwrap_or_else(|| panic!("{K8S_DEPLOYMENT}: no {probe}.httpGet"));
        assert_eq!(str_at(get, "/path", probe), path, "{probe}");
        assert_eq!(str_at(get, "/port", probe), port_name, "{probe} port");
    }
    let pods = pod_labels(&deployment);
    let service = yaml(K8S_SERVICE);
    assert_selects_pods(K8S_SERVICE, &service["spec"]["selector"], &pods);
    let sports = service["spec"]["ports"].as_array().expect("Service ports");
    assert_eq!(sports.len(), 1);
    assert_eq!(str_at(&sports[0], "/targetPort", K8S_SERVICE), port_name);
    assert_eq!(
        u64_at(&sports[0], "/port", K8S_SERVICE),
        u64::from(listen.port())
    );
    let monitor = yaml(K8S_PODMONITOR);
    assert_selects_pods(
        K8S_PODMONITOR,
        &monitor["spec"]["selector"]["matchLabels"],
        &pods,
    );
    let endpoints = monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1);
    assert_eq!(str_at(&endpoints[0], "/port", K8S_PODMONITOR), port_name);
    assert_eq!(str_at(&endpoints[0], "/path", K8S_PODMONITOR), "/metrics");
    // The job label the alerts select is the one the PodMonitor gives.
    let job_label = str_at(&monitor, "/spec/jobLabel", K8S_PODMONITOR);
    let job = pods
        .get(job_label)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("jobLabel {job_label} is not a pod label"));
    assert!(
        read(ALERTS).contains(&format!("job=\"{job}\"")),
        "{ALERTS} does not select job=\"{job}\", the job the PodMonitor gives"
    );
}

/// `GET` with a real HTTP client: the status.
fn http_status(url: &str) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    agent
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .status()
        .as_u16()
}

/// The paths the probes and the scrape use are the router's own: its
/// endpoint, started as the router starts it, answers them (and an unknown
/// path with 404, so a misspelt probe would show).
#[tokio::test]
async fn the_router_serves_the_paths_the_manifests_probe() {
    let deployment = yaml(K8S_DEPLOYMENT);
    let container = router_container(&deployment);
    let monitor = yaml(K8S_PODMONITOR);
    let stop = tokio_util::sync::CancellationToken::new();
    let (bound, serve) = delay_router::router::endpoint::bind(
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(Stats::new()),
        Arc::new(Health::default()),
        stop.clone(),
    )
    .await
    .expect("bind");
    let server = tokio::spawn(serve);
    let base = format!("http://{bound}");
    let expect = [
        (
            str_at(container, "/livenessProbe/httpGet/path", "liveness").to_owned(),
            200,
        ),
        // Not connected to a broker: not ready, and saying so.
        (
            str_at(container, "/readinessProbe/httpGet/path", "readiness").to_owned(),
            503,
        ),
        (
            str_at(&monitor, "/spec/podMetricsEndpoints/0/path", "PodMonitor").to_owned(),
            200,
        ),
        ("/no-such-path".to_owned(), 404),
    ];
    let got = tokio::task::spawn_blocking(move || {
        expect
            .into_iter()
            .map(|(path, want)| (http_status(&format!("{base}{path}")), want, path))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    for (status, want, path) in got {
        assert_eq!(status, want, "GET {path}");
    }
}

#[test]
fn the_kubernetes_grace_period_outlasts_the_routers_drain() {
    let deployment = yaml(K8S_DEPLOYMENT);
    let grace = Duration::from_secs(u64_at(
        &deployment,
        "/spec/template/spec/terminationGracePeriodSeconds",
        K8S_DEPLOYMENT,
    ));
    // After SIGTERM the router settles what it has in flight (up to
    // SHUTDOWN_GRACE), then sends its last acks (up to RPC_TIMEOUT): what is
    // still unacked when it is killed is delivered again. The closes after
    // that need some seconds more.
    let drain = SHUTDOWN_GRACE + RPC_TIMEOUT;
    assert!(
        grace > drain,
        "terminationGracePeriodSeconds {grace:?} must exceed the drain: shutdown grace \
         {SHUTDOWN_GRACE:?} + final acks {RPC_TIMEOUT:?}"
    );
}

#[test]
fn the_kubernetes_pods_are_hardened_spread_and_run_the_images_user() {
    let deployment = yaml(K8S_DEPLOYMENT);
    let container = router_container(&deployment);
    let image_user = read(DOCKERFILE)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .next_back()
        .expect("USER")
        .split(':')
        .next()
        .unwrap()
        .parse::<u64>()
        .expect("a numeric USER");
    for (scope, ctx) in [
        (
            "pod",
            &deployment["spec"]["template"]["spec"]["securityContext"],
        ),
        ("container", &container["securityContext"]),
    ] {
        assert_eq!(ctx["runAsNonRoot"], true, "{scope}: runAsNonRoot");
        assert_eq!(
            ctx["runAsUser"].as_u64(),
            Some(image_user),
            "{scope}: runAsUser is the image's USER"
        );
        assert_eq!(
            ctx.pointer("/seccompProfile/type"),
            Some(&Value::from("RuntimeDefault")),
            "{scope}: seccompProfile"
        );
    }
    let ctx = &container["securityContext"];
    assert_eq!(ctx["readOnlyRootFilesystem"], true);
    assert_eq!(ctx["allowPrivilegeEscalation"], false);
    assert_eq!(
        ctx.pointer("/capabilities/drop"),
        Some(&serde_json::json!(["ALL"]))
    );
    assert!(
        ctx.pointer("/capabilities/add").is_none(),
        "no capability added"
    );
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container
                    .pointer(&format!("/resources/{kind}/{resource}"))
                    .is_some(),
                "{K8S_DEPLOYMENT}: no resources.{kind}.{resource}"
            );
        }
    }

    assert_eq!(deployment["spec"]["replicas"], 2);
    let pods = pod_labels(&deployment);
    assert_selects_pods(
        K8S_DEPLOYMENT,
        &deployment["spec"]["selector"]["matchLabels"],
        &pods,
    );
    let spread = deployment
        .pointer("/spec/template/spec/topologySpreadConstraints")
        .and_then(Value::as_array)
        .expect("topologySpreadConstraints");
    let by_node = spread
        .iter()
        .find(|c| c["topologyKey"] == "kubernetes.io/hostname")
        .expect("a spread over kubernetes.io/hostname");
    assert_eq!(by_node["maxSkew"], 1);
    assert_selects_pods(
        "topologySpreadConstraints",
        &by_node["labelSelector"]["matchLabels"],
        &pods,
    );
    let pdb = yaml(K8S_PDB);
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_selects_pods(K8S_PDB, &pdb["spec"]["selector"]["matchLabels"], &pods);
}
