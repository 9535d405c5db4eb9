//! Wire ↔ domain conversions, in one place (DESIGN §1). Every conversion from the wire
//! checks its input and fails with a [`FieldError`] naming the field, which the services
//! turn into `INVALID_ARGUMENT`.

use crate::limits::{
    MAX_DRIVER_SIG_BYTES, MAX_ENDPOINT_BYTES, MAX_GPU_MODEL_BYTES, MAX_REGION_BYTES,
};
use hanzod_actors::actor::job::JobView;
use hanzod_actors::job::{
    AdamWSpec, Aggregation, EpochAssignment, JobPhase, JobSpec, LoraSpec, SeedCommitments,
    TrainMode, TrainingSpec,
};
use hanzod_actors::node::Heartbeat;
use hanzod_actors::ports::RingView;
use hanzod_actors::sched::NodeView;
use hanzod_actors::types::{GpuInfo, GymWei, JobId, LinkProfile, NodeId, NodeInfo, Timestamp};
use hanzod_proto::v1 as pb;

pub use crate::field::FieldError;

fn bad(field: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field,
        reason: reason.into(),
    }
}

/// Most bytes of an untrusted value that an error or a log line quotes ([`excerpt`]).
pub const EXCERPT_BYTES: usize = 32;

/// A bounded, escaped quote of an untrusted value for errors and logs (issue 19 item 7):
/// its first [`EXCERPT_BYTES`] bytes with every non-printable or non-ASCII byte escaped
/// (`\xNN`, `\n`, …) in double quotes, followed by `… (N bytes)` when it was cut. At most
/// `4 × EXCERPT_BYTES + 32` characters whatever the input, so a 4 MB field costs a log
/// line of about 160 bytes, and no control character reaches a terminal or a log parser.
pub fn excerpt(value: &[u8]) -> String {
    let head = &value[..value.len().min(EXCERPT_BYTES)];
    let quoted = format!("\"{}\"", head.escape_ascii());
    if head.len() < value.len() {
        format!("{quoted}… ({} bytes)", value.len())
    } else {
        quoted
    }
}

/// Longest message, in bytes, that [`bounded_message`] passes on whole.
pub const MESSAGE_BYTES: usize = 512;

/// A refusal's message made safe to send to a caller and to log: control characters and
/// the invisible characters that reorder or hide text (bidirectional overrides and
/// isolates, zero-width marks) escaped (`\n`, `\u{1b}`, `\u{202e}`, …) and, past
/// [`MESSAGE_BYTES`] bytes, cut at a character
/// boundary and followed by `… (N bytes)`, N being the escaped message's length. For
/// messages that may quote caller input at second hand (a JSON parser's error naming the
/// string it refused, an architecture up to 64 KiB): at most `MESSAGE_BYTES + 32` bytes.
pub fn bounded_message(msg: &str) -> String {
    let escaped: String = if msg.chars().any(hidden) {
        msg.chars()
            .map(|c| {
                if hidden(c) {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        msg.to_string()
    };
    if escaped.len() <= MESSAGE_BYTES {
        return escaped;
    }
    let mut cut = MESSAGE_BYTES;
    while !escaped.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &escaped[..cut], escaped.len())
}

/// A character a terminal or log viewer would not show as itself: a control character, or
/// a Unicode format character that reorders or hides text (U+061C, U+200B–U+200F,
/// U+202A–U+202E, U+2060–U+2069, U+FEFF).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// A claimed training loss from the wire (an upload header's or a ring commitment's
/// `claimed_loss`, nats/token for a language model, mean squared error for the MLP): both
/// losses hanzod trains are non-negative, so it must be finite and `>= 0`.
///
/// Errors: [`FieldError`] naming `field` for NaN, ±∞ and negative values.
pub fn claimed_loss(field: &'static str, v: f64) -> Result<f64, FieldError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(bad(
            field,
            format!("{v:e} is not a finite, non-negative loss (cross-entropy and MSE are >= 0)"),
        ))
    }
}

/// A 32-byte node id from the wire.
pub fn node_id(field: &'static str, bytes: &[u8]) -> Result<NodeId, FieldError> {
    let arr: [u8; 32] = bytes
        .try_into()
        .map_err(|_| bad(field, format!("{} bytes, want 32", bytes.len())))?;
    Ok(NodeId(arr))
}

/// An amount of GYM wei from its decimal string; empty means 0.
pub fn gym_wei(field: &'static str, s: &str) -> Result<GymWei, FieldError> {
    if s.is_empty() {
        return Ok(GymWei(0));
    }
    s.parse::<u128>().map(GymWei).map_err(|e| {
        bad(
            field,
            format!(
                "{} is not a decimal amount of GYM wei: {e}",
                excerpt(s.as_bytes())
            ),
        )
    })
}

/// Checks a `host:port` endpoint: at most 255 bytes, a non-empty host, a port 1..=65535.
pub fn endpoint(field: &'static str, s: &str) -> Result<String, FieldError> {
    if s.len() > MAX_ENDPOINT_BYTES {
        return Err(bad(
            field,
            format!("longer than {MAX_ENDPOINT_BYTES} bytes"),
        ));
    }
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| bad(field, format!("{} is not host:port", excerpt(s.as_bytes()))))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(
            field,
            format!("{} has no valid host", excerpt(s.as_bytes())),
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(bad(
            field,
            format!("{} has no valid port", excerpt(s.as_bytes())),
        )),
    }
}

