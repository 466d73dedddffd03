//! Hook packages (`install`, `update`, `remove`, `hooks.lock`): local bare repositories made
//! here (`git init --bare`, commits, tags) reached through `file://` and the shorthand base
//! `HERMES_HOOKS_GIT_BASE`, directories, and archives built here, hostile ones included.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::util::{Hooks, Serve, bin, poll};

/// A bare repository `BASE/owner/name.git` and a work tree to commit from.
struct Repo {
    bare: PathBuf,
    work: PathBuf,
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Repo {
    fn new(base: &Path, owner_name: &str) -> Self {
        let bare = base.join(format!("{owner_name}.git"));
        std::fs::create_dir_all(&bare).unwrap();
        git(&bare, &["init", "-q", "--bare", "-b", "main"]);
        let work = base.join(format!("{owner_name}.work"));
        std::fs::create_dir_all(&work).unwrap();
        git(&work, &["init", "-q", "-b", "main"]);
        Self { bare, work }
    }

    /// Writes `files`, removes `gone`, commits, pushes; returns the commit.
    fn commit(&self, files: &[(&str, &str)], gone: &[&str]) -> String {
        for (rel, text) in files {
            let p = self.work.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, text).unwrap();
        }
        for rel in gone {
            std::fs::remove_file(self.work.join(rel)).unwrap();
        }
        git(&self.work, &["add", "-A"]);
        git(&self.work, &["commit", "-q", "-m", "c"]);
        let bare = self.bare.display().to_string();
        git(&self.work, &["push", "-q", "--tags", &bare, "main"]);
        git(&self.work, &["rev-parse", "HEAD"])
    }

    fn tag(&self, tag: &str) {
        git(&self.work, &["tag", tag]);
        let bare = self.bare.display().to_string();
        git(&self.work, &["push", "-q", &bare, tag]);
    }
}

/// Runs the binary with HERMES_HOME and the shorthand base of `hooks`' temporary directory.
fn hh(hooks: &Hooks, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .arg("--hooks-dir")
        .arg(hooks.root())
        .env("HERMES_HOME", hooks.home())
        .env(
            "HERMES_HOOKS_GIT_BASE",
            format!("file://{}/", base(hooks).display()),
        )
        .env_remove("HERMES_HOOKS_TRUST")
        .output()
        .unwrap()
}

