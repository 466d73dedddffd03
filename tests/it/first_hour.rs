//! A new user's first hour (issue 50, "The first hour"): each mistake one makes early gets an
//! error or a warning that names the file (or the address) and the way out.

use std::process::{Command, Output};

use crate::util::{Hooks, bin};

/// Runs `hermes-hooks ARGS` with HERMES_HOME = the hooks' home and no HERMES_HOOKS_ADDRESS.
fn run(hooks: &Hooks, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("HERMES_HOME", hooks.home())
        .env_remove("HERMES_HOOKS_ADDRESS")
        .env_remove("HERMES_HOOKS_TOKEN")
        .output()
        .expect("run hermes-hooks")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `emit` after the README's `serve --listen 127.0.0.1:8787`: the service has no socket, and
/// "cannot reach ... hooks.sock (is `hermes-hooks serve` running?)" left the user stuck. The
/// error now says how to reach a TCP service; the TCP variant says where a socket service is.
#[test]
fn emit_without_a_socket_names_listen_and_hermes_hooks_address() {
    let hooks = Hooks::new();
    let o = run(&hooks, &["emit", "agent:start"]);
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("hooks.sock"), "{out}");
    assert!(out.contains("--listen HOST:PORT"), "{out}");
    assert!(
        out.contains("HERMES_HOOKS_ADDRESS=http://HOST:PORT"),
        "{out}"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let o = run(
        &hooks,
        &[
            "emit",
            "agent:start",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let out = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("--socket PATH"), "{out}");
}
