//! A WAN test bed of real hosts on one machine (needs root): one network namespace per
//! node and one for the orchestrator, each joined by a veth pair to a bridge in a
//! dedicated hub namespace, with per-destination egress rate limits (`tc` htb classes and
//! u32 filters on each endpoint's veth). Nothing is created in the caller's namespace
//! except the namespaces' names under `/run/netns`.
//!
//! - [`plan`]: the pure half: a [`Topology`] (TOML or code) and the [`Plan`] it becomes:
//!   the rate matrix (Mbit/s), the addresses (`10.77.0.1` the orchestrator, `10.77.0.(k+2)`
//!   node `k`), the names (`hzb` + pid + sequence digit + role, ≤ 15 bytes) and the exact
//!   `ip`/`tc` commands;
//! - [`Testbed`]: the bed itself: [`Testbed::up`] creates it, dropping it (also while a
//!   test unwinds), [`Testbed::down`], SIGINT or SIGTERM remove it; each `up` first
//!   removes what earlier, dead processes of this family left behind (the pid is in the
//!   names) and never touches any other name (a crashed run's namespaces survive until
//!   then, and longer if its pid was reused by a live process). Liveness is checked in
//!   the caller's pid namespace only: processes in separate pid namespaces (containers)
//!   sharing `/run/netns` would remove each other's beds, so give each its own;
//! - [`Testbed::command`]: a process inside a namespace (`ip netns exec`), killed on drop;
//!   [`in_namespace`]: a closure on a thread inside one (to open sockets there);
//!   [`Testbed::measure_tcp`]: TCP goodput between two endpoints;
//! - [`clean_stale`]: what `hanzod testbed clean` runs (the stale-bed removal of `up`);
//! - [`probe`]: every node→node link measured with the node agent's probe protocol, and
//!   the ring built on the measurements against the ring built on the configured rates;
//! - [`allreduce`]: one real ring all-reduce round among the nodes, against its bound.
//!
//! Shaping: node `i`'s traffic to node `j` is limited to `rates[i][j]`; its traffic to the
//! orchestrator to its uplink (and, when the orchestrator has a region, that region pair's
//! rate); all of a node's shaped traffic together is limited to its uplink (one htb parent
//! class); the orchestrator's own egress is unshaped unless it has a region. Rates are on
//! the wire (Ethernet frames), so TCP goodput is about 95 % of them at MTU 1500.
//!
//! ```no_run
//! # async fn t() -> Result<(), Box<dyn std::error::Error>> {
//! use hanzod_testkit::testbed::{Endpoint, Testbed, Topology};
//! let topo = Topology::from_toml_str(&std::fs::read_to_string("config/testbed.example.toml")?)?;
//! let bed = tokio::task::spawn_blocking(move || Testbed::up(&topo)).await??;
//! let out = bed
//!     .command_at(Endpoint::Node(0), "ip", ["-brief", "addr"])
//!     .output()
//!     .await?;
//! println!("{}", String::from_utf8_lossy(&out.stdout));
//! # Ok(()) }
//! ```

pub mod allreduce;
pub mod plan;
pub mod probe;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use plan::{
    address, name_prefix, parse_name, Cmd, Endpoint, EndpointPlan, OrchestratorPlacement, Plan,
    Region, RegionLink, Topology, TopologyError, UplinkFactor,
};

/// The most stderr bytes an error quotes.
const STDERR_QUOTE: usize = 1_000;