/// A registration's `NodeInfo` → the core's [`NodeInfo`] and the node's peer endpoint.
///
/// Checks: 32-byte id, GPU model 1..=128 bytes, VRAM > 0, compute capability parts ≤ 255,
/// attestation ≤ 1,024 bytes, bandwidth finite and ≥ 0, region 1..=64 bytes of `[a-z0-9-]`,
/// endpoint `host:port`.
pub fn node_info(info: &pb::NodeInfo) -> Result<(NodeInfo, String), FieldError> {
    let id = node_id("info.node_id", &info.node_id)?;
    let gpu = info
        .gpu
        .as_ref()
        .ok_or_else(|| bad("info.gpu", "missing"))?;
    if gpu.model.is_empty()
        || gpu.model.len() > MAX_GPU_MODEL_BYTES
        || gpu.model.chars().any(char::is_control)
    {
        return Err(bad(
            "info.gpu.model",
            format!("must be 1..={MAX_GPU_MODEL_BYTES} bytes without control characters"),
        ));
    }
    if gpu.vram_bytes == 0 {
        return Err(bad("info.gpu.vram_bytes", "must be > 0"));
    }
    let major = u8::try_from(gpu.compute_cap_major)
        .map_err(|_| bad("info.gpu.compute_cap_major", "must be ≤ 255"))?;
    let minor = u8::try_from(gpu.compute_cap_minor)
        .map_err(|_| bad("info.gpu.compute_cap_minor", "must be ≤ 255"))?;
    if gpu.driver_sig.len() > MAX_DRIVER_SIG_BYTES {
        return Err(bad(
            "info.gpu.driver_sig",
            format!("longer than {MAX_DRIVER_SIG_BYTES} bytes"),
        ));
    }
    let bw = info
        .bandwidth
        .as_ref()
        .ok_or_else(|| bad("info.bandwidth", "missing"))?;
    for (field, v) in [
        ("info.bandwidth.up_mbps", bw.up_mbps),
        ("info.bandwidth.down_mbps", bw.down_mbps),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(bad(field, format!("{v} is not a non-negative number")));
        }
    }
    let region = &info.region;
    if region.is_empty()
        || region.len() > MAX_REGION_BYTES
        || !region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(bad(
            "info.region",
            format!(
                "{} must be 1..={MAX_REGION_BYTES} bytes of [a-z0-9-]",
                excerpt(region.as_bytes())
            ),
        ));
    }
    let endpoint = endpoint("info.endpoint", &info.endpoint)?;
    Ok((
        NodeInfo {
            id,
            gpu: GpuInfo {
                model: gpu.model.clone(),
                vram_bytes: gpu.vram_bytes,
                compute_cap: (major, minor),
                driver_sig: gpu.driver_sig.clone(),
            },
            link: LinkProfile {
                up_mbps: bw.up_mbps,
                down_mbps: bw.down_mbps,
            },
            region: region.clone(),
        },
        endpoint,
    ))
}

/// A session heartbeat → the core's [`Heartbeat`] (sender, sequence and time come from the
/// verified envelope). GPU utilisation must be a fraction in [0, 1].
pub fn heartbeat(
    node: NodeId,
    seq: u64,
    timestamp_ms: u64,
    hb: &pb::Heartbeat,
) -> Result<Heartbeat, FieldError> {
    let u = hb.gpu_utilization;
    if !(u.is_finite() && (0.0..=1.0).contains(&u)) {
        return Err(bad(
            "heartbeat.gpu_utilization",
            format!("{u} is not in [0, 1]"),
        ));
    }
    Ok(Heartbeat {
        node,
        seq,
        timestamp: Timestamp(timestamp_ms),
        gpu_utilization: u,
        memory_used: hb.memory_used,
        current_step: hb.current_step,
    })
}

/// A job spec from the wire; the core's [`JobSpec::validate`] then checks the bounds.
pub fn job_spec(spec: Option<&pb::JobSpec>) -> Result<JobSpec, FieldError> {
    let s = spec.ok_or_else(|| bad("spec", "missing"))?;
    if s.name.len() > 256 {
        return Err(bad("spec.name", "longer than 256 bytes"));
    }
    if s.name.chars().any(char::is_control) {
        return Err(bad("spec.name", "must not contain control characters"));
    }
    let spec = JobSpec {
        name: s.name.clone(),
        epochs: s.epochs,
        min_nodes: s.min_nodes,
        max_nodes: s.max_nodes,
        min_vram_bytes: s.min_vram_bytes,
        pending_deadline_ms: s.pending_deadline_ms,
        epoch_deadline_ms: s.epoch_deadline_ms,
        utility: s.utility,
        submitter_stake: gym_wei("spec.submitter_stake_gym_wei", &s.submitter_stake_gym_wei)?,
        training: training_spec(s.training.as_ref())?,
    };
    spec.validate().map_err(|e| bad("spec", e.to_string()))?;
    Ok(spec)
}

