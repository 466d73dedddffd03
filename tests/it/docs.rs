//! The doc test: every sample in README.md, docs/*.md and clients/python/README.md that is marked
//! runnable is run, against the real binary, and what it prints is compared with what the doc
//! shows. Samples cannot go stale without failing `cargo test` (and so `.ci/run`).
//!
//! The markers are words after the language of a fenced block (written for doc authors in
//! README.md, *Development*):
//!
//! - ```` ```sh runnable ````: run with `bash -euo pipefail`. Comment lines directly under a
//!   command (no blank line between) are what it prints on stdout; `...` in such a line stands
//!   for any text, a line of only `...` for any number of lines, and a last line
//!   `# exit status N` expects that exit status (otherwise 0).
//! - ```` ```python runnable ````: run with `python3`; the comment lines directly under a line
//!   with `print(` are what the block prints.
//! - `service` added to either: run while a service is up. It is the one the last
//!   ```` ```sh serve ```` block of the same file started, else `hermes-hooks serve --hooks-dir
//!   hooks-examples --listen 127.0.0.1:0`. `8787` in the block becomes that service's port and
//!   `HERMES_HOOKS_ADDRESS` points at it when it listens on TCP.
//! - ```` ```sh serve ````: a one-command block that starts the service (`cargo run --release
//!   --` runs the binary under test, `127.0.0.1:8787` becomes `127.0.0.1:0`); it runs in the
//!   background until the next `serve` block or the end of the file.
//! - ```` ```yaml hook ````: written as the `HOOK.yaml` of a fresh hook directory (beside a
//!   trivial `handler.py` unless it has `url:`); `hermes-hooks check` must pass on it.
//!
//! Each file runs in its own scratch directory: `HOME` and `HERMES_HOME` (`$HOME/.hermes`) are
//! temporary, the working directory holds a copy of `hooks-examples/`, `hermes-hooks` is the
//! binary under test (first on `PATH`) and `clients/python` is on `PYTHONPATH`. The machine's
//! `~/.hermes` is never touched; services listen on port 0 or a socket in the scratch home.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::{bin, poll, set_mode};

/// One fenced block of a Markdown file.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    /// Line of the opening fence (1-based), for messages.
    line: usize,
    /// The language word of the info string (`sh`, `python`, `yaml`...).
    lang: String,
    /// The other words of the info string (`runnable`, `service`, `serve`, `hook`).
    flags: Vec<String>,
    /// The content, with the fence's indentation removed.
    text: String,
}

impl Block {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// Whether the doc test does something with this block.
    fn is_checked(&self) -> bool {
        self.has("runnable") || self.has("serve") || self.has("hook")
    }
}

/// The fenced blocks of a Markdown text (fences may be indented, as in list items).
fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let indent = line.len() - line.trim_start().len();
        // A fence's info string has no backtick (```` ```sh ```` in running text is not one).
        let Some(info) = line
            .trim_start()
            .strip_prefix("```")
            .filter(|i| !i.contains('`'))
        else {
            continue;
        };
        let mut words = info.split_whitespace().map(str::to_string);
        let lang = words.next().unwrap_or_default();
        let flags = words.collect();
        let mut text = String::new();
        for (_, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            let cut = l.len() - l.trim_start().len();
            text.push_str(&l[cut.min(indent)..]);
            text.push('\n');
        }
        out.push(Block {
            line: i + 1,
            lang,
            flags,
            text,
        });
    }
    out
}

/// One shell command of a block and what the doc says it prints.
#[derive(Debug, Default, PartialEq)]
struct ShellStep {
    /// The command's lines (continuations and here-documents included).
    command: String,
    /// Expected stdout lines (the comment lines under it), empty when the doc shows none.
    expected: Vec<String>,
    /// Expected exit status.
    status: i32,
}

/// The here-document delimiter a line opens, if any (`<<'X'`, `<<"X"`, `<<X`, `<<-X`).
fn heredoc_delimiter(line: &str) -> Option<String> {
    let rest = &line[line.find("<<")? + 2..];
    let rest = rest.strip_prefix('-').unwrap_or(rest).trim_start();
    let word: String = rest
        .trim_start_matches(['\'', '"'])
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// Splits a shell block into commands, each with the output the doc shows under it.
fn shell_steps(text: &str) -> Vec<ShellStep> {
    let mut steps: Vec<ShellStep> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut command = String::from(line);
        let mut last = line.to_string();
        loop {
            if let Some(delim) = heredoc_delimiter(&last) {
                for l in lines.by_ref() {
                    command.push('\n');
                    command.push_str(l);
                    if l.trim() == delim {
                        break;
                    }
                }
                last = String::new();
            }
            if !last.trim_end().ends_with('\\') {
                break;
            }
            match lines.next() {
                Some(l) => {
                    command.push('\n');
                    command.push_str(l);
                    last = l.to_string();
                }
                None => break,
            }
        }
        let mut step = ShellStep {
            command,
            ..Default::default()
        };
        while let Some(l) = lines.peek() {
            let Some(comment) = l.trim_start().strip_prefix('#') else {
                break;
            };
            let comment = comment.strip_prefix(' ').unwrap_or(comment).to_string();
            lines.next();
            match comment.strip_prefix("exit status ") {
                Some(n) => step.status = n.trim().parse().unwrap_or(-1),
                None => step.expected.push(comment),
            }
        }
        steps.push(step);
    }
    steps
}

