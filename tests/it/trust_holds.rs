//! Issue 20: trust that holds. Every byte that runs was approved: one regression test per way
//! the review ran unapproved code (the issue's table rows, named `row_N_...`).

use std::time::Duration;

use hermes_hooks::Host;
use hermes_hooks::cli::set_enabled;
use hermes_hooks::{TrustMode, TrustPolicy};
use serde_json::json;

use crate::util::{
    Hooks, approve, approved_host, assert_edit_refused, collect_one, config, start_trusted as start,
};

const T: Duration = Duration::from_secs(20);

fn explicit() -> TrustPolicy {
    TrustPolicy {
        mode: TrustMode::Explicit,
        insecure_permissions: false,
    }
}

const UNLOADED: &str = "the hook was unloaded (refused at the reload its change caused)";

/// The outcome of `event` for the one hook on it; a refused hook may be gone already.
async fn outcome(host: &Host, event: &str) -> Result<Option<serde_json::Value>, String> {
    let out = host
        .emit_collect(event, json!({}), Duration::from_secs(15))
        .await
        .unwrap();
    match out.first() {
        Some(o) => o.result.clone(),
        None => Err(UNLOADED.to_string()),
    }
}

/// Row 2: a file sourced by an approved script, or read as a program by a tool it runs, is
/// covered whatever its name or mode: `lib.bash` (no `.sh`, no exec bit) and `fmt.awk`.
#[tokio::test]
async fn row_2_sourced_files_of_any_name_are_covered() {
    let hooks = Hooks::new();
    let dir = hooks.with_files(
        hooks.exec(
            "e",
            "[\"x:*\"]",
            "#!/bin/sh\n. \"$HERMES_HOOK_DIR/lib.bash\"\nawk -v v=\"$(value)\" -f \"$HERMES_HOOK_DIR/fmt.awk\" /dev/null\n",
        ),
        &[
            ("lib.bash", "value() { echo approved; }\n"),
            ("fmt.awk", "BEGIN { printf \"\\\"%s-awk\\\"\\n\", v }\n"),
        ],
    );
    let host = approved_host(&hooks, "e", "x:go", json!("approved-awk")).await;
    for (file, injected) in [
        ("lib.bash", "value() { echo injected; }\n"),
        ("fmt.awk", "BEGIN { printf \"\\\"injected\\\"\\n\" }\n"),
    ] {
        let before = std::fs::read(dir.join(file)).unwrap();
        std::fs::write(dir.join(file), injected).unwrap();
        let out = outcome(&host, "x:go").await;
        let err = out.expect_err("a call with an edited sourced file must be refused");
        assert!(
            err.contains(&format!("{file} changed")) || err == UNLOADED,
            "{err}"
        );
        std::fs::write(dir.join(file), before).unwrap();
        host.reload().await;
    }
    host.shutdown(T).await;
}