/// Longest `spec.training.architecture` accepted (a Hugging Face `config.json`), bytes.
pub const MAX_ARCHITECTURE_BYTES: usize = 64 * 1024;

/// Most LoRA target modules accepted.
pub const MAX_LORA_TARGETS: usize = 16;

/// A training recipe from the wire: each unset field takes [`TrainingSpec::default`]'s value.
/// Every string is bounded before it is kept: names, the mode, the dtype and the base CID
/// at 256 bytes without control characters, each LoRA target at 64 bytes
/// ([`MAX_LORA_TARGETS`] of them), the architecture at [`MAX_ARCHITECTURE_BYTES`].
fn training_spec(t: Option<&pb::TrainingSpec>) -> Result<TrainingSpec, FieldError> {
    let d = TrainingSpec::default();
    let Some(t) = t else { return Ok(d) };
    let short = |field: &'static str, v: &str, max: usize| {
        if v.len() > max || v.chars().any(char::is_control) {
            Err(bad(
                field,
                format!("longer than {max} bytes or has control characters"),
            ))
        } else {
            Ok(())
        }
    };
    for (field, value) in [
        ("spec.training.model", &t.model),
        ("spec.training.dataset", &t.dataset),
        ("spec.training.mode", &t.mode),
        ("spec.training.base", &t.base),
        ("spec.training.delta_dtype", &t.delta_dtype),
        ("spec.training.aggregation", &t.aggregation),
    ] {
        if let Some(v) = value {
            short(field, v, 256)?;
        }
    }
    if t.architecture
        .as_ref()
        .is_some_and(|a| a.len() > MAX_ARCHITECTURE_BYTES)
    {
        return Err(bad(
            "spec.training.architecture",
            format!("longer than {MAX_ARCHITECTURE_BYTES} bytes"),
        ));
    }
    let aggregation = match t.aggregation.as_deref() {
        None => d.aggregation,
        Some("star") => Aggregation::Star,
        Some("ring") => Aggregation::Ring,
        Some(other) => {
            return Err(bad(
                "spec.training.aggregation",
                format!("{} is not \"star\" or \"ring\"", excerpt(other.as_bytes())),
            ))
        }
    };
    let mode = match t.mode.as_deref() {
        None => d.mode,
        Some("full") => TrainMode::Full,
        Some("lora") => TrainMode::Lora,
        Some(other) => {
            return Err(bad(
                "spec.training.mode",
                format!("{} is not \"full\" or \"lora\"", excerpt(other.as_bytes())),
            ))
        }
    };
    let da = AdamWSpec::default();
    let adamw = t.adamw.as_ref().map_or(da, |a| AdamWSpec {
        beta1: a.beta1.unwrap_or(da.beta1),
        beta2: a.beta2.unwrap_or(da.beta2),
        eps: a.eps.unwrap_or(da.eps),
        weight_decay: a.weight_decay.unwrap_or(da.weight_decay),
    });
    let dl = LoraSpec::default();
    let lora = match &t.lora {
        None => dl,
        Some(l) => {
            if l.target_modules.len() > MAX_LORA_TARGETS {
                return Err(bad(
                    "spec.training.lora.target_modules",
                    format!("more than {MAX_LORA_TARGETS} modules"),
                ));
            }
            for m in &l.target_modules {
                short("spec.training.lora.target_modules", m, 64)?;
            }
            LoraSpec {
                rank: l.rank.unwrap_or(dl.rank),
                alpha: l.alpha.unwrap_or(dl.alpha),
                target_modules: if l.target_modules.is_empty() {
                    dl.target_modules
                } else {
                    l.target_modules.clone()
                },
                dropout: l.dropout.unwrap_or(dl.dropout),
            }
        }
    };
    Ok(TrainingSpec {
        model: t.model.clone().unwrap_or(d.model),
        dataset: t.dataset.clone().unwrap_or(d.dataset),
        local_steps: t.local_steps.unwrap_or(d.local_steps),
        batch_size: t.batch_size.unwrap_or(d.batch_size),
        local_lr: t.local_lr.unwrap_or(d.local_lr),
        outer_lr: t.outer_lr.unwrap_or(d.outer_lr),
        seed: t.seed.unwrap_or(d.seed),
        seq_len: t.seq_len.unwrap_or(d.seq_len),
        validation_tokens: t.validation_tokens.unwrap_or(d.validation_tokens),
        adamw,
        mode,
        lora,
        architecture: t.architecture.clone(),
        base: t.base.clone(),
        delta_dtype: t.delta_dtype.clone().unwrap_or(d.delta_dtype),
        aggregation,
    })
}

/// The core's [`JobSpec`] on the wire.
pub fn job_spec_to_wire(s: &JobSpec) -> pb::JobSpec {
    pb::JobSpec {
        name: s.name.clone(),
        epochs: s.epochs,
        min_nodes: s.min_nodes,
        max_nodes: s.max_nodes,
        min_vram_bytes: s.min_vram_bytes,
        pending_deadline_ms: s.pending_deadline_ms,
        epoch_deadline_ms: s.epoch_deadline_ms,
        utility: s.utility,
        submitter_stake_gym_wei: s.submitter_stake.0.to_string(),
        training: Some(training_spec_to_wire(&s.training)),
    }
}

