//! The HTTP API (axum): a thin layer that parses requests, calls [`Host`], and turns every
//! failure into a JSON error `{"error": {"code", "message"}}` with the status codes of the design.
//! Nothing a client sends can panic the service: bodies are read with a limit and parsed by hand.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::handler::context::Context;
use crate::host::{EmitError, Host};
use crate::sink::SinkError;

/// Largest single-event or collect body.
pub(crate) const BODY_LIMIT: usize = 1024 * 1024;
/// Largest batch body.
pub(crate) const BATCH_BODY_LIMIT: usize = 16 * 1024 * 1024;
/// Most events in one batch.
pub(crate) const BATCH_MAX_EVENTS: usize = 10_000;
/// Collect deadline when the request gives none and no local hook matches (otherwise the
/// matching hooks' own timeouts decide: `crate::decision::collect_budget`).
pub(crate) const DEFAULT_COLLECT_MS: u64 = 5_000;
/// Longest collect deadline accepted.
pub(crate) const MAX_COLLECT_MS: u64 = 300_000;

/// Settings of the API.
#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    /// When set, every request needs `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

#[derive(Clone)]
struct AppState {
    host: Host,
    config: Arc<ApiConfig>,
}

/// An API error: status, machine code, human message.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        if self.code == "buffer_full" {
            // The edge's buffer drains as fast as the broker takes events: soon.
            return (self.status, [(header::RETRY_AFTER, "1")], axum::Json(body)).into_response();
        }
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<EmitError> for ApiError {
    fn from(e: EmitError) -> Self {
        match e {
            EmitError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                e.to_string(),
            ),
            EmitError::InvalidEvent(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_event", e.to_string())
            }
            EmitError::ContextNotObject(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_context", e.to_string())
            }
            EmitError::Sink(ref s) => match s {
                SinkError::TooLarge { .. } => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large_for_broker",
                    e.to_string(),
                ),
                SinkError::Full { .. } => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "buffer_full",
                    e.to_string(),
                ),
                SinkError::Refused(_) => {
                    ApiError::new(StatusCode::BAD_GATEWAY, "broker_refused", e.to_string())
                }
                SinkError::Fleet(_) => fleet_error(e.to_string()),
                SinkError::ShuttingDown => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "shutting_down",
                    e.to_string(),
                ),
            },
        }
    }
}

/// Version of the HTTP protocol this service speaks (the API of `docs/openapi.json`): sent on
/// every answer as the `Hermes-Hooks-Protocol` header and in `GET /healthz`. Raised only for a
/// change an older client cannot work with; the Python client refuses a service of another.
pub const PROTOCOL_VERSION: u32 = 1;

/// The router, without a listener: tests can drive it directly.
pub fn app(host: Host, config: ApiConfig) -> Router {
    let state = AppState {
        host,
        config: Arc::new(config),
    };
    route_table()
        .into_iter()
        .fold(Router::new(), |r, (_, path, handler)| {
            r.route(path, handler)
        })
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // The token is checked first (401 before anything else is said), then who sent it.
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .layer(axum::middleware::map_response(stamp))
        .with_state(state)
}

/// One row of [`route_table`]: the method's name and its routing filter come from one token.
macro_rules! route {
    ($method:ident $path:literal => $handler:expr) => {
        (
            stringify!($method),
            $path,
            axum::routing::on(axum::routing::MethodFilter::$method, $handler),
        )
    };
}

/// Every route of the API, once: the router is built from this table, and a test checks that
/// the OpenAPI document ([`OPENAPI`]) lists exactly these (method, path) pairs.
fn route_table() -> Vec<(&'static str, &'static str, MethodRouter<AppState>)> {
    vec![
        route!(POST "/v1/events" => post_event),
        route!(POST "/v1/events/batch" => post_batch),
        route!(POST "/v1/collect" => post_collect),
        route!(GET "/v1/hooks" => get_hooks),
        route!(GET "/v1/hooks/{name}" => get_hook),
        route!(POST "/v1/reload" => post_reload),
        route!(POST "/v1/proof" => post_proof),
        route!(GET "/v1/hooks/{name}/review" => get_review),
        route!(POST "/v1/hooks/{name}/enable" => set_enabled::<true>),
        route!(POST "/v1/hooks/{name}/disable" => set_enabled::<false>),
        route!(GET "/v1/notices" => get_notices),
        route!(GET "/v1/dead" => get_dead),
        route!(POST "/v1/dead/replay" => post_dead_replay),
        route!(GET "/v1/openapi.json" => openapi),
        route!(GET "/healthz" => healthz),
        route!(GET "/readyz" => readyz),
        route!(GET "/metrics" => metrics),
    ]
}

