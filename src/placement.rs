//! Placement: whether a Python hook runs in the service or inside the gateway (`runs:`).
//!
//! `runs: auto` (the default) decides by reading the hook's Python source without running it: the
//! handler and the modules of the hook directory it imports, followed import by import (a sibling
//! file the handler never imports does not count: issue 36). A hook that imports the gateway's
//! own modules (`gateway`, `gateway.*`, `run_agent`,
//! `hermes_cli`, `hermes_cli.*`; `tools.*` and `agent.*` only when the hook directory does not
//! provide them itself) needs the gateway's live objects and runs in the gateway; anything else
//! runs in the service. The decision carries its reason ("imports gateway.platforms.base at line
//! 272"). A leaf module: it reads files and knows the manifest's `runs:` value, nothing else.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::manifest::Runs;

/// Most Python files read per hook directory.
const MAX_FILES: usize = 256;
/// Largest Python file read (bigger ones are skipped: generated data, not hook code).
const MAX_FILE_BYTES: u64 = 2 * 1024 * 1024;

/// Where a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Site {
    /// In a worker of the service.
    Service,
    /// Inside the gateway process (imported by the gateway's client).
    Gateway,
}

impl Site {
    /// Lower-case name, as shown by the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Site::Service => "service",
            Site::Gateway => "gateway",
        }
    }
}

/// The decision and its reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Where the hook runs.
    pub runs: Site,
    /// Why, in words.
    pub why: String,
}

impl Placement {
    /// True for hooks the gateway's client runs.
    pub fn in_gateway(&self) -> bool {
        self.runs == Site::Gateway
    }

    /// The placement of a hook that is not Python: always the service.
    pub fn service(why: impl Into<String>) -> Self {
        Self {
            runs: Site::Service,
            why: why.into(),
        }
    }
}

/// Decides where a hook runs. `python` tells whether the handler is `handler.py` (only Python
/// hooks can run in the gateway); `Err` is a reason to refuse the hook (`runs: gateway` on a
/// hook that is not Python).
pub fn decide(runs: Runs, python: bool, dir: &Path, handler: &Path) -> Result<Placement, String> {
    match (runs, python) {
        (Runs::Gateway, false) => Err(
            "`runs: gateway` is only for Python hooks (handler.py): the gateway's client imports \
             them; remove it or use `runs: service`"
                .into(),
        ),
        (Runs::Gateway, true) => Ok(Placement {
            runs: Site::Gateway,
            why: "`runs: gateway` in HOOK.yaml".into(),
        }),
        (Runs::Service, _) => Ok(Placement::service("`runs: service` in HOOK.yaml")),
        (Runs::Auto, false) => Ok(Placement::service("not a Python hook")),
        (Runs::Auto, true) => Ok(match find_gateway_import(dir, handler) {
            Some(found) => Placement {
                runs: Site::Gateway,
                why: found.describe(handler),
            },
            None => Placement::service("its Python source imports none of the gateway's modules"),
        }),
    }
}

/// One import of a gateway module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayImport {
    /// The module as written (`gateway.platforms.base`).
    pub module: String,
    /// The file that imports it.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
}

impl GatewayImport {
    fn describe(&self, handler: &Path) -> String {
        if self.file == handler {
            format!("imports {} at line {}", self.module, self.line)
        } else {
            let name = self
                .file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!("imports {} at line {} of {name}", self.module, self.line)
        }
    }
}

/// The first gateway import of the handler or of a module of the hook directory it imports
/// (directly or through other such modules; breadth first, at most [`MAX_FILES`] files).
pub fn find_gateway_import(dir: &Path, handler: &Path) -> Option<GatewayImport> {
    let provides = |m: &str| dir.join(m).is_dir() || dir.join(format!("{m}.py")).is_file();
    let local = LocalModules {
        tools: provides("tools"),
        agent: provides("agent"),
    };
    let mut queue = std::collections::VecDeque::from([handler.to_path_buf()]);
    let mut seen = std::collections::HashSet::new();
    while let Some(file) = queue.pop_front() {
        if seen.len() >= MAX_FILES || !seen.insert(file.clone()) {
            continue;
        }
        let Some(text) = read_source(&file) else {
            continue;
        };
        let imports = all_imports(&text);
        if let Some((module, line)) = imports.iter().find(|(m, _)| is_gateway_module(m, local)) {
            return Some(GatewayImport {
                module: module.clone(),
                file,
                line: *line,
            });
        }
        let here = file.parent().unwrap_or(dir);
        for (module, _) in &imports {
            queue.extend(local_files(dir, here, module).filter(|f| !seen.contains(f)));
        }
    }
    None
}