/// Row 9: revoking an approval stops the hook at once; the events still queued are reported as
/// not run (undelivered), none runs with the revoked code.
#[tokio::test]
async fn row_9_revoked_hook_does_not_drain_its_queue() {
    let hooks = Hooks::new();
    let ran = hooks.out().join("ran.txt");
    hooks.python(
        "slow",
        "[\"x:*\"]",
        &format!(
            "import time\n\ndef handle(event, context):\n    with open({:?}, 'a') as f:\n        f.write('x\\n')\n    time.sleep(0.05)\n",
            ran.display().to_string()
        ),
    );
    approve(&hooks, "slow");
    let (host, report) = start(&hooks, TrustMode::Explicit).await;
    assert_eq!(report.loaded, vec!["slow"], "{report:#?}");
    for _ in 0..100 {
        host.emit("x:go", json!({})).unwrap();
    }
    let count = || {
        std::fs::read_to_string(&ran)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    crate::util::poll_async(T, "the first event to run", || (count() > 0).then_some(())).await;
    set_enabled(&[hooks.root()], &hooks.home(), &explicit(), "slow", false).unwrap();
    let before = count();
    let report = host.reload().await;
    assert!(report.loaded.is_empty(), "{report:#?}");
    // Whatever the stopped version would still run has run once the host is shut down.
    host.shutdown(T).await;
    let after = count();
    // At most the call that was running when the reload came finishes its line.
    assert!(
        after <= before + 1,
        "{} events ran after the approval was revoked",
        after - before
    );
    let tally = host.accounts()["slow"];
    assert!(tally.balanced(), "{tally:?}");
    assert!(
        tally.undelivered + tally.failed >= 100 - after as u64,
        "queued events must be reported: {tally:?}"
    );
}

/// Row 1: a planted `__pycache__/helper.cpython-3X.pyc` whose header matches helper.py's mtime and
/// size never runs: Python reads bytecode only from the cache the service owns.
#[tokio::test]
async fn row_1_planted_bytecode_cache_never_runs() {
    let hooks = Hooks::new();
    let dir = hooks.with_files(
        hooks.python(
            "h",
            "[\"x:*\"]",
            "import helper\n\ndef handle(event, context):\n    return helper.VALUE\n",
        ),
        &[("helper.py", "VALUE = 'approved'\n")],
    );
    // Compile an injected helper under the same name, then restore helper.py's size and mtime so
    // the planted cache's header matches the approved source.
    let planted = dir.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("helper.py"), "VALUE = 'injected'\n").unwrap();
    let approved_meta = std::fs::metadata(dir.join("helper.py")).unwrap();
    let mtime = approved_meta.modified().unwrap();
    std::fs::File::options()
        .write(true)
        .open(planted.join("helper.py"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import py_compile, sys; print(py_compile.compile(sys.argv[1], cfile=sys.argv[2]))",
        ])
        .arg(planted.join("helper.py"))
        .arg(
            dir.join("__pycache__")
                .join(format!("helper.{}.pyc", python_tag())),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::remove_dir_all(&planted).unwrap();
    let host = approved_host(&hooks, "h", "x:go", json!("approved")).await;
    host.shutdown(T).await;
}

/// `cpython-311` for the `python3` on PATH.
fn python_tag() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.implementation.cache_tag)"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Row 3: a module the handler imports lazily, edited after the worker started (no watcher), is
/// refused at the import instead of run.
#[tokio::test]
async fn row_3_lazily_imported_module_is_checked_at_import() {
    let hooks = Hooks::new();
    let dir = hooks.with_files(
        hooks.python(
            "h",
            "[\"x:*\"]",
            "def handle(event, context):\n    if event == 'x:late':\n        import late\n        return late.VALUE\n    return 'started'\n",
        ),
        &[("late.py", "VALUE = 'approved'\n")],
    );
    let host = approved_host(&hooks, "h", "x:go", json!("started")).await;
    assert_edit_refused(host, &dir.join("late.py"), "VALUE = 'injected'\n", "x:late").await;
}

/// Row 10: the service's own cache directory (where the runner lives) is not an import location,
/// for a forked worker and for one started from scratch (an `env:` with `PYTHON*` forces that).
#[tokio::test]
async fn row_10_runner_directory_is_not_on_the_import_path() {
    let hooks = Hooks::new();
    let code = "def handle(event, context):\n    try:\n        import planted_in_cache\n    except ImportError:\n        return 'clean'\n    return 'planted'\n";
    hooks.python("forked", "[\"x:forked\"]", code);
    hooks.add(
        "fresh",
        &[
            (
                "HOOK.yaml",
                "name: fresh\nevents: [\"x:fresh\"]\nenv:\n  PYTHONHASHSEED: \"0\"\n",
            ),
            ("handler.py", code),
        ],
    );
    let cache = config(&hooks).runtime_dir;
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("planted_in_cache.py"), "").unwrap();
    let (host, report) = start(&hooks, TrustMode::All).await;
    assert_eq!(report.loaded, vec!["forked", "fresh"], "{report:#?}");
    for event in ["x:forked", "x:fresh"] {
        assert_eq!(
            collect_one(&host, event, json!({})).await,
            Ok(Some(json!("clean"))),
            "{event}"
        );
    }
    host.shutdown(T).await;
}

