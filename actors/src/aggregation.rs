//! Ring aggregation of one epoch, the orchestrator's side (DESIGN §6.4; issue 18 part B): a
//! pure state machine, [`RingRound`], that decides who is asked for what and when, while
//! the caller (the job actor) carries its [`Effect`]s out and feeds the answers back as
//! [`Input`]s. No I/O, no clock (time comes in as [`Timestamp`]s), no randomness.
//!
//! # The steps
//!
//! ```text
//! Commit ─▶ Sketch ─▶ Score ─▶ Reduce(v) ─hashes agree─▶ Verify(v) ─upload + check sketches + audit─▶ Check ─ok─▶ Done
//!   │                   │        │  ▲                       │                                  │
//!   │                   │        │  └ ring version v′ > v:  │ uploader fails: next member      │ refused
//!   │                   │        │    restart without the   │                                  ▼
//!   │                   │        │    lost, renormalised    └──── none left / late ──────▶ Star (fallback)
//!   │                   │        └── hashes differ / deadline ─────────────────────────▶ Star
//!   │                   └── every weight 0 ──▶ Kept
//!   └── fewer than `min_members` committed ──▶ Failed
//! ```
//!
//! 1. **Commit.** Each member commits to its delta: the signed statement (job, epoch, step,
//!    claimed loss, SHA-256) without the bytes. The step closes when every current ring
//!    member committed, or at the commit deadline with those that did.
//! 2. **Sketch.** The machine asks for the epoch's scoring seed to be revealed to the
//!    committed members ([`Effect::Reveal`]); the caller answers which of them the
//!    commit–reveal spot-check selects ([`Input::Selected`]). Every member then sends a
//!    sketch; a selected one also uploads its full delta, so that every delta in the reduce
//!    that a spot-check chose is in the orchestrator's hands *before* the reduce, and a
//!    failed spot-check can exclude it (a reduce cannot be undone without the delta). A
//!    member that misses the sketch deadline is left out of the round (no weight, no
//!    reward); a selected member that does not upload is reported ([`Effect::Withheld`]):
//!    refusing the inspection counts as failing it.
//! 3. **Score.** The caller computes the weights from the sketches (and the spot-checked
//!    deltas' verdicts) and answers [`Input::Scored`]. Members of weight 0 are excluded and
//!    take no part in the all-reduce.
//! 4. **Reduce.** The members with weight, in ring order, all-reduce Σ wᵢ·δᵢ at the current
//!    ring version ([`Effect::StartReduce`]) and commit to the result's hash. When the ring
//!    manager publishes a new version ([`Input::RingChanged`]) while the round runs, the
//!    members it lost are dropped, the survivors' weights renormalised (wᵢ / Σ_survivors w)
//!    so they still sum to 1, and the round restarts on the new version; reports of an older
//!    version are ignored, so a result never mixes two versions (the members abort on the
//!    version too).
//! 5. **Verify.** When every round member reported the same hash, one member (rotating with
//!    the epoch; the next one when it fails or times out) uploads the result
//!    ([`Effect::RequestMerged`]), which must hash to the agreed hash, and the check seed is
//!    revealed ([`Effect::RevealCheck`]): a second seed, unknown while the members reduced,
//!    because a sketch is blind to changes in its projection's null space and a reducer who
//!    knew the seed could hide one there (see `hanzod_protocol::sketch`). Each member sends
//!    its committed delta's sketch under it. The caller also draws the post-reduce *audit*
//!    ([`Input::Audited`], a commit–reveal sample nobody could predict while reducing):
//!    those members upload their delta now, and the check waits for it, so their sketches
//!    are recomputed from the committed bytes: a member that reduced and sketched anything
//!    but its committed delta is caught with the audit's probability.
//! 6. **Check.** The caller sketches the uploaded result itself under the check seed and
//!    compares it with Σ wᵢ·sketchᵢ ([`Effect::Check`]). Hashes that differ, a refused
//!    check, a check sketch or an audited delta that does not come, no uploader left, or a
//!    round that misses its deadline fall back to the star for the epoch ([`Effect::Fallback`]): every committed
//!    member uploads its delta (which must match its commitment) and its round evidence, and
//!    the epoch merges as in star mode; the evidence attributes a wrong partial sum to the
//!    member that forwarded it.
//!
//! # Deadlines
//!
//! Each step has one deadline, set when the step starts ([`RoundTimeouts`]); the reduce's
//! comes from [`reduce_budget`]. [`RingRound::deadline`] tells the caller when to send the
//! next [`Input::Tick`]; a tick before the deadline changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{NodeId, Timestamp};

