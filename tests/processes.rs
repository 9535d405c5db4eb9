//! Real processes over real loopback sockets: `hanzod serve` plus 16 `hanzod node`
//! processes. SIGKILL one node → every survivor applies the same new ring; SIGTERM the
//! orchestrator and start it again on the same port → every agent reconnects.
//!
//! Every wait has a deadline; on a timeout the test prints what each node reported last,
//! the tail of the daemon's log and where the logs are (the temp dir is kept on failure).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hanzod");
const NODES: usize = 16;

/// A child process killed (SIGKILL) and reaped when dropped, panics included.
struct Proc {
    child: Child,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own, polling until `timeout`.
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return None,
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A command for the binary, with the environment that could leak into it removed.
fn hanzod() -> Command {
    let mut c = Command::new(BIN);
    for k in [
        "HANZOD_CONFIG",
        "HANZOD_ENDPOINT",
        "HANZOD_ADMIN_TOKEN",
        "HANZO_LOG_FORMAT",
    ] {
        c.env_remove(k);
    }
    c.env("HANZO_LOG", "info").stdin(Stdio::null());
    c
}

use crate::support::free_port;

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("<unreadable: {e}>"));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The daemon, its nodes, their events, and the temp dir holding keys, config and logs.
struct Cluster {
    dir: PathBuf,
    port: u16,
    endpoint: String,
    config: PathBuf,
    serve: Option<Proc>,
    serve_starts: u32,
    nodes: Vec<Option<Proc>>,
    /// Node ids (hex), learnt from each node's first `registered`.
    ids: Vec<Option<String>>,
    /// Every event each node printed, in order.
    history: Vec<Vec<Value>>,
    tx: Sender<(usize, Value)>,
    rx: Receiver<(usize, Value)>,
}

