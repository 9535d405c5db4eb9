//! A real IPFS node for tests and benches: js-ipfs 0.66.1 serving the
//! Kubo HTTP RPC API on a free loopback port, with its repo in a fresh temporary directory
//! (DESIGN §11). [`hanzod_adapters::kubo::KuboObjectStore`] is tested against it.
//!
//! What it needs, found by [`find`]:
//!
//! - `node` (Node.js 20 or later: the version it is tested on; js-ipfs's dependencies use
//!   `AbortSignal.any`) on `PATH`, or the executable named by `HANZOD_NODE`;
//! - the folder `tools/js-ipfs` of this repository (or the one named by `HANZOD_JS_IPFS`)
//!   with its `daemon.mjs` and the npm packages installed: [`INSTALL_HINT`].
//!
//! The node runs offline (no libp2p: no swarm, bootstrap, MDNS or preload); see
//! `tools/js-ipfs/daemon.mjs`. Its stdin is a pipe from this process, so it also exits when
//! this process dies without dropping the [`IpfsNode`].

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::process::{
    found_once, on_free_ports, on_path, LaunchError, RequiredUnderCi, ServerProcess,
};

/// How long [`IpfsNode::start`] waits for `/api/v0/version` to answer (js-ipfs loads ~1,000
/// npm modules first: ~3 s alone on a small machine, more when tests start several at once).
pub const START_DEADLINE: Duration = Duration::from_secs(90);

/// The command that installs the node's npm packages.
pub const INSTALL_HINT: &str =
    "cd tools/js-ipfs && npm ci --omit=optional --ignore-scripts --no-audit --no-fund";

/// Why the test node could not be found or started.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IpfsNodeError {
    /// No Node.js executable.
    #[error(
        "no `node` on PATH (Node.js 20+ runs the js-ipfs test node; set HANZOD_NODE to use \
         another executable)"
    )]
    NoNode,
    /// The Node.js executable does not run.
    #[error("{}: cannot run --version: {source}", node.display())]
    NodeVersion {
        /// The executable.
        node: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Node.js is older than 20 (or `--version` failed).
    #[error("{} --version printed {printed:?}: Node.js 20 or later is needed", node.display())]
    OldNode {
        /// The executable.
        node: PathBuf,
        /// What `--version` printed.
        printed: String,
    },
    /// The js-ipfs folder has no `daemon.mjs`.
    #[error("{} has no daemon.mjs (HANZOD_JS_IPFS names the tools/js-ipfs folder)", dir.display())]
    NoDaemon {
        /// The folder.
        dir: PathBuf,
    },
    /// An npm package is missing.
    #[error("js-ipfs is not installed in {} (no node_modules/{package}): run `{}`", dir.display(), INSTALL_HINT)]
    NotInstalled {
        /// The folder.
        dir: PathBuf,
        /// The missing package.
        package: &'static str,
    },
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
}

/// An installed js-ipfs test node: what [`IpfsNode::start`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsIpfs {
    /// The Node.js executable.
    pub node: PathBuf,
    /// `node --version`, e.g. `v20.20.2`.
    pub node_version: String,
    /// The `tools/js-ipfs` folder: `daemon.mjs` and `node_modules/`.
    pub dir: PathBuf,
}

impl std::fmt::Display for JsIpfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "js-ipfs in {} on node {} ({})",
            self.dir.display(),
            self.node_version,
            self.node.display()
        )
    }
}

fn discover() -> Result<JsIpfs, IpfsNodeError> {
    let node = match std::env::var_os("HANZOD_NODE").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => on_path("node").ok_or(IpfsNodeError::NoNode)?,
    };
    let out =
        Command::new(&node)
            .arg("--version")
            .output()
            .map_err(|e| IpfsNodeError::NodeVersion {
                node: node.clone(),
                source: Arc::new(e),
            })?;
    let node_version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let major: u32 = node_version
        .strip_prefix('v')
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if !out.status.success() || major < 20 {
        return Err(IpfsNodeError::OldNode {
            node,
            printed: node_version,
        });
    }
    let dir = match std::env::var_os("HANZOD_JS_IPFS").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/js-ipfs"),
    };
    if !dir.join("daemon.mjs").is_file() {
        return Err(IpfsNodeError::NoDaemon { dir });
    }
    for package in ["ipfs-core", "ipfs-http-server"] {
        if !dir
            .join("node_modules")
            .join(package)
            .join("package.json")
            .is_file()
        {
            return Err(IpfsNodeError::NotInstalled { dir, package });
        }
    }
    Ok(JsIpfs {
        node,
        node_version,
        dir,
    })
}

