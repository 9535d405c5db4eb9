//! The client commands of the `hanzod` binary: jobs, nodes and rings over gRPC, printed
//! for people (tables) or scripts (`--json`).

use std::path::Path;

use hanzod_proto::v1 as pb;
use hanzod_proto::v1::admin_service_client::AdminServiceClient;
use hanzod_proto::v1::job_service_client::JobServiceClient;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::epochs::short;
use hanzod_protocol::client::ClientOptions;

/// A job spec file (TOML): the fields of `hanzod.v1.JobSpec` with defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpecFile {
    /// Name, not blank.
    pub name: String,
    /// Epochs, ≥ 1 (default 5).
    #[serde(default = "d_epochs")]
    pub epochs: u32,
    /// Fewest nodes (default 2).
    #[serde(default = "d_min_nodes")]
    pub min_nodes: u32,
    /// Most nodes (default 16).
    #[serde(default = "d_max_nodes")]
    pub max_nodes: u32,
    /// Minimum GPU memory per node, bytes (default 0).
    #[serde(default)]
    pub min_vram_bytes: u64,
    /// How long the job may wait for nodes, ms (default 10 min).
    #[serde(default = "d_pending")]
    pub pending_deadline_ms: u64,
    /// How long one epoch may take, ms (default 1 h).
    #[serde(default = "d_epoch")]
    pub epoch_deadline_ms: u64,
    /// Expected utility u_j of paper §3.2 (default 1).
    #[serde(default = "d_utility")]
    pub utility: f64,
    /// The submitter's stake, whole GYM (default 10,000).
    #[serde(default = "d_stake")]
    pub submitter_stake_gym: u64,
    /// The training recipe (`[training]`; every key defaults, see
    /// [`hanzod_actors::job::TrainingSpec`]).
    #[serde(default)]
    pub training: hanzod_actors::job::TrainingSpec,
}

fn d_epochs() -> u32 {
    5
}
fn d_min_nodes() -> u32 {
    2
}
fn d_max_nodes() -> u32 {
    16
}
fn d_pending() -> u64 {
    600_000
}
fn d_epoch() -> u64 {
    3_600_000
}
fn d_utility() -> f64 {
    1.0
}
fn d_stake() -> u64 {
    10_000
}

/// Largest `config.json` a job file's `architecture` may name, bytes (the wire bound).
const MAX_ARCHITECTURE_BYTES: u64 = 64 * 1024;

