//! The job actor's side of ring aggregation (DESIGN §6.4): it owns the epoch's
//! [`RingRound`] machine, carries the members' messages in as [`Input`]s and the machine's
//! [`Effect`]s out (commands to nodes, calls to the sink run as tasks beside the actor), and
//! decides when the epoch is complete.
//!
//! The round's state lives in memory only. A job actor rebuilt during a ring epoch cannot
//! resume the round it lost (the sketches and reports are gone), so it falls back to the star
//! for that epoch: every ring member is asked for its delta ([`RoundUpload::Delta`]), and a
//! member that only now commits is refused with [`JobRequestError::NotRing`], which tells it
//! to upload instead. Receipts are durable, so deltas already uploaded count.

use std::collections::BTreeMap;
use std::time::Duration;

use ractor::ActorRef;

use super::JobState;
use crate::actor::msg::{JobMsg, JobRequestError, RoundMsg};
use crate::aggregation::{
    reduce_budget, Commit, Effect, Fallback, Input, RingRound, RoundTimeouts, Step,
};
use crate::job::{Aggregation, JobEvent, JobPhase};
use crate::ports::{
    CheckRefusal, NodeCommand, RingCheckInput, RingResult, RingScoreInput, RingSeeds, RoundAudit,
    RoundEvidence, RoundUpload, SketchData,
};
use crate::types::{NodeId, Timestamp};

/// One ring epoch's aggregation state.
#[derive(Debug)]
pub(super) struct RoundState {
    /// The epoch.
    pub epoch: u32,
    /// The machine; `None` once the epoch fell back to the star after a rebuild.
    pub machine: Option<RingRound>,
    /// The epoch's seeds.
    pub seeds: Option<RingSeeds>,
    /// Members in the order their commitments were accepted (the scoring's tie-break:
    /// the earlier of two copies keeps its weight).
    pub commit_order: Vec<NodeId>,
    /// Scoring-seed sketches.
    pub sketches: BTreeMap<NodeId, SketchData>,
    /// Check-seed sketches of the round being verified.
    pub check_sketches: BTreeMap<NodeId, SketchData>,
    /// Members the scoring excluded, with why.
    pub excluded: BTreeMap<NodeId, String>,
    /// Round evidence received after a fallback: member → (version, sender, pieces).
    pub evidence: BTreeMap<NodeId, (u64, NodeId, Vec<Vec<u8>>)>,
    /// Members whose sketch a refused check proved not to be their held delta's.
    pub unbound: std::collections::BTreeSet<NodeId>,
    /// Members that withheld their check sketch or audited delta (the fallback's reason).
    pub withheld: Vec<NodeId>,
    /// After a fallback from a round that ran: its version and the members asked for their
    /// evidence (those that reported a result); the epoch waits for them as for deltas.
    pub evidence_wanted: Option<(u64, Vec<NodeId>)>,
    /// The accepted round (or every member excluded: `merged` is `None`).
    pub result: Option<RingResult>,
    /// Whether `result` is recorded in the event log ([`crate::events::Event::RingAccepted`]).
    pub recorded: bool,
    /// After a fallback to the star: until when the members' deltas are awaited.
    pub star_until: Option<Timestamp>,
    /// The members a star fallback waits for (every ring member after a rebuild).
    pub star_members: Vec<NodeId>,
}

impl RoundState {
    /// A round of `epoch`: driven by `machine`, or (`machine` `None`) merged as a star that
    /// waits for `star_members` until `star_until`.
    fn new(
        epoch: u32,
        machine: Option<RingRound>,
        seeds: Option<RingSeeds>,
        star_until: Option<Timestamp>,
        star_members: Vec<NodeId>,
    ) -> RoundState {
        RoundState {
            epoch,
            machine,
            seeds,
            commit_order: Vec::new(),
            sketches: BTreeMap::new(),
            check_sketches: BTreeMap::new(),
            excluded: BTreeMap::new(),
            evidence: BTreeMap::new(),
            evidence_wanted: None,
            unbound: std::collections::BTreeSet::new(),
            withheld: Vec::new(),
            result: None,
            recorded: false,
            star_until,
            star_members,
        }
    }

