//! # hanzod-pipeline
//!
//! The epoch pipeline (DESIGN §6–§9, paper §5–§8): what happens to an epoch's deltas once
//! the job has accepted them, up to the published checkpoint and the settled epoch.
//!
//! - [`validate`]: each delta's checks (signature, format, quality score, spot-check
//!   re-execution) on a pool of validator threads;
//! - [`score`]: the score math (loss drop, stability, convergence, composite) and the
//!   commit–reveal spot-check selection;
//! - [`sketch_score`]: ring mode's scores and merge weights from the members' delta sketches
//!   (duplicates, outliers, the composite without its loss term);
//! - [`ring_audit`]: after a ring round fell back to the star, which member sent a wrong
//!   partial sum (from the signed pieces and the uploaded deltas), and its slashing evidence;
//! - [`merge`]: the aggregators (weighted mean by score, coordinate median, trimmed mean,
//!   Krum / Multi-Krum, centered clipping) and the policy that picks one;
//! - [`lora`]: merging LoRA deltas on each node's effective update ΔW = (α/r)·B·A per
//!   module (never on the factors), streamed module by module, and applying the merge to
//!   the base weights;
//! - [`sink`]: the [`CheckpointSink`](hanzod_actors::ports::CheckpointSink) that runs an
//!   epoch end to end (the model keeper owns each job's weights), and settles it on the
//!   ledger (rewards by score, slashes for failed spot-checks and proved ring tampering);
//! - [`publisher`]: staging and completing a publication (object store, model registry,
//!   signed record) so that a crash resumes it;
//! - [`recovery`]: rebuilding jobs from their signed publication records after the state
//!   store was lost;
//! - [`inspect`]: the report of `hanzod delta inspect`;
//! - [`budget`]: what validating one epoch of a job costs, in FLOPs (SubmitJob's budget).
#![warn(missing_docs)]

pub mod budget;
pub mod copies;
pub mod epoch;
pub mod inspect;
pub mod lora;
pub mod lora_sketch;
pub mod merge;
pub mod publisher;
pub mod recovery;
pub mod ring_audit;
pub mod score;
pub mod sink;
pub mod sketch_score;
pub mod validate;
