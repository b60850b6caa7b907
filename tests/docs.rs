//! The documentation against the code: README.md and the book in `docs/`
//! name only commands, flags, metrics and settings that exist, and list
//! every metric, alert and park reason there is. Reads files only (no
//! broker); `scripts/check-docs` builds the book and checks its links.

use std::collections::BTreeSet;
use std::path::Path;

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The pages of the book (from SUMMARY.md), README.md first.
fn pages() -> Vec<(String, String)> {
    let summary = read("docs/SUMMARY.md");
    let mut pages = vec![("README.md".to_owned(), read("README.md"))];
    for link in summary.split("](").skip(1) {
        let file = &link[..link.find(')').expect("a closed link")];
        let path = format!("docs/{file}");
        pages.push((path.clone(), read(&path)));
    }
    pages
}

/// Pages that describe the product as it is: not the history.
fn current_pages() -> Vec<(String, String)> {
    pages()
        .into_iter()
        .filter(|(p, _)| !p.ends_with("performance-log.md") && !p.ends_with("mechanisms.md"))
        .collect()
}

/// Code in markdown: fenced blocks and inline code spans.
fn code(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push(line.to_owned());
        } else {
            out.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
        }
    }
    out
}

/// Words made of `[a-z0-9_]` that start with `prefix`.
fn names_starting(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The metric families the router registers (`src/router/stats.rs`), without
/// the suffixes the exposition adds.
fn metric_families() -> BTreeSet<String> {
    let stats = read("src/router/stats.rs");
    let mut families = BTreeSet::new();
    for call in stats.split("r.register").skip(1) {
        let name = call.split('"').nth(1).expect("a metric name");
        families.insert(name.to_owned());
    }
    assert!(families.len() >= 25, "{families:?}");
    families
}

fn family_of(sample: &str) -> &str {
    [
        "_total",
        "_seconds_bucket",
        "_seconds_count",
        "_seconds_sum",
        "_seconds",
    ]
    .iter()
    .find_map(|s| sample.strip_suffix(s))
    .unwrap_or(sample)
}

#[test]
fn readme_is_a_front_door_of_at_most_300_lines() {
    let lines = read("README.md").lines().count();
    assert!(lines <= 300, "README.md has {lines} lines");
}

#[test]
fn operating_lists_every_metric_and_the_docs_name_no_other() {
    let families = metric_families();
    let operating = read("docs/operating.md");
    for f in &families {
        assert!(
            operating.contains(f.as_str()),
            "docs/operating.md does not list {f}"
        );
    }
    for (page, text) in current_pages() {
        for sample in names_starting(&text, "delay_router_") {
            assert!(
                families.contains(family_of(&sample)),
                "{page} names {sample}, which the router does not export"
            );
        }
    }
}

#[test]
fn troubleshooting_has_an_entry_for_every_alert_and_every_park_reason() {
    let page = read("docs/troubleshooting.md");
    let operating = read("docs/operating.md");
    let alerts: Vec<String> = read("deploy/prometheus/alerts.yml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: ").map(str::to_owned))
        .collect();
    assert!(alerts.len() >= 9, "{alerts:?}");
    for alert in &alerts {
        assert!(
            page.contains(&format!("### {alert}\n")),
            "docs/troubleshooting.md has no entry for {alert}"
        );
        assert!(
            operating.contains(&format!("`{alert}`")),
            "docs/operating.md does not list {alert}"
        );
    }
    let reasons = read("src/core/reasons.rs");
    let classes = reasons
        .split("pub const CLASSES")
        .nth(1)
        .and_then(|s| s.split("];").next())
        .expect("the CLASSES list");
    let mut named: Vec<&str> = classes.split('"').skip(1).step_by(2).collect();
    named.push("cancelled"); // listed through the CANCELLED constant
    assert!(named.len() >= 17, "{named:?}");
    for class in named {
        assert!(
            page.contains(&format!("`{class}`")),
            "docs/troubleshooting.md has no entry for the park reason class {class}"
        );
    }
}

