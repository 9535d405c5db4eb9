//! The reference worker of `hanzod node` (DESIGN §5–§6, paper §3.1): what a node does with
//! an [`EpochAssignment`].
//!
//! 1. Fetch the base checkpoint (`FetchCheckpoint`) and check its bytes against the
//!    reference (the job's `base` in epoch 0 when it has one, the checkpoint published for
//!    the previous epoch after); in epoch 0 of a job without a base derive the recipe's
//!    initial weights from its seed instead.
//! 2. Run the recipe's local steps on this node's batch stream with burn
//!    ([`hanzod_train::Trainer::local_delta`]: SGD for the MLP, AdamW for a language model,
//!    on every parameter or on a LoRA adapter; off the async runtime): deterministic for a
//!    given seed, job, node and step, so a validator can re-run them.
//! 3. Upload the delta (trained − start, or the trained adapter of a LoRA job) as an HZDL
//!    file, with the signed statement carrying the claimed loss (the pre-delta weights'
//!    loss on the first step's batch).
//!
//! A [`Behaviour`] other than [`Behaviour::Honest`] makes the node Byzantine, for fault
//! injection (`hanzod node --byzantine`, `hanzod demo --byzantine`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hanzod_actors::job::EpochAssignment;
use hanzod_actors::ports::Clock;
use hanzod_actors::types::Timestamp;
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tonic::transport::Channel;

use hanzod_protocol::identity::Identity;
use hanzod_train::{self, Weights};

use crate::attack::{Attack, Forge, ParseAttackError};
use crate::collude::Collusion;

/// How the node trains: honestly, or one of the attacks the validator must catch.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Behaviour {
    /// Trains as the recipe says and reports what it measured.
    #[default]
    Honest,
    /// Poisons: uploads −`scale` × its honest delta (sign-flipped and scaled; for a LoRA
    /// adapter, its `B` factors, so the update `B·A` is −`scale` × the honest one), with its
    /// honest claimed loss. The quality score and the robust merge must keep it out.
    Poison {
        /// The factor (> 0), e.g. 10.
        scale: f32,
    },
    /// Lies about its loss: uploads its honest delta but claims `factor` × the loss it
    /// measured. A spot-check must catch it (DESIGN §6: within 5 %).
    LieLoss {
        /// The factor (≠ 1, > 0), e.g. 0.5.
        factor: f64,
    },
    /// One of the attacks of [`crate::attack`] (issue 19): uploads what
    /// [`Attack::forge`] makes of its honest delta and claims [`Attack::claim`] of its
    /// measured loss. How the agent feeds each one:
    ///
    /// - [`Attack::Stale`]: trains from the base it was assigned `epochs` epochs ago (the
    ///   agent keeps the bases of the last [`MAX_STALE_EPOCHS`] + 1 epochs of a job); when
    ///   it did not see that epoch, it trains from the assigned base (honestly).
    /// - [`Attack::CopyLastMerged`]: skips training like [`RingFault::FreeRide`] (its claimed
    ///   loss is measured honestly on its batch); the last merged update is this epoch's
    ///   base minus the previous epoch's base, or none (a zero delta) in epoch 0, for a
    ///   LoRA job, or when it did not see the previous epoch.
    /// - The colluding attacks ([`Attack::colludes`]: ALIE, IPM, Identical, CopyPeer) read
    ///   the colluders' honest deltas through the side channel ([`crate::collude`],
    ///   `--collude`); without one they forge from their own delta alone (ALIE and
    ///   Identical then upload it unchanged, IPM −eps × it, CopyPeer a rescaled copy of it).
    ///   ALIE's `n` is the member count of the job's last ring the agent applied, else
    ///   2f + 1 (f: the colluders found; the smallest network with an honest majority).
    /// - The noise attacks draw from a generator seeded by the node, job and epoch, so a
    ///   retried epoch forges the same bytes.
    Attack {
        /// The attack.
        attack: Attack,
    },
}

/// The oldest base a [`Attack::Stale`] node trains from: `epochs` up to this many (the
/// agent keeps that many bases per job besides the current one).
pub const MAX_STALE_EPOCHS: u32 = 16;

/// The `--byzantine` values of [`Behaviour`] and [`RingFault`], for error messages.
pub const BYZANTINE_FORMS: &str = "honest, poison[:scale], lie-loss[:factor], \
     tamper-allreduce[:perturbation], substitute[:perturbation], free-ride, sign-flip, \
     scale:<k>, noise[:sigma], alie[:z], ipm[:eps], copy-peer[:rescale[:noise]], \
     copy-last[:rescale[:noise]], lazy[:scale], stale[:epochs], identical";

impl std::str::FromStr for Behaviour {
    type Err = String;