/// A training recipe on the wire, every field set.
pub fn training_spec_to_wire(t: &TrainingSpec) -> pb::TrainingSpec {
    pb::TrainingSpec {
        model: Some(t.model.clone()),
        dataset: Some(t.dataset.clone()),
        local_steps: Some(t.local_steps),
        batch_size: Some(t.batch_size),
        local_lr: Some(t.local_lr),
        outer_lr: Some(t.outer_lr),
        seed: Some(t.seed),
        seq_len: Some(t.seq_len),
        validation_tokens: Some(t.validation_tokens),
        adamw: Some(pb::AdamW {
            beta1: Some(t.adamw.beta1),
            beta2: Some(t.adamw.beta2),
            eps: Some(t.adamw.eps),
            weight_decay: Some(t.adamw.weight_decay),
        }),
        mode: Some(t.mode.as_str().to_string()),
        lora: Some(pb::LoraAdapter {
            rank: Some(t.lora.rank),
            alpha: Some(t.lora.alpha),
            target_modules: t.lora.target_modules.clone(),
            dropout: Some(t.lora.dropout),
        }),
        architecture: t.architecture.clone(),
        base: t.base.clone(),
        delta_dtype: Some(t.delta_dtype.clone()),
        aggregation: Some(t.aggregation.as_str().into()),
    }
}

/// An epoch assignment on the wire (`EpochStart`).
pub fn epoch_start_to_wire(a: &EpochAssignment) -> pb::EpochStart {
    pb::EpochStart {
        job_id: a.job.0,
        epoch: a.epoch,
        step: a.step,
        base_checkpoint: a.base.clone().unwrap_or_default(),
        training: Some(training_spec_to_wire(&a.training)),
        deadline_ms: a.deadline.as_millis(),
        sketch_commitment: a
            .seed_commitments
            .map(|(s, _)| s.to_vec())
            .unwrap_or_default(),
        check_commitment: a
            .seed_commitments
            .map(|(_, c)| c.to_vec())
            .unwrap_or_default(),
    }
}

/// An epoch assignment from the wire, as a node reads it: the recipe must be present (an
/// unset recipe field takes its default) and valid, and `step` must be
/// `epoch × local_steps`.
///
/// Errors: the field at fault (`training`, `training.*`, `step`).
pub fn epoch_start(e: &pb::EpochStart) -> Result<EpochAssignment, FieldError> {
    let training = e
        .training
        .as_ref()
        .ok_or_else(|| bad("training", "missing"))?;
    let training = training_spec(Some(training))?;
    if training.local_steps == 0 {
        return Err(bad("training.local_steps", "must be at least 1"));
    }
    let expected = u64::from(e.epoch) * u64::from(training.local_steps);
    if e.step != expected {
        return Err(bad(
            "step",
            format!("{} is not epoch × local_steps = {expected}", e.step),
        ));
    }
    Ok(EpochAssignment {
        job: JobId(e.job_id),
        epoch: e.epoch,
        step: e.step,
        base: (!e.base_checkpoint.is_empty()).then(|| e.base_checkpoint.clone()),
        seed_commitments: seed_commitments(e, training.aggregation)?,
        training,
        deadline: Timestamp(e.deadline_ms),
    })
}

/// The two seed commitments of a ring-aggregation assignment: 32 bytes each, present
/// exactly when the recipe aggregates over the ring.
fn seed_commitments(
    e: &pb::EpochStart,
    aggregation: Aggregation,
) -> Result<Option<SeedCommitments>, FieldError> {
    let field = |name: &'static str, v: &[u8]| -> Result<[u8; 32], FieldError> {
        v.try_into()
            .map_err(|_| bad(name, format!("{} bytes, not 32", v.len())))
    };
    match aggregation {
        Aggregation::Star => {
            if e.sketch_commitment.is_empty() && e.check_commitment.is_empty() {
                Ok(None)
            } else {
                Err(bad("sketch_commitment", "set in star aggregation"))
            }
        }
        Aggregation::Ring => Ok(Some((
            field("sketch_commitment", &e.sketch_commitment)?,
            field("check_commitment", &e.check_commitment)?,
        ))),
    }
}

/// A ring on the wire; `endpoint` gives each member's peer endpoint (empty when unknown).
pub fn ring(view: &RingView, endpoint: impl Fn(&NodeId) -> String) -> pb::Ring {
    pb::Ring {
        job_id: view.job.0,
        version: view.version,
        members: view
            .members
            .iter()
            .map(|m| pb::RingMember {
                node_id: m.0.to_vec(),
                endpoint: endpoint(m),
            })
            .collect(),
        bottleneck_mbps: view.bottleneck_mbps,
        estimated_links: view.estimated_links,
    }
}