impl JobSpecFile {
    /// Reads and parses a spec file; errors name the file and the key.
    ///
    /// `[training] dataset` defaults to `austen` for a language model (`qwen3-tiny`,
    /// `qwen3`), its only corpus.
    ///
    /// `[training] architecture` (for `model = "qwen3"`) may be given four ways. Three are
    /// sent as the `config.json` text: an inline table (`[training.architecture]` with the
    /// config's keys), a string holding the JSON itself (starting with `{`), or a path to a
    /// Hugging Face `config.json` (relative to the spec file's folder; at most 64 KiB). The
    /// fourth, a string that names no file but parses as a CID
    /// ([`hanzod_store::objects::parse_cid`]), is sent as it is: the CID of a `config.json`
    /// in the orchestrator's object store (a publication record's `config_cid`), which the
    /// daemon fetches and puts in the job in its place (`NOT_FOUND` when it has none).
    /// Errors: a string that is neither JSON, an existing file nor a CID (the message names
    /// the file and says a CID was tried), a file over 64 KiB, another TOML type.
    pub fn load(path: &Path) -> anyhow::Result<JobSpecFile> {
        let named = |e: &dyn std::fmt::Display| anyhow::anyhow!("{}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| named(&e))?;
        let mut value: toml::Table = toml::from_str(&text).map_err(|e| named(&e))?;
        // A language model's only corpus is `austen`: a file naming the model and no
        // dataset means it (the recipe default, `wine-quality-red`, is the MLP's).
        let mut defaulted = false;
        if let Some(toml::Value::Table(training)) = value.get_mut("training") {
            let lm = matches!(
                training.get("model").and_then(toml::Value::as_str),
                Some(hanzod_train::lm::QWEN3_TINY | hanzod_train::lm::QWEN3)
            );
            if lm && !training.contains_key("dataset") {
                training.insert(
                    "dataset".into(),
                    toml::Value::String(hanzod_train::text::AUSTEN.into()),
                );
                defaulted = true;
            }
        }
        let arch = match value.get_mut("training") {
            Some(toml::Value::Table(training)) => training.get_mut("architecture"),
            _ => None,
        };
        match arch {
            // Parsed from the text itself, so errors keep their line and column.
            None if !defaulted => toml::from_str(&text).map_err(|e| named(&e)),
            None => toml::Value::Table(value).try_into().map_err(|e| named(&e)),
            Some(arch) => {
                let dir = path.parent().unwrap_or(Path::new("."));
                *arch = toml::Value::String(architecture_text(arch, dir).map_err(|e| named(&e))?);
                toml::Value::Table(value).try_into().map_err(|e| named(&e))
            }
        }
    }

    /// The wire spec.
    pub fn to_wire(&self) -> pb::JobSpec {
        pb::JobSpec {
            name: self.name.clone(),
            epochs: self.epochs,
            min_nodes: self.min_nodes,
            max_nodes: self.max_nodes,
            min_vram_bytes: self.min_vram_bytes,
            pending_deadline_ms: self.pending_deadline_ms,
            epoch_deadline_ms: self.epoch_deadline_ms,
            utility: self.utility,
            submitter_stake_gym_wei: hanzod_actors::types::GymWei::gym(self.submitter_stake_gym)
                .0
                .to_string(),
            training: Some(hanzod_protocol::convert::training_spec_to_wire(
                &self.training,
            )),
        }
    }
}

/// The `config.json` text of a job file's `architecture` value, or the CID of one in the
/// orchestrator's object store, as sent on the wire ([`JobSpecFile::load`]).
fn architecture_text(value: &toml::Value, dir: &Path) -> anyhow::Result<String> {
    match value {
        toml::Value::Table(t) => serde_json::to_string_pretty(t)
            .map_err(|e| anyhow::anyhow!("training.architecture: {e}")),
        toml::Value::String(s) if s.trim_start().starts_with('{') => Ok(s.clone()),
        toml::Value::String(s) => {
            let file = dir.join(s);
            let metadata = match std::fs::metadata(&file) {
                // No such file, but a CID: the daemon resolves it in its object store.
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        && hanzod_store::objects::parse_cid(s).is_ok() =>
                {
                    return Ok(s.clone())
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
                    "training.architecture: {}: {e}, and the string is not a CID (of a \
                     config.json in the orchestrator's object store) either",
                    file.display()
                ),
                metadata => metadata,
            };
            let io = |e: std::io::Error| {
                anyhow::anyhow!("training.architecture: {}: {e}", file.display())
            };
            let len = metadata.map_err(io)?.len();
            if len > MAX_ARCHITECTURE_BYTES {
                anyhow::bail!(
                    "training.architecture: {} is {len} bytes, more than a config.json may be ({MAX_ARCHITECTURE_BYTES})",
                    file.display()
                );
            }
            std::fs::read_to_string(&file).map_err(io)
        }
        other => anyhow::bail!(
            "training.architecture must be a table, a config.json path or its JSON text, not a {}",
            other.type_str()
        ),
    }
}

/// A job, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct JobOut {
    /// Id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Phase name.
    pub phase: String,
    /// The epoch training or being aggregated, 0-based (Running, Aggregating); `None` in
    /// the other phases.
    pub epoch: Option<u32>,
    /// Epochs asked for.
    pub epochs: u32,
    /// Epochs published so far.
    pub published: usize,
    /// Failure reason, if failed.
    pub reason: Option<String>,
    /// The ring.
    pub ring: Option<RingOut>,
    /// Deltas accepted this epoch.
    pub deltas_this_epoch: u32,
    /// Checkpoint references.
    pub checkpoints: Vec<String>,
    /// What each published epoch's aggregation did (the epochs the daemon recorded one
    /// for), in epoch order.
    pub epoch_summaries: Vec<crate::epochs::EpochOut>,
    /// Whether training improved the model, stopped improving, got worse or never trained,
    /// in one line ([`crate::epochs::training_progress`]).
    pub progress: String,
}

/// A ring, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct RingOut {
    /// Job.
    pub job: u64,
    /// Version.
    pub version: u64,
    /// Weakest link, Mbit/s.
    pub bottleneck_mbps: f32,
    /// Links estimated rather than measured.
    pub estimated_links: u32,
    /// Members in order: (hex id, endpoint).
    pub members: Vec<MemberOut>,
}

/// A ring member, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct MemberOut {
    /// Hex id.
    pub node: String,
    /// Endpoint, empty when not connected.
    pub endpoint: String,
}

/// A publication record, as printed by `hanzod publications`.
#[derive(Debug, Clone, Serialize)]
pub struct PublicationOut {
    /// The signed record (hex keys and signature in JSON).
    #[serde(flatten)]
    pub record: hanzod_protocol::record::SignedPublication,
    /// Whether the signature verifies over the record's canonical bytes.
    pub signature_valid: bool,
    /// Whether the signer is the daemon's own key (`None`: the daemon did not say).
    pub signed_by_this_orchestrator: Option<bool>,
}