/// Subcommands and long flags from `src/cli.rs`.
fn cli() -> (BTreeSet<String>, BTreeSet<String>) {
    let source = read("src/cli.rs");
    let mut commands = BTreeSet::new();
    for enum_name in ["enum Command {", "enum ParkedCommand {"] {
        let body = source.split(enum_name).nth(1).expect("the enum");
        let body = &body[..body.find("\n}").expect("its end")];
        for line in body.lines() {
            let word: String = line
                .strip_prefix("    ")
                .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
                .map(|l| l.chars().take_while(char::is_ascii_alphanumeric).collect())
                .unwrap_or_default();
            if !word.is_empty() {
                commands.insert(word.to_lowercase());
            }
        }
    }
    let mut flags = BTreeSet::new();
    let mut long = false;
    for line in source.lines().map(str::trim) {
        if line.starts_with("#[arg(") && line.contains("long") {
            long = true;
        } else if long && !line.starts_with("#[") && !line.starts_with("///") {
            let field = line
                .trim_start_matches("pub ")
                .split(':')
                .next()
                .unwrap_or("");
            flags.insert(format!("--{}", field.trim().replace('_', "-")));
            long = false;
        }
    }
    assert!(
        commands.contains("parked") && flags.contains("--config"),
        "{commands:?} {flags:?}"
    );
    (commands, flags)
}

#[test]
fn every_command_and_flag_the_docs_show_exists() {
    let (commands, flags) = cli();
    for (page, text) in pages() {
        for snippet in code(&text) {
            for (i, _) in snippet.match_indices("delay-router ") {
                let before = snippet[..i].chars().last();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || "/-_.".contains(c)) {
                    continue;
                }
                let rest = &snippet[i + "delay-router ".len()..];
                let rest = rest.split(['#', '`', ';', '|']).next().unwrap_or("");
                let mut words = rest.split_whitespace();
                let command = words
                    .next()
                    .unwrap_or("")
                    .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
                if !command.starts_with(|c: char| c.is_ascii_lowercase()) {
                    continue;
                }
                assert!(
                    commands.contains(command),
                    "{page}: `delay-router {command}` is not a command: {snippet}"
                );
                for word in words {
                    let flag = word
                        .trim_start_matches('[')
                        .split(['=', ']', ',', ')'])
                        .next()
                        .unwrap_or("");
                    if flag.starts_with("--") {
                        assert!(flags.contains(flag), "{page}: no flag {flag}: {snippet}");
                    }
                }
            }
        }
    }
}

#[test]
fn removed_settings_are_documented_nowhere() {
    let removed = [
        "inflight_bytes",
        "due_within",
        "transit_format",
        "bucket_shards",
        "check_interval",
        "coalesce",
    ];
    // configuration.md names them once, as keys that are refused.
    for (page, text) in current_pages()
        .into_iter()
        .filter(|(p, _)| !p.ends_with("configuration.md"))
    {
        for key in removed {
            assert!(
                !text.contains(key),
                "{page} documents the removed setting {key}"
            );
        }
    }
}

#[test]
fn pages_state_the_present_without_dates() {
    for (page, text) in current_pages() {
        let bytes = text.as_bytes();
        for i in 0..bytes.len().saturating_sub(10) {
            let d = |k: usize| bytes[i + k].is_ascii_digit();
            let date = bytes[i..].starts_with(b"20")
                && d(2)
                && d(3)
                && bytes[i + 4] == b'-'
                && d(5)
                && d(6)
                && bytes[i + 7] == b'-'
                && d(8)
                && d(9);
            // An RFC 3339 example (`2026-11-22T10:00:00Z`) is a value, not a date of history.
            if date
                && bytes.get(i + 10) != Some(&b'T')
                && (i == 0 || !bytes[i - 1].is_ascii_digit())
            {
                let line = text[..i].lines().count();
                panic!(
                    "{page}:{line}: a date; history belongs in CHANGELOG.md or the performance log"
                );
            }
        }
    }
}