/// A Python file's text, unless it is missing or too big to be hook code.
fn read_source(file: &Path) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    if meta.len() > MAX_FILE_BYTES {
        return None;
    }
    let bytes = std::fs::read(file).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The files of the hook directory `dir` that importing `module` from a file in `here` runs:
/// its packages' `__init__.py` and the module itself. Relative names (`.x`, `..x`) start at
/// `here`; absolute ones at `dir` (the handler's directory is on the hook's path).
fn local_files<'a>(dir: &'a Path, here: &Path, module: &str) -> impl Iterator<Item = PathBuf> + 'a {
    let dots = module.chars().take_while(|c| *c == '.').count();
    let mut base = if dots == 0 {
        dir.to_path_buf()
    } else {
        here.to_path_buf()
    };
    for _ in 1..dots {
        base.pop();
    }
    let mut out = vec![base.join("__init__.py")];
    let mut path = base;
    for part in module[dots..].split('.').filter(|p| !p.is_empty()) {
        path.push(part);
        out.push(path.with_extension("py"));
        out.push(path.join("__init__.py"));
    }
    if dots == 0 {
        out.remove(0); // the hook directory itself is not a package here
    }
    out.into_iter()
        .filter(move |f| f.starts_with(dir) && f.is_file())
}

/// Which of the ambiguous top-level names the hook directory provides itself.
#[derive(Debug, Clone, Copy, Default)]
struct LocalModules {
    tools: bool,
    agent: bool,
}

fn is_gateway_module(module: &str, local: LocalModules) -> bool {
    let top = module.split('.').next().unwrap_or("");
    match top {
        "gateway" | "run_agent" | "hermes_cli" => true,
        "tools" => !local.tools,
        "agent" => !local.agent,
        _ => false,
    }
}

/// The first import of a gateway module in `source` and its 1-based line.
#[cfg(test)]
fn first_gateway_import(source: &str, local: LocalModules) -> Option<(String, usize)> {
    all_imports(source)
        .into_iter()
        .find(|(m, _)| is_gateway_module(m, local))
}