/// Whether `path` is one of the routes that take a POST (a `{param}` matches one segment). The
/// patterns are split once: the router's table is not built again for every request.
fn post_route(path: &str) -> bool {
    static POSTS: std::sync::OnceLock<Vec<Vec<&'static str>>> = std::sync::OnceLock::new();
    let posts = POSTS.get_or_init(|| {
        routes()
            .into_iter()
            .filter(|(method, _)| *method == "POST")
            .map(|(_, route)| route.split('/').collect())
            .collect()
    });
    let given: Vec<&str> = path.split('/').collect();
    posts.iter().any(|want| {
        want.len() == given.len()
            && want
                .iter()
                .zip(&given)
                .all(|(w, g)| w == g || (w.starts_with('{') && !g.is_empty()))
    })
}

/// The (method, path) of every route the router serves, paths in the router's `{param}` syntax
/// (the same as OpenAPI's).
pub(crate) fn routes() -> Vec<(&'static str, &'static str)> {
    route_table()
        .into_iter()
        .map(|(method, path, _)| (method, path))
        .collect()
}

/// The OpenAPI 3 document of this API (`docs/openapi.json`), served at `GET /v1/openapi.json`.
pub const OPENAPI: &str = include_str!("../docs/openapi.json");

/// Serves `app` on `listener` until `shutdown` resolves, then finishes in-flight requests.
/// Its connections are capped and timed out ([`crate::connections`]).
pub async fn serve<L>(
    listener: L,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Io: crate::connections::CallerOf + Sync,
    L::Addr: std::fmt::Debug,
    crate::caller::Peer: for<'a> axum::extract::connect_info::Connected<
            axum::serve::IncomingStream<'a, crate::connections::Guarded<L>>,
        >,
{
    axum::serve(
        crate::connections::Guarded::new(listener),
        router.into_make_service_with_connect_info::<crate::caller::Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

// Who connected, as the kernel says at accept time (crate::caller), for the request guard.
type Guarded<L> = crate::connections::Guarded<L>;

impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, Guarded<tokio::net::UnixListener>>,
    > for crate::caller::Peer
{
    fn connect_info(
        stream: axum::serve::IncomingStream<'_, Guarded<tokio::net::UnixListener>>,
    ) -> Self {
        use std::os::fd::AsRawFd;
        crate::caller::Peer::of_unix(stream.io().get_ref().as_raw_fd())
    }
}

impl
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, Guarded<tokio::net::TcpListener>>,
    > for crate::caller::Peer
{
    fn connect_info(
        stream: axum::serve::IncomingStream<'_, Guarded<tokio::net::TcpListener>>,
    ) -> Self {
        let remote = *stream.remote_addr();
        let local = stream.io().get_ref().local_addr().unwrap_or(remote);
        crate::caller::Peer::of_tcp_known(local, remote, stream.io().owner())
    }
}

/// Says on every answer (401s included) which protocol and which release answered.
async fn stamp(mut res: Response) -> Response {
    let headers = res.headers_mut();
    headers.insert(
        header::HeaderName::from_static("hermes-hooks-protocol"),
        header::HeaderValue::from(PROTOCOL_VERSION),
    );
    headers.insert(
        header::SERVER,
        header::HeaderValue::from_static(concat!("hermes-hooks/", env!("CARGO_PKG_VERSION"))),
    );
    res
}

async fn auth(
    State(state): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    // Health probes reveal nothing and are what supervisors poll; the proof is what a client
    // asks before it sends the token (it reveals nothing usable: crate::proof). No token needed.
    let probe = matches!(req.uri().path(), "/healthz" | "/readyz" | "/v1/proof");
    if let Some(token) = state.config.token.as_ref().filter(|_| !probe) {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .unwrap_or("");
        // `subtle` compares in time independent of where the bytes differ; a length mismatch
        // returns early, which reveals only the token's length.
        if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong token: send `Authorization: Bearer <token>` with the token from --token-file",
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// [`crate::request_guard`]: a browser's cross-site request is refused over TCP, and a hook
/// process may not change what runs. A request without connection info (the router driven
/// in-process, as tests and embedders do) is held to the browser rules as if it came over TCP.
async fn guard(
    State(state): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    use crate::request_guard as g;
    use axum::extract::ConnectInfo;
    let peer = req
        .extensions()
        .get::<ConnectInfo<crate::caller::Peer>>()
        .map(|c| c.0.clone());
    let tcp = !matches!(peer, Some(crate::caller::Peer::Unix { .. }));
    let refusal =
        |(status, code, message): g::Refusal| ApiError::new(status, code, message).into_response();
    // A POST to a route that takes none is answered 405 (or 404) by the router, not 415.
    let takes_post = req.method() == axum::http::Method::POST && post_route(req.uri().path());
    if let Err(r) = g::browser_rules(
        req.method(),
        req.headers(),
        tcp,
        state.config.token.is_some(),
        takes_post,
    ) {
        return refusal(r);
    }
    let route = g::route_of(req.uri().path());
    let control = g::is_control(req.method(), &route);
    // Over TCP without a token, a local client of another user is refused (issue 57 row 1):
    // looked up once per connection, on the first request.
    let foreign = tcp && state.config.token.is_none();
    if let Some(peer) = &peer
        && foreign
        && !control
        && peer.tcp_owner_known()
    {
        // Known for this connection: no /proc read, no thread hop.
        if let Err(r) = g::same_user(peer) {
            return refusal(r);
        }
    } else if let Some(peer) = peer.filter(|_| control || foreign) {
        let method = req.method().clone();
        let checked = tokio::task::spawn_blocking(move || {
            if foreign {
                g::same_user(&peer)?;
            }
            if control {
                g::control_caller(&peer, &method, &route)?;
            }
            Ok(())
        })
        .await;
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(r)) => return refusal(r),
            Err(e) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
                    .into_response();
            }
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no route {} {}; see GET /v1/hooks, POST /v1/events, POST /v1/collect",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// Reads a JSON object body with a size limit; 415 for a non-JSON content type.
async fn read_json(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let bytes = read_body(headers, body, limit).await?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("body is not valid JSON: {e}")))?;
    match value {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::bad_request("body must be a JSON object")),
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 9110 section 11.1), spaces around the token do not count.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Reads a body with a size limit (413 beyond it, 400 when the body cannot be read, e.g. the
/// client went away mid-body); 415 for a content type that is not JSON.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<axum::body::Bytes, ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or("").trim();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "Content-Type {essence:?} is not JSON; send `Content-Type: application/json`"
                ),
            ));
        }
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let inner = e.into_inner();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(inner.as_ref());
        while let Some(c) = cause {
            if c.is::<http_body_util::LengthLimitError>() {
                return ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("request body is larger than the limit of {limit} bytes"),
                );
            }
            cause = c.source();
        }
        tracing::debug!("request body could not be read: {inner}");
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "incomplete_body",
            format!("the request body could not be read: {inner}"),
        )
    })
}

