//! The pure core of one node's liveness: heartbeat acceptance (sequence numbers and the
//! replay window), the failure deadline, and uptime accounting. The `NodeActor` is a thin
//! shell that feeds heartbeats and timer ticks into a [`NodeCore`].

use serde::{Deserialize, Serialize};

use crate::config::HeartbeatConfig;
use crate::types::{NodeId, NodeInfo, Timestamp};
use crate::uptime::UptimeTracker;

/// A heartbeat as the core sees it (paper §4.4). The transport has already checked the
/// node's signature over it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The sender.
    pub node: NodeId,
    /// Strictly increasing within a registration session, starting at any value.
    pub seq: u64,
    /// The node's clock when it sent the heartbeat, ms since the Unix epoch.
    pub timestamp: Timestamp,
    /// GPU utilisation as a fraction in [0, 1].
    pub gpu_utilization: f32,
    /// GPU memory in use, bytes.
    pub memory_used: u64,
    /// The node's current local training step.
    pub current_step: u64,
}

/// Why a heartbeat was refused. Every refusal is counted by reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum HeartbeatError {
    /// The node never registered.
    #[error("node is not registered")]
    UnknownNode,
    /// The node was declared failed; it must register again before heartbeating.
    #[error("node was declared failed; register again")]
    Failed,
    /// Replay or reordering: the sequence number is not above the last accepted one.
    #[error("stale heartbeat sequence {got} (last accepted {last})")]
    StaleSequence {
        /// Last accepted sequence number.
        last: u64,
        /// The refused one.
        got: u64,
    },
    /// The timestamp is outside the replay window around the orchestrator's clock.
    #[error(
        "heartbeat timestamp is {skew_ms} ms from the orchestrator's clock (window {window_ms} ms)"
    )]
    OutsideWindow {
        /// Signed difference heartbeat − orchestrator, ms.
        skew_ms: i64,
        /// The allowed window, ms.
        window_ms: u64,
    },
    /// A field is out of range.
    #[error("invalid heartbeat field {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl HeartbeatError {
    /// A short snake_case label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            HeartbeatError::UnknownNode => "unknown_node",
            HeartbeatError::Failed => "failed",
            HeartbeatError::StaleSequence { .. } => "stale_sequence",
            HeartbeatError::OutsideWindow { .. } => "outside_window",
            HeartbeatError::Invalid { .. } => "invalid",
        }
    }
}

/// Liveness of a node as the orchestrator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Liveness {
    /// Heartbeating within the timeout.
    Alive,
    /// Declared failed; waiting for it to register again.
    Failed,
}

/// One node's liveness state machine.
#[derive(Debug, Clone)]
pub struct NodeCore {
    info: NodeInfo,
    liveness: Liveness,
    last_seq: Option<u64>,
    last_heard: Timestamp,
    uptime: UptimeTracker,
    cfg: HeartbeatConfig,
    heartbeats: u64,
    sessions: u32,
}

