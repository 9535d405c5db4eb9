//! Random-projection sketches of LoRA updates (issue 19 item 3): what a star epoch of a LoRA
//! job compares to find copies ([`crate::copies`]) and to measure each delta's agreement with
//! the epoch ([`crate::epoch::agreements`]), on the effective updates
//! `ΔWᵢ = (alpha/r)·Bᵢ·Aᵢ` rather than on the factors.
//!
//! The factors cannot be compared: every node of an epoch starts from the job's same `A`
//! ([`hanzod_train::Trainer::init_adapter`]), so honest factors look alike, and the factors
//! are only defined up to an invertible `R` (`B·A = (B·R)·(R⁻¹·A)`). Materialising every
//! node's `ΔWᵢ` (`out·in` floats per module) to compare them is what the merge avoids holding
//! ([`crate::lora`]). A sketch keeps inner products instead.
//!
//! # The sketch
//!
//! For every adapted module `m` (base weight `[out, in]`, in the plan's base-name order) a
//! random sign matrix `Rₘ ∈ {±1}^{in × k}` is drawn from the epoch's seed (below) and
//! `Xₘ = Rₘ / √k`, so `E[Xₘ Xₘᵀ] = I`. The sketch of one update is
//!
//! ```text
//! Sₘ = ΔWₘ · Xₘ = (alpha/r) · Bₘ · (Aₘ · Xₘ)      [out, r] × ([r, in] × [in, k]) → [out, k]
//! ```
//!
//! and the sketch of an adapter is every module's `Sₘ`, row-major, concatenated in module
//! order: `Σₘ outₘ · k` floats ([`sketch_len`]). From the factors ([`sketch_adapter`]) the
//! cost is `r·k·(in + out)` multiply-adds per module and node instead of the `r·out·in` of
//! `ΔWₘ`; from an update already in the model's full layout ([`sketch_update`]: the last
//! merged update, [`crate::epoch::Merged::delta`]) it is `out·in·k` per module, once per
//! epoch. Both use the same `Xₘ`, so the last merged update and the adapters are comparable.
//! Only one module's `Rₘ` (`in·k` floats) is held at a time.
//!
//! # Why inner products survive: the error bound
//!
//! `⟨Sᵢ, Sⱼ⟩ = Σₘ (1/k) Σ_c r_cᵀ (ΔWᵢₘᵀ ΔWⱼₘ) r_c` (`r_c` the columns of `Rₘ`) is a
//! Hutchinson trace estimator of `Σₘ tr(ΔWᵢₘᵀ ΔWⱼₘ) = ⟨ΔWᵢ, ΔWⱼ⟩_F`: unbiased, with variance,
//! for Rademacher signs (M. F. Hutchinson, "A stochastic estimator of the trace of the
//! influence matrix for Laplacian smoothing splines", 1989; H. Avron & S. Toledo,
//! "Randomized algorithms for estimating the trace of an implicit symmetric positive
//! semi-definite matrix", J. ACM 58(2), 2011),
//!
//! ```text
//! Var ⟨Sᵢ, Sⱼ⟩ = (2/k) · Σₘ Σ_{p≠q} (Mₘ)²_pq  ≤  (2/k) · Σₘ ‖ΔWᵢₘᵀ ΔWⱼₘ‖²_F,
//!     Mₘ = sym(ΔWᵢₘᵀ ΔWⱼₘ).
//! ```
//!
//! For the squared norm (`i = j`) this is a relative standard deviation of at most
//! `√(2 / (k·ρ))`, `ρ = (Σ σ²)² / Σ σ⁴` over the singular values of every module's `ΔW`
//! (about the stable rank times the number of modules of comparable energy; `ρ ≤ r·L` for
//! `L` modules); the norm's own relative error is half that. **Not** `1/√(k·out)`: the `out`
//! rows of a rank-`r` update are combinations of `r` rows, so they are not `out` independent
//! samples. The cosine of two updates whose true cosine is `c` then has a standard deviation
//! of about `(1 − c²)/√(k·ρ)` (the sampling error of a correlation coefficient): small for
//! near copies (a rescaled copy `c·ΔW` has the sketch `c·S` exactly, up to f32 rounding, so
//! its cosine is 1), largest for unrelated updates. That the projection keeps every inner
//! product within `ε·‖ΔWᵢ‖‖ΔWⱼ‖` once `k = O(log n / ε²)` is the Johnson–Lindenstrauss lemma
//! (W. B. Johnson & J. Lindenstrauss, 1984); D. Achlioptas ("Database-friendly random
//! projections: Johnson–Lindenstrauss with binary coins", J. Comput. Syst. Sci. 66(4),
//! 2003, theorem 1.1) proves it for `±1/√k` entries, the ones used here.
//!
//! `k` = [`SKETCH_COLUMNS`] = 32: with `ρ ≥ 4` (rank 4, or rank 1 over four modules) the
//! squared norms are within `√(2/128)` = 12.5 % (one σ), the cosine of two honest updates
//! with `c = 0.9` within 0.017; the copy rules' threshold 0.995 is then over five σ above
//! such a pair, and an exact or rescaled copy is at 1. Sixteen columns would double the
//! variance for half the cost; the cost is small either way (for Qwen3-0.6B's `q_proj`,
//! 2048 × 1024 at `r = 8`: 0.8 M multiply-adds per node, against the 17 M of its `ΔW`).
//! The sketch holds `out·k` floats per module, the order of the adapter's `r·(in + out)`
//! (2× for a square module at `r = 8`, 2.7× for that `q_proj`). Measured on the LoRA test
//! job (`qwen3-tiny`, rank 4, eight modules of 128 × 128 and 64 × 128; 420 pairs of
//! adapters from unrelated to identical, each under its own seed): cosine error at most
//! 0.019 (rms 0.0046), norm error at most 7.4 %.
//!
//! # The seed
//!
//! The epoch's projection seed is `SHA-256(`[`SKETCH_DOMAIN`]` ‖ epoch secret)`
//! ([`Projection::of_epoch`]): the same for every node of an epoch, unknown to the nodes
//! until the secret is revealed at epoch end, after every upload (so no adapter can be
//! shaped against `X`), and recomputable by an auditor from the revealed secret. Module
//! `m`'s signs are the bits of the ChaCha20 stream ([`rand_chacha::ChaCha20Rng`], its
//! `next_u64` words, least significant bit first) keyed by
//! `SHA-256(seed ‖ len(base) u64 LE ‖ base name ‖ in u64 LE ‖ k u64 LE)`: entry `(p, c)` of
//! `Rₘ` (row-major, index `p·k + c`) is `+1` when its bit is 0, `−1` when it is 1
//! ([`Projection::signs`]).

