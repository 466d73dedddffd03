//! Webhook handlers (`url:` in HOOK.yaml): one signed HTTP POST per event.
//!
//! Body: `{"hook_event_name", "event", "context", "delivery_id", "timestamp"}`, serialised once;
//! those exact bytes are what is sent (on every attempt) and what the signature covers. Headers:
//! `Content-Type: application/json`, `X-Hermes-Event`, `X-Hermes-Delivery` (the delivery id) and,
//! when `secret_env` names a set variable, `X-Hermes-Signature-256: sha256=<hex HMAC-SHA256>`.
//!
//! Each hook owns one [`reqwest::Client`] (keep-alive to its endpoint), built with rustls on the
//! `ring` provider, no proxies, and redirects never followed. An attempt may take the hook's
//! `timeout` clamped to 1..=60 s (10 s when HOOK.yaml gives none). Connection errors and 5xx are
//! retried once after a short backoff with the same delivery id; 4xx, 3xx and a timed-out
//! attempt are not retried (the endpoint may already have acted on the event). Because the worker
//! wraps the whole delivery in the hook's timeout, discovery sets that timeout to
//! [`delivery_budget`], which leaves room for both attempts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderValue, LOCATION};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::api::{
    BoxFuture, Call, Feed, Handler, HandlerContext, HandlerError, HandlerResult, NoFeed, Report,
    call_each,
};
use super::context::Context;
use crate::discovery::{HandlerKind, HookSpec};
use crate::manifest::Manifest;

/// Per-attempt timeout when HOOK.yaml has no `timeout:`.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Shortest per-attempt timeout.
pub const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest per-attempt timeout.
pub const MAX_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause before the single retry.
pub const RETRY_BACKOFF: Duration = Duration::from_millis(250);
/// Largest response body kept as a result.
pub const MAX_RESPONSE: usize = 1024 * 1024;
/// Characters of a failed response body quoted in the error.
const SNIPPET_CHARS: usize = 200;

/// Header carrying the event name.
pub const HEADER_EVENT: &str = "x-hermes-event";
/// Header carrying the delivery id (same as `delivery_id` in the body).
pub const HEADER_DELIVERY: &str = "x-hermes-delivery";
/// Header carrying `sha256=<hex HMAC-SHA256 of the body>`.
pub const HEADER_SIGNATURE: &str = "x-hermes-signature-256";

/// The per-attempt timeout of a webhook hook: its explicit `timeout:` clamped to 1..=60 s, or
/// [`DEFAULT_ATTEMPT_TIMEOUT`].
pub fn attempt_timeout(m: &Manifest) -> Duration {
    m.explicit_timeout
        .map(|t| t.clamp(MIN_ATTEMPT_TIMEOUT, MAX_ATTEMPT_TIMEOUT))
        .unwrap_or(DEFAULT_ATTEMPT_TIMEOUT)
}

/// Time a whole delivery may take (two attempts and the backoff, plus a margin): the worker's
/// timeout for a webhook hook, so that its own cut-off never pre-empts the retry.
pub fn delivery_budget(m: &Manifest) -> Duration {
    attempt_timeout(m) * 2 + RETRY_BACKOFF + Duration::from_secs(1)
}

/// True when deliveries of this manifest are signed: `secret_env` names a set, non-empty variable.
pub fn is_signed(m: &Manifest) -> bool {
    m.secret_env.as_deref().and_then(read_secret).is_some()
}

/// The load-time warning for a webhook whose `secret_env` names an unset variable.
pub fn unsigned_warning(m: &Manifest) -> Option<String> {
    let var = m.secret_env.as_deref()?;
    read_secret(var).is_none().then(|| {
        format!(
            "`secret_env`: environment variable {var} is not set; deliveries are sent UNSIGNED \
             (set {var} in the service's environment to sign them)"
        )
    })
}

fn read_secret(var: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    std::env::var_os(var)
        .map(OsStringExt::into_vec)
        .filter(|v| !v.is_empty())
}

/// What a webhook handler needs from the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookTarget {
    /// `url:`.
    pub url: String,
    /// `secret_env:`.
    pub secret_env: Option<String>,
    /// `ca_file:`, resolved against the hook directory.
    pub ca_file: Option<std::path::PathBuf>,
    /// Time allowed per attempt.
    pub attempt_timeout: Duration,
}