impl NodeCore {
    /// A node admitted at `now`; it is alive and must heartbeat within the timeout.
    pub fn new(
        info: NodeInfo,
        cfg: HeartbeatConfig,
        uptime_window_ms: u64,
        now: Timestamp,
    ) -> Self {
        let mut uptime = UptimeTracker::new(uptime_window_ms, now);
        uptime.record_heartbeat(now, cfg.timeout_ms);
        NodeCore {
            info,
            liveness: Liveness::Alive,
            last_seq: None,
            last_heard: now,
            uptime,
            cfg,
            heartbeats: 0,
            sessions: 1,
        }
    }

    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.info.id
    }

    /// The node's declared info.
    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    /// Current liveness.
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// Heartbeats accepted since admission.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats
    }

    /// Registration sessions (1 + re-registrations).
    pub fn sessions(&self) -> u32 {
        self.sessions
    }

    /// When the node fails if nothing more is heard: last heard + timeout.
    pub fn deadline(&self) -> Timestamp {
        self.last_heard.plus_ms(self.cfg.timeout_ms)
    }

    /// A new registration of the same key: new info, a new heartbeat session (sequence
    /// numbers restart), alive again. Uptime history is kept.
    pub fn reregister(&mut self, info: NodeInfo, now: Timestamp) {
        self.info = info;
        self.last_seq = None;
        self.last_heard = now;
        self.liveness = Liveness::Alive;
        self.sessions += 1;
        self.uptime.record_heartbeat(now, self.cfg.timeout_ms);
    }

    /// Accepts or refuses a heartbeat received at `now`. A refused heartbeat changes nothing.
    pub fn on_heartbeat(&mut self, hb: &Heartbeat, now: Timestamp) -> Result<(), HeartbeatError> {
        if hb.node != self.info.id {
            return Err(HeartbeatError::UnknownNode);
        }
        if !(hb.gpu_utilization.is_finite() && (0.0..=1.0).contains(&hb.gpu_utilization)) {
            return Err(HeartbeatError::Invalid {
                field: "gpu_utilization",
                reason: format!("{} is not in [0, 1]", hb.gpu_utilization),
            });
        }
        if self.liveness == Liveness::Failed {
            return Err(HeartbeatError::Failed);
        }
        if let Some(last) = self.last_seq {
            if hb.seq <= last {
                return Err(HeartbeatError::StaleSequence { last, got: hb.seq });
            }
        }
        let skew = hb.timestamp.0 as i128 - now.0 as i128;
        if skew.unsigned_abs() > self.cfg.replay_window_ms as u128 {
            return Err(HeartbeatError::OutsideWindow {
                skew_ms: skew.clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                window_ms: self.cfg.replay_window_ms,
            });
        }
        self.last_seq = Some(hb.seq);
        self.last_heard = now;
        self.heartbeats += 1;
        self.uptime.record_heartbeat(now, self.cfg.timeout_ms);
        Ok(())
    }

    /// True when the node is alive but nothing was heard for the timeout or longer.
    pub fn is_overdue(&self, now: Timestamp) -> bool {
        self.liveness == Liveness::Alive && now >= self.deadline()
    }

    /// Declares the node failed at `now` (timeout, closed session, crashed actor).
    /// Returns false when it already was.
    pub fn mark_failed(&mut self, now: Timestamp) -> bool {
        if self.liveness == Liveness::Failed {
            return false;
        }
        self.liveness = Liveness::Failed;
        self.uptime.record_down(now);
        true
    }

    /// Uptime over the window at `now`, a fraction in [0, 1] ([`UptimeTracker::uptime`]).
    pub fn uptime(&self, now: Timestamp) -> f64 {
        self.uptime.uptime(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn core(now: u64) -> NodeCore {
        let info = NodeInfo {
            id: NodeId([7; 32]),
            ..Default::default()
        };
        NodeCore::new(info, HeartbeatConfig::default(), 86_400_000, Timestamp(now))
    }

    fn hb(seq: u64, ts: u64) -> Heartbeat {
        Heartbeat {
            node: NodeId([7; 32]),
            seq,
            timestamp: Timestamp(ts),
            gpu_utilization: 0.5,
            memory_used: 0,
            current_step: 0,
        }
    }

    #[test]
    fn replayed_sequence_is_refused() {
        let mut n = core(1_000_000);
        n.on_heartbeat(&hb(5, 1_000_000), Timestamp(1_000_000))
            .unwrap();
        assert_eq!(
            n.on_heartbeat(&hb(5, 1_010_000), Timestamp(1_010_000)),
            Err(HeartbeatError::StaleSequence { last: 5, got: 5 })
        );
        n.on_heartbeat(&hb(6, 1_010_000), Timestamp(1_010_000))
            .unwrap();
    }

    #[test]
    fn timestamp_outside_window_is_refused() {
        let mut n = core(1_000_000);
        let err = n
            .on_heartbeat(&hb(1, 900_000), Timestamp(1_000_000))
            .unwrap_err();
        assert!(matches!(
            err,
            HeartbeatError::OutsideWindow {
                skew_ms: -100_000,
                ..
            }
        ));
    }

    #[test]
    fn failed_node_must_reregister() {
        let mut n = core(0);
        assert!(!n.is_overdue(Timestamp(29_999)));
        assert!(n.is_overdue(Timestamp(30_000)));
        assert!(n.mark_failed(Timestamp(30_000)));
        assert_eq!(
            n.on_heartbeat(&hb(1, 31_000), Timestamp(31_000)),
            Err(HeartbeatError::Failed)
        );
        n.reregister(n.info().clone(), Timestamp(32_000));
        n.on_heartbeat(&hb(1, 32_000), Timestamp(32_000)).unwrap();
        assert_eq!(n.sessions(), 2);
    }

    proptest! {
        /// Whatever arrives, accepted sequence numbers strictly increase and the deadline
        /// never moves backwards.
        #[test]
        fn accepted_sequences_increase(msgs in proptest::collection::vec((0u64..50, 0u64..120_000, 0u64..20_000), 1..80)) {
            let mut n = core(60_000);
            let mut now = 60_000u64;
            let mut accepted = vec![];
            let mut deadline = n.deadline();
            for (seq, ts, dt) in msgs {
                now += dt;
                if n.on_heartbeat(&hb(seq, ts), Timestamp(now)).is_ok() {
                    accepted.push(seq);
                    prop_assert!((ts as i128 - now as i128).abs() <= 30_000);
                }
                prop_assert!(n.deadline() >= deadline);
                deadline = n.deadline();
            }
            prop_assert!(accepted.windows(2).all(|w| w[0] < w[1]));
        }
    }
}
