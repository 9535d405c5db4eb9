//! Attribution after a ring round fell back to the star (DESIGN §4b): the members' uploaded
//! deltas and handed-in evidence go through [`hanzod_allreduce::audit`], and each member
//! proved to have sent a wrong partial sum leaves [`TamperEvidence`] that slashes it and
//! keeps its delta out of the epoch's merge and rewards.
//!
//! The evidence is self-contained for anyone holding the round's deltas (kept with it, by
//! hash): the wrong piece's header signed by its sender, the input piece it had received
//! (signed by its predecessor) when it forwarded a partial sum, the round's members and f32
//! weights, and the expected payload hash, which anyone recomputes with
//! `hanzod_allreduce::audit` from the deltas named by `delta_hashes`.

use std::sync::Arc;

use hanzod_actors::aggregation::RoundAudit;
use hanzod_actors::types::NodeId;
use hanzod_allreduce::audit::{audit, AuditInput, Finding};
use hanzod_allreduce::wire::SignedPiece;
use hanzod_protocol::hzdl::{self, DeltaView};
use hanzod_protocol::round::flat_values;
use serde::{Deserialize, Serialize};

/// The evidence that a member sent a wrong partial sum in a ring round, as recorded with
/// its slash (`GYMToken.slash(node, pct, reporter, evidence)`, DESIGN §8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TamperEvidence {
    /// The member slashed (hex key): the wrong piece's signer.
    pub node: String,
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The round's ring version.
    pub ring_version: u64,
    /// The round's members in ring order (hex keys).
    pub members: Vec<String>,
    /// Their f32 weights, in the same order.
    pub weights: Vec<f32>,
    /// SHA-256 of each member's delta (hex; its commitment), in the same order.
    pub delta_hashes: Vec<String>,
    /// The member that received the wrong piece and handed it in (hex key).
    pub receiver: String,
    /// The wrong piece: header and the sender's signature (hex, 137 bytes).
    pub piece: String,
    /// SHA-256 of the payload the schedule says the piece should have carried (hex).
    pub expected_sha256: String,
    /// The right piece the sender had received as its input (hex, 137 bytes, signed by
    /// its predecessor); `None` when the wrong piece was its first (its input was its own
    /// weighted delta).
    pub input_piece: Option<String>,
}

impl TamperEvidence {
    /// The evidence as recorded with a slash: canonical JSON with the
    /// [`hanzod_actors::domain::RING_TAMPER_EVIDENCE`] domain tag. The ledger keys a slash
    /// by the SHA-256 of these bytes, so a retried settlement slashes once.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "domain": std::str::from_utf8(hanzod_actors::domain::RING_TAMPER_EVIDENCE).expect("ASCII"),
            "node": self.node,
            "job": self.job,
            "epoch": self.epoch,
            "ring_version": self.ring_version,
            "members": self.members,
            "weights": self.weights,
            "delta_hashes": self.delta_hashes,
            "receiver": self.receiver,
            "piece": self.piece,
            "expected_sha256": self.expected_sha256,
            "input_piece": self.input_piece,
        }))
        .expect("JSON of strings and numbers")
    }
}

/// What the attribution of a fallen-back round found, as the epoch report records it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundAuditReport {
    /// The round's ring version.
    pub ring_version: u64,
    /// Members that handed in evidence.
    pub evidence_from: usize,
    /// Pieces whose expected hash was computed.
    pub checked: usize,
    /// Of those, pieces whose signed hash differs.
    pub wrong: usize,
    /// Pieces that need a delta the orchestrator does not hold.
    pub unverifiable: usize,
    /// Pieces refused (bad signature, another round, not in the schedule, malformed).
    pub refused: usize,
    /// Members that sent a wrong piece but did not hand in its input (hex keys; not
    /// slashed).
    pub undetermined: Vec<String>,
    /// One per member proved to have tampered: slashed with it.
    pub tampered: Vec<TamperEvidence>,
    /// Members whose sketch the check proved not to be their held delta's (hex keys):
    /// rejected, not slashed (DESIGN §4b).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unbound: Vec<String>,
    /// Members that withheld their check sketch or audited delta (hex keys): rejected, not
    /// slashed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withheld: Vec<String>,
}

impl RoundAuditReport {
    /// The members proved to have tampered.
    pub fn guilty(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.tampered.iter().filter_map(|t| t.node.parse().ok())
    }

    /// The members whose sketch was proved not to be their delta's.
    pub fn unbound(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.unbound.iter().filter_map(|n| n.parse().ok())
    }

