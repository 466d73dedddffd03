//! `hermes-hooks completions SHELL` and `hermes-hooks man`: shell completion scripts
//! (clap_complete) and roff man pages (clap_mangen), both generated from the clap definition of
//! the command line, so they list exactly the commands and options the binary takes.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap_complete::Shell;

/// Why the man pages could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ManError {
    /// Creating the output directory or writing a page failed.
    #[error("cannot {about} {path}: {source}")]
    Io {
        /// What was being done.
        about: &'static str,
        /// The directory or page.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The completion script for `shell`.
pub fn completion_script(shell: Shell) -> Vec<u8> {
    let mut cmd = super::args::command();
    let mut out = Vec::new();
    // Into memory: clap_complete panics on a failed write, and stdout may be a closed pipe.
    clap_complete::generate(shell, &mut cmd, "hermes-hooks", &mut out);
    out
}

/// The man page of `hermes-hooks` itself (section 1, listing every command), as roff.
pub fn man_page() -> Vec<u8> {
    let mut out = Vec::new();
    // Rendering into a Vec cannot fail.
    // Without the `help` subcommand, as in `write_man_pages`: no hermes-hooks-help(1) page exists.
    let cmd = super::args::command().disable_help_subcommand(true);
    let _ = clap_mangen::Man::new(cmd).render(&mut out);
    out
}

/// Writes `hermes-hooks.1` and one page per command (`hermes-hooks-serve.1`, ...) into `dir`,
/// creating it; returns the pages written.
pub fn write_man_pages(dir: &Path) -> Result<Vec<PathBuf>, ManError> {
    std::fs::create_dir_all(dir).map_err(|source| ManError::Io {
        about: "create the directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut cmd = super::args::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    let mut pending = vec![cmd];
    while let Some(cmd) = pending.pop() {
        pending.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        let man = clap_mangen::Man::new(cmd);
        let path = dir.join(man.get_filename());
        let mut roff = Vec::new();
        let _ = man.render(&mut roff);
        std::fs::write(&path, roff).map_err(|source| ManError::Io {
            about: "write",
            path: path.clone(),
            source,
        })?;
        pages.push(path);
    }
    pages.sort();
    Ok(pages)
}

/// `hermes-hooks completions SHELL`: the script on stdout.
pub fn completions(shell: Shell) -> i32 {
    print_bytes(&completion_script(shell))
}

/// `hermes-hooks man [--out DIR]`: the main page on stdout, or every page into DIR.
pub fn man(out: Option<&Path>) -> i32 {
    match out {
        None => print_bytes(&man_page()),
        Some(dir) => match write_man_pages(dir) {
            Ok(pages) => {
                for p in pages {
                    println!("{}", p.display());
                }
                0
            }
            Err(e) => super::common::fail(e),
        },
    }
}

fn print_bytes(bytes: &[u8]) -> i32 {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => 0,
        Err(e) => super::common::fail(format!("cannot write to stdout: {e}")),
    }
}