/// A member's commitment to its epoch delta (the statement of DESIGN §6 without the bytes),
/// as the caller checked and recorded it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Commit {
    /// SHA-256 of the delta's HZDL payload.
    pub hash: [u8; 32],
    /// The loss the member claims for the epoch's checkpoint on its batch.
    pub claimed_loss: f64,
    /// Size of the HZDL payload, bytes.
    pub total_bytes: u64,
}

/// An accepted ring round, handed to [`crate::ports::CheckpointSink::publish`] in ring aggregation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RingResult {
    /// SHA-256 of the merged delta Σ wᵢ·δᵢ (a blob the result's uploader stored); `None`
    /// when the scoring excluded every member (the epoch keeps its base checkpoint).
    pub merged: Option<[u8; 32]>,
    /// The round's members in ring order with the weights it ran with.
    pub weights: Vec<(NodeId, f32)>,
    /// Every member's commitment (the round's and the excluded).
    pub commits: Vec<(NodeId, Commit)>,
    /// Members excluded by the scoring, with why.
    pub excluded: Vec<(NodeId, String)>,
}

/// A ring round whose result was not accepted, handed with the star fallback's deltas to
/// [`crate::ports::CheckpointSink::publish`] (`EpochInput::audit`) so the sink can attribute
/// a wrong partial sum to the member that sent it (DESIGN §4b, `hanzod_allreduce::audit`).
#[derive(Debug, Clone, PartialEq)]
pub struct RoundAudit {
    /// The round's ring version.
    pub version: u64,
    /// The round's members in ring order with the f32 weights it ran with.
    pub members: Vec<(NodeId, f32)>,
    /// Every member's commitment (its delta's hash: the star upload must match it).
    pub commits: Vec<(NodeId, Commit)>,
    /// The evidence handed in, one entry per member that sent it.
    pub evidence: Vec<RoundEvidence>,
    /// Members whose sketch the check proved not to be their held delta's
    /// ([`crate::ports::CheckRefusal::unbound`]).
    pub unbound: Vec<NodeId>,
    /// Members that withheld what the check needed from them (their check sketch, or their
    /// delta when audited: [`Fallback::CheckSketchMissing`], [`Fallback::AuditWithheld`]),
    /// making the round fall back.
    pub withheld: Vec<NodeId>,
}

/// One member's round evidence (`SubmitEvidence`, `node.proto`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundEvidence {
    /// The member that received the pieces and handed them in.
    pub receiver: NodeId,
    /// The member it says signed them (its predecessor in the round).
    pub signer: NodeId,
    /// The signed piece headers, 137 bytes each (`hanzod_allreduce::wire::SIGNED_PIECE_LEN`),
    /// unchecked: the sink verifies them.
    pub pieces: Vec<Vec<u8>>,
}

/// How long each step may take, ms (the reduce's limit is [`reduce_budget`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundTimeouts {
    /// From the reveal to every sketch and spot-checked upload (default 120 000: an upload
    /// of a 1.2 GB delta at 100 Mbit/s takes 96 s).
    pub sketch_ms: u64,
    /// From the check to the result uploaded (default 120 000).
    pub upload_ms: u64,
}

impl Default for RoundTimeouts {
    fn default() -> Self {
        RoundTimeouts {
            sketch_ms: 120_000,
            upload_ms: 120_000,
        }
    }
}

/// The time budget of one ring all-reduce round, ms: `floor_ms + slack × 2(n−1)/n × bytes ×
/// 8 / (mbps × 10⁶)` s, the bandwidth-optimal ring all-reduce's transfer time on a ring whose
/// weakest link carries `bottleneck_mbps` Mbit/s (Patarasuk & Yuan 2009, "Bandwidth optimal
/// all-reduce algorithms for clusters of workstations", §3: each member sends and receives
/// 2(n−1)/n of the vector), stretched by `slack`. `n ≤ 1` needs no transfer (`floor_ms`); an
/// unusable bandwidth or slack (≤ 0, NaN) assumes 1 Mbit/s. Capped at 24 h.
pub fn reduce_budget(bytes: u64, n: usize, bottleneck_mbps: f64, slack: f64, floor_ms: u64) -> u64 {
    const CAP_MS: f64 = 24.0 * 3600.0 * 1000.0;
    if n <= 1 {
        return floor_ms;
    }
    let usable = |x: f64| x.is_finite() && x > 0.0;
    let mbps = if usable(bottleneck_mbps) {
        bottleneck_mbps
    } else {
        1.0
    };
    let slack = if usable(slack) { slack } else { 1.0 };
    let share = 2.0 * (n as f64 - 1.0) / n as f64;
    let ms = share * bytes as f64 * 8.0 / (mbps * 1e6) * 1000.0 * slack;
    (floor_ms as f64 + ms).min(CAP_MS) as u64
}