/// A wire ring back into the core's view (for clients); checks member ids.
pub fn ring_from_wire(r: &pb::Ring) -> Result<RingView, FieldError> {
    Ok(RingView {
        job: JobId(r.job_id),
        version: r.version,
        members: r
            .members
            .iter()
            .map(|m| node_id("ring.members.node_id", &m.node_id))
            .collect::<Result<_, _>>()?,
        bottleneck_mbps: r.bottleneck_mbps,
        estimated_links: r.estimated_links,
    })
}

/// A job phase on the wire.
pub fn phase(p: &JobPhase) -> pb::JobPhase {
    use pb::job_phase::Kind;
    let mut out = pb::JobPhase::default();
    match p {
        JobPhase::Pending { deadline, .. } => {
            out.kind = Kind::Pending as i32;
            out.deadline_ms = deadline.as_millis();
        }
        JobPhase::Provisioning { ring_version } => {
            out.kind = Kind::Provisioning as i32;
            out.ring_version = *ring_version;
        }
        JobPhase::Running {
            epoch,
            ring_version,
        } => {
            out.kind = Kind::Running as i32;
            out.epoch = *epoch;
            out.ring_version = *ring_version;
        }
        JobPhase::Aggregating {
            epoch,
            ring_version,
        } => {
            out.kind = Kind::Aggregating as i32;
            out.epoch = *epoch;
            out.ring_version = *ring_version;
        }
        JobPhase::Published { epochs, .. } => {
            out.kind = Kind::Published as i32;
            out.epoch = *epochs;
        }
        JobPhase::Failed { reason, phase, .. } => {
            out.kind = Kind::Failed as i32;
            out.reason = reason.to_string();
            out.failed_in = phase.clone();
        }
    }
    out
}

/// A job on the wire.
pub fn job(v: &JobView, endpoint: impl Fn(&NodeId) -> String) -> pb::Job {
    pb::Job {
        job_id: v.id.0,
        name: v.name.clone(),
        phase: Some(phase(&v.phase)),
        epochs: v.epochs,
        ring: v.ring.as_ref().map(|r| ring(r, endpoint)),
        deltas_this_epoch: u32::try_from(v.deltas_this_epoch).unwrap_or(u32::MAX),
        checkpoints: v.checkpoints.clone(),
        // Filled in by the JobService, which knows the orchestrator's commitments.
        spot_check_commitment: Vec::new(),
        epoch_summaries: v
            .summaries
            .iter()
            .map(|(&epoch, s)| {
                let checkpoint = v.checkpoints.get(epoch as usize).cloned();
                epoch_summary(epoch, checkpoint.unwrap_or_default(), s)
            })
            .collect(),
    }
}

/// One epoch's summary on the wire.
pub fn epoch_summary(
    epoch: u32,
    checkpoint: String,
    s: &hanzod_actors::job::EpochSummary,
) -> pb::EpochSummary {
    use hanzod_actors::job::EpochOutcome;
    let (advanced, aggregator, kept_reason) = match &s.outcome {
        EpochOutcome::Advanced { aggregator } => (true, aggregator.clone(), String::new()),
        EpochOutcome::Kept { reason } => (false, String::new(), reason.clone()),
    };
    pb::EpochSummary {
        epoch,
        checkpoint,
        advanced,
        aggregator,
        kept_reason,
        loss_before: s.loss_before,
        loss_after: s.loss_after,
        accepted: s.accepted,
        suspect: s.suspect,
        rejected: s.rejected,
        spot_checked: s.spot_checked,
        spot_checks_failed: s.spot_checks_failed,
        rewarded_nodes: s.rewarded_nodes,
        rewards_gym_wei: s.rewards.0.to_string(),
        slashed_nodes: s.slashed_nodes,
        slashed_gym_wei: s.slashed.0.to_string(),
        repo: s.repo.clone().unwrap_or_default(),
        registry_error: s.registry_error.clone().unwrap_or_default(),
        settlement_error: s.settlement_error.clone().unwrap_or_default(),
    }
}

/// One epoch's summary from the wire ([`epoch_summary`]'s inverse, the checkpoint left
/// out): its epoch and summary, for a client that reads a job's summaries as a whole
/// ([`hanzod_actors::job::progress`]). Fails on an amount that is not a decimal of GYM wei.
pub fn epoch_summary_from_wire(
    s: &pb::EpochSummary,
) -> Result<(u32, hanzod_actors::job::EpochSummary), FieldError> {
    use hanzod_actors::job::{EpochOutcome, EpochSummary};
    let some = |v: &str| (!v.is_empty()).then(|| v.to_string());
    let outcome = if s.advanced {
        EpochOutcome::Advanced {
            aggregator: s.aggregator.clone(),
        }
    } else {
        EpochOutcome::Kept {
            reason: s.kept_reason.clone(),
        }
    };
    let summary = EpochSummary {
        outcome,
        loss_before: s.loss_before,
        loss_after: s.loss_after,
        accepted: s.accepted,
        suspect: s.suspect,
        rejected: s.rejected,
        spot_checked: s.spot_checked,
        spot_checks_failed: s.spot_checks_failed,
        rewarded_nodes: s.rewarded_nodes,
        rewards: gym_wei("epoch_summaries.rewards_gym_wei", &s.rewards_gym_wei)?,
        slashed_nodes: s.slashed_nodes,
        slashed: gym_wei("epoch_summaries.slashed_gym_wei", &s.slashed_gym_wei)?,
        repo: some(&s.repo),
        registry_error: some(&s.registry_error),
        settlement_error: some(&s.settlement_error),
    };
    Ok((s.epoch, summary))
}