/// Pulls `event` (required string) and `context` (optional object) out of a request object.
fn event_of(
    obj: &mut serde_json::Map<String, Value>,
    at: &str,
) -> Result<(String, Value), ApiError> {
    let event = match obj.remove("event") {
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                format!("{at}`event` must be a string such as \"agent:start\""),
            ));
        }
        None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_event",
                format!("{at}missing `event` (a string such as \"agent:start\")"),
            ));
        }
    };
    let context = obj.remove("context").unwrap_or(Value::Null);
    let context = crate::host::check_event(&event, context).map_err(|e| {
        let mut err = ApiError::from(e);
        err.message = format!("{at}{}", err.message);
        err
    })?;
    Ok((event, context))
}

/// Events sent before the first load would match nothing and be lost: refuse them (503) so the
/// client retries.
fn require_ready(host: &Host) -> Result<(), ApiError> {
    if host.is_ready() || host.is_draining() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "hooks are still loading; retry shortly (GET /readyz answers 200 when ready)",
    ))
}

/// The peer of a request, when it came through a listener.
fn peer_of(req: &Request) -> Option<crate::caller::Peer> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<crate::caller::Peer>>()
        .map(|c| c.0.clone())
}

/// Who sent the agent's event `event`, held to [`crate::request_guard::agent_sender`]: its
/// working directory, for the context's `cwd` (issue 57). Without a peer (the router driven
/// in-process by an embedder), the embedder is the sender: this process's own directory.
async fn agent_origin(
    peer: Option<crate::caller::Peer>,
    event: &str,
) -> Result<Option<std::path::PathBuf>, ApiError> {
    let event = event.to_string();
    let checked = tokio::task::spawn_blocking(move || match peer {
        Some(peer) => crate::request_guard::agent_sender(&peer, &event),
        None => Ok(std::env::current_dir().ok()),
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    checked.map_err(|(status, code, message)| ApiError::new(status, code, message))
}

/// `context` of `event` as the service passes it on: an agent event's `cwd` is where its sender
/// stands, whatever the context said.
async fn stamped(
    peer: Option<crate::caller::Peer>,
    event: &str,
    mut context: Value,
) -> Result<Value, ApiError> {
    if crate::events::agent_event(event).is_some() {
        let cwd = agent_origin(peer, event).await?;
        crate::request_guard::stamp_cwd(&mut context, cwd.as_deref());
    }
    Ok(context)
}

async fn post_event(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    require_ready(&state.host)?;
    let peer = peer_of(&req);
    let (parts, body) = req.into_parts();
    let mut obj = read_json(&parts.headers, body, BODY_LIMIT).await?;
    let (event, context) = event_of(&mut obj, "")?;
    let context = stamped(peer, &event, context).await?;
    let id = id_of(obj.remove("id"), "")?;
    let accepted = state.host.accept(&event, context, id).await?;
    Ok(accepted_response(accepted.queued, accepted.state()))
}

/// 202 with `queued`, and in fleet mode `state`: `stored` (the broker has every event) or
/// `buffered` (some wait in the edge's buffer for the broker).
fn accepted_response(queued: impl serde::Serialize, state: Option<&str>) -> Response {
    let mut body = json!({"queued": queued});
    if let Some(s) = state {
        body["state"] = json!(s);
    }
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

/// Longest client event id.
const MAX_ID_LEN: usize = 200;

/// The optional client event id (`"id"`): 1 to 200 printable characters, no whitespace.
fn id_of(v: Option<Value>, at: &str) -> Result<Option<String>, ApiError> {
    let id = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s,
        Some(_) => return Err(ApiError::bad_request(format!("{at}`id` must be a string"))),
    };
    check_id(&id, at)?;
    Ok(Some(id))
}

fn check_id(id: &str, at: &str) -> Result<(), ApiError> {
    if id.is_empty()
        || id.len() > MAX_ID_LEN
        || id.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ApiError::bad_request(format!(
            "{at}`id` must be 1 to {MAX_ID_LEN} bytes without whitespace or control characters"
        )));
    }
    Ok(())
}

