//! [`Children`]: the bookkeeping every supervisor shares (DESIGN §2). ractor has no restart
//! policy of its own: a supervisor maps each child's actor id back to the key it rebuilds
//! the child from (a job id, a node id, a subsystem), and keeps one [`RestartBudget`] per
//! key, across rebuilds, to decide whether and after what backoff to rebuild it.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use ractor::{ActorId, ActorRef, SupervisionEvent};

use crate::config::SupervisionConfig;
use crate::supervision::{RestartBudget, RestartDecision};
use crate::types::Timestamp;

/// A child that stopped: which one, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit<K> {
    /// The key the child was adopted under.
    pub key: K,
    /// Whether it failed (panicked or returned an error) rather than stopped.
    pub failed: bool,
    /// The failure, or the stop reason (`"stopped"` when none was given).
    pub why: String,
}

/// The children of one supervisor, by key `K`.
#[derive(Debug)]
pub struct Children<K> {
    cfg: SupervisionConfig,
    by_actor: HashMap<ActorId, K>,
    budgets: HashMap<K, RestartBudget>,
}

impl<K: Clone + Eq + Hash> Children<K> {
    /// No children yet; each key's budget follows `cfg`.
    pub fn new(cfg: SupervisionConfig) -> Self {
        Children {
            cfg,
            by_actor: HashMap::new(),
            budgets: HashMap::new(),
        }
    }

    /// Records that actor `id` is the child for `key` (a first start or a rebuild; the
    /// key's budget is kept across rebuilds).
    pub fn adopt(&mut self, key: K, id: ActorId) {
        self.budgets
            .entry(key.clone())
            .or_insert_with(|| RestartBudget::new(self.cfg.clone()));
        self.by_actor.insert(id, key);
    }

    /// Forgets `key` for good, budget included (the job ended, the node was removed).
    pub fn forget(&mut self, key: &K) {
        self.by_actor.retain(|_, k| k != key);
        self.budgets.remove(key);
    }

    /// The child a supervision event is about, if it is one of ours and it stopped or
    /// failed; its actor id is forgotten. Other events (spawns, process-group changes) and
    /// actors this supervisor did not adopt give `None`.
    pub fn exited(&mut self, event: &SupervisionEvent) -> Option<Exit<K>> {
        let (cell, failed, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, true, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                false,
                reason.clone().unwrap_or_else(|| "stopped".into()),
            ),
            _ => return None,
        };
        let key = self.by_actor.remove(&cell.get_id())?;
        Some(Exit { key, failed, why })
    }

    /// The child a supervision event reports failed (panicked or returned an error), with
    /// why; a child that stopped is forgotten and gives `None`, as do other events.
    pub fn failed(&mut self, event: &SupervisionEvent) -> Option<(K, String)> {
        self.exited(event)
            .and_then(|e| e.failed.then_some((e.key, e.why)))
    }

    /// Spends one restart of `key`'s budget at `now`: rebuild after the backoff, or give
    /// up ([`RestartBudget::on_failure`]).
    pub fn on_failure(&mut self, key: &K, now: Timestamp) -> RestartDecision {
        self.budgets
            .entry(key.clone())
            .or_insert_with(|| RestartBudget::new(self.cfg.clone()))
            .on_failure(now)
    }
}

/// Carries out `decision` for a supervisor `myself`: sends it `respawn()` after the backoff
/// and returns `true`, or returns `false` when the budget is spent (the caller gives up).
pub fn schedule_respawn<M: ractor::Message>(
    myself: &ActorRef<M>,
    decision: RestartDecision,
    respawn: impl FnOnce() -> M + Send + 'static,
) -> bool {
    match decision {
        RestartDecision::RestartAfter(ms) => {
            myself.send_after(Duration::from_millis(ms), respawn);
            true
        }
        RestartDecision::GiveUp => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_per_key_and_survives_rebuilds_until_forgotten() {
        let mut c: Children<u32> = Children::new(crate::supervision::test_config(2));
        let t = Timestamp(0);
        assert_eq!(c.on_failure(&1, t), RestartDecision::RestartAfter(10));
        assert_eq!(c.on_failure(&1, t), RestartDecision::RestartAfter(20));
        assert_eq!(c.on_failure(&1, t), RestartDecision::GiveUp);
        // Another key has its own budget.
        assert_eq!(c.on_failure(&2, t), RestartDecision::RestartAfter(10));
        // Forgotten, key 1 starts afresh.
        c.forget(&1);
        assert_eq!(c.on_failure(&1, t), RestartDecision::RestartAfter(10));
    }
}