/// Why the test bed could not be set up, used or removed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// The topology was refused.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The process is not root.
    #[error("the test bed needs root (effective uid {0})")]
    NotRoot(u32),
    /// A command could not be started (its program is missing, say).
    #[error("could not run `{command}`: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stderr (at most 1,000 bytes).
        stderr: String,
    },
    /// Every sequence digit of this process is taken by a live bed (36 at once).
    #[error("36 test beds are already up in this process")]
    TooManyBeds,
    /// The endpoint is not in the bed.
    #[error("no endpoint {0} in the test bed")]
    NoSuchEndpoint(Endpoint),
    /// An I/O error inside a namespace (entering it, a socket), with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl TestbedError {
    /// Whether this error says the machine cannot host a test bed at all (not root, no
    /// `ip`, or `ip netns add` refused), as opposed to a failure of the bed: tests skip
    /// on it (unless `CI` is set).
    pub fn is_unsupported(&self) -> bool {
        match self {
            TestbedError::NotRoot(_) | TestbedError::Spawn { .. } => true,
            TestbedError::Command { command, .. } => command.starts_with("ip netns add "),
            _ => false,
        }
    }

    fn io(what: impl Into<String>, source: std::io::Error) -> TestbedError {
        TestbedError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Runs one command (argument vector, no shell) and returns its stdout.
pub fn run_cmd(cmd: &Cmd) -> Result<String, TestbedError> {
    let out = std::process::Command::new(&cmd.program)
        .args(&cmd.args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| TestbedError::Spawn {
            command: cmd.to_string(),
            source,
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if stderr.len() > STDERR_QUOTE {
        let mut cut = STDERR_QUOTE;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        stderr.push('…');
    }
    Err(TestbedError::Command {
        command: cmd.to_string(),
        status: out.status.to_string(),
        stderr,
    })
}

fn cmd(program: &str, args: &[&str]) -> Cmd {
    Cmd {
        program: program.into(),
        args: args.iter().map(|a| (*a).to_string()).collect(),
    }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    effective_uid() == 0
}

/// This process's effective uid.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The live beds of this process: sequence digit → namespaces (what a signal removes).
static LIVE: Mutex<BTreeMap<u8, Vec<String>>> = Mutex::new(BTreeMap::new());

fn live() -> std::sync::MutexGuard<'static, BTreeMap<u8, Vec<String>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Kills (SIGKILL) every process inside `ns`, then deletes it. A namespace that does not
/// exist is not an error.
fn remove_netns(ns: &str) -> Result<(), TestbedError> {
    if !netns_exists(ns) {
        return Ok(());
    }
    if let Ok(pids) = run_cmd(&cmd("ip", &["netns", "pids", ns])) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            if pid > 1 && pid != std::process::id() as i32 {
                // SAFETY: kill has no memory preconditions; the pid is one `ip` listed as
                // running inside a namespace this test bed created.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    match run_cmd(&cmd("ip", &["netns", "del", ns])) {
        Ok(_) => Ok(()),
        Err(_) if !netns_exists(ns) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the namespaces of this family (names [`parse_name`] accepts) that a dead
/// process left: those whose pid is not running, and those with this process's pid that
/// no live bed of this process owns (an earlier process that had the same pid). Called
/// with the [`LIVE`] lock held. Returns the names removed.
///
/// Limitation: liveness is judged by `/proc/<pid>` in *this* process's pid namespace,
/// while `/run/netns` may be shared more widely. Two containers (or any two pid
/// namespaces) sharing `/run/netns` see each other's beds as dead and delete them, and
/// the same pid in both collides in names too. Run at most one pid namespace's test beds
/// per `/run/netns` (e.g. give each container its own mount of it).
fn remove_stale(live: &BTreeMap<u8, Vec<String>>) -> Vec<String> {
    let Ok(list) = run_cmd(&cmd("ip", &["netns", "list"])) else {
        return vec![];
    };
    let me = std::process::id();
    let mut removed = vec![];
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some((pid, seq)) = parse_name(name) else {
            continue;
        };
        let stale = if pid == me {
            !live.get(&seq).is_some_and(|v| v.iter().any(|n| n == name))
        } else {
            !Path::new(&format!("/proc/{pid}")).exists()
        };
        if stale && remove_netns(name).is_ok() {
            removed.push(name.to_string());
        }
    }
    removed
}

/// Removes the namespaces that earlier, dead processes of this family left (what
/// [`Testbed::up`] does first; `hanzod testbed clean`): names [`parse_name`] accepts whose
/// pid is not running, and those with this process's pid that no live bed of this process
/// owns. Every interface, address and qdisc of a bed lives inside its namespaces (nothing
/// is created in the caller's namespace), so removing them removes the links too. Needs
/// root ([`TestbedError::NotRoot`]); returns the names removed (a name that could not be
/// removed is left and not listed). The pid-namespace limitation of [`Testbed::up`]
/// applies.
pub fn clean_stale() -> Result<Vec<String>, TestbedError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(TestbedError::NotRoot(euid));
    }
    // `ip` itself missing is reported (remove_stale treats a failed list as empty).
    run_cmd(&cmd("ip", &["netns", "list"]))?;
    let live = live();
    Ok(remove_stale(&live))
}

/// Removes every live bed of this process (the signal path).
fn remove_all_live() {
    let beds = std::mem::take(&mut *live());
    for namespaces in beds.values() {
        for ns in namespaces.iter().rev() {
            let _ = remove_netns(ns);
        }
    }
}

/// Starts, once per process, a thread that on SIGINT or SIGTERM removes every live bed and
/// exits (status 130 or 143). From then on these signals no longer kill the process
/// before that.
fn install_signal_cleanup() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("testbed-signals".into())
            .spawn(|| {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                let code = rt.block_on(async {
                    use tokio::signal::unix::{signal, SignalKind};
                    let (Ok(mut int), Ok(mut term)) = (
                        signal(SignalKind::interrupt()),
                        signal(SignalKind::terminate()),
                    ) else {
                        return None;
                    };
                    tokio::select! {
                        _ = int.recv() => Some(130),
                        _ = term.recv() => Some(143),
                    }
                });
                if let Some(code) = code {
                    eprintln!("hanzod testbed: signal received, removing the test beds");
                    remove_all_live();
                    std::process::exit(code);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "test bed: no signal cleanup thread");
        }
    });
}

