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
//! Subjects (with the default prefix `hermes`): events `hermes.ev.e.<ns>.<rest>` (and replays,
//! whose envelope names their hook; stream `HERMES_EVENTS`), dead letters `hermes.dead.<hook>` (stream
//! `HERMES_DEAD`), collect requests `hermes.collect.<hook>` (cancels `hermes.cancel.<hook>`), worker status `hermes.status.<id>`.

pub mod attempts;
pub mod collect;
pub mod dead;
pub mod discards;
pub mod edge;
pub mod envelope;
pub mod held;
pub mod identity;
pub mod lease;
pub mod repeats;
pub mod replayed;
pub mod retry;
pub mod status;
pub mod version_log;
pub mod versions;
pub mod worker;

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream;

/// Settings shared by the edge, the workers and the `dead` command.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Broker URL(s), comma-separated: `nats://host:4222`, without credentials (a
    /// `nats://user:password@host` given to [`FleetConfig::new`] moves into `user`/`password`,
    /// so this is safe to log and show).
    pub url: String,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Token.
    pub token: Option<String>,
    /// A `.creds` file (user JWT and nkey seed, as `nsc` writes it): decentralised auth.
    pub creds: Option<PathBuf>,
    /// An nkey seed (`SU...`): the server's `nkey:` users.
    pub nkey_seed: Option<String>,
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
    /// Replicas of the streams and the lease bucket, when created (1; 3 or 5 in a cluster).
    pub replicas: usize,
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
    /// Default settings for a broker URL. Credentials in the URL (`nats://user:password@host`,
    /// or `nats://token@host`) are taken out of it and used for the login.
    pub fn new(url: impl Into<String>) -> Self {
        let (url, creds) = split_credentials(&url.into());
        let (mut user, mut password, mut token) = (None, None, None);
        match creds {
            Some((u, Some(p))) => (user, password) = (Some(u), Some(p)),
            Some((t, None)) => token = Some(t),
            None => {}
        }
        Self {
            url,
            user,
            password,
            token,
            creds: None,
            nkey_seed: None,
            tls_ca: None,
            tls_cert: None,
            require_tls: false,
            prefix: "hermes".into(),
            stream: StreamLimits::default(),
            replicas: 1,
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

    /// Name of the key-value bucket of the ordered hooks' leases.
    pub fn lease_bucket(&self) -> String {
        format!("{}_LEASES", token(&self.prefix).to_uppercase())
    }

    /// The key-value bucket of what ordered hooks' holders may have started on an event's last
    /// allowed delivery ([`attempts`]).
    pub fn attempts_bucket(&self) -> String {
        format!("{}_ATTEMPTS", token(&self.prefix).to_uppercase())
    }

    /// The key-value bucket of the version of each hook each worker runs
    /// ([`version_log`]).
    pub fn versions_bucket(&self) -> String {
        format!("{}_VERSIONS", token(&self.prefix).to_uppercase())
    }

    /// Every subject of the event stream (the filter of each hook's consumer).
    pub fn events_filter(&self) -> String {
        format!("{}.ev.>", self.prefix)
    }

    /// The subject an event is published on: `<prefix>.ev.e.<ns>.<rest>` for `ns:rest` (split
    /// at the first `:`), `<prefix>.ev.e.<name>` for a name without `:`, each part one token;
    /// so the broker can route an event to the consumers of the hooks it matches. A replay
    /// goes to the same subject (its envelope names the one hook it is for).
    pub fn event_subject(&self, event: &str) -> String {
        match event.split_once(':') {
            Some((ns, rest)) => format!("{}.ev.e.{}.{}", self.prefix, token(ns), token(rest)),
            None => format!("{}.ev.e.{}", self.prefix, token(event)),
        }
    }

    /// The filter subject of a hook's consumer: the subject of its one pattern when that is an
    /// exact name or `ns:*` (the broker then delivers only what it matches); every event
    /// otherwise (several patterns: nats-server 2.9 takes one filter per consumer; other
    /// globs), the worker skipping what its patterns do not match.
    pub fn hook_filter(&self, patterns: &[String]) -> String {
        let [p] = patterns else {
            return self.events_filter();
        };
        let glob = |t: &str| t.contains(['*', '?', '[', ']', '{', '}']);
        if let Some(ns) = p.strip_suffix(":*")
            && !ns.contains(':')
            && !glob(ns)
        {
            return format!("{}.ev.e.{}.*", self.prefix, token(ns));
        }
        if glob(p) {
            return self.events_filter();
        }
        self.event_subject(p)
    }

    /// The subject of a hook's dead letters.
    pub fn dead_subject(&self, hook: &str) -> String {
        format!("{}.dead.{}", self.prefix, token(hook))
    }

    /// The subject collect requests for a hook go to.
    pub fn collect_subject(&self, hook: &str) -> String {
        format!("{}.collect.{}", self.prefix, token(hook))
    }

    /// The subject on which the edge cancels a collect request for a hook it gave up on.
    pub fn cancel_subject(&self, hook: &str) -> String {
        format!("{}.cancel.{}", self.prefix, token(hook))
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
        self.connect_watched(name, wait, None).await
    }

    /// [`FleetConfig::connect`], and each time the connection is lost, `lost` is set to that
    /// moment (monotonic ns, [`crate::start_gate::monotonic_ns`]): what the broker delivered
    /// before may not be its to finish any more (a restarted broker rolls back what it had not
    /// written, and delivers it again as new).
    pub async fn connect_watched(
        &self,
        name: &str,
        wait: bool,
        lost: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    ) -> Result<async_nats::Client, FleetError> {
        let mut opts = async_nats::ConnectOptions::new();
        if let Some(lost) = lost {
            opts = opts.event_callback(move |event| {
                let lost = lost.clone();
                async move {
                    if matches!(event, async_nats::Event::Disconnected) {
                        lost.store(
                            crate::start_gate::monotonic_ns(),
                            std::sync::atomic::Ordering::SeqCst,
                        );
                    }
                }
            });
        }
        if let (Some(u), Some(p)) = (&self.user, &self.password) {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        if let Some(t) = &self.token {
            opts = opts.token(t.clone());
        }
        if let Some(seed) = &self.nkey_seed {
            opts = opts.nkey(seed.clone());
        }
        if let Some(path) = &self.creds {
            opts = opts.credentials_file(path).await.map_err(|e| {
                FleetError::Config(format!(
                    "cannot use the credentials file {}: {e}",
                    path.display()
                ))
            })?;
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
            num_replicas: self.replicas,
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
            num_replicas: self.replicas,
            ..Default::default()
        };
        js.get_or_create_stream(config)
            .await
            .map_err(|e| self.broker_err("get or create the dead-letter stream", e))
    }
}

/// `text` as one subject token, injectively (two names never share a subject): `_`, `.`, `*`,
/// `>`, whitespace and control characters become `_` and their UTF-8 bytes in hex (`my.hook`
/// is `my_2ehook`, `my_hook` is `my_5fhook`); the empty name is `_`.
pub fn token(text: &str) -> String {
    use std::fmt::Write;
    if text.is_empty() {
        return "_".into();
    }
    let mut t = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '_' || c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control() {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                let _ = write!(t, "_{byte:02x}");
            }
        } else {
            t.push(c);
        }
    }
    t
}

