//! How epochs, their outcomes and ring changes read for people, in `hanzod job status` and
//! `job watch`: pure functions from the wire messages to lines, with their JSON forms.
//!
//! One numbering everywhere: an epoch is named by its 0-based index, as in the job's phase,
//! the repo names (`…-epoch-4`), the publication records and the demo. Counts are counts:
//! "2/5 published" while epoch 2 trains.

use std::collections::BTreeMap;

use hanzod_actors::job::EpochOutcome;
use hanzod_proto::v1 as pb;
use hanzod_protocol::human::{duration, gym_str as gym};
use serde::Serialize;

/// One published epoch, as printed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochOut {
    /// The epoch, 0-based.
    pub epoch: u32,
    /// Its checkpoint's CID (the previous epoch's when kept).
    pub checkpoint: String,
    /// `advanced` or `kept`.
    pub outcome: &'static str,
    /// The aggregator, when advanced.
    pub aggregator: Option<String>,
    /// Why the previous checkpoint was kept, when it was.
    pub kept_reason: Option<String>,
    /// Validation loss before and after.
    pub loss_before: f64,
    /// Validation loss of the published checkpoint.
    pub loss_after: f64,
    /// Deltas accepted (suspect ones included).
    pub accepted: u32,
    /// Accepted deltas marked suspect.
    pub suspect: u32,
    /// Deltas rejected.
    pub rejected: u32,
    /// Spot-checks run.
    pub spot_checked: u32,
    /// Spot-checks failed.
    pub spot_checks_failed: u32,
    /// Nodes paid.
    pub rewarded_nodes: u32,
    /// Rewards paid in total, GYM wei (decimal).
    pub rewards_gym_wei: String,
    /// Nodes slashed.
    pub slashed_nodes: u32,
    /// Stake slashed in total, GYM wei (decimal).
    pub slashed_gym_wei: String,
    /// The Hub repo id, when published as one.
    pub repo: Option<String>,
    /// Why the registry refused the checkpoint.
    pub registry_error: Option<String>,
    /// Why the settlement failed (retried by the orchestrator).
    pub settlement_error: Option<String>,
}