/// The batch body as the fast path reads it; anything it cannot read takes the slow path, which
/// words the error.
#[derive(serde::Deserialize)]
struct BatchBody {
    events: Vec<BatchItem>,
}

#[derive(serde::Deserialize)]
struct BatchItem {
    event: String,
    /// Kept as the client's text: no hook needs it as an object (checked to be one later).
    #[serde(default)]
    context: Option<Box<RawValue>>,
    #[serde(default)]
    id: Option<String>,
}

async fn post_batch(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    require_ready(&state.host)?;
    let peer = peer_of(&req);
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, BATCH_BODY_LIMIT).await?;
    let (events, ids): (Vec<(String, Context)>, Vec<Option<String>>) = match batch_fast_path(&bytes)
    {
        Some(items) => items.into_iter().unzip(),
        None => batch_slow_path(&bytes)?
            .into_iter()
            .map(|((event, context), id)| ((event, Context::new(context)), id))
            .unzip(),
    };
    for (i, id) in ids.iter().enumerate() {
        if let Some(id) = id {
            check_id(id, &format!("events[{i}]: "))?;
        }
    }
    if events.len() > BATCH_MAX_EVENTS {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "{} events in one batch; the limit is {BATCH_MAX_EVENTS}",
                events.len()
            ),
        ));
    }
    let events = stamped_batch(peer, events).await?;
    let accepted = state
        .host
        .accept_batch(events, ids)
        .await
        .map_err(|(i, e)| {
            let mut err = ApiError::from(e);
            if err.status == StatusCode::BAD_REQUEST {
                err.message = format!("events[{i}]: {}", err.message);
            }
            err
        })?;
    Ok(accepted_response(&accepted.queued, accepted.state()))
}

/// [`stamped`] for a batch: the sender is looked up once, and only when the batch holds one
/// of the agent's events.
async fn stamped_batch(
    peer: Option<crate::caller::Peer>,
    mut events: Vec<(String, Context)>,
) -> Result<Vec<(String, Context)>, ApiError> {
    let Some(first) = events
        .iter()
        .find(|(e, _)| crate::events::agent_event(e).is_some())
    else {
        return Ok(events);
    };
    let cwd = agent_origin(peer, &first.0.clone()).await?;
    for (event, context) in &mut events {
        if crate::events::agent_event(event).is_none() {
            continue;
        }
        let text = context
            .json()
            .map_err(|e| ApiError::bad_request(format!("{event}: context: {e}")))?;
        let mut value: Value = serde_json::from_str(text)
            .map_err(|e| ApiError::bad_request(format!("{event}: context: {e}")))?;
        crate::request_guard::stamp_cwd(&mut value, cwd.as_deref());
        *context = Context::new(value);
    }
    Ok(events)
}

/// An event name and its context.
type EventItem = (String, Value);

