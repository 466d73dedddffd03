//! Shell handlers' errors named by their file (issue 50). An executable handler runs from
//! `/proc/self/fd/N` (see `verified_exec`), so its shell reports a syntax error as
//! `/proc/self/fd/21: 4: Syntax error: ...`: [`name_the_handler`] puts the handler's path back
//! in what the service logs. And `check` runs the `#!` shell's `-n` on each shell handler
//! ([`syntax_error`]), so such an error is found before the first event.

use std::borrow::Cow;
use std::path::Path;
use std::process::{Command, Stdio};

/// Shells whose `-n` reads a script without running it.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"];

/// `text` (a handler's stderr) with every `/proc/self/fd/N` of `fd_path` replaced by the
/// handler's path; a longer number (`/proc/self/fd/210` for `.../21`) is left alone.
pub fn name_the_handler<'a>(text: &'a str, fd_path: &Path, program: &Path) -> Cow<'a, str> {
    let Some(fd_path) = fd_path.to_str() else {
        return Cow::Borrowed(text);
    };
    if !text.contains(fd_path) {
        return Cow::Borrowed(text);
    }
    let program = program.display().to_string();
    let mut out = String::with_capacity(text.len() + program.len());
    let mut rest = text;
    while let Some(at) = rest.find(fd_path) {
        let after = &rest[at + fd_path.len()..];
        out.push_str(&rest[..at]);
        if after.starts_with(|c: char| c.is_ascii_digit()) {
            out.push_str(fd_path);
        } else {
            out.push_str(&program);
        }
        rest = after;
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The shell a script's `#!` line runs it with, when it is one whose `-n` checks syntax:
/// `#!/bin/sh`, `#!/usr/bin/env bash`... As the program to run (a path, or a name for `PATH`).
fn shell_of(script: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let first = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let mut words = first.strip_prefix("#!")?.split_whitespace();
    let mut program = words.next()?.to_string();
    if Path::new(&program).file_name().is_some_and(|f| f == "env") {
        program = words.find(|w| !w.starts_with('-'))?.to_string();
    }
    let name = Path::new(&program).file_name()?.to_str()?;
    SHELLS.contains(&name).then_some(program)
}

/// The syntax error the `#!` shell finds in `script` with `-n` (nothing is run), naming the
/// file; `None` when it finds none, or `script` is not a shell script, or the shell is missing.
/// Blocks (starts a process).
pub fn syntax_error(script: &Path) -> Option<String> {
    let shell = shell_of(script)?;
    let out = Command::new(&shell)
        .arg("-n")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .ok()?;
    if out.status.success() {
        return None;
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said = said.trim();
    let shown = script.display().to_string();
    Some(if said.contains(&shown) {
        format!("`{shell} -n` finds a syntax error: {said}")
    } else {
        format!("`{shell} -n` finds a syntax error in {shown}: {said}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_path_becomes_the_handlers_and_only_that_one() {
        let fd = Path::new("/proc/self/fd/21");
        let program = Path::new("/hooks/h/handler.sh");
        assert_eq!(
            name_the_handler(
                "/proc/self/fd/21: 4: Syntax error: end of file unexpected",
                fd,
                program
            ),
            "/hooks/h/handler.sh: 4: Syntax error: end of file unexpected"
        );
        assert_eq!(
            name_the_handler("/proc/self/fd/210: x", fd, program),
            "/proc/self/fd/210: x"
        );
        assert!(matches!(
            name_the_handler("plain", fd, program),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn sh_n_names_the_file_and_other_scripts_are_not_checked() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("handler.sh");
        std::fs::write(&bad, "#!/bin/sh\nif true; then\n  echo hi\n").unwrap();
        let e = syntax_error(&bad).expect("a syntax error");
        assert!(e.contains(&bad.display().to_string()), "{e}");
        let good = dir.path().join("good.sh");
        std::fs::write(&good, "#!/usr/bin/env sh\necho hi\n").unwrap();
        assert_eq!(syntax_error(&good), None);
        let py = dir.path().join("tool");
        std::fs::write(&py, "#!/usr/bin/env python3\nif (:\n").unwrap();
        assert_eq!(syntax_error(&py), None);
    }
}
