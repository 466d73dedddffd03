//! `check`: load every hook here (Python handlers are import-checked) and report problems and
//! warnings; exit 1 on any problem.

use std::io::Write;

use crate::cli::args::RootArgs;
use crate::cli::common::{common_python, describe_roots, with_host};

/// Runs `check`; returns the exit code. A `--hooks-dir` given is the root checked: config.yaml's
/// shell hooks only with `--config-hooks` then (issue 60), always without one.
pub async fn check(roots: RootArgs, config_hooks: bool) -> i32 {
    let config_hooks = config_hooks || roots.hooks_dir.is_empty();
    let config = roots.checked_config().map(|mut c| {
        c.config_hooks = config_hooks;
        c
    });
    with_host(config, async |host, report| {
        let mut out = std::io::stdout().lock();
        let snapshot = host.snapshot();
        let mut warnings = 0;
        let mut problems = 0;
        let config = host.config();
        let placements: Vec<_> = snapshot
            .hooks
            .iter()
            .map(|h| {
                crate::ingateway::HookPlacement::of(&h.spec, &config.python, &config.hermes_home)
            })
            .collect();
        let common = common_python(
            placements
                .iter()
                .filter_map(|p| p.python.as_ref().map(|i| (i.path.clone(), i.why.clone()))),
        );
        for (h, placement) in snapshot.hooks.iter().zip(&placements) {
            // A config.yaml entry as written there (issue 58 row 8), not its made directory.
            let kind = match h.spec.config_entries.is_empty() {
                false => "shell",
                true => h.spec.kind.as_str(),
            };
            let _ = writeln!(
                out,
                "ok      {} ({kind}, {})",
                h.spec.name,
                h.spec.manifest.events.join(", ")
            );
            for entry in &h.spec.config_entries {
                let _ = writeln!(out, "        {}", entry.summary());
            }
            let python = placement
                .python
                .as_ref()
                .map(|i| (i.path.clone(), i.why.clone()));
            // Said once below for the usual case: in the service, with the common interpreter.
            if placement.runs != "service" || python.is_some() && python != common {
                let _ = writeln!(out, "        {}", placement.summary());
            }
            let sandbox =
                crate::host::sandbox_view(&h.spec, config.sandbox_default, &config.hermes_home);
            for line in sandbox.lines() {
                let _ = writeln!(out, "        {line}");
            }
            if host.config().trust.mode == crate::trust::TrustMode::Explicit {
                for line in crate::trust::coverage::lines(&h.spec.files) {
                    let _ = writeln!(out, "        {line}");
                }
            }
            if let Some(r) = &placement.restart_needed {
                warnings += 1;
                let _ = writeln!(out, "warning {}: {r}", h.spec.name);
            }
            for n in &h.spec.manifest.notes {
                let _ = writeln!(out, "note    {}: {n}", h.spec.manifest_path.display());
            }
            let (p, w) = findings(&h.spec, &mut out);
            problems += p;
            warnings += w;
        }
        for s in &report.skipped {
            if s.is_problem() {
                problems += 1;
                let _ = writeln!(out, "error   {s}");
            } else {
                let _ = writeln!(out, "skip    {s}");
            }
        }
        if let Some((path, why)) = &common {
            let _ = writeln!(out, "python hooks: interpreter {path} ({why})");
        }
        let home = host.config().hermes_home.clone();
        let mut lines = tokio::task::block_in_place(|| installed_drift(&home));
        let (config_warnings, notes) = if config_hooks {
            config_hook_lines(&home)
        } else {
            (Vec::new(), config_hooks_left_out(&home))
        };
        lines.extend(config_warnings);
        for note in notes {
            let _ = writeln!(out, "{note}");
        }
        for (bad, line) in lines {
            if bad {
                problems += 1;
            } else {
                warnings += 1;
            }
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(
            out,
            "{} hook(s) ok, {problems} problem(s), {warnings} warning(s) in {}",
            snapshot.hooks.len(),
            describe_roots(&host.config().roots)
        );
        i32::from(problems > 0)
    })
    .await
}

/// What `check` says about one loaded hook's patterns and handler: manifest warnings (a near
/// miss of a gateway event's name is a problem: the hook never runs for it, issue 50), patterns
/// of custom events, a shell handler's syntax error (`sh -n`). Returns (problems, warnings).
fn findings(spec: &crate::discovery::HookSpec, out: &mut impl Write) -> (usize, usize) {
    let (mut problems, mut warnings) = (0, 0);
    let misspelt: Vec<String> = spec
        .patterns
        .patterns()
        .iter()
        .filter_map(|p| crate::pattern::misspelt_warning(p))
        .collect();
    for w in &spec.manifest.warnings {
        // A near miss of a gateway event is a hook that never runs: `check` fails on it
        // (issue 50), though the service loads the hook (and warns).
        if misspelt.contains(w) {
            problems += 1;
            let _ = writeln!(
                out,
                "error   {}: {w} (the hook loads but never runs for it; fix the name in \
                 `events:`)",
                spec.manifest_path.display()
            );
        } else {
            warnings += 1;
            let _ = writeln!(out, "warning {}: {w}", spec.manifest_path.display());
        }
    }
    if spec.kind == crate::discovery::HandlerKind::Exec
        && let Some(path) = &spec.handler_path
        && let Some(e) =
            tokio::task::block_in_place(|| crate::handler::shell_syntax::syntax_error(path))
    {
        problems += 1;
        let _ = writeln!(out, "error   {}: {e}", spec.name);
    }
    // A misspelt pattern is among the manifest's warnings above (the service says it
    // too); the other patterns no known event matches are custom events.
    for p in spec.patterns.patterns() {
        if let Some(note) = crate::events::command_note(p) {
            warnings += 1;
            let _ = writeln!(out, "warning {}: {note}", spec.manifest_path.display());
        } else if !crate::pattern::matches_known_event(p) && crate::events::suggest(p).is_none() {
            warnings += 1;
            let _ = writeln!(
                out,
                "warning {}: pattern {p:?} matches no known gateway event (fine for \
                 custom events)",
                spec.manifest_path.display()
            );
        }
    }
    (problems, warnings)
}

/// The installed hooks (`hooks.lock`) whose files no longer match their entry, as
/// `(is_problem, line)`: a hook edited by hand or gone is a warning; an unreadable lock file a
/// problem.
fn installed_drift(hermes_home: &std::path::Path) -> Vec<(bool, String)> {
    use crate::package::{Drift, LockFile, lock_file};
    let lock = match LockFile::load(&lock_file(hermes_home)) {
        Ok(l) => l,
        Err(e) => return vec![(true, format!("error   {e}"))],
    };
    let mut lines = Vec::new();
    for (name, entry) in &lock.hooks {
        let line = match entry.drift() {
            Ok(Drift::Same) => continue,
            Ok(Drift::Missing) => format!(
                "warning {name}: installed from {} but {} is gone; `hermes-hooks remove {name}` forgets it",
                entry.source,
                entry.dir.display()
            ),
            Ok(Drift::Changed(now)) => format!(
                "warning {name}: its files no longer match hooks.lock (installed from {} as {}, now {}): \
                 edited by hand? `hermes-hooks update {name}` puts the published version back",
                entry.source,
                short(&entry.tree),
                short(&now)
            ),
            Err(e) => format!("warning {name}: cannot compare with hooks.lock: {e}"),
        };
        lines.push((false, line));
    }
    lines
}

/// What `check` says about the `hooks:` block of config.yaml (issue 49): its skipped entries
/// (warnings, as `(false, line)`) and the entries not hosted for want of consent (notes, which
/// are not counted: Hermes runs those itself once they have consent).
fn config_hook_lines(hermes_home: &std::path::Path) -> (Vec<(bool, String)>, Vec<String>) {
    let plan = match crate::config_hooks::plan(hermes_home) {
        Ok(p) => p,
        Err(e) => return (vec![(false, format!("warning {e}"))], Vec::new()),
    };
    let config = hermes_home.join("config.yaml");
    let warnings = plan
        .warnings
        .iter()
        .map(|w| (false, format!("warning {}: {w}", config.display())))
        .collect();
    let notes = plan
        .unconsented
        .iter()
        .map(|e| {
            format!(
                "note    {}: hooks.{}[{}] ({}) has no consent in shell-hooks-allowlist.json: not \
                 hosted here; Hermes asks for it at its terminal (or set hooks_auto_accept: \
                 true, or HERMES_ACCEPT_HOOKS=1 for the service)",
                config.display(),
                e.event,
                e.index,
                e.command
            )
        })
        .collect();
    (warnings, notes)
}

/// The note that config.yaml's shell hooks were not checked (a `--hooks-dir` was given), when
/// it has any.
fn config_hooks_left_out(hermes_home: &std::path::Path) -> Vec<String> {
    let entries = crate::config_hooks::plan(hermes_home)
        .map(|p| p.hosted.len() + p.unconsented.len())
        .unwrap_or(0);
    if entries == 0 {
        return Vec::new();
    }
    vec![format!(
        "note    {}: its {entries} shell hook(s) are not checked here (a --hooks-dir was given); \
         add --config-hooks, or run `hermes-hooks check` without --hooks-dir",
        hermes_home.join("config.yaml").display()
    )]
}

fn short(tree: &str) -> String {
    let hex = tree.trim_start_matches("sha256:");
    format!("tree {}", &hex[..hex.len().min(12)])
}