use hanzod_train::{Layout, Trainer};
use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};

use crate::lora::{LoraError, LoraFactors, LoraModule, LoraPlan};
use crate::score::EpochSecret;

/// The domain of the projection seed, `SHA-256(SKETCH_DOMAIN ‖ epoch secret)`:
/// [`hanzod_actors::domain::LORA_SKETCH`] (prefix-free among every domain hanzod uses).
pub const SKETCH_DOMAIN: &[u8] = hanzod_actors::domain::LORA_SKETCH;

/// Columns `k` of every module's projection (module docs: the error bound and the cost).
pub const SKETCH_COLUMNS: usize = 32;

/// Why a sketch could not be computed. Every check on the shapes comes before any work.
#[derive(Debug, thiserror::Error)]
pub enum SketchError {
    /// A projection of zero columns.
    #[error("a sketch needs at least one column")]
    NoColumns,
    /// The plan or the adapter does not fit ([`LoraPlan`]'s checks,
    /// [`LoraFactors::check_factors`]: kind, missing or unexpected tensors, shapes, length).
    #[error(transparent)]
    Lora(#[from] LoraError),
    /// A full-layout update whose length is not its layout's.
    #[error("the update holds {found} values for a layout of {expected}")]
    UpdateLength {
        /// The layout's length.
        expected: usize,
        /// The update's length.
        found: usize,
    },
    /// A module's base tensor that the full layout lacks.
    #[error("base tensor {tensor:?} is not in the update's layout")]
    UpdateMissing {
        /// The module's base tensor.
        tensor: String,
    },
    /// A module's base tensor whose shape in the full layout is not `[out, in]`.
    #[error("base tensor {tensor:?} has shape {found:?} in the update's layout, the plan wants {expected:?}")]
    UpdateShape {
        /// The module's base tensor.
        tensor: String,
        /// `[out, in]` from the plan.
        expected: Vec<usize>,
        /// The layout's shape.
        found: Vec<usize>,
    },
    /// A NaN or ±Inf in a factor, in the update, or in the sketch (an f32 overflow).
    #[error("{what} of module {module:?} is not finite at element {index}")]
    NonFinite {
        /// The module's base tensor.
        module: String,
        /// Which values: `"A"`, `"B"`, `"update"` or `"sketch"`.
        what: &'static str,
        /// Element index, row-major in those values.
        index: usize,
    },
    /// A size (`in·k`, `out·k`, or the sketch's length) overflows `usize`.
    #[error("the sketch of {what} is too large (overflows usize)")]
    TooLarge {
        /// The module's base tensor, or `sketch`.
        what: String,
    },
}

/// An epoch's projection: its seed and its `k` columns (module docs). `Debug` does not
/// print the seed: before the epoch secret is revealed it would let a node shape its
/// adapter against `X`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Projection {
    seed: [u8; 32],
    columns: usize,
}

impl std::fmt::Debug for Projection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projection")
            .field("seed", &"<redacted>")
            .field("columns", &self.columns)
            .finish()
    }
}

impl Projection {
    /// The projection of `seed` with `columns` columns; [`SketchError::NoColumns`] for 0.
    pub fn new(seed: [u8; 32], columns: usize) -> Result<Projection, SketchError> {
        if columns == 0 {
            return Err(SketchError::NoColumns);
        }
        Ok(Projection { seed, columns })
    }

    /// The projection of the epoch whose secret is `secret`: seed
    /// `SHA-256(`[`SKETCH_DOMAIN`]` ‖ secret)`, [`SKETCH_COLUMNS`] columns.
    pub fn of_epoch(secret: &EpochSecret) -> Projection {
        let mut h = Sha256::new();
        h.update(SKETCH_DOMAIN);
        h.update(secret.as_bytes());
        Projection {
            seed: h.finalize().into(),
            columns: SKETCH_COLUMNS,
        }
    }

    /// The columns `k`.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// The sign matrix `Rₘ` of `module`: `in × k` values `±1.0`, row-major (`Xₘ = Rₘ/√k`;
    /// module docs for how the bits are drawn). Deterministic given the seed, the module's
    /// base name, `in` and `k`. [`SketchError::TooLarge`] when `in·k` overflows.
    pub fn signs(&self, module: &LoraModule) -> Result<Vec<f32>, SketchError> {
        let k = self.columns;
        let n = module
            .in_features
            .checked_mul(k)
            .ok_or_else(|| SketchError::TooLarge {
                what: module.base.clone(),
            })?;
        let mut h = Sha256::new();
        h.update(self.seed);
        h.update((module.base.len() as u64).to_le_bytes());
        h.update(module.base.as_bytes());
        h.update((module.in_features as u64).to_le_bytes());
        h.update((k as u64).to_le_bytes());
        let mut rng = ChaCha20Rng::from_seed(h.finalize().into());
        let mut signs = Vec::with_capacity(n);
        while signs.len() < n {
            let word = rng.next_u64();
            let take = (n - signs.len()).min(64);
            signs.extend((0..take).map(|b| if (word >> b) & 1 == 0 { 1.0f32 } else { -1.0 }));
        }
        Ok(signs)
    }
}

