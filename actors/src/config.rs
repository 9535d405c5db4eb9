//! The core's settings: one serde tree, every field defaulted, unknown keys rejected.
//! `hanzod` embeds `config/default.toml` whose `[core]` table deserializes into [`CoreConfig`].

use serde::{Deserialize, Serialize};

use crate::sched::EligibilityRules;
use crate::types::GymWei;

/// All settings of the actor core.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoreConfig {
    /// Heartbeat protocol (paper §4.4).
    pub heartbeat: HeartbeatConfig,
    /// Node eligibility (paper §3.3).
    pub eligibility: EligibilityConfig,
    /// Scheduler.
    pub scheduler: SchedulerConfig,
    /// Ring construction and recovery.
    pub ring: RingConfig,
    /// Supervision: restart budget and backoff.
    pub supervision: SupervisionConfig,
    /// Link probing (DESIGN §4).
    pub probe: ProbeConfig,
    /// Ring aggregation (DESIGN §6.4).
    pub aggregation: AggregationConfig,
    /// Deadline of every actor-to-actor call, in ms.
    pub call_timeout_ms: u64,
    /// How long an epoch's publication (validate, merge, publish, settle: the
    /// [`CheckpointSink`](crate::ports::CheckpointSink)) may take before the job fails with
    /// `PublicationFailed`, in ms (counted from the epoch's aggregation, so a sink that
    /// publishes jobs one after another counts the wait for its turn too). It runs beside
    /// the job actor, which keeps answering.
    pub publish_deadline_ms: u64,
    /// The id of the first job of a fresh (empty) event log; 0 draws it from the clock at
    /// start ([`crate::replay::first_job_id_from_clock`]: the seconds since 2025-01-01 UTC),
    /// so an orchestrator restarted on a fresh log (the in-memory one) never hands out an id
    /// an earlier run used. A log that holds jobs continues after its highest id either
    /// way. [`Orchestrator::start`](crate::Orchestrator) resolves 0, so a running
    /// orchestrator's [`config`](crate::OrchestratorHandle::config) holds the id drawn.
    /// At most [`CoreConfig::MAX_FIRST_JOB_ID`].
    pub first_job_id: u64,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            heartbeat: HeartbeatConfig::default(),
            eligibility: EligibilityConfig::default(),
            scheduler: SchedulerConfig::default(),
            ring: RingConfig::default(),
            supervision: SupervisionConfig::default(),
            probe: ProbeConfig::default(),
            aggregation: AggregationConfig::default(),
            call_timeout_ms: 5_000,
            publish_deadline_ms: 3_600_000,
            first_job_id: 0,
        }
    }
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("core.{key}: {reason}")]
pub struct ConfigError {
    /// The key, e.g. `heartbeat.timeout_ms`.
    pub key: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl CoreConfig {
    /// The largest accepted `first_job_id`, 2^53 − 1: ids stay exact as JSON numbers (and
    /// far from overflowing).
    pub const MAX_FIRST_JOB_ID: u64 = (1 << 53) - 1;

    /// Checks every setting's range and the relations between them (a timeout shorter
    /// than the interval would fail every node). Called by the builder before starting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, reason: &str| {
            Err(ConfigError {
                key,
                reason: reason.to_string(),
            })
        };
        if self.publish_deadline_ms == 0 {
            return err("publish_deadline_ms", "must be > 0");
        }
        let hb = &self.heartbeat;
        if hb.interval_ms == 0 {
            return err("heartbeat.interval_ms", "must be > 0");
        }
        if hb.timeout_ms <= hb.interval_ms {
            return err(
                "heartbeat.timeout_ms",
                "must be longer than heartbeat.interval_ms (a node would fail between two heartbeats)",
            );
        }
        if hb.replay_window_ms == 0 {
            return err("heartbeat.replay_window_ms", "must be > 0");
        }
        let el = &self.eligibility;
        if !(0.0..=1.0).contains(&el.min_uptime) {
            return err("eligibility.min_uptime", "must be a fraction in [0, 1]");
        }
        if el.uptime_window_ms == 0 {
            return err("eligibility.uptime_window_ms", "must be > 0");
        }
        if self.scheduler.tick_ms == 0 {
            return err("scheduler.tick_ms", "must be > 0");
        }
        if !(self.ring.cross_region_factor.is_finite() && self.ring.cross_region_factor >= 0.0) {
            return err("ring.cross_region_factor", "must be a finite number >= 0");
        }
        let sup = &self.supervision;
        if sup.max_restarts == 0 {
            return err("supervision.max_restarts", "must be >= 1");
        }
        if sup.backoff_base_ms > sup.backoff_max_ms {
            return err(
                "supervision.backoff_base_ms",
                "must not exceed supervision.backoff_max_ms",
            );
        }
        if self.probe.peers_per_node > ProbeConfig::MAX_PEERS_PER_NODE {
            return err(
                "probe.peers_per_node",
                "must be at most 1024 (each admission sends 2 requests per peer)",
            );
        }
        let rows = self.aggregation.sketch_rows;
        if !(16..=32_768).contains(&rows) || !rows.is_power_of_two() {
            return err(
                "aggregation.sketch_rows",
                "must be a power of two in 16..=32768",
            );
        }
        for (key, v) in [
            ("aggregation.sketch_ms", self.aggregation.sketch_ms),
            ("aggregation.upload_ms", self.aggregation.upload_ms),
        ] {
            if v == 0 {
                return err(key, "must be > 0");
            }
        }
        if !(self.aggregation.reduce_slack.is_finite() && self.aggregation.reduce_slack >= 1.0) {
            return err("aggregation.reduce_slack", "must be finite and >= 1");
        }
        if self.call_timeout_ms == 0 {
            return err("call_timeout_ms", "must be > 0");
        }
        if self.first_job_id > Self::MAX_FIRST_JOB_ID {
            return err(
                "first_job_id",
                "must be at most 2^53 - 1 (job ids stay exact in JSON); 0 draws it from the clock",
            );
        }
        Ok(())
    }
}