/// Runs `f` on a new thread inside network namespace `netns` (by its name under
/// `/run/netns`) and returns its result: sockets it opens belong to that namespace and
/// keep belonging to it when used from any thread afterwards.
pub fn in_namespace<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> Result<T, TestbedError> {
    let path = Path::new("/run/netns").join(netns);
    let file = File::open(&path)
        .map_err(|e| TestbedError::io(format!("opening {}", path.display()), e))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: the fd is a network namespace file open for the duration of the
            // call; setns only changes this (new, scoped) thread's network namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(TestbedError::io(
                    format!("entering network namespace {netns}"),
                    std::io::Error::last_os_error(),
                ));
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A measured TCP transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Payload bytes received in the measurement window.
    pub bytes: u64,
    /// The window, seconds.
    pub seconds: f64,
    /// Goodput (TCP payload), Mbit/s.
    pub mbit: f64,
}

/// A WAN test bed that is up; dropping it removes it (see the [module](self) docs).
#[derive(Debug)]
pub struct Testbed {
    plan: Plan,
    seq: u8,
    removed: bool,
}

impl Testbed {
    /// Creates the bed of `topology` (blocking: from async code, call it through
    /// `tokio::task::spawn_blocking`). First removes what dead processes of this family
    /// left. On failure, whatever was created is removed.
    pub fn up(topology: &Topology) -> Result<Testbed, TestbedError> {
        topology.validate()?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(TestbedError::NotRoot(euid));
        }
        let pid = std::process::id();
        let (plan, seq) = {
            let mut live = live();
            let removed = remove_stale(&live);
            if !removed.is_empty() {
                eprintln!("hanzod testbed: removed stale namespaces {removed:?}");
            }
            let seq = (0..36u8)
                .find(|s| !live.contains_key(s))
                .ok_or(TestbedError::TooManyBeds)?;
            let plan = Plan::new(topology, &name_prefix(pid, seq))?;
            live.insert(seq, plan.namespaces());
            (plan, seq)
        };
        install_signal_cleanup();
        let bed = Testbed {
            plan,
            seq,
            removed: false,
        };
        for c in bed.plan.setup_commands() {
            run_cmd(&c)?; // on error, dropping `bed` removes what was made
        }
        Ok(bed)
    }

    /// The plan the bed was made from (names, addresses, rates, commands).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The number of nodes.
    pub fn nodes(&self) -> usize {
        self.plan.rates.len()
    }

    fn endpoint(&self, e: Endpoint) -> Result<&EndpointPlan, TestbedError> {
        self.plan.endpoint(e).ok_or(TestbedError::NoSuchEndpoint(e))
    }

    /// An endpoint's namespace name (panics on a node index out of range).
    pub fn netns(&self, e: Endpoint) -> &str {
        match self.endpoint(e) {
            Ok(p) => &p.netns,
            Err(err) => panic!("{err}"),
        }
    }

    /// An endpoint's address.
    pub fn addr(&self, e: Endpoint) -> Ipv4Addr {
        address(e)
    }

    /// The configured rate from node `i` to node `j`, Mbit/s (`None` for `i == j` or out of
    /// range).
    pub fn rate(&self, i: usize, j: usize) -> Option<f64> {
        self.plan.rates.get(i)?.get(j).copied().flatten()
    }

    /// `ip netns exec <netns> <program> <args…>` as a tokio command, killed when dropped
    /// (configure stdio and spawn or `output()` it as usual).
    pub fn command<I, S>(
        &self,
        netns: &str,
        program: impl AsRef<OsStr>,
        args: I,
    ) -> tokio::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = tokio::process::Command::new("ip");
        c.arg("netns")
            .arg("exec")
            .arg(netns)
            .arg(program)
            .args(args)
            .kill_on_drop(true);
        c
    }

    /// [`Testbed::command`] in an endpoint's namespace.
    pub fn command_at<I, S>(
        &self,
        e: Endpoint,
        program: impl AsRef<OsStr>,
        args: I,
    ) -> tokio::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.command(self.netns(e), program, args)
    }

    /// Measures TCP goodput from `from` to `to` (blocking): a receiver in `to`'s namespace,
    /// a sender in `from`'s sending as fast as it can; counts what arrives during `window`
    /// after `warmup` from the first byte (so htb's burst and TCP's slow start are left
    /// out).
    pub fn measure_tcp(
        &self,
        from: Endpoint,
        to: Endpoint,
        warmup: Duration,
        window: Duration,
    ) -> Result<Throughput, TestbedError> {
        let (src, dst) = (self.endpoint(from)?, self.endpoint(to)?);
        let listener = in_namespace(&dst.netns, || TcpListener::bind((dst.addr, 0)))?
            .map_err(|e| TestbedError::io(format!("binding in {}", dst.netns), e))?;
        let target: SocketAddr = listener
            .local_addr()
            .map_err(|e| TestbedError::io("listener address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| TestbedError::io("listener", e))?;
        let receiver = std::thread::spawn(move || receive(listener, warmup, window));
        let stream = in_namespace(&src.netns, || {
            TcpStream::connect_timeout(&target, Duration::from_secs(5))
        })?
        .map_err(|e| TestbedError::io(format!("connecting {from} -> {to} ({target})"), e));
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                let _ = receiver.join();
                return Err(e);
            }
        };
        send_until_closed(stream, warmup + window + Duration::from_secs(10));
        receiver
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// Removes the bed, reporting the first failure (dropping it does the same, silently).
    pub fn down(mut self) -> Result<(), TestbedError> {
        self.remove()
    }

    fn remove(&mut self) -> Result<(), TestbedError> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        let mut first = Ok(());
        for ns in self
            .plan
            .namespaces()
            .iter()
            .skip(1)
            .chain([&self.plan.hub_netns])
        {
            if let Err(e) = remove_netns(ns) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        live().remove(&self.seq);
        first
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("hanzod testbed: removing {}: {e}", self.plan.prefix);
        }
    }
}