    /// `honest`, `poison`, `poison:<scale>`, `lie-loss` or `lie-loss:<factor>` (defaults:
    /// scale 10, factor 0.5), or an [`Attack`] (`sign-flip`, `scale:<k>`, `noise[:sigma]`,
    /// `alie[:z]`, `ipm[:eps]`, `copy-peer[:rescale[:noise]]`,
    /// `copy-last[:rescale[:noise]]`, `lazy[:scale]`, `stale[:epochs]` (epochs up to
    /// [`MAX_STALE_EPOCHS`]), `identical`: [`Behaviour::Attack`]). `poison:s` uploads what
    /// `scale:-s` does; `lie-loss` is read as [`Behaviour::LieLoss`].
    fn from_str(s: &str) -> Result<Behaviour, String> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let num = |default: f64| -> Result<f64, String> {
            match arg {
                None => Ok(default),
                Some(a) => a
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .ok_or_else(|| format!("{a:?} is not a positive number")),
            }
        };
        match kind {
            "honest" if arg.is_none() => Ok(Behaviour::Honest),
            "poison" => Ok(Behaviour::Poison {
                scale: num(10.0)? as f32,
            }),
            "lie-loss" => {
                let factor = num(0.5)?;
                if factor == 1.0 {
                    return Err("a lie-loss factor of 1 is the truth".into());
                }
                Ok(Behaviour::LieLoss { factor })
            }
            _ => match s.parse::<Attack>() {
                Ok(Attack::Stale { epochs }) if epochs > MAX_STALE_EPOCHS => Err(format!(
                    "stale: the node agent keeps the bases of the last {MAX_STALE_EPOCHS} epochs, not {epochs}"
                )),
                Ok(attack) => Ok(Behaviour::Attack { attack }),
                Err(ParseAttackError::Unknown(_)) => {
                    Err(format!("unknown behaviour {s:?} (one of: {BYZANTINE_FORMS})"))
                }
                Err(e) => Err(e.to_string()),
            },
        }
    }
}

/// A fault of the ring-aggregation side of a node (DESIGN §6.4), for fault injection. Kept
/// apart from [`Behaviour`] (the training attacks) so that matches on [`Behaviour`] elsewhere
/// stay exhaustive; both are chosen with one `--byzantine` value ([`Byzantine`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RingFault {
    /// Takes part in ring aggregation honestly.
    #[default]
    Honest,
    /// Adds `perturbation` to every value of its own weighted contribution `w_i · δ_i`
    /// before the all-reduce (the allreduce crate offers no hook into the chunks a member
    /// forwards, so the tampering is on the member's input, not on what it relays). Its
    /// commitment and sketches stay those of its honest delta, so the result no longer
    /// equals `Σ w_i · δ_i`, and the orchestrator's sketch check must catch it.
    TamperAllreduce {
        /// Added to every value (finite, ≠ 0), e.g. 1.0.
        perturbation: f32,
    },
    /// Commits to its honest delta `δ_i` but reduces `δ_i + perturbation` (every value) and
    /// sketches that, under both seeds: the round's result check passes, and only a held
    /// copy of its committed delta (a spot-check before the reduce, the audit after it)
    /// shows its sketches are not its delta's.
    Substitute {
        /// Added to every value of its delta (finite, ≠ 0), e.g. 0.001.
        perturbation: f32,
    },
    /// Skips training and commits the previous epoch's global update (this epoch's base
    /// minus the previous epoch's base; a zero delta in epoch 0, for a LoRA job, or when it
    /// did not see the previous epoch's base) as its own delta, with the claimed loss
    /// measured honestly on its batch. It still takes part in the round honestly.
    FreeRide,
}

/// What `--byzantine` selects: a training attack ([`Behaviour`]) or a ring-aggregation
/// fault ([`RingFault`]), one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Byzantine {
    /// How it trains.
    pub behaviour: Behaviour,
    /// How it aggregates over the ring.
    pub ring: RingFault,
}

impl std::str::FromStr for Byzantine {
    type Err = String;

    /// Every [`Behaviour`] value, `tamper-allreduce[:<perturbation>]` (default 1.0),
    /// `substitute[:<perturbation>]` (default 0.001) or `free-ride` ([`BYZANTINE_FORMS`]).
    fn from_str(s: &str) -> Result<Byzantine, String> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        let perturbation = |default: f32| match arg {
            None => Ok(default),
            Some(a) => a
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite() && *v != 0.0)
                .ok_or_else(|| format!("{a:?} is not a finite, non-zero number")),
        };
        let ring = match kind {
            "tamper-allreduce" => RingFault::TamperAllreduce {
                perturbation: perturbation(1.0)?,
            },
            "substitute" => RingFault::Substitute {
                perturbation: perturbation(0.001)?,
            },
            "free-ride" if arg.is_none() => RingFault::FreeRide,
            _ => {
                let behaviour = s.parse::<Behaviour>()?;
                return Ok(Byzantine {
                    behaviour,
                    ring: RingFault::Honest,
                });
            }
        };
        Ok(Byzantine {
            behaviour: Behaviour::Honest,
            ring,
        })
    }
}

/// What one epoch's work produced.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochWork {
    /// The claimed loss sent (the measured one unless the node lies).
    pub claimed_loss: f64,
    /// The loss of the last local step's batch, after training.
    pub last_loss: f64,
    /// SHA-256 of the uploaded HZDL bytes.
    pub delta_hash: [u8; 32],
    /// Size of the uploaded HZDL bytes.
    pub delta_bytes: usize,
    /// Time to fetch the base checkpoint, ms.
    pub fetch_ms: u64,
    /// Time of the local steps, ms.
    pub train_ms: u64,
    /// Time of the upload, ms.
    pub upload_ms: u64,
    /// The daemon had already recorded this delta (a retry after a lost ack).
    pub already_delivered: bool,
}

/// Why an epoch's work failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrainError {
    /// The recipe names something this worker cannot train.
    #[error("recipe: {0}")]
    Recipe(hanzod_train::RecipeError),
    /// The checkpoint could not be fetched (the daemon's status, or the transfer broke).
    #[error("fetching checkpoint {checkpoint}: {reason}")]
    Fetch {
        /// The reference.
        checkpoint: String,
        /// Why.
        reason: String,
    },
    /// The daemon refused the checkpoint download (its status).
    #[error("fetching the checkpoint: {}: {message}", hanzod_protocol::status::code_name(*.code))]
    FetchStatus {
        /// The status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// The assignment's deadline passed before the work was done.
    #[error("the epoch deadline passed")]
    Expired,
    /// The checkpoint's bytes do not hash to its reference, or do not load.
    #[error("checkpoint {checkpoint} is bad: {reason}")]
    BadCheckpoint {
        /// The reference.
        checkpoint: String,
        /// Why.
        reason: String,
    },
    /// Training failed (non-finite loss, the worker thread died, …).
    #[error("training: {0}")]
    Training(String),
    /// The daemon refused the delta, or the upload broke.
    #[error("upload: {0}")]
    Upload(String),
    /// Ring aggregation: the commitment to the delta was refused or failed.
    #[error("commit: {0}")]
    Commit(String),
}