    /// The round's outcome to record and publish: `merged` (`None`: every member excluded)
    /// reduced with `weights`.
    fn outcome(&self, merged: Option<[u8; 32]>, weights: Vec<(NodeId, f32)>) -> RingResult {
        RingResult {
            merged,
            weights,
            commits: self
                .machine
                .as_ref()
                .map(|m| m.commits().iter().map(|(n, c)| (*n, *c)).collect())
                .unwrap_or_default(),
            excluded: self.excluded.iter().map(|(n, w)| (*n, w.clone())).collect(),
        }
    }
    /// The round a fallback audits: its members, commitments and the evidence handed in
    /// for its version (`None` when no round ran or nobody handed any in).
    pub(super) fn audit(&self) -> Option<RoundAudit> {
        let (version, _) = self.evidence_wanted.as_ref()?;
        let machine = self.machine.as_ref()?;
        let evidence: Vec<RoundEvidence> = self
            .evidence
            .iter()
            .filter(|(_, (v, _, _))| v == version)
            .map(|(receiver, (_, signer, pieces))| RoundEvidence {
                receiver: *receiver,
                signer: *signer,
                pieces: pieces.clone(),
            })
            .collect();
        let blamed = !self.unbound.is_empty() || !self.withheld.is_empty();
        (!evidence.is_empty() || blamed).then(|| RoundAudit {
            version: *version,
            members: machine.round().to_vec(),
            commits: machine.commits().iter().map(|(n, c)| (*n, *c)).collect(),
            evidence,
            unbound: self.unbound.iter().copied().collect(),
            withheld: self.withheld.clone(),
        })
    }

    /// A rebuilt actor whose log holds the epoch's accepted round (`Event::RingAccepted`).
    pub(super) fn recorded_round(epoch: u32, result: RingResult) -> RoundState {
        let mut r = RoundState::new(epoch, None, None, None, Vec::new());
        r.result = Some(result);
        r.recorded = true;
        r
    }

    /// The step name for answers and logs.
    fn step(&self) -> &'static str {
        match &self.machine {
            Some(m) => m.step().name(),
            None => "star",
        }
    }

    /// Whether the epoch merges as in star mode.
    pub fn is_star(&self) -> bool {
        self.machine.is_none()
            || matches!(
                self.machine.as_ref().map(RingRound::step),
                Some(Step::Star { .. })
            )
    }
}

impl JobState {
    /// Whether the job aggregates over the ring.
    pub(super) fn ring_mode(&self) -> bool {
        self.job.spec.training.aggregation == Aggregation::Ring
    }

    /// The seed commitments the running epoch's assignment carries: the round's, unless the
    /// epoch merges as in star mode.
    pub(super) fn seed_commitments(&self) -> Option<crate::job::SeedCommitments> {
        let round = self.round.as_ref()?;
        if round.is_star() {
            return None;
        }
        round
            .seeds
            .map(|s| (s.score_commitment, s.check_commitment))
    }

    /// Sets up the ring aggregation of the epoch just entered (nothing in star mode). When
    /// the sink has no seeds (it does not aggregate over rings) the epoch falls back to the
    /// star at once.
    pub(super) fn begin_round(&mut self, epoch: u32) {
        self.round = None;
        if !self.ring_mode() {
            return;
        }
        let Some(ring) = &self.ring else { return };
        let cfg = &self.deps.cfg.aggregation;
        let seeds = self.deps.sink.ring_seeds(self.job.id, epoch);
        let commit_deadline = self.phase_since.plus_ms(self.job.spec.epoch_deadline_ms);
        let machine = seeds.map(|_| {
            RingRound::new(
                epoch,
                ring.version,
                ring.members.clone(),
                // As in star mode, an epoch completes with whoever delivered; a ring below
                // min_nodes fails the job through the ring rule (`Job::ring_due`).
                1,
                commit_deadline,
                RoundTimeouts {
                    sketch_ms: cfg.sketch_ms,
                    upload_ms: cfg.upload_ms,
                },
                cfg.reduce_floor_ms,
            )
        });
        if machine.is_none() {
            tracing::warn!(job = %self.job.id, epoch, "the sink does not aggregate over rings; epoch runs as a star");
        }
        let star_members = if machine.is_none() {
            ring.members.clone()
        } else {
            Vec::new()
        };
        let star_until = machine.is_none().then_some(commit_deadline);
        self.round = Some(RoundState::new(
            epoch,
            machine,
            seeds,
            star_until,
            star_members,
        ));
    }

