//! `update [NAME|--all] [--dry-run]`: the work is [`crate::package::plan_update`] and
//! [`crate::package::apply`]; here what changes is printed before anything is applied, and
//! under `--trust explicit` a changed hook is applied only with `--yes`, which approves it
//! (given to the staged version, so the service never sees it unapproved). A hook whose files
//! were edited by hand since the install is replaced only after a yes: asked on a terminal,
//! `--yes` otherwise (issue 50: the edit was overwritten without a word). A warning the same
//! source gives is printed once, not once per hook.

use std::path::PathBuf;

use crate::cli::args::UpdateArgs;
use crate::cli::common::{fail, usage};
use crate::package::{LockFile, Plan, lock_file};
use crate::set_enabled::{approve_staged, restore_approvals, snapshot_approvals};
use crate::trust::{TrustMode, TrustPolicy};

/// Runs `update`; returns the exit code.
pub async fn update(args: UpdateArgs) -> i32 {
    let config = match args.roots.checked_config() {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let home = config.hermes_home.clone();
    let names: Vec<String> = if args.all {
        match LockFile::load(&lock_file(&home)) {
            Ok(l) => l.hooks.keys().cloned().collect(),
            Err(e) => return fail(e),
        }
    } else {
        args.name.iter().cloned().collect()
    };
    if names.is_empty() {
        println!(
            "no hooks installed ({} is empty)",
            lock_file(&home).display()
        );
        return 0;
    }
    let mut code = 0;
    let mut warned = std::collections::HashSet::new();
    for name in names {
        let (h, n, r) = (home.clone(), name.clone(), args.reference.clone());
        let planned =
            tokio::task::spawn_blocking(move || crate::package::plan_update(&h, &n, r.as_deref()))
                .await;
        let plan = match planned {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                eprintln!("hermes-hooks: update {name}: {e}; the installed version stays");
                code = 1;
                continue;
            }
            Err(e) => return fail(e),
        };
        for w in &plan.warnings {
            if warned.insert(w.clone()) {
                eprintln!("{w}");
            }
        }
        show(&plan);
        if plan.unchanged() {
            println!("{name} is up to date ({})", plan.entry.version());
            continue;
        }
        if let Some(now) = &plan.hand_edited {
            eprintln!(
                "warning: {name}: its files were edited by hand since it was installed (tree {}, \
                 now {}): the update replaces those edits (the lines above marked - go)",
                short(&plan.previous.tree),
                short(now)
            );
        }
        if args.dry_run {
            println!("{name}: dry run, nothing changed");
            continue;
        }
        if plan.hand_edited.is_some()
            && !args.yes
            && !confirm(&format!("replace the edited {name}?"))
        {
            eprintln!(
                "hermes-hooks: update {name}: not replacing the hand-edited files; keep a copy of \
                 {} if you need the edits, then run `hermes-hooks update {name} --yes`; nothing \
                 changed",
                plan.entry.dir.display()
            );
            code = 1;
            continue;
        }
        let explicit = config.trust.mode == TrustMode::Explicit;
        if explicit && !args.yes {
            let pin = args
                .reference
                .as_ref()
                .map(|r| format!(" --ref {r}"))
                .unwrap_or_default();
            eprintln!(
                "hermes-hooks: update {name}: under --trust explicit the new version needs approval, \
                 as a new hook does: review the changes above, then run `hermes-hooks update {name}{pin} \
                 --trust explicit --yes`; nothing changed"
            );
            code = 1;
            continue;
        }
        match apply(plan, home.clone(), explicit.then_some(config.trust)).await {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => {
                eprintln!("hermes-hooks: update {name}: {e}; the installed version stays");
                code = 1;
            }
        }
    }
    code
}

/// Asks `question` on the terminal; false without one (stdin not a terminal) or on anything
/// but y/yes.
fn confirm(question: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// `sha256:abcdef...` shortened for a message.
fn short(tree: &str) -> String {
    let hex = tree.trim_start_matches("sha256:");
    hex[..hex.len().min(12)].to_string()
}

/// Prints what the update changes (every changed text file line by line).
fn show(plan: &Plan) {
    for n in &plan.notes {
        println!("{n}");
    }
    if plan.unchanged() {
        return;
    }
    println!(
        "{}: {} -> {} ({})",
        plan.name,
        plan.previous.version(),
        plan.entry.version(),
        plan.entry.source
    );
    for (what, files) in [
        ("added", &plan.diff.added),
        ("removed", &plan.diff.removed),
        ("changed", &plan.diff.changed),
    ] {
        if !files.is_empty() {
            println!("  {what:<8} {}", files.join(", "));
        }
    }
    for (file, lines) in &plan.file_diffs {
        println!("  {file}:");
        for l in lines {
            println!("    {l}");
        }
    }
}

/// Approves (explicit mode) and applies `plan`; an approval given is taken back when the new
/// version does not land. Returns the lines to print.
async fn apply(
    plan: Plan,
    home: PathBuf,
    approve: Option<TrustPolicy>,
) -> Result<Vec<String>, String> {
    let linked = plan.entry.kind == "link";
    let work = tokio::task::spawn_blocking(move || {
        let saved = snapshot_approvals(&home);
        let mut lines = Vec::new();
        let name = plan.name.clone();
        if let Some(policy) = approve.filter(|_| !linked) {
            let msg = approve_staged(&plan.staged_root(), &home, &policy, &name, &plan.entry.dir)
                .map_err(|e| format!("cannot approve the new version: {e}"))?;
            lines.push(msg);
        }
        match crate::package::apply(plan, &home) {
            Ok(entry) => {
                lines.insert(0, format!("updated {name} to {}", entry.version()));
                if let (Some(policy), true) = (approve, linked) {
                    let msg = crate::set_enabled::set_enabled(
                        &[entry.dir.parent().map(PathBuf::from).unwrap_or_default()],
                        &home,
                        &policy,
                        &name,
                        true,
                    )
                    .map_err(|e| e.to_string())?;
                    lines.push(msg);
                }
                Ok(lines)
            }
            Err(e) => {
                restore_approvals(&home, saved);
                Err(e.to_string())
            }
        }
    });
    work.await.map_err(|e| e.to_string())?
}