/// Checkpoints above this size are refused before download (the built-in models are a few
/// KiB; a bound keeps a confused orchestrator from filling the node's memory).
pub const MAX_CHECKPOINT_BYTES: u64 = 1 << 30;

/// Downloads checkpoint `reference` (a CID) and checks its bytes: the header's SHA-256,
/// and the CID recomputed as Kubo's `ipfs add --cid-version=1` would.
///
/// Errors: [`TrainError::Fetch`] for the daemon's refusal or a broken transfer,
/// [`TrainError::BadCheckpoint`] when the bytes do not match.
pub async fn fetch_checkpoint(
    client: &mut NodeServiceClient<Channel>,
    session: &[u8],
    reference: &str,
) -> Result<Vec<u8>, TrainError> {
    let fetch = |reason: String| TrainError::Fetch {
        checkpoint: reference.to_string(),
        reason,
    };
    let bad = |reason: String| TrainError::BadCheckpoint {
        checkpoint: reference.to_string(),
        reason,
    };
    hanzod_protocol::cid::parse_cid(reference).map_err(|e| bad(e.to_string()))?;
    let mut stream = client
        .fetch_checkpoint(pb::FetchCheckpointRequest {
            session: session.to_vec(),
            checkpoint: reference.to_string(),
        })
        .await
        .map_err(|s| TrainError::FetchStatus {
            code: s.code(),
            message: s.message().to_string(),
        })?
        .into_inner();
    let header = match stream.message().await {
        Ok(Some(pb::CheckpointChunk {
            part: Some(pb::checkpoint_chunk::Part::Header(h)),
        })) => h,
        Ok(_) => return Err(fetch("the stream did not start with a header".into())),
        Err(s) => return Err(fetch(hanzod_protocol::status::status_line(&s))),
    };
    if header.total_bytes > MAX_CHECKPOINT_BYTES {
        return Err(bad(format!(
            "{} bytes is above the {MAX_CHECKPOINT_BYTES}-byte bound",
            header.total_bytes
        )));
    }
    let mut bytes = Vec::with_capacity(header.total_bytes.min(1 << 20) as usize);
    loop {
        match stream.message().await {
            Ok(Some(pb::CheckpointChunk {
                part: Some(pb::checkpoint_chunk::Part::Data(d)),
            })) => {
                if (bytes.len() + d.len()) as u64 > header.total_bytes {
                    return Err(bad("more bytes than the header announced".into()));
                }
                bytes.extend_from_slice(&d);
            }
            Ok(None) => break,
            Ok(Some(_)) => return Err(fetch("a second header".into())),
            Err(s) => return Err(fetch(hanzod_protocol::status::status_line(&s))),
        }
    }
    if bytes.len() as u64 != header.total_bytes {
        return Err(fetch(format!(
            "{} of {} bytes arrived",
            bytes.len(),
            header.total_bytes
        )));
    }
    let sha: [u8; 32] = Sha256::digest(&bytes).into();
    if header.sha256 != sha {
        return Err(fetch("the bytes do not match the header's SHA-256".into()));
    }
    // The reference is the CID (Kubo's `ipfs add --cid-version=1`): recompute it.
    let found = hanzod_protocol::cid::cid_of(&bytes).to_string();
    if found != reference {
        return Err(bad(format!("the bytes have CID {found}")));
    }
    Ok(bytes)
}

/// [`fetch_checkpoint`] through the live session, retried like an upload.
async fn fetch_with_retry(
    live: &mut watch::Receiver<Option<WorkerSession>>,
    clock: &Arc<dyn Clock>,
    deadline: Timestamp,
    reference: &str,
) -> Result<Vec<u8>, TrainError> {
    let got = with_live_session(live, clock, deadline, |s| async move {
        let mut client = s.client.clone();
        match fetch_checkpoint(&mut client, &s.session, reference).await {
            Err(TrainError::FetchStatus { code, message }) => {
                Err(tonic::Status::new(code, message))
            }
            other => Ok(other),
        }
    })
    .await;
    match got {
        Ok(r) => r,
        Err(st) => Err(TrainError::Fetch {
            checkpoint: reference.to_string(),
            reason: hanzod_protocol::status::status_line(&st),
        }),
    }
}

/// The worker's connection to the daemon for one session.
#[derive(Clone)]
pub struct WorkerSession {
    /// The node service client.
    pub client: NodeServiceClient<Channel>,
    /// The session token.
    pub session: Vec<u8>,
    /// Upload chunk size, bytes (`RegisterResponse.delta_chunk_bytes`).
    pub chunk_bytes: usize,
    /// The node's identity.
    pub identity: Identity,
}

impl std::fmt::Debug for WorkerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerSession")
            .field("chunk_bytes", &self.chunk_bytes)
            .finish_non_exhaustive()
    }
}

/// Statuses worth another try: the daemon is busy or restarting, or the session was
/// replaced (`UNAUTHENTICATED` with [`hanzod_protocol::status::UNKNOWN_SESSION`]; the next try uses
/// the live session).
fn transient(st: &tonic::Status) -> bool {
    match st.code() {
        tonic::Code::ResourceExhausted | tonic::Code::Unavailable => true,
        tonic::Code::Unauthenticated => st.message() == hanzod_protocol::status::UNKNOWN_SESSION,
        _ => false,
    }
}