    /// A rebuilt actor in a ring epoch: the round is lost, so the epoch falls back to the
    /// star (module docs). Asks every ring member without a receipt for its delta.
    pub(super) async fn resume_round_as_star(&mut self, epoch: u32) {
        if !self.ring_mode() || self.round.as_ref().is_some_and(|r| r.epoch == epoch) {
            return;
        }
        let Some(ring) = self.ring.clone() else {
            return;
        };
        let until = self
            .deps
            .now()
            .plus_ms(self.deps.cfg.aggregation.upload_ms)
            .max(self.phase_since.plus_ms(self.job.spec.epoch_deadline_ms));
        tracing::info!(job = %self.job.id, epoch, "ring round lost with the actor; the epoch merges as a star");
        self.round = Some(RoundState::new(
            epoch,
            None,
            None,
            Some(until),
            ring.members.clone(),
        ));
        for m in ring
            .members
            .iter()
            .filter(|m| !self.receipts.contains_key(*m))
        {
            self.send(
                m,
                NodeCommand::UploadRequest {
                    job: self.job.id,
                    epoch,
                    version: ring.version,
                    kind: RoundUpload::Delta,
                    reason: "the orchestrator lost the epoch's ring round; upload your delta"
                        .into(),
                },
            )
            .await;
        }
    }

    async fn send(&self, node: &NodeId, command: NodeCommand) {
        if let Err(e) = self.deps.link.send(node, command).await {
            tracing::debug!(job = %self.job.id, node = %node, error = %e, "round command not delivered");
        }
    }

