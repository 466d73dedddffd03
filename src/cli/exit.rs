//! Exit codes in one place: every command ends with one of these (or 0).

/// A problem found or a failure: one line on stderr, exit code 1.
pub fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("hermes-hooks: {msg}");
    1
}

/// A usage error (bad argument value): one line, exit code 2.
pub fn usage(msg: impl std::fmt::Display) -> i32 {
    eprintln!("hermes-hooks: {msg}");
    2
}
