//! `hanzod sim`: a training job on simulated nodes under scripted, seeded faults, in
//! simulated time (a ten-minute run takes well under a second). It is the harness of
//! [`crate`] behind a command line, for operators who want to see how the
//! orchestrator detects failures and repairs rings before they trust it with real nodes.

use std::time::Duration;

use hanzod_actors::events::Event;
use hanzod_actors::job::{JobEvent, JobPhase};
use hanzod_actors::types::NodeId;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::{Fault, FaultScript, Harness, HarnessConfig};
use hanzod_daemon::config::Config;

/// What to simulate (also the `hanzod sim` flags).
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Simulated nodes (the job's ring plus idle standbys).
    #[arg(long, default_value_t = 64)]
    pub nodes: usize,
    /// Nodes the job asks for (its ring size when enough are eligible).
    #[arg(long, default_value_t = 48)]
    pub job_nodes: u32,
    /// Epochs to train (1..=10000).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub epochs: u32,
    /// Ring members whose process is killed, at seeded times during the run.
    #[arg(long, default_value_t = 3)]
    pub crash: usize,
    /// Ring members that hang (stop heartbeating, never resume).
    #[arg(long, default_value_t = 1)]
    pub hang: usize,
    /// Additional random faults (hangs, flapping, slow heartbeats, disconnects, duplicate
    /// registrations, actor panics), drawn from the seed.
    #[arg(long, default_value_t = 0)]
    pub faults: usize,
    /// The seed of the run; the same seed replays it.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Why [`SimArgs`] describe no run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimArgsError {
    /// The job's ring cannot be formed from the nodes.
    #[error("need 2 <= --job-nodes ({job_nodes}) <= --nodes ({nodes})")]
    JobNodes {
        /// `--job-nodes`.
        job_nodes: u32,
        /// `--nodes`.
        nodes: usize,
    },
    /// More ring members would crash or hang than the ring has.
    #[error("--crash {crash} + --hang {hang} exceed the ring's {ring} members")]
    TooManyFaults {
        /// `--crash`.
        crash: usize,
        /// `--hang`.
        hang: usize,
        /// The ring size, `--job-nodes`.
        ring: u32,
    },
}

impl SimArgs {
    /// Checks that the arguments describe a run: a ring of 2 to `nodes` members, and no
    /// more crashed and hung members than the ring has (they are refused, not clamped).
    pub fn check(&self) -> Result<(), SimArgsError> {
        if self.job_nodes < 2 || self.nodes < self.job_nodes as usize {
            return Err(SimArgsError::JobNodes {
                job_nodes: self.job_nodes,
                nodes: self.nodes,
            });
        }
        if self.crash.saturating_add(self.hang) > self.job_nodes as usize {
            return Err(SimArgsError::TooManyFaults {
                crash: self.crash,
                hang: self.hang,
                ring: self.job_nodes,
            });
        }
        Ok(())
    }
}

/// One line of the run's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineEntry {
    /// Simulated ms since the job was submitted.
    pub at_ms: u64,
    /// What happened.
    pub what: String,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// The seed (replays the run).
    pub seed: u64,
    /// Simulated time the run took, ms.
    pub simulated_ms: u64,
    /// The job's final phase.
    pub phase: JobPhase,
    /// Checkpoints published, one per epoch.
    pub checkpoints: usize,
    /// The final ring version.
    pub ring_version: u64,
    /// Final ring size.
    pub ring_size: usize,
    /// Ring reconfigurations after formation.
    pub reconfigurations: usize,
    /// For each node the orchestrator declared failed: ms from the injected fault to the
    /// failure (detection), and from the failure to the ring without it (repair).
    pub detections: Vec<Detection>,
    /// Everything that happened, in order.
    pub timeline: Vec<TimelineEntry>,
    /// The orchestrator's counters at the end: (name, label, value).
    pub counters: Vec<(String, String, u64)>,
}

/// Detection and repair latency for one injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    /// The node (short id).
    pub node: String,
    /// The fault.
    pub fault: String,
    /// Fault → declared failed, ms.
    pub detect_ms: u64,
    /// Declared failed → ring without it recorded, ms (None when it was not in a ring).
    pub repair_ms: Option<u64>,
}