/// Parses a batch the fast path refused, to say exactly what is wrong with it.
/// An event of a batch with its context as the client's text.
type TextItem = (String, Context);

/// The batch as the fast path reads it, each context kept as the client's text; `None` for
/// anything it cannot read (the slow path words the error).
fn batch_fast_path(bytes: &[u8]) -> Option<Vec<(TextItem, Option<String>)>> {
    let body = serde_json::from_slice::<BatchBody>(bytes).ok()?;
    body.events
        .into_iter()
        .map(|i| {
            let context = match i.context {
                Some(raw) => Context::from_raw(raw).ok()?,
                None => Value::Null.into(),
            };
            Some(((i.event, context), i.id))
        })
        .collect()
}

fn batch_slow_path(bytes: &[u8]) -> Result<Vec<(EventItem, Option<String>)>, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("body is not valid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::bad_request("body must be a JSON object"));
    };
    let events = match obj.remove("events") {
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::bad_request(
                "`events` must be a list of {\"event\", \"context\"} objects",
            ));
        }
        None => {
            return Err(ApiError::bad_request(
                "missing `events` (a list of {\"event\", \"context\"} objects)",
            ));
        }
    };
    let mut parsed = Vec::with_capacity(events.len());
    for (i, item) in events.into_iter().enumerate() {
        let at = format!("events[{i}]: ");
        let Value::Object(mut o) = item else {
            return Err(ApiError::bad_request(format!("{at}must be an object")));
        };
        let ev = event_of(&mut o, &at)?;
        parsed.push((ev, id_of(o.remove("id"), &at)?));
    }
    Ok(parsed)
}

async fn post_collect(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    require_ready(&state.host)?;
    let peer = peer_of(&req);
    let (parts, body) = req.into_parts();
    let mut obj = read_json(&parts.headers, body, BODY_LIMIT).await?;
    let (event, context) = event_of(&mut obj, "")?;
    let context = stamped(peer, &event, context).await?;
    let timeout_ms = match obj.remove("timeout_ms") {
        None | Some(Value::Null) => state
            .host
            .collect_budget(&event)
            .map_or(DEFAULT_COLLECT_MS, |d| d.as_millis() as u64),
        Some(v) => match v.as_u64() {
            Some(ms) if (1..=MAX_COLLECT_MS).contains(&ms) => ms,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "`timeout_ms` must be an integer from 1 to {MAX_COLLECT_MS}"
                )));
            }
        },
    };
    let outcomes = state
        .host
        .collect(&event, context, Duration::from_millis(timeout_ms))
        .await?;
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for o in outcomes {
        match o.result {
            Ok(Some(v)) => results.push(json!({"hook": o.hook, "result": v})),
            Ok(None) => {}
            Err(e) if crate::decision::is_timeout(&e) => {
                errors.push(json!({"hook": o.hook, "error": e, "timed_out": true}))
            }
            Err(e) => errors.push(json!({"hook": o.hook, "error": e})),
        }
    }
    // A matching hook that is not running is no "no objection": it is named (issue 33).
    for u in state.host.unanswerable(&event) {
        errors.push(json!({"hook": u.hook, "error": u.reason, "state": u.state}));
    }
    Ok(axum::Json(json!({"results": results, "errors": errors})).into_response())
}

async fn get_hooks(State(state): State<AppState>) -> Response {
    let hooks = state.host.hooks();
    let skipped = state.host.skipped();
    // `ready: false` while the first load runs: the list is not the hooks yet (a client reads
    // them from disk meanwhile and asks again; issue 36).
    let ready = state.host.is_ready() || state.host.is_draining();
    let config = state.host.config();
    let trust = match config.trust.mode {
        crate::trust::policy::TrustMode::Explicit => "explicit",
        crate::trust::policy::TrustMode::All => "all",
    };
    // config.yaml's shell hooks are scanned from a root of their own (issue 60 row 6: the tab's
    // roots omitted it): listed when a hook loaded or refused lives there.
    let mut roots = config.roots.clone();
    let made = config.hermes_home.join(crate::config_hooks::ROOT_DIR);
    if config.config_hooks
        && !roots.contains(&made)
        && (hooks.iter().any(|h| h.root == made)
            || skipped.iter().any(|s| s.dir.starts_with(&made)))
    {
        roots.push(made);
    }
    let mut body =
        json!({"hooks": hooks, "skipped": skipped, "ready": ready, "roots": roots, "trust": trust});
    // Fleet edge: the workers' hooks join the list, and the fleet's own state is added.
    if let Some(Value::Object(extra)) = state.host.sink_status() {
        for (k, v) in extra {
            match (body.get_mut(&k), v) {
                (Some(Value::Array(mine)), Value::Array(more)) => mine.extend(more),
                (_, v) => body[k] = v,
            }
        }
    }
    axum::Json(body).into_response()
}