/// Accepts one connection (within 5 s) and counts the bytes of the window.
fn receive(
    listener: TcpListener,
    warmup: Duration,
    window: Duration,
) -> Result<Throughput, TestbedError> {
    let accept_by = Instant::now() + Duration::from_secs(5);
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < accept_by => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(TestbedError::io("accepting the sender", e)),
        }
    };
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(Duration::from_secs(5))))
        .map_err(|e| TestbedError::io("receiver socket", e))?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    let mut start: Option<(Instant, u64)> = None;
    let mut first: Option<Instant> = None;
    loop {
        let n = stream
            .read(&mut buf)
            .map_err(|e| TestbedError::io("receiving", e))?;
        if n == 0 {
            return Err(TestbedError::io(
                "receiving",
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the sender stopped before the window ended",
                ),
            ));
        }
        let now = Instant::now();
        total += n as u64;
        let t0 = *first.get_or_insert(now);
        match start {
            None if now >= t0 + warmup => start = Some((now, total)),
            Some((s, at)) if now >= s + window => {
                let seconds = now.duration_since(s).as_secs_f64();
                let bytes = total - at;
                // Dropping the stream resets the connection: the sender stops.
                return Ok(Throughput {
                    bytes,
                    seconds,
                    mbit: bytes as f64 * 8.0 / seconds / 1e6,
                });
            }
            _ => {}
        }
    }
}

/// Writes until the receiver closes (or `limit` passes).
fn send_until_closed(mut stream: TcpStream, limit: Duration) {
    let buf = vec![0x5au8; 64 * 1024];
    let end = Instant::now() + limit;
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    while Instant::now() < end {
        match stream.write(&buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests;