/// Row 7: an executable swapped by rename between the check and the exec never runs: the process
/// starts from the descriptor whose bytes were checked.
#[tokio::test]
async fn row_7_swapped_executable_never_runs() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let hooks = Hooks::new();
    let good = "#!/bin/sh\necho '\"approved\"'\n";
    let evil = "#!/bin/sh\necho '\"injected\"'\n";
    let dir = hooks.exec("e", "[\"x:*\"]", good);
    approve(&hooks, "e");
    let (host, report) = start(&hooks, TrustMode::Explicit).await;
    assert_eq!(report.loaded, vec!["e"], "{report:#?}");
    let staging = hooks.tmp.path().join("staging");
    std::fs::create_dir(&staging).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, staging, handler) = (stop.clone(), staging.clone(), dir.join("handler"));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for content in [evil, good] {
                    let tmp = staging.join(format!("h{n}"));
                    n += 1;
                    std::fs::write(&tmp, content).unwrap();
                    crate::util::set_mode(&tmp, 0o755);
                    std::fs::rename(&tmp, &handler).unwrap();
                }
            }
        })
    };
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..200 {
        let out = outcome(&host, "x:go").await;
        let key = match out {
            Ok(v) => format!("{v:?}"),
            Err(e) if e.contains("not started") => "refused".to_string(),
            Err(e) => format!("error: {e}"),
        };
        *outcomes.entry(key).or_insert(0) += 1;
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    eprintln!("row 7 outcomes: {outcomes:?}");
    assert!(
        outcomes.keys().all(|k| !k.contains("injected")),
        "the swapped-in executable ran: {outcomes:?}"
    );
    host.shutdown(T).await;
}

/// Zombie children of `pid`.
fn zombie_children(pid: u32) -> usize {
    crate::util::child_pids(pid)
        .into_iter()
        .filter(|kid| {
            let stat = std::fs::read_to_string(format!("/proc/{kid}/stat")).unwrap_or_default();
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_string));
            state.as_deref() == Some("Z")
        })
        .count()
}

/// Sends 20 events to an exec hook that leaves a short-lived background process behind each
/// time, through a `serve` started by `cmd`, whose service process is `service_pid(serve)`; then
/// every orphan must be reaped.
fn orphans_are_reaped(mut cmd: std::process::Command, service_pid: impl Fn(u32) -> u32) {
    let hooks = Hooks::new();
    hooks.exec(
        "bg",
        "[\"x:*\"]",
        "#!/bin/sh\n(sleep 0.05 </dev/null >/dev/null 2>&1 &)\necho null\n",
    );
    cmd.arg(crate::util::bin())
        .arg("serve")
        .arg("--hooks-dir")
        .arg(hooks.root())
        .args(["--listen", "127.0.0.1:0"]);
    let serve = crate::util::Serve::spawn(cmd, &hooks);
    let pid = service_pid(serve.child.id());
    for _ in 0..20 {
        let (status, body) = serve.post("/v1/collect", &json!({"event": "x:go"}));
        assert_eq!(status, 200, "{body}");
    }
    crate::util::poll(Duration::from_secs(10), "every orphan reaped", || {
        (zombie_children(pid) == 0).then_some(())
    });
    // Stop the service itself (a wrapper such as unshare does not forward signals).
    crate::util::signal(pid, libc::SIGTERM);
}

/// Also in issue 20: as PID 1 (in a new PID namespace, as in a container) the service reaps the
/// orphans its hooks leave behind instead of collecting zombies. Needs `unshare` (root); where
/// it cannot run, `cargo test` lists it as ignored with the reason (issue 50: it returned early
/// and counted as passed).
#[testenv::needs(pid_namespace)]
#[test]
fn orphans_of_hooks_are_reaped_when_the_service_is_pid_1() {
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
    // The service is unshare's one child.
    orphans_are_reaped(cmd, |unshare| {
        let kids = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .unwrap_or_default();
        kids.split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("unshare's child")
    });
}

/// The same with `HERMES_HOOKS_SUBREAPER=1` outside a container.
#[test]
fn orphans_of_hooks_are_reaped_by_a_subreaper_service() {
    let mut cmd = std::process::Command::new("env");
    cmd.arg(format!("{}=1", "HERMES_HOOKS_SUBREAPER"));
    // `env` execs the service: same pid.
    orphans_are_reaped(cmd, |pid| pid);
}