/// A ring change on the wire: the new ring's version and size, who left and joined, and
/// how long its repair took.
pub fn ring_change(
    ring: &RingView,
    removed: &[NodeId],
    added: &[NodeId],
    repair_ms: Option<u64>,
) -> pb::RingChange {
    pb::RingChange {
        removed: removed.iter().map(|n| n.0.to_vec()).collect(),
        added: added.iter().map(|n| n.0.to_vec()).collect(),
        repair_ms,
        version: ring.version,
        members: u32::try_from(ring.members.len()).unwrap_or(u32::MAX),
    }
}

/// A node on the wire, with why it cannot be placed now (`ineligible`, the
/// [`hanzod_actors::sched::placement_blocker`] in words; None when it can).
pub fn node(v: &NodeView, endpoint: String, ineligible: Option<String>) -> pb::Node {
    pb::Node {
        node_id: v.id.0.to_vec(),
        stake_gym_wei: v.stake.0.to_string(),
        vram_bytes: v.vram_bytes,
        uptime: v.uptime,
        region: v.region.clone(),
        alive: v.alive,
        assigned_job: v.assigned.map(|j| j.0).unwrap_or(0),
        penalty_until_ms: v.penalty_until.map(|t| t.as_millis()).unwrap_or(0),
        endpoint,
        standing_read_at_ms: v.standing_read_at.as_millis(),
        ineligible: ineligible.unwrap_or_default(),
    }
}

/// The wire form of a signed publication record.
pub fn publication(p: &crate::record::SignedPublication) -> pb::Publication {
    let r = &p.record;
    pb::Publication {
        job_id: r.job.0,
        epoch: r.epoch,
        cid: r.cid.clone(),
        config_cid: r.config_cid.clone(),
        card_cid: r.card_cid.clone(),
        hf_repo: r.hf_repo.clone(),
        quality: r.quality,
        timestamp_ms: r.timestamp.0,
        signer: p.signer.to_vec(),
        signature: p.signature.to_vec(),
    }
}

/// Why a wire publication record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicationWireError {
    /// The signer key is not 32 bytes.
    #[error("signer is {len} bytes, want 32")]
    Signer {
        /// Its length, bytes.
        len: usize,
    },
    /// The signature is not 64 bytes.
    #[error("signature is {len} bytes, want 64")]
    Signature {
        /// Its length, bytes.
        len: usize,
    },
}