/// Runs `attempt` with the live session until it succeeds, fails for good, or `deadline`
/// (ms since the Unix epoch, read from `clock`) passes: transient failures ([`transient`])
/// are retried with jittered exponential backoff (50 ms doubling to 2 s), and while no
/// session is live it waits for one.
pub(crate) async fn with_live_session<T, F, Fut>(
    live: &mut watch::Receiver<Option<WorkerSession>>,
    clock: &Arc<dyn Clock>,
    deadline: Timestamp,
    mut attempt: F,
) -> Result<T, tonic::Status>
where
    F: FnMut(WorkerSession) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut delay = Duration::from_millis(50);
    loop {
        let left = Duration::from_millis(deadline.since(clock.now()));
        if left.is_zero() {
            return Err(tonic::Status::deadline_exceeded(
                "the epoch deadline passed",
            ));
        }
        let current = live.borrow_and_update().clone();
        let Some(session) = current else {
            // Between sessions: wait for the next one (or the deadline). The agent gone:
            // nobody will open one.
            if let Ok(Err(_)) = tokio::time::timeout(left, live.changed()).await {
                return Err(tonic::Status::cancelled("the node agent stopped"));
            }
            continue;
        };
        match attempt(session).await {
            Err(st) if transient(&st) => {
                let jitter = rand::random::<f64>() * 0.5 + 0.5;
                tokio::time::sleep(delay.mul_f64(jitter).min(left)).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// Multiplies `delta` by −`scale` ([`Behaviour::Poison`]): every value of a full-parameter
/// delta, only the `lora_B` factors of a LoRA adapter (scaling both factors would scale
/// `B·A` by `scale²` and keep its sign).
fn poison(delta: &mut Weights, scale: f32) {
    let lora = delta.layout.delta_kind() == hanzod_protocol::hzdl::DeltaKind::Lora;
    let layout = delta.layout.clone();
    for e in layout.entries() {
        if lora && !e.name.ends_with(".lora_B.weight") {
            continue;
        }
        for x in &mut delta.data[e.offset..e.offset + e.len] {
            *x *= -scale;
        }
    }
}

/// A delta trained (or, for a Byzantine node, fabricated) for one assignment, not yet
/// delivered: uploaded in star aggregation ([`upload_trained`]), committed to and kept in
/// memory in ring aggregation (`crate::ring`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedDelta {
    /// The HZDL payload (its header's base version is the epoch).
    pub payload: Vec<u8>,
    /// SHA-256 of `payload` (the delta hash).
    pub hash: [u8; 32],
    /// The claimed loss to state (the measured one unless the node lies).
    pub claimed_loss: f64,
    /// The loss of the last local step's batch, after training.
    pub last_loss: f64,
    /// Time to fetch the base checkpoint(s), ms.
    pub fetch_ms: u64,
    /// Time of the local steps, ms.
    pub train_ms: u64,
}

/// Loads the checkpoint `reference` (`None`: the recipe's initial weights) as weights of
/// `trainer`'s model.
async fn load_base(
    live: &mut watch::Receiver<Option<WorkerSession>>,
    clock: &Arc<dyn Clock>,
    deadline: Timestamp,
    trainer: &hanzod_train::recipe::Trainer,
    reference: Option<&String>,
) -> Result<Weights, TrainError> {
    match reference {
        None => Ok(trainer.init()),
        Some(reference) => {
            let bytes = fetch_with_retry(live, clock, deadline, reference).await?;
            Weights::from_safetensors(&bytes, trainer.layout()).map_err(|e| {
                TrainError::BadCheckpoint {
                    checkpoint: reference.clone(),
                    reason: e.to_string(),
                }
            })
        }
    }
}

/// What the agent knows of a job beyond one assignment, for the Byzantine behaviours that
/// need it (an honest node needs none of it: [`EpochContext::default`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochContext {
    /// The bases this node was assigned in earlier epochs of the job, by epoch (`None`:
    /// the recipe's initial weights). [`RingFault::FreeRide`] and
    /// [`Attack::CopyLastMerged`] use epoch − 1's, [`Attack::Stale`] epoch − k's.
    pub bases: std::collections::BTreeMap<u32, Option<String>>,
    /// How many deltas the epoch expects (the members of the job's ring), when known:
    /// ALIE's `n` ([`crate::attack::alie_z_max`]).
    pub nodes: Option<usize>,
    /// The colluders' side channel (`--collude`), for the colluding attacks.
    pub collusion: Option<Collusion>,
}

impl EpochContext {
    /// A context knowing only the base of the epoch before `epoch` (`previous`, when the
    /// node saw it).
    pub fn with_previous(epoch: u32, previous: Option<Option<String>>) -> EpochContext {
        let mut context = EpochContext::default();
        if let (Some(e), Some(b)) = (epoch.checked_sub(1), previous) {
            context.bases.insert(e, b);
        }
        context
    }
}

/// The seed of a Byzantine node's forging generator: SHA-256 of a label, the node, the job
/// and the epoch (a retried epoch forges the same bytes; nodes differ).
fn forge_seed(node: &[u8; 32], job: u64, epoch: u32) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"hanzod-node/attack/v1");
    h.update(node);
    h.update(job.to_le_bytes());
    h.update(epoch.to_le_bytes());
    h.finalize().into()
}