/// Heartbeat protocol (paper §4.4, DESIGN §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeartbeatConfig {
    /// How often nodes send a heartbeat, in ms (10 s).
    pub interval_ms: u64,
    /// A node with no heartbeat for this long is failed, in ms (30 s = 3 missed heartbeats).
    pub timeout_ms: u64,
    /// A heartbeat's timestamp must be within this many ms of the orchestrator's clock,
    /// either side, or it is rejected as a replay.
    pub replay_window_ms: u64,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            interval_ms: 10_000,
            timeout_ms: 30_000,
            replay_window_ms: 30_000,
        }
    }
}

/// Node eligibility (paper §3.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EligibilityConfig {
    /// Minimum stake in whole GYM (10,000).
    pub min_stake_gym: u64,
    /// Minimum uptime over the window, as a fraction (0.95).
    pub min_uptime: f64,
    /// The uptime window in ms (24 h).
    pub uptime_window_ms: u64,
}

impl Default for EligibilityConfig {
    fn default() -> Self {
        EligibilityConfig {
            min_stake_gym: 10_000,
            min_uptime: 0.95,
            uptime_window_ms: 24 * 3_600_000,
        }
    }
}

impl EligibilityConfig {
    /// The rules the scheduling policy applies.
    pub fn rules(&self) -> EligibilityRules {
        EligibilityRules {
            min_stake: GymWei::gym(self.min_stake_gym),
            min_uptime: self.min_uptime,
        }
    }
}

/// Scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// How often pending jobs are matched against nodes, in ms (also on every submission
    /// and registration).
    pub tick_ms: u64,
    /// τ of the aging priority `s·u·(1 + t/τ)`, in ms (DESIGN §12).
    pub aging_tau_ms: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            tick_ms: 1_000,
            aging_tau_ms: 600_000,
        }
    }
}

/// Which ring builder a job uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RingBuilderKind {
    /// Bottleneck-threshold search with Hamiltonian-cycle heuristic and polish (default).
    #[default]
    Threshold,
    /// The paper's Algorithm 1 (greedy + 2-opt), kept as a baseline.
    Algorithm1,
}

/// Ring construction and recovery (DESIGN §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RingConfig {
    /// The coalescing window, ms (DESIGN §4). Leading edge: a failure reported while no
    /// window is open is applied at once and opens the window; failures reported within it
    /// are applied together as one more reconfiguration when it closes. A lone failure is
    /// never delayed; a burst within one window is at most two reconfigurations.
    pub coalesce_ms: u64,
    /// The builder.
    pub builder: RingBuilderKind,
    /// Estimated cross-region link = min(up, down) × this factor (same region: × 1).
    pub cross_region_factor: f32,
    /// Every this many ms the current ring is sent again to its members, so one that
    /// missed an update converges (0: never). Default: the heartbeat interval.
    pub resync_ms: u64,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            coalesce_ms: 200,
            builder: RingBuilderKind::Threshold,
            cross_region_factor: 0.5,
            resync_ms: 10_000,
        }
    }
}