impl Cluster {
    fn new(name: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("hanzod-proc-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let config = dir.join("serve.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[server]\ngrpc_addr = \"127.0.0.1:{port}\"\nmetrics_addr = \"\"\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let (tx, rx) = mpsc::channel();
        Cluster {
            endpoint: format!("http://127.0.0.1:{port}"),
            dir,
            port,
            config,
            serve: None,
            serve_starts: 0,
            nodes: Vec::new(),
            ids: Vec::new(),
            history: Vec::new(),
            tx,
            rx,
        }
    }

    fn serve_log(&self) -> PathBuf {
        self.dir.join(format!("serve-{}.log", self.serve_starts))
    }

    /// Starts `hanzod serve` and waits until its gRPC port accepts connections.
    fn start_serve(&mut self) {
        assert!(self.serve.is_none());
        self.serve_starts += 1;
        let log = File::create(self.serve_log()).unwrap();
        let child = hanzod()
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn hanzod serve");
        let mut serve = Proc { child };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            if let Ok(Some(s)) = serve.child.try_wait() {
                self.serve = None;
                self.fail(&format!("hanzod serve exited at start: {s}"));
            }
            if Instant::now() > deadline {
                self.serve = Some(serve);
                self.fail("hanzod serve did not accept connections within 15 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.serve = Some(serve);
    }

    /// Starts node `i` with its own key, piping its JSON events into the shared channel.
    fn start_node(&mut self, i: usize) {
        let stderr = File::create(self.dir.join(format!("node-{i}.log"))).unwrap();
        let mut child = hanzod()
            .arg("node")
            .arg("--key")
            .arg(self.dir.join(format!("n{i}.key")))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--vram-gib",
                "8",
                "--json",
                "--endpoint",
            ])
            .arg(&self.endpoint)
            .args(["--backoff-min-ms", "100", "--backoff-max-ms", "1000"])
            // Membership and recovery only: a job that trained would reach Published (and
            // release its ring) before the kill. Training processes: tests/demo.rs.
            .arg("--no-train")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn hanzod node");
        let stdout = child.stdout.take().unwrap();
        let tx = self.tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({ "event": "unparsed", "line": line }));
                if tx.send((i, v)).is_err() {
                    return;
                }
            }
        });
        while self.nodes.len() <= i {
            self.nodes.push(None);
            self.ids.push(None);
            self.history.push(Vec::new());
        }
        self.nodes[i] = Some(Proc { child });
    }

    /// Where each node's history ends now: later waits look only past this mark.
    fn mark(&self) -> Vec<usize> {
        self.history.iter().map(Vec::len).collect()
    }

    /// Receives events until `done` holds, or fails after `timeout`.
    fn wait(&mut self, what: &str, timeout: Duration, done: impl Fn(&Cluster) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if done(self) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((i, v)) => {
                    if v["event"] == "registered" && self.ids[i].is_none() {
                        self.ids[i] = v["node"].as_str().map(str::to_owned);
                    }
                    self.history[i].push(v);
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.fail(&format!("timed out after {timeout:?} waiting for {what}"))
                }
                Err(RecvTimeoutError::Disconnected) => unreachable!("the cluster holds a sender"),
            }
        }
    }

    /// Prints what each node reported last, the daemon's log tail, and panics.
    fn fail(&self, why: &str) -> ! {
        eprintln!("==== {why}");
        for (i, h) in self.history.iter().enumerate() {
            let state = if self.nodes[i].is_some() {
                "running"
            } else {
                "killed"
            };
            eprintln!(
                "node {i} ({state}, {}): {} events; last:",
                self.ids[i].as_deref().map_or("?", |s| &s[..8]),
                h.len()
            );
            for v in &h[h.len().saturating_sub(4)..] {
                eprintln!("    {}", brief(v));
            }
        }
        let log = self.serve_log();
        eprintln!(
            "==== tail of {} (node logs: {}/node-*.log)",
            log.display(),
            self.dir.display()
        );
        eprintln!("{}", tail(&log, 60));
        panic!("{why}");
    }

    /// Runs a client command against the daemon with `--json` and parses its output.
    fn cli(&self, args: &[&str]) -> Value {
        let out = hanzod()
            .args(args)
            .args(["--endpoint", &self.endpoint, "--json"])
            .output()
            .expect("run hanzod");
        if !out.status.success() {
            self.fail(&format!(
                "hanzod {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            self.fail(&format!(
                "hanzod {args:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            ))
        })
    }

    fn running(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some())
            .collect()
    }

    fn id(&self, i: usize) -> String {
        self.ids[i].clone().expect("node id known once registered")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in self.nodes.iter_mut() {
            n.take();
        }
        self.serve.take();
        if std::thread::panicking() || std::env::var_os("PROCESSES_KEEP_TMP").is_some() {
            eprintln!("kept {} for diagnosis", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// An event on one line, ids shortened to 8 hex digits.
fn brief(v: &Value) -> String {
    let short = |s: &Value| {
        s.as_str()
            .unwrap_or("?")
            .chars()
            .take(8)
            .collect::<String>()
    };
    match v["event"].as_str() {
        Some("ring_applied") => {
            let members = v["members"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            format!(
                "ring_applied job {} v{} of {}: {}",
                v["job"],
                v["version"],
                members.len(),
                members.iter().map(short).collect::<Vec<_>>().join(" ")
            )
        }
        Some("registered") => format!("registered as {}", short(&v["node"])),
        Some("probed") => format!(
            "probed {}: {} Mbit/s {}",
            short(&v["peer"]),
            v["mbps"],
            v["error"]
        ),
        _ => v.to_string(),
    }
}

/// Every node in `who` has an event named `name` past `mark`.
fn all_saw(c: &Cluster, who: &[usize], mark: &[usize], name: &str) -> bool {
    who.iter()
        .all(|&i| c.history[i][mark[i]..].iter().any(|v| v["event"] == name))
}

/// The last ring node `i` applied for `job`: (version, members).
fn last_ring(c: &Cluster, i: usize, job: u64) -> Option<(u64, Vec<String>)> {
    c.history[i]
        .iter()
        .rev()
        .find(|v| v["event"] == "ring_applied" && v["job"] == job)
        .map(|v| {
            let members = v["members"].as_array().unwrap();
            (
                v["version"].as_u64().unwrap(),
                members
                    .iter()
                    .map(|m| m.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
}

/// The ring every node in `who` holds for `job`, when they all hold the same one.
fn common_ring(c: &Cluster, who: &[usize], job: u64) -> Option<(u64, Vec<String>)> {
    let first = last_ring(c, who[0], job)?;
    who[1..]
        .iter()
        .all(|&i| last_ring(c, i, job).as_ref() == Some(&first))
        .then_some(first)
}

#[test]
fn kill_a_node_then_restart_the_orchestrator() {
    let t0 = Instant::now();
    let mut c = Cluster::new("kill-restart");
    c.start_serve();
    for i in 0..NODES {
        c.start_node(i);
    }
    let all: Vec<usize> = (0..NODES).collect();
    let m = c.mark();
    c.wait("all 16 nodes registered", Duration::from_secs(30), |c| {
        all_saw(c, &all, &m, "registered")
    });
    eprintln!("16 nodes registered after {:?}", t0.elapsed());

    // Submit once all 16 are registered, so the scheduler places up to max_nodes of them.
    let spec = c.dir.join("job.toml");
    std::fs::write(
        &spec,
        "name = \"processes\"\nepochs = 1\nmin_nodes = 2\nmax_nodes = 16\n",
    )
    .unwrap();
    let submitted = c.cli(&["job", "submit", spec.to_str().unwrap()]);
    let job = submitted["job"].as_u64().expect("job id");

    let t = Instant::now();
    c.wait(
        "all 16 nodes on the same 16-member ring",
        Duration::from_secs(30),
        |c| common_ring(c, &all, job).is_some_and(|(_, m)| m.len() == NODES),
    );
    let (v1, ring1) = common_ring(&c, &all, job).unwrap();
    let ids: BTreeSet<String> = all.iter().map(|&i| c.id(i)).collect();
    assert_eq!(ring1.iter().cloned().collect::<BTreeSet<_>>(), ids);
    eprintln!("ring v{v1} of 16 on every node after {:?}", t.elapsed());

    // SIGKILL one member.
    let victim = 5;
    let victim_id = c.id(victim);
    c.nodes[victim].as_mut().unwrap().kill();
    c.nodes[victim] = None;
    let killed = Instant::now();
    let survivors = c.running();
    assert_eq!(survivors.len(), NODES - 1);
    c.wait(
        "every survivor on the same 15-member ring without the killed node",
        Duration::from_secs(20),
        |c| {
            common_ring(c, &survivors, job)
                .is_some_and(|(v, m)| v > v1 && m.len() == NODES - 1 && !m.contains(&victim_id))
        },
    );
    let (v2, ring2) = common_ring(&c, &survivors, job).unwrap();
    eprintln!(
        "kill -9 → ring v{v2} of 15 on every survivor after {:?}",
        killed.elapsed()
    );
    let expected: BTreeSet<String> = survivors.iter().map(|&i| c.id(i)).collect();
    assert_eq!(ring2.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // Survivors keep their order (Algorithm 2): the new ring is the old one less the victim.
    let kept: Vec<String> = ring1.iter().filter(|m| **m != victim_id).cloned().collect();
    assert_eq!(ring2, kept, "survivors should keep their ring order");

    let ring = c.cli(&["ring", &job.to_string()]);
    assert_eq!(ring["job"].as_u64(), Some(job));
    assert_eq!(ring["version"].as_u64(), Some(v2), "hanzod ring: {ring}");
    let listed: Vec<String> = ring["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["node"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, ring2, "hanzod ring lists the ring the nodes hold");

    // SIGTERM the orchestrator: it exits 0 and every agent notices.
    let m = c.mark();
    let pid = c.serve.as_ref().unwrap().pid();
    let stopping = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -TERM {pid}: {st}");
    let status = c.serve.as_mut().unwrap().wait_exit(Duration::from_secs(10));
    match status {
        Some(s) if s.success() => {}
        Some(s) => c.fail(&format!("hanzod serve exited with {s} on SIGTERM")),
        None => c.fail("hanzod serve still running 10 s after SIGTERM"),
    }
    c.serve = None;
    eprintln!("serve exited 0 after {:?}", stopping.elapsed());
    c.wait(
        "every agent disconnected and reconnecting",
        Duration::from_secs(15),
        |c| {
            all_saw(c, &survivors, &m, "disconnected") && all_saw(c, &survivors, &m, "reconnecting")
        },
    );

    // Start it again on the same port: every agent registers again.
    let m = c.mark();
    let restarting = Instant::now();
    c.start_serve();
    c.wait(
        "every agent registered with the restarted orchestrator",
        Duration::from_secs(20),
        |c| all_saw(c, &survivors, &m, "registered"),
    );
    eprintln!(
        "15 agents re-registered {:?} after the restart",
        restarting.elapsed()
    );
    for &i in &survivors {
        let again = c.history[i][m[i]..]
            .iter()
            .find(|v| v["event"] == "registered")
            .unwrap();
        assert_eq!(again["node"].as_str(), Some(c.id(i).as_str()));
    }
    let nodes = c.cli(&["nodes"]);
    let nodes = nodes.as_array().expect("hanzod nodes --json: an array");
    let listed: BTreeSet<String> = nodes
        .iter()
        .map(|n| n["node"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, expected, "hanzod nodes lists the 15 survivors");
    assert!(
        nodes.iter().all(|n| n["alive"] == true),
        "every node alive: {nodes:?}"
    );
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for v in c.history.iter().flatten() {
        let mut name = v["event"].as_str().unwrap_or("?").to_owned();
        if name == "probed" && !v["error"].is_null() {
            name.push_str(" (failed)");
        }
        *counts.entry(name).or_default() += 1;
    }
    eprintln!("total {:?}; events: {counts:?}", t0.elapsed());
    assert!(
        !counts.contains_key("rejected") && !counts.contains_key("unparsed"),
        "no node had a message refused or printed a non-JSON line: {counts:?}"
    );
}