    /// The members that withheld their check sketch or audited delta.
    pub fn withheld(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.withheld.iter().filter_map(|n| n.parse().ok())
    }
}

/// Attributes the round `audit` of `job`'s epoch `epoch` from the members' uploaded
/// payloads (HZDL bytes; `payloads[i]` is member `audit.members[i]`'s upload, `None` when
/// it has none). A payload that does not hash to the member's commitment or does not parse
/// counts as not held. CPU-bound (module docs of `hanzod_allreduce::audit`): run it off the
/// async runtime. Memory: the members' f32 vectors (4 bytes per parameter each); each
/// payload is dropped once decoded.
pub fn attribute(
    job: u64,
    epoch: u32,
    round: &RoundAudit,
    payloads: Vec<Option<Arc<[u8]>>>,
) -> RoundAuditReport {
    let commit_of = |n: &NodeId| {
        round
            .commits
            .iter()
            .find(|(m, _)| m == n)
            .map(|(_, c)| c.hash)
    };
    let deltas: Vec<Option<Vec<f32>>> = round
        .members
        .iter()
        .zip(payloads)
        .map(|((n, _), p)| {
            let p = p?;
            (Some(hzdl::payload_hash(&p)) == commit_of(n)).then_some(())?;
            DeltaView::parse(&p).ok().map(|v| flat_values(&v))
        })
        .collect();
    let mut refused = 0;
    let evidence: Vec<(NodeId, Vec<SignedPiece>)> = round
        .evidence
        .iter()
        .map(|e| {
            let pieces = e
                .pieces
                .iter()
                .filter_map(|b| {
                    let p = SignedPiece::from_bytes(b).ok();
                    refused += usize::from(p.is_none());
                    p
                })
                .collect();
            (e.receiver, pieces)
        })
        .collect();
    let found = audit(AuditInput {
        job,
        epoch,
        ring_version: round.version,
        ring: &round.members,
        deltas,
        evidence: &evidence,
    });
    let hex_of = |n: &NodeId| hex::encode(n.0);
    let members: Vec<String> = round.members.iter().map(|(n, _)| hex_of(n)).collect();
    let weights: Vec<f32> = round.members.iter().map(|(_, w)| *w).collect();
    let delta_hashes: Vec<String> = round
        .members
        .iter()
        .map(|(n, _)| commit_of(n).map(hex::encode).unwrap_or_default())
        .collect();
    let tampered = found
        .guilty
        .iter()
        .map(|f: &Finding| TamperEvidence {
            node: hex_of(&f.sender),
            job,
            epoch,
            ring_version: round.version,
            members: members.clone(),
            weights: weights.clone(),
            delta_hashes: delta_hashes.clone(),
            receiver: hex_of(&f.receiver),
            piece: hex::encode(f.piece.to_bytes()),
            expected_sha256: hex::encode(f.expected),
            input_piece: f.input.map(|p| hex::encode(p.to_bytes())),
        })
        .collect();
    RoundAuditReport {
        ring_version: round.version,
        evidence_from: round.evidence.len(),
        checked: found.checked,
        wrong: found.wrong,
        unverifiable: found.unverifiable,
        refused: found.refused + refused,
        undetermined: found.undetermined.iter().map(hex_of).collect(),
        tampered,
        unbound: round.unbound.iter().map(hex_of).collect(),
        withheld: round.withheld.iter().map(hex_of).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::aggregation::{Commit, RoundEvidence};
    use hanzod_allreduce::schedule::weight_in_place;
    use hanzod_allreduce::{all_reduce, loopback_ring, RoundConfig};
    use hanzod_protocol::hzdl::{write_delta, DeltaDtype, DeltaKind};
    use hanzod_protocol::identity::Identity;

    const JOB: u64 = 4;
    const EPOCH: u32 = 2;
    const VERSION: u64 = 3;

    fn payload(i: usize) -> Vec<u8> {
        let a: Vec<f32> = (0..10).map(|j| (i * 10 + j) as f32 * 0.125 - 3.0).collect();
        let b: Vec<f32> = (0..7).map(|j| ((i + j) % 5) as f32 * -0.5).collect();
        write_delta(
            DeltaKind::Full,
            u64::from(EPOCH),
            DeltaDtype::F32,
            &[("b", &[7], &b), ("a", &[2, 5], &a)],
        )
        .unwrap()
    }

    /// Runs a real round over loopback TCP where member `tamper` adds 0.5 to its weighted
    /// input (what `hanzod node --byzantine tamper-allreduce` does), and returns the round
    /// as the orchestrator would hold it after the fallback, with the members' payloads.
    async fn tampered_round(n: usize, tamper: usize) -> (RoundAudit, Vec<Vec<u8>>) {
        let keys: Vec<Identity> = (0..n)
            .map(|i| Identity::from_seed([i as u8 + 40; 32]))
            .collect();
        let ring: Vec<NodeId> = keys.iter().map(Identity::node_id).collect();
        let weights: Vec<f32> = (0..n).map(|i| 0.5 / n as f32 + i as f32 * 0.1).collect();
        let payloads: Vec<Vec<u8>> = (0..n).map(payload).collect();
        let links = loopback_ring(n).await.unwrap();
        let mut tasks = Vec::new();
        for (i, link) in links.into_iter().enumerate() {
            let mut cfg = RoundConfig::new(JOB, EPOCH, VERSION, ring.clone());
            cfg.piece_elems = 3;
            let key = keys[i].clone();
            let mut data = flat_values(&DeltaView::parse(&payloads[i]).unwrap());
            weight_in_place(&mut data, weights[i]);
            if i == tamper {
                data.iter_mut().for_each(|x| *x += 0.5);
            }
            tasks.push(tokio::spawn(async move {
                all_reduce(&cfg, &key, Some(link), &mut data).await.unwrap()
            }));
        }
        let mut evidence = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            let outcome = t.await.unwrap();
            evidence.push(RoundEvidence {
                receiver: ring[i],
                signer: outcome.evidence_signer.unwrap(),
                pieces: outcome
                    .evidence
                    .iter()
                    .map(|p| p.to_bytes().to_vec())
                    .collect(),
            });
        }
        let audit = RoundAudit {
            version: VERSION,
            members: ring.iter().copied().zip(weights).collect(),
            commits: ring
                .iter()
                .zip(&payloads)
                .map(|(n, p)| {
                    let commit = Commit {
                        hash: hzdl::payload_hash(p),
                        claimed_loss: 1.0,
                        total_bytes: p.len() as u64,
                    };
                    (*n, commit)
                })
                .collect(),
            evidence,
            unbound: Vec::new(),
            withheld: Vec::new(),
        };
        (audit, payloads)
    }

    fn held(payloads: &[Vec<u8>]) -> Vec<Option<Arc<[u8]>>> {
        payloads
            .iter()
            .map(|p| Some(Arc::from(p.as_slice())))
            .collect()
    }

    #[tokio::test]
    async fn a_real_rounds_tamperer_is_proved_from_its_signed_pieces() {
        let (mut audit, payloads) = tampered_round(4, 2).await;
        // A malformed piece handed in is refused, not fatal.
        audit.evidence[0].pieces.push(vec![1, 2, 3]);
        let found = attribute(JOB, EPOCH, &audit, held(&payloads));
        assert_eq!(found.tampered.len(), 1, "{found:?}");
        let t = &found.tampered[0];
        assert_eq!(t.node, hex::encode(audit.members[2].0 .0));
        assert_eq!(t.receiver, hex::encode(audit.members[3].0 .0));
        // Its first piece was wrong: its input was its own delta.
        assert_eq!(t.input_piece, None);
        assert_eq!(t.delta_hashes.len(), 4);
        assert_eq!(found.refused, 1);
        assert!(found.undetermined.is_empty());
        assert!(found.wrong > 1, "the wrong sum travelled: {found:?}");
        let bytes = String::from_utf8(t.canonical_bytes()).unwrap();
        assert!(bytes.contains("hanzod-ring-tamper-v1"), "{bytes}");
        assert_eq!(found.guilty().collect::<Vec<_>>(), vec![audit.members[2].0]);
    }

    #[tokio::test]
    async fn an_upload_that_is_not_the_commitment_proves_nothing() {
        let (audit, mut payloads) = tampered_round(3, 1).await;
        // The tamperer's upload differs from what it committed to: its input is not held,
        // so nothing that depends on it is judged and nobody is blamed.
        payloads[1] = payload(9);
        let found = attribute(JOB, EPOCH, &audit, held(&payloads));
        assert!(found.tampered.is_empty(), "{found:?}");
        assert!(found.unverifiable > 0);
    }

    #[tokio::test]
    async fn an_honest_round_proves_nobody_guilty() {
        let (audit, payloads) = tampered_round(3, usize::MAX).await;
        let found = attribute(JOB, EPOCH, &audit, held(&payloads));
        assert_eq!((found.wrong, found.refused, found.unverifiable), (0, 0, 0));
        assert!(found.checked > 0 && found.tampered.is_empty());
    }
}