/// Where the epoch's aggregation is.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Waiting for commitments.
    Commit,
    /// Seed revealed; waiting for sketches (and the selected members' uploads).
    Sketch,
    /// Waiting for the caller's weights.
    Score,
    /// The all-reduce runs at this ring version.
    Reduce {
        /// The ring version of the running round.
        version: u64,
    },
    /// Every round member committed to the same result: `from` uploads it while every
    /// member sketches its delta under the check seed.
    Verify {
        /// The ring version of the round.
        version: u64,
        /// The member asked to upload the result.
        from: NodeId,
    },
    /// Waiting for the caller's check of the uploaded result.
    Check {
        /// The ring version of the checked round.
        version: u64,
    },
    /// Terminal: the result was accepted.
    Done,
    /// Terminal: the epoch merges as in star mode (every committed member uploads).
    Star {
        /// Why.
        reason: Fallback,
    },
    /// Terminal: every member was excluded; the epoch keeps its base checkpoint.
    Kept,
    /// Terminal: fewer than the minimum committed.
    Failed {
        /// Committed members.
        committed: usize,
        /// The minimum.
        needed: usize,
    },
}

impl Step {
    /// A short name for logs and the `RoundAck.step` answer: "commit", "sketch", "score",
    /// "reduce", "verify", "check", "done", "star", "kept", "failed".
    pub fn name(&self) -> &'static str {
        match self {
            Step::Commit => "commit",
            Step::Sketch => "sketch",
            Step::Score => "score",
            Step::Reduce { .. } => "reduce",
            Step::Verify { .. } => "verify",
            Step::Check { .. } => "check",
            Step::Done => "done",
            Step::Star { .. } => "star",
            Step::Kept => "kept",
            Step::Failed { .. } => "failed",
        }
    }

    /// Whether the machine has finished.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Step::Done | Step::Star { .. } | Step::Kept | Step::Failed { .. }
        )
    }
}

/// Why a round fell back to the star.
#[derive(Debug, Clone, PartialEq)]
pub enum Fallback {
    /// Members reported different result hashes (the distinct hashes, sorted).
    HashesDiffer(Vec<[u8; 32]>),
    /// The caller's check of the result sketch against Σ wᵢ·sketchᵢ refused it.
    CheckFailed(String),
    /// The round did not complete by its deadline; these members had not reported.
    ReduceTimedOut(Vec<NodeId>),
    /// No member uploaded the agreed result.
    NoUpload,
    /// These round members did not sketch their delta under the check seed in time.
    CheckSketchMissing(Vec<NodeId>),
    /// These audited round members did not upload their delta in time.
    AuditWithheld(Vec<NodeId>),
    /// The caller could not score the sketches.
    ScoreFailed(String),
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fallback::HashesDiffer(h) => {
                write!(f, "members reported {} different result hashes", h.len())
            }
            Fallback::CheckFailed(why) => write!(f, "result check failed: {why}"),
            Fallback::ReduceTimedOut(late) => {
                write!(
                    f,
                    "round timed out; {} members had not reported",
                    late.len()
                )
            }
            Fallback::NoUpload => write!(f, "no member uploaded the agreed result"),
            Fallback::CheckSketchMissing(late) => write!(
                f,
                "{} members did not sketch their delta under the check seed",
                late.len()
            ),
            Fallback::AuditWithheld(late) => write!(
                f,
                "{} audited members did not upload their delta",
                late.len()
            ),
            Fallback::ScoreFailed(why) => write!(f, "sketches could not be scored: {why}"),
        }
    }
}