/// What a Python block prints: the comment lines directly under its `print(` lines.
fn python_expected(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut after_print = false;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(c) = t.strip_prefix('#') {
            if after_print {
                out.push(c.strip_prefix(' ').unwrap_or(c).to_string());
            }
            continue;
        }
        after_print = t.contains("print(");
    }
    out
}

/// Whether one line matches an expected line (`...` stands for any text).
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.trim_end().split("...").collect();
    let actual = actual.trim_end();
    if parts.len() == 1 {
        return parts[0] == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Whether the lines match the expected ones (a line `...` stands for any number of lines).
fn lines_match(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e.trim() == "..." => {
            (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..]))
        }
        Some((e, rest)) => {
            !actual.is_empty() && line_matches(e, &actual[0]) && lines_match(rest, &actual[1..])
        }
    }
}

/// A service started for the samples; stopped (SIGTERM, then SIGKILL) on drop.
struct DocService {
    child: Child,
    /// `http://127.0.0.1:PORT` or `unix:PATH`, as the service logs it.
    address: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl DocService {
    fn port(&self) -> Option<&str> {
        self.address
            .strip_prefix("http://")
            .and_then(|a| a.rsplit(':').next())
    }
}

impl Drop for DocService {
    fn drop(&mut self) {
        crate::util::signal(self.child.id(), libc::SIGTERM);
        let stopped = (0..2000).any(|_| {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
            false
        });
        if !stopped {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The scratch directory one doc file's samples run in.
struct Scratch {
    tmp: tempfile::TempDir,
    repo: PathBuf,
    service: Option<DocService>,
    /// Checked blocks run so far, for the coverage assertions.
    ran: usize,
}

/// Copies a directory tree (files keep their run bit; nothing is group- or world-writable).
fn copy_tree(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).unwrap();
    set_mode(to, 0o755);
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            let mode = entry.metadata().unwrap().permissions().mode();
            set_mode(&target, if mode & 0o100 != 0 { 0o755 } else { 0o644 });
        }
    }
}

impl Scratch {
    fn new() -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("home")).unwrap();
        copy_tree(
            &repo.join("hooks-examples"),
            &tmp.path().join("work/hooks-examples"),
        );
        Self {
            tmp,
            repo,
            service: None,
            ran: 0,
        }
    }

    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    fn work(&self) -> PathBuf {
        self.tmp.path().join("work")
    }

    /// A command with the scratch environment: temporary HOME and HERMES_HOME, the binary
    /// under test first on PATH, the client on PYTHONPATH, no HERMES_* from the caller.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for (k, _) in std::env::vars() {
            if k.starts_with("HERMES_") {
                cmd.env_remove(k);
            }
        }
        let bin_dir = Path::new(bin()).parent().unwrap();
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.current_dir(self.work())
            .env("HOME", self.home())
            .env("HERMES_HOME", self.home().join(".hermes"))
            .env("PATH", format!("{}:{path}", bin_dir.display()))
            .env("PYTHONPATH", self.repo.join("clients/python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null());
        if let Some(port) = self.service.as_ref().and_then(DocService::port) {
            cmd.env("HERMES_HOOKS_ADDRESS", format!("http://127.0.0.1:{port}"));
        }
        cmd
    }

    /// Starts the service a `serve` block names (replacing any running one).
    fn serve(&mut self, where_: &str, command_line: &str) {
        self.service = None;
        let line = command_line
            .replace("cargo run --release --", "hermes-hooks")
            .replace("127.0.0.1:8787", "127.0.0.1:0");
        assert!(
            line.trim_start().starts_with("hermes-hooks serve"),
            "{where_}: a `serve` block runs `hermes-hooks serve` or `cargo run --release -- serve`: {command_line}"
        );
        let mut cmd = self.command("bash");
        cmd.arg("-c")
            .arg(format!("exec {line}"))
            .env("HERMES_HOOKS_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the service");
        let log = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push(line);
            }
        });
        let mut service = DocService {
            child,
            address: String::new(),
            log,
        };
        let what = format!("{where_}: the service to load its hooks ({line})");
        let address = poll(Duration::from_secs(60), &what, || {
            let log = service.log.lock().unwrap();
            let address = log.iter().find_map(|l| {
                l.split("listening on ")
                    .nth(1)
                    .map(|a| a.split_whitespace().next().unwrap_or("").to_string())
            })?;
            log.iter()
                .any(|l| l.contains("hooks loaded"))
                .then_some(address)
        });
        service.address = address;
        self.service = Some(service);
    }

    fn service_log(&self) -> String {
        self.service
            .as_ref()
            .map(|s| s.log.lock().unwrap().join("\n"))
            .unwrap_or_default()
    }

    /// Runs a `runnable` shell block and compares each command's output with the doc's.
    fn run_shell(&mut self, where_: &str, text: &str) {
        let text = self.with_port(text);
        let steps = shell_steps(&text);
        let outs = self.tmp.path().join("out");
        let _ = std::fs::remove_dir_all(&outs);
        std::fs::create_dir_all(&outs).unwrap();
        let mut script = String::from("set -euo pipefail\n");
        for (i, step) in steps.iter().enumerate() {
            if step.expected.is_empty() && step.status == 0 {
                script.push_str(&step.command);
                script.push('\n');
            } else {
                let out = outs.join(i.to_string());
                script.push_str(&format!(
                    "set +e\n{{ {}\n}} > '{o}'\necho $? > '{o}.status'\nset -e\n",
                    step.command,
                    o = out.display()
                ));
            }
        }
        let output = self
            .command("bash")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let context = || {
            format!(
                "{where_}:\n--- block ---\n{text}--- stdout ---\n{}--- stderr ---\n{}--- service log ---\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                self.service_log()
            )
        };
        assert!(output.status.success(), "the block failed\n{}", context());
        for (i, step) in steps.iter().enumerate() {
            if step.expected.is_empty() && step.status == 0 {
                continue;
            }
            let out = outs.join(i.to_string());
            let printed = std::fs::read_to_string(&out).unwrap_or_default();
            let status: i32 = std::fs::read_to_string(out.with_extension("status"))
                .unwrap_or_default()
                .trim()
                .parse()
                .unwrap_or(-1);
            let actual: Vec<String> = printed.lines().map(str::to_string).collect();
            assert!(
                status == step.status && lines_match(&step.expected, &actual),
                "`{}` printed (exit status {status}):\n{printed}\nthe doc shows (exit status {}):\n{}\n{}",
                step.command,
                step.status,
                step.expected.join("\n"),
                context()
            );
        }
    }

    /// Runs a `runnable` Python block and compares what it prints with the doc.
    fn run_python(&mut self, where_: &str, text: &str) {
        let text = self.with_port(text);
        let file = self.tmp.path().join("sample.py");
        std::fs::write(&file, &text).unwrap();
        let output = self.command("python3").arg(&file).output().unwrap();
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        let actual: Vec<String> = printed.lines().map(str::to_string).collect();
        let expected = python_expected(&text);
        assert!(
            output.status.success() && lines_match(&expected, &actual),
            "{where_}: the Python sample printed:\n{printed}\nthe doc shows:\n{}\n--- stderr ---\n{}--- service log ---\n{}",
            expected.join("\n"),
            String::from_utf8_lossy(&output.stderr),
            self.service_log()
        );
    }

    /// Writes a `hook` block as a HOOK.yaml and checks that it loads.
    fn check_hook(&mut self, where_: &str, yaml: &str) {
        let root = self.tmp.path().join(format!("hook-check-{}", self.ran));
        let dir = root.join("sample");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("HOOK.yaml"), yaml).unwrap();
        if !yaml.lines().any(|l| l.starts_with("url:")) {
            std::fs::write(
                dir.join("handler.py"),
                "def handle(event_type, context):\n    return None\n",
            )
            .unwrap();
        }
        let output = self
            .command(bin())
            .args(["check", "--hooks-dir"])
            .arg(&root)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && printed.contains("1 hook(s) ok, 0 problem(s)"),
            "{where_}: `check` on this HOOK.yaml:\n{yaml}printed:\n{printed}{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `8787` (the docs' example port) replaced by the running service's port.
    fn with_port(&self, text: &str) -> String {
        match self.service.as_ref().and_then(DocService::port) {
            Some(port) => text.replace(":8787", &format!(":{port}")),
            None => text.to_string(),
        }
    }

    /// Runs every checked block of one file, in order.
    fn run_file(&mut self, name: &str) {
        let markdown = std::fs::read_to_string(self.repo.join(name)).unwrap();
        for block in blocks(&markdown) {
            if !block.is_checked() {
                continue;
            }
            let where_ = format!("{name}:{}", block.line);
            self.ran += 1;
            if block.has("serve") {
                let line: Vec<&str> = block
                    .text
                    .lines()
                    .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                    .collect();
                assert_eq!(line.len(), 1, "{where_}: a `serve` block has one command");
                self.serve(&where_, line[0]);
                continue;
            }
            if block.has("hook") {
                self.check_hook(&where_, &block.text);
                continue;
            }
            if block.has("service") && self.service.is_none() {
                self.serve(
                    &where_,
                    "hermes-hooks serve --hooks-dir hooks-examples --listen 127.0.0.1:8787",
                );
            }
            match block.lang.as_str() {
                "sh" | "bash" | "console" => self.run_shell(&where_, &block.text),
                "python" | "py" => self.run_python(&where_, &block.text),
                other => panic!("{where_}: cannot run a `{other}` block"),
            }
        }
    }
}

