//! `hanzod testbed`: a WAN test bed of network namespaces on this machine (needs root;
//! feature `testkit`): bring one up and hold it, measure its links with the node agent's
//! probe, run real ring all-reduce rounds on it, remove what dead runs left.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use hanzod_testkit::testbed::allreduce::{self, AllReduceError, AllReduceReport, AllReduceSpec};
use hanzod_testkit::testbed::probe::{self, ProbeReport, ProbeRunError, GOODPUT_FACTOR};
use hanzod_testkit::testbed::{self, Endpoint, Testbed, TestbedError, Topology, TopologyError};
use serde::Serialize;

#[derive(Subcommand, Debug)]
pub(crate) enum TestbedCommand {
    /// Create the test bed of a topology file, print its endpoints (namespace, address,
    /// region), and hold it until SIGINT or SIGTERM, which remove it (exit 130 or 143).
    /// Run commands inside with `ip netns exec <namespace> …`.
    #[command(after_help = "\
Examples:
  sudo hanzod testbed up config/testbed.example.toml
  sudo hanzod testbed up config/testbed.example.toml --json")]
    Up {
        /// The topology (TOML, see config/testbed.example.toml).
        topology: PathBuf,
        /// Print the endpoints as one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Create the test bed, measure every directed node→node link with the node agent's
    /// probe (a timed TCP transfer), print configured vs measured Mbit/s and the error per
    /// link, then build the ring on the measured and on the configured matrix and compare
    /// their bottlenecks on the configured one. Removes the bed.
    #[command(after_help = "\
Examples:
  sudo hanzod testbed measure config/testbed.example.toml
  sudo hanzod testbed measure config/testbed.example.toml --bytes 8388608 --json")]
    Measure {
        /// The topology (TOML).
        topology: PathBuf,
        /// Bytes per probe (the agent's default, `core.probe.probe_bytes`: 2 MiB).
        #[arg(long, default_value_t = probe::DEFAULT_PROBE_BYTES)]
        bytes: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run one real ring all-reduce round per delta size on the test bed (every node a
    /// ring member with its own runtime in its namespace), check every member ends with
    /// the reference sum, and print the time against the ring's bound
    /// 2(N−1)/N × bytes × 8 / bottleneck. With --nodes the topology must have one region,
    /// whose node count each entry replaces (one bed per entry).
    #[command(after_help = "\
Examples:
  sudo hanzod testbed allreduce config/testbed.allreduce.toml --mb 8,64
  sudo hanzod testbed allreduce config/testbed.allreduce.toml --nodes 4,8,16 --mb 8,64,256 --mbit 100")]
    Allreduce {
        /// The topology (TOML).
        topology: PathBuf,
        /// Delta sizes per member, MB (10⁶ bytes), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "8")]
        mb: Vec<u64>,
        /// Node counts, comma-separated (a one-region topology only).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<usize>,
        /// Replace the (one) region's rate, Mbit/s.
        #[arg(long)]
        mbit: Option<f64>,
        /// Piece size, KiB (f32 elements = KiB × 256).
        #[arg(long, default_value_t = 256)]
        piece_kib: u32,
        /// Outgoing pieces in flight per member.
        #[arg(long, default_value_t = 4)]
        in_flight: usize,
        /// Seeds the deltas, weights and keys.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Print the rows as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove the namespaces (and with them every link) that test beds of dead processes
    /// left behind; beds of live processes are kept.
    #[command(after_help = "Example:\n  sudo hanzod testbed clean")]
    Clean {
        /// Print the names removed as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Why a `hanzod testbed` command failed; `usage` errors exit 2, the others 1.
#[derive(Debug, thiserror::Error)]
enum CmdError {
    /// Not root.
    #[error("the test bed needs root (effective uid {0}); run it with sudo")]
    NotRoot(u32),
    /// The topology file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The topology is refused (the message names the field).
    #[error("{path}: {source}")]
    Topology {
        path: String,
        #[source]
        source: TopologyError,
    },
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The bed failed.
    #[error(transparent)]
    Testbed(TestbedError),
    /// A probe failed.
    #[error(transparent)]
    Probe(ProbeRunError),
    /// A round failed.
    #[error(transparent)]
    AllReduce(AllReduceError),
    /// Anything else (runtime, output).
    #[error("{0}")]
    Other(String),
}

impl CmdError {
    fn exit_code(&self) -> ExitCode {
        match self {
            CmdError::NotRoot(_)
            | CmdError::Read { .. }
            | CmdError::Topology { .. }
            | CmdError::Usage(_) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

impl From<TestbedError> for CmdError {
    fn from(e: TestbedError) -> CmdError {
        match e {
            TestbedError::NotRoot(uid) => CmdError::NotRoot(uid),
            TestbedError::Topology(source) => CmdError::Topology {
                path: "topology".into(),
                source,
            },
            e => CmdError::Testbed(e),
        }
    }
}

impl From<ProbeRunError> for CmdError {
    fn from(e: ProbeRunError) -> CmdError {
        match e {
            ProbeRunError::Testbed(e) => e.into(),
            ProbeRunError::BadSize(_) | ProbeRunError::TooFewNodes(_) => {
                CmdError::Usage(e.to_string())
            }
            e => CmdError::Probe(e),
        }
    }
}

impl From<AllReduceError> for CmdError {
    fn from(e: AllReduceError) -> CmdError {
        match e {
            AllReduceError::Testbed(e) => e.into(),
            e => CmdError::AllReduce(e),
        }
    }
}

pub(crate) fn run_testbed(cmd: TestbedCommand) -> ExitCode {
    let r = match cmd {
        TestbedCommand::Up { topology, json } => up(&topology, json),
        TestbedCommand::Measure {
            topology,
            bytes,
            json,
        } => measure(&topology, bytes, json),
        TestbedCommand::Allreduce {
            topology,
            mb,
            nodes,
            mbit,
            piece_kib,
            in_flight,
            seed,
            json,
        } => run_allreduce(
            &topology, &mb, &nodes, mbit, piece_kib, in_flight, seed, json,
        ),
        TestbedCommand::Clean { json } => clean(json),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

fn require_root() -> Result<(), CmdError> {
    match testbed::effective_uid() {
        0 => Ok(()),
        uid => Err(CmdError::NotRoot(uid)),
    }
}

fn load(path: &Path) -> Result<Topology, CmdError> {
    let text = std::fs::read_to_string(path).map_err(|source| CmdError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Topology::from_toml_str(&text).map_err(|source| CmdError::Topology {
        path: path.display().to_string(),
        source,
    })
}

fn bring_up(topology: Topology) -> Result<Testbed, CmdError> {
    Ok(Testbed::up(&topology)?)
}

fn print_json(v: &impl Serialize) -> Result<(), CmdError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| CmdError::Other(e.to_string()))?;
    println!("{s}");
    Ok(())
}

#[derive(Serialize)]
struct EndpointJson {
    endpoint: String,
    netns: String,
    addr: String,
    region: Option<String>,
    /// Mbit/s; `None` for the orchestrator.
    uplink_mbit: Option<f64>,
}

#[derive(Serialize)]
struct BedJson {
    prefix: String,
    hub_netns: String,
    endpoints: Vec<EndpointJson>,
    /// Node i → node j, Mbit/s (`null` on the diagonal).
    rates_mbit: Vec<Vec<Option<f64>>>,
}

fn describe(topology: &Topology, bed: &Testbed) -> BedJson {
    let regions = topology.node_regions();
    let plan = bed.plan();
    BedJson {
        prefix: plan.prefix.clone(),
        hub_netns: plan.hub_netns.clone(),
        endpoints: plan
            .endpoints
            .iter()
            .map(|e| EndpointJson {
                endpoint: e.endpoint.to_string(),
                netns: e.netns.clone(),
                addr: e.addr.to_string(),
                region: match e.endpoint {
                    Endpoint::Node(k) => regions.get(k).cloned(),
                    Endpoint::Orchestrator => topology.orchestrator.region.clone(),
                },
                uplink_mbit: e.uplink,
            })
            .collect(),
        rates_mbit: plan.rates.clone(),
    }
}

fn up(path: &Path, json: bool) -> Result<(), CmdError> {
    let topology = load(path)?;
    require_root()?;
    let bed = bring_up(topology.clone())?;
    let d = describe(&topology, &bed);
    if json {
        print_json(&d)?;
    } else {
        println!(
            "{:<6} {:<14} {:<12} {:<10} uplink Mbit/s",
            "", "namespace", "address", "region"
        );
        for e in &d.endpoints {
            println!(
                "{:<6} {:<14} {:<12} {:<10} {}",
                e.endpoint,
                e.netns,
                e.addr,
                e.region.as_deref().unwrap_or("-"),
                e.uplink_mbit.map_or("-".into(), |u| format!("{u}"))
            );
        }
    }
    let _ = std::io::stdout().flush();
    eprintln!(
        "test bed {} is up; `ip netns exec <namespace> <command>` runs inside it. \
         Ctrl-C or SIGTERM removes it.",
        d.prefix
    );
    // The bed's own signal thread removes it and exits (130 on SIGINT, 143 on SIGTERM).
    let _hold = bed;
    loop {
        std::thread::park();
    }
}

fn measure(path: &Path, bytes: u64, json: bool) -> Result<(), CmdError> {
    let topology = load(path)?;
    require_root()?;
    if bytes == 0 || bytes > hanzod_node::probe::MAX_PROBE_BYTES {
        return Err(CmdError::Usage(format!(
            "--bytes {bytes}: 1 to {} allowed",
            hanzod_node::probe::MAX_PROBE_BYTES
        )));
    }
    let regions = topology.node_regions();
    let bed = bring_up(topology)?;
    let rt = crate::runtime().map_err(|e| CmdError::Other(format!("runtime: {e}")))?;
    let report = rt.block_on(probe::probe_links(&bed, bytes, &regions))?;
    bed.down()?;
    if json {
        return print_json(&report);
    }
    print_probe_report(&report);
    Ok(())
}

fn print_probe_report(r: &ProbeReport) {
    println!(
        "{:<12} {:>12} {:>12} {:>9} {:>12}",
        "link", "configured", "measured", "error", "vs goodput"
    );
    for l in &r.links {
        println!(
            "{:<12} {:>7.1} Mb/s {:>7.2} Mb/s {:>+8.1}% {:>+11.1}%",
            format!("n{} -> n{}", l.from, l.to),
            l.configured_mbit,
            l.measured_mbit,
            100.0 * l.relative_error(),
            100.0 * l.goodput_error()
        );
    }
    println!(
        "{} links, probes of {} bytes: |error| mean {:.1} %, max {:.1} %; against payload \
         goodput ({GOODPUT_FACTOR:.3} × configured): mean {:.1} %, max {:.1} %",
        r.links.len(),
        r.probe_bytes,
        100.0 * r.mean_abs_error,
        100.0 * r.max_abs_error,
        100.0 * r.mean_abs_goodput_error,
        100.0 * r.max_abs_goodput_error
    );
    let c = &r.ring;
    println!(
        "ring ({}) on the measured matrix: {:?}, bottleneck {:.2} Mbit/s measured, {:.2} Mbit/s \
         configured",
        c.builder, c.measured_ring, c.measured_ring_on_measured_mbit, c.measured_ring_on_true_mbit
    );
    println!(
        "ring on the configured matrix: {:?}, bottleneck {:.2} Mbit/s{}",
        c.true_ring,
        c.true_ring_on_true_mbit,
        c.exact_on_true_mbit
            .map_or(String::new(), |x| format!(" (exact optimum {x:.2})"))
    );
    println!(
        "measured ring / best ring, both on the configured matrix: {:.3}",
        c.ratio
    );
}

/// One row of `hanzod testbed allreduce`.
#[derive(Serialize)]
struct Row {
    nodes: usize,
    mb: u64,
    /// The 1-minute load average when the row ended.
    load: Option<f64>,
    /// The report, or why the row did not run.
    #[serde(flatten)]
    result: RowResult,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RowResult {
    Ran(AllReduceReport),
    Skipped { skipped: String },
}

fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[allow(clippy::too_many_arguments)]
fn run_allreduce(
    path: &Path,
    mb: &[u64],
    nodes: &[usize],
    mbit: Option<f64>,
    piece_kib: u32,
    in_flight: usize,
    seed: u64,
    json: bool,
) -> Result<(), CmdError> {
    let base = load(path)?;
    require_root()?;
    if mb.is_empty() || mb.contains(&0) {
        return Err(CmdError::Usage("--mb: sizes ≥ 1 MB".into()));
    }
    let piece_elems = piece_kib
        .checked_mul(256)
        .filter(|p| *p > 0)
        .ok_or_else(|| CmdError::Usage(format!("--piece-kib {piece_kib}: 1 to 16777215")))?;
    if in_flight == 0 {
        return Err(CmdError::Usage("--in-flight: at least 1".into()));
    }
    let one_region = |what: &str| {
        if base.regions.len() == 1 {
            Ok(())
        } else {
            Err(CmdError::Usage(format!(
                "{what} needs a topology with exactly one region ({} has {})",
                path.display(),
                base.regions.len()
            )))
        }
    };
    let mut topologies = vec![];
    if nodes.is_empty() {
        topologies.push(base.clone());
    } else {
        one_region("--nodes")?;
        for &n in nodes {
            let mut t = base.clone();
            t.regions[0].nodes = n;
            t.uplinks.retain(|u| u.node < n);
            topologies.push(t);
        }
    }
    if let Some(m) = mbit {
        one_region("--mbit")?;
        for t in &mut topologies {
            t.regions[0].intra_mbit = m;
            t.regions[0].uplink_mbit = None;
        }
    }
    for t in &topologies {
        t.validate().map_err(|source| CmdError::Topology {
            path: path.display().to_string(),
            source,
        })?;
        if t.node_count() < 2 {
            return Err(CmdError::Usage(format!(
                "{} node(s): a ring needs at least 2",
                t.node_count()
            )));
        }
    }
    if !json {
        println!(
            "{:>3} {:>6} {:>12} {:>9} {:>10} {:>6} {:>10} {:>5}",
            "N", "MB", "bottleneck", "bound s", "measured s", "ratio", "goodput", "load"
        );
    }
    let mut rows = vec![];
    for t in topologies {
        let bed = bring_up(t)?;
        for &size in mb {
            let spec = AllReduceSpec {
                bytes: size.saturating_mul(1_000_000),
                seed,
                piece_elems,
                max_in_flight: in_flight,
                ring: None,
            };
            let result = match allreduce::check_memory(bed.nodes(), &spec) {
                Err(e) => RowResult::Skipped {
                    skipped: e.to_string(),
                },
                Ok(()) => RowResult::Ran(allreduce::run_allreduce(&bed, &spec)?),
            };
            let row = Row {
                nodes: bed.nodes(),
                mb: size,
                load: loadavg(),
                result,
            };
            if !json {
                let load = row.load.map_or("-".into(), |l| format!("{l:.2}"));
                match &row.result {
                    RowResult::Ran(r) => println!(
                        "{:>3} {:>6} {:>7.1} Mb/s {:>9.3} {:>10.3} {:>6.3} {:>5.1} Mb/s {:>5}",
                        r.nodes,
                        size,
                        r.bottleneck_mbit,
                        r.bound_s,
                        r.elapsed_s,
                        r.ratio,
                        r.goodput_mbit,
                        load
                    ),
                    RowResult::Skipped { skipped } => {
                        println!("{:>3} {:>6} skipped: {skipped}", row.nodes, size)
                    }
                }
                let _ = std::io::stdout().flush();
            }
            rows.push(row);
        }
        bed.down()?;
    }
    if json {
        print_json(&rows)?;
    } else {
        println!(
            "bound = 2(N−1)/N × bytes × 8 / bottleneck (configured wire rate); TCP payload \
             tops out near {GOODPUT_FACTOR:.3} of it. Every member's result equals the \
             reference sum."
        );
    }
    Ok(())
}

fn clean(json: bool) -> Result<(), CmdError> {
    require_root()?;
    let removed = testbed::clean_stale()?;
    if json {
        return print_json(&removed);
    }
    if removed.is_empty() {
        println!("nothing to remove");
    }
    for name in &removed {
        println!("removed {name}");
    }
    Ok(())
}