/// What happened to the machine.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// `node` committed (the caller checked the statement). A second commit of a node is
    /// ignored: the first is final.
    Committed {
        /// The member.
        node: NodeId,
        /// Its commitment.
        commit: Commit,
    },
    /// The spot-check selection among the committed members, answering [`Effect::Reveal`].
    Selected {
        /// Members that must also upload their delta.
        nodes: BTreeSet<NodeId>,
    },
    /// `node`'s sketch arrived (the caller checked it against the commitment's hash and
    /// keeps it).
    Sketched {
        /// The member.
        node: NodeId,
    },
    /// A selected member's delta arrived and matches its commitment.
    Uploaded {
        /// The member.
        node: NodeId,
    },
    /// The weights, answering [`Effect::Score`]: one per scored member (≥ 0, finite; a
    /// member missing counts as 0). They need not sum to 1: the machine normalises.
    Scored {
        /// Member → weight.
        weights: BTreeMap<NodeId, f64>,
    },
    /// The caller could not score (answering [`Effect::Score`]).
    ScoreFailed {
        /// Why.
        reason: String,
    },
    /// The ring manager published `version` with `members` (ring order).
    RingChanged {
        /// The new version.
        version: u64,
        /// Its members in ring order.
        members: Vec<NodeId>,
    },
    /// `node` finished the round of `version` with this result hash.
    Reported {
        /// The member.
        node: NodeId,
        /// The round's ring version.
        version: u64,
        /// SHA-256 of its result.
        result: [u8; 32],
    },
    /// `node`'s sketch of its committed delta under the check seed arrived (the caller keeps
    /// it).
    CheckSketched {
        /// The member.
        node: NodeId,
        /// The round it is for.
        version: u64,
    },
    /// The members the post-reduce audit selected among the round's, answering
    /// [`Effect::RevealCheck`] (their check SketchRequest asked for their delta): the check
    /// waits for their uploads ([`Input::Uploaded`]), which bind their sketches.
    Audited {
        /// The audited members.
        nodes: BTreeSet<NodeId>,
    },
    /// The caller's check of the agreed result, answering [`Effect::Check`].
    Checked {
        /// The ring version checked.
        version: u64,
        /// `Err(why)` when the result sketch is not Σ wᵢ·sketchᵢ or a member's report is
        /// refused.
        outcome: Result<(), String>,
    },
    /// The result upload by `node` arrived with this hash.
    MergedUploaded {
        /// The uploader.
        node: NodeId,
        /// SHA-256 of the uploaded result.
        hash: [u8; 32],
    },
    /// The result upload by `node` failed (refused, broken off).
    MergedFailed {
        /// The uploader.
        node: NodeId,
    },
    /// Time passed; steps whose deadline is at or before `now` close.
    Tick {
        /// Now.
        now: Timestamp,
    },
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Reveal the epoch's sketch seed to `to` (SketchRequest), then answer
    /// [`Input::Selected`] with those of `to` the spot-check selects (their SketchRequest
    /// says `upload_delta`).
    Reveal {
        /// The committed members.
        to: Vec<NodeId>,
    },
    /// A selected member did not upload its delta by the sketch deadline: it refused the
    /// inspection (the caller penalises it as a failed spot-check).
    Withheld {
        /// The member.
        node: NodeId,
    },
    /// Compute the weights of `members` from their sketches and answer [`Input::Scored`].
    Score {
        /// The members with a sketch (and, when selected, an upload).
        members: Vec<NodeId>,
    },
    /// Send ReduceStart for `version` to every member of `members` (ring order, weights
    /// summing to 1) and expect reports by `deadline`.
    StartReduce {
        /// The ring version.
        version: u64,
        /// Round members in ring order with their weights (f32 on the wire).
        members: Vec<(NodeId, f32)>,
    },
    /// Reveal the check seed to every round member (SketchRequest, check = true): each
    /// committed to the result, so the seed can no longer shape it. Answer
    /// [`Input::Audited`] with the members the post-reduce audit selects (their request
    /// asks for their delta too).
    RevealCheck {
        /// The round's ring version.
        version: u64,
        /// The round members.
        to: Vec<NodeId>,
    },
    /// Check the uploaded result `result`: its sketch under the check seed, computed from the
    /// uploaded bytes, against Σ wᵢ·sketchᵢ over `members`; then answer [`Input::Checked`].
    Check {
        /// The ring version.
        version: u64,
        /// The agreed result hash.
        result: [u8; 32],
        /// The weights the round ran with.
        members: Vec<(NodeId, f32)>,
    },
    /// Ask `from` to upload the round's result (UploadRequest kind MERGED), answered by
    /// [`Input::MergedUploaded`] or [`Input::MergedFailed`].
    RequestMerged {
        /// The uploader.
        from: NodeId,
        /// The ring version.
        version: u64,
    },
    /// The result `result` is accepted: publish it as the epoch's merged delta.
    Accept {
        /// SHA-256 of the merged delta.
        result: [u8; 32],
        /// The weights it was reduced with.
        members: Vec<(NodeId, f32)>,
    },
    /// Fall back to the star: ask each of `members` for its delta and, when `evidence`, for
    /// its round evidence (UploadRequest kinds DELTA and EVIDENCE).
    Fallback {
        /// Why.
        reason: Fallback,
        /// Committed members still in the ring.
        members: Vec<NodeId>,
        /// The round version whose evidence to collect, when a round ran.
        evidence: Option<u64>,
    },
    /// Every member was excluded: keep the base checkpoint.
    KeepBase,
    /// Fewer than the minimum committed: the epoch cannot aggregate.
    TooFew {
        /// Committed members.
        committed: usize,
        /// The minimum.
        needed: usize,
    },
}

