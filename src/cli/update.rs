//! `update [NAME|--all] [--dry-run]`: the work is [`crate::package::plan_update`] and
//! [`crate::package::apply`]; here what changes is printed before anything is applied, and
//! under `--trust explicit` a changed hook is applied only with `--yes`, which approves it
//! (given to the staged version, so the service never sees it unapproved).

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
        show(&plan);
        if plan.unchanged() {
            println!("{name} is up to date ({})", plan.entry.version());
            continue;
        }
        if args.dry_run {
            println!("{name}: dry run, nothing changed");
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

/// Prints what the update changes.
fn show(plan: &Plan) {
    for w in &plan.warnings {
        eprintln!("{w}");
    }
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
    if !plan.manifest_diff.is_empty() {
        println!("  HOOK.yaml:");
        for l in &plan.manifest_diff {
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