/// Runs a simulation. Call it on a runtime whose time is paused
/// (`tokio::runtime::Builder::start_paused(true)`) to run in simulated time.
pub async fn run(cfg: &Config, args: &SimArgs) -> SimReport {
    let mut hc = HarnessConfig::new(args.nodes).core(cfg.core.clone());
    // The simulation's log is its own, thrown away at the end: its job is job 1.
    hc.core.first_job_id = 1;
    hc.seed = args.seed;
    hc.print_seed = false;
    // A fixed start (2026-01-01T00:00:00Z): the same seed prints the same report.
    hc.start_at = Some(hanzod_actors::types::Timestamp(1_767_225_600_000));
    // Local training takes 20–60 s per epoch on each simulated node.
    hc.compute_ms = (20_000, 60_000);
    let mut h = Harness::start(hc).await;
    let start = tokio::time::Instant::now();
    let t0 = h.orch.clock().now();
    let mut spec = h.job_spec("sim", args.job_nodes, args.epochs);
    spec.min_nodes = 2.min(args.job_nodes);
    let job = match h.orch.submit_job(spec).await {
        Ok(j) => j,
        Err(e) => panic!("sim job refused: {e}"),
    };
    let ring = h
        .await_ring(job, Duration::from_secs(600), "ring formed", |r| {
            r.version == 1
        })
        .await
        .ok();

    // The fault script: crashes and hangs of ring members at seeded times in the first
    // epochs, plus random faults over the same horizon.
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0x51);
    // Faults land while the job trains: in the first 80 % of its expected duration.
    let horizon = 48_000 * u64::from(args.epochs.max(1));
    let mut members: Vec<usize> = ring
        .map(|r| r.members.iter().filter_map(|m| h.index_of(m)).collect())
        .unwrap_or_default();
    members.shuffle(&mut rng);
    let mut script = FaultScript::random(args.seed, args.nodes, args.faults, horizon);
    for (k, i) in members.iter().take(args.crash + args.hang).enumerate() {
        let fault = if k < args.crash {
            Fault::Crash(*i)
        } else {
            Fault::Hang(*i)
        };
        script.steps.push((rng.gen_range(0..horizon), fault));
    }
    script.steps.sort_by_key(|(t, _)| *t);
    let mut injected = vec![];
    for (at, fault) in &script.steps {
        tokio::time::sleep_until(start + Duration::from_millis(*at)).await;
        if h.orch.job(job).await.is_ok_and(|v| v.phase.is_terminal()) {
            break;
        }
        let _ = h.apply(fault).await;
        injected.push((start.elapsed().as_millis() as u64, fault.clone()));
    }
    // Every epoch ends by its deadline at the latest; allow all of them, twice over.
    let limit = Duration::from_millis(
        2 * u64::from(args.epochs.max(1)) * h.job_spec("", 2, 1).epoch_deadline_ms,
    );
    let _ = h.await_end(job, limit).await;
    let simulated_ms = start.elapsed().as_millis() as u64;
    let view = h.orch.job(job).await.ok();
    let phase = match &view {
        Some(v) => v.phase.clone(),
        None => JobPhase::Failed {
            reason: hanzod_actors::job::FailReason::Other("job not found".into()),
            phase: "unknown".into(),
            at: h.orch.clock().now(),
        },
    };
    let final_ring = view.as_ref().and_then(|v| v.ring.clone());

    // Timeline and latencies from the event log (every record is stamped by the clock,
    // which runs in simulated time).
    let mut timeline: Vec<TimelineEntry> = injected
        .iter()
        .map(|(at, f)| TimelineEntry {
            at_ms: *at,
            what: format!("inject {}", describe(&h, f)),
        })
        .collect();
    let mut failed_at: Vec<(NodeId, u64)> = vec![];
    let mut ring_changes: Vec<(Vec<NodeId>, u64)> = vec![];
    for r in h.records().await {
        let at_ms = r.at.0.saturating_sub(t0.0);
        let what = match r.event {
            Event::NodeFailed { node, kind } => {
                failed_at.push((node, at_ms));
                format!("node {} failed: {kind}", node.short())
            }
            Event::RingChanged {
                ring,
                removed,
                added,
            } => {
                ring_changes.push((removed.clone(), at_ms));
                format!(
                    "ring v{}: {} member(s), bottleneck {:.0} Mbit/s (-{} +{})",
                    ring.version,
                    ring.members.len(),
                    ring.bottleneck_mbps,
                    removed.len(),
                    added.len()
                )
            }
            Event::Job { event, .. } => match event {
                JobEvent::EpochComplete { epoch } => format!("epoch {epoch} complete"),
                JobEvent::CheckpointPublished {
                    epoch, checkpoint, ..
                } => {
                    format!("checkpoint {epoch} published: {checkpoint}")
                }
                JobEvent::Fail { reason } => format!("job failed: {reason}"),
                other => format!("job {}", other.name()),
            },
            _ => continue,
        };
        timeline.push(TimelineEntry { at_ms, what });
    }
    let reconfigurations = ring_changes.len().saturating_sub(1);
    // Every fault aimed at a node that led to the node being declared failed, the first per
    // node (a later one hits a node that is already gone): crashes, hangs, disconnects,
    // flapping, slow heartbeats, actor panics.
    let mut hit = std::collections::HashSet::new();
    let detections = injected
        .iter()
        .filter_map(|(at, f)| {
            let (Fault::Crash(i)
            | Fault::Hang(i)
            | Fault::Disconnect(i)
            | Fault::PanicNodeActor(i)
            | Fault::Flap { node: i, .. }
            | Fault::SlowHeartbeats { node: i, .. }) = f
            else {
                return None;
            };
            if !hit.insert(*i) {
                return None;
            }
            let id = h.node_id(*i);
            let (_, failed) = failed_at.iter().find(|(n, t)| *n == id && *t >= *at)?;
            let repair = ring_changes
                .iter()
                .find(|(removed, t)| removed.contains(&id) && *t >= *failed)
                .map(|(_, t)| t - failed);
            Some(Detection {
                node: id.short(),
                fault: describe(&h, f),
                detect_ms: failed - at,
                repair_ms: repair,
            })
        })
        .collect();
    timeline.sort_by_key(|e| e.at_ms);
    let report = SimReport {
        seed: args.seed,
        simulated_ms,
        phase,
        checkpoints: view.map_or(0, |v| v.checkpoints.len()),
        ring_version: final_ring.as_ref().map_or(0, |r| r.version),
        ring_size: final_ring.as_ref().map_or(0, |r| r.members.len()),
        reconfigurations,
        detections,
        timeline,
        counters: h.metrics.counters(),
    };
    h.orch.shutdown().await;
    report
}

