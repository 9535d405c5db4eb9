//! A real EVM node for tests and the chain demo: anvil (Foundry 1.7.1,
//! from npm `@foundry-rs/anvil-linux-amd64`, installed by `contracts/build.sh`) on a free
//! loopback port with chain id 36900, and [`Deployment`]: the contracts deployed from the
//! committed artefacts, the pool funded, the orchestrator's account staked, and node
//! operators staked and bound.
//!
//! The anvil binary: `HANZOD_ANVIL`, else `contracts/node_modules/.../bin/anvil`, else
//! `anvil` on `PATH`. Without one, tests skip saying why, unless `CI` is set (then they
//! fail).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::process::{
    found_once, on_free_ports, on_path, LaunchError, RequiredUnderCi, ServerProcess,
};

/// The command that installs anvil (and forge) from npm.
pub const INSTALL_HINT: &str = "contracts/build.sh (or: cd contracts && npm ci)";

/// How long anvil may take to answer after it starts.
const START_DEADLINE: Duration = Duration::from_secs(20);

pub use hanzod_adapters::chain::deploy::{
    deployer, operator_of, read_provider, stake_and_bind_with, wallet_provider, DeployError,
    DeployOptions, Deployment, CHAIN_ID, DEPLOYER_KEY,
};

/// Why anvil, its proxy or a deployment on it could not be had. Cheap to clone (what
/// [`find`] found is cached).
#[derive(Debug, Clone, thiserror::Error)]
pub enum AnvilError {
    /// No anvil binary.
    #[error(
        "no anvil: not in contracts/node_modules nor on PATH (install with `{}`, or set \
         HANZOD_ANVIL)",
        INSTALL_HINT
    )]
    NotFound,
    /// The node's temporary directory could not be created.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The process did not start or answer.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The proxy's HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[source] hanzod_adapters::tls::TlsError),
    /// The proxy could not listen.
    #[error("{doing}: {source}")]
    Proxy {
        /// `cannot bind the proxy` or `proxy address`.
        doing: &'static str,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A deployment or setup transaction failed.
    #[error(transparent)]
    Deploy(#[from] DeployError),
    /// An account's key could not be read.
    #[error(transparent)]
    Key(Arc<hanzod_protocol::identity::KeyError>),
}

fn discover() -> Result<PathBuf, AnvilError> {
    if let Some(p) = std::env::var_os("HANZOD_ANVIL").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let npm = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contracts/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil");
    if npm.is_file() {
        return Ok(npm);
    }
    on_path("anvil").ok_or(AnvilError::NotFound)
}

/// The anvil binary the tests use (looked up once per process; the first call prints it).
pub fn find() -> Result<PathBuf, AnvilError> {
    static FOUND: OnceLock<Result<String, AnvilError>> = OnceLock::new();
    found_once(&FOUND, "test EVM node", || {
        discover().map(|p| p.display().to_string())
    })
    .map(PathBuf::from)
}

/// Whether a test may skip for want of anvil: `Ok(None)` to run, `Ok(Some(why))` to skip
/// (only when `CI` is unset), `Err` to fail.
pub fn skip_reason() -> Result<Option<String>, RequiredUnderCi<AnvilError>> {
    crate::process::skip_reason(find())
}

/// For a test about to start anvil: `true` (after printing `SKIPPED: why`) when there is
/// none and `CI` is unset; `false` to run.
///
/// # Panics
/// When there is no anvil and `CI` is set: under CI a missing node is a failure.
pub fn skip_test() -> bool {
    match skip_reason() {
        Ok(None) => false,
        Ok(Some(why)) => {
            eprintln!("SKIPPED: {why}");
            true
        }
        Err(e) => panic!("{e}"),
    }
}

/// `eth_chainId` over a plain socket: the chain id when the node answers.
fn chain_id(port: u16) -> Option<u64> {
    use std::io::{Read, Write};
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
    s.write_all(
        format!(
            "POST / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .ok()?;
    let mut reply = Vec::new();
    s.take(64 << 10).read_to_end(&mut reply).ok()?;
    let text = String::from_utf8_lossy(&reply);
    let json: serde_json::Value = serde_json::from_str(text.split("\r\n\r\n").nth(1)?).ok()?;
    u64::from_str_radix(json.get("result")?.as_str()?.trim_start_matches("0x"), 16).ok()
}

/// An anvil node on `127.0.0.1` with chain id [`CHAIN_ID`], mining each transaction at
/// once. Killed (SIGKILL) and its directory removed when dropped.
#[derive(Debug)]
pub struct AnvilNode {
    process: Option<ServerProcess>,
    port: u16,
    dir: PathBuf,
}

impl AnvilNode {
    /// Starts anvil ([`find`]) on a free loopback port and waits until it answers
    /// `eth_chainId` with [`CHAIN_ID`].
    ///
    /// Errors: no anvil, or it exits or does not answer in time (quoting its log).
    pub async fn start() -> Result<AnvilNode, AnvilError> {
        let anvil = find()?;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hanzod-anvil-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| AnvilError::CreateDir {
            dir: dir.clone(),
            source: Arc::new(e),
        })?;
        let mut node = AnvilNode {
            process: None,
            port: 0,
            dir,
        };
        let log = node.dir.join("anvil.log");
        let (anvil, log) = (&anvil, log.as_path());
        let (port, process) = on_free_ports(3, |port, _| async move {
            let mut cmd = Command::new(anvil);
            cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--chain-id", &CHAIN_ID.to_string()])
                .args(["--accounts", "2", "--balance", "1000000"])
                .arg("--no-request-size-limit")
                .stdin(std::process::Stdio::null());
            let process = ServerProcess::spawn(&mut cmd, log, &anvil.display())?;
            let (process, _) = process
                .wait_ready(
                    START_DEADLINE,
                    Duration::from_millis(50),
                    "eth_chainId",
                    || async move { chain_id(port).filter(|&id| id == CHAIN_ID) },
                )
                .await
                .map_err(|e| e.on("anvil", port))?;
            Ok::<_, LaunchError>((port, process))
        })
        .await?;
        node.port = port;
        node.process = Some(process);
        Ok(node)
    }

    /// `http://127.0.0.1:<port>`: the `HANZO_RPC` of this node.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the process (SIGKILL). Does nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}

impl Drop for AnvilNode {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What an [`RpcProxy`] does with the requests it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards every request and its answer.
    Forward,
    /// Answers every request 503 without forwarding it: the endpoint is down.
    Down,
    /// Forwards every request, but loses the answer to each `eth_sendRawTransaction`
    /// (answers 502): the transaction is sent and mined, the sender never hears of it.
    LoseSendAnswers,
}

#[derive(Debug)]
struct ProxyState {
    upstream: String,
    http: reqwest::Client,
    mode: std::sync::Mutex<ProxyMode>,
    lost: AtomicU64,
    sends: AtomicU64,
    refused: AtomicU64,
}

/// A JSON-RPC endpoint in front of a node, on a free loopback port, whose failures a test
/// switches ([`ProxyMode`]): the RPC endpoint killed, or answers lost. Stops when dropped.
#[derive(Debug)]
pub struct RpcProxy {
    state: std::sync::Arc<ProxyState>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl RpcProxy {
    /// Starts a proxy to `upstream` (a JSON-RPC URL) in [`ProxyMode::Forward`].
    ///
    /// Errors: no loopback port can be bound.
    pub async fn start(upstream: &str) -> Result<RpcProxy, AnvilError> {
        use axum::body::Bytes;
        use axum::extract::State;
        use axum::http::StatusCode;
        use axum::response::{IntoResponse, Response};
        async fn forward(State(s): State<std::sync::Arc<ProxyState>>, body: Bytes) -> Response {
            let mode = *s.mode.lock().unwrap_or_else(|p| p.into_inner());
            if mode == ProxyMode::Down {
                s.refused.fetch_add(1, Ordering::Relaxed);
                return (StatusCode::SERVICE_UNAVAILABLE, "endpoint down").into_response();
            }
            let is_send =
                std::str::from_utf8(&body).is_ok_and(|b| b.contains("eth_sendRawTransaction"));
            if is_send {
                s.sends.fetch_add(1, Ordering::Relaxed);
            }
            let answer = s
                .http
                .post(&s.upstream)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let answer = match answer {
                Ok(a) => a,
                Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            };
            let status = answer.status().as_u16();
            let bytes = answer.bytes().await.unwrap_or_default();
            if is_send && mode == ProxyMode::LoseSendAnswers {
                s.lost.fetch_add(1, Ordering::Relaxed);
                return (StatusCode::BAD_GATEWAY, "answer lost").into_response();
            }
            (
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                [("content-type", "application/json")],
                bytes,
            )
                .into_response()
        }
        let state = std::sync::Arc::new(ProxyState {
            upstream: upstream.to_string(),
            // reqwest's own default client has no TLS provider in this build.
            http: hanzod_adapters::tls::client_builder(
                false,
                None,
                hanzod_adapters::tls::Alpn::Http1,
            )
            .and_then(|b| {
                b.build()
                    .map_err(|e| hanzod_adapters::tls::TlsError(e.to_string()))
            })
            .map_err(AnvilError::Http)?,
            mode: std::sync::Mutex::new(ProxyMode::Forward),
            lost: AtomicU64::new(0),
            sends: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| AnvilError::Proxy {
                doing: "cannot bind the proxy",
                source: Arc::new(e),
            })?;
        let addr = listener.local_addr().map_err(|e| AnvilError::Proxy {
            doing: "proxy address",
            source: Arc::new(e),
        })?;
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(RpcProxy { state, addr, task })
    }

    /// The proxy's URL: give it as `HANZO_RPC`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches what the proxy does from now on.
    pub fn set_mode(&self, mode: ProxyMode) {
        *self.state.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    /// How many `eth_sendRawTransaction` answers were lost.
    pub fn lost_answers(&self) -> u64 {
        self.state.lost.load(Ordering::Relaxed)
    }

    /// How many requests were refused while the proxy was [`ProxyMode::Down`].
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// How many `eth_sendRawTransaction` requests were forwarded.
    pub fn sends(&self) -> u64 {
        self.state.sends.load(Ordering::Relaxed)
    }
}

impl Drop for RpcProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