/// The length of a sketch under `plan` with `columns` columns: `Σₘ outₘ · k`.
/// [`SketchError::TooLarge`] on overflow.
pub fn sketch_len(plan: &LoraPlan, columns: usize) -> Result<usize, SketchError> {
    plan.modules
        .iter()
        .try_fold(0usize, |acc, m| {
            m.out_features
                .checked_mul(columns)
                .and_then(|l| acc.checked_add(l))
        })
        .ok_or_else(|| SketchError::TooLarge {
            what: "sketch".into(),
        })
}

/// [`SketchError::NonFinite`] at the first NaN or ±Inf of `values`.
fn check_finite(
    module: &LoraModule,
    what: &'static str,
    values: &[f32],
) -> Result<(), SketchError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(SketchError::NonFinite {
            module: module.base.clone(),
            what,
            index,
        }),
        None => Ok(()),
    }
}

/// `acc[c] += Σ_p x[p] · signs[p·k + c]` for one row `x` of `in` values (f64 accumulation).
fn project_row(x: &[f32], signs: &[f32], k: usize, acc: &mut [f64]) {
    for (&v, row) in x.iter().zip(signs.chunks_exact(k)) {
        if v == 0.0 {
            continue;
        }
        let v = f64::from(v);
        for (a, &s) in acc.iter_mut().zip(row) {
            *a += v * f64::from(s);
        }
    }
}

/// Checks the plan and the projection's sizes; returns the sketch's length.
fn check_plan(plan: &LoraPlan, projection: &Projection) -> Result<usize, SketchError> {
    if projection.columns == 0 {
        return Err(SketchError::NoColumns);
    }
    // What the sketch relies on of the plan (the adapter's shapes are checked against it
    // by `check_factors`).
    if plan.rank == 0 {
        return Err(LoraError::ZeroRank.into());
    }
    if !(plan.alpha.is_finite() && plan.alpha > 0.0) {
        return Err(LoraError::BadAlpha(plan.alpha).into());
    }
    if plan.modules.is_empty() {
        return Err(LoraError::NoModules.into());
    }
    for m in &plan.modules {
        let fits = m.in_features.checked_mul(projection.columns).is_some()
            && plan.rank.checked_mul(projection.columns).is_some()
            && m.out_features.checked_mul(m.in_features).is_some();
        if !fits {
            return Err(SketchError::TooLarge {
                what: m.base.clone(),
            });
        }
    }
    sketch_len(plan, projection.columns)
}

/// The sketch of one adapter's update (module docs): for every module of `plan`, in order,
/// `Sₘ = (alpha/r)·Bₘ·(Aₘ·Xₘ)` `[out, k]` row-major, concatenated ([`sketch_len`] floats).
/// `A [r, in]` and `B [out, r]` come from `adapter` through [`LoraFactors::factor`] (a
/// parsed delta, [`hanzod_train::Weights`] or a [`crate::lora::FlatAdapter`]); the scaling
/// is [`LoraPlan::scaling`], as the merge's `ΔW`. Accumulated in f64, rounded once to f32.
///
/// Cost per module: `r·k·(in + out)` multiply-adds, `in·k` floats for `Rₘ` and `r·k` for
/// `Aₘ·Xₘ`; `ΔW` is never formed. Errors, before any work: the plan's and the adapter's
/// checks ([`SketchError::Lora`]); then [`SketchError::NonFinite`] for a non-finite factor or
/// a sketch value that overflows f32.
pub fn sketch_adapter<D: LoraFactors + ?Sized>(
    plan: &LoraPlan,
    adapter: &D,
    projection: &Projection,
) -> Result<Vec<f32>, SketchError> {
    let len = check_plan(plan, projection)?;
    adapter.check_factors(plan, 0)?;
    let (k, r) = (projection.columns, plan.rank);
    let s = f64::from(plan.scaling()) / (k as f64).sqrt();
    let mut out = Vec::with_capacity(len);
    let mut ax = vec![0.0f64; r * k];
    for m in &plan.modules {
        let a = adapter.factor(0, &m.lora_a)?;
        let b = adapter.factor(0, &m.lora_b)?;
        check_finite(m, "A", &a)?;
        check_finite(m, "B", &b)?;
        let signs = projection.signs(m)?;
        // A·R: [r, k].
        ax.iter_mut().for_each(|x| *x = 0.0);
        for (row, acc) in a
            .chunks_exact(m.in_features.max(1))
            .zip(ax.chunks_exact_mut(k))
        {
            project_row(row, &signs, k, acc);
        }
        // s·B·(A·R): [out, k].
        let start = out.len();
        let mut acc = vec![0.0f64; k];
        for brow in b.chunks_exact(r) {
            acc.iter_mut().for_each(|x| *x = 0.0);
            for (&bt, axt) in brow.iter().zip(ax.chunks_exact(k)) {
                let bt = f64::from(bt);
                for (o, &v) in acc.iter_mut().zip(axt) {
                    *o += bt * v;
                }
            }
            out.extend(acc.iter().map(|&v| (s * v) as f32));
        }
        check_finite(m, "sketch", &out[start..])?;
    }
    Ok(out)
}