async fn get_hook(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    // A name that does not decode (say `%FF`) gets the API's JSON error, not axum's plain text.
    let Path(name) = name.map_err(|e| ApiError::bad_request(format!("hook name: {e}")))?;
    let fleet_hook = || {
        let st = state.host.sink_status()?;
        st["hooks"]
            .as_array()?
            .iter()
            .find(|h| h["name"] == name.as_str())
            .cloned()
    };
    if let Some(h) = state.host.hook(&name) {
        return Ok(axum::Json(h).into_response());
    }
    match fleet_hook() {
        Some(h) => Ok(axum::Json(h).into_response()),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no loaded hook named {name:?}"),
        )),
    }
}

async fn post_reload(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // The body says nothing, but it must be empty (no bytes at all) or a JSON object (as
    // documented): whitespace alone is not JSON, and is refused like any other bad body.
    let bytes = read_body(&headers, body, 64 * 1024).await?;
    if !bytes.is_empty() {
        read_object(&bytes)?;
    }
    if state.host.is_draining() {
        return Err(EmitError::ShuttingDown.into());
    }
    let report = state.host.reload().await;
    Ok(axum::Json(report).into_response())
}

/// `TrustError` as the API's error: no such hook 404, refused 409, anything else 500.
fn trust_error(e: crate::trust::error::TrustError) -> ApiError {
    use crate::trust::error::TrustError;
    let (status, code) = match e {
        TrustError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
        TrustError::Refused { .. } => (StatusCode::CONFLICT, "refused"),
        TrustError::Io { .. } | TrustError::Corrupt { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, "trust_file")
        }
    };
    ApiError::new(status, code, e.to_string())
}

/// A hook name from the path, as the API's JSON error when it does not decode.
fn hook_name(name: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    name.map(|Path(n)| n)
        .map_err(|e| ApiError::bad_request(format!("hook name: {e}")))
}

/// What approving the hook would cover (its files and their SHA-256), before anyone approves.
async fn get_review(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = hook_name(name)?;
    let config = state.host.config().clone();
    let review = tokio::task::spawn_blocking(move || {
        crate::set_enabled::review(
            &config.roots,
            &config.hermes_home,
            &config.trust,
            config.sandbox_default,
            &name,
        )
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
    .map_err(trust_error)?;
    Ok(axum::Json(review).into_response())
}

/// A JSON object body, or the API's 400.
fn read_object(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::bad_request("body must be a JSON object")),
    }
}

/// The optional `{"reviewed": DIGEST}` body of enable/disable (no bytes at all: none;
/// whitespace alone is not JSON and is refused).
async fn reviewed_digest(headers: &HeaderMap, body: Body) -> Result<Option<String>, ApiError> {
    let bytes = read_body(headers, body, 64 * 1024).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    let m = read_object(&bytes)?;
    match m.get("reviewed") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(d)) => Ok(Some(d.clone())),
        Some(_) => Err(ApiError::bad_request("`reviewed` must be a string")),
    }
}

/// How long enable/disable wait for their reload before answering without its report.
const RELOAD_WAIT: Duration = Duration::from_secs(3);

/// `enable`/`disable` as the CLI does them (approve or revoke under `--trust explicit`, else
/// `enabled:` in HOOK.yaml), then a reload (its report, or null when it takes longer than
/// [`RELOAD_WAIT`]). An approval with `{"reviewed": DIGEST}` happens only
/// if the hook's files still have the digest its review showed.
async fn set_enabled<const ON: bool>(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let on = ON;
    let name = hook_name(name)?;
    let name_shown = name.clone();
    let reviewed = reviewed_digest(&headers, body).await?;
    if state.host.is_draining() {
        return Err(EmitError::ShuttingDown.into());
    }
    let config = state.host.config().clone();
    let message = tokio::task::spawn_blocking(move || {
        crate::set_enabled::set_enabled_reviewed(
            &config.roots,
            &config.hermes_home,
            &config.trust,
            &name,
            on,
            reviewed.as_deref(),
        )
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?
    .map_err(trust_error)?;
    // The reload goes on by itself; its report is in the answer when it is done within
    // RELOAD_WAIT (starting hook processes on a loaded machine can take longer).
    let host = state.host.clone();
    let reload = tokio::spawn(async move { host.reload().await });
    let report = tokio::time::timeout(RELOAD_WAIT, reload)
        .await
        .ok()
        .and_then(Result::ok);
    let loaded = report.as_ref().map(|r| r.loaded.as_slice());
    let message = crate::set_enabled::after_reload(&message, &name_shown, loaded);
    Ok(axum::Json(json!({"message": message, "reload": report})).into_response())
}

/// The last notices (`serve --output json`'s lines) after number `after`.
async fn get_notices(
    State(state): State<AppState>,
    query: Result<axum::extract::Query<NoticesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (notices, last) = state.host.notices().recent(q.after.unwrap_or(0));
    Ok(axum::Json(json!({"notices": notices, "last": last})).into_response())
}

/// `GET /v1/notices?after=N`.
#[derive(serde::Deserialize)]
struct NoticesQuery {
    after: Option<u64>,
}

/// A fleet operation the broker failed (502 `fleet_error`).
fn fleet_error(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_GATEWAY, "fleet_error", message)
}

/// 404 `not_fleet`: dead letters exist only on a fleet edge.
fn not_fleet() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_fleet",
        "this service is not a fleet edge: dead letters exist only in fleet mode (serve --fleet nats://HOST:PORT)",
    )
}

