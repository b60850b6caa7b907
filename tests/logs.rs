//! `[log] format`: JSON lines, and no ANSI colour codes when stderr is not a
//! terminal (a file here).

mod common;

use common::*;
use std::time::Duration;

const CLASSIC: &str = "[topology]\nqueue_type = \"classic\"\n";

async fn run_logging(h: &Harness, extra: &str) -> String {
    let path = write_config(&h.prefix, &["1s"], extra);
    let log = std::env::temp_dir().join(format!("{}-{}.log", h.prefix, extra.len()));
    let mut router = spawn_binary(&path, &log);
    h.wait_consumers().await;
    // A parked message: a WARN line with fields.
    h.publish("k", to_queue("nowhere", s("soon")), b"x").await;
    h.wait_depth(h.names.parked.as_str(), 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    router.kill_9();
    let text = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(&log).ok();
    std::fs::remove_file(&path).ok();
    text
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_and_text_logs_have_no_colour_in_a_file() {
    let mut h = Harness::new(&["1s"], "").await;
    // Classic buckets named, whatever the harness's default type: the
    // router warns once about what they risk, and the test reads that WARN.
    let json = run_logging(&h, &format!("[log]\nformat = \"json\"\n{CLASSIC}")).await;
    let lines: Vec<&str> = json.lines().collect();
    assert!(lines.len() >= 3, "{json}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
    }
    let park = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["fields"]["message"] == "parking message")
        .expect("the parked message is logged");
    assert_eq!(park["level"], "WARN");
    assert!(
        park["fields"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("invalid delay")
    );
    assert!(!json.contains('\u{1b}'));
    // Classic buckets: the router says once what they risk.
    let classic: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("queue_type is classic"))
        })
        .collect();
    assert_eq!(classic.len(), 1, "{json}");
    assert_eq!(classic[0]["level"], "WARN");

    // Drain the park before the second run.
    h.receive(h.names.parked.as_str(), 1, Duration::from_secs(5))
        .await;
    let text = run_logging(&h, CLASSIC).await;
    assert!(text.contains("parking message"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "ANSI codes in a log file:\n{text}"
    );
    let _ = h.stop_router().await;
    h.cleanup().await;
}