/// The ranges of a LoRA delta's `lora_B` factors (empty for a full-parameter delta).
fn lora_b_ranges(delta: &Weights) -> Vec<std::ops::Range<usize>> {
    if delta.layout.delta_kind() != hanzod_protocol::hzdl::DeltaKind::Lora {
        return Vec::new();
    }
    delta
        .layout
        .entries()
        .iter()
        .filter(|e| e.name.ends_with(".lora_B.weight"))
        .map(|e| e.offset..e.offset + e.len)
        .collect()
}

/// Fetches the base and trains `assignment` (module docs, steps 1 and 2), or fabricates the
/// delta as `byzantine` says, with what `context` tells of the job's earlier epochs and of
/// the colluders (see [`Behaviour::Attack`]). A colluding attack with a side channel waits
/// for its colluders' deltas up to [`crate::collude::MAX_WAIT`] or the time left before
/// the deadline, whichever is less.
///
/// Errors: see [`TrainError`] (not [`TrainError::Upload`]); a side channel that cannot be
/// written or listed is [`TrainError::Training`].
pub async fn train_delta(
    live: &mut watch::Receiver<Option<WorkerSession>>,
    identity: &Identity,
    clock: &Arc<dyn Clock>,
    assignment: &EpochAssignment,
    byzantine: Byzantine,
    context: &EpochContext,
) -> Result<TrainedDelta, TrainError> {
    let deadline = assignment.deadline;
    if clock.now() >= deadline {
        return Err(TrainError::Expired);
    }
    let dtype =
        hanzod_train::recipe::delta_dtype(&assignment.training).map_err(TrainError::Recipe)?;
    // Resolving a language model's recipe tokenizes its corpus once per process (seconds):
    // off the async runtime.
    let (training, job) = (assignment.training.clone(), assignment.job);
    let trainer = tokio::task::spawn_blocking(move || hanzod_train::trainer_of(&training, job))
        .await
        .map_err(|e| TrainError::Training(format!("the recipe thread died: {e}")))?
        .map_err(TrainError::Recipe)?;
    let started = Instant::now();
    let base = load_base(live, clock, deadline, &trainer, assignment.base.as_ref()).await?;
    let attack = match byzantine.behaviour {
        Behaviour::Attack { attack } => Some(attack),
        _ => None,
    };
    // A free rider (or a copier of the last merged update) needs the previous epoch's base
    // too, for the global update, and trains nothing.
    let free_ride = byzantine.ring == RingFault::FreeRide;
    let copy_last = matches!(attack, Some(Attack::CopyLastMerged { .. }));
    let lora = trainer.lora().is_some();
    let epoch = assignment.epoch;
    let previous = epoch.checked_sub(1).and_then(|e| context.bases.get(&e));
    let prior = match (previous, (free_ride || copy_last) && !lora) {
        (Some(prev), true) => {
            Some(load_base(live, clock, deadline, &trainer, prev.as_ref()).await?)
        }
        _ => None,
    };
    // A stale node trains from the base of `epochs` epochs ago, when it saw that epoch.
    let stale = match attack {
        Some(Attack::Stale { epochs }) => epoch
            .checked_sub(epochs)
            .and_then(|e| context.bases.get(&e)),
        _ => None,
    };
    let start = match stale {
        Some(old) => Some(load_base(live, clock, deadline, &trainer, old.as_ref()).await?),
        None => None,
    };
    let fetch_ms = started.elapsed().as_millis() as u64;
    let started = Instant::now();
    let node = identity.node_id().0;
    let step = assignment.step;
    let behaviour = byzantine.behaviour;
    let (collusion, nodes) = (context.collusion.clone(), context.nodes);
    let clock = clock.clone();
    let (payload, claimed, last_loss) = tokio::task::spawn_blocking(move || {
        let training = |e: hanzod_train::TrainError| TrainError::Training(e.to_string());
        let (mut delta, mut claimed, last) = if free_ride || copy_last {
            // No local steps: the loss is measured honestly, the delta is someone else's.
            let claimed = trainer.batch_loss(&base, &node, step).map_err(training)?;
            let delta = match (&prior, free_ride) {
                (Some(prior), true) => base.sub(prior).map_err(training)?,
                _ => Weights::zeros(trainer.delta_layout()),
            };
            (delta, claimed, claimed)
        } else {
            let from = start.as_ref().unwrap_or(&base);
            let run = trainer.local_delta(from, &node, step).map_err(training)?;
            let last = run.losses.last().copied().unwrap_or(run.claimed_loss);
            (run.delta, run.claimed_loss, last)
        };
        match behaviour {
            Behaviour::Honest => {}
            Behaviour::Poison { scale } => poison(&mut delta, scale),
            Behaviour::LieLoss { factor } => claimed *= factor,
            Behaviour::Attack { attack } => {
                let last_merged = match &prior {
                    Some(prior) if copy_last => Some(base.sub(prior).map_err(training)?.data),
                    _ => None,
                };
                let found = match &collusion {
                    Some(c) if attack.colludes() => {
                        let left = Duration::from_millis(deadline.since(clock.now()));
                        let found = crate::collude::exchange(
                            c,
                            job.0,
                            epoch,
                            &node,
                            &delta.data,
                            left.min(crate::collude::MAX_WAIT),
                        )
                        .map_err(|e| TrainError::Training(format!("colluding: {e}")))?;
                        tracing::info!(
                            job = job.0,
                            epoch,
                            found = found.deltas.len(),
                            expected = c.colluders,
                            waited_ms = found.waited_ms,
                            "read the colluders' deltas"
                        );
                        found.deltas.into_iter().map(|(_, d)| d).collect()
                    }
                    _ => Vec::new(),
                };
                let colluders: Vec<&[f32]> = if found.is_empty() {
                    vec![&delta.data]
                } else {
                    found.iter().map(Vec::as_slice).collect()
                };
                let lora_b = lora_b_ranges(&delta);
                let view = Forge {
                    own: &delta.data,
                    colluders: &colluders,
                    peer: None,
                    last_merged: last_merged.as_deref(),
                    nodes: nodes.unwrap_or(2 * colluders.len() + 1),
                    lora_b: &lora_b,
                };
                let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_seed(forge_seed(
                    &node, job.0, epoch,
                ));
                let forged = attack.forge(&view, &mut rng);
                delta = Weights::from_vec(delta.layout.clone(), forged).map_err(training)?;
                claimed = attack.claim(claimed);
            }
        }
        let payload = delta
            .to_delta_bytes_as(u64::from(epoch), dtype)
            .map_err(|e| TrainError::Training(e.to_string()))?;
        Ok::<_, TrainError>((payload, claimed, last))
    })
    .await
    .map_err(|e| TrainError::Training(format!("the training thread died: {e}")))??;
    let hash: [u8; 32] = Sha256::digest(&payload).into();
    Ok(TrainedDelta {
        payload,
        hash,
        claimed_loss: claimed,
        last_loss,
        fetch_ms,
        train_ms: started.elapsed().as_millis() as u64,
    })
}

