//! Fleet mode on NATS JetStream: the settings every fleet role shares, the broker
//! connection, and the names of streams and subjects.
//!
//! - [`envelope`]: the wire format of an event (event id, gateway id, name, context).
//! - [`edge`]: the sink `serve --fleet` installs: a bounded buffer, pipelined publishing,
//!   degraded state and drop counts.
//! - [`worker`]: `worker --fleet`: one durable pull consumer per hook, ack after the handler,
//!   retries with backoff, dead letters on the last delivery.
//! - [`collect`]: request/reply collect across the workers serving each hook.
//! - [`status`]: the workers' status messages and the edge's view of the fleet.
//! - [`dead`]: `dead list|replay`.
//!
//! Subjects (with the default prefix `hermes`): events `hermes.ev.e.<event>`, targeted replays
//! `hermes.ev.r.<hook>` (stream `HERMES_EVENTS`), dead letters `hermes.dead.<hook>` (stream
//! `HERMES_DEAD`), collect requests `hermes.collect.<hook>`, worker status `hermes.status.<id>`.

pub mod collect;
pub mod dead;
pub mod edge;
pub mod envelope;
pub mod status;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream;

/// Settings shared by the edge, the workers and the `dead` command.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Broker URL(s), comma-separated: `nats://host:4222`.
    pub url: String,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Token.
    pub token: Option<String>,
    /// Extra root certificates (PEM) for TLS.
    pub tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub tls_cert: Option<(PathBuf, PathBuf)>,
    /// Require TLS.
    pub require_tls: bool,
    /// Subject prefix; streams are named after it (`HERMES_EVENTS`, `HERMES_DEAD`).
    pub prefix: String,
    /// Stream limits, used when the stream is created.
    pub stream: StreamLimits,
}

/// Limits of the event stream (applied when it is created).
#[derive(Debug, Clone)]
pub struct StreamLimits {
    /// Oldest message kept.
    pub max_age: Duration,
    /// Most bytes kept (-1: no limit).
    pub max_bytes: i64,
    /// Window in which a repeated event id is recognised as a duplicate.
    pub duplicate_window: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: 1 << 30,
            duplicate_window: Duration::from_secs(120),
        }
    }
}

/// What can go wrong in fleet mode.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The connection options are unusable (a credentials file that cannot be read, ...).
    #[error("fleet: {0}")]
    Config(String),
    /// The broker refused or failed a request.
    #[error("fleet broker {url}: {what}: {why}")]
    Broker {
        /// The broker URL.
        url: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        why: String,
    },
}