/// The sketch of an update in the model's full layout (module docs): for every module of
/// `plan`, in order, `Sₘ = ΔWₘ·Xₘ` `[out, k]` with `ΔWₘ` the values of `update` at the
/// module's base tensor in `layout`; the values of unadapted tensors are not read. The same
/// `Xₘ` as [`sketch_adapter`], so the sketch of `ΔW` materialised from an adapter is that
/// adapter's sketch up to the f32 rounding of `ΔW`. What a LoRA job's last merged update
/// ([`crate::epoch::Merged::delta`]: the merged `ΔW` on the adapted modules, zeros
/// elsewhere) is compared through.
///
/// Cost per module: `out·in·k` multiply-adds (f64 accumulation), `in·k` floats for `Rₘ`.
/// Errors, before any work: the plan's ([`SketchError::Lora`]), `update` not of `layout`'s
/// length ([`SketchError::UpdateLength`]), a module's base tensor absent or not `[out, in]`
/// ([`SketchError::UpdateMissing`], [`SketchError::UpdateShape`]); then
/// [`SketchError::NonFinite`] for a non-finite update value or sketch value.
pub fn sketch_update(
    plan: &LoraPlan,
    layout: &Layout,
    update: &[f32],
    projection: &Projection,
) -> Result<Vec<f32>, SketchError> {
    let len = check_plan(plan, projection)?;
    if update.len() != layout.len() {
        return Err(SketchError::UpdateLength {
            expected: layout.len(),
            found: update.len(),
        });
    }
    let mut slots = Vec::with_capacity(plan.modules.len());
    for m in &plan.modules {
        let e = layout
            .entry(&m.base)
            .ok_or_else(|| SketchError::UpdateMissing {
                tensor: m.base.clone(),
            })?;
        if e.shape != [m.out_features, m.in_features] {
            return Err(SketchError::UpdateShape {
                tensor: m.base.clone(),
                expected: vec![m.out_features, m.in_features],
                found: e.shape.clone(),
            });
        }
        // In bounds: the layout's entries lie within its length, which `update` has.
        slots.push(&update[e.offset..e.offset + e.len]);
    }
    let k = projection.columns;
    let scale = 1.0 / (k as f64).sqrt();
    let mut out = Vec::with_capacity(len);
    let mut acc = vec![0.0f64; k];
    for (m, dw) in plan.modules.iter().zip(slots) {
        check_finite(m, "update", dw)?;
        let start = out.len();
        if m.in_features == 0 {
            // `[out, 0]`: the sketch is `out·k` zeros.
            out.resize(start + m.out_features * k, 0.0);
            continue;
        }
        let signs = projection.signs(m)?;
        for row in dw.chunks_exact(m.in_features) {
            acc.iter_mut().for_each(|x| *x = 0.0);
            project_row(row, &signs, k, &mut acc);
            out.extend(acc.iter().map(|&v| (scale * v) as f32));
        }
        check_finite(m, "sketch", &out[start..])?;
    }
    Ok(out)
}

/// What a LoRA star epoch compares ([`sketch_epoch`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpochSketches {
    /// Each given adapter's sketch, in the caller's order (`None`: no adapter given, or it
    /// could not be sketched).
    pub adapters: Vec<Option<Vec<f32>>>,
    /// The last merged update's sketch (`None`: none given, not of the model's full
    /// length, or it could not be sketched).
    pub last_merged: Option<Vec<f32>>,
}

impl EpochSketches {
    /// No sketch for any of `n` deltas.
    pub fn none(n: usize) -> EpochSketches {
        EpochSketches {
            adapters: vec![None; n],
            last_merged: None,
        }
    }

    /// The adapters' sketches as slices, in the caller's order.
    pub fn views(&self) -> Vec<Option<&[f32]>> {
        self.adapters.iter().map(|s| s.as_deref()).collect()
    }
}