/// `check --trust explicit` says every file an approval covers, and what is left out as data.
#[test]
fn check_reports_every_covered_file() {
    let hooks = Hooks::new();
    hooks.add(
        "h",
        &[
            (
                "HOOK.yaml",
                "name: h\nevents: [\"x:*\"]\ndata: [\"state/\"]\n",
            ),
            (
                "handler.py",
                "import helper\n\ndef handle(e, c):\n    return helper.V\n",
            ),
            ("helper.py", "V = 1\n"),
            ("lib.bash", "v() { :; }\n"),
            ("state/seen.json", "{}\n"),
            ("hook.log", "line\n"),
        ],
    );
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::util::bin())
            .args(args)
            .arg("--hooks-dir")
            .arg(hooks.root())
            .args(["--trust", "explicit"])
            .env("HERMES_HOME", hooks.home())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}");
        text
    };
    run(&["enable", "h"]);
    let out = run(&["check"]);
    for file in ["handler.py", "helper.py", "lib.bash"] {
        assert!(
            out.contains(&format!("covers  {file}  sha256 ")),
            "{file}:\n{out}"
        );
    }
    assert!(!out.contains("covers  state/"), "{out}");
    assert!(!out.contains("covers  hook.log"), "{out}");
    assert!(out.contains("data    __pycache__/, *.log, state/"), "{out}");
}

/// The checked imports keep what hooks rely on: packages, relative imports, namespace packages,
/// `__file__`; a module under a `data:` directory is not code and is refused.
#[tokio::test]
async fn checked_imports_keep_packages_working() {
    let hooks = Hooks::new();
    hooks.add(
        "pk",
        &[
            ("HOOK.yaml", "name: pk\nevents: [\"x:*\"]\ndata: [\"state/\"]\n"),
            (
                "handler.py",
                "import os\nimport pkg\nfrom ns import mod\n\ndef handle(event, context):\n    if event == 'x:data':\n        import state.planted\n    return [pkg.VALUE, mod.VALUE, os.path.basename(pkg.sub.__file__)]\n",
            ),
            ("pkg/__init__.py", "from . import sub\nVALUE = sub.VALUE\n"),
            ("pkg/sub.py", "VALUE = 'pkg'\n"),
            ("ns/mod.py", "VALUE = 'ns'\n"),
            ("state/planted.py", "raise SystemExit('data ran')\n"),
        ],
    );
    let host = approved_host(&hooks, "pk", "x:go", json!(["pkg", "ns", "sub.py"])).await;
    let err = collect_one(&host, "x:data", json!({}))
        .await
        .expect_err("a module under a data directory is not imported");
    assert!(err.contains("state/planted.py is not among"), "{err}");
    host.shutdown(T).await;
}

