//! `new NAME --kind ...`: scaffold a hook directory in the first root.

use std::path::PathBuf;

use crate::cli::args::RootArgs;
use crate::cli::common::fail;

/// Runs `new`; returns the exit code.
pub fn new_hook(
    roots: &RootArgs,
    name: &str,
    kind: crate::scaffold::Kind,
    url: Option<&str>,
    src: Option<PathBuf>,
) -> i32 {
    let config = roots.config();
    let Some(root) = config.roots.first() else {
        return fail("no hook root");
    };
    // A root under HERMES_HOME (the default one): create HERMES_HOME private (0700), as
    // `serve` does, before the root's directories are made with the usual mode.
    if root.starts_with(&config.hermes_home)
        && let Err(e) = crate::layout::create_private_dir(&config.hermes_home)
    {
        return fail(format!(
            "cannot create HERMES_HOME {}: {e}",
            config.hermes_home.display()
        ));
    }
    let src = match src {
        Some(s) => s,
        None => match crate::scaffold::rust_source_dir(&config.hermes_home, name) {
            Ok(s) => s,
            Err(e) => return fail(e),
        },
    };
    match crate::scaffold::new_hook(root, name, kind, url, Some(&src)) {
        Ok(s) => {
            println!("created {} ({})", s.dir.display(), s.files.join(", "));
            println!("next: {}", s.next);
            0
        }
        Err(e) => fail(e),
    }
}
