//! Trust (DESIGN 12): permission refusals, handlers leaving their directory, `--trust explicit`
//! approvals through the real binary, and `enable`/`disable` editing HOOK.yaml byte for byte.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use hermes_hooks::{Host, LoadReport, SkipCode, Skipped};
use hermes_hooks::{TrustMode, TrustPolicy};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::util::{Hooks, bin, config, set_mode};

const T: Duration = Duration::from_secs(20);
const SCRIPT: &str = "#!/bin/sh\necho '{\"ran\": true}'\n";

fn skipped<'a>(report: &'a LoadReport, name: &str) -> &'a Skipped {
    report
        .skipped
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} not skipped: {report:#?}"))
}

async fn load(hooks: &Hooks, insecure: bool) -> (Host, LoadReport) {
    let mut cfg = config(hooks);
    cfg.trust = TrustPolicy {
        mode: TrustMode::All,
        insecure_permissions: insecure,
    };
    Host::start(cfg).await
}

fn run(hooks: &Hooks, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env_remove("HERMES_HOOKS_TRUST")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `list --json` skip entries by name: (code, reason).
fn list_skipped(hooks: &Hooks, extra: &[&str]) -> (Vec<String>, Vec<(String, String, String)>) {
    let mut args = vec!["list", "--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = run(hooks, &args);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let loaded = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap().to_string())
        .collect();
    let skipped = v["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["code"].as_str().unwrap().to_string(),
                s["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (loaded, skipped)
}

fn sha256_hex(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// --- permissions ---

#[testenv::needs(shared_group)]
#[tokio::test]
async fn group_writable_hook_directory_is_refused() {
    let hooks = Hooks::new();
    let dir = hooks.exec("gw", "[agent:start]", SCRIPT);
    set_mode(&dir, 0o775);
    // Group-writable is fine for the owner's private group (issue 19): make the group shared.
    let shared = crate::dropin::shared_gid().expect("a group other than this user's private one");
    std::os::unix::fs::lchown(&dir, None, Some(shared)).unwrap();
    let (host, report) = load(&hooks, false).await;
    assert!(report.loaded.is_empty());
    let s = skipped(&report, "gw");
    assert_eq!(s.code, SkipCode::Permissions);
    assert_eq!(s.file, dir);
    assert!(
        s.reason.contains(&dir.display().to_string()),
        "{}",
        s.reason
    );
    assert!(
        s.reason
            .contains("writable by its group, which is not the owner's private group (mode 0775)"),
        "{}",
        s.reason
    );
    assert!(s.reason.contains("chmod -R go-w"), "{}", s.reason);
    assert!(s.reason.contains("--insecure-permissions"), "{}", s.reason);
    host.shutdown(T).await;

    // --insecure-permissions overrides.
    let (host, report) = load(&hooks, true).await;
    assert_eq!(report.loaded, vec!["gw"], "{:?}", report.skipped);
    host.shutdown(T).await;
}

#[tokio::test]
async fn world_writable_handler_and_manifest_are_refused() {
    let hooks = Hooks::new();
    let dir = hooks.exec("ww", "[agent:start]", SCRIPT);
    set_mode(&dir.join("handler"), 0o777);
    let (host, report) = load(&hooks, false).await;
    let s = skipped(&report, "ww");
    assert_eq!(s.code, SkipCode::Permissions);
    assert_eq!(s.file, dir.join("handler"));
    assert!(
        s.reason
            .contains("writable by group and others (mode 0777)"),
        "{}",
        s.reason
    );
    host.shutdown(T).await;

    set_mode(&dir.join("handler"), 0o755);
    set_mode(&dir.join("HOOK.yaml"), 0o646);
    let (host, report) = load(&hooks, false).await;
    let s = skipped(&report, "ww");
    assert_eq!(s.file, dir.join("HOOK.yaml"));
    assert!(
        s.reason.contains("writable by others (mode 0646)"),
        "{}",
        s.reason
    );
    host.shutdown(T).await;

    // Through the binary: check reports it and fails; the flag makes it load.
    let (code, out, _) = run(&hooks, &["check"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("mode 0646"), "{out}");
    let (code, out, _) = run(&hooks, &["check", "--insecure-permissions"]);
    assert_eq!(code, 0, "{out}");
}

#[testenv::needs(root, "needs root to chown a file to uid 65534")]
#[tokio::test]
async fn foreign_owner_is_refused() {
    let hooks = Hooks::new();
    let dir = hooks.exec("foreign", "[agent:start]", SCRIPT);
    std::os::unix::fs::chown(dir.join("handler"), Some(65534), Some(65534)).unwrap();
    let (host, report) = load(&hooks, false).await;
    let s = skipped(&report, "foreign");
    assert_eq!(s.code, SkipCode::Permissions);
    assert_eq!(s.file, dir.join("handler"));
    assert!(s.reason.contains("owned by uid 65534"), "{}", s.reason);
    assert!(s.reason.contains("chown -R 0"), "{}", s.reason);
    host.shutdown(T).await;

    // The directory too; root-owned files are fine.
    std::os::unix::fs::chown(dir.join("handler"), Some(0), Some(0)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
    let (host, report) = load(&hooks, false).await;
    assert_eq!(skipped(&report, "foreign").file, dir);
    host.shutdown(T).await;
    std::os::unix::fs::chown(&dir, Some(0), None).unwrap();
    let (host, report) = load(&hooks, false).await;
    assert_eq!(report.loaded, vec!["foreign"]);
    host.shutdown(T).await;
}

// --- handler paths ---

#[tokio::test]
async fn handler_paths_leaving_the_directory_are_refused() {
    let hooks = Hooks::new();
    let outside = hooks.tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("evil.sh"), SCRIPT).unwrap();
    std::fs::write(
        outside.join("handler.py"),
        "def handle(e, c):\n    return 1\n",
    )
    .unwrap();

    hooks.add(
        "dotdot",
        &[(
            "HOOK.yaml",
            "events: [agent:start]\nhandler: ../../outside/evil.sh\n",
        )],
    );
    hooks.add(
        "absolute",
        &[(
            "HOOK.yaml",
            &format!(
                "events: [agent:start]\nhandler: {}\n",
                outside.join("evil.sh").display()
            ),
        )],
    );
    let link = hooks.add(
        "link",
        &[("HOOK.yaml", "events: [agent:start]\nhandler: run.sh\n")],
    );
    std::os::unix::fs::symlink(outside.join("evil.sh"), link.join("run.sh")).unwrap();
    // No `handler:`: the default handler.py is a symlink out of the directory.
    let implicit = hooks.add("implicit", &[("HOOK.yaml", "events: [agent:start]\n")]);
    std::os::unix::fs::symlink(outside.join("handler.py"), implicit.join("handler.py")).unwrap();
    // A symlink that stays inside is fine.
    let inside = hooks.add(
        "inside",
        &[
            ("HOOK.yaml", "events: [agent:start]\n"),
            ("real.sh", SCRIPT),
        ],
    );
    std::os::unix::fs::symlink(inside.join("real.sh"), inside.join("handler.sh")).unwrap();

    let (host, report) = load(&hooks, false).await;
    assert_eq!(report.loaded, vec!["inside"], "{:#?}", report.skipped);
    for (name, needle) in [
        ("dotdot", "uses `..`"),
        ("absolute", "absolute path"),
        ("link", "symlink escape"),
        ("implicit", "symlink escape"),
    ] {
        let s = skipped(&report, name);
        assert_eq!(s.code, SkipCode::HandlerOutside, "{name}: {s:?}");
        assert!(s.reason.contains(needle), "{name}: {}", s.reason);
    }
    host.shutdown(T).await;
}

// --- --trust explicit ---

#[test]
fn explicit_mode_approve_change_reapprove_revoke() {
    let hooks = Hooks::new();
    let dir = hooks.exec("audited", "[agent:start]", SCRIPT);
    hooks.exec("other", "[agent:start]", SCRIPT);
    let handler = dir.join("handler");
    let trust_file = hooks.home().join("hooks-trust.json");
    let explicit = ["--trust", "explicit"];

    // Not approved: skipped with the command to run.
    let (loaded, skipped) = list_skipped(&hooks, &explicit);
    assert!(loaded.is_empty(), "{loaded:?}");
    let (_, code, reason) = skipped.iter().find(|s| s.0 == "audited").unwrap();
    assert_eq!(code, "not_approved");
    assert!(reason.contains("hermes-hooks enable audited"), "{reason}");
    let (code, out, _) = run(&hooks, &["check", "--trust", "explicit"]);
    assert_eq!(code, 1, "{out}");
    // Without --trust explicit both load.
    assert_eq!(list_skipped(&hooks, &[]).0, vec!["audited", "other"]);

    // Approve: recorded with the handler's SHA-256, file mode 0600.
    let (code, out, err) = run(&hooks, &["enable", "audited", "--trust", "explicit"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("approved audited"), "{out}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&trust_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(&trust_file).unwrap()).unwrap();
    assert_eq!(recorded["hooks"]["audited"]["sha256"], sha256_hex(&handler));
    let (loaded, _) = list_skipped(&hooks, &explicit);
    assert_eq!(loaded, vec!["audited"]);
    // The environment variable selects the mode as well.
    let out = Command::new(bin())
        .args(["list", "--json", "--hooks-dir"])
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env("HERMES_HOOKS_TRUST", "explicit")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["hooks"].as_array().unwrap().len(), 1, "{v}");

    // Change the handler: refused until approved again.
    std::fs::write(&handler, "#!/bin/sh\necho '{\"ran\": \"changed\"}'\n").unwrap();
    let (loaded, skipped) = list_skipped(&hooks, &explicit);
    assert!(loaded.is_empty());
    let (_, code, reason) = skipped.iter().find(|s| s.0 == "audited").unwrap();
    assert_eq!(code, "not_approved");
    assert!(reason.contains("changed since it was approved"), "{reason}");
    assert!(reason.contains("hermes-hooks enable audited"), "{reason}");

    let (code, out, _) = run(&hooks, &["enable", "audited", "--trust", "explicit"]);
    assert_eq!(code, 0);
    assert!(out.contains("approved audited again"), "{out}");
    // Settings that change what runs (env, python, handler) need approving again too; a
    // comment or the description does not.
    let manifest = dir.join("HOOK.yaml");
    let original = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        format!("# reviewed\n{original}description: audited hook\n"),
    )
    .unwrap();
    assert_eq!(list_skipped(&hooks, &explicit).0, vec!["audited"]);
    std::fs::write(
        &manifest,
        format!("{original}env: {{LD_PRELOAD: /tmp/evil.so}}\n"),
    )
    .unwrap();
    let (loaded, skipped) = list_skipped(&hooks, &explicit);
    assert!(loaded.is_empty());
    let (_, _, reason) = skipped.iter().find(|s| s.0 == "audited").unwrap();
    assert!(
        reason.contains(
            "settings changed since it was approved (env.LD_PRELOAD: (unset) -> \"/tmp/evil.so\")"
        ),
        "{reason}"
    );
    std::fs::write(&manifest, &original).unwrap();
    assert_eq!(list_skipped(&hooks, &explicit).0, vec!["audited"]);
    let (code, out, _) = run(
        &hooks,
        &["test", "agent:start", "--json", "--trust", "explicit"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("changed"), "the approved version runs: {out}");

    // Revoke.
    let (code, out, _) = run(&hooks, &["disable", "audited", "--trust", "explicit"]);
    assert_eq!(code, 0);
    assert!(out.contains("revoked"), "{out}");
    assert!(list_skipped(&hooks, &explicit).0.is_empty());
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(&trust_file).unwrap()).unwrap();
    assert_eq!(recorded["hooks"], json!({}));
    // HOOK.yaml was never touched in explicit mode.
    assert_eq!(
        std::fs::read_to_string(dir.join("HOOK.yaml")).unwrap(),
        "name: audited\nevents: [agent:start]\n"
    );

    // Unknown names fail clearly.
    let (code, _, err) = run(&hooks, &["enable", "nope", "--trust", "explicit"]);
    assert_eq!(code, 1);
    assert!(err.contains("no hook named \"nope\""), "{err}");
}

#[test]
fn explicit_mode_covers_webhooks_by_url() {
    let hooks = Hooks::new();
    let dir = hooks.add(
        "hook-out",
        &[(
            "HOOK.yaml",
            "events: [agent:start]\nurl: http://127.0.0.1:9/a\n",
        )],
    );
    let explicit = ["--trust", "explicit"];
    assert!(list_skipped(&hooks, &explicit).0.is_empty());
    assert_eq!(
        run(&hooks, &["enable", "hook-out", "--trust", "explicit"]).0,
        0
    );
    assert_eq!(list_skipped(&hooks, &explicit).0, vec!["hook-out"]);
    std::fs::write(
        dir.join("HOOK.yaml"),
        "events: [agent:start]\nurl: http://127.0.0.1:9/b\n",
    )
    .unwrap();
    let (loaded, skipped) = list_skipped(&hooks, &explicit);
    assert!(loaded.is_empty());
    assert!(
        skipped[0].2.contains("url/secret_env changed"),
        "{skipped:?}"
    );
}

#[tokio::test]
async fn a_changed_handler_stops_on_reload_in_explicit_mode() {
    let hooks = Hooks::new();
    let dir = hooks.exec("x", "[agent:start]", SCRIPT);
    let (code, out, err) = run(&hooks, &["enable", "x", "--trust", "explicit"]);
    assert_eq!(code, 0, "{out}{err}");
    let mut cfg = config(&hooks);
    cfg.trust.mode = TrustMode::Explicit;
    let (host, report) = Host::start(cfg).await;
    assert_eq!(report.loaded, vec!["x"]);
    std::fs::write(dir.join("handler"), "#!/bin/sh\necho '\"tampered\"'\n").unwrap();
    let report = host.reload().await;
    assert!(
        report.loaded.is_empty(),
        "an unapproved version must not keep running: {report:?}"
    );
    assert_eq!(report.stopped, vec!["x"]);
    assert_eq!(skipped(&report, "x").code, SkipCode::NotApproved);
    assert_eq!(host.emit("agent:start", json!({})).unwrap(), 0);
    host.shutdown(T).await;
}

// --- enable/disable without --trust explicit: `enabled:` in HOOK.yaml ---

#[test]
fn disable_and_enable_flip_only_the_enabled_value() {
    let hooks = Hooks::new();
    let original = "# Audit hook -- keep this comment\r\n\
                    name: 'flip'   # quoted name\r\n\
                    enabled:   true    # toggled by hermes-hooks\r\n\
                    events:\r\n  - \"agent:start\"   # the only event\r\n\
                    env: {enabled: 'nested, untouched'}\r\n";
    let dir = hooks.add("flip-dir", &[("HOOK.yaml", original), ("handler", SCRIPT)]);
    set_mode(&dir.join("handler"), 0o755);
    let manifest = dir.join("HOOK.yaml");
    set_mode(&manifest, 0o640);

    let (code, out, err) = run(&hooks, &["disable", "flip"]);
    assert_eq!(code, 0, "{out}{err}");
    // The watcher sees the edit: no reload to ask for (issue 38).
    assert!(
        out.contains("a running service picks it up by itself"),
        "{out}"
    );
    let disabled = std::fs::read_to_string(&manifest).unwrap();
    assert_eq!(
        disabled,
        original.replace("enabled:   true", "enabled:   false")
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&manifest).unwrap().permissions().mode() & 0o777,
        0o640,
        "the file keeps its mode"
    );
    let (loaded, skipped) = list_skipped(&hooks, &[]);
    assert!(loaded.is_empty());
    assert_eq!(skipped[0].1, "disabled");

    // Disabling again changes nothing.
    let (code, out, _) = run(&hooks, &["disable", "flip"]);
    assert_eq!(code, 0);
    assert!(out.contains("already disabled"), "{out}");
    assert_eq!(std::fs::read_to_string(&manifest).unwrap(), disabled);

    let (code, _, _) = run(&hooks, &["enable", "flip"]);
    assert_eq!(code, 0);
    assert_eq!(
        std::fs::read_to_string(&manifest).unwrap(),
        original,
        "byte for byte"
    );
    assert_eq!(list_skipped(&hooks, &[]).0, vec!["flip"]);
}

#[test]
fn disable_appends_enabled_false_when_absent() {
    let hooks = Hooks::new();
    let original = "events: [agent:start]  # no enabled line\n# trailing comment";
    hooks.add("plain", &[("HOOK.yaml", original), ("handler.sh", SCRIPT)]);
    let manifest = hooks.root().join("plain/HOOK.yaml");
    let (code, out, err) = run(&hooks, &["disable", "plain"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(&manifest).unwrap(),
        format!("{original}\nenabled: false\n")
    );
    assert_eq!(list_skipped(&hooks, &[]).1[0].1, "disabled");
    assert_eq!(run(&hooks, &["enable", "plain"]).0, 0);
    assert_eq!(
        std::fs::read_to_string(&manifest).unwrap(),
        format!("{original}\nenabled: true\n")
    );
    assert_eq!(list_skipped(&hooks, &[]).0, vec!["plain"]);

    // A one-line flow mapping cannot be edited safely: refused, file untouched.
    let flow = "{events: [agent:start]}\n";
    hooks.add("flow", &[("HOOK.yaml", flow), ("handler.sh", SCRIPT)]);
    let (code, _, err) = run(&hooks, &["disable", "flow"]);
    assert_eq!(code, 1);
    assert!(err.contains("edit it by hand"), "{err}");
    assert_eq!(
        std::fs::read_to_string(hooks.root().join("flow/HOOK.yaml")).unwrap(),
        flow
    );
}