/// One epoch's ring aggregation (see the [module](self) docs).
#[derive(Debug, Clone)]
pub struct RingRound {
    epoch: u32,
    min_members: usize,
    timeouts: RoundTimeouts,
    /// The current ring: version and members in ring order.
    version: u64,
    ring: Vec<NodeId>,
    step: Step,
    deadline: Option<Timestamp>,
    commits: BTreeMap<NodeId, Commit>,
    selected: BTreeSet<NodeId>,
    sketched: BTreeSet<NodeId>,
    uploaded: BTreeSet<NodeId>,
    /// Normalised weights of the round members (all > 0), as scored and renormalised.
    weights: BTreeMap<NodeId, f64>,
    reports: BTreeMap<NodeId, [u8; 32]>,
    /// The agreed result of the checked round.
    agreed: Option<[u8; 32]>,
    /// Members asked to upload the result, in order.
    asked: Vec<NodeId>,
    /// Whether the asked member's upload matched the agreed result.
    merged: bool,
    /// Round members whose check sketch arrived.
    check_sketched: BTreeSet<NodeId>,
    /// Round members the post-reduce audit selected, and those whose upload arrived.
    audited: BTreeSet<NodeId>,
    audit_uploaded: BTreeSet<NodeId>,
    /// The version of the last round started, for evidence.
    last_round: Option<u64>,
    /// The members and weights the last round started with (ring order).
    round: Vec<(NodeId, f32)>,
    /// How long the caller budgets a round of the current members ([`reduce_budget`]), ms.
    reduce_ms: u64,
}

impl RingRound {
    /// The aggregation of `epoch` on ring `version` with `ring` (members in ring order),
    /// starting at `now` with the commit step closing at `commit_deadline` (the epoch's
    /// deadline). `min_members` is the fewest commitments the epoch can aggregate with (the
    /// job's `min_nodes`, at least 1); `reduce_ms` the round budget ([`reduce_budget`]).
    pub fn new(
        epoch: u32,
        version: u64,
        ring: Vec<NodeId>,
        min_members: usize,
        commit_deadline: Timestamp,
        timeouts: RoundTimeouts,
        reduce_ms: u64,
    ) -> RingRound {
        RingRound {
            epoch,
            min_members: min_members.max(1),
            timeouts,
            version,
            ring,
            step: Step::Commit,
            deadline: Some(commit_deadline),
            commits: BTreeMap::new(),
            selected: BTreeSet::new(),
            sketched: BTreeSet::new(),
            uploaded: BTreeSet::new(),
            weights: BTreeMap::new(),
            reports: BTreeMap::new(),
            agreed: None,
            asked: Vec::new(),
            merged: false,
            check_sketched: BTreeSet::new(),
            audited: BTreeSet::new(),
            audit_uploaded: BTreeSet::new(),
            last_round: None,
            round: Vec::new(),
            reduce_ms,
        }
    }

    /// The step the aggregation is at.
    pub fn step(&self) -> &Step {
        &self.step
    }

    /// The epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// When the current step closes (send [`Input::Tick`] then); `None` when waiting on the
    /// caller (Score, Check) or terminal.
    pub fn deadline(&self) -> Option<Timestamp> {
        self.deadline
    }

    /// The commitments recorded.
    pub fn commits(&self) -> &BTreeMap<NodeId, Commit> {
        &self.commits
    }

    /// The members the spot-check selected.
    pub fn selected(&self) -> &BTreeSet<NodeId> {
        &self.selected
    }

    /// The result hash every round member reported, once they agreed.
    pub fn agreed(&self) -> Option<[u8; 32]> {
        self.agreed
    }

    /// The largest committed delta, bytes (what a round's budget is computed from).
    pub fn largest_commit(&self) -> u64 {
        self.commits
            .values()
            .map(|c| c.total_bytes)
            .max()
            .unwrap_or(0)
    }

    /// The members and weights of the round that last started, in ring order (empty before
    /// the first).
    pub fn round(&self) -> &[(NodeId, f32)] {
        &self.round
    }

    /// The ring version of the round that last started (`None` before the first).
    pub fn last_round(&self) -> Option<u64> {
        self.last_round
    }

    /// The members that reported a result for the round that last started: those that
    /// hold the round's evidence (a fallback asks them for it).
    pub fn reported(&self) -> impl Iterator<Item = &NodeId> {
        self.reports.keys()
    }

    /// The current members in ring order with their weights (empty before Score).
    fn round_members(&self) -> Vec<(NodeId, f32)> {
        self.ring
            .iter()
            .filter_map(|n| self.weights.get(n).map(|w| (*n, *w as f32)))
            .collect()
    }

