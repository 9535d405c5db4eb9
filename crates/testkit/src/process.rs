//! Launching a real server as a child process for tests and benches:
//! what [`crate::valkey_server::ValkeyServer`], [`crate::ipfs_node::IpfsNode`] and
//! [`crate::fake_hub::OlahServer`] share.
//!
//! - finding the program: [`on_path`], looked up once per process by [`found_once`], and
//!   whether a test may skip without it ([`skip_reason`]: only when `CI` is unset);
//! - a free loopback port, tried again with another when the server could not bind it
//!   ([`on_free_ports`]);
//! - the process itself ([`ServerProcess`]): its stdout and stderr appended to one log
//!   file, polled until it answers with a deadline ([`ServerProcess::wait_ready`], whose
//!   error quotes the end of the log), and killed (SIGKILL) and reaped when dropped.
//!
//! What fails is a [`LaunchError`]; each launcher's own error wraps it.

use std::fmt::Display;
use std::future::Future;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Why a server process could not be started. Cheap to clone (the I/O errors are shared),
/// so that a launcher can cache what it found.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LaunchError {
    /// No loopback port could be bound.
    #[error("no free loopback port: {0}")]
    NoFreePort(#[source] Arc<std::io::Error>),
    /// The log file could not be opened.
    #[error("{}: {source}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The program could not be run.
    #[error("cannot run {program}: {source}")]
    Run {
        /// The program, as the launcher names it.
        program: String,
        /// Why.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The process exited before it answered.
    #[error("exited ({status}); its log ends:\n{log}")]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// The end of its log (the server's own words).
        log: String,
    },
    /// The process did not answer within the deadline (it was killed).
    #[error("did not answer {awaited} within {deadline:?}; its log ends:\n{log}")]
    NoAnswer {
        /// What was awaited (`PING`, `/api/v0/version`).
        awaited: String,
        /// The deadline.
        deadline: Duration,
        /// The end of its log.
        log: String,
    },
    /// A server started on a port but did not become ready ([`LaunchError::Exited`] or
    /// [`LaunchError::NoAnswer`], named).
    #[error("{server} on port {port} {source}")]
    NotReady {
        /// The server, as the launcher names it.
        server: String,
        /// The port it was given.
        port: u16,
        /// Why.
        #[source]
        source: Box<LaunchError>,
    },
}

impl LaunchError {
    /// `self` (from [`ServerProcess::wait_ready`]) named as `server` on `port`.
    pub fn on(self, server: impl Display, port: u16) -> LaunchError {
        LaunchError::NotReady {
            server: server.to_string(),
            port,
            source: Box::new(self),
        }
    }
}

/// What a test needs is missing and the environment variable `CI` is set
/// ([`skip_reason`]): a failure, not a skip.
#[derive(Debug, Clone, thiserror::Error)]
#[error("CI is set and {0}")]
pub struct RequiredUnderCi<E>(pub E);

/// How many lines of a server's log an error quotes.
const LOG_TAIL: usize = 20;

/// The file `name` in the first directory of `PATH` that has it.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// `discover()`'s result, computed once per process in `cell`; the first call prints it
/// (or why there is none) to stderr as `{what}: …`.
pub fn found_once<T, E>(
    cell: &OnceLock<Result<T, E>>,
    what: &str,
    discover: impl FnOnce() -> Result<T, E>,
) -> Result<T, E>
where
    T: Clone + Display,
    E: Clone + Display,
{
    cell.get_or_init(|| {
        let found = discover();
        match &found {
            Ok(v) => eprintln!("{what}: {v}"),
            Err(e) => eprintln!("{what}: {e}"),
        }
        found
    })
    .clone()
}

/// Whether a test may skip for want of what `found` looked for: `Ok(None)` when it was
/// found (run the test); `Ok(Some(why))` when it was not and the environment variable `CI`
/// is unset (skip, saying why); `Err` when it was not and `CI` is set (under `CI` a missing
/// server is a failure, not a skip).
pub fn skip_reason<T, E: Display>(
    found: Result<T, E>,
) -> Result<Option<String>, RequiredUnderCi<E>> {
    match found {
        Ok(_) => Ok(None),
        Err(e) if std::env::var_os("CI").is_none() => Ok(Some(e.to_string())),
        Err(e) => Err(RequiredUnderCi(e)),
    }
}

/// The ports [`free_port`] draws from: below Linux's ephemeral range (32768–60999 by
/// default), so no outgoing connection of another test (whose source port the kernel takes
/// from that range) can take a port between the moment it is found free and the moment a
/// server binds it.
pub const RESERVED_PORTS: std::ops::Range<u16> = 20_000..32_768;

/// A loopback port nothing listens on right now, drawn at random from [`RESERVED_PORTS`]
/// (a few tries), else one the kernel assigns. Every test that needs a port to give a
/// server it starts later takes it here: many tests run at once in the one test binary.
pub fn free_port() -> Result<u16, LaunchError> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..64 {
        let port = rng.gen_range(RESERVED_PORTS);
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LaunchError::NoFreePort(Arc::new(e)))
}

