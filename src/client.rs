//! The CLI's HTTP/1.1 client (`emit`, `list --live`): one request per connection over the Unix
//! socket or TCP, on `hyper`'s connection-level client (`hyper-util` adapts the tokio socket), so
//! no HTTP is parsed here and no second HTTP stack is built in. Over TCP with a token, the
//! service first proves that it holds the token (`POST /v1/proof`, `crate::proof`) on the same
//! connection; the token goes out only after that.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header;
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};

/// Largest answer read.
const MAX_RESPONSE: usize = 64 * 1024 * 1024;

/// Where the service listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A Unix socket path.
    Unix(PathBuf),
    /// `host:port` over TCP.
    Tcp(String),
}

impl Address {
    /// Parses `http://host:port`, `unix:/path` or a plain socket path.
    pub fn parse(text: &str) -> Self {
        if let Some(rest) = text.strip_prefix("http://") {
            return Address::Tcp(rest.trim_end_matches('/').to_string());
        }
        Address::Unix(PathBuf::from(text.strip_prefix("unix:").unwrap_or(text)))
    }
}

impl Address {
    /// What to check when nothing answers here. A service started with `--listen` has no
    /// socket: the CLI then looks for one in vain unless told the TCP address (issue 50).
    fn unreachable_hint(&self) -> &'static str {
        match self {
            Address::Unix(_) => {
                "is `hermes-hooks serve` running? A service started with `--listen HOST:PORT` \
                 has no socket: reach it with `--listen HOST:PORT` or \
                 HERMES_HOOKS_ADDRESS=http://HOST:PORT"
            }
            Address::Tcp(_) => {
                "is `hermes-hooks serve --listen` running on that address? A service without \
                 `--listen` is on its Unix socket: `--socket PATH`, or unset HERMES_HOOKS_ADDRESS"
            }
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "{}", p.display()),
            Address::Tcp(a) => write!(f, "http://{a}"),
        }
    }
}

/// A request that got no HTTP answer.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Could not connect.
    #[error("cannot reach hermes-hooks at {address}: {source} ({hint})")]
    Connect {
        /// The address tried.
        address: String,
        /// Why.
        source: std::io::Error,
        /// What to check, for the kind of address tried.
        hint: &'static str,
    },
    /// The connection broke or timed out, or the request could not be built.
    #[error("talking to hermes-hooks at {address}: {reason}")]
    Io {
        /// The address.
        address: String,
        /// What happened.
        reason: String,
    },
}

/// Sends one request; returns the status and body.
pub async fn request(
    address: &Address,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), ClientError> {
    let shown = address.to_string();
    let io = |reason: String| ClientError::Io {
        address: shown.clone(),
        reason,
    };
    let connect_err = |source| ClientError::Connect {
        address: shown.clone(),
        source,
        hint: address.unreachable_hint(),
    };
    let fut = async {
        match address {
            Address::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                exchange(s, method, path, token, body, None)
                    .await
                    .map_err(io)
            }
            Address::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a)
                    .await
                    .map_err(connect_err)?;
                exchange(s, method, path, token, body, Some(a))
                    .await
                    .map_err(io)
            }
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| io(format!("no answer within {timeout:?}")))?
}

/// Aborts the task driving the connection when the exchange ends or is cancelled (timeout).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn exchange<S>(
    stream: S,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
    tcp: Option<&str>,
) -> Result<(u16, Vec<u8>), String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let body = Bytes::copy_from_slice(body.unwrap_or_default());
    // Over TCP the service refuses a Host that is not an address or a loopback name while it
    // has no token (crate::request_guard): the address as given is what a browser would send.
    let host = tcp.unwrap_or("localhost");
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, host)
        .header(header::CONNECTION, "close");
    // Every POST says JSON, also with no body: the service refuses one that does not.
    if !body.is_empty() || method == "POST" {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("cannot build the request: {e}"))?;

    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    // The connection is driven by its own task; errors surface through `send_request` and the
    // body, so the task's own result carries nothing more.
    let _conn = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    if let Some(t) = token.filter(|_| tcp.is_some()) {
        prove(&mut sender, host, t).await?;
    }
    let answer = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let bytes = Limited::new(answer.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    Ok((status, bytes.to_vec()))
}

/// 32 bytes from the kernel's random source, for the proof's nonce.
fn fresh_nonce() -> Result<[u8; 32], String> {
    use std::io::Read;
    let mut nonce = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut nonce))
        .map_err(|e| format!("cannot read /dev/urandom for the proof's nonce: {e}"))?;
    Ok(nonce)
}

/// Asks the service on this connection to prove that it holds `token` (`POST /v1/proof`);
/// an error unless the answer is [`crate::proof::answer`] for a fresh nonce.
async fn prove(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: &str,
    token: &str,
) -> Result<(), String> {
    use subtle::ConstantTimeEq;
    let nonce = fresh_nonce()?;
    let body = serde_json::json!({ "nonce": hex::encode(nonce) }).to_string();
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/v1/proof")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("cannot build the proof request: {e}"))?;
    let answer = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = answer.status().as_u16();
    let bytes = Limited::new(answer.into_body(), 64 * 1024)
        .collect()
        .await
        .map_err(|e| format!("reading the proof: {e}"))?
        .to_bytes();
    let got = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["proof"].as_str().map(str::to_string))
        .unwrap_or_default();
    let want = crate::proof::answer(token, &nonce);
    if status == 200 && bool::from(got.as_bytes().ct_eq(want.as_bytes())) {
        return sender.ready().await.map_err(|e| e.to_string());
    }
    let why = if status == 200 {
        "a wrong proof".to_string()
    } else {
        format!("status {status} to POST /v1/proof")
    };
    Err(format!(
        "the process on the port did not prove that it is the hermes-hooks service holding this \
         token ({why}): the token was not sent"
    ))
}