fn base(hooks: &Hooks) -> PathBuf {
    hooks.tmp.path().join("remote")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn lock(hooks: &Hooks) -> Value {
    std::fs::read_to_string(hooks.home().join("hooks.lock"))
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap_or(Value::Null)
}

/// The names in the hook root, hidden ones included (a staging directory left behind shows).
fn root_entries(hooks: &Hooks) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(hooks.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn manifest(name: Option<&str>, events: &str) -> String {
    match name {
        Some(n) => format!("name: {n}\nevents: {events}\n"),
        None => format!("events: {events}\n"),
    }
}

fn answer(v: u32) -> String {
    format!("def handle(event, context):\n    return {{'v': {v}}}\n")
}

/// A repository with two hooks under `hooks/` and an install script at its top.
fn two_hook_repo(hooks: &Hooks) -> (Repo, String) {
    let repo = Repo::new(&base(hooks), "acme/pack");
    let c1 = repo.commit(
        &[
            ("hooks/alpha/HOOK.yaml", &manifest(None, "[\"test:alpha\"]")),
            ("hooks/alpha/handler.py", &answer(1)),
            (
                "hooks/beta/HOOK.yaml",
                &manifest(Some("beta"), "[\"test:beta\"]"),
            ),
            ("hooks/beta/handler.py", &answer(1)),
            ("install.sh", "touch /tmp/should-never-exist\n"),
            ("README.md", "two hooks\n"),
        ],
        &[],
    );
    repo.tag("v1");
    (repo, c1)
}

#[test]
fn shorthands_subdirectories_refs_and_all_install_from_local_repositories() {
    let hooks = Hooks::new();
    let (repo, c1) = two_hook_repo(&hooks);
    repo.commit(&[("hooks/alpha/handler.py", &answer(2))], &[]);

    // Two hooks and no --all: listed, nothing installed.
    let o = hh(&hooks, &["install", "acme/pack"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("hooks/alpha") && text(&o).contains("--all"),
        "{}",
        text(&o)
    );
    assert!(
        root_entries(&hooks).is_empty(),
        "{:?}",
        root_entries(&hooks)
    );

    // owner/repo/subdir at a tag: the tag's commit, pinned in the lock file.
    let o = hh(&hooks, &["install", "acme/pack/hooks/alpha", "--ref", "v1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("insecure or local URL scheme"),
        "{}",
        text(&o)
    );
    let e = &lock(&hooks)["hooks"]["alpha"];
    assert_eq!(e["ref"], "v1");
    assert_eq!(e["commit"], c1.as_str());
    assert_eq!(e["path"], "hooks/alpha");
    assert!(e["tree"].as_str().unwrap().starts_with("sha256:"));
    let handler = std::fs::read_to_string(hooks.root().join("alpha/handler.py")).unwrap();
    assert_eq!(handler, answer(1), "the tag's version, not main's");
    // The install script was shown, not run.
    assert!(!Path::new("/tmp/should-never-exist").exists());
    assert!(!hooks.root().join("alpha/.git").exists());

    // list shows where it came from and which version.
    let o = hh(&hooks, &["list", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let pkg = &v["hooks"][0]["package"];
    assert_eq!(pkg["source"], "acme/pack/hooks/alpha", "{v}");
    assert_eq!(pkg["version"], format!("v1@{}", &c1[..12]));
    let o = hh(&hooks, &["list"]);
    assert!(
        text(&o).contains("installed from acme/pack/hooks/alpha (v1@"),
        "{}",
        text(&o)
    );

    // A browser URL names its ref; URL#subdir; a renamed hook.
    let url = format!(
        "file://{}/acme/pack/tree/v1/hooks/beta",
        base(&hooks).display()
    );
    let o = hh(&hooks, &["install", &url]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(lock(&hooks)["hooks"]["beta"]["ref"], "v1");
    let o = hh(&hooks, &["remove", "beta"]);
    assert!(o.status.success(), "{}", text(&o));
    let url = format!("file://{}#hooks/alpha", repo.bare.display());
    let o = hh(&hooks, &["install", &url, "--name", "alpha-main"]);
    assert!(o.status.success(), "{}", text(&o));
    let handler = std::fs::read_to_string(hooks.root().join("alpha-main/handler.py")).unwrap();
    assert_eq!(handler, answer(2), "the default branch");

    // --all installs every hook at once; one already installed is skipped, saying so, and the
    // rest are installed (issue 50: a clash used to refuse all of them).
    let o = hh(&hooks, &["install", "acme/pack", "--all"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("skipped alpha: already installed"),
        "{}",
        text(&o)
    );
    assert!(hooks.root().join("beta").exists());
    for name in ["alpha", "alpha-main", "beta"] {
        assert!(hh(&hooks, &["remove", name]).status.success());
    }
    let o = hh(&hooks, &["install", "acme/pack", "--all", "--ref", "v1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("install.sh (shown, not run"),
        "{}",
        text(&o)
    );
    assert_eq!(root_entries(&hooks), vec!["alpha", "beta"]);
    let o = hh(&hooks, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("2 hook(s) ok"), "{}", text(&o));
}

#[test]
fn directories_are_copied_or_linked_and_check_sees_hand_edits() {
    let hooks = Hooks::new();
    let src = hooks.tmp.path().join("src/greeter");
    std::fs::create_dir_all(&src).unwrap();
    let yaml = format!("{}data: [\"state/\"]\n", manifest(None, "[\"test:hi\"]"));
    std::fs::write(src.join("HOOK.yaml"), yaml).unwrap();
    std::fs::write(src.join("handler.py"), answer(1)).unwrap();
    // What a killed install left behind a day ago goes; a running one's is left alone.
    let (stale, fresh) = (
        hooks.root().join(".hermes-install-killed"),
        hooks.root().join(".hermes-install-running"),
    );
    for d in [&stale, &fresh] {
        std::fs::create_dir_all(d.join("land/x")).unwrap();
    }
    let day_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 24 * 3600);
    std::fs::File::open(&stale)
        .unwrap()
        .set_modified(day_ago)
        .unwrap();
    let s = src.display().to_string();
    let o = hh(&hooks, &["install", &s]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!stale.exists() && fresh.exists());
    std::fs::remove_dir_all(&fresh).unwrap();
    assert!(!hooks.root().join("greeter").is_symlink());
    let o = hh(&hooks, &["install", &s, "--link", "--name", "greeter-dev"]);
    assert!(o.status.success(), "{}", text(&o));
    let link = hooks.root().join("greeter-dev");
    assert_eq!(std::fs::read_link(&link).unwrap(), src);
    let o = hh(&hooks, &["check"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("no longer match"), "{}", text(&o));

    // What the hook writes as data is no edit, and an update keeps it.
    let state = hooks.root().join("greeter/state/seen.json");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    std::fs::write(&state, "{}").unwrap();
    let o = hh(&hooks, &["check"]);
    assert!(!text(&o).contains("no longer match"), "{}", text(&o));
    // An edit by hand of the copy: check says so.
    std::fs::write(hooks.root().join("greeter/handler.py"), answer(9)).unwrap();
    let o = hh(&hooks, &["check"]);
    let out = text(&o);
    assert!(
        out.contains("warning greeter: its files no longer match hooks.lock"),
        "{out}"
    );
    assert!(!out.contains("warning greeter-dev"), "{out}");
    // update puts the published version back: after a yes, the edit being replaced (issue 50).
    let o = hh(&hooks, &["update", "greeter"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("edited by hand"), "{}", text(&o));
    let o = hh(&hooks, &["update", "greeter", "--yes"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("changed  handler.py"), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(hooks.root().join("greeter/handler.py")).unwrap(),
        answer(1)
    );
    assert_eq!(std::fs::read_to_string(&state).unwrap(), "{}", "data kept");
    assert!(!text(&o).contains("state/"), "{}", text(&o));

    // A linked hook is edited in its source on purpose: `update` replaces nothing of it and
    // does not ask (issue 50's hand-edit question is for copies).
    std::fs::write(src.join("handler.py"), answer(7)).unwrap();
    let o = hh(&hooks, &["update", "greeter-dev"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("edited by hand"), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(src.join("handler.py")).unwrap(),
        answer(7)
    );

    // remove deletes the copy (and only the link of a linked one).
    let state_dir = hooks.home().join("hook-state/greeter");
    std::fs::create_dir_all(&state_dir).unwrap();
    assert!(hh(&hooks, &["remove", "greeter"]).status.success());
    assert!(state_dir.exists(), "kept without --purge");
    let dev_state = hooks.home().join("hook-state/greeter-dev");
    std::fs::create_dir_all(&dev_state).unwrap();
    let o = hh(&hooks, &["remove", "greeter-dev", "--purge"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!dev_state.exists(), "deleted with --purge");
    assert!(
        src.join("handler.py").exists(),
        "a linked source is left alone"
    );
    assert!(root_entries(&hooks).is_empty());
    assert_eq!(lock(&hooks)["hooks"], json!({}));
    let o = hh(&hooks, &["remove", "greeter"]);
    assert_eq!(o.status.code(), Some(1));
}

/// A gzip-compressed tar written header by header, so hostile names, links and sizes can be
/// made: `(name, type, declared size, data, link target)`.
fn raw_tar_gz(entries: &[(&str, tar::EntryType, u64, &[u8], &str)]) -> Vec<u8> {
    let mut tar = Vec::new();
    for (name, kind, size, data, link) in entries {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(*size);
        h.set_mode(0o644);
        h.set_cksum();
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(data);
        tar.resize(tar.len().div_ceil(512) * 512, 0);
    }
    tar.extend_from_slice(&[0u8; 1024]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    gz.finish().unwrap()
}

fn file<'a>(name: &'a str, data: &'a [u8]) -> (&'a str, tar::EntryType, u64, &'a [u8], &'a str) {
    (name, tar::EntryType::Regular, data.len() as u64, data, "")
}

fn zip_of(entries: &[(&str, &str)], links: &[(&str, &str)]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, text) in entries {
        z.start_file(*name, SimpleFileOptions::default()).unwrap();
        z.write_all(text.as_bytes()).unwrap();
    }
    for (name, target) in links {
        z.add_symlink(*name, *target, SimpleFileOptions::default())
            .unwrap();
    }
    z.finish().unwrap().into_inner()
}

#[test]
fn archives_install_and_hostile_packages_are_refused_before_anything_is_written() {
    let hooks = Hooks::new();
    let dir = hooks.tmp.path();
    let yaml = manifest(None, "[\"test:a\"]");
    let good = raw_tar_gz(&[
        ("pkg/", tar::EntryType::Directory, 0, b"", ""),
        file("pkg/HOOK.yaml", yaml.as_bytes()),
        file("pkg/handler.py", answer(1).as_bytes()),
        ("pkg/same.py", tar::EntryType::Symlink, 0, b"", "handler.py"),
    ]);
    std::fs::write(dir.join("tarred.tar.gz"), good).unwrap();
    let o = hh(
        &hooks,
        &["install", &dir.join("tarred.tar.gz").display().to_string()],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(hooks.root().join("pkg/handler.py")).unwrap(),
        answer(1)
    );
    assert_eq!(lock(&hooks)["hooks"]["pkg"]["kind"], "archive");
    let zipped = zip_of(&[("HOOK.yaml", &yaml), ("handler.py", &answer(2))], &[]);
    std::fs::write(dir.join("zipped.zip"), zipped).unwrap();
    let o = hh(
        &hooks,
        &["install", &dir.join("zipped.zip").display().to_string()],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(hooks.root().join("zipped/handler.py")).unwrap(),
        answer(2)
    );
    let before = (root_entries(&hooks), lock(&hooks));

    let outside = dir.join("outside");
    let hostile: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot.tar.gz",
            raw_tar_gz(&[
                file("h/HOOK.yaml", yaml.as_bytes()),
                file("../outside", b"x"),
            ]),
            "contains `..`",
        ),
        (
            "abs.tar.gz",
            raw_tar_gz(&[
                file("h/HOOK.yaml", yaml.as_bytes()),
                file("/tmp/abs-outside", b"x"),
            ]),
            "an absolute path",
        ),
        (
            "linkout.tar.gz",
            raw_tar_gz(&[
                file("h/HOOK.yaml", yaml.as_bytes()),
                file("h/handler.py", answer(1).as_bytes()),
                ("h/up", tar::EntryType::Symlink, 0, b"", "../../outside"),
            ]),
            "points outside the hook directory",
        ),
        (
            "huge.tar.gz",
            raw_tar_gz(&[
                file("h/HOOK.yaml", yaml.as_bytes()),
                ("h/big.bin", tar::EntryType::Regular, 2 << 30, b"", ""),
            ]),
            "declares 2147483648 bytes",
        ),
        (
            "linkout.zip",
            zip_of(
                &[("h/HOOK.yaml", &yaml), ("h/handler.py", &answer(1))],
                &[("h/up", "../../outside")],
            ),
            "points outside the hook directory",
        ),
        (
            "dotdot.zip",
            zip_of(&[("h/HOOK.yaml", &yaml), ("h/../../outside", "x")], &[]),
            "contains `..`",
        ),
        (
            "badcheck.zip",
            zip_of(
                &[
                    ("h/HOOK.yaml", "events: 42\n"),
                    ("h/handler.py", &answer(1)),
                ],
                &[],
            ),
            "does not pass check",
        ),
    ];
    for (name, bytes, why) in hostile {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let o = hh(&hooks, &["install", &path.display().to_string()]);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {out}");
        assert!(out.contains(why), "{name}: expected {why:?} in {out}");
        assert!(out.contains("nothing was installed"), "{name}: {out}");
        assert!(!outside.exists(), "{name} wrote outside");
        assert!(
            !Path::new("/tmp/abs-outside").exists(),
            "{name} wrote outside"
        );
        assert_eq!(
            (root_entries(&hooks), lock(&hooks)),
            before,
            "{name} left something"
        );
    }

    // A directory package with a link out of the hook is refused the same way.
    let src = dir.join("src/escaper");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("HOOK.yaml"), &yaml).unwrap();
    std::fs::write(src.join("handler.py"), answer(1)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("passwd")).unwrap();
    let o = hh(&hooks, &["install", &src.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("absolute path /etc/passwd"),
        "{}",
        text(&o)
    );
    assert_eq!((root_entries(&hooks), lock(&hooks)), before);
}

/// How many notices of `kind` about hook `versioned` the service wrote (`--output json`).
fn notices(serve: &Serve, kind: &str) -> usize {
    let lines = serve.stdout.lock().unwrap();
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == kind && (v["hook"] == "versioned" || v["name"] == "versioned"))
        .count()
}

fn collect_v(serve: &Serve) -> Value {
    let (s, body) = serve.post("/v1/collect", &json!({"event": "test:v"}));
    assert_eq!(s, 200, "{body}");
    body["results"][0]["result"]["v"].clone()
}

#[test]
fn updates_show_changes_need_approval_under_explicit_trust_and_never_break_the_running_hook() {
    let hooks = Hooks::new();
    let repo = Repo::new(&base(&hooks), "acme/single");
    let yaml = manifest(Some("versioned"), "[\"test:v\"]");
    repo.commit(&[("HOOK.yaml", &yaml), ("handler.py", &answer(1))], &[]);
    // Not approved without --yes; approved with it.
    let o = hh(&hooks, &["install", "acme/single", "--trust", "explicit"]);
    assert!(text(&o).contains("is not approved yet"), "{}", text(&o));
    assert!(hh(&hooks, &["remove", "versioned"]).status.success());
    // A watching service sees the approved hook arrive whole: loaded once, never refused.
    let serve = Serve::start(&hooks, &["--trust", "explicit", "--output", "json"]);
    let o = hh(
        &hooks,
        &["install", "acme/single", "--trust", "explicit", "--yes"],
    );
    assert!(o.status.success(), "{}", text(&o));
    poll(
        Duration::from_secs(30),
        "the installed hook to answer",
        || (collect_v(&serve) == 1).then_some(()),
    );
    assert_eq!(notices(&serve, "hook_loaded"), 1, "{:?}", serve.stdout);
    assert_eq!(notices(&serve, "hook_skipped"), 0, "{:?}", serve.stdout);

    // A new version with a changed handler and HOOK.yaml.
    let yaml2 = format!("{yaml}timeout: 7\n");
    repo.commit(
        &[
            ("HOOK.yaml", &yaml2),
            ("handler.py", &answer(2)),
            ("lib.py", "X = 1\n"),
        ],
        &[],
    );
    let lock_before = lock(&hooks);
    let o = hh(
        &hooks,
        &["update", "--all", "--dry-run", "--trust", "explicit"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("added    lib.py"), "{out}");
    assert!(out.contains("changed  HOOK.yaml, handler.py"), "{out}");
    assert!(out.contains("+timeout: 7"), "{out}");
    assert!(out.contains("dry run, nothing changed"), "{out}");
    assert_eq!(lock(&hooks), lock_before);
    // Under --trust explicit, refused until approved.
    let o = hh(&hooks, &["update", "versioned", "--trust", "explicit"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("needs approval"), "{}", text(&o));
    assert_eq!(lock(&hooks), lock_before);
    assert_eq!(
        std::fs::read_to_string(hooks.root().join("versioned/handler.py")).unwrap(),
        answer(1)
    );
    assert_eq!(collect_v(&serve), 1);
    let o = hh(
        &hooks,
        &["update", "versioned", "--trust", "explicit", "--yes"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("approved versioned"), "{}", text(&o));
    poll(Duration::from_secs(30), "the new version to answer", || {
        (collect_v(&serve) == 2).then_some(())
    });
    assert_eq!(notices(&serve, "hook_reloaded"), 1, "{:?}", serve.stdout);
    assert_eq!(
        notices(&serve, "hook_unloaded") + notices(&serve, "hook_skipped"),
        0
    );

    // A version that fails check: the update fails, the running one stays.
    repo.commit(&[("HOOK.yaml", "name: versioned\nevents: 42\n")], &[]);
    let lock_before = lock(&hooks);
    let o = hh(
        &hooks,
        &["update", "versioned", "--trust", "explicit", "--yes"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("does not pass check"), "{}", text(&o));
    assert!(
        text(&o).contains("the installed version stays"),
        "{}",
        text(&o)
    );
    assert_eq!(lock(&hooks), lock_before);
    assert_eq!(root_entries(&hooks), vec!["versioned"]);
    assert_eq!(collect_v(&serve), 2);
    let o = hh(&hooks, &["check", "--trust", "explicit"]);
    assert!(o.status.success(), "{}", text(&o));

    // remove takes the approval with the files; the service unloads the hook.
    let trust = hooks.home().join("hooks-trust.json");
    assert!(
        std::fs::read_to_string(&trust)
            .unwrap()
            .contains("versioned")
    );
    let o = hh(&hooks, &["remove", "versioned"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !std::fs::read_to_string(&trust)
            .unwrap()
            .contains("versioned")
    );
    assert_eq!(lock(&hooks)["hooks"], json!({}));
    poll(
        Duration::from_secs(30),
        "the removed hook to unload",
        || (notices(&serve, "hook_unloaded") == 1).then_some(()),
    );
}