/// Runs the checked samples of `name`; returns how many there were.
fn run_doc(name: &str) -> usize {
    let mut scratch = Scratch::new();
    scratch.run_file(name);
    scratch.ran
}

/// The README's samples: the quick start (the `serve` command and the curls against it), the
/// first hook (written, checked, tested, emitted to a service on it) and the client sample.
#[test]
fn readme_samples_run() {
    let markdown =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let checked: Vec<Block> = blocks(&markdown)
        .into_iter()
        .filter(Block::is_checked)
        .collect();
    for (what, found) in [
        (
            "the quick start's service",
            checked
                .iter()
                .any(|b| b.has("serve") && b.text.contains("--hooks-dir hooks-examples")),
        ),
        (
            "the quick start's curls",
            checked
                .iter()
                .any(|b| b.has("service") && b.text.contains("curl")),
        ),
        (
            "the first hook",
            checked
                .iter()
                .any(|b| b.has("runnable") && b.text.contains("HOOK.yaml")),
        ),
        (
            "the first hook's check and test",
            checked.iter().any(|b| {
                b.text.contains("hermes-hooks check") && b.text.contains("hermes-hooks test")
            }),
        ),
        (
            "the first hook's emit",
            checked
                .iter()
                .any(|b| b.has("service") && b.text.contains("hermes-hooks emit")),
        ),
        (
            "the client sample",
            checked
                .iter()
                .any(|b| b.lang == "python" && b.text.contains("HookRegistry")),
        ),
    ] {
        assert!(found, "README.md: {what} is not marked runnable");
    }
    assert_eq!(run_doc("README.md"), checked.len());
}

