//! What a request must show before the API acts on it (issue 46), beyond the token:
//! - **Not a browser's cross-site request.** A page on another origin can send a POST with no
//!   body and no `Content-Type` to `http://127.0.0.1:PORT` (a "simple" request needs no
//!   preflight), and a DNS-rebinding name makes the page's own origin resolve to the service.
//!   Over TCP, a `Host` that is not an address or a loopback name is refused while no token is
//!   set (a page cannot add the token), an `Origin` other than the service's own and a
//!   `Sec-Fetch-Site` of another site are refused, and every POST needs a JSON `Content-Type`
//!   (which no simple request can send). The Unix socket is out of a browser's reach.
//! - **Not a hook, for what changes what runs.** Enable, disable (approve and revoke under
//!   `--trust explicit`), the review an approval is given on, reload and dead-letter replay are
//!   refused to the service's own hook processes ([`crate::caller`]), and so are the agent's
//!   events ([`agent_sender`]): a hook does not speak for the agent (issue 57).
//! - **Not another user, over TCP without a token.** The Unix socket is the operator's alone
//!   (mode 0600); a TCP port is open to every local user, so without a token a local client
//!   whose socket another uid made (root aside) is refused (issue 57 row 1).
//! - **Where the agent stands.** A config.yaml command runs where Hermes would run it: the
//!   agent's own working directory. That is read from the kernel for the process that sent the
//!   event and written into the context as `cwd`, over whatever the sender wrote
//!   ([`stamp_cwd`]): nothing a sender writes decides where a command runs.

use axum::http::{HeaderMap, Method, StatusCode, header};

use std::path::PathBuf;

use serde_json::Value;

use crate::caller::{Peer, TcpOwner, Verdict};

/// Why a request was refused: status, machine code, message.
pub(crate) type Refusal = (StatusCode, &'static str, String);

/// Whether `(method, route)` changes what the service runs, or shows what an approval is given
/// on: refused to hook processes. `route` is the router's pattern (`/v1/hooks/{name}/enable`).
pub(crate) fn is_control(method: &Method, route: &str) -> bool {
    (method == Method::POST
        && matches!(
            route,
            "/v1/reload"
                | "/v1/hooks/{name}/enable"
                | "/v1/hooks/{name}/disable"
                | "/v1/dead/replay"
        ))
        || (method == Method::GET && route == "/v1/hooks/{name}/review")
}

/// The router's pattern for a control route's `path` (`/v1/hooks/x/enable` ->
/// `/v1/hooks/{name}/enable`); any other path as it is.
pub(crate) fn route_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        [
            "",
            "v1",
            "hooks",
            name,
            action @ ("enable" | "disable" | "review"),
        ] if !name.is_empty() => {
            format!("/v1/hooks/{{name}}/{action}")
        }
        _ => path.to_string(),
    }
}

/// Refuses a local TCP client whose socket another user made (root aside), for a service
/// without a token. Blocking on a connection's first request (reads `/proc`), then kept.
pub(crate) fn same_user(peer: &Peer) -> Result<(), Refusal> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match peer.tcp_owner() {
        Some(TcpOwner::Local { uid, .. }) if uid != me && uid != 0 => Err((
            StatusCode::FORBIDDEN,
            "another_user",
            format!(
                "this connection comes from uid {uid}, not the service's user ({me}): without a \
                 token the service's TCP port answers its own user only (start it with \
                 --token-file to let other users in with the token, or use its Unix socket)"
            ),
        )),
        _ => Ok(()),
    }
}

/// May `peer` send the agent's events? Not when it is one of the service's hook processes (a
/// hook does not speak for the agent). When it may: its working directory, read from the kernel
/// (`None` when this machine cannot tell: another machine). Blocking: reads `/proc`.
pub(crate) fn agent_sender(peer: &Peer, event: &str) -> Result<Option<PathBuf>, Refusal> {
    match crate::caller::judge(peer) {
        Verdict::Hook(c) => Err(hook_refused(
            &c,
            &format!("the agent's event {event}"),
            "only the agent (its plugin) and the operator send the agent's events; a hook may \
             send gateway events",
        )),
        Verdict::Gone => Err(gone(event)),
        Verdict::Outside => Ok(peer.cwd()),
    }
}

/// The agent's own working directory `cwd` written into `context` as `cwd` (a context that is
/// not an object is left alone); without one (another machine), any `cwd` the sender wrote is
/// removed: the command then runs in the hook's own directory.
pub(crate) fn stamp_cwd(context: &mut Value, cwd: Option<&std::path::Path>) {
    let Value::Object(map) = context else {
        return;
    };
    match cwd {
        Some(dir) => {
            map.insert(
                "cwd".to_string(),
                Value::String(dir.to_string_lossy().into_owned()),
            );
        }
        None => {
            map.remove("cwd");
        }
    }
}

/// 403 `hook_caller` for `what` from the hook process `c`, logged once here.
fn hook_refused(c: &crate::caller::HookCaller, what: &str, rule: &str) -> Refusal {
    tracing::warn!(
        pid = c.pid,
        command = %c.command,
        "refused {what} from a hook process ({})",
        c.why
    );
    (
        StatusCode::FORBIDDEN,
        "hook_caller",
        format!(
            "{what} comes from pid {} ({}), one of this service's hook processes ({}): {rule}",
            c.pid, c.command, c.why
        ),
    )
}