    /// Whether the machine expects `node`'s delta now: a spot-checked member in the Sketch
    /// step, or an audited member in the Verify step.
    pub fn wants_upload(&self, node: &NodeId) -> bool {
        match self.step {
            Step::Sketch => self.selected.contains(node) && !self.uploaded.contains(node),
            Step::Verify { .. } => {
                self.audited.contains(node) && !self.audit_uploaded.contains(node)
            }
            _ => false,
        }
    }

    /// Whether `node` is expected to send its sketch now (a committed member in the Sketch
    /// step that has not sent one).
    pub fn wants_sketch(&self, node: &NodeId) -> bool {
        self.step == Step::Sketch
            && self.commits.contains_key(node)
            && !self.sketched.contains(node)
    }

    /// Updates the round budget used by the next round start (the caller recomputes it when
    /// the ring's bottleneck or the member count changes).
    pub fn set_reduce_budget(&mut self, reduce_ms: u64) {
        self.reduce_ms = reduce_ms;
    }

    /// Applies `input` at time `now` and returns what the caller must do, in order.
    pub fn apply(&mut self, input: Input, now: Timestamp) -> Vec<Effect> {
        let mut out = Vec::new();
        if self.step.is_terminal() {
            return out;
        }
        match input {
            Input::Committed { node, commit } => {
                if self.step == Step::Commit
                    && self.ring.contains(&node)
                    && !self.commits.contains_key(&node)
                {
                    self.commits.insert(node, commit);
                    if self.ring.iter().all(|n| self.commits.contains_key(n)) {
                        self.close_commit(now, &mut out);
                    }
                }
            }
            Input::Selected { nodes } => {
                if self.step == Step::Sketch {
                    self.selected = nodes
                        .into_iter()
                        .filter(|n| self.commits.contains_key(n))
                        .collect();
                    self.maybe_close_sketch(&mut out);
                }
            }
            Input::Sketched { node } => {
                if self.wants_sketch(&node) {
                    self.sketched.insert(node);
                    self.maybe_close_sketch(&mut out);
                }
            }
            Input::Uploaded { node } => {
                if self.step == Step::Sketch && self.selected.contains(&node) {
                    self.uploaded.insert(node);
                    self.maybe_close_sketch(&mut out);
                } else if matches!(self.step, Step::Verify { .. }) && self.audited.contains(&node) {
                    self.audit_uploaded.insert(node);
                    self.maybe_check(&mut out);
                }
            }
            Input::Audited { nodes } => {
                if matches!(self.step, Step::Verify { .. }) {
                    self.audited = nodes
                        .into_iter()
                        .filter(|n| self.round.iter().any(|(m, _)| m == n))
                        .collect();
                    self.maybe_check(&mut out);
                }
            }
            Input::Scored { weights } => {
                if self.step == Step::Score {
                    self.weights = normalise(
                        weights
                            .into_iter()
                            .filter(|(n, _)| self.ready(n) && self.ring.contains(n)),
                    );
                    if self.weights.is_empty() {
                        self.finish(Step::Kept);
                        out.push(Effect::KeepBase);
                    } else {
                        self.start_round(now, &mut out);
                    }
                }
            }
            Input::ScoreFailed { reason } => {
                if self.step == Step::Score {
                    self.fall_back(Fallback::ScoreFailed(reason), &mut out);
                }
            }
            Input::RingChanged { version, members } => {
                if version > self.version {
                    self.ring_changed(version, members, now, &mut out);
                }
            }
            Input::Reported {
                node,
                version,
                result,
            } => {
                if self.step == (Step::Reduce { version }) && self.weights.contains_key(&node) {
                    self.reports.entry(node).or_insert(result);
                    self.maybe_agree(now, &mut out);
                }
            }
            Input::CheckSketched { node, version } => {
                if matches!(self.step, Step::Verify { version: v, .. } if v == version)
                    && self.round.iter().any(|(n, _)| *n == node)
                {
                    self.check_sketched.insert(node);
                    self.maybe_check(&mut out);
                }
            }
            Input::Checked { version, outcome } => {
                if self.step == (Step::Check { version }) {
                    match outcome {
                        Ok(()) => {
                            let result = self.agreed.unwrap_or_default();
                            self.finish(Step::Done);
                            out.push(Effect::Accept {
                                result,
                                members: self.round.clone(),
                            });
                        }
                        Err(why) => self.fall_back(Fallback::CheckFailed(why), &mut out),
                    }
                }
            }
            Input::MergedUploaded { node, hash } => {
                if matches!(self.step, Step::Verify { from, .. } if from == node) && !self.merged {
                    if Some(hash) == self.agreed {
                        self.merged = true;
                        self.maybe_check(&mut out);
                    } else {
                        self.ask_next_uploader(now, &mut out);
                    }
                }
            }
            Input::MergedFailed { node } => {
                if matches!(self.step, Step::Verify { from, .. } if from == node) && !self.merged {
                    self.ask_next_uploader(now, &mut out);
                }
            }
            Input::Tick { now: t } => {
                if self.deadline.is_some_and(|d| t >= d) {
                    self.timed_out(t, &mut out);
                }
            }
        }
        out
    }