/// Every module `source` imports, with its 1-based line, in order. Reads `import a.b`,
/// `import a, b as c`, `from a.b import x, y` (also `a.b.x`, `a.b.y`: they may be submodules),
/// relative `from .a import x` (as `.a`, `.a.x`), also indented (e.g. inside a function), and
/// `importlib.import_module("a.b")` / `__import__("a.b")` with a literal name; skips comments
/// and triple-quoted strings.
fn all_imports(source: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut in_string: Option<&'static str> = None;
    for (i, raw) in source.lines().enumerate() {
        let line = raw.trim();
        if let Some(delim) = in_string {
            if line.contains(delim) {
                in_string = None;
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        for statement in line.split(';') {
            for module in imported_modules(statement.trim()) {
                found.push((module, i + 1));
            }
        }
        for delim in ["\"\"\"", "'''"] {
            if line.matches(delim).count() % 2 == 1 {
                in_string = Some(delim);
                break;
            }
        }
    }
    found
}

fn imported_modules(statement: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(rest) = statement.strip_prefix("import ") {
        for part in rest.split(',') {
            if let Some(name) = part.split_whitespace().next() {
                out.push(name.trim_matches(['(', ')']).to_string());
            }
        }
    } else if let Some(rest) = statement.strip_prefix("from ")
        && let Some((name, names)) = rest.split_once(" import ")
    {
        let name = name.trim();
        out.push(name.to_string());
        let sep = if name.ends_with('.') { "" } else { "." };
        for part in names.trim().trim_matches(['(', ')']).split(',') {
            if let Some(n) = part.split_whitespace().next().filter(|n| *n != "*") {
                out.push(format!("{name}{sep}{n}"));
            }
        }
    }
    for call in ["import_module(", "__import__("] {
        let mut rest = statement;
        while let Some(at) = rest.find(call) {
            rest = &rest[at + call.len()..];
            let arg = rest.trim_start();
            if let Some(q) = arg.chars().next().filter(|c| *c == '"' || *c == '\'')
                && let Some(end) = arg[1..].find(q)
            {
                out.push(arg[1..1 + end].to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first(src: &str) -> Option<(String, usize)> {
        first_gateway_import(src, LocalModules::default())
    }

    #[test]
    fn reads_the_forms_of_import() {
        assert_eq!(
            first("import os\n\nfrom gateway.platforms.base import BasePlatformAdapter\n"),
            Some(("gateway.platforms.base".into(), 3))
        );
        assert_eq!(
            first("import json, run_agent as ra\n"),
            Some(("run_agent".into(), 1))
        );
        assert_eq!(
            first("def handle(e, c):\n    from gateway.run import _gateway_runner_ref\n"),
            Some(("gateway.run".into(), 2))
        );
        assert_eq!(
            first("import importlib\nm = importlib.import_module('hermes_cli.config')\n"),
            Some(("hermes_cli.config".into(), 2))
        );
        assert_eq!(
            first("import tools.registry\n"),
            Some(("tools.registry".into(), 1))
        );
    }

    #[test]
    fn ignores_comments_strings_relatives_and_lookalikes() {
        assert_eq!(first("# from gateway import run\n"), None);
        assert_eq!(
            first("\"\"\"Docs.\n\nfrom gateway import run\n\"\"\"\nimport json\n"),
            None
        );
        assert_eq!(first("from . import gateway\nimport gateways\n"), None);
        assert_eq!(first("import httpx\nimport gateway_tools\n"), None);
    }

    #[test]
    fn a_hook_that_ships_its_own_tools_package_keeps_them() {
        let local = LocalModules {
            tools: true,
            agent: false,
        };
        assert_eq!(
            first_gateway_import("from tools import util\n", local),
            None
        );
        assert_eq!(
            first_gateway_import("from agent.core import x\n", local),
            Some(("agent.core".into(), 1))
        );
    }

    /// A hook directory with `files` (path, text).
    fn hook_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = d.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    fn placed(d: &tempfile::TempDir) -> Placement {
        decide(Runs::Auto, true, d.path(), &d.path().join("handler.py")).unwrap()
    }

    #[test]
    fn a_sibling_the_handler_never_imports_does_not_place_the_hook() {
        // The published hook of issue 36: a plugin file beside the handler mentions the
        // gateway's session context; the handler imports only its own helper.
        let d = hook_dir(&[
            (
                "handler.py",
                "import json
from helper import fmt

def handle(e, c):
    pass
",
            ),
            (
                "helper.py",
                "def fmt(x):
    return str(x)
",
            ),
            (
                "plugin.py",
                "from gateway.session_context import current
",
            ),
        ]);
        let p = placed(&d);
        assert_eq!(p.runs, Site::Service, "{p:?}");
    }

    #[test]
    fn gateway_imports_are_followed_through_the_hooks_own_modules() {
        // Absolute, through a package's __init__ and a submodule.
        let d = hook_dir(&[
            (
                "handler.py",
                "from lib import util
",
            ),
            ("lib/__init__.py", ""),
            (
                "lib/util.py",
                "import os
from gateway.run import _gateway_runner_ref
",
            ),
        ]);
        let p = placed(&d);
        assert_eq!(p.runs, Site::Gateway, "{p:?}");
        assert_eq!(p.why, "imports gateway.run at line 2 of util.py");
        // Relative, two levels.
        let d = hook_dir(&[
            (
                "handler.py",
                "def handle(e, c):
    from .pkg.a import f
",
            ),
            ("pkg/__init__.py", ""),
            (
                "pkg/a.py",
                "from ..b import g
",
            ),
            (
                "b.py",
                "import hermes_cli.config
",
            ),
        ]);
        let p = placed(&d);
        assert_eq!(p.runs, Site::Gateway, "{p:?}");
        assert!(p.why.contains("hermes_cli.config"), "{p:?}");
        // A cycle between the hook's modules ends.
        let d = hook_dir(&[
            (
                "handler.py",
                "import a
",
            ),
            (
                "a.py",
                "import b
",
            ),
            (
                "b.py",
                "import a
",
            ),
        ]);
        assert_eq!(placed(&d).runs, Site::Service);
    }

    #[test]
    fn explicit_settings_and_other_kinds() {
        let d = Path::new("/nonexistent");
        let h = d.join("handler.py");
        assert_eq!(
            decide(Runs::Service, true, d, &h).unwrap().runs,
            Site::Service
        );
        assert_eq!(
            decide(Runs::Gateway, true, d, &h).unwrap().runs,
            Site::Gateway
        );
        assert!(decide(Runs::Gateway, false, d, &h).is_err());
        assert_eq!(
            decide(Runs::Auto, false, d, &h).unwrap().runs,
            Site::Service
        );
    }
}