/// Uploads a trained delta for `assignment` (module docs, step 3) through the live session,
/// retrying transient failures until the deadline.
///
/// Errors: [`TrainError::Upload`] (an `ALREADY_EXISTS` naming this very delta's hash is
/// success, [`EpochWork::already_delivered`]).
pub async fn upload_trained(
    live: &mut watch::Receiver<Option<WorkerSession>>,
    clock: &Arc<dyn Clock>,
    assignment: &EpochAssignment,
    trained: &TrainedDelta,
) -> Result<EpochWork, TrainError> {
    let (epoch, step) = (assignment.epoch, assignment.step);
    let started = Instant::now();
    let upload = with_live_session(live, clock, assignment.deadline, |s| {
        let payload = &trained.payload;
        async move {
            let mut client = s.client.clone();
            crate::protocol::upload_delta(
                &mut client,
                &s.session,
                &s.identity,
                assignment.job.0,
                epoch,
                step,
                trained.claimed_loss,
                payload,
                s.chunk_bytes,
            )
            .await
        }
    })
    .await;
    let already_delivered = match upload {
        Ok(_) => false,
        // A retry after a lost ack: the daemon names the delivered hash.
        Err(st)
            if st.code() == tonic::Code::AlreadyExists
                && st.message().contains(&hex::encode(trained.hash)) =>
        {
            true
        }
        Err(st) => {
            return Err(TrainError::Upload(hanzod_protocol::status::status_line(
                &st,
            )))
        }
    };
    Ok(EpochWork {
        claimed_loss: trained.claimed_loss,
        last_loss: trained.last_loss,
        delta_hash: trained.hash,
        delta_bytes: trained.payload.len(),
        fetch_ms: trained.fetch_ms,
        train_ms: trained.train_ms,
        upload_ms: started.elapsed().as_millis() as u64,
        already_delivered,
    })
}