impl PublicationOut {
    /// Checks `record`'s signature and compares its signer with `ours`.
    pub fn of(
        record: hanzod_protocol::record::SignedPublication,
        ours: Option<[u8; 32]>,
    ) -> PublicationOut {
        PublicationOut {
            signature_valid: hanzod_protocol::record::check_signature(&record).is_ok(),
            signed_by_this_orchestrator: ours.map(|k| k == record.signer),
            record,
        }
    }

    /// The signer column: its short key, then `BAD SIGNATURE` or `not this daemon` when so.
    pub fn signer_line(&self) -> String {
        let mut line = short(&hex::encode(self.record.signer)).to_string();
        if !self.signature_valid {
            line.push_str(" BAD SIGNATURE");
        }
        if self.signed_by_this_orchestrator == Some(false) {
            line.push_str(" (not this daemon's key)");
        }
        line
    }
}

/// A node, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct NodeOut {
    /// Hex id.
    pub node: String,
    /// Region.
    pub region: String,
    /// VRAM, bytes.
    pub vram_bytes: u64,
    /// Stake, GYM wei (decimal), as last read from the chain.
    pub stake_gym_wei: String,
    /// End of its latest slashing penalty (ms since the Unix epoch), if it was slashed.
    pub penalty_until_ms: Option<u64>,
    /// When stake and penalty were last read from the chain (ms since the Unix epoch; 0
    /// when unknown).
    pub standing_read_at_ms: u64,
    /// Uptime fraction over 24 h.
    pub uptime: f64,
    /// Not declared failed.
    pub alive: bool,
    /// Assigned job, if any.
    pub job: Option<u64>,
    /// Endpoint, when connected.
    pub endpoint: String,
    /// Why it cannot be placed in a new job now (paper §3.3), if it cannot.
    pub ineligible: Option<String>,
}

fn phase_name(k: i32) -> &'static str {
    use pb::job_phase::Kind;
    match Kind::try_from(k).unwrap_or(Kind::Unspecified) {
        Kind::Pending => "Pending",
        Kind::Provisioning => "Provisioning",
        Kind::Running => "Running",
        Kind::Aggregating => "Aggregating",
        Kind::Published => "Published",
        Kind::Failed => "Failed",
        Kind::Unspecified => "Unknown",
    }
}

/// Converts a wire ring.
pub fn ring_out(r: &pb::Ring) -> RingOut {
    RingOut {
        job: r.job_id,
        version: r.version,
        bottleneck_mbps: r.bottleneck_mbps,
        estimated_links: r.estimated_links,
        members: r
            .members
            .iter()
            .map(|m| MemberOut {
                node: hex::encode(&m.node_id),
                endpoint: m.endpoint.clone(),
            })
            .collect(),
    }
}

/// Converts a wire job.
pub fn job_out(j: &pb::Job) -> JobOut {
    let phase = j.phase.clone().unwrap_or_default();
    let name = phase_name(phase.kind);
    JobOut {
        id: j.job_id,
        name: j.name.clone(),
        phase: name.to_string(),
        epoch: matches!(name, "Running" | "Aggregating").then_some(phase.epoch),
        epochs: j.epochs,
        published: j.checkpoints.len(),
        reason: (!phase.reason.is_empty()).then_some(phase.reason),
        ring: j.ring.as_ref().map(ring_out),
        deltas_this_epoch: j.deltas_this_epoch,
        checkpoints: j.checkpoints.clone(),
        epoch_summaries: j
            .epoch_summaries
            .iter()
            .map(crate::epochs::epoch_out)
            .collect(),
        progress: crate::epochs::training_progress(&j.epoch_summaries),
    }
}

/// Converts a wire node.
pub fn node_out(n: &pb::Node) -> NodeOut {
    NodeOut {
        node: hex::encode(&n.node_id),
        region: n.region.clone(),
        vram_bytes: n.vram_bytes,
        stake_gym_wei: n.stake_gym_wei.clone(),
        penalty_until_ms: (n.penalty_until_ms != 0).then_some(n.penalty_until_ms),
        standing_read_at_ms: n.standing_read_at_ms,
        uptime: n.uptime,
        alive: n.alive,
        job: (n.assigned_job != 0).then_some(n.assigned_job),
        endpoint: n.endpoint.clone(),
        ineligible: (!n.ineligible.is_empty()).then(|| n.ineligible.clone()),
    }
}