/// Issue 47, row 5: an approved executable rewritten through a shared mapping, so that its
/// size, mtime, ctime and inode stay what they were (tmpfs: writes through a mapping never
/// touch the times; ext4: a second write through a mapping whose page is already dirty), ran
/// its new bytes under `--trust explicit`: the checks trusted the unchanged `stat`. The handler
/// now runs from a sealed private copy made when it was loaded and checked: the approved bytes
/// run.
async fn the_approved_bytes_run_after_a_stat_preserving_rewrite(base: &std::path::Path) {
    let tmp = tempfile::tempdir_in(base).unwrap();
    for d in ["hooks", "home", "out"] {
        std::fs::create_dir_all(tmp.path().join(d)).unwrap();
    }
    let hooks = crate::util::Hooks { tmp };
    // A `.sh` handler without the run bit: `sh` reads it (through the service's descriptor),
    // so a live writable mapping does not make its start fail (ETXTBSY) as an exec would.
    let script = "cat >/dev/null\necho '{\"v\": \"approved\"}'\n";
    let dir = hooks.add(
        "mapped",
        &[
            ("HOOK.yaml", "name: mapped\nevents: [\"command:run\"]\n"),
            ("handler.sh", script),
        ],
    );
    let handler = dir.join("handler.sh");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&handler)
        .unwrap();
    let len = script.len();
    // SAFETY: a shared mapping of `len` bytes of a file of that size, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let bytes = map as *mut u8;
    // The first write through the mapping (the same byte): on ext4 it updates the times once;
    // the page then stays writable and dirty, and further writes do not.
    // SAFETY: within the mapping.
    unsafe { bytes.write_volatile(b'c') };
    // Past the racy window of trust/racy.rs (50 ms on these file systems): from now on the
    // hash caches trust the file's unchanged stat, as they would for a file written long ago.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let host =
        crate::util::approved_host(&hooks, "mapped", "command:run", json!({"v": "approved"})).await;
    let key = |m: std::fs::Metadata| {
        use std::os::unix::fs::MetadataExt;
        (
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.ino(),
        )
    };
    let before = key(std::fs::metadata(&handler).unwrap());
    let at = script.find("approved").unwrap();
    for (i, b) in b"REPLACED".iter().enumerate() {
        // SAFETY: within the mapping (the word is inside the script).
        unsafe { bytes.add(at + i).write_volatile(*b) };
    }
    assert!(
        std::fs::read_to_string(&handler)
            .unwrap()
            .contains("REPLACED")
    );
    let after = key(std::fs::metadata(&handler).unwrap());
    if base.starts_with("/dev/shm") {
        assert_eq!(
            before, after,
            "tmpfs keeps the file's stat through the rewrite"
        );
    }
    let got = crate::util::collect_one(&host, "command:run", json!({})).await;
    match got {
        Ok(Some(v)) => assert_eq!(v, json!({"v": "approved"}), "unapproved bytes ran"),
        Err(e) => assert!(e.contains("changed"), "{e}"),
        other => panic!("{other:?}"),
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, len) };
    host.shutdown(std::time::Duration::from_secs(20)).await;
}

#[tokio::test]
async fn a_rewrite_through_a_shared_mapping_on_tmpfs_never_runs() {
    the_approved_bytes_run_after_a_stat_preserving_rewrite(std::path::Path::new("/dev/shm")).await;
}

#[tokio::test]
async fn a_rewrite_through_a_shared_mapping_on_disk_never_runs() {
    // A directory on the disk (ext4 here), not a tmpfs.
    let disk = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    the_approved_bytes_run_after_a_stat_preserving_rewrite(&disk).await;
}

/// Issue 47, row 5, Python: a handler.py rewritten through a shared mapping on tmpfs (its stat
/// unchanged) and a worker restart: the runner hashes the bytes it reads and compiles exactly
/// those, so the rewrite is refused at import; never run.
#[tokio::test]
async fn a_python_handler_rewritten_through_a_shared_mapping_never_runs() {
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    for d in ["hooks", "home", "out"] {
        std::fs::create_dir_all(tmp.path().join(d)).unwrap();
    }
    let hooks = crate::util::Hooks { tmp };
    let code = "import os\n\ndef handle(e, c):\n    if e == 'agent:crash':\n        os._exit(3)\n    return 'approved'\n";
    let dir = hooks.python("mapped-py", r#"["command:run", "agent:crash"]"#, code);
    let handler = dir.join("handler.py");
    std::thread::sleep(std::time::Duration::from_millis(300)); // past the caches' racy window
    let host =
        crate::util::approved_host(&hooks, "mapped-py", "command:run", json!("approved")).await;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&handler)
        .unwrap();
    // SAFETY: a shared mapping of the file's bytes, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            code.len(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let at = code.find("approved").unwrap();
    for (i, b) in b"REPLACED".iter().enumerate() {
        // SAFETY: within the mapping.
        unsafe { (map as *mut u8).add(at + i).write_volatile(*b) };
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, code.len()) };
    drop(file);
    let _ = crate::util::collect_one(&host, "agent:crash", json!({})).await;
    let got = crate::util::collect_one(&host, "command:run", json!({})).await;
    assert_ne!(got, Ok(Some(json!("REPLACED"))), "unapproved bytes ran");
    host.shutdown(std::time::Duration::from_secs(20)).await;
}