    /// A committed member that sent its sketch and, when selected, its delta.
    fn ready(&self, n: &NodeId) -> bool {
        self.sketched.contains(n) && (!self.selected.contains(n) || self.uploaded.contains(n))
    }

    fn finish(&mut self, step: Step) {
        self.step = step;
        self.deadline = None;
    }

    fn close_commit(&mut self, now: Timestamp, out: &mut Vec<Effect>) {
        let committed: Vec<NodeId> = self
            .ring
            .iter()
            .filter(|n| self.commits.contains_key(n))
            .copied()
            .collect();
        if committed.len() < self.min_members {
            let (committed, needed) = (committed.len(), self.min_members);
            self.finish(Step::Failed { committed, needed });
            out.push(Effect::TooFew { committed, needed });
            return;
        }
        self.step = Step::Sketch;
        self.deadline = Some(now.plus_ms(self.timeouts.sketch_ms));
        out.push(Effect::Reveal { to: committed });
    }

    /// The committed members still in the ring, in ring order.
    fn live_committed(&self) -> Vec<NodeId> {
        self.ring
            .iter()
            .filter(|n| self.commits.contains_key(n))
            .copied()
            .collect()
    }

    fn maybe_close_sketch(&mut self, out: &mut Vec<Effect>) {
        if self.step == Step::Sketch && self.live_committed().iter().all(|n| self.ready(n)) {
            self.close_sketch(out);
        }
    }

    fn close_sketch(&mut self, out: &mut Vec<Effect>) {
        let live = self.live_committed();
        for n in &live {
            if self.selected.contains(n) && !self.uploaded.contains(n) {
                out.push(Effect::Withheld { node: *n });
            }
        }
        let members: Vec<NodeId> = live.into_iter().filter(|n| self.ready(n)).collect();
        if members.is_empty() {
            self.finish(Step::Kept);
            out.push(Effect::KeepBase);
            return;
        }
        self.step = Step::Score;
        self.deadline = None;
        out.push(Effect::Score { members });
    }

    fn start_round(&mut self, now: Timestamp, out: &mut Vec<Effect>) {
        self.reports.clear();
        self.step = Step::Reduce {
            version: self.version,
        };
        self.deadline = Some(now.plus_ms(self.reduce_ms));
        self.last_round = Some(self.version);
        self.round = self.round_members();
        out.push(Effect::StartReduce {
            version: self.version,
            members: self.round.clone(),
        });
    }

    fn ring_changed(
        &mut self,
        version: u64,
        members: Vec<NodeId>,
        now: Timestamp,
        out: &mut Vec<Effect>,
    ) {
        self.version = version;
        self.ring = members;
        match self.step.clone() {
            // Members that joined take part once they commit; the lost no longer hold the
            // step open.
            Step::Commit
                if !self.ring.is_empty()
                    && self.ring.iter().all(|n| self.commits.contains_key(n)) =>
            {
                self.close_commit(now, out)
            }
            Step::Sketch => self.maybe_close_sketch(out),
            Step::Score => {}
            Step::Reduce { .. } => {
                let ring = self.ring.clone();
                self.weights.retain(|n, _| ring.contains(n));
                self.weights = normalise(std::mem::take(&mut self.weights));
                if self.weights.is_empty() {
                    self.finish(Step::Kept);
                    out.push(Effect::KeepBase);
                    return;
                }
                // Every member restarts on the new version, lost one or not: a member never
                // mixes pieces of two versions.
                self.start_round(now, out);
            }
            // The agreed result was complete before anyone left; only the uploader may be gone
            // (a member lost before its check sketch arrived makes the check fall back at the
            // deadline: its weight is in the result).
            Step::Verify { from, .. } if !self.merged && !self.ring.contains(&from) => {
                self.ask_next_uploader(now, out)
            }
            _ => {}
        }
    }

