//! `enable NAME` / `disable NAME`: the work is in [`crate::set_enabled::set_enabled`].

use crate::cli::args::RootArgs;
use crate::cli::common::fail;

/// Runs `enable` (`on`) or `disable`; returns the exit code.
pub fn set_enabled(roots: &RootArgs, name: &str, on: bool) -> i32 {
    let config = match roots.checked_config() {
        Ok(c) => c,
        Err(e) => return crate::cli::common::usage(e),
    };
    // The hooks made of config.yaml's shell hooks (issue 49) are found too (set_enabled.rs).
    match crate::set_enabled::set_enabled(
        &config.roots,
        &config.hermes_home,
        &config.trust,
        name,
        on,
    ) {
        Ok(msg) => {
            println!("{msg}");
            0
        }
        Err(e) => fail(e),
    }
}
