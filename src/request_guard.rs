//! What a request must show before the API acts on it (issue 46), beyond the token:
//! - **Not a browser's cross-site request.** A page on another origin can send a POST with no
//!   body and no `Content-Type` to `http://127.0.0.1:PORT` (a "simple" request needs no
//!   preflight), and a DNS-rebinding name makes the page's own origin resolve to the service.
//!   Over TCP, a `Host` that is not an address or a loopback name is refused while no token is
//!   set (a page cannot add the token), an `Origin` other than the service's own and a
//!   `Sec-Fetch-Site` of another site are refused, and every POST needs a JSON `Content-Type`
//!   (which no simple request can send). The Unix socket is out of a browser's reach.
//! - **Not a hook, for what changes what runs.** Enable, disable (approve and revoke under
//!   `--trust explicit`), reload and dead-letter replay are refused to the service's own hook
//!   processes ([`crate::caller`]).

use axum::http::{HeaderMap, Method, StatusCode, header};

use crate::caller::{Peer, Verdict};

/// Why a request was refused: status, machine code, message.
pub(crate) type Refusal = (StatusCode, &'static str, String);

/// Whether `(method, route)` changes what the service runs: refused to hook processes. `route`
/// is the router's pattern (`/v1/hooks/{name}/enable`).
pub(crate) fn is_control(method: &Method, route: &str) -> bool {
    method == Method::POST
        && matches!(
            route,
            "/v1/reload"
                | "/v1/hooks/{name}/enable"
                | "/v1/hooks/{name}/disable"
                | "/v1/dead/replay"
        )
}

/// The router's pattern for a control route's `path` (`/v1/hooks/x/enable` ->
/// `/v1/hooks/{name}/enable`); any other path as it is.
pub(crate) fn route_of(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    match parts.as_slice() {
        ["", "v1", "hooks", name, action @ ("enable" | "disable")] if !name.is_empty() => {
            format!("/v1/hooks/{{name}}/{action}")
        }
        _ => path.to_string(),
    }
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
pub(crate) fn control_caller(peer: &Peer, route: &str) -> Result<(), Refusal> {
    match crate::caller::judge(peer) {
        Verdict::Outside => Ok(()),
        Verdict::Hook(c) => {
            tracing::warn!(
                pid = c.pid,
                command = %c.command,
                "refused POST {route} from a hook process ({})",
                c.why
            );
            Err((
                StatusCode::FORBIDDEN,
                "hook_caller",
                format!(
                    "POST {route} comes from pid {} ({}), one of this service's hook processes \
                     ({}): hooks may not enable, disable, approve, reload or replay; run that \
                     from a shell, the dashboard or the gateway",
                    c.pid, c.command, c.why
                ),
            ))
        }
        Verdict::Gone => Err((
            StatusCode::FORBIDDEN,
            "hook_caller",
            format!(
                "POST {route}: the process that opened this connection is gone or cannot be \
                 identified, so it cannot be told from a hook process; send the request from a \
                 process that stays until the answer"
            ),
        )),
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