impl FleetConfig {
    /// Default settings for a broker URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            user: None,
            password: None,
            token: None,
            tls_ca: None,
            tls_cert: None,
            require_tls: false,
            prefix: "hermes".into(),
            stream: StreamLimits::default(),
        }
    }

    /// Name of the event stream.
    pub fn events_stream(&self) -> String {
        format!("{}_EVENTS", token(&self.prefix).to_uppercase())
    }

    /// Name of the dead-letter stream.
    pub fn dead_stream(&self) -> String {
        format!("{}_DEAD", token(&self.prefix).to_uppercase())
    }

    /// Every subject of the event stream (the filter of each hook's consumer).
    pub fn events_filter(&self) -> String {
        format!("{}.ev.>", self.prefix)
    }

    /// The subject an event is published on.
    pub fn event_subject(&self, event: &str) -> String {
        format!("{}.ev.e.{}", self.prefix, token(event))
    }

    /// The subject a replay for one hook is published on.
    pub fn replay_subject(&self, hook: &str) -> String {
        format!("{}.ev.r.{}", self.prefix, token(hook))
    }

    /// The subject of a hook's dead letters.
    pub fn dead_subject(&self, hook: &str) -> String {
        format!("{}.dead.{}", self.prefix, token(hook))
    }

    /// The subject collect requests for a hook go to.
    pub fn collect_subject(&self, hook: &str) -> String {
        format!("{}.collect.{}", self.prefix, token(hook))
    }

    /// The subject a worker's status goes to.
    pub fn status_subject(&self, worker: &str) -> String {
        format!("{}.status.{}", self.prefix, token(worker))
    }

    /// The subjects of every worker's status.
    pub fn status_filter(&self) -> String {
        format!("{}.status.>", self.prefix)
    }

    fn broker_err(&self, what: &'static str, why: impl std::fmt::Display) -> FleetError {
        FleetError::Broker {
            url: self.url.clone(),
            what,
            why: why.to_string(),
        }
    }

    /// Connects to the broker. When `wait` is false the client keeps trying in the background
    /// (the edge starts while the broker is down); otherwise a failure is an error.
    pub async fn connect(&self, name: &str, wait: bool) -> Result<async_nats::Client, FleetError> {
        let mut opts = async_nats::ConnectOptions::new();
        if let (Some(u), Some(p)) = (&self.user, &self.password) {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        if let Some(t) = &self.token {
            opts = opts.token(t.clone());
        }
        if let Some(ca) = &self.tls_ca {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls_cert {
            opts = opts.add_client_certificate(cert.clone(), key.clone());
        }
        if self.require_tls {
            opts = opts.require_tls(true);
        }
        // Reconnect quickly (the broker restarting is the common case), at most once a second.
        opts = opts
            .name(name)
            .connection_timeout(Duration::from_secs(2))
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((50 * attempts as u64).min(1000))
            })
            .max_reconnects(None);
        if !wait {
            opts = opts.retry_on_initial_connect();
        }
        let addrs: Vec<&str> = self.url.split(',').map(str::trim).collect();
        let addrs: Vec<async_nats::ServerAddr> = addrs
            .iter()
            .map(|a| {
                a.parse()
                    .map_err(|e| FleetError::Config(format!("bad broker URL {a:?}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        opts.connect(addrs)
            .await
            .map_err(|e| self.broker_err("connect", e))
    }

    /// The JetStream context over `client`.
    pub fn jetstream(&self, client: async_nats::Client) -> jetstream::Context {
        jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .ack_timeout(Duration::from_secs(3))
            .max_ack_inflight(4096)
            .backpressure_on_inflight(true)
            .build(client)
    }

    /// The event stream, created when missing (file storage, Limits retention: every hook has
    /// its own consumer over all subjects, which WorkQueue retention refuses).
    pub async fn events(
        &self,
        js: &jetstream::Context,
    ) -> Result<jetstream::stream::Stream, FleetError> {
        let config = jetstream::stream::Config {
            name: self.events_stream(),
            subjects: vec![self.events_filter()],
            storage: jetstream::stream::StorageType::File,
            retention: jetstream::stream::RetentionPolicy::Limits,
            max_age: self.stream.max_age,
            max_bytes: self.stream.max_bytes,
            duplicate_window: self.stream.duplicate_window,
            ..Default::default()
        };
        js.get_or_create_stream(config)
            .await
            .map_err(|e| self.broker_err("get or create the event stream", e))
    }

    /// The dead-letter stream, created when missing.
    pub async fn dead(
        &self,
        js: &jetstream::Context,
    ) -> Result<jetstream::stream::Stream, FleetError> {
        let config = jetstream::stream::Config {
            name: self.dead_stream(),
            subjects: vec![format!("{}.dead.>", self.prefix)],
            storage: jetstream::stream::StorageType::File,
            retention: jetstream::stream::RetentionPolicy::Limits,
            max_age: self.stream.max_age,
            duplicate_window: self.stream.duplicate_window,
            ..Default::default()
        };
        js.get_or_create_stream(config)
            .await
            .map_err(|e| self.broker_err("get or create the dead-letter stream", e))
    }
}

/// `text` as one subject token: `.`, `*`, `>` and whitespace become `_`.
pub fn token(text: &str) -> String {
    let t: String = text
        .chars()
        .map(|c| {
            if c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if t.is_empty() { "_".into() } else { t }
}

/// A durable consumer name for a hook: letters, digits, `-` and `_` only; a short hash keeps
/// names that differ only in other characters apart.
pub fn consumer_name(hook: &str) -> String {
    let clean: String = hook
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == hook {
        format!("hook_{clean}")
    } else {
        // FNV-1a: stable across builds and machines.
        let mut h: u32 = 0x811c_9dc5;
        for b in hook.bytes() {
            h ^= b as u32;
            h = h.wrapping_mul(0x0100_0193);
        }
        format!("hook_{clean}_{h:08x}")
    }
}

/// This machine's host name (the default gateway and worker id).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_subject_tokens() {
        assert_eq!(token("command:reset"), "command:reset");
        assert_eq!(token("a.b*c>d e"), "a_b_c_d_e");
        assert_eq!(consumer_name("logger-1"), "hook_logger-1");
        let odd = consumer_name("my.hook");
        assert!(odd.starts_with("hook_my_hook_"), "{odd}");
        assert_ne!(odd, consumer_name("my:hook"));
    }
}