fn gone(what: &str) -> Refusal {
    (
        StatusCode::FORBIDDEN,
        "hook_caller",
        format!(
            "{what}: the process that opened this connection is gone or cannot be identified, \
             so it cannot be told from a hook process; send the request from a process that \
             stays until the answer"
        ),
    )
}

/// The browser rules above, for a request that came over TCP (`tcp`); `token_set`: the service
/// has an API token (a page cannot know it, so any `Host` may then be used, e.g. a fleet edge
/// reached by name); `takes_post`: the request is a POST to a route that takes one (the
/// router answers any other POST with 405 or 404).
pub(crate) fn browser_rules(
    method: &Method,
    headers: &HeaderMap,
    tcp: bool,
    token_set: bool,
    takes_post: bool,
) -> Result<(), Refusal> {
    if method == Method::POST && takes_post {
        json_content_type(headers)?;
    }
    if !tcp {
        return Ok(());
    }
    let host = headers
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}").trim().to_ascii_lowercase());
    if let Some(host) = &host
        && !token_set
        && !local_host(host)
    {
        return Err((
            StatusCode::FORBIDDEN,
            "foreign_host",
            format!(
                "Host {host:?} is not an IP address or a loopback name: refused, as a page that \
                 renamed itself to this address would be (DNS rebinding); reach the service by \
                 its address (127.0.0.1:PORT), or start it with --token-file to use a name"
            ),
        ));
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && matches!(site, "cross-site" | "same-site")
    {
        return Err(foreign_origin(&format!("Sec-Fetch-Site: {site}")));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("\u{fffd}").trim();
        let own = host
            .as_deref()
            .is_some_and(|h| origin.eq_ignore_ascii_case(&format!("http://{h}")));
        if !own {
            return Err(foreign_origin(&format!("Origin {origin:?}")));
        }
    }
    Ok(())
}

fn foreign_origin(what: &str) -> Refusal {
    (
        StatusCode::FORBIDDEN,
        "foreign_origin",
        format!(
            "{what}: a request from a web page of another origin is refused (the service serves \
             no pages; its clients are not browsers)"
        ),
    )
}

/// 415 unless the body is declared JSON: `application/json` or `*+json`.
fn json_content_type(headers: &HeaderMap) -> Result<(), Refusal> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("").to_ascii_lowercase());
    let essence = ct
        .as_deref()
        .map(|c| c.split(';').next().unwrap_or("").trim().to_string());
    match essence.as_deref() {
        Some(e) if e == "application/json" || e.ends_with("+json") => Ok(()),
        other => Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "{}: every POST needs `Content-Type: application/json`, also with an empty body \
                 (a web page's simple request cannot send it)",
                match other {
                    None => "no Content-Type".to_string(),
                    Some(e) => format!("Content-Type {e:?} is not JSON"),
                }
            ),
        )),
    }
}

/// Whether a `Host` value names this machine in a way no other site can take over: an IP
/// address (with or without a port) or `localhost` / `*.localhost`.
fn local_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split_once(']')
            .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(host, |(name, _)| name)
    };
    name.parse::<std::net::IpAddr>().is_ok() || name == "localhost" || name.ends_with(".localhost")
}

/// Refuses a control request from one of the service's hook processes (blocking: reads /proc).
pub(crate) fn control_caller(peer: &Peer, method: &Method, route: &str) -> Result<(), Refusal> {
    match crate::caller::judge(peer) {
        Verdict::Outside => Ok(()),
        Verdict::Hook(c) => Err(hook_refused(
            &c,
            &format!("{method} {route}"),
            "hooks may not review, enable, disable, approve, reload or replay; run that from a \
             shell, the dashboard or the gateway",
        )),
        Verdict::Gone => Err(gone(&format!("{method} {route}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_pass_and_names_do_not() {
        for ok in [
            "127.0.0.1:8787",
            "127.0.0.1",
            "localhost:8787",
            "app.localhost",
            "[::1]:8787",
            "10.1.2.3:80",
        ] {
            assert!(local_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8787",
            "hermes-hooks",
            "[evil]:1",
        ] {
            assert!(!local_host(bad), "{bad}");
        }
    }

    #[test]
    fn a_post_without_a_json_content_type_is_refused() {
        let mut h = HeaderMap::new();
        assert!(browser_rules(&Method::POST, &h, true, false, true).is_err());
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(browser_rules(&Method::POST, &h, false, false, true).is_err());
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert!(browser_rules(&Method::POST, &h, true, false, true).is_ok());
        assert!(browser_rules(&Method::GET, &HeaderMap::new(), true, false, false).is_ok());
    }

    #[test]
    fn only_the_services_own_origin_passes() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8787".parse().unwrap());
        h.insert(header::ORIGIN, "http://127.0.0.1:9999".parse().unwrap());
        assert_eq!(
            browser_rules(&Method::GET, &h, true, false, false)
                .unwrap_err()
                .1,
            "foreign_origin"
        );
        h.insert(header::ORIGIN, "http://127.0.0.1:8787".parse().unwrap());
        assert!(browser_rules(&Method::GET, &h, true, false, false).is_ok());
        h.insert(header::HOST, "evil.example:8787".parse().unwrap());
        assert_eq!(
            browser_rules(&Method::GET, &h, true, false, false)
                .unwrap_err()
                .1,
            "foreign_host"
        );
        // With a token, a name is fine (a page cannot send the token) but an origin is not.
        h.insert(header::ORIGIN, "http://evil.example:8787".parse().unwrap());
        assert!(browser_rules(&Method::GET, &h, true, true, false).is_ok());
    }
}