/// `start(port, attempt)` on a [`free_port`], up to `attempts` times (at least once): a
/// port found free may be taken before the server binds it. The first success, else the
/// last error.
pub async fn on_free_ports<T, E, F, Fut>(attempts: u32, mut start: F) -> Result<T, E>
where
    E: From<LaunchError>,
    F: FnMut(u16, u32) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let attempts = attempts.max(1);
    let mut attempt = 0;
    loop {
        match start(free_port()?, attempt).await {
            Ok(v) => return Ok(v),
            Err(e) if attempt + 1 >= attempts => return Err(e),
            Err(_) => attempt += 1,
        }
    }
}

/// The last `n` lines of the file at `path` (empty when it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A server's child process, its stdout and stderr appended to one log file. Killed
/// (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    log: PathBuf,
}

impl ServerProcess {
    /// Runs `cmd` (its arguments, directory and stdin as the caller set them) with stdout
    /// and stderr appended to `log` (created if missing).
    ///
    /// Errors: the log cannot be opened, or the program cannot be run (the message names
    /// it as `program`).
    pub fn spawn(
        cmd: &mut Command,
        log: &Path,
        program: &dyn Display,
    ) -> Result<ServerProcess, LaunchError> {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|e| LaunchError::Log {
                    path: log.to_path_buf(),
                    source: Arc::new(e),
                })
        };
        let child = cmd
            .stdout(open()?)
            .stderr(open()?)
            .spawn()
            .map_err(|e| LaunchError::Run {
                program: program.to_string(),
                source: Arc::new(e),
            })?;
        Ok(ServerProcess {
            child,
            log: log.to_path_buf(),
        })
    }

    /// Calls `probe` every `every` until it answers `Some`, and returns the process with
    /// that answer.
    ///
    /// Errors: the process exits, or `deadline` passes first; the process is then killed
    /// and the error — [`LaunchError::Exited`] or [`LaunchError::NoAnswer`], with the end of
    /// its log — is for the caller to name with the server's name and port
    /// ([`LaunchError::on`]).
    pub async fn wait_ready<T, F, Fut>(
        mut self,
        deadline: Duration,
        every: Duration,
        awaited: &str,
        mut probe: F,
    ) -> Result<(ServerProcess, T), LaunchError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let until = Instant::now() + deadline;
        loop {
            if let Some(answer) = probe().await {
                return Ok((self, answer));
            }
            let exited = self.child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= until {
                self.kill();
                let log = self.log_tail();
                return Err(match exited {
                    Some(status) => LaunchError::Exited { status, log },
                    None => LaunchError::NoAnswer {
                        awaited: awaited.to_string(),
                        deadline,
                        log,
                    },
                });
            }
            tokio::time::sleep(every).await;
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log, LOG_TAIL)
    }

    /// Kills the process (SIGKILL) and waits for it; nothing when it has exited already.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_only_without_ci() {
        assert_eq!(skip_reason::<(), String>(Ok(())).ok(), Some(None));
        let missing = skip_reason::<(), _>(Err("no server")).map_err(|e| e.to_string());
        if std::env::var_os("CI").is_none() {
            assert_eq!(missing, Ok(Some("no server".to_string())));
        } else {
            assert_eq!(missing, Err("CI is set and no server".to_string()));
        }
    }

    /// Runs `program args` logging to `log` and waits at most `deadline` for a probe that
    /// answers `answer`.
    async fn run(
        log: &Path,
        program: &str,
        args: &[&str],
        deadline: Duration,
        answer: Option<u32>,
    ) -> Result<(ServerProcess, u32), LaunchError> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        let p = ServerProcess::spawn(&mut cmd, log, &program)?;
        let every = Duration::from_millis(10);
        p.wait_ready(deadline, every, "a probe", || async move { answer })
            .await
    }

    #[tokio::test]
    async fn a_process_that_exits_is_reported_with_its_log() {
        let dir = std::env::temp_dir().join(format!("hanzod-process-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("sh.log");
        let long = Duration::from_secs(10);
        let script = ["-c", "echo starting; echo broken >&2; exit 3"];
        let e = run(&log, "sh", &script, long, None).await.unwrap_err();
        assert!(matches!(e, LaunchError::Exited { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("exited ("), "{e}");
        assert!(e.ends_with("starting\nbroken"), "{e}");

        let short = Duration::from_millis(50);
        let e = run(&log, "sleep", &["30"], short, None).await.unwrap_err();
        let e = e.on("sleep", 1234).to_string();
        assert!(
            e.starts_with("sleep on port 1234 did not answer a probe within 50ms"),
            "{e}"
        );

        let (p, n) = run(&log, "sleep", &["30"], long, Some(7)).await.unwrap();
        assert_eq!(n, 7);
        assert!(p.pid() > 0);
        drop(p);
        let e = run(&log, "/nonexistent/x", &[], long, None)
            .await
            .unwrap_err();
        assert!(matches!(e, LaunchError::Run { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("cannot run /nonexistent/x"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