fn some(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// Converts a wire epoch summary.
pub fn epoch_out(s: &pb::EpochSummary) -> EpochOut {
    EpochOut {
        epoch: s.epoch,
        checkpoint: s.checkpoint.clone(),
        outcome: if s.advanced { "advanced" } else { "kept" },
        aggregator: some(&s.aggregator),
        kept_reason: some(&s.kept_reason),
        loss_before: s.loss_before,
        loss_after: s.loss_after,
        accepted: s.accepted,
        suspect: s.suspect,
        rejected: s.rejected,
        spot_checked: s.spot_checked,
        spot_checks_failed: s.spot_checks_failed,
        rewarded_nodes: s.rewarded_nodes,
        rewards_gym_wei: s.rewards_gym_wei.clone(),
        slashed_nodes: s.slashed_nodes,
        slashed_gym_wei: s.slashed_gym_wei.clone(),
        repo: some(&s.repo),
        registry_error: some(&s.registry_error),
        settlement_error: some(&s.settlement_error),
    }
}

/// Whether the job's training improved the model, stopped improving, got worse or never
/// trained, in one line ([`hanzod_actors::job::Progress`]), from its wire epoch summaries:
/// `trained: loss 2.042 → 0.601 (best, epoch 4)`. A summary the daemon sent malformed
/// gives `progress unknown: <why>`.
pub fn training_progress(summaries: &[pb::EpochSummary]) -> String {
    match summaries
        .iter()
        .map(hanzod_protocol::convert::epoch_summary_from_wire)
        .collect::<Result<BTreeMap<_, _>, _>>()
    {
        Ok(summaries) => hanzod_actors::job::progress(&summaries).to_string(),
        Err(e) => format!("progress unknown: {e}"),
    }
}

/// The lines of one published epoch: its outcome, then what was validated and paid, then
/// what went wrong in publication, if anything.
///
/// ```text
/// epoch 1: advanced (weighted-mean), validation loss 0.8123 → 0.7011
///   deltas: 4 accepted (1 suspect), 0 rejected; spot-checks: 2, 0 failed
///   rewards at publication: 100 GYM to 3 nodes; slashed: none
///   checkpoint bafkrei…
/// ```
pub fn epoch_lines(e: &EpochOut) -> Vec<String> {
    let outcome = match (&e.aggregator, &e.kept_reason) {
        (Some(a), _) if e.outcome == "advanced" => EpochOutcome::Advanced {
            aggregator: a.clone(),
        }
        .to_string(),
        (_, Some(r)) => EpochOutcome::Kept { reason: r.clone() }.to_string(),
        _ => e.outcome.to_string(),
    };
    let mut lines = vec![
        format!(
            "epoch {}: {outcome}, validation loss {:.4} → {:.4}",
            e.epoch, e.loss_before, e.loss_after
        ),
        format!(
            "  deltas: {} accepted ({} suspect), {} rejected; spot-checks: {}, {} failed",
            e.accepted, e.suspect, e.rejected, e.spot_checked, e.spot_checks_failed
        ),
        format!(
            "  rewards at publication: {}; slashed: {}",
            amount(&e.rewards_gym_wei, "to", e.rewarded_nodes),
            amount(&e.slashed_gym_wei, "from", e.slashed_nodes)
        ),
    ];
    let repo = e
        .repo
        .as_ref()
        .map(|r| format!(", repo {r}"))
        .unwrap_or_default();
    lines.push(format!("  checkpoint {}{repo}", e.checkpoint));
    if let Some(why) = &e.registry_error {
        lines.push(format!("  registry refused the checkpoint: {why}"));
    }
    if let Some(why) = &e.settlement_error {
        lines.push(format!(
            "  settlement failed at publication (the orchestrator retries it): {why}"
        ));
    }
    lines
}

/// `100 GYM to 3 nodes`, or `none` for no node.
fn amount(wei: &str, preposition: &str, nodes: u32) -> String {
    if nodes == 0 {
        return "none".into();
    }
    format!("{} {preposition} {nodes} node{}", gym(wei), plural(nodes))
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The first 8 hex digits of a node id.
pub fn short_id(id: &[u8]) -> String {
    short(&hex::encode(id)).to_string()
}

/// The first 8 characters of a hex node id.
pub fn short(hex_id: &str) -> &str {
    &hex_id[..hex_id.len().min(8)]
}

/// A ring change in `job watch`, from the change itself (the job's view may still show
/// the previous ring): `ring v3: 4 members; removed 1a2b3c4d; added 5e6f7a8b; repaired in
/// 206 ms`, or `ring v1 formed: 4 members` for a first ring.
pub fn ring_change_line(c: &pb::RingChange) -> String {
    let ids = |v: &[Vec<u8>]| v.iter().map(|n| short_id(n)).collect::<Vec<_>>().join(", ");
    let (version, members) = (c.version, c.members);
    if version <= 1 {
        let dead = if c.removed.is_empty() {
            String::new()
        } else {
            format!(
                " (left out, failed or out of standing: {})",
                ids(&c.removed)
            )
        };
        return format!("ring v{version} formed: {members} members{dead}");
    }
    let mut parts = vec![format!("ring v{version}: {members} members")];
    if !c.removed.is_empty() {
        parts.push(format!("removed {}", ids(&c.removed)));
    }
    if !c.added.is_empty() {
        parts.push(format!("added {}", ids(&c.added)));
    }
    parts.push(match c.repair_ms {
        Some(ms) => format!("repaired in {}", duration(ms)),
        None => "repaired by a rebuilt ring manager".into(),
    });
    parts.join("; ")
}

/// Where a job is in its epochs: `epoch 2, 2/5 published` while epoch 2 trains or is
/// aggregated, `5/5 published` at the end, empty before the first epoch.
pub fn progress(phase: &str, epoch: Option<u32>, epochs: u32, published: usize) -> String {
    match (phase, epoch) {
        ("Running" | "Aggregating", Some(e)) => {
            format!("epoch {e}, {published}/{epochs} published")
        }
        ("Published", _) => format!("{published}/{epochs} epochs"),
        _ if published > 0 => format!("{published}/{epochs} published"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> pb::EpochSummary {
        pb::EpochSummary {
            epoch: 1,
            checkpoint: "bafkreiabc".into(),
            advanced: true,
            aggregator: "weighted-mean".into(),
            loss_before: 0.81234,
            loss_after: 0.70111,
            accepted: 4,
            suspect: 1,
            rejected: 1,
            spot_checked: 2,
            spot_checks_failed: 1,
            rewarded_nodes: 3,
            rewards_gym_wei: "100000000000000000000".into(),
            slashed_nodes: 1,
            slashed_gym_wei: "500000000000000000000".into(),
            ..Default::default()
        }
    }

    #[test]
    fn an_advanced_epoch_names_its_aggregator_losses_verdicts_and_payments() {
        let lines = epoch_lines(&epoch_out(&summary()));
        assert_eq!(
            lines,
            [
                "epoch 1: advanced (weighted-mean), validation loss 0.8123 → 0.7011",
                "  deltas: 4 accepted (1 suspect), 1 rejected; spot-checks: 2, 1 failed",
                "  rewards at publication: 100 GYM to 3 nodes; slashed: 500 GYM from 1 node",
                "  checkpoint bafkreiabc",
            ]
        );
    }

    #[test]
    fn a_kept_epoch_says_why_and_shows_registry_and_settlement_failures() {
        let s = pb::EpochSummary {
            advanced: false,
            aggregator: String::new(),
            kept_reason: "every delta was rejected".into(),
            rewarded_nodes: 0,
            slashed_nodes: 0,
            repo: "hanzo-gym/wine-mlp-job-1-epoch-1".into(),
            registry_error: "the repo exists with other weights".into(),
            settlement_error: "ledger unavailable".into(),
            ..summary()
        };
        let out = epoch_out(&s);
        assert_eq!(out.outcome, "kept");
        let lines = epoch_lines(&out);
        assert_eq!(
            lines[0],
            "epoch 1: kept the previous checkpoint: every delta was rejected, validation loss 0.8123 → 0.7011"
        );
        assert_eq!(
            lines[2], "  rewards at publication: none; slashed: none",
            "a kept epoch pays nobody"
        );
        assert_eq!(
            lines[3],
            "  checkpoint bafkreiabc, repo hanzo-gym/wine-mlp-job-1-epoch-1"
        );
        assert_eq!(
            lines[4],
            "  registry refused the checkpoint: the repo exists with other weights"
        );
        assert_eq!(
            lines[5],
            "  settlement failed at publication (the orchestrator retries it): ledger unavailable"
        );
    }

    #[test]
    fn the_progress_line_reads_the_jobs_summaries_as_a_whole() {
        assert_eq!(
            training_progress(&[]),
            "not started: no epoch published yet"
        );
        let kept = |epoch| pb::EpochSummary {
            epoch,
            advanced: false,
            aggregator: String::new(),
            kept_reason: "every delta was rejected".into(),
            loss_before: 0.81234,
            loss_after: 0.81234,
            ..summary()
        };
        assert_eq!(
            training_progress(&[kept(0), kept(1)]),
            "not trained: all 2 epochs kept their base checkpoint"
        );
        let first = pb::EpochSummary {
            epoch: 0,
            ..summary()
        };
        assert_eq!(
            training_progress(&[first.clone(), kept(1)]),
            "trained: loss 0.812 → best 0.701 at epoch 0, no improvement since \
             (last 0.812 at epoch 1, +15.9 % above the best)"
        );
        let bad = pb::EpochSummary {
            slashed_gym_wei: "a lot".into(),
            ..first
        };
        assert!(training_progress(&[bad])
            .starts_with("progress unknown: invalid epoch_summaries.slashed_gym_wei"));
    }

    #[test]
    fn ring_changes_name_who_left_and_joined_and_the_repair_time() {
        let c = pb::RingChange {
            removed: vec![vec![0x1a; 32]],
            added: vec![vec![0x5e; 32], vec![0x77; 32]],
            repair_ms: Some(206),
            version: 3,
            members: 4,
        };
        assert_eq!(
            ring_change_line(&c),
            "ring v3: 4 members; removed 1a1a1a1a; added 5e5e5e5e, 77777777; repaired in 206 ms"
        );
        let rebuilt = pb::RingChange {
            repair_ms: None,
            ..c.clone()
        };
        assert!(ring_change_line(&rebuilt).ends_with("repaired by a rebuilt ring manager"));
        let first = pb::RingChange {
            version: 1,
            members: 8,
            ..Default::default()
        };
        assert_eq!(ring_change_line(&first), "ring v1 formed: 8 members");
    }

    #[test]
    fn one_epoch_numbering_the_running_epoch_is_its_index_and_counts_are_counts() {
        assert_eq!(progress("Running", Some(2), 5, 2), "epoch 2, 2/5 published");
        assert_eq!(
            progress("Aggregating", Some(4), 5, 4),
            "epoch 4, 4/5 published"
        );
        assert_eq!(progress("Published", None, 5, 5), "5/5 epochs");
        assert_eq!(progress("Failed", None, 5, 3), "3/5 published");
        assert_eq!(progress("Pending", None, 5, 0), "");
    }
}
