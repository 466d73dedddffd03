//! A minimal HTTP/1.1 client for the CLI's `emit`: one request per connection, over the Unix
//! socket or TCP, so the CLI needs no HTTP client crate.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
    #[error("cannot reach hermes-hooks at {address}: {source} (is `hermes-hooks serve` running?)")]
    Connect {
        /// The address tried.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// The connection broke or timed out.
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
    };
    let fut = async {
        let result = match address {
            Address::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                exchange(s, method, path, token, body).await
            }
            Address::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a)
                    .await
                    .map_err(connect_err)?;
                exchange(s, method, path, token, body).await
            }
        };
        result.map_err(|e| io(e.to_string()))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| io(format!("no answer within {timeout:?}")))?
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&[u8]>,
) -> std::io::Result<(u16, Vec<u8>)> {
    let body = body.unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: hermes-hooks\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    s.flush().await?;
    let mut raw = Vec::new();
    (&mut s)
        .take(MAX_RESPONSE as u64)
        .read_to_end(&mut raw)
        .await?;
    parse(&raw).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP answer")
    })
}

fn parse(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(p) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..p]).ok()?.trim(), 16).ok()?;
            if size == 0 {
                break;
            }
            let chunk = rest.get(p + 2..p + 2 + size)?;
            out.extend_from_slice(chunk);
            rest = rest.get(p + 2 + size + 2..)?;
        }
        body = out;
    }
    Some((status, body))
}
