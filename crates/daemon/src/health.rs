//! What a replica is doing and whether its state store answers (DESIGN §9, §10): served on
//! the metrics listener as `GET /healthz` and `GET /readyz`, exported as gauges, and read
//! by `hanzod health` for container health checks.
//!
//! * `/healthz`: 200 while the process runs (liveness), with a JSON report: the role, the
//!   lease token, the state store's reachability and error counts.
//! * `/readyz`: 200 only when this replica serves nodes (the leader, or a single daemon)
//!   and its state store answers; 503 with the reason otherwise. A Kubernetes Service whose
//!   pods have this readiness probe routes node traffic to the leader only.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;

/// What a replica does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The only orchestrator (the in-memory store: no election).
    Single,
    /// Waiting for the lease; not serving nodes.
    Standby,
    /// Holds the lease and serves nodes.
    Leader,
    /// Lost the lease, or shutting down: no longer serving.
    Stopping,
}

impl Role {
    fn code(self) -> u8 {
        match self {
            Role::Single => 0,
            Role::Standby => 1,
            Role::Leader => 2,
            Role::Stopping => 3,
        }
    }

    fn from_code(c: u8) -> Role {
        match c {
            0 => Role::Single,
            1 => Role::Standby,
            2 => Role::Leader,
            _ => Role::Stopping,
        }
    }

    /// Whether this role serves nodes.
    pub fn serves(self) -> bool {
        matches!(self, Role::Single | Role::Leader)
    }

    /// Its name, as `/healthz` spells it (`standby`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Single => "single",
            Role::Standby => "standby",
            Role::Leader => "leader",
            Role::Stopping => "stopping",
        }
    }
}

pub use hanzod_actors::ports::StoreHealth;

/// Why a replica is not ready (`/readyz` answers 503 with this).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The remote state store does not answer (a replica that stepped down because of it
    /// says so first).
    #[error("state store unreachable: {}", last_error.as_deref().unwrap_or("no answer"))]
    StoreUnreachable {
        /// The store client's last error, as the store's client reported it.
        last_error: Option<String>,
    },
    /// This replica does not serve nodes in its role (a standby, or one stopping).
    #[error("{} replica: not serving nodes", role.name())]
    NotServing {
        /// Its role.
        role: Role,
    },
}

/// Why `hanzod health` got no healthy answer ([`probe`]).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The metrics listener could not be reached.
    #[error("connect {addr}: {source}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The request could not be sent.
    #[error("send: {0}")]
    Send(#[source] std::io::Error),
    /// The answer could not be read.
    #[error("read: {0}")]
    Read(#[source] std::io::Error),
    /// What came back is not an HTTP answer.
    #[error("not an HTTP answer from {addr}")]
    NotHttp {
        /// The address dialled.
        addr: String,
    },
    /// The endpoint answered with another status than 200.
    #[error("{path}: HTTP {status}: {body}")]
    Status {
        /// `/healthz` or `/readyz`.
        path: &'static str,
        /// The HTTP status.
        status: u16,
        /// The body (the reason the replica gives), trimmed.
        body: String,
    },
    /// No answer within the timeout.
    #[error("{path}: no answer from {addr} within {timeout_ms} ms")]
    Timeout {
        /// `/healthz` or `/readyz`.
        path: &'static str,
        /// The address dialled.
        addr: String,
        /// The timeout.
        timeout_ms: u64,
    },
}

type StoreProbe = Arc<dyn Fn() -> StoreHealth + Send + Sync>;

/// The replica's health, shared by the election loop, the daemon and the exporter.
#[derive(Clone)]
pub struct Health(Arc<Inner>);

struct Inner {
    role: AtomicU8,
    token: AtomicU64,
    store: RwLock<Option<StoreProbe>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("role", &self.role())
            .field("token", &self.token())
            .finish_non_exhaustive()
    }
}

/// The JSON body of `/healthz`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What the replica does.
    pub role: Role,
    /// The fencing token it writes under (0 when it holds no lease).
    pub lease_token: u64,
    /// Whether it serves nodes now (what `/readyz` answers).
    pub ready: bool,
    /// Why it is not ready, when it is not.
    pub reason: Option<String>,
    /// The state store, when it is a remote one.
    pub state_store: Option<StoreHealth>,
}