    /// A member's message ([`JobMsg::Round`]): checked against the epoch and the step, fed to
    /// the machine; answers the step after it.
    pub(super) async fn on_round_msg(
        &mut self,
        myself: &ActorRef<JobMsg>,
        node: NodeId,
        msg: RoundMsg,
    ) -> Result<&'static str, JobRequestError> {
        let JobPhase::Running { epoch, .. } = self.job.phase else {
            return Err(JobRequestError::NotRunning {
                phase: self.job.phase.name().to_string(),
            });
        };
        if msg.epoch() != epoch {
            return Err(JobRequestError::WrongEpoch {
                expected: epoch,
                got: msg.epoch(),
            });
        }
        if !self.ring_mode() {
            return Err(JobRequestError::NotRing(self.job.id));
        }
        let Some(round) = self.round.as_mut().filter(|r| r.epoch == epoch) else {
            return Err(JobRequestError::NotRing(self.job.id));
        };
        if let RoundMsg::Evidence {
            version,
            sender,
            pieces,
            ..
        } = msg
        {
            // Evidence is wanted after a fallback, from the members asked.
            if !round.is_star() {
                return Err(JobRequestError::RoundStep {
                    want: "star",
                    at: round.step(),
                });
            }
            // Only the members asked, for the round asked, once (a repeat keeps the first).
            match &round.evidence_wanted {
                Some((v, from)) if *v == version && from.contains(&node) => {}
                _ => return Err(JobRequestError::NotMember(node)),
            }
            round
                .evidence
                .entry(node)
                .or_insert((version, sender, pieces));
            return Ok(round.step());
        }
        let Some(machine) = round.machine.as_ref() else {
            return Err(JobRequestError::NotRing(self.job.id));
        };
        let in_ring = self
            .ring
            .as_ref()
            .is_some_and(|r| r.members.contains(&node));
        let input = match msg {
            RoundMsg::Commit { commit, .. } => {
                if !in_ring {
                    return Err(JobRequestError::NotMember(node));
                }
                match machine.commits().get(&node) {
                    Some(prev) if prev.hash == commit.hash => return Ok(machine.step().name()),
                    Some(_) => return Err(JobRequestError::Conflicting(node)),
                    None if *machine.step() != Step::Commit => {
                        return Err(JobRequestError::RoundStep {
                            want: "commit",
                            at: machine.step().name(),
                        })
                    }
                    None => {}
                }
                round.commit_order.push(node);
                Input::Committed { node, commit }
            }
            RoundMsg::Sketch {
                check,
                delta_hash,
                sketch,
                ..
            } => {
                let Some(c) = machine.commits().get(&node) else {
                    return Err(JobRequestError::NotMember(node));
                };
                if c.hash != delta_hash {
                    return Err(JobRequestError::Conflicting(node));
                }
                match check.then(|| match machine.step() {
                    Step::Verify { version, .. } => Some(*version),
                    _ => None,
                }) {
                    None => {
                        if !machine.wants_sketch(&node) {
                            return if round.sketches.contains_key(&node) {
                                Ok(machine.step().name())
                            } else {
                                Err(JobRequestError::RoundStep {
                                    want: "sketch",
                                    at: machine.step().name(),
                                })
                            };
                        }
                        round.sketches.insert(node, sketch);
                        Input::Sketched { node }
                    }
                    Some(None) => {
                        return Err(JobRequestError::RoundStep {
                            want: "verify",
                            at: machine.step().name(),
                        })
                    }
                    Some(Some(_)) if !machine.round().iter().any(|(n, _)| *n == node) => {
                        return Err(JobRequestError::NotMember(node))
                    }
                    Some(Some(version)) => {
                        round.check_sketches.insert(node, sketch);
                        Input::CheckSketched { node, version }
                    }
                }
            }
            RoundMsg::Report {
                version, result, ..
            } => {
                if !matches!(machine.step(), Step::Reduce { version: v } if *v == version) {
                    return Err(JobRequestError::RoundStep {
                        want: "reduce",
                        at: machine.step().name(),
                    });
                }
                if !machine.round().iter().any(|(n, _)| *n == node) {
                    return Err(JobRequestError::NotMember(node));
                }
                Input::Reported {
                    node,
                    version,
                    result,
                }
            }
            RoundMsg::Merged { hash, .. } => {
                if !matches!(machine.step(), Step::Verify { from, .. } if *from == node) {
                    return Err(JobRequestError::RoundStep {
                        want: "verify",
                        at: machine.step().name(),
                    });
                }
                if machine.agreed() != Some(hash) {
                    // Not the result every member committed to: the turn passes on, and the
                    // uploader is told (its blob is removed).
                    self.round_input(myself, Input::MergedUploaded { node, hash })
                        .await;
                    return Err(JobRequestError::Conflicting(node));
                }
                Input::MergedUploaded { node, hash }
            }
            RoundMsg::Evidence { .. } => unreachable!("handled above"),
        };
        self.round_input(myself, input).await;
        Ok(self.round.as_ref().map_or("star", RoundState::step))
    }

    /// A receipt in a ring epoch: it must be the committed delta, uploaded when the machine
    /// wants it (a selected member during the sketch step, an audited one during the verify
    /// step) or after a fallback. Returns whether the receipt is to be recorded.
    pub(super) fn check_round_receipt(
        &self,
        node: &NodeId,
        hash: &[u8; 32],
    ) -> Result<(), JobRequestError> {
        let Some(round) = &self.round else {
            return Ok(());
        };
        let Some(machine) = &round.machine else {
            return Ok(()); // star after a rebuild: any member's delta
        };
        match machine.commits().get(node) {
            Some(c) if c.hash != *hash => Err(JobRequestError::Conflicting(*node)),
            // After a fallback every member delivers as in star mode: a member that never
            // committed (a standby that joined late) is validated like any star delta.
            _ if round.is_star() => Ok(()),
            None => Err(JobRequestError::RoundStep {
                want: "commit",
                at: machine.step().name(),
            }),
            Some(_) if machine.wants_upload(node) => Ok(()),
            Some(_) => Err(JobRequestError::RoundStep {
                want: "star",
                at: machine.step().name(),
            }),
        }
    }

    /// A receipt was recorded in a ring epoch: a selected or audited member's upload.
    pub(super) async fn round_receipt_recorded(&mut self, myself: &ActorRef<JobMsg>, node: NodeId) {
        let wants = self
            .round
            .as_ref()
            .and_then(|r| r.machine.as_ref())
            .is_some_and(|m| m.wants_upload(&node));
        if wants {
            self.round_input(myself, Input::Uploaded { node }).await;
        }
    }

    /// The budget of a round of `members` members ([`reduce_budget`] over the largest
    /// committed delta, as f32 values, and the ring's weakest link), ms.
    fn round_budget(&self, machine: &RingRound, members: usize) -> u64 {
        let cfg = &self.deps.cfg.aggregation;
        // The ring carries f32 values: a bf16 delta's bytes double.
        let bytes = machine.largest_commit().saturating_mul(2);
        let mbps = self
            .ring
            .as_ref()
            .map_or(0.0, |r| f64::from(r.bottleneck_mbps));
        reduce_budget(bytes, members, mbps, cfg.reduce_slack, cfg.reduce_floor_ms)
    }

    /// Applies `input` to the machine, carries its effects out (an effect may answer with
    /// the next input, applied in turn) and arms the next tick.
    pub(super) async fn round_input(&mut self, myself: &ActorRef<JobMsg>, input: Input) {
        let mut queue = std::collections::VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            let now = self.deps.now();
            // A round may start on this input: its budget first, so its deadline is right.
            let members = match &input {
                Input::Scored { weights } => Some(weights.values().filter(|w| **w > 0.0).count()),
                Input::RingChanged { members, .. } => Some(members.len()),
                _ => None,
            };
            if let (Some(n), Some(m)) = (
                members,
                self.round.as_ref().and_then(|r| r.machine.as_ref()),
            ) {
                let budget = self.round_budget(m, n);
                if let Some(m) = self.round.as_mut().and_then(|r| r.machine.as_mut()) {
                    m.set_reduce_budget(budget);
                }
            }
            let Some(machine) = self.round.as_mut().and_then(|r| r.machine.as_mut()) else {
                return;
            };
            let effects = machine.apply(input, now);
            let deadline = machine.deadline();
            let epoch = machine.epoch();
            for e in effects {
                if let Some(next) = self.run_effect(myself, e).await {
                    queue.push_back(next);
                }
            }
            if let Some(d) = deadline {
                myself.send_after(Duration::from_millis(d.since(now) + 1), move || {
                    JobMsg::RoundTick { epoch }
                });
            }
        }
        self.check_epoch(myself, false).await;
    }

    /// Carries one effect out; returns the input that answers it at once, if any.
    async fn run_effect(&mut self, myself: &ActorRef<JobMsg>, effect: Effect) -> Option<Input> {
        let job = self.job.id;
        let round = self.round.as_mut()?;
        let epoch = round.epoch;
        let seeds = round.seeds?;
        let version = self.ring.as_ref().map_or(0, |r| r.version);
        tracing::debug!(%job, epoch, effect = ?effect, "ring round");
        match effect {
            Effect::Reveal { to } => {
                let commits = round
                    .machine
                    .as_ref()
                    .map(|m| m.commits().clone())
                    .unwrap_or_default();
                let mut selected = std::collections::BTreeSet::new();
                for n in &to {
                    let chosen = commits
                        .get(n)
                        .is_some_and(|c| self.deps.sink.ring_selected(job, epoch, &c.hash));
                    if chosen {
                        selected.insert(*n);
                    }
                    self.send(
                        n,
                        NodeCommand::SketchRequest {
                            job,
                            epoch,
                            seed: seeds.score,
                            rows: self.deps.cfg.aggregation.sketch_rows,
                            upload_delta: chosen,
                            check: None,
                        },
                    )
                    .await;
                }
                return Some(Input::Selected { nodes: selected });
            }
            Effect::Withheld { node } => {
                tracing::warn!(%job, epoch, node = %node, "a spot-checked member did not upload its delta; excluded");
                round
                    .excluded
                    .insert(node, "did not upload its delta for the spot-check".into());
            }
            Effect::Score { members } => {
                let input_members: Vec<(NodeId, Commit, SketchData)> = {
                    let commits = round
                        .machine
                        .as_ref()
                        .map(|m| m.commits().clone())
                        .unwrap_or_default();
                    // In commitment order (the scoring's tie-break).
                    round
                        .commit_order
                        .iter()
                        .filter(|n| members.contains(n))
                        .filter_map(|n| {
                            Some((*n, *commits.get(n)?, round.sketches.get(n)?.clone()))
                        })
                        .collect()
                };
                let uploaded: Vec<(NodeId, [u8; 32])> = input_members
                    .iter()
                    .filter_map(|(n, _, _)| Some((*n, self.receipts.get(n)?.delta_hash)))
                    .collect();
                let sink = self.deps.sink.clone();
                let spec = self.job.spec.clone();
                let base = self.job.base_of(epoch).map(str::to_string);
                answer_from_task(
                    myself.clone(),
                    "scoring",
                    async move {
                        let input = RingScoreInput {
                            job,
                            epoch,
                            spec: &spec,
                            base: base.as_deref(),
                            seed: seeds.score,
                            members: &input_members,
                            uploaded: &uploaded,
                        };
                        sink.ring_score(input).await.map_err(|e| e.to_string())
                    },
                    move |result| JobMsg::RoundScored { epoch, result },
                );
            }
            Effect::StartReduce { version, members } => {
                tracing::info!(%job, epoch, version, members = members.len(), "ring round starts");
                let bottleneck_mbps = self.ring.as_ref().map_or(0.0, |r| r.bottleneck_mbps);
                for (n, _) in &members {
                    self.send(
                        n,
                        NodeCommand::ReduceStart {
                            job,
                            epoch,
                            version,
                            members: members.clone(),
                            bottleneck_mbps,
                        },
                    )
                    .await;
                }
            }
            Effect::RevealCheck { version, to } => {
                round.check_sketches.clear();
                let commits = round
                    .machine
                    .as_ref()
                    .map(|m| m.commits().clone())
                    .unwrap_or_default();
                let mut audited = std::collections::BTreeSet::new();
                for n in &to {
                    // The post-reduce audit: a member whose delta is not already held.
                    let chosen = !self.receipts.contains_key(n)
                        && commits
                            .get(n)
                            .is_some_and(|c| self.deps.sink.ring_audited(job, epoch, &c.hash));
                    if chosen {
                        audited.insert(*n);
                    }
                    self.send(
                        n,
                        NodeCommand::SketchRequest {
                            job,
                            epoch,
                            seed: seeds.check,
                            rows: self.deps.cfg.aggregation.sketch_rows,
                            upload_delta: chosen,
                            check: Some(version),
                        },
                    )
                    .await;
                }
                if !audited.is_empty() {
                    tracing::info!(%job, epoch, version, audited = audited.len(), "post-reduce audit drawn");
                }
                return Some(Input::Audited { nodes: audited });
            }
            Effect::RequestMerged { from, version } => {
                self.send(
                    &from,
                    NodeCommand::UploadRequest {
                        job,
                        epoch,
                        version,
                        kind: RoundUpload::Merged,
                        reason: "upload the round's result".into(),
                    },
                )
                .await;
            }
            Effect::Check {
                version,
                result,
                members,
            } => {
                let with_sketches: Vec<(NodeId, f32, SketchData)> = members
                    .iter()
                    .filter_map(|(n, w)| Some((*n, *w, round.check_sketches.get(n)?.clone())))
                    .collect();
                let uploaded: Vec<(NodeId, [u8; 32])> = members
                    .iter()
                    .filter_map(|(n, _)| Some((*n, self.receipts.get(n)?.delta_hash)))
                    .collect();
                let scoring: Vec<(NodeId, SketchData)> = members
                    .iter()
                    .filter_map(|(n, _)| Some((*n, round.sketches.get(n)?.clone())))
                    .collect();
                let sink = self.deps.sink.clone();
                let spec = self.job.spec.clone();
                answer_from_task(
                    myself.clone(),
                    "check",
                    async move {
                        let input = RingCheckInput {
                            job,
                            epoch,
                            spec: &spec,
                            result,
                            seed: seeds.check,
                            members: &with_sketches,
                            uploaded: &uploaded,
                            score_seed: seeds.score,
                            scoring: &scoring,
                        };
                        sink.ring_check(input).await.map_err(|e| e.to_string())
                    },
                    move |result| JobMsg::RoundChecked {
                        epoch,
                        version,
                        result,
                    },
                );
            }
            Effect::Accept { result, members } => {
                tracing::info!(%job, epoch, result = %hex::encode(&result[..8]), members = members.len(), "ring round accepted");
                round.result = Some(round.outcome(Some(result), members));
            }
            Effect::KeepBase => {
                tracing::warn!(%job, epoch, "every ring member was excluded; the epoch keeps its base");
                round.result = Some(round.outcome(None, Vec::new()));
            }
            Effect::Fallback {
                reason,
                members,
                evidence,
            } => {
                tracing::warn!(%job, epoch, %reason, members = members.len(), "ring round falls back to the star");
                round.star_until =
                    Some(self.deps.now().plus_ms(self.deps.cfg.aggregation.upload_ms));
                round.star_members = members.clone();
                if let Fallback::CheckSketchMissing(late) | Fallback::AuditWithheld(late) = &reason
                {
                    round.withheld = late.clone();
                }
                let reason = reason.to_string();
                // Evidence from the round members that reported a result (the others hold
                // none); the epoch waits for it as for the deltas.
                let evidence = evidence.and_then(|v| {
                    let machine = round.machine.as_ref()?;
                    let from: Vec<NodeId> = machine
                        .reported()
                        .filter(|n| members.contains(n))
                        .copied()
                        .collect();
                    Some((v, from))
                });
                round.evidence_wanted = evidence.clone();
                for n in &members {
                    if !self.receipts.contains_key(n) {
                        self.send(
                            n,
                            NodeCommand::UploadRequest {
                                job,
                                epoch,
                                version,
                                kind: RoundUpload::Delta,
                                reason: reason.clone(),
                            },
                        )
                        .await;
                    }
                    if let Some((v, _)) = evidence.as_ref().filter(|(_, f)| f.contains(n)) {
                        let v = *v;
                        self.send(
                            n,
                            NodeCommand::UploadRequest {
                                job,
                                epoch,
                                version: v,
                                kind: RoundUpload::Evidence,
                                reason: reason.clone(),
                            },
                        )
                        .await;
                    }
                }
                let until = self.deps.cfg.aggregation.upload_ms;
                myself.send_after(Duration::from_millis(until + 1), move || {
                    JobMsg::RoundTick { epoch }
                });
            }
            Effect::TooFew { committed, needed } => {
                tracing::warn!(%job, epoch, committed, needed, "too few ring members committed");
            }
        }
        None
    }

    /// The sink's weights ([`JobMsg::RoundScored`]).
    pub(super) async fn on_round_scored(
        &mut self,
        myself: &ActorRef<JobMsg>,
        epoch: u32,
        result: Result<crate::ports::RingScores, String>,
    ) {
        if self.round.as_ref().is_none_or(|r| r.epoch != epoch) {
            return;
        }
        let input = match result {
            Ok(scores) => {
                if let Some(r) = self.round.as_mut() {
                    r.excluded.extend(scores.excluded);
                }
                Input::Scored {
                    weights: scores.weights,
                }
            }
            Err(reason) => Input::ScoreFailed { reason },
        };
        self.round_input(myself, input).await;
    }

    /// The sink's check ([`JobMsg::RoundChecked`]).
    pub(super) async fn on_round_checked(
        &mut self,
        myself: &ActorRef<JobMsg>,
        epoch: u32,
        version: u64,
        result: Result<Result<(), CheckRefusal>, String>,
    ) {
        let Some(round) = self.round.as_mut().filter(|r| r.epoch == epoch) else {
            return;
        };
        let outcome = match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refusal)) => {
                round.unbound.extend(refusal.unbound);
                Err(refusal.why)
            }
            Err(e) => Err(format!("the check could not run: {e}")),
        };
        self.round_input(myself, Input::Checked { version, outcome })
            .await;
    }

    /// A round step's deadline may have passed ([`JobMsg::RoundTick`]).
    pub(super) async fn on_round_tick(&mut self, myself: &ActorRef<JobMsg>, epoch: u32) {
        if self.round.as_ref().is_none_or(|r| r.epoch != epoch) {
            return;
        }
        let now = self.deps.now();
        if self.round.as_ref().is_some_and(|r| r.machine.is_some()) {
            self.round_input(myself, Input::Tick { now }).await;
        } else {
            self.check_epoch(myself, false).await;
        }
    }

    /// A new ring during a ring epoch.
    pub(super) async fn round_ring_changed(&mut self, myself: &ActorRef<JobMsg>) {
        let Some(ring) = self.ring.clone() else {
            return;
        };
        if self.round.as_ref().is_some_and(|r| r.machine.is_some()) {
            self.round_input(
                myself,
                Input::RingChanged {
                    version: ring.version,
                    members: ring.members,
                },
            )
            .await;
        }
    }

    /// The ring epoch's completion rule (replacing [`crate::job::Job::epoch_due`]'s): the
    /// event, if the epoch is complete, and whether it is a ring result (else star).
    pub(super) fn round_due(&self, now: Timestamp) -> Option<JobEvent> {
        let JobPhase::Running { epoch, .. } = self.job.phase else {
            return None;
        };
        let round = self.round.as_ref().filter(|r| r.epoch == epoch)?;
        if round.result.is_some() {
            return Some(JobEvent::EpochComplete { epoch });
        }
        if let Some(Step::Failed { .. }) = round.machine.as_ref().map(RingRound::step) {
            // Nobody committed by the epoch deadline: as in star mode without a delta.
            return Some(JobEvent::Fail {
                reason: crate::job::FailReason::DeadlinePassed,
            });
        }
        if !round.is_star() {
            return None;
        }
        let members: Vec<NodeId> = round
            .star_members
            .iter()
            .filter(|m| self.ring.as_ref().is_some_and(|r| r.members.contains(m)))
            .copied()
            .collect();
        let passed = round.star_until.is_some_and(|t| now >= t);
        let evidence_in = |m: &NodeId| match &round.evidence_wanted {
            Some((_, from)) if from.contains(m) => round.evidence.contains_key(m),
            _ => true,
        };
        self.job.epoch_due(
            Some(&members),
            |m| self.receipts.contains_key(m) && evidence_in(m),
            self.receipts.len(),
            passed,
        )
    }

    /// Records the accepted round before the epoch completes on it; `false` when the log
    /// refused (the epoch waits for the next tick or reconcile).
    pub(super) async fn record_round(&mut self) -> bool {
        let Some(round) = self.round.as_mut() else {
            return true;
        };
        let Some(result) = round.result.clone().filter(|_| !round.recorded) else {
            return true;
        };
        let event = crate::events::Event::RingAccepted {
            job: self.job.id,
            epoch: round.epoch,
            result,
        };
        match self.deps.persist(event).await {
            Ok(_) => {
                if let Some(r) = self.round.as_mut() {
                    r.recorded = true;
                }
                true
            }
            Err(e) => {
                tracing::warn!(job = %self.job.id, error = %e, "ring round not recorded; will retry");
                false
            }
        }
    }

    /// The failed round to hand the sink for attribution, if any.
    pub(super) fn round_audit(&self, epoch: u32) -> Option<RoundAudit> {
        self.round
            .as_ref()
            .filter(|r| r.epoch == epoch && r.result.is_none())
            .and_then(RoundState::audit)
    }

    /// The accepted round to hand the sink, if any.
    pub(super) fn ring_result(&self, epoch: u32) -> Option<RingResult> {
        self.round
            .as_ref()
            .filter(|r| r.epoch == epoch)
            .and_then(|r| r.result.clone())
    }
}

/// Runs `work` (a sink call) as a task of its own and casts its answer to the job actor
/// `me` as `wrap(result)`. A task that panics is an answer too (`Err`, naming `what`), so
/// the round falls back instead of waiting for ever; the actor never waits on the call.
fn answer_from_task<T: Send + 'static>(
    me: ActorRef<JobMsg>,
    what: &'static str,
    work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
    wrap: impl FnOnce(Result<T, String>) -> JobMsg + Send + 'static,
) {
    tokio::spawn(async move {
        let result = tokio::spawn(work)
            .await
            .unwrap_or_else(|e| Err(format!("the {what} did not finish: {e}")));
        let _ = me.cast(wrap(result));
    });
}
