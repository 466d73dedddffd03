//! What an approval covers, said file by file for `check --trust explicit`: every file of the
//! hook's tree that is not data, with its SHA-256, and the data patterns that are left out.

use crate::trust::approvals::short;
use crate::trust::files::RunFiles;

/// One line per covered file (`covers  handler.py  sha256 0123456789ab`), then the data rules.
pub fn lines(files: &RunFiles) -> Vec<String> {
    let mut out: Vec<String> = files
        .files
        .iter()
        .map(|(path, sha)| format!("covers  {path}  sha256 {}", short(sha)))
        .collect();
    out.push(format!(
        "data    {} (not covered: the hook may write there)",
        files.data.patterns().join(", ")
    ));
    out
}