/// Ring aggregation's tunables (DESIGN §6.4, [`crate::aggregation`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregationConfig {
    /// Rows `k` of every sketch: a power of two in 16..=32768 (256: the norm estimate's
    /// relative standard deviation is √(2/k) = 8.8 %).
    pub sketch_rows: u32,
    /// From a seed's reveal to every sketch (and the spot-checked deltas' uploads), ms.
    pub sketch_ms: u64,
    /// From asking a member for the round's result (or, after a fallback to the star, for
    /// its delta) to the upload, ms.
    pub upload_ms: u64,
    /// A round's budget is `floor_ms + slack × 2(n−1)/n × bytes × 8 / bottleneck`
    /// ([`crate::aggregation::reduce_budget`]): the slack (≥ 1).
    pub reduce_slack: f64,
    /// … and the floor, ms.
    pub reduce_floor_ms: u64,
}

impl Default for AggregationConfig {
    fn default() -> Self {
        AggregationConfig {
            sketch_rows: 256,
            sketch_ms: 120_000,
            upload_ms: 120_000,
            reduce_slack: 4.0,
            reduce_floor_ms: 30_000,
        }
    }
}

/// Supervision: how failed actors are rebuilt (quickwit-style restart budget).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisionConfig {
    /// At most this many restarts of one child …
    pub max_restarts: u32,
    /// … within this many ms; past it the child is given up (its node/job is failed).
    pub window_ms: u64,
    /// First restart delay in ms; doubles per restart in the window.
    pub backoff_base_ms: u64,
    /// Cap of the restart delay in ms.
    pub backoff_max_ms: u64,
}

impl Default for SupervisionConfig {
    fn default() -> Self {
        SupervisionConfig {
            max_restarts: 5,
            window_ms: 60_000,
            backoff_base_ms: 50,
            backoff_max_ms: 5_000,
        }
    }
}

/// Link probing (DESIGN §4: nodes probe each other on the orchestrator's request).
///
/// After each admission (first registration or re-registration) the registry asks the node
/// and up to `peers_per_node` live peers to measure the links between them, unmeasured
/// pairs and same-region peers first ([`crate::ring::plan_probes`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeConfig {
    /// The most peers probed per admitted node; each costs up to two probe requests (one
    /// per direction). 0 disables probing (every link stays estimated unless reported).
    /// At most [`ProbeConfig::MAX_PEERS_PER_NODE`].
    pub peers_per_node: u32,
}

impl ProbeConfig {
    /// The largest accepted `peers_per_node` (1024), bounding one admission's fan-out.
    pub const MAX_PEERS_PER_NODE: u32 = 1024;
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig { peers_per_node: 8 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        CoreConfig::default().validate().unwrap();
        type Setter = Box<dyn Fn(&mut CoreConfig)>;
        let cases: Vec<(&str, Setter)> = vec![
            (
                "heartbeat.interval_ms",
                Box::new(|c| c.heartbeat.interval_ms = 0),
            ),
            (
                "heartbeat.timeout_ms",
                Box::new(|c| c.heartbeat.timeout_ms = 5_000),
            ),
            (
                "eligibility.min_uptime",
                Box::new(|c| c.eligibility.min_uptime = 7.5),
            ),
            ("call_timeout_ms", Box::new(|c| c.call_timeout_ms = 0)),
            (
                "ring.cross_region_factor",
                Box::new(|c| c.ring.cross_region_factor = f32::NAN),
            ),
            (
                "supervision.backoff_base_ms",
                Box::new(|c| c.supervision.backoff_base_ms = 10_000),
            ),
            (
                "probe.peers_per_node",
                Box::new(|c| c.probe.peers_per_node = 1_025),
            ),
            ("first_job_id", Box::new(|c| c.first_job_id = 1 << 53)),
        ];
        for (key, set) in cases {
            let mut c = CoreConfig::default();
            set(&mut c);
            assert_eq!(c.validate().unwrap_err().key, key);
        }
        let mut off = CoreConfig::default();
        off.probe.peers_per_node = 0;
        off.validate().unwrap();
    }
}
