//! `remove NAME`: the work is [`crate::package::remove`]; an approval of the hook
//! (`--trust explicit`) is revoked with it, since the files it named are gone.

use crate::cli::args::RootArgs;
use crate::cli::common::{fail, usage};

/// Runs `remove`; returns the exit code.
pub async fn remove(roots: &RootArgs, name: &str, purge: bool) -> i32 {
    let config = match roots.checked_config() {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let home = config.hermes_home.clone();
    let owned = name.to_string();
    let done =
        tokio::task::spawn_blocking(move || crate::package::remove(&home, &owned, purge)).await;
    let removed = match done {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(format!("remove {name}: {e}")),
        Err(e) => return fail(format!("remove {name}: {e}")),
    };
    println!("removed {name} ({})", removed.dir.display());
    if let Some(state) = &removed.purged {
        println!("deleted its state directory {}", state.display());
    }
    let approvals = crate::trust::approvals::TrustFile::load(&crate::trust::approvals::trust_file(
        &config.hermes_home,
    ));
    // Another hook of that name (an operator's, made since) keeps its approval.
    let other = crate::cli::install::hooks_by_name(&config.roots).remove(name);
    if let Some(dir) = &other {
        println!(
            "the approval of {name} stays: another hook of that name runs from {}",
            dir.display()
        );
    }
    if other.is_none() && approvals.is_ok_and(|a| a.hooks.contains_key(name)) {
        let explicit = crate::trust::TrustPolicy {
            mode: crate::trust::TrustMode::Explicit,
            insecure_permissions: false,
        };
        match crate::set_enabled::set_enabled(
            &config.roots,
            &config.hermes_home,
            &explicit,
            name,
            false,
        ) {
            Ok(msg) => println!("{msg}"),
            Err(e) => return fail(format!("removed {name}, but: {e}")),
        }
    }
    0
}