/// The sketches a LoRA star epoch compares: every adapter of `adapters` (each in `trainer`'s
/// delta layout, [`Trainer::delta_layout`]; `None`: not to be sketched) with
/// [`sketch_adapter`], and `last_merged` (the model's full layout, [`Trainer::layout`]) with
/// [`sketch_update`] when it has that layout's length, all under the epoch's projection
/// ([`Projection::of_epoch`] of `secret`). An adapter or update that cannot be sketched is
/// `None` (logged): it is left out of the comparisons, not rejected. Errors only when
/// `trainer` has no usable LoRA plan ([`LoraPlan::of_trainer`]: not a LoRA job,
/// [`SketchError::Lora`] with [`LoraError::NotLoraSpec`]; or an adapter layout outside the
/// PEFT naming).
pub fn sketch_epoch(
    trainer: &Trainer,
    secret: &EpochSecret,
    adapters: &[Option<&[f32]>],
    last_merged: Option<&[f32]>,
) -> Result<EpochSketches, SketchError> {
    let plan = LoraPlan::of_trainer(trainer)?.ok_or_else(|| {
        SketchError::Lora(LoraError::NotLoraSpec(trainer.layout().name().to_string()))
    })?;
    let projection = Projection::of_epoch(secret);
    let layout = trainer.delta_layout();
    let adapters = adapters
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let data = (*a)?;
            let adapter = crate::lora::FlatAdapter::new(&layout, data);
            sketch_adapter(&plan, &adapter, &projection)
                .inspect_err(|e| {
                    tracing::warn!(index, error = %e, "LoRA delta not sketched: left out of the copy and agreement checks");
                })
                .ok()
        })
        .collect();
    let full = trainer.layout();
    let last_merged = last_merged.filter(|l| l.len() == full.len()).and_then(|l| {
        sketch_update(&plan, &full, l, &projection)
            .inspect_err(|e| {
                tracing::warn!(error = %e, "last merged update not sketched: no common direction");
            })
            .ok()
    });
    Ok(EpochSketches {
        adapters,
        last_merged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::{for_each_update, FlatAdapter, LORA_A_SUFFIX, LORA_B_SUFFIX, PEFT_PREFIX};
    use hanzod_protocol::model::{LoraConfig, ModelSpec};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::sync::Arc;

    /// Standard deviations the inner products may stray from the exact ones (the variance
    /// of the module docs; the tails are sub-exponential, Hanson–Wright).
    const SIGMAS: f64 = 6.0;

    /// A job of modules `dims` (`[out, in]` each), rank `rank`, `alpha`: its plan (parsed
    /// from the adapter spec by [`LoraPlan::from_spec`]), the adapter layout, and the full
    /// layout (every module's base and one unadapted tensor).
    struct Job {
        plan: LoraPlan,
        adapter: Arc<Layout>,
        full: Arc<Layout>,
    }

    fn job(rank: usize, dims: &[(usize, usize)], alpha: f32) -> Job {
        let mut params = BTreeMap::new();
        let mut base = BTreeMap::new();
        for (i, &(o, n)) in dims.iter().enumerate() {
            let module = format!("model.layers.{i}.self_attn.q_proj");
            params.insert(
                format!("{PEFT_PREFIX}{module}{LORA_A_SUFFIX}"),
                vec![rank, n],
            );
            params.insert(
                format!("{PEFT_PREFIX}{module}{LORA_B_SUFFIX}"),
                vec![o, rank],
            );
            base.insert(format!("{module}.weight"), vec![o, n]);
        }
        base.insert("model.norm.weight".to_string(), vec![3]);
        let spec = ModelSpec {
            name: "adapter".into(),
            params,
            lora: Some(LoraConfig {
                rank,
                target_modules: vec!["q_proj".into()],
            }),
        };
        let full = ModelSpec {
            name: "full".into(),
            params: base,
            lora: None,
        };
        Job {
            plan: LoraPlan::from_spec(&spec, alpha).expect("plan"),
            adapter: Arc::new(Layout::new(&spec).expect("adapter layout")),
            full: Arc::new(Layout::new(&full).expect("full layout")),
        }
    }

    use crate::epoch::tests::{gaussian, gaussian_vec};

    /// A pair of adapters as honest LoRA nodes hold them: the same `A` up to `1 − t` of
    /// independent noise, `Bⱼ = t·Bᵢ + (1 − t)·B'` (`t` = 1: the same adapter; 0: unrelated
    /// `B`s on nearly the same `A`).
    fn pair(j: &Job, t: f32, rng: &mut ChaCha8Rng) -> (Vec<f32>, Vec<f32>) {
        let first = gaussian_vec(rng, j.adapter.len());
        let mut second = first.clone();
        for e in j.adapter.entries() {
            let is_b = e.name.ends_with(LORA_B_SUFFIX);
            for x in &mut second[e.offset..e.offset + e.len] {
                let fresh = gaussian(rng);
                *x = if is_b {
                    t * *x + (1.0 - t) * fresh
                } else {
                    *x + 0.3 * (1.0 - t) * fresh
                };
            }
        }
        (first, second)
    }

    /// Every module's `ΔW = s·B·A` `[out, in]` in f64 (the test's own product).
    fn dense(j: &Job, data: &[f32]) -> Vec<Vec<f64>> {
        let adapter = FlatAdapter::new(&j.adapter, data);
        let (r, s) = (j.plan.rank, f64::from(j.plan.scaling()));
        j.plan
            .modules
            .iter()
            .map(|m| {
                let a = adapter.factor(0, &m.lora_a).expect("A");
                let b = adapter.factor(0, &m.lora_b).expect("B");
                let mut dw = vec![0.0f64; m.out_features * m.in_features];
                for o in 0..m.out_features {
                    for p in 0..m.in_features {
                        dw[o * m.in_features + p] = (0..r)
                            .map(|t| {
                                s * f64::from(b[o * r + t]) * f64::from(a[t * m.in_features + p])
                            })
                            .sum();
                    }
                }
                dw
            })
            .collect()
    }

    fn dot64(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn dot32(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum()
    }

    fn cos32(a: &[f32], b: &[f32]) -> f64 {
        dot32(a, b) / (dot32(a, a) * dot32(b, b)).sqrt()
    }

    /// `⟨U, V⟩_F` over the modules and the standard deviation of its sketch estimate with
    /// `k` columns: `√((2/k) Σₘ Σ_{p≠q} sym(UₘᵀVₘ)²_pq)` (module docs).
    fn exact_and_sigma(j: &Job, u: &[Vec<f64>], v: &[Vec<f64>], k: usize) -> (f64, f64) {
        let (mut dot, mut var) = (0.0, 0.0);
        for ((m, u), v) in j.plan.modules.iter().zip(u).zip(v) {
            dot += dot64(u, v);
            let (o_n, i_n) = (m.out_features, m.in_features);
            // M = UᵀV: [in, in].
            let mut mm = vec![0.0f64; i_n * i_n];
            for o in 0..o_n {
                for p in 0..i_n {
                    for q in 0..i_n {
                        mm[p * i_n + q] += u[o * i_n + p] * v[o * i_n + q];
                    }
                }
            }
            for p in 0..i_n {
                for q in 0..i_n {
                    if p != q {
                        let sym = 0.5 * (mm[p * i_n + q] + mm[q * i_n + p]);
                        var += sym * sym;
                    }
                }
            }
        }
        (dot, (2.0 / k as f64 * var).sqrt())
    }

    fn dims_strategy() -> impl Strategy<Value = Vec<(usize, usize)>> {
        prop::collection::vec((1usize..=12, 1usize..=12), 1..=3)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Over shapes, ranks, alphas and how alike two adapters are: the sketches' inner
        /// products and squared norms are within six standard deviations (module docs) of
        /// the exact ones of the materialised `ΔW`s, and their cosine within what those
        /// bounds imply.
        #[test]
        fn sketch_inner_products_norms_and_cosines_match_the_materialised_updates(
            rank in 1usize..=4,
            dims in dims_strategy(),
            alpha in 0.5f32..32.0,
            t in 0.0f32..=1.0,
            seed in any::<u64>(),
            proj_seed in any::<[u8; 32]>(),
        ) {
            let j = job(rank, &dims, alpha);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (x, y) = pair(&j, t, &mut rng);
            let p = Projection::new(proj_seed, SKETCH_COLUMNS).unwrap();
            let sx = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &x), &p).unwrap();
            let sy = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &y), &p).unwrap();
            prop_assert_eq!(sx.len(), sketch_len(&j.plan, SKETCH_COLUMNS).unwrap());
            let (u, v) = (dense(&j, &x), dense(&j, &y));
            let k = SKETCH_COLUMNS;
            let (uv, s_uv) = exact_and_sigma(&j, &u, &v, k);
            let (uu, s_uu) = exact_and_sigma(&j, &u, &u, k);
            let (vv, s_vv) = exact_and_sigma(&j, &v, &v, k);
            let (ex, exx, eyy) = (dot32(&sx, &sy), dot32(&sx, &sx), dot32(&sy, &sy));
            // f32 rounding of the sketch values (relative 2⁻²⁴ each).
            let slack = 1e-5 * (exx * eyy).sqrt() + 1e-30;
            prop_assert!((ex - uv).abs() <= SIGMAS * s_uv + slack, "dot {} vs {} (σ {})", ex, uv, s_uv);
            prop_assert!((exx - uu).abs() <= SIGMAS * s_uu + 1e-5 * exx + 1e-30, "‖x‖² {} vs {} (σ {})", exx, uu, s_uu);
            prop_assert!((eyy - vv).abs() <= SIGMAS * s_vv + 1e-5 * eyy + 1e-30, "‖y‖² {} vs {} (σ {})", eyy, vv, s_vv);
            // The cosine: the extreme values of d/√(a·b) over those three intervals.
            let (lo_a, lo_b) = (uu - SIGMAS * s_uu, vv - SIGMAS * s_vv);
            if lo_a > 0.0 && lo_b > 0.0 {
                let exact = uv / (uu * vv).sqrt();
                let d = SIGMAS * s_uv + slack;
                let corners = [uv - d, uv + d];
                let denominators = [(lo_a * lo_b).sqrt(), ((uu + SIGMAS * s_uu) * (vv + SIGMAS * s_vv)).sqrt()];
                let tol = corners
                    .iter()
                    .flat_map(|n| denominators.iter().map(move |q| (n / q).clamp(-1.0, 1.0)))
                    .map(|c| (c - exact).abs())
                    .fold(0.0f64, f64::max)
                    + 1e-6;
                let got = cos32(&sx, &sy);
                prop_assert!((got - exact).abs() <= tol, "cosine {} vs {} (tolerance {})", got, exact, tol);
            }
        }

        /// The same adapter gives the same sketch, bit for bit; `B·c` gives the sketch `c·S`:
        /// cosine 1 (−1 for `c < 0`) and norm ratio `|c|`, up to f32 rounding.
        #[test]
        fn a_copy_has_the_same_sketch_and_a_rescaled_copy_cosine_one(
            rank in 1usize..=4,
            dims in dims_strategy(),
            c in prop_oneof![-100.0f32..-0.01, 0.01f32..100.0],
            seed in any::<u64>(),
        ) {
            let j = job(rank, &dims, 8.0);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let x = gaussian_vec(&mut rng, j.adapter.len());
            let p = Projection::new([seed as u8; 32], SKETCH_COLUMNS).unwrap();
            let sx = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &x), &p).unwrap();
            let again = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &x.clone()), &p).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&sx), bits(&again));
            let mut scaled = x.clone();
            for e in j.adapter.entries().iter().filter(|e| e.name.ends_with(LORA_B_SUFFIX)) {
                scaled[e.offset..e.offset + e.len].iter_mut().for_each(|b| *b *= c);
            }
            let sc = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &scaled), &p).unwrap();
            let cos = cos32(&sx, &sc);
            prop_assert!((cos - f64::from(c.signum())).abs() <= 1e-6, "cosine {}", cos);
            let ratio = (dot32(&sc, &sc) / dot32(&sx, &sx)).sqrt();
            prop_assert!((ratio / f64::from(c.abs()) - 1.0).abs() <= 1e-5, "ratio {} for {}", ratio, c);
        }

        /// The sketch of `ΔW` materialised in the full layout (by the merge's own kernel,
        /// [`for_each_update`]; arbitrary values on the unadapted tensor) is the adapter's
        /// sketch, element by element within the f32 rounding of `ΔW`.
        #[test]
        fn the_sketch_of_the_materialised_update_is_the_adapters(
            rank in 1usize..=4,
            dims in prop::collection::vec((0usize..=12, 0usize..=12), 1..=3),
            alpha in 0.5f32..32.0,
            seed in any::<u64>(),
        ) {
            let j = job(rank, &dims, alpha);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let x = gaussian_vec(&mut rng, j.adapter.len());
            let adapter = FlatAdapter::new(&j.adapter, &x);
            let mut full = gaussian_vec(&mut rng, j.full.len());
            for_each_update(&j.plan, &adapter, |m, dw| -> Result<(), Infallible> {
                let e = j.full.entry(&m.base).expect("base");
                full[e.offset..e.offset + e.len].copy_from_slice(dw);
                Ok(())
            })
            .unwrap();
            let p = Projection::new([7; 32], SKETCH_COLUMNS).unwrap();
            let from_adapter = sketch_adapter(&j.plan, &adapter, &p).unwrap();
            let from_full = sketch_update(&j.plan, &j.full, &full, &p).unwrap();
            prop_assert_eq!(from_adapter.len(), from_full.len());
            // Bound: the f32 ΔW is within (r + 2)·2⁻²⁴ of Σₜ|s·B·A| per element; summed over
            // `in` with |R| = 1 and scaled by 1/√k.
            let k = SKETCH_COLUMNS;
            let (r, s) = (rank, f64::from(j.plan.scaling()));
            let mut at = 0;
            for m in &j.plan.modules {
                let a = adapter.factor(0, &m.lora_a).unwrap();
                let b = adapter.factor(0, &m.lora_b).unwrap();
                for o in 0..m.out_features {
                    let mag: f64 = (0..m.in_features)
                        .flat_map(|q| (0..r).map(move |t| (q, t)))
                        .map(|(q, t)| (s * f64::from(b[o * r + t]) * f64::from(a[t * m.in_features + q])).abs())
                        .sum::<f64>()
                        / (k as f64).sqrt();
                    for c in 0..k {
                        let (g, w) = (from_full[at], from_adapter[at]);
                        let tol = 1e-6 * (r as f64 + 4.0) * mag + 1e-6 * f64::from(w.abs()) + 1e-30;
                        prop_assert!((f64::from(g) - f64::from(w)).abs() <= tol, "{}[{},{}]: {} vs {}", m.base, o, c, g, w);
                        at += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn the_projection_is_deterministic_per_seed_and_module_and_differs_across_them() {
        let j = job(2, &[(5, 300), (4, 300)], 8.0);
        let (m0, m1) = (&j.plan.modules[0], &j.plan.modules[1]);
        let p = Projection::new([1; 32], SKETCH_COLUMNS).unwrap();
        let q = Projection::new([2; 32], SKETCH_COLUMNS).unwrap();
        let signs = p.signs(m0).unwrap();
        assert_eq!(signs.len(), 300 * SKETCH_COLUMNS);
        assert!(signs.iter().all(|&s| s == 1.0 || s == -1.0));
        assert_eq!(
            signs,
            p.signs(m0).unwrap(),
            "the same seed gives the same X"
        );
        let other = q.signs(m0).unwrap();
        let differ = signs.iter().zip(&other).filter(|(a, b)| a != b).count();
        // Independent fair signs: about half differ (9600 entries, σ ≈ 49).
        assert!(
            (4400..5200).contains(&differ),
            "{differ} of {}",
            signs.len()
        );
        assert_ne!(signs, p.signs(m1).unwrap(), "each module has its own X");
        let plus = signs.iter().filter(|&&s| s > 0.0).count();
        assert!((4400..5200).contains(&plus), "{plus} positive signs");
        // The epoch's projection: the secret decides it.
        let (e1, e2) = (
            Projection::of_epoch(&EpochSecret::from_bytes([9; 32])),
            Projection::of_epoch(&EpochSecret::from_bytes([10; 32])),
        );
        assert_eq!(e1.columns(), SKETCH_COLUMNS);
        assert_ne!(e1.signs(m0).unwrap(), e2.signs(m0).unwrap());
        assert_eq!(
            e1,
            Projection::of_epoch(&EpochSecret::from_bytes([9; 32])),
            "an auditor recomputes it from the revealed secret"
        );
        assert!(format!("{e1:?}").contains("redacted"), "{e1:?}");
        // The same seed under another k is another matrix, not a reshaping of this one.
        let wide = Projection::new([1; 32], 2 * SKETCH_COLUMNS).unwrap();
        assert_ne!(
            wide.signs(m0).unwrap()[..SKETCH_COLUMNS],
            signs[..SKETCH_COLUMNS]
        );
    }

    #[test]
    fn what_cannot_be_sketched_is_a_typed_error() {
        let j = job(2, &[(3, 4), (5, 6)], 8.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let x = gaussian_vec(&mut rng, j.adapter.len());
        let p = Projection::new([3; 32], 8).unwrap();
        assert!(matches!(
            Projection::new([3; 32], 0),
            Err(SketchError::NoColumns)
        ));
        // An adapter of another shape; a buffer shorter than its layout.
        let other = job(3, &[(3, 4), (5, 6)], 8.0);
        let y = gaussian_vec(&mut rng, other.adapter.len());
        assert!(matches!(
            sketch_adapter(&j.plan, &FlatAdapter::new(&other.adapter, &y), &p),
            Err(SketchError::Lora(LoraError::WrongShape { .. }))
        ));
        assert!(matches!(
            sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &x[1..]), &p),
            Err(SketchError::Lora(LoraError::AdapterLength { .. }))
        ));
        let mut bad = j.plan.clone();
        bad.alpha = f32::NAN;
        assert!(matches!(
            sketch_adapter(&bad, &FlatAdapter::new(&j.adapter, &x), &p),
            Err(SketchError::Lora(LoraError::BadAlpha(_)))
        ));
        // Non-finite factors, and an overflow of the sketch.
        let b1 = j.adapter.entry(&j.plan.modules[1].lora_b).unwrap().offset + 2;
        let mut nan = x.clone();
        nan[b1] = f32::NAN;
        match sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &nan), &p) {
            Err(SketchError::NonFinite {
                module,
                what: "B",
                index: 2,
            }) => {
                assert_eq!(module, j.plan.modules[1].base)
            }
            other => panic!("{other:?}"),
        }
        let huge = vec![1e30f32; x.len()];
        assert!(matches!(
            sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &huge), &p),
            Err(SketchError::NonFinite { what: "sketch", .. })
        ));
        // Full-layout updates: length, a missing or misshapen module, a non-finite value.
        let full = vec![0.5f32; j.full.len()];
        assert!(matches!(
            sketch_update(&j.plan, &j.full, &full[1..], &p),
            Err(SketchError::UpdateLength { expected, found }) if found + 1 == expected
        ));
        let fewer = job(2, &[(3, 4)], 8.0);
        assert!(matches!(
            sketch_update(&j.plan, &fewer.full, &vec![0.0; fewer.full.len()], &p),
            Err(SketchError::UpdateMissing { .. })
        ));
        let wrong = job(2, &[(3, 4), (6, 5)], 8.0);
        assert!(matches!(
            sketch_update(&j.plan, &wrong.full, &vec![0.0; wrong.full.len()], &p),
            Err(SketchError::UpdateShape { .. })
        ));
        let mut inf = full.clone();
        let e = j.full.entry(&j.plan.modules[0].base).unwrap();
        inf[e.offset + 1] = f32::INFINITY;
        assert!(matches!(
            sketch_update(&j.plan, &j.full, &inf, &p),
            Err(SketchError::NonFinite {
                what: "update",
                index: 1,
                ..
            })
        ));
        // A NaN off the adapted modules is not read.
        let mut off = full.clone();
        off[j.full.entry("model.norm.weight").unwrap().offset] = f32::NAN;
        assert!(sketch_update(&j.plan, &j.full, &off, &p).is_ok());
    }

    /// The error measured on the LoRA test job's shapes (`qwen3-tiny`, rank 4, `q_proj` and
    /// `v_proj`): 420 pairs of random adapters from unrelated to identical, each pair
    /// sketched under its own seed, against the exact cosine of the materialised updates.
    /// Prints the figures (`--nocapture`).
    #[test]
    fn measured_cosine_error_on_the_lora_test_job() {
        let f = crate::validate::lora_tests::lora_fixture();
        let j = Job {
            plan: f.plan.clone(),
            adapter: f.trainer.delta_layout(),
            full: f.trainer.layout(),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(2024);
        let (mut worst, mut sq, mut worst_scaled, mut worst_norm) =
            (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        let n = 420;
        for i in 0..n {
            let t = (i % 21) as f32 / 20.0;
            let (x, y) = pair(&j, t, &mut rng);
            let p = Projection::new(rng.gen(), SKETCH_COLUMNS).unwrap();
            let sx = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &x), &p).unwrap();
            let sy = sketch_adapter(&j.plan, &FlatAdapter::new(&j.adapter, &y), &p).unwrap();
            let (u, v) = (dense(&j, &x), dense(&j, &y));
            let (uv, uu, vv) = (
                u.iter().zip(&v).map(|(a, b)| dot64(a, b)).sum::<f64>(),
                u.iter().map(|a| dot64(a, a)).sum::<f64>(),
                v.iter().map(|a| dot64(a, a)).sum::<f64>(),
            );
            let exact = uv / (uu * vv).sqrt();
            let err = (cos32(&sx, &sy) - exact).abs();
            worst = worst.max(err);
            sq += err * err;
            if exact < 0.999 {
                worst_scaled = worst_scaled.max(err / (1.0 - exact * exact));
            }
            worst_norm = worst_norm.max((dot32(&sx, &sx).sqrt() / uu.sqrt() - 1.0).abs());
        }
        let rms = (sq / n as f64).sqrt();
        let shapes: Vec<(usize, usize)> = j
            .plan
            .modules
            .iter()
            .map(|m| (m.out_features, m.in_features))
            .collect();
        eprintln!(
            "k = {SKETCH_COLUMNS}, r = {}, modules {shapes:?}: cosine error max {worst:.4}, rms {rms:.4}, \
             max error/(1 − c²) {worst_scaled:.4}; norm relative error max {worst_norm:.4}",
            j.plan.rank
        );
        assert!(worst <= 0.05, "{worst}");
        assert!(worst_norm <= 0.15, "{worst_norm}");
    }

    #[test]
    fn an_epoch_sketches_its_adapters_and_the_last_merged_update() {
        let f = crate::validate::lora_tests::lora_fixture();
        let secret = EpochSecret::from_bytes([9; 32]);
        let (a, b) = (&f.deltas[0].delta.data, &f.deltas[1].delta.data);
        let full = f.trainer.layout();
        let mut last = vec![0.0f32; full.len()];
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for m in &f.plan.modules {
            let e = full.entry(&m.base).expect("base");
            last[e.offset..e.offset + e.len].copy_from_slice(&gaussian_vec(&mut rng, e.len));
        }
        let s = sketch_epoch(
            &f.trainer,
            &secret,
            &[Some(a), None, Some(&b[1..]), Some(b)],
            Some(&last),
        )
        .unwrap();
        let p = Projection::of_epoch(&secret);
        let layout = f.trainer.delta_layout();
        let want = |d: &[f32]| sketch_adapter(&f.plan, &FlatAdapter::new(&layout, d), &p).unwrap();
        assert_eq!(s.adapters.len(), 4);
        assert_eq!(s.adapters[0], Some(want(a)));
        assert_eq!(s.adapters[1], None, "not given");
        assert_eq!(s.adapters[2], None, "not of the adapter layout");
        assert_eq!(s.adapters[3], Some(want(b)));
        assert_eq!(
            s.last_merged,
            Some(sketch_update(&f.plan, &full, &last, &p).unwrap())
        );
        assert_eq!(s.views()[3], s.adapters[3].as_deref());
        // The honest pair's sketched cosine is close to their updates' exact one.
        let j = Job {
            plan: f.plan.clone(),
            adapter: layout.clone(),
            full: full.clone(),
        };
        let (u, v) = (dense(&j, a), dense(&j, b));
        let (uv, uu, vv) = (
            u.iter().zip(&v).map(|(x, y)| dot64(x, y)).sum::<f64>(),
            u.iter().map(|x| dot64(x, x)).sum::<f64>(),
            v.iter().map(|x| dot64(x, x)).sum::<f64>(),
        );
        let exact = uv / (uu * vv).sqrt();
        let sketched = cos32(&want(a), &want(b));
        eprintln!("honest pair: exact cosine {exact:.4}, sketched {sketched:.4}");
        assert!((sketched - exact).abs() < 0.1, "{sketched} vs {exact}");
        // A last merged update of another length is not sketched.
        let s = sketch_epoch(&f.trainer, &secret, &[Some(a)], Some(&last[1..])).unwrap();
        assert_eq!(s.last_merged, None);
        // A full-parameter job has no sketches.
        let wine = hanzod_train::trainer_of(
            &hanzod_actors::job::TrainingSpec::default(),
            hanzod_actors::types::JobId(1),
        )
        .expect("trainer");
        assert!(matches!(
            sketch_epoch(&wine, &secret, &[], None),
            Err(SketchError::Lora(LoraError::NotLoraSpec(_)))
        ));
        assert_eq!(EpochSketches::none(2).views(), vec![None, None]);
    }
}