/// The `PENALTY LEFT` and `STAKE READ` columns of `hanzod nodes` at local time `now` (ms
/// since the Unix epoch): the time left of an active penalty (`-` for none or ended), and
/// how long ago the stake was read (`-` when unknown). A daemon clock ahead of this one
/// reads as `0 ms ago`.
pub fn standing_columns(n: &NodeOut, now: u64) -> (String, String) {
    use hanzod_protocol::human::duration;
    let penalty = match n.penalty_until_ms {
        Some(until) if until > now => duration(until - now),
        _ => "-".into(),
    };
    let read = match n.standing_read_at_ms {
        0 => "-".into(),
        at => format!("{} ago", duration(now.saturating_sub(at))),
    };
    (penalty, read)
}

/// Where the job is in its epochs ([`crate::epochs::progress`]).
fn progress(j: &JobOut) -> String {
    crate::epochs::progress(&j.phase, j.epoch, j.epochs, j.published)
}

/// A one-line summary of a job: `job 3 "wine": Running epoch 2, 2/5 published, ring v2 of
/// 4 nodes`.
pub fn job_line(j: &JobOut) -> String {
    let progress = match progress(j) {
        p if p.is_empty() => String::new(),
        p => format!(" {p}"),
    };
    let ring = j
        .ring
        .as_ref()
        .map(|r| format!(", ring v{} of {} nodes", r.version, r.members.len()))
        .unwrap_or_default();
    let reason = j
        .reason
        .as_ref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    format!(
        "job {} {:?}: {}{progress}{reason}{ring}",
        j.id, j.name, j.phase
    )
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A connected client of both the job and the admin service.
pub struct Clients {
    opts: ClientOptions,
    jobs: JobServiceClient<Channel>,
    admin: AdminServiceClient<Channel>,
}

impl Clients {
    /// Connects.
    pub async fn connect(opts: ClientOptions) -> anyhow::Result<Clients> {
        let channel = opts.connect().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot reach hanzod at {}: {}",
                opts.endpoint,
                hanzod_node::error_chain(&e)
            )
        })?;
        Ok(Clients {
            jobs: JobServiceClient::new(channel.clone()),
            admin: AdminServiceClient::new(channel),
            opts,
        })
    }

    /// `hanzod job submit`.
    pub async fn submit(&mut self, spec: &JobSpecFile, json: bool) -> anyhow::Result<u64> {
        let r = self
            .jobs
            .submit_job(self.opts.request(pb::SubmitJobRequest {
                spec: Some(spec.to_wire()),
            }))
            .await
            .map_err(status)?
            .into_inner();
        if json {
            print_json(&serde_json::json!({ "job": r.job_id }))?;
        } else {
            println!("submitted job {} ({:?})", r.job_id, spec.name);
        }
        Ok(r.job_id)
    }

    /// `hanzod job status`.
    pub async fn status(&mut self, job: u64, json: bool) -> anyhow::Result<()> {
        let j = self
            .jobs
            .get_job(self.opts.request(pb::GetJobRequest { job_id: job }))
            .await
            .map_err(status)?
            .into_inner();
        let out = job_out(&j);
        if json {
            return print_json(&out);
        }
        println!("{}", job_line(&out));
        if let Some(r) = &out.ring {
            print_ring(r);
        }
        for (e, c) in out.checkpoints.iter().enumerate() {
            match out.epoch_summaries.iter().find(|s| s.epoch as usize == e) {
                Some(s) => crate::epochs::epoch_lines(s)
                    .iter()
                    .for_each(|l| println!("{l}")),
                None => println!("epoch {e}: checkpoint {c}"),
            }
        }
        println!("{}", out.progress);
        Ok(())
    }

    /// `hanzod job list`.
    pub async fn list(&mut self, json: bool) -> anyhow::Result<()> {
        let r = self
            .jobs
            .list_jobs(self.opts.request(pb::ListJobsRequest {}))
            .await
            .map_err(status)?
            .into_inner();
        let jobs: Vec<JobOut> = r.jobs.iter().map(job_out).collect();
        if json {
            return print_json(&jobs);
        }
        if jobs.is_empty() {
            println!("no jobs");
            return Ok(());
        }
        println!(
            "{:>5}  {:<24} {:<13} {:>5} {:>9} {:>6} {:>5}",
            "ID", "NAME", "PHASE", "EPOCH", "PUBLISHED", "RING", "NODES"
        );
        for j in &jobs {
            println!(
                "{:>5}  {:<24} {:<13} {:>5} {:>9} {:>6} {:>5}",
                j.id,
                j.name,
                j.phase,
                j.epoch.map_or_else(|| "-".into(), |e| e.to_string()),
                format!("{}/{}", j.published, j.epochs),
                j.ring
                    .as_ref()
                    .map(|r| format!("v{}", r.version))
                    .unwrap_or_else(|| "-".into()),
                j.ring.as_ref().map(|r| r.members.len()).unwrap_or(0)
            );
        }
        Ok(())
    }

    /// `hanzod job watch`: prints every change until the job ends.
    pub async fn watch(&mut self, job: u64, json: bool) -> anyhow::Result<()> {
        let mut stream = self
            .jobs
            .watch_job(
                self.opts
                    .stream_request(pb::WatchJobRequest { job_id: job }),
            )
            .await
            .map_err(status)?
            .into_inner();
        let mut last: Option<JobOut> = None;
        while let Some(ev) = stream.message().await.map_err(status)? {
            let Some(j) = ev.job else { continue };
            let out = job_out(&j);
            let seen = last.as_ref().map_or(0, |l| l.epoch_summaries.len());
            last = Some(out.clone());
            if json {
                let ring_change = ev.ring_change.as_ref().map(|c| {
                    serde_json::json!({
                        "removed": c.removed.iter().map(hex::encode).collect::<Vec<_>>(),
                        "added": c.added.iter().map(hex::encode).collect::<Vec<_>>(),
                        "repair_ms": c.repair_ms,
                        "version": c.version,
                        "members": c.members,
                    })
                });
                println!(
                    "{}",
                    serde_json::to_string(&serde_json::json!({
                        "change": ev.change,
                        "job": out,
                        "ring_change": ring_change,
                    }))?
                );
                continue;
            }
            // Epochs published since the last message, with what they did (the snapshot
            // shows every epoch so far).
            for s in out.epoch_summaries.iter().skip(seen) {
                crate::epochs::epoch_lines(s)
                    .iter()
                    .for_each(|l| println!("{l}"));
            }
            match &ev.ring_change {
                Some(c) => println!("[ring] {}", crate::epochs::ring_change_line(c)),
                None => println!("[{}] {}", ev.change, job_line(&out)),
            }
        }
        // How the training went (in JSON, the last message's `progress`).
        if let (Some(j), false) = (&last, json) {
            println!("{}", j.progress);
        }
        // Scripts can tell a failed (or cancelled) job from a published one.
        match last {
            Some(j) if j.phase == "Failed" => anyhow::bail!(
                "job {job} failed: {}",
                j.reason.as_deref().unwrap_or("no reason given")
            ),
            _ => Ok(()),
        }
    }

    /// `hanzod job cancel`.
    pub async fn cancel(&mut self, job: u64, json: bool) -> anyhow::Result<()> {
        self.jobs
            .cancel_job(self.opts.request(pb::CancelJobRequest { job_id: job }))
            .await
            .map_err(status)?;
        if json {
            print_json(&serde_json::json!({ "job": job, "cancelled": true }))
        } else {
            println!("cancelled job {job}");
            Ok(())
        }
    }

    /// `hanzod nodes`.
    pub async fn nodes(&mut self, json: bool) -> anyhow::Result<()> {
        let r = self
            .admin
            .list_nodes(self.opts.request(pb::ListNodesRequest {}))
            .await
            .map_err(status)?
            .into_inner();
        let nodes: Vec<NodeOut> = r.nodes.iter().map(node_out).collect();
        if json {
            return print_json(&nodes);
        }
        if nodes.is_empty() {
            println!("no nodes registered");
            return Ok(());
        }
        println!(
            "{:<9} {:<12} {:>9} {:>11} {:<16} {:<16} {:>8} {:<6} {:>5}  ENDPOINT  (WHY NOT PLACEABLE)",
            "NODE",
            "REGION",
            "VRAM GiB",
            "STAKE GYM",
            "PENALTY LEFT",
            "STAKE READ",
            "UPTIME",
            "STATE",
            "JOB"
        );
        let now = {
            use hanzod_actors::ports::Clock;
            hanzod_actors::ports::SystemClock.now().as_millis()
        };
        for n in &nodes {
            let (penalty, read) = standing_columns(n, now);
            let stake = n
                .stake_gym_wei
                .parse::<u128>()
                .map(|w| (w / hanzod_actors::types::GymWei::PER_GYM).to_string())
                .unwrap_or_else(|_| n.stake_gym_wei.clone());
            let why = n
                .ineligible
                .as_deref()
                .map(|w| format!("  ({w})"))
                .unwrap_or_default();
            println!(
                "{:<9} {:<12} {:>9.1} {:>11} {:<16} {:<16} {:>7.2}% {:<6} {:>5}  {}{why}",
                short(&n.node),
                n.region,
                n.vram_bytes as f64 / (1u64 << 30) as f64,
                stake,
                penalty,
                read,
                n.uptime * 100.0,
                if n.alive { "alive" } else { "failed" },
                n.job.map(|j| j.to_string()).unwrap_or_else(|| "-".into()),
                if n.endpoint.is_empty() {
                    "-"
                } else {
                    &n.endpoint
                }
            );
        }
        Ok(())
    }

    /// The publication records on the daemon's ledger for weights `cid` and for the
    /// (job, epoch) of `card` (both: a kept epoch shares its CID with the epoch before; see
    /// [`crate::verify::find_record`]), and the daemon's own public key.
    pub async fn publications(
        &mut self,
        cid: &str,
        card: Option<(u64, u32)>,
    ) -> anyhow::Result<(
        Vec<hanzod_protocol::record::SignedPublication>,
        Option<[u8; 32]>,
    )> {
        let mut queries = vec![pb::ListPublicationsRequest {
            cid: cid.to_string(),
            ..Default::default()
        }];
        if let Some((job, epoch)) = card {
            queries.push(pb::ListPublicationsRequest {
                cid: String::new(),
                job_id: Some(job),
                epoch: Some(epoch),
            });
        }
        let mut found = Vec::new();
        let mut orchestrator = None;
        for q in queries {
            let answer = self
                .admin
                .list_publications(self.opts.request(q))
                .await
                .map_err(status)?
                .into_inner();
            orchestrator = answer.orchestrator.as_slice().try_into().ok();
            for p in answer.publications {
                let p = hanzod_protocol::convert::publication_from(p)?;
                if !found.contains(&p) {
                    found.push(p);
                }
            }
        }
        Ok((found, orchestrator))
    }

    /// `hanzod publications`: the records `query` selects, oldest first, each with whether
    /// its signature holds and whether this daemon signed it.
    pub async fn list_publications(
        &mut self,
        query: pb::ListPublicationsRequest,
        json: bool,
    ) -> anyhow::Result<()> {
        let answer = self
            .admin
            .list_publications(self.opts.request(query))
            .await
            .map_err(status)?
            .into_inner();
        let ours: Option<[u8; 32]> = answer.orchestrator.as_slice().try_into().ok();
        let mut rows = Vec::new();
        for p in answer.publications {
            // A malformed record is named and skipped; the others are still listed.
            match hanzod_protocol::convert::publication_from(p.clone()) {
                Ok(record) => rows.push(PublicationOut::of(record, ours)),
                Err(e) => eprintln!(
                    "warning: skipped a malformed record of job {} epoch {}: {e}",
                    p.job_id, p.epoch
                ),
            }
        }
        let bad = rows.iter().filter(|r| !r.signature_valid).count();
        let fail = |bad: usize| {
            anyhow::anyhow!("{bad} record(s) do not carry a valid signature of their signer")
        };
        if json {
            print_json(&rows)?;
            return if bad == 0 { Ok(()) } else { Err(fail(bad)) };
        }
        if rows.is_empty() {
            println!("no publication records");
            return Ok(());
        }
        println!(
            "{:>5} {:>5}  {:<59}  {:>10}  {:<23}  SIGNER",
            "JOB", "EPOCH", "WEIGHTS CID", "QUALITY", "SIGNED AT"
        );
        for r in &rows {
            println!(
                "{:>5} {:>5}  {:<59}  {:>10.6}  {:<23}  {}",
                r.record.record.job.0,
                r.record.record.epoch,
                r.record.record.cid,
                r.record.record.quality,
                hanzod_protocol::human::utc(r.record.record.timestamp.0),
                r.signer_line()
            );
        }
        if bad > 0 {
            return Err(fail(bad));
        }
        Ok(())
    }

    /// `hanzod ring`.
    pub async fn ring(&mut self, job: u64, json: bool) -> anyhow::Result<()> {
        let r = self
            .admin
            .get_ring(self.opts.request(pb::GetRingRequest { job_id: job }))
            .await
            .map_err(status)?
            .into_inner();
        let out = ring_out(&r);
        if json {
            return print_json(&out);
        }
        print_ring(&out);
        Ok(())
    }
}