/// A signed publication record from its wire form; `Err` names a signer that is not 32
/// bytes or a signature that is not 64.
pub fn publication_from(
    p: pb::Publication,
) -> Result<crate::record::SignedPublication, PublicationWireError> {
    let signer: [u8; 32] =
        p.signer
            .as_slice()
            .try_into()
            .map_err(|_| PublicationWireError::Signer {
                len: p.signer.len(),
            })?;
    let signature: [u8; 64] =
        p.signature
            .as_slice()
            .try_into()
            .map_err(|_| PublicationWireError::Signature {
                len: p.signature.len(),
            })?;
    Ok(crate::record::SignedPublication {
        record: crate::record::PublicationRecord {
            job: hanzod_actors::types::JobId(p.job_id),
            epoch: p.epoch,
            cid: p.cid,
            config_cid: p.config_cid,
            card_cid: p.card_cid,
            hf_repo: p.hf_repo,
            quality: p.quality,
            timestamp: hanzod_actors::types::Timestamp(p.timestamp_ms),
        },
        signer,
        signature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tonic::Status;

    #[test]
    fn an_epoch_summary_reads_back_from_the_wire() {
        use hanzod_actors::job::{EpochOutcome, EpochSummary};
        let advanced = EpochSummary {
            outcome: EpochOutcome::Advanced {
                aggregator: "coordinate-median".into(),
            },
            loss_before: 2.042,
            loss_after: 1.5,
            accepted: 4,
            suspect: 1,
            rejected: 2,
            spot_checked: 3,
            spot_checks_failed: 1,
            rewarded_nodes: 3,
            rewards: GymWei(100_000_000_000_000_000_000),
            slashed_nodes: 1,
            slashed: GymWei(7),
            repo: Some("hanzo-gym/wine-mlp-job-1-epoch-3".into()),
            registry_error: Some("refused".into()),
            settlement_error: None,
        };
        let kept = EpochSummary {
            outcome: EpochOutcome::Kept {
                reason: "every delta was rejected".into(),
            },
            ..EpochSummary::default()
        };
        for s in [advanced, kept] {
            let wire = epoch_summary(3, "bafkreiabc".into(), &s);
            assert_eq!(epoch_summary_from_wire(&wire), Ok((3, s)));
        }
        let bad = pb::EpochSummary {
            rewards_gym_wei: "12 GYM".into(),
            ..Default::default()
        };
        assert_eq!(
            epoch_summary_from_wire(&bad).unwrap_err().field,
            "epoch_summaries.rewards_gym_wei"
        );
    }

    fn info() -> pb::NodeInfo {
        pb::NodeInfo {
            node_id: vec![7; 32],
            gpu: Some(pb::GpuInfo {
                model: "NVIDIA A100-SXM4-80GB".into(),
                vram_bytes: 85_899_345_920,
                compute_cap_major: 8,
                compute_cap_minor: 0,
                driver_sig: vec![],
            }),
            bandwidth: Some(pb::BandwidthProbe {
                up_mbps: 1000.0,
                down_mbps: 1000.0,
            }),
            region: "eu-west".into(),
            endpoint: "10.0.0.1:9560".into(),
        }
    }

    #[test]
    fn node_info_round_trip_and_field_errors() {
        let (n, ep) = node_info(&info()).unwrap();
        assert_eq!(n.id, NodeId([7; 32]));
        assert_eq!(n.gpu.compute_cap, (8, 0));
        assert_eq!(ep, "10.0.0.1:9560");
        type Mutation = Box<dyn Fn(&mut pb::NodeInfo)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("info.node_id", Box::new(|i| i.node_id.truncate(31))),
            ("info.gpu", Box::new(|i| i.gpu = None)),
            (
                "info.gpu.model",
                Box::new(|i| i.gpu.as_mut().unwrap().model.clear()),
            ),
            (
                "info.gpu.vram_bytes",
                Box::new(|i| i.gpu.as_mut().unwrap().vram_bytes = 0),
            ),
            (
                "info.gpu.compute_cap_major",
                Box::new(|i| i.gpu.as_mut().unwrap().compute_cap_major = 256),
            ),
            (
                "info.bandwidth.up_mbps",
                Box::new(|i| i.bandwidth.as_mut().unwrap().up_mbps = f32::NAN),
            ),
            ("info.region", Box::new(|i| i.region = "EU West".into())),
            ("info.endpoint", Box::new(|i| i.endpoint = "nohost".into())),
            ("info.endpoint", Box::new(|i| i.endpoint = "h:0".into())),
        ];
        for (field, mutate) in cases {
            let mut i = info();
            mutate(&mut i);
            let err = node_info(&i).unwrap_err();
            assert_eq!(err.field, field, "{err}");
            assert_eq!(Status::from(err).code(), tonic::Code::InvalidArgument);
        }
    }

    #[test]
    fn job_spec_errors_name_the_field() {
        let good = pb::JobSpec {
            name: "llm".into(),
            epochs: 3,
            min_nodes: 2,
            max_nodes: 4,
            min_vram_bytes: 1,
            pending_deadline_ms: 1000,
            epoch_deadline_ms: 1000,
            utility: 1.0,
            submitter_stake_gym_wei: "10000000000000000000000".into(),
            training: None,
        };
        let spec = job_spec(Some(&good)).unwrap();
        assert_eq!(spec.training, TrainingSpec::default());
        assert_eq!(job_spec(Some(&job_spec_to_wire(&spec))).unwrap(), spec);
        let mut partial = good.clone();
        partial.training = Some(pb::TrainingSpec {
            local_steps: Some(7),
            ..Default::default()
        });
        let t = job_spec(Some(&partial)).unwrap().training;
        assert_eq!(
            (t.local_steps, t.batch_size),
            (7, TrainingSpec::default().batch_size)
        );
        partial.training = Some(pb::TrainingSpec {
            outer_lr: Some(f64::NAN),
            ..Default::default()
        });
        let e = job_spec(Some(&partial)).unwrap_err();
        assert!(e.to_string().contains("outer_lr"), "{e}");
        for (aggregation, ok) in [("star", true), ("ring", true), ("mesh", false)] {
            partial.training = Some(pb::TrainingSpec {
                aggregation: Some(aggregation.into()),
                ..Default::default()
            });
            match job_spec(Some(&partial)) {
                Ok(_) => assert!(ok, "{aggregation} accepted"),
                Err(e) => {
                    assert!(!ok, "{aggregation} refused: {e}");
                    assert_eq!(e.field, "spec.training.aggregation");
                }
            }
        }
        assert_eq!(spec.submitter_stake, GymWei(10_000 * 10u128.pow(18)));
        // The wire form spells the defaulted recipe out; everything else is as sent.
        let wire = job_spec_to_wire(&spec);
        assert_eq!(
            wire.training,
            Some(training_spec_to_wire(&TrainingSpec::default()))
        );
        assert_eq!(
            pb::JobSpec {
                training: None,
                ..wire
            },
            good
        );
        let mut bad_stake = good.clone();
        bad_stake.submitter_stake_gym_wei = "-1".into();
        assert_eq!(
            job_spec(Some(&bad_stake)).unwrap_err().field,
            "spec.submitter_stake_gym_wei"
        );
        let mut zero = good.clone();
        zero.epochs = 0;
        assert!(job_spec(Some(&zero)).unwrap_err().reason.contains("epochs"));
        assert_eq!(job_spec(None).unwrap_err().field, "spec");
    }

    #[test]
    fn claimed_losses_are_finite_and_non_negative() {
        assert_eq!(claimed_loss("claimed_loss", 0.0), Ok(0.0));
        assert_eq!(claimed_loss("claimed_loss", 2.5), Ok(2.5));
        for v in [-1e-9, -3.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = claimed_loss("header.claimed_loss", v).unwrap_err();
            assert_eq!(e.field, "header.claimed_loss");
        }
    }

    #[test]
    fn an_oversized_region_is_refused_with_a_bounded_quote() {
        let mut info = pb::NodeInfo {
            node_id: vec![1; 32],
            gpu: Some(pb::GpuInfo {
                model: "H100".into(),
                vram_bytes: 80 << 30,
                ..Default::default()
            }),
            bandwidth: Some(pb::BandwidthProbe {
                up_mbps: 1.0,
                down_mbps: 1.0,
            }),
            region: "\u{1b}[2J".repeat(1 << 20),
            endpoint: "10.0.0.1:7000".into(),
        };
        let e = node_info(&info).unwrap_err();
        assert_eq!(e.field, "info.region");
        assert!(e.to_string().len() < 300, "{}", e.to_string().len());
        assert!(!e.to_string().contains('\u{1b}'));
        assert!(e.to_string().contains(&format!("({} bytes)", 4 << 20)));
        info.region = "eu-west".into();
        info.endpoint = "x".repeat(200);
        let e = node_info(&info).unwrap_err();
        assert_eq!(e.field, "info.endpoint");
        assert!(e.to_string().contains("(200 bytes)"), "{e}");
        assert!(e.to_string().len() < 120, "{e}");
    }

    #[test]
    fn a_json_error_quoting_a_64_kib_value_is_cut_to_a_bounded_message() {
        let value = "\u{1b}[2J".repeat(64 << 10 >> 4);
        let parsed: Result<u32, _> = serde_json::from_str(&serde_json::to_string(&value).unwrap());
        let msg = format!(
            "invalid spec.training.architecture: {}",
            parsed.unwrap_err()
        );
        assert!(
            msg.len() > 30_000,
            "the parser quotes the value: {}",
            msg.len()
        );
        let b = bounded_message(&msg);
        assert!(b.len() <= MESSAGE_BYTES + 32, "{}", b.len());
        assert!(b.starts_with("invalid spec.training.architecture: invalid type: string"));
        assert!(!b.chars().any(char::is_control), "{b}");
        assert!(b.ends_with(" bytes)"), "{b}");
        assert_eq!(bounded_message("short and clean"), "short and clean");
        // A right-to-left override would make "exe.txt" read as "txt.exe".
        assert_eq!(bounded_message("a\u{202e}txt.exe"), "a\\u{202e}txt.exe");
        // A message whose escaping and cutting happen to keep its length is still escaped.
        let tricky = format!("{}\n", "x".repeat(MESSAGE_BYTES + 14));
        assert!(!bounded_message(&tricky).contains('\n'));
    }

    proptest! {
        /// Any message comes out bounded, free of control characters, and unchanged when it
        /// was short and clean.
        #[test]
        fn messages_are_bounded_escaped_and_kept_when_short(msg in "(?s).{0,700}") {
            let b = bounded_message(&msg);
            prop_assert!(b.len() <= MESSAGE_BYTES + 32, "{}", b.len());
            prop_assert!(!b.chars().any(hidden));
            if msg.len() <= MESSAGE_BYTES && !msg.chars().any(hidden) {
                prop_assert_eq!(b, msg);
            }
        }
    }

    proptest! {
        /// Whatever the bytes, the quote is bounded, printable ASCII, and exact when short.
        #[test]
        fn excerpts_are_bounded_printable_and_exact_when_short(
            value in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let q = excerpt(&value);
            prop_assert!(q.chars().count() <= 4 * EXCERPT_BYTES + 32, "{}", q);
            prop_assert!(q.chars().all(|c| !c.is_control()));
            prop_assert_eq!(q.contains('…'), value.len() > EXCERPT_BYTES);
            if value.len() <= EXCERPT_BYTES {
                prop_assert_eq!(q, format!("\"{}\"", value.escape_ascii()));
            }
        }

        #[test]
        fn ring_round_trips(job in 0u64..1000, version in 1u64..100, n in 0usize..20, b in 0f32..1e4) {
            let view = RingView {
                job: JobId(job),
                version,
                members: (0..n).map(|i| NodeId([i as u8; 32])).collect(),
                bottleneck_mbps: b,
                estimated_links: n as u32,
            };
            let wire = ring(&view, |m| format!("h{}:1", m.0[0]));
            prop_assert_eq!(ring_from_wire(&wire).unwrap(), view);
        }

        #[test]
        fn endpoint_never_panics(s in ".{0,300}") {
            let _ = endpoint("e", &s);
        }

        #[test]
        fn gym_wei_round_trips(v in any::<u128>()) {
            prop_assert_eq!(gym_wei("x", &v.to_string()).unwrap(), GymWei(v));
        }
    }
}