/// Outside fleet mode, `not_fleet` before anything else is looked at.
fn require_fleet(host: &Host) -> Result<(), ApiError> {
    if host.keeps_dead_letters() {
        Ok(())
    } else {
        Err(not_fleet())
    }
}

/// A dead-letter answer from the host (`None`: not a fleet edge).
fn dead_answer(answer: Option<Result<Value, SinkError>>) -> Result<Response, ApiError> {
    match answer {
        None => Err(not_fleet()),
        Some(Err(e)) => Err(fleet_error(e.to_string())),
        Some(Ok(v)) => Ok(axum::Json(v).into_response()),
    }
}

/// Most dead letters one `GET /v1/dead` lists.
const DEAD_LIST_MAX: usize = 1000;
/// What `GET /v1/dead` lists without `limit`.
const DEAD_LIST_DEFAULT: usize = 100;

/// `GET /v1/dead?hook=NAME&limit=N`.
#[derive(serde::Deserialize)]
struct DeadListQuery {
    hook: Option<String>,
    limit: Option<usize>,
}

/// The fleet's dead letters (of one hook with `hook`), oldest first, at most `limit`.
async fn get_dead(
    State(state): State<AppState>,
    query: Result<axum::extract::Query<DeadListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    require_fleet(&state.host)?;
    let axum::extract::Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = q.limit.unwrap_or(DEAD_LIST_DEFAULT);
    if !(1..=DEAD_LIST_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "`limit` must be from 1 to {DEAD_LIST_MAX}"
        )));
    }
    let query = crate::sink::DeadQuery {
        hook: q.hook.filter(|h| !h.is_empty()),
        seqs: Vec::new(),
        limit,
    };
    dead_answer(state.host.dead_letters(query).await)
}

/// `dead replay` through the API: `{"hook": NAME?, "seqs": [N, ...]}` or
/// `{"hook": NAME?, "all": true}`.
async fn post_dead_replay(
    State(state): State<AppState>,
    req: Request,
) -> Result<Response, ApiError> {
    require_fleet(&state.host)?;
    let (parts, body) = req.into_parts();
    let obj = read_json(&parts.headers, body, 64 * 1024).await?;
    let hook = match obj.get("hook") {
        None | Some(Value::Null) => None,
        Some(Value::String(h)) if !h.is_empty() => Some(h.clone()),
        Some(_) => return Err(ApiError::bad_request("`hook` must be a hook's name")),
    };
    let seqs: Vec<u64> = match obj.get("seqs") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
            ApiError::bad_request("`seqs` must be a list of sequences (as GET /v1/dead lists)")
        })?,
    };
    let all = match obj.get("all") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("`all` must be true or false")),
    };
    // Both, or neither (as `dead replay` refuses them).
    if all != seqs.is_empty() {
        return Err(ApiError::bad_request(
            "give either `seqs` (sequences from GET /v1/dead) or `\"all\": true`, not both",
        ));
    }
    let query = crate::sink::DeadQuery {
        hook,
        seqs,
        limit: 0,
    };
    dead_answer(state.host.replay_dead(query).await)
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Largest `POST /v1/proof` body (a nonce of at most 128 hex digits in a JSON object).
const PROOF_BODY_LIMIT: usize = 1024;

