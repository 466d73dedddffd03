//! What the test machine has, for hermes-hooks' tests (issue 60): a dev-dependency only, so what
//! the machine has decides what the tests ignore and never how the service is built.
//!
//! - `#[testenv::needs(FACILITY, ...)]` above `#[test]`: the test is marked
//!   `#[ignore = "why, and how to make it run"]` when one of the facilities is missing here, and
//!   left as it is otherwise. A string literal after the facilities replaces the default reason.
//!   Put it above `#[test]`: the test harness reads `#[ignore]` when `#[test]` expands.
//! - `testenv::has!(FACILITY)`: `true` or `false`, for a test that runs either way but checks more
//!   where the facility is there.
//!
//! The facilities and how each is decided are in build.rs; `cargo test -- --ignored` runs the
//! ignored tests anyway, and each fails saying what is missing.

use proc_macro::{Delimiter, Group, Literal, Punct, Spacing, TokenStream, TokenTree};

/// Each facility and the reason a test that needs it is ignored without it.
const FACILITIES: &[(&str, &str)] = &[
    (
        "nats",
        "nats-server is not installed (apt-get install nats-server, or set HERMES_NATS_SERVER)",
    ),
    ("zsh", "zsh is not installed (apt-get install zsh)"),
    ("fish", "fish is not installed (apt-get install fish)"),
    (
        "man",
        "man or groff is not installed (apt-get install man-db)",
    ),
    (
        "gateway_venv",
        "no gateway venv: run .ci/hermes-agent-venv.sh target/hermes-agent-venv (network) or set \
         HERMES_AGENT_VENV, then touch crates/testenv/build.rs",
    ),
    (
        "landlock4",
        "this kernel has no Landlock ABI >= 4 (Linux 6.7 or later)",
    ),
    (
        "fuse",
        "needs /dev/fuse and mfusepy in target/fuse-venv (.ci/run installs it)",
    ),
    ("root", "needs root"),
    (
        "setpriv_root",
        "needs root and /usr/bin/setpriv to run the service as nobody",
    ),
    (
        "private_group",
        "this user's primary group is not a private one (another user has it or it lists members)",
    ),
    (
        "shared_group",
        "no group other than this user's private one to give a directory here",
    ),
    (
        "pid_namespace",
        "`unshare --pid --fork --mount-proc` does not work here (needs root)",
    ),
];

/// Whether build.rs found `facility` missing on this machine.
fn missing(facility: &str) -> bool {
    env!("TESTENV_MISSING").split(',').any(|m| m == facility)
}

/// `compile_error!(message)`, for a use of the macros this crate does not understand.
fn error(message: &str) -> TokenStream {
    let mut out: TokenStream = "compile_error!".parse().unwrap_or_default();
    out.extend([TokenTree::Group(Group::new(
        Delimiter::Parenthesis,
        TokenTree::Literal(Literal::string(message)).into(),
    ))]);
    out
}

/// The facilities named in `attr` and the reason given after them, if any; or the error to show.
fn parse(attr: TokenStream) -> Result<(Vec<String>, Option<Literal>), String> {
    let mut names = Vec::new();
    let mut reason = None;
    for token in attr {
        match token {
            TokenTree::Ident(ident) if reason.is_none() => {
                let name = ident.to_string();
                if !FACILITIES.iter().any(|(f, _)| *f == name) {
                    let known: Vec<&str> = FACILITIES.iter().map(|(f, _)| *f).collect();
                    return Err(format!(
                        "unknown facility `{name}`; known: {}",
                        known.join(", ")
                    ));
                }
                names.push(name);
            }
            TokenTree::Punct(p) if p.as_char() == ',' => {}
            TokenTree::Literal(lit) if reason.is_none() && lit.to_string().starts_with('"') => {
                reason = Some(lit);
            }
            other => {
                return Err(format!(
                    "expected facility names and an optional reason string, found `{other}`"
                ));
            }
        }
    }
    if names.is_empty() {
        return Err("name at least one facility".to_string());
    }
    Ok((names, reason))
}

/// `#[testenv::needs(nats)]`, `#[testenv::needs(root, "needs root to chown a file")]`,
/// `#[testenv::needs(private_group, shared_group, "why")]`: the item gets
/// `#[ignore = "reason"]` when any facility named is missing here.
#[proc_macro_attribute]
pub fn needs(attr: TokenStream, item: TokenStream) -> TokenStream {
    let (names, reason) = match parse(attr) {
        Ok(parsed) => parsed,
        Err(message) => return error(&message),
    };
    let absent: Vec<&String> = names.iter().filter(|n| missing(n)).collect();
    if absent.is_empty() {
        return item;
    }
    let reason = reason.unwrap_or_else(|| {
        let reasons: Vec<&str> = absent
            .iter()
            .filter_map(|n| FACILITIES.iter().find(|(f, _)| f == n).map(|(_, r)| *r))
            .collect();
        Literal::string(&reasons.join("; "))
    });
    let mut ignore: TokenStream = "ignore =".parse().unwrap_or_default();
    ignore.extend([TokenTree::Literal(reason)]);
    let mut out: TokenStream = TokenTree::Punct(Punct::new('#', Spacing::Alone)).into();
    out.extend([TokenTree::Group(Group::new(Delimiter::Bracket, ignore))]);
    out.extend(item);
    out
}

/// `testenv::has!(landlock4)`: `true` when the facility is there, `false` when it is missing.
#[proc_macro]
pub fn has(input: TokenStream) -> TokenStream {
    match parse(input) {
        Ok((names, None)) if names.len() == 1 => {
            let there = !missing(&names[0]);
            there.to_string().parse().unwrap_or_default()
        }
        Ok(_) => error("`has!` takes one facility and no reason"),
        Err(message) => error(&message),
    }
}