fn describe(h: &Harness, f: &Fault) -> String {
    let node = |i: &usize| h.node_id(*i).short();
    match f {
        Fault::Crash(i) => format!("crash of node {}", node(i)),
        Fault::Disconnect(i) => format!("disconnect of node {}", node(i)),
        Fault::Hang(i) => format!("hang of node {}", node(i)),
        Fault::Resume(i) => format!("resume of node {}", node(i)),
        Fault::Rejoin(i) => format!("rejoin of node {}", node(i)),
        Fault::DuplicateRegistration(i) => format!("duplicate registration of node {}", node(i)),
        Fault::PanicNodeActor(i) => format!("panic of node {}'s actor", node(i)),
        Fault::Flap {
            node: i,
            down_ms,
            up_ms,
            cycles,
        } => format!(
            "flapping of node {} ({cycles}x {down_ms} ms down, {up_ms} ms up)",
            node(i)
        ),
        Fault::SlowHeartbeats {
            node: i,
            interval_ms,
        } => {
            format!(
                "slow heartbeats of node {} (every {interval_ms} ms)",
                node(i)
            )
        }
        Fault::PanicRingActor(j) => format!("panic of {j}'s ring actor"),
        Fault::PanicJobActor(j) => format!("panic of {j}'s actor"),
    }
}

fn phase_text(p: &JobPhase) -> String {
    match p {
        JobPhase::Running {
            epoch,
            ring_version,
        } => format!("running epoch {epoch} (ring v{ring_version})"),
        JobPhase::Aggregating { epoch, .. } => format!("aggregating epoch {epoch}"),
        JobPhase::Published { epochs, .. } => format!("published after {epochs} epoch(s)"),
        JobPhase::Failed { reason, .. } => format!("failed: {reason}"),
        other => other.name().to_lowercase(),
    }
}

/// Prints `report` for people.
pub fn print_human(report: &SimReport) {
    println!(
        "seed {}  simulated {:.1} s",
        report.seed,
        report.simulated_ms as f64 / 1000.0
    );
    for e in &report.timeline {
        println!("  {:>9.3} s  {}", e.at_ms as f64 / 1000.0, e.what);
    }
    println!();
    println!("detect: fault → declared failed (the timeout runs from the node's last heartbeat)");
    println!("repair: declared failed → new ring version recorded and sent to the members");
    println!("fault                         detect (s)  repair (ms)");
    for d in &report.detections {
        println!(
            "  {:<28} {:>9.3}  {:>10}",
            d.fault,
            d.detect_ms as f64 / 1000.0,
            d.repair_ms.map_or("-".into(), |r| r.to_string())
        );
    }
    println!();
    println!("counters");
    for (name, label, value) in &report.counters {
        println!("  {name}{{{label}}} {value}");
    }
    println!();
    println!(
        "job: {}; {} checkpoints; ring v{} with {} members after {} reconfigurations",
        phase_text(&report.phase),
        report.checkpoints,
        report.ring_version,
        report.ring_size,
        report.reconfigurations
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: usize, job_nodes: u32, crash: usize, hang: usize) -> SimArgs {
        SimArgs {
            nodes,
            job_nodes,
            epochs: 1,
            crash,
            hang,
            faults: 0,
            seed: 1,
        }
    }

    /// Regression: more crashes than ring members were clamped silently.
    #[test]
    fn sim_refuses_more_crashes_than_members() {
        assert_eq!(args(64, 48, 3, 1).check(), Ok(()));
        assert_eq!(args(8, 8, 6, 2).check(), Ok(()));
        assert_eq!(
            args(8, 4, 4, 1).check(),
            Err(SimArgsError::TooManyFaults {
                crash: 4,
                hang: 1,
                ring: 4
            })
        );
        assert_eq!(
            args(4, 8, 0, 0).check(),
            Err(SimArgsError::JobNodes {
                job_nodes: 8,
                nodes: 4
            })
        );
        assert!(args(4, 1, 0, 0).check().is_err());
    }
}
