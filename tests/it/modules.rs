//! The module graph of `src/` has no cycles: no module (a file) uses a module that uses it back,
//! directly or through others. Edges come from paths, in `use` lines and inline alike: `crate::`,
//! `super::`, `self::` and, in a file that declares `mod x;`, `x::` (comments are ignored, test
//! modules count). `crate::x::y` resolves to `src/x/y.rs` when that file exists, else to
//! `src/x.rs` or `src/x/mod.rs`; an item of the crate root (`crate::Host`) to `src/lib.rs`.
//! Declaring a child module (`mod x;`) is not an edge. Pure Rust: reads the files, runs nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module (path relative to `src/`) -> modules it uses, each with the first line that does.
type Graph = BTreeMap<String, BTreeMap<String, usize>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The code of a line without its `//` comment (a `//` inside a string literal is kept).
fn code_of(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && prev == '/' => return &line[..i - 1],
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    line
}

/// The module paths (segments after `crate::`) named by the text starting right after a
/// `crate::`: `a::b::C`, or a group `{a::b, c::{self, d}}`.
fn paths_after(text: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        // Split the group at top-level commas, up to its closing brace.
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths_after(&group[start..i], prefix, out);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths_after(&group[start..i], prefix, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        paths_after(&group[start..], prefix, out);
        return;
    }
    let mut segs = prefix.to_vec();
    let mut rest = text;
    loop {
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        let seg = &rest[..end];
        if seg.is_empty() {
            break;
        }
        if seg != "self" {
            segs.push(seg.to_string());
        }
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(r) if r.trim_start().starts_with('{') => {
                paths_after(r, &segs, out);
                return;
            }
            Some(r) => rest = r,
            None => break,
        }
    }
    if !segs.is_empty() {
        out.push(segs);
    }
}