    /// Every round member reported: agree on the result (or fall back), then ask for the
    /// upload and reveal the check seed.
    fn maybe_agree(&mut self, now: Timestamp, out: &mut Vec<Effect>) {
        let Step::Reduce { version } = self.step else {
            return;
        };
        if self.weights.keys().any(|n| !self.reports.contains_key(n)) {
            return;
        }
        let distinct: BTreeSet<[u8; 32]> = self.reports.values().copied().collect();
        let agreed = match distinct.iter().next() {
            Some(h) if distinct.len() == 1 => *h,
            _ => {
                self.fall_back(Fallback::HashesDiffer(distinct.into_iter().collect()), out);
                return;
            }
        };
        self.agreed = Some(agreed);
        self.merged = false;
        self.check_sketched.clear();
        self.audited.clear();
        self.audit_uploaded.clear();
        self.asked.clear();
        out.push(Effect::RevealCheck {
            version,
            to: self.round.iter().map(|(n, _)| *n).collect(),
        });
        self.step = Step::Verify {
            version,
            from: self.round[0].0,
        };
        self.ask_next_uploader(now, out);
    }

    /// The result uploaded and every check sketch in: hand the check to the caller.
    fn maybe_check(&mut self, out: &mut Vec<Effect>) {
        let Step::Verify { version, .. } = self.step else {
            return;
        };
        if !self.merged
            || self
                .round
                .iter()
                .any(|(n, _)| !self.check_sketched.contains(n))
            || !self.audited.is_subset(&self.audit_uploaded)
        {
            return;
        }
        self.step = Step::Check { version };
        self.deadline = None;
        out.push(Effect::Check {
            version,
            result: self.agreed.unwrap_or_default(),
            members: self.round.clone(),
        });
    }

    /// Asks the next round member (rotating with the epoch, still in the ring, not asked
    /// yet) for the result; falls back when none is left.
    fn ask_next_uploader(&mut self, now: Timestamp, out: &mut Vec<Effect>) {
        let Step::Verify { version, .. } = self.step else {
            return;
        };
        let members: Vec<NodeId> = self
            .round
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| self.ring.contains(n))
            .collect();
        let next = (!members.is_empty())
            .then(|| {
                let start = self.epoch as usize % members.len();
                (0..members.len())
                    .map(|i| members[(start + i) % members.len()])
                    .find(|n| !self.asked.contains(n))
            })
            .flatten();
        match next {
            Some(from) => {
                self.asked.push(from);
                self.step = Step::Verify { version, from };
                self.deadline = Some(now.plus_ms(self.timeouts.upload_ms));
                out.push(Effect::RequestMerged { from, version });
            }
            None => self.fall_back(Fallback::NoUpload, out),
        }
    }

    fn fall_back(&mut self, reason: Fallback, out: &mut Vec<Effect>) {
        let members = self.live_committed();
        let evidence = self.last_round;
        self.finish(Step::Star {
            reason: reason.clone(),
        });
        out.push(Effect::Fallback {
            reason,
            members,
            evidence,
        });
    }

    fn timed_out(&mut self, now: Timestamp, out: &mut Vec<Effect>) {
        match self.step {
            Step::Commit => self.close_commit(now, out),
            Step::Sketch => self.close_sketch(out),
            Step::Reduce { .. } => {
                let late: Vec<NodeId> = self
                    .weights
                    .keys()
                    .filter(|n| !self.reports.contains_key(n))
                    .copied()
                    .collect();
                self.fall_back(Fallback::ReduceTimedOut(late), out);
            }
            Step::Verify { .. } => {
                let late: Vec<NodeId> = self
                    .round
                    .iter()
                    .map(|(n, _)| *n)
                    .filter(|n| !self.check_sketched.contains(n))
                    .collect();
                let withheld: Vec<NodeId> = self
                    .audited
                    .difference(&self.audit_uploaded)
                    .copied()
                    .collect();
                if !late.is_empty() {
                    self.fall_back(Fallback::CheckSketchMissing(late), out);
                } else if !withheld.is_empty() {
                    self.fall_back(Fallback::AuditWithheld(withheld), out);
                } else if !self.merged {
                    self.ask_next_uploader(now, out);
                }
            }
            _ => {}
        }
    }
}

/// Keeps the positive, finite weights and scales them to sum to 1 (f64). Empty when none is
/// positive.
fn normalise(weights: impl IntoIterator<Item = (NodeId, f64)>) -> BTreeMap<NodeId, f64> {
    let kept: BTreeMap<NodeId, f64> = weights
        .into_iter()
        .filter(|(_, w)| w.is_finite() && *w > 0.0)
        .collect();
    let total: f64 = kept.values().sum();
    if !(total.is_finite() && total > 0.0) {
        return BTreeMap::new();
    }
    kept.into_iter().map(|(n, w)| (n, w / total)).collect()
}

#[cfg(test)]
mod tests;