/// `POST /v1/proof` `{"nonce": HEX}`: `{"proof": HMAC-SHA256(token, nonce || context)}`
/// (`crate::proof`); 404 `no_token` when the service has no token to prove.
async fn post_proof(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let obj = read_json(&headers, body, PROOF_BODY_LIMIT).await?;
    // A fixed shape (docs/openapi.json, ProofRequest): extra fields are refused, not ignored,
    // so that a body within the schema also fits the limit.
    if let Some(extra) = obj.keys().find(|k| *k != "nonce") {
        return Err(ApiError::bad_request(format!(
            "unknown field {extra:?}: the body is {{\"nonce\": HEX}}"
        )));
    }
    let nonce = obj
        .get("nonce")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("missing 'nonce' (16 to 64 random bytes as hex)"))?;
    let nonce =
        crate::proof::parse_nonce(nonce).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let Some(token) = state.config.token.as_ref() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_token",
            "this service has no token (--token-file) to prove",
        ));
    };
    Ok(axum::Json(json!({ "proof": crate::proof::answer(token, &nonce) })).into_response())
}

async fn healthz() -> Response {
    axum::Json(json!({
        "status": "ok",
        "protocol": PROTOCOL_VERSION,
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.host.is_draining() {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the host is shutting down",
        )
        .into_response()
    } else if state.host.is_ready()
        && let Some(reason) = state.host.degraded()
    {
        // Still accepting (into a bounded buffer): ready, but say what is wrong.
        axum::Json(json!({"status": "degraded", "reason": reason, "hooks": state.host.snapshot().hooks.len()}))
            .into_response()
    } else if state.host.is_ready() {
        axum::Json(json!({"status": "ready", "hooks": state.host.snapshot().hooks.len()}))
            .into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "hooks are still loading",
        )
        .into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    match crate::metrics::render(&state.host) {
        Ok(text) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response(),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("encoding the metrics failed: {e}"),
        )
        .into_response(),
    }
}

/// Why the Unix socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BindError {
    /// Another process answers on the socket.
    #[error("another hermes-hooks is already running on {path}{pid}; stop it or pass --socket/--listen", pid = pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    InUse {
        /// The socket path.
        path: String,
        /// The peer's pid, when the OS tells.
        pid: Option<i32>,
    },
    /// An I/O error while preparing or binding the socket.
    #[error("cannot {about} {path}: {source}")]
    Io {
        /// What was being done.
        about: &'static str,
        /// The socket path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Binds the Unix socket at `path` with mode 0600: a stale socket file left by a dead process is
/// replaced, and so is the socket of a service that is shutting down (its `/readyz` says
/// `shutting_down`: it drains on, unreachable, and a new gateway's events come here instead of
/// waiting for its drain; issue 33); a socket some other live process answers on is refused.
pub(crate) fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener, BindError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let shown = path.display().to_string();
    let io = |about: &'static str| {
        let shown = shown.clone();
        move |source| BindError::Io {
            about,
            path: shown,
            source,
        }
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::Io {
                about: "replace (it is not a socket)",
                path: shown,
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(stream) if shutting_down(&stream) => {
                tracing::info!(
                    pid = peer_pid(&stream),
                    "the service on {shown} is shutting down: taking its socket over"
                );
                std::fs::remove_file(path)
                    .map_err(io("replace the socket of a stopping service"))?;
            }
            Ok(stream) => {
                return Err(BindError::InUse {
                    path: shown,
                    pid: peer_pid(&stream),
                });
            }
            Err(_) => std::fs::remove_file(path).map_err(io("remove the stale socket"))?,
        }
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    crate::layout::create_private_dir(parent).map_err(io("create the directory of"))?;
    // No window in which another user can connect: the socket is bound inside a fresh 0700
    // directory, made 0600 there, and only then renamed into place.
    let private = tempfile::Builder::new()
        .prefix(".hooks-sock-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)
        .map_err(io("create a private directory next to"))?;
    let staged = private.path().join("s");
    let listener = tokio::net::UnixListener::bind(&staged).map_err(io("bind"))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .map_err(io("set mode 0600 on"))?;
    std::fs::rename(&staged, path).map_err(io("move the bound socket to"))?;
    Ok(listener)
}

/// Whether the service answering on `stream` says it is shutting down (`GET /readyz`, 503
/// `shutting_down`), within a second.
fn shutting_down(stream: &std::os::unix::net::UnixStream) -> bool {
    use std::io::{Read, Write};
    let limit = Some(Duration::from_secs(1));
    if stream.set_read_timeout(limit).is_err() || stream.set_write_timeout(limit).is_err() {
        return false;
    }
    let mut s = stream;
    if s.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.take(4096).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.starts_with("HTTP/1.") && text.contains(" 503 ") && text.contains("\"shutting_down\"")
}

/// The identity (device, inode) of the file at `path`, to tell later whether it is still the
/// socket this service bound (another may have taken the path over).
pub fn file_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    crate::caller::peer_pid(stream.as_raw_fd())
}