fn print_ring(r: &RingOut) {
    println!(
        "ring of job {} v{}: {} members, bottleneck {:.1} Mbit/s ({} of {} links estimated)",
        r.job,
        r.version,
        r.members.len(),
        r.bottleneck_mbps,
        r.estimated_links,
        r.members.len()
    );
    for (i, m) in r.members.iter().enumerate() {
        let next = &r.members[(i + 1) % r.members.len()];
        println!(
            "  {:>3}. {} {:<21} → {}",
            i,
            short(&m.node),
            if m.endpoint.is_empty() {
                "-"
            } else {
                &m.endpoint
            },
            short(&next.node)
        );
    }
}

/// A gRPC status as a one-line error: `NOT_FOUND: job 9 not found`.
pub fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(hanzod_protocol::status::status_line(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_show_the_penalty_left_and_how_old_the_stake_read_is() {
        let wire = pb::Node {
            node_id: vec![7; 32],
            stake_gym_wei: "5000000000000000000000".into(),
            penalty_until_ms: 1_000_000 + 3_600_000,
            standing_read_at_ms: 1_000_000 - 12_000,
            ..Default::default()
        };
        let n = node_out(&wire);
        assert_eq!(n.penalty_until_ms, Some(4_600_000));
        assert_eq!(
            standing_columns(&n, 1_000_000),
            ("1 h 0 min".to_string(), "12.0 s ago".to_string())
        );
        // An ended penalty and an unknown read time read as "-".
        assert_eq!(
            standing_columns(&n, 5_000_000).0,
            "-",
            "the penalty has ended"
        );
        let unknown = node_out(&pb::Node::default());
        assert_eq!(unknown.penalty_until_ms, None);
        assert_eq!(
            standing_columns(&unknown, 1),
            ("-".to_string(), "-".to_string())
        );
        let json = serde_json::to_value(&n).unwrap();
        assert_eq!(json["standing_read_at_ms"], 988_000, "{json}");
    }

    #[test]
    fn a_publication_record_shows_whether_its_signature_holds_and_who_signed_it() {
        use hanzod_actors::types::{JobId, Timestamp};
        use hanzod_protocol::identity::Identity;
        use hanzod_protocol::record::{sign, PublicationRecord};
        let key = Identity::generate();
        let record = sign(
            PublicationRecord {
                job: JobId(1),
                epoch: 4,
                cid: "bafkreiweights".into(),
                config_cid: "bafkreiconfig".into(),
                card_cid: "bafkreicard".into(),
                hf_repo: String::new(),
                quality: 0.5,
                timestamp: Timestamp(1_764_637_612_345),
            },
            &key,
        );
        let ours = PublicationOut::of(record.clone(), Some(key.node_id().0));
        assert!(ours.signature_valid);
        assert_eq!(ours.signed_by_this_orchestrator, Some(true));
        assert_eq!(ours.signer_line(), short(&hex::encode(key.node_id().0)));

        let other = PublicationOut::of(record.clone(), Some([7; 32]));
        assert!(other.signer_line().ends_with("(not this daemon's key)"));

        let mut forged = record;
        forged.record.quality = 0.1;
        let forged = PublicationOut::of(forged, None);
        assert!(!forged.signature_valid);
        assert_eq!(forged.signed_by_this_orchestrator, None);
        assert!(forged.signer_line().contains("BAD SIGNATURE"));
        let json = serde_json::to_value(&forged).unwrap();
        assert_eq!(json["record"]["epoch"], 4, "{json}");
        assert_eq!(json["signature_valid"], false);
    }

    #[test]
    fn example_job_spec_parses_and_unknown_keys_fail() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/job.example.toml");
        let spec = JobSpecFile::load(&path).unwrap();
        let wire = spec.to_wire();
        assert!(hanzod_protocol::convert::job_spec(Some(&wire)).is_ok());
        let err = toml::from_str::<JobSpecFile>("name = \"x\"\nepoch = 3\n").unwrap_err();
        assert!(err.to_string().contains("epoch"), "{err}");
    }

    #[test]
    fn lora_example_parses_and_has_a_lora_trainer() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/job.lora.example.toml");
        let file = JobSpecFile::load(&path).unwrap();
        let spec = hanzod_protocol::convert::job_spec(Some(&file.to_wire())).unwrap();
        assert_eq!(spec.training, file.training);
        assert_eq!(spec.training.mode, hanzod_actors::job::TrainMode::Lora);
        let t = hanzod_train::trainer_of(&spec.training, hanzod_actors::types::JobId(1))
            .expect("a trainer");
        let lora = t.lora().expect("a LoRA trainer");
        assert_eq!((lora.rank(), lora.scaling()), (16, 2.0));
        // 4 layers × 7 modules × (A, B).
        assert_eq!(t.delta_layout().entries().len(), 56);
    }

    #[test]
    fn a_language_model_job_reads_its_corpus_by_default() {
        let dir = std::env::temp_dir().join(format!("hanzod-ds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (model, dataset) in [("qwen3-tiny", "austen"), ("wine-mlp", "wine-quality-red")] {
            let path = dir.join(format!("{model}.toml"));
            std::fs::write(
                &path,
                format!("name = \"x\"\n[training]\nmodel = \"{model}\"\n"),
            )
            .unwrap();
            let spec = JobSpecFile::load(&path).unwrap();
            assert_eq!(spec.training.dataset, dataset, "{model}");
        }
        // A dataset the file names is kept (and refused later if wrong).
        let path = dir.join("named.toml");
        std::fs::write(
            &path,
            "name = \"x\"\n[training]\nmodel = \"qwen3-tiny\"\ndataset = \"wine-quality-red\"\n",
        )
        .unwrap();
        assert_eq!(
            JobSpecFile::load(&path).unwrap().training.dataset,
            "wine-quality-red"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn architecture_is_a_path_an_inline_table_or_json_text() {
        let dir = std::env::temp_dir().join(format!("hanzod-arch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = hanzod_train::lm::qwen3_tiny();
        std::fs::write(dir.join("config.json"), cfg.to_json()).unwrap();
        let head = "name = \"q\"\n[training]\nmodel = \"qwen3\"\ndataset = \"austen\"\n";
        let json: serde_json::Value = serde_json::from_str(&cfg.to_json()).unwrap();
        let mut table = String::from("[training.architecture]\n");
        for (k, v) in json.as_object().unwrap() {
            if !v.is_null() {
                table.push_str(&format!("{k} = {}\n", toml::Value::try_from(v).unwrap()));
            }
        }
        let files = [
            format!("{head}architecture = \"config.json\"\n"),
            format!("{head}architecture = {:?}\n", cfg.to_json()),
            format!("{head}{table}"),
        ];
        for (i, text) in files.iter().enumerate() {
            let path = dir.join(format!("job{i}.toml"));
            std::fs::write(&path, text).unwrap();
            let spec = JobSpecFile::load(&path).unwrap_or_else(|e| panic!("{i}: {e}\n{text}"));
            let arch = spec.training.architecture.as_deref().expect("architecture");
            assert_eq!(
                hanzod_train::qwen3::Qwen3Config::from_json(arch).unwrap(),
                cfg,
                "form {i}"
            );
            let t = hanzod_train::trainer_of(&spec.training, hanzod_actors::types::JobId(1))
                .expect("a trainer");
            assert_eq!(t.layout().len(), 1_049_984);
        }
        // A string that names no file but is a CID is sent as it is, for the daemon to
        // fetch from its object store; a file of that name is read instead.
        let cid = hanzod_protocol::cid::cid_of(cfg.to_json().as_bytes()).to_string();
        let path = dir.join("by_cid.toml");
        std::fs::write(&path, format!("{head}architecture = \"{cid}\"\n")).unwrap();
        let spec = JobSpecFile::load(&path).unwrap();
        assert_eq!(spec.training.architecture.as_deref(), Some(cid.as_str()));
        let wire = hanzod_protocol::convert::job_spec(Some(&spec.to_wire())).unwrap();
        assert_eq!(wire.training.architecture.as_deref(), Some(cid.as_str()));
        std::fs::write(dir.join(&cid), cfg.to_json()).unwrap();
        let spec = JobSpecFile::load(&path).unwrap();
        assert_eq!(spec.training.architecture, Some(cfg.to_json()));
        // A missing file that is no CID either and a number are refused, naming the key.
        for (i, bad) in ["architecture = \"nope.json\"", "architecture = 3"]
            .iter()
            .enumerate()
        {
            let path = dir.join(format!("bad{i}.toml"));
            std::fs::write(&path, format!("{head}{bad}\n")).unwrap();
            let e = JobSpecFile::load(&path).unwrap_err().to_string();
            assert!(e.contains("training.architecture"), "{e}");
            if i == 0 {
                assert!(e.contains("nope.json") && e.contains("CID"), "{e}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn language_model_example_parses_round_trips_and_has_a_trainer() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/job.lm.example.toml");
        let file = JobSpecFile::load(&path).unwrap();
        let spec = hanzod_protocol::convert::job_spec(Some(&file.to_wire())).unwrap();
        assert_eq!(spec.training, file.training);
        let t = &spec.training;
        assert_eq!(
            (t.model.as_str(), t.dataset.as_str()),
            ("qwen3-tiny", "austen")
        );
        assert_eq!((t.seq_len, t.validation_tokens), (64, 2048));
        assert_eq!(t.mode, hanzod_actors::job::TrainMode::Full);
        let trainer =
            hanzod_train::trainer_of(t, hanzod_actors::types::JobId(1)).expect("a trainer");
        assert_eq!(trainer.loss_unit(), "nats/token");
        let err = toml::from_str::<JobSpecFile>(
            "name = \"x\"\n[training.lora]\nrank = 8\nalpha = 16.0\nranks = 3\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("ranks"), "{err}");
    }
}