/// The file a module path names: `src/x/y.rs` if it exists, else `src/x.rs` or `src/x/mod.rs`
/// (for the longest prefix that is a file).
fn resolve(src: &Path, segs: &[String]) -> Option<String> {
    for n in (1..=segs.len()).rev() {
        let base = segs[..n].join("/");
        for candidate in [format!("{base}.rs"), format!("{base}/mod.rs")] {
            if src.join(&candidate).is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// The module path of a file: `handler/exec.rs` -> `[handler, exec]`, `handler/mod.rs` ->
/// `[handler]`, `lib.rs` -> `[]`.
fn module_path(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut segs: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(
        segs.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        segs.pop();
    }
    segs
}

/// Child modules a file declares (`mod x;` / `pub mod x;`, not inline `mod x { ... }`).
fn declared_children(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| code_of(l).trim())
        .filter_map(|l| {
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g = Graph::new();
    for file in files {
        let module = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let here = module_path(&module);
        // Where a path may start, and the module path it is relative to.
        let parent = here[..here.len().saturating_sub(1)].to_vec();
        let mut starts: Vec<(String, Vec<String>)> = vec![
            ("crate::".to_string(), Vec::new()),
            ("super::".to_string(), parent),
            ("self::".to_string(), here.clone()),
        ];
        for child in declared_children(&text) {
            let mut base = here.clone();
            base.push(child.clone());
            starts.push((format!("{child}::"), base));
        }
        let edges = g.entry(module.clone()).or_default();
        // Inside an inline `mod tests { ... }` (at the end of a file), `super::` is this file.
        let inline_mod = text.lines().position(|l| {
            let l = code_of(l).trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.starts_with("mod ") && l.ends_with('{')
        });
        // A `use` statement with a group may span lines: join it up to its `;`.
        let mut pending = String::new();
        let mut pending_line = 0;
        for (n, line) in text.lines().enumerate() {
            let code = code_of(line);
            let (code, line_no) = if pending.is_empty() {
                (code.to_string(), n + 1)
            } else {
                pending.push(' ');
                pending.push_str(code);
                (std::mem::take(&mut pending), pending_line)
            };
            let trimmed = code.trim_start();
            let is_use = trimmed.starts_with("use ") || trimmed.starts_with("pub use ");
            if is_use && !code.contains(';') {
                pending = code;
                pending_line = line_no;
                continue;
            }
            if inline_mod.is_some_and(|m| n > m) {
                starts[1].1 = here.clone();
            }
            for (start, base) in &starts {
                let mut at = 0;
                while let Some(i) = code[at..].find(start.as_str()) {
                    let pos = at + i;
                    at = pos + start.len();
                    // Only where a path begins: not `x::crate::`, `$crate::`, `my_child::`, nor
                    // a method's turbofish (`.collect::<T>()` beside a child module `collect`).
                    let before = code[..pos].chars().next_back();
                    if before.is_some_and(|c| is_ident(c) || c == '$' || c == ':' || c == '.')
                        || code[at..].starts_with('<')
                    {
                        continue;
                    }
                    let mut paths = Vec::new();
                    paths_after(&code[at..], base, &mut paths);
                    if paths.is_empty() {
                        paths.push(base.clone());
                    }
                    for p in paths {
                        let target = resolve(src, &p).unwrap_or_else(|| "lib.rs".to_string());
                        if target != module {
                            edges.entry(target).or_insert(line_no);
                        }
                    }
                }
            }
        }
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Edges deliberately left out of the check, each with the reason. Must stay empty unless a
/// move is in flight; an entry whose edge no longer exists is stale and fails the test.
const PENDING: &[(&str, &str, &str)] = &[];

#[test]
fn src_modules_form_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut g = graph(&src);
    let mut stale = Vec::new();
    for (from, to, why) in PENDING {
        if g.get_mut(*from).and_then(|e| e.remove(*to)).is_none() {
            stale.push(format!("{from} -> {to} ({why})"));
        }
    }
    assert!(
        stale.is_empty(),
        "PENDING entries whose edge is gone (delete them from tests/it/modules.rs): {stale:?}"
    );
    assert!(
        g.len() > 10 && g.values().map(BTreeMap::len).sum::<usize>() > 10,
        "expected the graph of src/ to have modules and edges, got {g:?}"
    );
    let found = cycles(&g);
    let mut msg = String::new();
    for comp in &found {
        msg.push_str(&format!("\ncycle among {}:", comp.join(", ")));
        for from in comp {
            for (to, line) in &g[from] {
                if comp.contains(to) {
                    msg.push_str(&format!("\n  src/{from}:{line} uses src/{to}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "expected no import cycle among src/ modules; found:{msg}"
    );
}

#[test]
fn the_checker_sees_groups_inline_paths_and_cycles() {
    let mut paths = Vec::new();
    paths_after(
        "{discovery::{self, HookSpec}, trust::policy::Gate};",
        &[],
        &mut paths,
    );
    paths_after("time::now())", &[], &mut paths);
    let strs: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        strs,
        [
            "discovery",
            "discovery::HookSpec",
            "trust::policy::Gate",
            "time::now"
        ]
    );
    assert_eq!(
        code_of("let u = \"http://x\"; // crate::a"),
        "let u = \"http://x\"; "
    );
    let mut g = Graph::new();
    g.entry("a.rs".into()).or_default().insert("b.rs".into(), 1);
    g.entry("b.rs".into()).or_default().insert("c.rs".into(), 1);
    g.entry("c.rs".into()).or_default().insert("a.rs".into(), 1);
    g.entry("d.rs".into()).or_default().insert("a.rs".into(), 1);
    assert_eq!(cycles(&g), vec![vec!["a.rs", "b.rs", "c.rs"]]);
}

/// Longest function allowed in `src/` (lines from its `fn` line to its closing brace).
const MAX_FN_LINES: usize = 120;

/// Functions in `src/` longer than [`MAX_FN_LINES`]: (file, line, name, lines). A nested
/// function counts within its parent too. Braces in strings and comments are ignored.
fn long_functions(src: &Path) -> Vec<(String, usize, String, usize)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = fn_name(code_of(line)) else {
                continue;
            };
            if let Some(end) = body_end(&lines[i..]) {
                let n = end + 1;
                if n > MAX_FN_LINES {
                    out.push((rel.clone(), i + 1, name, n));
                }
            }
        }
    }
    out
}

/// The name of the function a line declares (`pub async fn name(`), if it does.
fn fn_name(code: &str) -> Option<String> {
    let mut words = code.split_whitespace();
    loop {
        let w = words.next()?;
        if w == "fn" {
            let next = words.next()?;
            let name: String = next.chars().take_while(|c| is_ident(*c)).collect();
            return (!name.is_empty()).then_some(name);
        }
        let qualifier =
            w.starts_with("pub") || matches!(w, "async" | "const" | "unsafe" | "extern" | "\"C\"");
        if !qualifier {
            return None;
        }
    }
}

/// The index of the line that closes the body opened on or after `lines[0]`; `None` for a
/// declaration without a body (a trait method).
fn body_end(lines: &[&str]) -> Option<usize> {
    let mut depth = 0i64;
    let mut opened = false;
    for (i, line) in lines.iter().enumerate() {
        let code = code_of(line);
        let mut in_str = false;
        let mut prev = ' ';
        for c in code.chars() {
            match c {
                '"' if prev != '\\' => in_str = !in_str,
                '{' if !in_str => {
                    depth += 1;
                    opened = true;
                }
                '}' if !in_str => depth -= 1,
                ';' if !in_str && !opened => return None,
                _ => {}
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        if opened && depth <= 0 {
            return Some(i);
        }
    }
    None
}

#[test]
fn no_function_in_src_is_over_120_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long = long_functions(&src);
    let list: Vec<String> = long
        .iter()
        .map(|(f, l, n, len)| format!("src/{f}:{l} {n} ({len} lines)"))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them): {list:?}"
    );
}

/// The package (top-level folder) of a module file: `handler/python/zygote.rs` and
/// `handler/mod.rs` -> `handler`, `events.rs` -> `events`, `lib.rs` -> `` (the crate root).
fn package_of(rel: &str) -> String {
    // Files of one top-level folder are one package; a top-level file is its own.
    module_path(rel).first().cloned().unwrap_or_default()
}

#[test]
fn src_packages_form_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    let mut pg = Graph::new();
    for (from, edges) in &g {
        let pf = package_of(from);
        for (to, line) in edges {
            let pt = package_of(to);
            // The crate root only declares and re-exports: it is nobody's dependency.
            if pf != pt && !pf.is_empty() && !pt.is_empty() {
                pg.entry(pf.clone())
                    .or_default()
                    .entry(format!("{pt} (src/{from}:{line} uses src/{to})"))
                    .or_insert(*line);
                pg.entry(pf.clone()).or_default().entry(pt).or_insert(*line);
            }
        }
    }
    // Keep only package -> package edges for the search; the annotated ones explain a cycle.
    let plain: Graph = pg
        .iter()
        .map(|(k, v)| {
            let e = v
                .iter()
                .filter(|(t, _)| !t.contains(' '))
                .map(|(t, l)| (t.clone(), *l));
            (k.clone(), e.collect())
        })
        .collect();
    let found = cycles(&plain);
    let mut msg = String::new();
    for comp in &found {
        msg.push_str(&format!("\ncycle among packages {}:", comp.join(", ")));
        for from in comp {
            for why in pg[from].keys().filter(|t| t.contains(' ')) {
                if comp.iter().any(|c| why.starts_with(&format!("{c} "))) {
                    msg.push_str(&format!("\n  {from} -> {why}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "expected no import cycle among src/ packages (folders); found:{msg}"
    );
}

#[test]
fn the_length_check_sees_functions() {
    assert_eq!(
        fn_name("    pub(crate) async fn run(x: u8) {"),
        Some("run".into())
    );
    assert_eq!(fn_name("    let f = fn_ptr;"), None);
    assert_eq!(body_end(&["fn a() {", "  let s = \"}\";", "}"]), Some(2));
    assert_eq!(body_end(&["    fn a(&self);"]), None);
    assert_eq!(package_of("handler/python/zygote.rs"), "handler");
    assert_eq!(package_of("events.rs"), "events");
}