impl WebhookTarget {
    /// The target of a webhook hook; `None` for other kinds.
    pub fn of(spec: &HookSpec) -> Option<Self> {
        if spec.kind != HandlerKind::Webhook {
            return None;
        }
        Some(Self {
            url: spec.manifest.url.clone()?,
            secret_env: spec.manifest.secret_env.clone(),
            ca_file: spec.manifest.ca_file.as_ref().map(|c| spec.dir.join(c)),
            attempt_timeout: attempt_timeout(&spec.manifest),
        })
    }
}

/// `sha256=<hex>` of the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length; the error branch cannot happen but must not panic.
    match <Hmac<Sha256> as KeyInit>::new_from_slice(secret) {
        Ok(mut mac) => {
            mac.update(body);
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        }
        Err(_) => String::new(),
    }
}

/// A delivery id unique per event per hook: 32 hex digits from the clock, the process id, a
/// process-wide counter and per-process random keys.
pub fn delivery_id(hook: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(n.to_le_bytes());
    h.update(nanos.to_le_bytes());
    h.update(hook.as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// Why one attempt failed, and whether a retry may help.
enum AttemptError {
    /// Connection failure or 5xx: retried once.
    Retry(String),
    /// Anything else: reported as is.
    Final(String),
}

/// The webhook handler of one hook.
pub struct WebhookHandler {
    name: String,
    url: reqwest::Url,
    secret: Option<Vec<u8>>,
    client: reqwest::Client,
    attempt_timeout: Duration,
    /// The hook's timeout for a whole delivery (both attempts).
    timeout: Duration,
    /// Deliveries in flight at once (`concurrency:`).
    concurrency: usize,
}

/// A delivery's body (the context's text embedded as it is, not parsed).
#[derive(serde::Serialize)]
struct Body<'a> {
    hook_event_name: &'a str,
    event: &'a str,
    context: &'a serde_json::value::RawValue,
    delivery_id: &'a str,
    timestamp: String,
}

impl WebhookHandler {
    /// Checks the URL, reads the secret and builds the hook's HTTP client; nothing is sent yet.
    pub fn new(ctx: &HandlerContext, target: Option<WebhookTarget>) -> Result<Self, HandlerError> {
        let target =
            target.ok_or_else(|| HandlerError::Load("webhook hook without `url:`".into()))?;
        let url = reqwest::Url::parse(&target.url).map_err(|e| {
            HandlerError::Load(format!("`url`: {:?} is not a URL: {e}", target.url))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(HandlerError::Load(format!(
                "`url`: scheme {:?} is not supported: use http:// or https://",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(HandlerError::Load(format!(
                "`url`: {:?} has no host",
                target.url
            )));
        }
        let secret = target.secret_env.as_deref().and_then(read_secret);
        if let (Some(var), None) = (&target.secret_env, &secret) {
            tracing::warn!(hook = %ctx.name, "secret_env {var} is not set: deliveries are UNSIGNED");
        }
        // reqwest with `rustls-no-provider` uses the process-wide default provider: install ring
        // (an error only means a provider is already installed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let extra_roots = match &target.ca_file {
            Some(path) => load_ca_file(path)?,
            None => Vec::new(),
        };
        let client = reqwest::Client::builder()
            .tls_certs_merge(extra_roots)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(target.attempt_timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(ctx.concurrency.max(4))
            .user_agent(concat!("hermes-hooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HandlerError::Load(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            name: ctx.name.clone(),
            url,
            secret,
            client,
            attempt_timeout: target.attempt_timeout,
            timeout: ctx.timeout,
            concurrency: ctx.concurrency,
        })
    }

    async fn deliver(&self, event: &str, context: &Context) -> HandlerResult {
        let id = delivery_id(&self.name);
        let context = context
            .raw()
            .map_err(|e| HandlerError::Failed(format!("cannot encode the event: {e}")))?;
        let body = Body {
            hook_event_name: event,
            event,
            context,
            delivery_id: &id,
            timestamp: crate::time::now(),
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| HandlerError::Failed(format!("cannot encode the event: {e}")))?;
        let signature = self.secret.as_deref().map(|s| signature(s, &body));
        let mut first_error = None;
        for attempt in 1..=2u32 {
            match self.attempt(event, &id, &body, signature.as_deref()).await {
                Ok(v) => {
                    if let Some(e) = first_error {
                        tracing::info!(hook = %self.name, delivery = %id, "delivered on retry after: {e}");
                    }
                    return Ok(v);
                }
                Err(AttemptError::Retry(e)) if attempt == 1 => {
                    tracing::warn!(hook = %self.name, delivery = %id, "{e}; retrying once in {}", crate::time::fmt_duration(RETRY_BACKOFF));
                    first_error = Some(e);
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
                Err(AttemptError::Retry(e)) => {
                    return Err(HandlerError::Failed(format!(
                        "{e} (after 2 attempts, delivery {id})"
                    )));
                }
                Err(AttemptError::Final(e)) => {
                    return Err(HandlerError::Failed(format!("{e} (delivery {id})")));
                }
            }
        }
        Err(HandlerError::Failed(format!(
            "not delivered (delivery {id})"
        )))
    }

    async fn attempt(
        &self,
        event: &str,
        id: &str,
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<Option<Value>, AttemptError> {
        let mut req = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(HEADER_EVENT, event)
            .header(HEADER_DELIVERY, id)
            .body(body.to_vec());
        if let Some(sig) = signature {
            req = req.header(HEADER_SIGNATURE, sig);
        }
        let limit = self.attempt_timeout;
        let timed_out = || {
            AttemptError::Final(format!(
                "{} did not answer within {} (not retried: it may have received the event)",
                self.display_url(),
                crate::time::fmt_duration(limit)
            ))
        };
        let exchange = async {
            let mut resp = req.send().await.map_err(|e| self.transport_error(e))?;
            let status = resp.status();
            let (bytes, cut) = read_capped(&mut resp, MAX_RESPONSE)
                .await
                .map_err(|e| self.transport_error(e))?;
            Ok::<_, AttemptError>((status, resp.headers().clone(), bytes, cut))
        };
        let (status, headers, bytes, cut) = match tokio::time::timeout(limit, exchange).await {
            Ok(r) => r?,
            Err(_) => return Err(timed_out()),
        };
        interpret(status, &headers, &bytes, cut)
    }

    fn transport_error(&self, e: reqwest::Error) -> AttemptError {
        let (timeout, connect) = (e.is_timeout(), e.is_connect());
        let cert = certificate_error(&e);
        let detail = error_chain(&e.without_url());
        if let Some(cert) = cert {
            // Retrying cannot help: the same certificate comes back.
            return AttemptError::Final(format!(
                "TLS: the certificate of {} is not trusted ({cert}); if the endpoint uses a \
                 private certificate authority, name its PEM file in HOOK.yaml `ca_file:` (or \
                 SSL_CERT_FILE for the whole service); not retried",
                self.display_url()
            ));
        }
        if timeout && !connect {
            return AttemptError::Final(format!(
                "{} did not answer within {} ({detail})",
                self.display_url(),
                crate::time::fmt_duration(self.attempt_timeout)
            ));
        }
        if connect {
            return AttemptError::Retry(format!(
                "cannot connect to {}: {detail}",
                self.display_url()
            ));
        }
        AttemptError::Retry(format!(
            "request to {} failed: {detail}",
            self.display_url()
        ))
    }

    /// The URL for messages: scheme, host and port only (credentials, path and query may be
    /// secrets, and messages end up in logs and `last_error`).
    fn display_url(&self) -> String {
        crate::text::redact_url(self.url.as_str())
    }
}

/// The certificates of `ca_file:` (PEM, one or more).
fn load_ca_file(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, HandlerError> {
    let pem = std::fs::read(path).map_err(|e| {
        HandlerError::Load(format!("`ca_file`: cannot read {}: {e}", path.display()))
    })?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
        HandlerError::Load(format!(
            "`ca_file`: {} is not a PEM certificate bundle: {e}",
            path.display()
        ))
    })?;
    if certs.is_empty() {
        return Err(HandlerError::Load(format!(
            "`ca_file`: {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The rustls certificate error somewhere in `e`'s sources (an I/O error's inner error counts).
fn certificate_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let inner = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|i| i as &(dyn std::error::Error + 'static));
        for candidate in [Some(c), inner].into_iter().flatten() {
            if let Some(rustls::Error::InvalidCertificate(ce)) =
                candidate.downcast_ref::<rustls::Error>()
            {
                return Some(format!("{ce:?}"));
            }
        }
        // Wrapped where a downcast cannot reach (a boxed connector error): rustls' own wording.
        let text = c.to_string();
        if let Some(at) = text.find("invalid peer certificate: ") {
            return Some(text[at + "invalid peer certificate: ".len()..].to_string());
        }
        cause = c.source();
    }
    None
}

/// `e` and its sources, joined with ": ".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

async fn read_capped(
    resp: &mut reqwest::Response,
    max: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = max.saturating_sub(out.len());
        if chunk.len() > room {
            out.extend_from_slice(&chunk[..room]);
            return Ok((out, true));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, false))
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut s: String = flat.chars().take(SNIPPET_CHARS).collect();
    if flat.chars().count() > SNIPPET_CHARS {
        s.push('…');
    }
    s
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(r) => format!("HTTP {} {r}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    }
}

fn is_json(headers: &reqwest::header::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|m| m == "application/json" || m.ends_with("+json"))
}

/// Turns a response into the hook's result: a 2xx JSON body is the result (empty = none); a 2xx
/// body that is not JSON is accepted without a result unless it claims to be JSON; 3xx, 4xx and
/// 5xx are errors (5xx retryable).
fn interpret(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
    cut: bool,
) -> Result<Option<Value>, AttemptError> {
    if status.is_success() {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        if cut {
            return Err(AttemptError::Final(format!(
                "{}: response body exceeded {} MiB and was cut; no result",
                status_text(status),
                MAX_RESPONSE >> 20
            )));
        }
        return match serde_json::from_str::<Value>(text) {
            Ok(Value::Null) => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(e) if is_json(headers) => Err(AttemptError::Final(format!(
                "{}: body is not valid JSON ({e}): {:?}",
                status_text(status),
                snippet(body)
            ))),
            Err(_) => {
                tracing::debug!(
                    "2xx response without a JSON body ({:?}): no result",
                    snippet(body)
                );
                Ok(None)
            }
        };
    }
    let detail = if body.is_empty() {
        String::new()
    } else {
        format!(": {:?}", snippet(body))
    };
    if status.is_redirection() {
        let to = headers
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(|l| format!(" to {l}"))
            .unwrap_or_default();
        return Err(AttemptError::Final(format!(
            "{}: redirect{to} not followed (webhooks never follow redirects: point `url:` at the final address)",
            status_text(status)
        )));
    }
    if status.is_server_error() {
        return Err(AttemptError::Retry(format!(
            "{}{detail}",
            status_text(status)
        )));
    }
    Err(AttemptError::Final(format!(
        "{}{detail}",
        status_text(status)
    )))
}

impl Handler for WebhookHandler {
    fn max_calls(&self) -> usize {
        self.concurrency
    }

    fn call<'a>(&'a mut self, calls: Vec<Call>, report: &'a mut Report<'_>) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.call_fed(calls, &mut NoFeed, report).await })
    }

    fn call_fed<'a>(
        &'a mut self,
        calls: Vec<Call>,
        feed: &'a mut dyn Feed,
        report: &'a mut Report<'_>,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let this = &*self;
            // Past the hook's timeout a request is dropped (cancelled).
            call_each(
                calls,
                feed,
                this.timeout,
                this.concurrency,
                report,
                |call| async move {
                    // The last moment before the request goes out (issue 56 row 8).
                    if !crate::start_gate::may_start(call.gate.as_deref()) {
                        return Err(HandlerError::Expired);
                    }
                    this.deliver(&call.event, &call.context).await
                },
            )
            .await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_signature() {
        assert_eq!(hex::encode([0, 15, 16, 255]), "000f10ff");
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn delivery_ids_are_unique() {
        let a = delivery_id("h");
        let b = delivery_id("h");
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }

    #[test]
    fn timeouts() {
        let mut m = crate::manifest::parse_manifest("events: [a]\nurl: http://x/\n").unwrap();
        assert_eq!(attempt_timeout(&m), DEFAULT_ATTEMPT_TIMEOUT);
        m.explicit_timeout = Some(Duration::from_millis(300));
        assert_eq!(attempt_timeout(&m), MIN_ATTEMPT_TIMEOUT);
        m.explicit_timeout = Some(Duration::from_secs(200));
        assert_eq!(attempt_timeout(&m), MAX_ATTEMPT_TIMEOUT);
        assert!(delivery_budget(&m) > MAX_ATTEMPT_TIMEOUT * 2);
    }

    #[test]
    fn statuses() {
        let h = reqwest::header::HeaderMap::new();
        assert!(matches!(
            interpret(StatusCode::OK, &h, b"", false),
            Ok(None)
        ));
        assert!(matches!(
            interpret(StatusCode::OK, &h, b"{\"a\":1}", false),
            Ok(Some(_))
        ));
        assert!(matches!(
            interpret(StatusCode::OK, &h, b"ok", false),
            Ok(None)
        ));
        assert!(matches!(
            interpret(StatusCode::INTERNAL_SERVER_ERROR, &h, b"x", false),
            Err(AttemptError::Retry(_))
        ));
        assert!(matches!(
            interpret(StatusCode::BAD_REQUEST, &h, b"x", false),
            Err(AttemptError::Final(_))
        ));
        assert!(matches!(
            interpret(StatusCode::FOUND, &h, b"", false),
            Err(AttemptError::Final(_))
        ));
    }
}