impl Health {
    /// Health in `role`, with no remote state store.
    pub fn new(role: Role) -> Health {
        Health(Arc::new(Inner {
            role: AtomicU8::new(role.code()),
            token: AtomicU64::new(0),
            store: RwLock::new(None),
        }))
    }

    /// Reads the state store's health through `probe` from now on.
    pub fn watch_store(&self, probe: impl Fn() -> StoreHealth + Send + Sync + 'static) {
        *self.0.store.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(probe));
    }

    /// Sets the role (and the lease token: 0 without a lease).
    pub fn set_role(&self, role: Role, token: u64) {
        self.0.token.store(token, Ordering::SeqCst);
        self.0.role.store(role.code(), Ordering::SeqCst);
    }

    /// The current role.
    pub fn role(&self) -> Role {
        Role::from_code(self.0.role.load(Ordering::SeqCst))
    }

    /// The lease token (0 without a lease).
    pub fn token(&self) -> u64 {
        self.0.token.load(Ordering::SeqCst)
    }

    /// The state store's health, when a remote store is watched.
    pub fn store(&self) -> Option<StoreHealth> {
        let probe = self
            .0
            .store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        probe.map(|p| p())
    }

    /// `Ok` when this replica serves nodes and its store answers; else why not.
    pub fn ready(&self) -> Result<(), NotReady> {
        // The store first: a replica that stepped down because of it says so.
        if let Some(s) = self.store().filter(|s| !s.reachable) {
            return Err(NotReady::StoreUnreachable {
                last_error: s.last_error,
            });
        }
        let role = self.role();
        if !role.serves() {
            return Err(NotReady::NotServing { role });
        }
        Ok(())
    }

    /// The `/healthz` body.
    pub fn report(&self) -> Report {
        let ready = self.ready();
        Report {
            role: self.role(),
            lease_token: self.token(),
            ready: ready.is_ok(),
            reason: ready.err().map(|e| e.to_string()),
            state_store: self.store(),
        }
    }
}

/// `hanzod health`: GETs `/healthz` (or `/readyz` when `ready`) from the metrics listener
/// at `addr` (`host:port`) within `timeout_ms`; `Ok(body)` on HTTP 200, else why not
/// (connection refused, timeout, any other status). A plain HTTP/1.0 request, so container
/// images need no curl.
pub async fn probe(addr: &str, ready: bool, timeout_ms: u64) -> Result<String, ProbeError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = if ready { "/readyz" } else { "/healthz" };
    let run = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| ProbeError::Connect {
                addr: addr.to_string(),
                source,
            })?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .map_err(ProbeError::Send)?;
        let mut buf = Vec::new();
        s.take(1 << 20)
            .read_to_end(&mut buf)
            .await
            .map_err(ProbeError::Read)?;
        let text = String::from_utf8_lossy(&buf);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| ProbeError::NotHttp {
                addr: addr.to_string(),
            })?;
        if status == 200 {
            Ok(body.to_string())
        } else {
            Err(ProbeError::Status {
                path,
                status,
                body: body.trim().to_string(),
            })
        }
    };
    tokio::time::timeout(std::time::Duration::from_millis(timeout_ms), run)
        .await
        .map_err(|_| ProbeError::Timeout {
            path,
            addr: addr.to_string(),
            timeout_ms,
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_role_and_store() {
        let h = Health::new(Role::Standby);
        assert_eq!(
            h.ready().unwrap_err().to_string(),
            "standby replica: not serving nodes"
        );
        h.set_role(Role::Leader, 7);
        assert_eq!(h.ready(), Ok(()));
        assert_eq!(h.report().lease_token, 7);
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let u = up.clone();
        h.watch_store(move || StoreHealth {
            reachable: u.load(Ordering::SeqCst),
            errors_total: 3,
            retries_total: 5,
            last_error: Some("connection refused".into()),
        });
        assert_eq!(
            h.ready().unwrap_err().to_string(),
            "state store unreachable: connection refused"
        );
        assert!(!h.report().ready);
        up.store(true, Ordering::SeqCst);
        assert_eq!(h.ready(), Ok(()));
        h.set_role(Role::Stopping, 7);
        assert!(h.ready().is_err());
    }
}
