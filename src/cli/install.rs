//! `install SOURCE`: the work is [`crate::package::install`]; here the options, the approval
//! of `--yes` under `--trust explicit` (given to the staged hooks, so the service never sees
//! them unapproved), and what is printed.

use crate::cli::args::InstallArgs;
use crate::cli::common::{fail, usage};
use crate::package::{InstallOptions, install as install_package};
use crate::set_enabled::{approve_staged, restore_approvals, snapshot_approvals};
use crate::trust::TrustMode;

/// The hooks in `roots` by name (loaded or not), as discovery reads them.
pub(crate) fn hooks_by_name(
    roots: &[std::path::PathBuf],
) -> std::collections::BTreeMap<String, std::path::PathBuf> {
    let found = crate::discovery::discover(roots);
    let mut out = std::collections::BTreeMap::new();
    for s in &found.skipped {
        out.insert(s.name.clone(), s.dir.clone());
    }
    for h in &found.hooks {
        out.insert(h.name.clone(), h.dir.clone());
    }
    out
}

/// Runs `install`; returns the exit code.
pub async fn install(args: InstallArgs) -> i32 {
    let config = match args.roots.checked_config() {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let Some(root) = config.roots.first().cloned() else {
        return usage("no hook root to install into");
    };
    let opts = InstallOptions {
        source: args.source.clone(),
        reference: args.reference.clone(),
        name: args.name.clone(),
        all: args.all,
        link: args.link,
        root: root.clone(),
        hermes_home: config.hermes_home.clone(),
        taken: hooks_by_name(&config.roots),
    };
    let explicit = config.trust.mode == TrustMode::Explicit;
    let approve = explicit && args.yes && !args.link;
    let (home, policy) = (config.hermes_home.clone(), config.trust);
    let work = tokio::task::spawn_blocking(move || {
        let saved = snapshot_approvals(&home);
        let mut messages = Vec::new();
        let mut before_land = |staged: &std::path::Path, names: &[String]| {
            for name in names.iter().filter(|_| approve) {
                let dir = crate::hook_name::path_under(&root, name)?;
                let msg = approve_staged(staged, &home, &policy, name, &dir)
                    .map_err(|e| format!("cannot approve {name}: {e}"))?;
                messages.push(msg);
            }
            Ok(())
        };
        let result = install_package(&opts, &mut before_land);
        if result.is_err() && approve {
            restore_approvals(&home, saved);
        }
        result.map(|r| (r, messages))
    });
    let (report, approvals) = match work.await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return fail(format!(
                "install {}: {e}; nothing was installed",
                args.source
            ));
        }
        Err(e) => return fail(format!("install {}: {e}", args.source)),
    };
    for w in &report.warnings {
        eprintln!("{w}");
    }
    for n in &report.notes {
        println!("{n}");
    }
    for k in &report.skipped {
        println!("{k}");
    }
    for h in &report.installed {
        println!(
            "installed {} ({}) from {} into {}",
            h.name,
            h.entry.version(),
            h.entry.source,
            h.entry.dir.display()
        );
    }
    for a in &approvals {
        println!("{a}");
    }
    if explicit && args.yes && args.link {
        // A linked hook is used in place: approved once its link is in the root.
        for h in &report.installed {
            match crate::set_enabled::set_enabled(
                &config.roots,
                &config.hermes_home,
                &config.trust,
                &h.name,
                true,
            ) {
                Ok(msg) => println!("{msg}"),
                Err(e) => return fail(format!("installed {}, but cannot approve it: {e}", h.name)),
            }
        }
    }
    if explicit && !args.yes {
        for h in &report.installed {
            let how = if args.link {
                format!("hermes-hooks enable {} --trust explicit", h.name)
            } else {
                format!(
                    "hermes-hooks enable {} --trust explicit (or install with --yes)",
                    h.name
                )
            };
            println!(
                "{} is not approved yet: review it, then run `{how}`",
                h.name
            );
        }
    }
    println!("a running service loads it on its next reload (at once when it watches the root)");
    0
}