/// Takes `user:password@` (or `token@`) out of each URL of a comma-separated list: returns the
/// URLs without them and the first credentials found (percent-decoded).
pub fn split_credentials(urls: &str) -> (String, Option<(String, Option<String>)>) {
    let mut creds = None;
    let clean: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .map(|u| {
            let (scheme, rest) = match u.split_once("://") {
                Some((s, r)) => (Some(s), r),
                None => (None, u),
            };
            let host_end = rest.find('/').unwrap_or(rest.len());
            let Some(at) = rest[..host_end].rfind('@') else {
                return u.to_string();
            };
            let (userinfo, host) = (&rest[..at], &rest[at + 1..]);
            if creds.is_none() {
                creds = Some(match userinfo.split_once(':') {
                    Some((user, pass)) => (percent_decode(user), Some(percent_decode(pass))),
                    None => (percent_decode(userinfo), None),
                });
            }
            match scheme {
                Some(s) => format!("{s}://{host}"),
                None => host.to_string(),
            }
        })
        .collect();
    (clean.join(","), creds)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

/// Whether NATS subject `subject` matches `filter` (`*` one token, `>` the rest).
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
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
        assert_eq!(token("a.b*c>d e"), "a_2eb_2ac_3ed_20e");
        assert_ne!(token("my.hook"), token("my_hook"), "injective");
        assert_ne!(token("my_2ehook"), token("my.hook"), "injective");
        assert_eq!(token(""), "_");
        assert_eq!(consumer_name("logger-1"), "hook_logger-1");
        let odd = consumer_name("my.hook");
        assert!(odd.starts_with("hook_my_hook_"), "{odd}");
        assert_ne!(odd, consumer_name("my:hook"));
    }

    #[test]
    fn event_subjects_and_hook_filters() {
        let c = FleetConfig::new("nats://h:1");
        assert_eq!(c.event_subject("agent:start"), "hermes.ev.e.agent.start");
        assert_eq!(c.event_subject("a:b:c"), "hermes.ev.e.a.b:c");
        assert_eq!(c.event_subject("boot"), "hermes.ev.e.boot");
        assert_eq!(c.event_subject("x.y:z"), "hermes.ev.e.x_2ey.z");
        let f = |p: &[&str]| c.hook_filter(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(f(&["agent:*"]), "hermes.ev.e.agent.*");
        assert_eq!(f(&["agent:start"]), "hermes.ev.e.agent.start");
        assert_eq!(f(&["boot"]), "hermes.ev.e.boot");
        assert_eq!(f(&["*"]), "hermes.ev.>");
        assert_eq!(f(&["{a,b}:*"]), "hermes.ev.>");
        assert_eq!(f(&["a:b:*"]), "hermes.ev.>");
        assert_eq!(f(&["a:*", "b:*"]), "hermes.ev.>");
    }

    #[test]
    fn credentials_leave_the_url() {
        let c = FleetConfig::new("nats://al%40x:p%3Ass@127.0.0.1:4222, nats://h2:4222");
        assert_eq!(c.url, "nats://127.0.0.1:4222,nats://h2:4222");
        assert_eq!(c.user.as_deref(), Some("al@x"));
        assert_eq!(c.password.as_deref(), Some("p:ss"));
        let t = FleetConfig::new("tls://s3cret@broker:4222");
        assert_eq!(t.url, "tls://broker:4222");
        assert_eq!(t.token.as_deref(), Some("s3cret"));
        assert_eq!(FleetConfig::new("nats://h:1").url, "nats://h:1");
    }
}
