//! The operator files in `contrib/` cannot drift from the service: every `hermes_hooks_*` metric the
//! Grafana dashboard and the Prometheus alert rules use is exposed by a real service's `/metrics`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, http, poll};

const T: Duration = Duration::from_secs(20);

fn repo_file(rel: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    (path, text)
}

/// Every `hermes_hooks_<name>` in `text` (a bare `hermes_hooks_*` in prose is not a name).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("hermes_hooks_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..len].trim_end_matches('_');
        if name.len() > "hermes_hooks".len() {
            names.insert(name.to_string());
        }
        rest = &tail[len.max(1)..];
    }
    names
}

/// The sample names of an exposition (Prometheus text or OpenMetrics): the first token of every
/// line that is not a comment (`# HELP`, `# TYPE`, `# EOF`, ...) or blank.
fn exposed_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn metric_name_extraction_skips_prose() {
    let names = metric_names(
        "every metric is named hermes_hooks_*; rate(hermes_hooks_dropped_total{hook=\"a\"}[5m]) and \
         hermes_hooks_handler_duration_seconds_bucket",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec![
            "hermes_hooks_dropped_total".to_string(),
            "hermes_hooks_handler_duration_seconds_bucket".to_string()
        ]
    );
    let exposed = exposed_names(
        "# TYPE hermes_hooks_x counter\nhermes_hooks_x_total 1\nhermes_hooks_q{hook=\"a\"} 2\n# EOF\n",
    );
    assert_eq!(
        exposed.into_iter().collect::<Vec<_>>(),
        vec![
            "hermes_hooks_q".to_string(),
            "hermes_hooks_x_total".to_string()
        ]
    );
}

#[test]
fn dashboard_and_alerts_use_only_exposed_metrics() {
    let (dash_path, dash) = repo_file("contrib/grafana/hermes-hooks.json");
    let (rules_path, rules) = repo_file("contrib/prometheus/alerts.yml");

    // Both files are what their tools load.
    let dash_json: Value = serde_json::from_str(&dash)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", dash_path.display()));
    assert!(
        dash_json["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "the dashboard should have panels"
    );
    let rules_doc: Value = serde_saphyr::from_str(&rules)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", rules_path.display()));
    let rule_list: Vec<&Value> = rules_doc["groups"]
        .as_array()
        .expect("alerts.yml: `groups` is a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("each group has `rules`"))
        .collect();
    let alerts: Vec<&str> = rule_list
        .iter()
        .map(|r| {
            assert!(
                r["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "every rule needs an `expr`: {r}"
            );
            assert!(
                r["labels"]["severity"].is_string() && r["annotations"]["summary"].is_string(),
                "every alert needs labels.severity and annotations.summary: {r}"
            );
            r["alert"].as_str().expect("every rule is an alert")
        })
        .collect();
    for needed in [
        "HermesHooksDown",
        "HermesHooksNotReady",
        "HermesHooksHookFailing",
        "HermesHooksDroppingEvents",
        "HermesHooksHookStuck",
    ] {
        assert!(alerts.contains(&needed), "alerts.yml should have {needed}");
    }

    // A real service with per-hook series: one hook that succeeds, one that fails.
    let hooks = Hooks::new();
    hooks.recorder("rec", "[\"agent:*\"]", "None");
    hooks.python(
        "broken",
        "[\"agent:*\"]",
        "def handle(e, c):\n    raise ValueError('no')\n",
    );
    let serve = Serve::start(&hooks, &[]);
    for _ in 0..3 {
        let (s, v) = serve.post("/v1/events", &json!({"event": "agent:start"}));
        assert_eq!((s, v), (202, json!({"queued": 2})));
    }
    poll(T, "both hooks to finish their calls", || {
        let (_, v) = serve.get("/v1/hooks");
        let done = |name: &str, key: &str| {
            v["hooks"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h["name"] == name && h["counters"][key] == 3)
        };
        (done("rec", "ok") && done("broken", "failed")).then_some(())
    });
    let (status, _, body) = http(&serve.addr, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "GET /metrics");
    let exposition = String::from_utf8_lossy(&body);
    let exposed = exposed_names(&exposition);

    let mut used = metric_names(&dash);
    used.extend(metric_names(&rules));
    assert!(
        used.len() >= 10,
        "the dashboard and the alerts should use the service's metrics; found only {used:?}"
    );
    let missing: Vec<&String> = used.iter().filter(|n| !exposed.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "contrib/ uses metrics that /metrics does not expose: {missing:?}\n/metrics:\n{exposition}"
    );
    // Per-hook series exist for both hooks.
    for hook in ["rec", "broken"] {
        assert!(
            exposition.contains(&format!("hermes_hooks_dispatched_total{{hook=\"{hook}\"}}")),
            "/metrics should have a dispatched series for {hook}:\n{exposition}"
        );
    }
}

#[test]
fn launchd_plist_is_a_well_formed_property_list() {
    // The plist cannot be run here (no launchd); check it is what launchd would parse, with
    // python3's plistlib (python3 is needed by the tests anyway).
    let (path, _) = repo_file("contrib/launchd/dev.hermes-hooks.plist");
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, plistlib, sys; print(json.dumps(plistlib.load(open(sys.argv[1], 'rb'))))",
        ])
        .arg(&path)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{} is not a well-formed property list: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let plist: Value = serde_json::from_slice(&out.stdout).expect("plist as JSON");
    assert_eq!(plist["Label"], "dev.hermes-hooks");
    assert_eq!(plist["ProgramArguments"][1], "serve");
    assert!(
        plist["ExitTimeOut"].as_u64().is_some_and(|t| t > 5),
        "launchd must wait longer than the 5 s drain before SIGKILL: {plist}"
    );
    assert_eq!(
        plist["Umask"],
        json!(0o027),
        "files hooks create must not be group/other-writable"
    );
}