/// The js-ipfs installation the tests use (looked up once per process; the first call
/// prints it or why there is none).
///
/// Errors: no Node.js 20+, no `daemon.mjs`, or the npm packages not installed (the message
/// names [`INSTALL_HINT`]).
pub fn find() -> Result<JsIpfs, IpfsNodeError> {
    static FOUND: OnceLock<Result<JsIpfs, IpfsNodeError>> = OnceLock::new();
    found_once(&FOUND, "test IPFS node", discover)
}

/// Whether a test may skip for want of a node: only when [`find`] fails *and* the
/// environment variable `CI` is unset. `Ok(None)`: start one; `Ok(Some(reason))`: skip,
/// saying why; `Err`: fail (under `CI` a missing node is an error, not a skip).
pub fn skip_reason() -> Result<Option<String>, RequiredUnderCi<IpfsNodeError>> {
    crate::process::skip_reason(find())
}

/// A js-ipfs node on `127.0.0.1` with a repo in a temporary directory. Killed (SIGKILL)
/// and its directory removed when dropped.
#[derive(Debug)]
pub struct IpfsNode {
    process: Option<ServerProcess>,
    port: u16,
    dir: PathBuf,
    version: String,
}

/// `POST /api/v0/version` over a plain socket: the `Version` when the node answers 200.
fn version(port: u16) -> std::io::Result<Option<String>> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(
        format!(
            "POST /api/v0/version HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
        )
        .as_bytes(),
    )?;
    let mut reply = Vec::new();
    s.take(64 << 10).read_to_end(&mut reply)?;
    let text = String::from_utf8_lossy(&reply);
    if !text.starts_with("HTTP/1.1 200") && !text.starts_with("HTTP/1.0 200") {
        return Ok(None);
    }
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    Ok(serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("Version")?.as_str().map(str::to_string)))
}

impl IpfsNode {
    /// Starts a node ([`find`]) with an empty repo in a fresh temporary directory, on a free
    /// loopback port, and waits (at most [`START_DEADLINE`]) until `/api/v0/version`
    /// answers.
    ///
    /// Errors: no installation, or the process exits or does not answer in time (the
    /// message quotes the end of its log).
    pub async fn start() -> Result<IpfsNode, IpfsNodeError> {
        let js = find()?;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hanzod-ipfs-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| IpfsNodeError::CreateDir {
            dir: dir.clone(),
            source: Arc::new(e),
        })?;
        // Dropped if no attempt starts, which removes the directory.
        let mut node = IpfsNode {
            process: None,
            port: 0,
            dir,
            version: String::new(),
        };
        let (js, dir) = (&js, node.dir.as_path());
        let (port, process, version) =
            on_free_ports(3, |port, attempt| launch(js, dir, port, attempt)).await?;
        node.port = port;
        node.process = Some(process);
        node.version = version;
        Ok(node)
    }

    /// `http://127.0.0.1:<port>`: the `IPFS_URL` of this node.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The loopback port its RPC API listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The version `/api/v0/version` reported (js-ipfs reports its `ipfs-core` version,
    /// `0.18.1` for js-ipfs 0.66.1).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The temporary directory: the repo and `daemon.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    /// Kills the process (SIGKILL) and waits for it. Does nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}

/// Runs `js` on `port` with the repo `dir/repo-{attempt}` and its output in
/// `dir/daemon.log`, and waits (at most [`START_DEADLINE`]) until `/api/v0/version`
/// answers: the port, the process and the version it reported.
async fn launch(
    js: &JsIpfs,
    dir: &Path,
    port: u16,
    attempt: u32,
) -> Result<(u16, ServerProcess, String), LaunchError> {
    let mut cmd = Command::new(&js.node);
    cmd.arg(js.dir.join("daemon.mjs"))
        .arg(dir.join(format!("repo-{attempt}")))
        .arg(port.to_string())
        .current_dir(&js.dir)
        .stdin(Stdio::piped());
    let process = ServerProcess::spawn(&mut cmd, &dir.join("daemon.log"), js)?;
    let ready = process.wait_ready(
        START_DEADLINE,
        Duration::from_millis(50),
        "/api/v0/version",
        || async move {
            let answer = tokio::task::spawn_blocking(move || version(port)).await;
            answer.ok()?.ok()?
        },
    );
    let (process, version) = ready.await.map_err(|e| e.on(js, port))?;
    Ok((port, process, version))
}

impl Drop for IpfsNode {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