/// Every doc in docs/ with shell or Python samples has checked ones, and they run.
#[test]
fn docs_samples_run() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    assert!(!names.is_empty());
    for name in names {
        let path = format!("docs/{name}");
        let markdown = std::fs::read_to_string(dir.join(&name)).unwrap();
        let samples = blocks(&markdown)
            .iter()
            .any(|b| ["sh", "bash", "python"].contains(&b.lang.as_str()));
        let ran = run_doc(&path);
        assert!(
            ran > 0 || !samples,
            "{path} has shell or Python samples but none marked runnable"
        );
    }
}

/// The client's README: its sample runs against a service.
#[test]
fn client_readme_samples_run() {
    assert!(run_doc("clients/python/README.md") > 0);
}

#[test]
fn the_parser_and_the_matcher() {
    let md = "a ```` ```sh serve ```` b\n  ```sh runnable service\n  echo hi\n  # hi\n  ```\n```yaml\nx: 1\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!((b[0].line, b[0].lang.as_str()), (2, "sh"));
    assert_eq!(b[0].flags, vec!["runnable", "service"]);
    assert_eq!(b[0].text, "echo hi\n# hi\n");
    let steps = shell_steps(
        "# intro\ncat > f <<'PY'\n# not output\nPY\necho a \\\n  b\n# a b\n\nfalse\n# exit status 1\n",
    );
    assert_eq!(steps.len(), 3, "{steps:?}");
    assert_eq!(steps[0].command, "cat > f <<'PY'\n# not output\nPY");
    assert!(steps[0].expected.is_empty());
    assert_eq!(steps[1].expected, vec!["a b"]);
    assert_eq!(steps[2].status, 1);
    assert!(line_matches(
        "ok ... ms  (no result)",
        "ok   0.6 ms  (no result)"
    ));
    assert!(!line_matches("ok ... ms", "ok 0.6 s"));
    assert!(line_matches("in .../hooks", "in /tmp/x/hooks"));
    let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(
        &l(&["a", "...", "z"]),
        &l(&["a", "b", "c", "z"])
    ));
    assert!(lines_match(&l(&["a", "...", "z"]), &l(&["a", "z"])));
    assert!(!lines_match(&l(&["a"]), &l(&["a", "b"])));
    assert_eq!(
        python_expected("x = 1\nprint(x)\n# 1\n# done\ny = 2\n# not output\n"),
        vec!["1", "done"]
    );
}