/// Does `assignment`: fetch, train, upload (module docs), through the live session `live`
/// (a session replaced meanwhile is followed, so finished work is not lost to a
/// reconnect). The recipe's model and data are resolved here ([`hanzod_train::trainer_of`]);
/// `clock` tells when the assignment's deadline passes (work past it is abandoned).
/// `context` as in [`train_delta`].
///
/// Errors: see [`TrainError`]; the caller reports them and waits for the next assignment
/// (the daemon resends it while the epoch runs).
pub async fn work_epoch(
    mut live: watch::Receiver<Option<WorkerSession>>,
    identity: &Identity,
    clock: Arc<dyn Clock>,
    assignment: &EpochAssignment,
    byzantine: Byzantine,
    context: &EpochContext,
) -> Result<EpochWork, TrainError> {
    let trained = train_delta(&mut live, identity, &clock, assignment, byzantine, context).await?;
    upload_trained(&mut live, &clock, assignment, &trained).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::ports::TokioClock;

    fn session(token: u8) -> WorkerSession {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        WorkerSession {
            client: NodeServiceClient::new(channel),
            session: vec![token; 16],
            chunk_bytes: 1024,
            identity: Identity::from_seed([token; 32]),
        }
    }

    fn clock() -> Arc<dyn Clock> {
        Arc::new(TokioClock::starting_at(Timestamp(1_000_000)))
    }

    #[tokio::test(start_paused = true)]
    async fn work_moves_to_the_new_session_when_the_old_one_is_replaced() {
        let (tx, mut live) = watch::channel(Some(session(1)));
        let clock = clock();
        let deadline = clock.now().plus_ms(60_000);
        let mut seen = Vec::new();
        let got = with_live_session(&mut live, &clock, deadline, |s| {
            seen.push(s.session[0]);
            let tx = &tx;
            async move {
                match s.session[0] {
                    // The daemon forgot session 1 (the node reconnected as session 2).
                    1 => {
                        tx.send_replace(Some(session(2)));
                        Err(tonic::Status::unauthenticated(
                            hanzod_protocol::status::UNKNOWN_SESSION,
                        ))
                    }
                    _ => Ok("uploaded"),
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), "uploaded");
        assert_eq!(seen, [1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn busy_is_retried_until_the_deadline_and_refusals_are_final() {
        let (_tx, mut live) = watch::channel(Some(session(1)));
        let clock = clock();
        let deadline = clock.now().plus_ms(10_000);
        let mut tries = 0;
        let busy = with_live_session(&mut live, &clock, deadline, |_| {
            tries += 1;
            async { Err::<(), _>(tonic::Status::resource_exhausted("4 uploads in flight")) }
        })
        .await
        .unwrap_err();
        assert_eq!(busy.code(), tonic::Code::DeadlineExceeded);
        // Backoff from 50 ms doubling to 2 s: a handful of tries in 10 s, not a spin.
        assert!((5..=15).contains(&tries), "{tries} tries");
        assert!(clock.now() >= deadline);

        let mut tries = 0;
        let refused = with_live_session(&mut live, &clock, clock.now().plus_ms(10_000), |_| {
            tries += 1;
            async { Err::<(), _>(tonic::Status::invalid_argument("bad delta")) }
        })
        .await
        .unwrap_err();
        assert_eq!((refused.code(), tries), (tonic::Code::InvalidArgument, 1));
        // A bad signature is UNAUTHENTICATED too, but not about the session: final.
        let mut tries = 0;
        let forged = with_live_session(&mut live, &clock, clock.now().plus_ms(10_000), |_| {
            tries += 1;
            async { Err::<(), _>(tonic::Status::unauthenticated("bad statement signature")) }
        })
        .await
        .unwrap_err();
        assert_eq!((forged.code(), tries), (tonic::Code::Unauthenticated, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn between_sessions_work_waits_and_stops_when_the_agent_is_gone() {
        let (tx, mut live) = watch::channel(None::<WorkerSession>);
        let clock = clock();
        let deadline = clock.now().plus_ms(60_000);
        let waiting = tokio::spawn({
            let clock = clock.clone();
            let mut live = live.clone();
            async move {
                with_live_session(&mut live, &clock, deadline, |s| async move {
                    Ok::<_, tonic::Status>(s.session[0])
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        tx.send_replace(Some(session(7)));
        assert_eq!(waiting.await.unwrap().unwrap(), 7);
        // The agent stopped with no session live: no spinning until the deadline.
        tx.send_replace(None);
        drop(tx);
        let gone = with_live_session(&mut live, &clock, deadline, |_| async {
            Ok::<(), tonic::Status>(())
        })
        .await
        .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::Cancelled);
    }

    #[test]
    fn behaviours_parse_with_defaults_and_refuse_nonsense() {
        assert_eq!("honest".parse(), Ok(Behaviour::Honest));
        assert_eq!("poison".parse(), Ok(Behaviour::Poison { scale: 10.0 }));
        assert_eq!("poison:3".parse(), Ok(Behaviour::Poison { scale: 3.0 }));
        assert_eq!("lie-loss".parse(), Ok(Behaviour::LieLoss { factor: 0.5 }));
        assert_eq!("lie-loss:2".parse(), Ok(Behaviour::LieLoss { factor: 2.0 }));
        for bad in [
            "",
            "poison:-1",
            "poison:nan",
            "poison:x",
            "lie-loss:1",
            "honest:2",
            "evil",
        ] {
            assert!(bad.parse::<Behaviour>().is_err(), "{bad:?} was accepted");
        }
    }

    #[tokio::test]
    async fn a_free_rider_states_its_real_loss_but_commits_no_training_in_epoch_0() {
        let (_tx, mut live) = watch::channel(None::<WorkerSession>);
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(Timestamp(1_000_000)));
        let a = epoch_zero(&clock);
        let id = Identity::from_seed([4; 32]);
        let free = Byzantine {
            behaviour: Behaviour::Honest,
            ring: RingFault::FreeRide,
        };
        let values = flat;
        let rider = train_delta(&mut live, &id, &clock, &a, free, &EpochContext::default())
            .await
            .unwrap();
        assert!(values(&rider).iter().all(|x| *x == 0.0));
        let honest = train_delta(
            &mut live,
            &id,
            &clock,
            &a,
            Byzantine::default(),
            &EpochContext::default(),
        )
        .await
        .unwrap();
        assert!(values(&honest).iter().any(|x| *x != 0.0));
        assert_eq!(values(&honest).len(), values(&rider).len());
        // Its claimed loss is the honest one (a spot-check of the loss passes).
        let rel = (rider.claimed_loss - honest.claimed_loss).abs() / honest.claimed_loss;
        assert!(
            rel < 1e-6,
            "{} vs {}",
            rider.claimed_loss,
            honest.claimed_loss
        );
    }

    /// An epoch-0 assignment of the default recipe (the wine MLP from its seed: no fetch).
    fn epoch_zero(clock: &Arc<dyn Clock>) -> EpochAssignment {
        EpochAssignment {
            job: hanzod_actors::types::JobId(3),
            epoch: 0,
            step: 0,
            base: None,
            training: hanzod_actors::job::TrainingSpec::default(),
            deadline: clock.now().plus_ms(3_600_000),
            seed_commitments: None,
        }
    }

    fn flat(t: &TrainedDelta) -> Vec<f32> {
        let view = hanzod_protocol::hzdl::DeltaView::parse(&t.payload).unwrap();
        hanzod_protocol::round::flat_values(&view)
    }

    fn attacker(s: &str) -> Byzantine {
        s.parse().unwrap()
    }

    /// What node `[seed; 32]` uploads for [`epoch_zero`] as `b` says, with `context`.
    async fn forged(seed: u8, b: Byzantine, context: &EpochContext) -> TrainedDelta {
        let (_tx, mut live) = watch::channel(None::<WorkerSession>);
        let clock = clock();
        let a = epoch_zero(&clock);
        let id = Identity::from_seed([seed; 32]);
        train_delta(&mut live, &id, &clock, &a, b, context)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_attack_suite_forges_from_the_honest_delta() {
        let none = EpochContext::default();
        let run = |how: &str| forged(4, attacker(how), &none);
        let honest = run("honest").await;
        let h = flat(&honest);
        assert!(h.iter().any(|x| *x != 0.0));
        let flipped = run("sign-flip").await;
        assert_eq!(flat(&flipped), h.iter().map(|x| -x).collect::<Vec<_>>());
        assert_eq!(flipped.claimed_loss, honest.claimed_loss);
        let lazy = run("lazy").await;
        assert!(flat(&lazy).iter().all(|x| *x == 0.0));
        // No earlier epoch: the last merged update is none, a zero delta, an honest loss.
        let copier = run("copy-last:2").await;
        assert!(flat(&copier).iter().all(|x| *x == 0.0));
        assert!((copier.claimed_loss - honest.claimed_loss).abs() < 1e-9 * honest.claimed_loss);
        // Stale without the older base: trains from the assigned one, honestly.
        assert_eq!(run("stale").await.payload, honest.payload);
        // Noise: the asked norm, the same bytes on a retry.
        let noisy = run("noise:2").await;
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let ratio = norm(&flat(&noisy)) / norm(&h);
        assert!((ratio - 2.0).abs() < 1e-2, "{ratio}");
        assert_eq!(run("noise:2").await.payload, noisy.payload);
        // Colluding without a side channel: from its own delta alone.
        assert_eq!(run("identical").await.payload, honest.payload);
        let ipm = run("ipm:0.5").await;
        assert_eq!(flat(&ipm), h.iter().map(|x| -0.5 * x).collect::<Vec<_>>());
        // Lying through the attack suite.
        let liar = run("lie-loss:0.25").await;
        assert_eq!(liar.payload, honest.payload);
        assert_eq!(liar.claimed_loss, honest.claimed_loss * 0.25);
    }

    #[tokio::test]
    async fn colluders_share_their_deltas_through_the_side_channel() {
        let dir =
            std::env::temp_dir().join(format!("hanzod-trainer-collude-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let context = EpochContext {
            collusion: Some(Collusion::new(&dir, 2).unwrap()),
            ..EpochContext::default()
        };
        let none = EpochContext::default();
        let (h5, h6) = (
            flat(&forged(5, Byzantine::default(), &none).await),
            flat(&forged(6, Byzantine::default(), &none).await),
        );
        assert_ne!(h5, h6);
        // Identical: the same bytes, the mean of the two honest deltas.
        let (x, y) = tokio::join!(
            forged(5, attacker("identical"), &context),
            forged(6, attacker("identical"), &context)
        );
        assert_eq!(x.hash, y.hash);
        for ((m, p), q) in flat(&x).iter().zip(&h5).zip(&h6) {
            let want = (f64::from(*p) + f64::from(*q)) / 2.0;
            assert!((f64::from(*m) - want).abs() < 1e-6, "{m} vs {want}");
        }
        // CopyPeer: each uploads the other's honest delta (a fresh folder: another job).
        let _ = std::fs::remove_dir_all(&dir);
        let (x, y) = tokio::join!(
            forged(5, attacker("copy-peer"), &context),
            forged(6, attacker("copy-peer"), &context)
        );
        assert_eq!((flat(&x), flat(&y)), (h6, h5));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_attack_suite_parses_as_behaviours() {
        assert_eq!(
            "alie".parse(),
            Ok(Behaviour::Attack {
                attack: Attack::Alie { z: None }
            })
        );
        assert_eq!(
            "stale:16".parse(),
            Ok(Behaviour::Attack {
                attack: Attack::Stale { epochs: 16 }
            })
        );
        assert!("stale:17".parse::<Behaviour>().unwrap_err().contains("16"));
        assert_eq!(
            "scale:-3"
                .parse::<Byzantine>()
                .map(|b| (b.behaviour, b.ring)),
            Ok((
                Behaviour::Attack {
                    attack: Attack::Scale { k: -3.0 }
                },
                RingFault::Honest
            ))
        );
        let e = "ipm:-1".parse::<Byzantine>().unwrap_err();
        assert!(e.contains("ipm") && e.contains("> 0"), "{e}");
        let e = "evil".parse::<Behaviour>().unwrap_err();
        assert!(
            e.contains("identical") && e.contains("poison[:scale]"),
            "{e}"
        );
    }

    #[test]
    fn byzantine_selects_a_training_attack_or_a_ring_fault() {
        let b = |s: &str| s.parse::<Byzantine>();
        assert_eq!(b("honest"), Ok(Byzantine::default()));
        assert_eq!(
            b("poison:3").map(|b| (b.behaviour, b.ring)),
            Ok((Behaviour::Poison { scale: 3.0 }, RingFault::Honest))
        );
        assert_eq!(
            b("tamper-allreduce").map(|b| (b.behaviour, b.ring)),
            Ok((
                Behaviour::Honest,
                RingFault::TamperAllreduce { perturbation: 1.0 }
            ))
        );
        assert_eq!(
            b("tamper-allreduce:-0.5").map(|b| b.ring),
            Ok(RingFault::TamperAllreduce { perturbation: -0.5 })
        );
        assert_eq!(b("free-ride").map(|b| b.ring), Ok(RingFault::FreeRide));
        assert_eq!(
            b("substitute").map(|b| b.ring),
            Ok(RingFault::Substitute {
                perturbation: 0.001
            })
        );
        assert_eq!(
            b("substitute:0.25").map(|b| b.ring),
            Ok(RingFault::Substitute { perturbation: 0.25 })
        );
        for bad in [
            "tamper-allreduce:0",
            "tamper-allreduce:inf",
            "substitute:nan",
            "free-ride:2",
            "evil",
        ] {
            assert!(b(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(b("evil").unwrap_err().contains("free-ride"));
        assert!(b("evil").unwrap_err().contains("substitute"));
    }
}
