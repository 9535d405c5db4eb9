//! Merging an epoch's LoRA adapter deltas (DESIGN §6 "Merge" for deltas of kind
//! [`DeltaKind::Lora`]).
//!
//! A LoRA delta (PEFT; E. Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
//! ICLR 2022, eq. 3) carries, for every adapted linear module `m` with base weight
//! `W₀ [out, in]`, two factors `A [r, in]` (`base_model.model.<m>.lora_A.weight`) and
//! `B [out, r]` (`base_model.model.<m>.lora_B.weight`). The weight update they stand for is
//!
//! ```text
//! ΔW = (alpha / r) · B · A        [out, r] × [r, in] → [out, in]
//! ```
//!
//! (PEFT's `scaling = lora_alpha / r`, `LoraLayer.get_delta_weight`). Aggregation must act
//! on `ΔWᵢ`, never on the factors: the mean of products is not the product of means
//! (`mean(Bᵢ)·mean(Aᵢ) ≠ mean(Bᵢ·Aᵢ)`), and the factors are only defined up to an
//! invertible `R` (`B·A = (B·R)·(R⁻¹·A)`), so two nodes with the same update can hold very
//! different factors. [`merge_lora`] therefore computes every node's `ΔWᵢ` for one module,
//! hands the N dense updates to an [`Aggregator`] (weighted mean, coordinate median, trimmed
//! mean, …) and passes the merged `ΔW` to a sink; [`apply_lora_merge`] is the sink that adds
//! `outer_lr · ΔW` to the base [`Weights`] to form the next full checkpoint.
//!
//! Memory: modules are processed one at a time (in base-name order), so besides the inputs
//! and the caller's weights the merge holds one scratch of `N_used × max(out·in)` floats and
//! one merged `[out, in]` buffer ([`LoraPlan::scratch_floats`]); for Qwen3-0.6B (largest
//! module 3072 × 1024) that is 12.6 MB per node taking part, independent of the layer count.
//! The merged adapter is a full-rank update: the result is a full checkpoint, not an adapter.
//!
//! The factors come from any [`LoraFactors`] source: parsed HZDL deltas ([`DeltaView`], any
//! dtype, decoded per module), or adapters already decoded to f32 in the adapter's layout
//! ([`Weights`] of a LoRA [`Layout`], or a flat buffer with its layout, [`FlatAdapter`]: what
//! the validator and the sink hold). [`add_adapter_update`] streams one node's adapter the
//! same way, adding its `ΔW` to full weights and measuring `‖ΔW‖₂` and `⟨ΔW, v⟩` (the
//! quality score's norm and convergence), module by module.
//!
//! Conventions are those of [`crate::merge`]: `weights[i]` belongs to `deltas[i]`, finite and
//! `>= 0`; a weight of `0` takes no part (its `ΔWᵢ` is not even computed, though its shapes
//! are checked); no deltas, or all weights zero, is [`MergeOutcome::KeepPrevious`] and the
//! sink is never called. The same deltas and weights feed every module, so one
//! [`MergeOutcome`] describes the whole merge.

use std::borrow::Cow;
use std::error::Error as StdError;

use hanzod_protocol::hzdl::{DeltaKind, DeltaTensor, DeltaView};
use hanzod_protocol::model::ModelSpec;
use hanzod_train::{Layout, Trainer, Weights};

use crate::merge::{Aggregator, KeepReason, MergeError, MergeOutcome};

/// The prefix PEFT puts before a module path in adapter tensor names.
pub const PEFT_PREFIX: &str = "base_model.model.";
/// Suffix of the `A [r, in]` factor's tensor name (after the module path).
pub const LORA_A_SUFFIX: &str = ".lora_A.weight";
/// Suffix of the `B [out, r]` factor's tensor name (after the module path).
pub const LORA_B_SUFFIX: &str = ".lora_B.weight";

/// Why a LoRA merge (or its application to base weights) could not run. Every check on the
/// inputs happens before the first module is merged, so with the aggregators of
/// [`crate::merge`] and an infallible sink an error means nothing was handed to the sink;
/// only [`LoraError::InconsistentOutcome`], [`LoraError::NonFiniteDelta`],
/// [`LoraError::NonFiniteWeights`] and [`LoraError::Sink`] can come after some modules were.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    /// The model spec has no LoRA configuration (it is a full-parameter spec).
    #[error("model spec {0:?} is not a LoRA spec")]
    NotLoraSpec(String),
    /// A LoRA spec tensor that does not fit the PEFT naming or the spec's rank.
    #[error("LoRA spec tensor {tensor:?}: {reason}")]
    BadSpec {
        /// The tensor.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A rank of 0.
    #[error("LoRA rank must be at least 1")]
    ZeroRank,
    /// An `alpha` that is NaN, infinite, zero or negative.
    #[error("LoRA alpha {0} must be finite and positive")]
    BadAlpha(f32),
    /// A plan without modules.
    #[error("the LoRA plan has no modules")]
    NoModules,
    /// Plan modules not in strictly increasing base-name order (or a module twice).
    #[error("LoRA plan module {module:?} is out of base-name order or repeated")]
    ModuleOrder {
        /// The base tensor name of the offending module.
        module: String,
    },
    /// A size (`out·in`, `r·in`, `out·r`, or the scratch of `N × out·in`) overflows `usize`.
    #[error("{what} is too large (overflows usize)")]
    TooLarge {
        /// What overflowed (a module's base name, or `scratch`).
        what: String,
    },
    /// A delta whose header kind is not LoRA.
    #[error("delta {index} is a {found} delta; a LoRA merge needs lora")]
    WrongKind {
        /// Index of the delta.
        index: usize,
        /// Its kind.
        found: DeltaKind,
    },
    /// An adapter tensor of the plan that a delta lacks.
    #[error("delta {index}: adapter tensor {tensor:?} is missing")]
    MissingTensor {
        /// Index of the delta.
        index: usize,
        /// The tensor.
        tensor: String,
    },
    /// A tensor in a delta that is not an adapter tensor of the plan.
    #[error("delta {index}: tensor {tensor:?} is not an adapter tensor of this LoRA plan")]
    UnexpectedTensor {
        /// Index of the delta.
        index: usize,
        /// The tensor.
        tensor: String,
    },
    /// An adapter tensor whose shape is not `[r, in]` (A) or `[out, r]` (B).
    #[error("delta {index}: tensor {tensor:?} has shape {found:?}, the plan wants {expected:?}")]
    WrongShape {
        /// Index of the delta.
        index: usize,
        /// The tensor.
        tensor: String,
        /// The plan's shape.
        expected: Vec<usize>,
        /// The delta's shape.
        found: Vec<usize>,
    },
    /// A tensor whose data is not `elements × dtype size` bytes long (only a hand-built
    /// [`DeltaView`]; [`DeltaView::parse`] guarantees it).
    #[error(
        "delta {index}: tensor {tensor:?} holds {found} bytes, its shape and dtype need {expected}"
    )]
    DataLength {
        /// Index of the delta.
        index: usize,
        /// The tensor.
        tensor: String,
        /// Bytes the shape and dtype imply.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// A decoded adapter whose buffer length differs from its layout's ([`FlatAdapter`]).
    #[error("delta {index}: the adapter holds {found} values for a layout of {expected}")]
    AdapterLength {
        /// Index of the delta.
        index: usize,
        /// The layout's length.
        expected: usize,
        /// The buffer's length.
        found: usize,
    },
    /// The weights (count, values) or the aggregator refused the merge.
    #[error(transparent)]
    Merge(#[from] MergeError),
    /// The aggregator reported, for a later module, another outcome than for the first one
    /// (it is given the same weights every time; the aggregators of [`crate::merge`] never
    /// do this).
    #[error(
        "module {module:?}: the aggregator reported {found:?}, but {first:?} for the first module"
    )]
    InconsistentOutcome {
        /// The module's base tensor name.
        module: String,
        /// The outcome for the first module.
        first: MergeOutcome,
        /// The outcome for this module.
        found: MergeOutcome,
    },
    /// The merged `ΔW` of a module has a NaN or ±Inf (an f32 overflow of `s·B·A` or of the
    /// aggregation; inputs are finite after the format check).
    #[error("merged update of {tensor:?} is not finite at element {index}")]
    NonFiniteDelta {
        /// The module's base tensor name.
        tensor: String,
        /// Element index in the row-major `[out, in]` update.
        index: usize,
    },
    /// `outer_lr` (or the scale of [`add_adapter_update`]) is NaN or infinite.
    #[error("outer learning rate {0} is not finite")]
    BadLearningRate(f32),
    /// The vector [`add_adapter_update`] takes inner products with is not of the full
    /// weights' length.
    #[error("the comparison vector holds {found} values for a layout of {expected}")]
    OtherLength {
        /// The full weights' layout length.
        expected: usize,
        /// The vector's length.
        found: usize,
    },
    /// The base weights' buffer length differs from their layout's.
    #[error("base weights hold {found} values for a layout of {expected}")]
    BaseLength {
        /// The layout's length.
        expected: usize,
        /// The buffer's length.
        found: usize,
    },
    /// A module's base tensor is not in the base weights.
    #[error("base tensor {tensor:?} is not in the base weights")]
    BaseMissing {
        /// The tensor.
        tensor: String,
    },
    /// A module's base tensor does not have the adapter's `[out, in]` shape.
    #[error("base tensor {tensor:?} has shape {found:?}, the adapter wants {expected:?}")]
    BaseShape {
        /// The tensor.
        tensor: String,
        /// `[out, in]` from the plan.
        expected: Vec<usize>,
        /// The base weights' shape.
        found: Vec<usize>,
    },
    /// A base weight became NaN or ±Inf after `w + outer_lr·ΔW` (f32 overflow). The modules
    /// before this one, and this one, have been updated.
    #[error("updated weight {tensor:?}[{index}] is not finite")]
    NonFiniteWeights {
        /// The tensor.
        tensor: String,
        /// Element index (row-major).
        index: usize,
    },
    /// The caller's sink refused a module's merged update; the modules before it were
    /// handed over.
    #[error("sink refused the merged update of {module:?}: {source}")]
    Sink {
        /// The module's base tensor name.
        module: String,
        /// The sink's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

/// One LoRA-adapted linear module: its base weight and its two adapter tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    /// The base weight's name in the full model (Hugging Face naming, e.g.
    /// `model.layers.0.self_attn.q_proj.weight`), shape `[out_features, in_features]`.
    pub base: String,
    /// The `A` factor's tensor name (`base_model.model.<module>.lora_A.weight`), shape
    /// `[r, in_features]`.
    pub lora_a: String,
    /// The `B` factor's tensor name (`base_model.model.<module>.lora_B.weight`), shape
    /// `[out_features, r]`.
    pub lora_b: String,
    /// Output features (rows of the base weight).
    pub out_features: usize,
    /// Input features (columns of the base weight).
    pub in_features: usize,
}

impl LoraModule {
    /// Elements of the base weight and of `ΔW`: `out · in` (saturating; [`LoraPlan`]
    /// checks it does not overflow).
    pub fn weight_len(&self) -> usize {
        self.out_features.saturating_mul(self.in_features)
    }
}

/// The adapted modules of a LoRA spec ([`ModelSpec::lora_spec`]), sorted by base tensor
/// name: for every `base_model.model.<m>.lora_A.weight [r, in]` with its
/// `base_model.model.<m>.lora_B.weight [out, r]`, the module with base `<m>.weight`,
/// `out`, `in`. Fails with [`LoraError::NotLoraSpec`] for a full-parameter spec and
/// [`LoraError::BadSpec`] for a tensor outside that naming, a factor without its partner,
/// or a shape that is not 2-D with the config's rank.
pub fn lora_modules(spec: &ModelSpec) -> Result<Vec<LoraModule>, LoraError> {
    let cfg = spec
        .lora
        .as_ref()
        .ok_or_else(|| LoraError::NotLoraSpec(spec.name.clone()))?;
    let rank = cfg.rank;
    if rank == 0 {
        return Err(LoraError::ZeroRank);
    }
    let bad = |tensor: &str, reason: String| LoraError::BadSpec {
        tensor: tensor.to_string(),
        reason,
    };
    let mut modules = Vec::new();
    for (name, shape) in &spec.params {
        let rest = name.strip_prefix(PEFT_PREFIX).ok_or_else(|| {
            bad(
                name,
                format!("not a PEFT adapter name ({PEFT_PREFIX}<module>{LORA_A_SUFFIX})"),
            )
        })?;
        if let Some(module) = rest.strip_suffix(LORA_A_SUFFIX) {
            let &[r, in_features] = shape.as_slice() else {
                return Err(bad(
                    name,
                    format!("lora_A has shape {shape:?}, want [r, in]"),
                ));
            };
            if r != rank {
                return Err(bad(
                    name,
                    format!("lora_A has rank {r}, the config says {rank}"),
                ));
            }
            let lora_b = format!("{PEFT_PREFIX}{module}{LORA_B_SUFFIX}");
            let b_shape = spec
                .params
                .get(&lora_b)
                .ok_or_else(|| bad(&lora_b, "missing: lora_A without lora_B".into()))?;
            let &[out_features, rb] = b_shape.as_slice() else {
                return Err(bad(
                    &lora_b,
                    format!("lora_B has shape {b_shape:?}, want [out, r]"),
                ));
            };
            if rb != rank {
                return Err(bad(
                    &lora_b,
                    format!("lora_B has rank {rb}, the config says {rank}"),
                ));
            }
            modules.push(LoraModule {
                base: format!("{module}.weight"),
                lora_a: name.clone(),
                lora_b,
                out_features,
                in_features,
            });
        } else if let Some(module) = rest.strip_suffix(LORA_B_SUFFIX) {
            // Shapes are checked with the A factor; here only the pairing.
            if !spec
                .params
                .contains_key(&format!("{PEFT_PREFIX}{module}{LORA_A_SUFFIX}"))
            {
                return Err(bad(name, "lora_B without lora_A".into()));
            }
        } else {
            return Err(bad(name, "neither a lora_A nor a lora_B weight".into()));
        }
    }
    modules.sort_by(|a, b| a.base.cmp(&b.base));
    Ok(modules)
}

/// What a LoRA merge runs on: the adapted modules, the rank `r` and PEFT's `lora_alpha`.
/// Checked at every merge ([`LoraError::ZeroRank`], [`LoraError::BadAlpha`],
/// [`LoraError::NoModules`], [`LoraError::ModuleOrder`], [`LoraError::TooLarge`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPlan {
    /// The modules, in strictly increasing base-name order (the order [`merge_lora`] goes
    /// in and [`lora_modules`] returns).
    pub modules: Vec<LoraModule>,
    /// The adapter rank `r` (every delta's `A` is `[r, in]`, `B` is `[out, r]`).
    pub rank: usize,
    /// PEFT's `lora_alpha`: `ΔW = (alpha / r)·B·A`. For an rsLoRA adapter (scaling
    /// `alpha / √r`) pass `alpha·√r`.
    pub alpha: f32,
}

impl LoraPlan {
    /// The plan of a LoRA spec ([`ModelSpec::lora_spec`]): its [`lora_modules`], the
    /// config's rank, and `alpha` (the job's `lora_alpha`, which the spec does not carry).
    pub fn from_spec(spec: &ModelSpec, alpha: f32) -> Result<LoraPlan, LoraError> {
        let modules = lora_modules(spec)?;
        let rank = spec.lora.as_ref().map_or(0, |c| c.rank);
        let plan = LoraPlan {
            modules,
            rank,
            alpha,
        };
        plan.check()?;
        Ok(plan)
    }

    /// The plan of a trainer's LoRA adapter ([`Trainer::lora`]): [`LoraPlan::from_spec`] of
    /// the adapter layout's spec with the job's `lora_alpha` rounded to f32 (so
    /// [`LoraPlan::scaling`] is the trainer's `alpha / r` up to that rounding: exact for
    /// alphas representable in f32, such as every integer up to 2²⁴). `Ok(None)` for a
    /// full-parameter trainer; errors as [`LoraPlan::from_spec`] (a trainer whose adapter
    /// layout does not follow the PEFT naming).
    pub fn of_trainer(trainer: &Trainer) -> Result<Option<LoraPlan>, LoraError> {
        let Some(lora) = trainer.lora() else {
            return Ok(None);
        };
        LoraPlan::from_spec(&lora.layout().spec(), lora.alpha() as f32).map(Some)
    }

    /// PEFT's `scaling = lora_alpha / r`, computed in f64 and rounded once to f32.
    pub fn scaling(&self) -> f32 {
        (f64::from(self.alpha) / self.rank as f64) as f32
    }

    /// Adapter parameters per delta, `Σ r·(in + out)` over the modules (saturating).
    pub fn adapter_params(&self) -> u64 {
        self.modules
            .iter()
            .map(|m| {
                (self.rank as u64)
                    .saturating_mul((m.in_features as u64).saturating_add(m.out_features as u64))
            })
            .fold(0, u64::saturating_add)
    }

    /// Floats [`merge_lora`] allocates for `nodes` deltas of non-zero weight:
    /// `(nodes + 1) × max(out·in)` (the per-node `ΔWᵢ` scratch and the merged buffer),
    /// `None` on overflow. The decoded `A`, `B` of one node (`r·(in + out)`) come on top.
    pub fn scratch_floats(&self, nodes: usize) -> Option<usize> {
        let max = self.modules.iter().map(LoraModule::weight_len).max()?;
        nodes.checked_add(1)?.checked_mul(max)
    }

    /// Checks the plan; returns the largest module's `out·in`.
    fn check(&self) -> Result<usize, LoraError> {
        if self.rank == 0 {
            return Err(LoraError::ZeroRank);
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(LoraError::BadAlpha(self.alpha));
        }
        if self.modules.is_empty() {
            return Err(LoraError::NoModules);
        }
        let mut max = 0;
        for (i, m) in self.modules.iter().enumerate() {
            if i > 0 && self.modules[i - 1].base >= m.base {
                return Err(LoraError::ModuleOrder {
                    module: m.base.clone(),
                });
            }
            let len = m
                .out_features
                .checked_mul(m.in_features)
                .filter(|_| m.in_features.checked_mul(self.rank).is_some())
                .filter(|_| m.out_features.checked_mul(self.rank).is_some())
                .ok_or_else(|| LoraError::TooLarge {
                    what: m.base.clone(),
                })?;
            max = max.max(len);
        }
        Ok(max)
    }
}

/// A source of one node's LoRA factors for [`merge_lora`] and [`add_adapter_update`]: a
/// parsed HZDL delta ([`DeltaView`], any dtype), or an adapter already decoded to f32 in
/// its LoRA layout ([`Weights`], [`FlatAdapter`]).
pub trait LoraFactors {
    /// Checks this adapter against `plan` before any work: kind LoRA
    /// ([`LoraError::WrongKind`]), every adapter tensor of the plan present
    /// ([`LoraError::MissingTensor`]) with shape `A [r, in]`, `B [out, r]`
    /// ([`LoraError::WrongShape`]) and the data its shape needs ([`LoraError::DataLength`],
    /// [`LoraError::AdapterLength`]), no other tensor ([`LoraError::UnexpectedTensor`]).
    /// `index` names the adapter in errors.
    fn check_factors(&self, plan: &LoraPlan, index: usize) -> Result<(), LoraError>;

    /// The tensor `name` (an adapter tensor of a plan [`LoraFactors::check_factors`]
    /// accepted) as row-major f32 values: borrowed when already decoded, converted from the
    /// delta's dtype otherwise. [`LoraError::MissingTensor`] when absent.
    fn factor(&self, index: usize, name: &str) -> Result<Cow<'_, [f32]>, LoraError>;
}

impl<T: LoraFactors + ?Sized> LoraFactors for &T {
    fn check_factors(&self, plan: &LoraPlan, index: usize) -> Result<(), LoraError> {
        (**self).check_factors(plan, index)
    }

    fn factor(&self, index: usize, name: &str) -> Result<Cow<'_, [f32]>, LoraError> {
        (**self).factor(index, name)
    }
}

/// The adapter tensors of `plan` with the shapes it wants: `(A, [r, in])`, `(B, [out, r])`
/// per module, in module order.
fn plan_tensors(plan: &LoraPlan) -> impl Iterator<Item = (&String, [usize; 2])> {
    let r = plan.rank;
    plan.modules.iter().flat_map(move |m| {
        [
            (&m.lora_a, [r, m.in_features]),
            (&m.lora_b, [m.out_features, r]),
        ]
    })
}

/// [`LoraError::WrongShape`] unless `found == expected`.
fn check_shape(
    index: usize,
    name: &str,
    expected: [usize; 2],
    found: &[usize],
) -> Result<(), LoraError> {
    if found == expected {
        return Ok(());
    }
    Err(LoraError::WrongShape {
        index,
        tensor: name.to_string(),
        expected: expected.to_vec(),
        found: found.to_vec(),
    })
}

/// The first of `names` that is not an adapter tensor of `plan`, as
/// [`LoraError::UnexpectedTensor`] (called when the count says one is extra).
fn unexpected<'n>(
    plan: &LoraPlan,
    index: usize,
    mut names: impl Iterator<Item = &'n str>,
) -> Result<(), LoraError> {
    let known: std::collections::BTreeSet<&str> =
        plan_tensors(plan).map(|(n, _)| n.as_str()).collect();
    match names.find(|n| !known.contains(n)) {
        Some(t) => Err(LoraError::UnexpectedTensor {
            index,
            tensor: t.to_string(),
        }),
        None => Ok(()),
    }
}

impl LoraFactors for DeltaView<'_> {
    /// Kind, names, shapes and data lengths of the parsed delta (values are not read: a
    /// delta format-checked against the job's LoRA spec is finite).
    fn check_factors(&self, plan: &LoraPlan, index: usize) -> Result<(), LoraError> {
        if self.header.kind != DeltaKind::Lora {
            return Err(LoraError::WrongKind {
                index,
                found: self.header.kind,
            });
        }
        let size = self.header.dtype.size() as u64;
        for (name, expected) in plan_tensors(plan) {
            let t = adapter(self, index, name)?;
            check_shape(index, name, expected, &t.shape)?;
            // Fits: the plan check bounded r·in and out·r by usize.
            let want = ((expected[0] * expected[1]) as u64).saturating_mul(size);
            if t.data.len() as u64 != want {
                return Err(LoraError::DataLength {
                    index,
                    tensor: name.clone(),
                    expected: want,
                    found: t.data.len() as u64,
                });
            }
        }
        if self.tensors.len() != 2 * plan.modules.len() {
            // Every plan tensor is present (checked above) and names are unique, so one is
            // extra.
            unexpected(plan, index, self.tensors.iter().map(|t| t.name.as_str()))?;
        }
        Ok(())
    }

    fn factor(&self, index: usize, name: &str) -> Result<Cow<'_, [f32]>, LoraError> {
        Ok(Cow::Owned(self.to_f32(adapter(self, index, name)?)))
    }
}

/// `tensor` of a parsed delta.
fn adapter<'v, 'a>(
    view: &'v DeltaView<'a>,
    index: usize,
    name: &str,
) -> Result<&'v DeltaTensor<'a>, LoraError> {
    view.tensor(name).ok_or_else(|| LoraError::MissingTensor {
        index,
        tensor: name.to_string(),
    })
}

/// An adapter decoded to f32: `data` laid out by `layout` (an adapter layout: PEFT names,
/// [`Layout::delta_kind`] LoRA, e.g. [`Trainer::delta_layout`] of a LoRA job), as the
/// validator's verdicts carry it. The factors are borrowed, never copied.
#[derive(Debug, Clone, Copy)]
pub struct FlatAdapter<'a> {
    /// The adapter's layout.
    pub layout: &'a Layout,
    /// Its values, `layout.len()` of them, in layout order.
    pub data: &'a [f32],
}

impl<'a> FlatAdapter<'a> {
    /// `data` laid out by `layout` (checked by [`LoraFactors::check_factors`]).
    pub fn new(layout: &'a Layout, data: &'a [f32]) -> FlatAdapter<'a> {
        FlatAdapter { layout, data }
    }

    /// The values of tensor `name`, borrowed for the buffer's lifetime.
    fn tensor(&self, index: usize, name: &str) -> Result<&'a [f32], LoraError> {
        let e = self
            .layout
            .entry(name)
            .ok_or_else(|| LoraError::MissingTensor {
                index,
                tensor: name.to_string(),
            })?;
        self.data
            .get(e.offset..e.offset + e.len)
            .ok_or(LoraError::AdapterLength {
                index,
                expected: self.layout.len(),
                found: self.data.len(),
            })
    }
}

impl LoraFactors for FlatAdapter<'_> {
    /// The layout's kind (LoRA), names and shapes, and the buffer's length.
    fn check_factors(&self, plan: &LoraPlan, index: usize) -> Result<(), LoraError> {
        if self.layout.delta_kind() != DeltaKind::Lora {
            return Err(LoraError::WrongKind {
                index,
                found: self.layout.delta_kind(),
            });
        }
        if self.data.len() != self.layout.len() {
            return Err(LoraError::AdapterLength {
                index,
                expected: self.layout.len(),
                found: self.data.len(),
            });
        }
        for (name, expected) in plan_tensors(plan) {
            let e = self
                .layout
                .entry(name)
                .ok_or_else(|| LoraError::MissingTensor {
                    index,
                    tensor: name.clone(),
                })?;
            check_shape(index, name, expected, &e.shape)?;
        }
        let entries = self.layout.entries();
        if entries.len() != 2 * plan.modules.len() {
            unexpected(plan, index, entries.iter().map(|e| e.name.as_str()))?;
        }
        Ok(())
    }

    fn factor(&self, index: usize, name: &str) -> Result<Cow<'_, [f32]>, LoraError> {
        self.tensor(index, name).map(Cow::Borrowed)
    }
}

impl LoraFactors for Weights {
    /// As [`FlatAdapter`] over the weights' layout and values.
    fn check_factors(&self, plan: &LoraPlan, index: usize) -> Result<(), LoraError> {
        FlatAdapter::new(&self.layout, &self.data).check_factors(plan, index)
    }

    fn factor(&self, index: usize, name: &str) -> Result<Cow<'_, [f32]>, LoraError> {
        FlatAdapter::new(&self.layout, &self.data)
            .tensor(index, name)
            .map(Cow::Borrowed)
    }
}

/// `dw = s·B·A` for `b` `[out, r]`, `a` `[r, in]`, `dw` `[out, in]`, all row-major f32
/// (Hu et al. 2022, eq. 3; PEFT `get_delta_weight`).
///
/// For each output row `o` the row of `dw` (`in` floats, in L1) is built from the `r` rows
/// of `A` (`r·in` floats, in L2) as
/// `dw[o,:] = Σₖ cₖ·A[k,:]` with `cₖ = s·B[o,k]` rounded to f32, accumulated in f32 over
/// `k` in groups of four: `dw[o,j] ← dw[o,j] + (((c₀a₀ⱼ + c₁a₁ⱼ) + c₂a₂ⱼ) + c₃a₃ⱼ)` (the first
/// group assigns), then single terms for the last `r mod 4`. Every element thus carries
/// about `r` f32 roundings (relative error ≲ `(r + 2)·2⁻²⁴` of `Σₖ|s·B[o,k]·A[k,j]|`);
/// PEFT scales after the product, `(B·A)·s`, which differs by the same order. No fused
/// multiply-add, so the AVX2 and the portable paths give identical bits.
fn lora_product(b: &[f32], a: &[f32], r: usize, in_f: usize, s: f32, dw: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { lora_product_avx2(b, a, r, in_f, s, dw) };
        return;
    }
    lora_product_portable(b, a, r, in_f, s, dw);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lora_product_avx2(b: &[f32], a: &[f32], r: usize, in_f: usize, s: f32, dw: &mut [f32]) {
    lora_product_portable(b, a, r, in_f, s, dw);
}

#[inline(always)]
fn lora_product_portable(b: &[f32], a: &[f32], r: usize, in_f: usize, s: f32, dw: &mut [f32]) {
    if in_f == 0 || r == 0 {
        return;
    }
    let arow = |k: usize| &a[k * in_f..(k + 1) * in_f];
    for (row, bo) in dw.chunks_exact_mut(in_f).zip(b.chunks_exact(r)) {
        let c = |k: usize| s * bo[k];
        let mut k = 0;
        if r >= 4 {
            let (c0, c1, c2, c3) = (c(0), c(1), c(2), c(3));
            let (a0, a1, a2, a3) = (arow(0), arow(1), arow(2), arow(3));
            for ((((x, &p), &q), &u), &v) in row.iter_mut().zip(a0).zip(a1).zip(a2).zip(a3) {
                *x = c0 * p + c1 * q + c2 * u + c3 * v;
            }
            k = 4;
        } else {
            let c0 = c(0);
            for (x, &p) in row.iter_mut().zip(arow(0)) {
                *x = c0 * p;
            }
            k += 1;
        }
        while k + 4 <= r {
            let (c0, c1, c2, c3) = (c(k), c(k + 1), c(k + 2), c(k + 3));
            let (a0, a1, a2, a3) = (arow(k), arow(k + 1), arow(k + 2), arow(k + 3));
            for ((((x, &p), &q), &u), &v) in row.iter_mut().zip(a0).zip(a1).zip(a2).zip(a3) {
                *x += c0 * p + c1 * q + c2 * u + c3 * v;
            }
            k += 4;
        }
        while k < r {
            let c0 = c(k);
            for (x, &p) in row.iter_mut().zip(arow(k)) {
                *x += c0 * p;
            }
            k += 1;
        }
    }
}

/// Merges N LoRA deltas module by module (Hu et al. 2022; DESIGN §6 "Merge").
///
/// `deltas` are the nodes' adapters ([`LoraFactors`]: parsed LoRA deltas, each already
/// format-checked against the job's LoRA spec, or adapters decoded in the job's adapter
/// layout; kind, names, shapes and data lengths are checked again here, cheaply, before
/// any work), `weights[i]` (finite, `>= 0`) belongs to `deltas[i]`. For each module of
/// `plan` in base-name order, every node with a non-zero weight gets
/// `ΔWᵢ = (alpha / r)·Bᵢ·Aᵢ` `[out, in]` (f32, see the product's rounding in the module
/// docs) in a scratch reused across modules; `aggregator` merges the `ΔWᵢ` with their
/// weights into one `[out, in]` buffer, which is checked finite and handed to
/// `sink(module, ΔW)`. Factors of a parsed delta are decoded to f32 from its dtype
/// ([`DeltaView::to_f32`]); decoded ones are borrowed.
///
/// Returns the one outcome of the merge: [`MergeOutcome::Merged`] with the aggregator's
/// name and the number of deltas that took part (it is the same for every module), or
/// [`MergeOutcome::KeepPrevious`] (no deltas, or every weight zero) without calling the
/// sink. Errors: the plan's ([`LoraPlan`]), the deltas' ([`LoraFactors::check_factors`]:
/// [`LoraError::WrongKind`], [`LoraError::MissingTensor`], [`LoraError::UnexpectedTensor`],
/// [`LoraError::WrongShape`], [`LoraError::DataLength`], [`LoraError::AdapterLength`]), the
/// weights' and the aggregator's ([`LoraError::Merge`], e.g. [`MergeError::WeightCount`])
/// all come before the sink's first call; a sink error stops the merge
/// ([`LoraError::Sink`]).
///
/// Peak memory beyond the inputs: [`LoraPlan::scratch_floats`]`(N_used)` floats plus one
/// node's decoded factors (none for decoded adapters).
pub fn merge_lora<D, F, E>(
    plan: &LoraPlan,
    deltas: &[D],
    weights: &[f32],
    aggregator: &dyn Aggregator,
    mut sink: F,
) -> Result<MergeOutcome, LoraError>
where
    D: LoraFactors,
    F: FnMut(&LoraModule, &[f32]) -> Result<(), E>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    let max_len = plan.check()?;
    if deltas.len() != weights.len() {
        return Err(MergeError::WeightCount {
            deltas: deltas.len(),
            weights: weights.len(),
        }
        .into());
    }
    for (index, delta) in deltas.iter().enumerate() {
        delta.check_factors(plan, index)?;
    }
    let mut used = Vec::with_capacity(weights.len());
    for (index, &weight) in weights.iter().enumerate() {
        if !weight.is_finite() || weight < 0.0 {
            return Err(MergeError::BadWeight { index, weight }.into());
        }
        if weight > 0.0 {
            used.push(index);
        }
    }
    if deltas.is_empty() {
        return Ok(MergeOutcome::KeepPrevious {
            reason: KeepReason::NoDeltas,
        });
    }
    if used.is_empty() {
        return Ok(MergeOutcome::KeepPrevious {
            reason: KeepReason::AllWeightsZero,
        });
    }

    let n = used.len();
    let scratch_len = n.checked_mul(max_len).ok_or_else(|| LoraError::TooLarge {
        what: "scratch".into(),
    })?;
    let mut scratch = vec![0.0f32; scratch_len];
    let mut merged = vec![0.0f32; max_len];
    let used_weights: Vec<f32> = used.iter().map(|&i| weights[i]).collect();
    let s = plan.scaling();
    let mut first: Option<MergeOutcome> = None;
    for m in &plan.modules {
        let len = m.weight_len();
        for (row, &i) in used.iter().enumerate() {
            let delta = &deltas[i];
            let a = delta.factor(i, &m.lora_a)?;
            let b = delta.factor(i, &m.lora_b)?;
            let dw = &mut scratch[row * len..(row + 1) * len];
            lora_product(&b, &a, plan.rank, m.in_features, s, dw);
        }
        let rows: Vec<&[f32]> = (0..n).map(|t| &scratch[t * len..(t + 1) * len]).collect();
        let out = &mut merged[..len];
        let outcome = aggregator.merge(&rows, &used_weights, out)?;
        match first {
            None => {
                if let MergeOutcome::KeepPrevious { .. } = outcome {
                    return Ok(outcome);
                }
                first = Some(outcome);
            }
            Some(f) if f != outcome => {
                return Err(LoraError::InconsistentOutcome {
                    module: m.base.clone(),
                    first: f,
                    found: outcome,
                })
            }
            Some(_) => {}
        }
        check_finite_update(m, out)?;
        sink(m, out).map_err(|e| LoraError::Sink {
            module: m.base.clone(),
            source: e.into(),
        })?;
    }
    first.ok_or(LoraError::NoModules)
}

/// [`LoraError::NonFiniteDelta`] at the first NaN or ±Inf of a module's update.
fn check_finite_update(m: &LoraModule, dw: &[f32]) -> Result<(), LoraError> {
    match dw.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(LoraError::NonFiniteDelta {
            tensor: m.base.clone(),
            index,
        }),
        None => Ok(()),
    }
}

/// Checks that `base` can take every module of `plan`: its buffer fits its layout
/// ([`LoraError::BaseLength`]) and each module's base tensor is there
/// ([`LoraError::BaseMissing`]) with shape `[out, in]` ([`LoraError::BaseShape`]).
fn check_base(base: &Weights, plan: &LoraPlan) -> Result<(), LoraError> {
    if base.data.len() != base.layout.len() {
        return Err(LoraError::BaseLength {
            expected: base.layout.len(),
            found: base.data.len(),
        });
    }
    for m in &plan.modules {
        let e = base
            .layout
            .entry(&m.base)
            .ok_or_else(|| LoraError::BaseMissing {
                tensor: m.base.clone(),
            })?;
        if e.shape != [m.out_features, m.in_features] {
            return Err(LoraError::BaseShape {
                tensor: m.base.clone(),
                expected: vec![m.out_features, m.in_features],
                found: e.shape.clone(),
            });
        }
    }
    Ok(())
}

/// `w ← w + scale·ΔW` on module `m`'s base tensor of `base` (element-wise in f32, no fused
/// multiply-add, as [`Weights::add_scaled`]); [`LoraError::NonFiniteWeights`] when a
/// weight overflows (the tensor is left updated).
fn add_to_base(
    base: &mut Weights,
    m: &LoraModule,
    dw: &[f32],
    scale: f32,
) -> Result<(), LoraError> {
    let w = base
        .tensor_mut(&m.base)
        .ok_or_else(|| LoraError::BaseMissing {
            tensor: m.base.clone(),
        })?;
    for (w, &d) in w.iter_mut().zip(dw) {
        *w += scale * d;
    }
    match w.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(LoraError::NonFiniteWeights {
            tensor: m.base.clone(),
            index,
        }),
        None => Ok(()),
    }
}

/// The outer step for a LoRA epoch: merges `deltas` with [`merge_lora`] and adds
/// `outer_lr · ΔW` to each adapted module's base tensor in `base`
/// (`w ← w + outer_lr·ΔW[j]`, element-wise in f32, no fused multiply-add, as
/// [`Weights::add_scaled`]); every other tensor is left untouched, bit for bit. The result
/// is the next full checkpoint.
///
/// Before anything is merged: `outer_lr` must be finite ([`LoraError::BadLearningRate`]),
/// `base` consistent with its layout ([`LoraError::BaseLength`]) and every module's base
/// tensor present with shape `[out, in]` ([`LoraError::BaseMissing`],
/// [`LoraError::BaseShape`]); then the checks of [`merge_lora`]. On
/// [`MergeOutcome::KeepPrevious`] and on those errors `base` is unchanged. A value that
/// overflows to ±Inf ([`LoraError::NonFiniteDelta`], [`LoraError::NonFiniteWeights`])
/// stops the merge with the modules before it already updated (as `add_scaled` leaves
/// the weights updated): the caller keeps the previous checkpoint.
pub fn apply_lora_merge<D: LoraFactors>(
    base: &mut Weights,
    plan: &LoraPlan,
    deltas: &[D],
    weights: &[f32],
    aggregator: &dyn Aggregator,
    outer_lr: f32,
) -> Result<MergeOutcome, LoraError> {
    apply_merge(base, plan, deltas, weights, aggregator, outer_lr, None)
}

/// [`apply_lora_merge`] that also writes the merged update `ΔW` (before the `outer_lr`
/// scaling) into `update`, a buffer in `base`'s (full) layout: each adapted module's slot
/// gets its merged `ΔW`, every other value is left as it is (pass zeros to get the full
/// update, the zero elsewhere of a LoRA merge). What the next epoch's convergence score
/// compares with. [`LoraError::OtherLength`] when `update` is not of the layout's length
/// (checked first; `base` and `update` are then unchanged). On
/// [`MergeOutcome::KeepPrevious`] `update` is unchanged; on an error after the merge began
/// the slots of the modules handed over are written.
pub fn apply_lora_merge_with_update<D: LoraFactors>(
    base: &mut Weights,
    plan: &LoraPlan,
    deltas: &[D],
    weights: &[f32],
    aggregator: &dyn Aggregator,
    outer_lr: f32,
    update: &mut [f32],
) -> Result<MergeOutcome, LoraError> {
    if update.len() != base.layout.len() {
        return Err(LoraError::OtherLength {
            expected: base.layout.len(),
            found: update.len(),
        });
    }
    apply_merge(
        base,
        plan,
        deltas,
        weights,
        aggregator,
        outer_lr,
        Some(update),
    )
}

fn apply_merge<D: LoraFactors>(
    base: &mut Weights,
    plan: &LoraPlan,
    deltas: &[D],
    weights: &[f32],
    aggregator: &dyn Aggregator,
    outer_lr: f32,
    mut update: Option<&mut [f32]>,
) -> Result<MergeOutcome, LoraError> {
    if !outer_lr.is_finite() {
        return Err(LoraError::BadLearningRate(outer_lr));
    }
    check_base(base, plan)?;
    let layout = base.layout.clone();
    let r = merge_lora(plan, deltas, weights, aggregator, |m, dw| {
        if let (Some(u), Some(e)) = (update.as_deref_mut(), layout.entry(&m.base)) {
            u[e.offset..e.offset + e.len].copy_from_slice(dw);
        }
        add_to_base(base, m, dw, outer_lr)
    });
    // The sink's own errors are `LoraError`s: return them as they are, not wrapped.
    r.map_err(unwrap_sink)
}

/// A [`LoraError::Sink`] whose source is itself a [`LoraError`], as that error.
fn unwrap_sink(e: LoraError) -> LoraError {
    match e {
        LoraError::Sink { module, source } => match source.downcast::<LoraError>() {
            Ok(inner) => *inner,
            Err(source) => LoraError::Sink { module, source },
        },
        other => other,
    }
}

/// Streams one adapter's effective updates, module by module in base-name order:
/// `sink(module, ΔW)` with `ΔW = (alpha / r)·B·A` `[out, in]` (Hu et al. 2022, eq. 3; the
/// kernel and rounding of [`merge_lora`]) in one scratch of the largest module's `out·in`
/// floats, reused. The adapter is checked first ([`LoraFactors::check_factors`], index 0),
/// and every `ΔW` is checked finite before the sink sees it ([`LoraError::NonFiniteDelta`]);
/// a sink error stops the stream ([`LoraError::Sink`]).
pub fn for_each_update<D, F, E>(plan: &LoraPlan, adapter: &D, mut sink: F) -> Result<(), LoraError>
where
    D: LoraFactors + ?Sized,
    F: FnMut(&LoraModule, &[f32]) -> Result<(), E>,
    E: Into<Box<dyn StdError + Send + Sync>>,
{
    let max_len = plan.check()?;
    adapter.check_factors(plan, 0)?;
    let mut scratch = vec![0.0f32; max_len];
    let s = plan.scaling();
    for m in &plan.modules {
        let a = adapter.factor(0, &m.lora_a)?;
        let b = adapter.factor(0, &m.lora_b)?;
        let dw = &mut scratch[..m.weight_len()];
        lora_product(&b, &a, plan.rank, m.in_features, s, dw);
        check_finite_update(m, dw)?;
        sink(m, dw).map_err(|e| LoraError::Sink {
            module: m.base.clone(),
            source: e.into(),
        })?;
    }
    Ok(())
}

/// What [`add_adapter_update`] measured of one adapter's update `ΔW` (every adapted
/// module's `ΔW`, flattened; zero on the tensors it does not adapt).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateStats {
    /// `‖ΔW‖₂` over every adapted module, accumulated in f64 from the f32 `ΔW` (the norm
    /// of the full-model update the adapter stands for; the factors' norms say nothing:
    /// `B·A = (B·R)·(R⁻¹·A)`).
    pub norm: f64,
    /// `⟨ΔW, other⟩` (f64 accumulation) over the adapted modules' slots of the full-layout
    /// vector `other`, when one was given; the slots of unadapted tensors add nothing, as
    /// `ΔW` is zero there.
    pub dot: Option<f64>,
}

/// Adds one adapter's update to full weights and measures it (the validator's view of a
/// LoRA delta, DESIGN §6): for every module of `plan`, `w ← w + scale·ΔW` on its base
/// tensor of `target` (element-wise in f32 as [`Weights::add_scaled`]; `scale = 1` gives
/// `base + ΔW`), every other tensor untouched; returns `‖ΔW‖₂` and, given `other` (a
/// vector in `target`'s full layout, e.g. the last merged update), `⟨ΔW, other⟩`. Streams
/// with [`for_each_update`]: one `[out, in]` scratch, nothing model-sized.
///
/// Checked before anything is written: `scale` finite ([`LoraError::BadLearningRate`]),
/// `target` able to take every module ([`LoraError::BaseLength`],
/// [`LoraError::BaseMissing`], [`LoraError::BaseShape`]), `other` of the layout's length
/// ([`LoraError::OtherLength`]), the plan and the adapter ([`for_each_update`]). A value
/// that overflows ([`LoraError::NonFiniteDelta`], [`LoraError::NonFiniteWeights`]) stops
/// with the modules before it updated.
pub fn add_adapter_update<D: LoraFactors + ?Sized>(
    target: &mut Weights,
    plan: &LoraPlan,
    adapter: &D,
    scale: f32,
    other: Option<&[f32]>,
) -> Result<UpdateStats, LoraError> {
    if !scale.is_finite() {
        return Err(LoraError::BadLearningRate(scale));
    }
    check_base(target, plan)?;
    if let Some(o) = other.filter(|o| o.len() != target.layout.len()) {
        return Err(LoraError::OtherLength {
            expected: target.layout.len(),
            found: o.len(),
        });
    }
    let layout = target.layout.clone();
    let (mut norm_sq, mut dot) = (0.0f64, 0.0f64);
    for_each_update(plan, adapter, |m, dw| {
        norm_sq += dw.iter().map(|&d| f64::from(d) * f64::from(d)).sum::<f64>();
        if let (Some(o), Some(e)) = (other, layout.entry(&m.base)) {
            let slot = &o[e.offset..e.offset + e.len];
            dot += dw
                .iter()
                .zip(slot)
                .map(|(&d, &v)| f64::from(d) * f64::from(v))
                .sum::<f64>();
        }
        add_to_base(target, m, dw, scale)
    })
    .map_err(unwrap_sink)?;
    Ok(UpdateStats {
        norm: norm_sq.sqrt(),
        dot: other.map(|_| dot),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::{CoordinateMedian, TrimmedMean, WeightedMean};
    use hanzod_protocol::hzdl::{write_delta, DeltaDtype};
    use hanzod_train::Layout;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BTreeMap;
    use std::convert::Infallible;
    use std::sync::Arc;

    /// A Qwen3-architecture model small enough for exhaustive checks: hidden 8, 2 layers,
    /// 2 heads of 4 (1 KV head), intermediate 12: q/o `[8,8]`, k/v `[4,8]`, gate/up
    /// `[12,8]`, down `[8,12]`.
    const TINY: &str = r#"{"model_type":"qwen3","hidden_size":8,"num_hidden_layers":2,
        "num_attention_heads":2,"num_key_value_heads":1,"head_dim":4,
        "intermediate_size":12,"vocab_size":10,"tie_word_embeddings":true}"#;

    /// The published Qwen/Qwen3-0.6B `config.json` fields the spec reads.
    const QWEN3_0_6B: &str = include_str!("../../../tests/data/qwen3-0.6b/config.json");

    fn tiny_base() -> ModelSpec {
        ModelSpec::from_hf_config(TINY).unwrap()
    }

    fn tiny_plan(rank: usize, targets: &[&str], alpha: f32) -> LoraPlan {
        LoraPlan::from_spec(&tiny_base().lora_spec(rank, targets).unwrap(), alpha).unwrap()
    }

    /// Owned adapter tensors of one node: name → (shape, values).
    type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

    fn random_adapter(plan: &LoraPlan, rng: &mut ChaCha8Rng) -> Tensors {
        let r = plan.rank;
        let mut t = Tensors::new();
        for m in &plan.modules {
            let a = (0..r * m.in_features)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let b = (0..m.out_features * r)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            t.insert(m.lora_a.clone(), (vec![r, m.in_features], a));
            t.insert(m.lora_b.clone(), (vec![m.out_features, r], b));
        }
        t
    }

    fn encode(kind: DeltaKind, dtype: DeltaDtype, t: &Tensors) -> Vec<u8> {
        let parts: Vec<(&str, &[usize], &[f32])> = t
            .iter()
            .map(|(n, (s, v))| (n.as_str(), s.as_slice(), v.as_slice()))
            .collect();
        write_delta(kind, 0, dtype, &parts).unwrap()
    }

    fn parse_all(bytes: &[Vec<u8>]) -> Vec<DeltaView<'_>> {
        bytes.iter().map(|b| DeltaView::parse(b).unwrap()).collect()
    }

    /// What a sink received: (base tensor name, merged ΔW), in call order.
    type Received = Vec<(String, Vec<f32>)>;

    /// Runs `merge_lora` and collects what the sink received, in call order.
    fn collect<D: LoraFactors>(
        plan: &LoraPlan,
        views: &[D],
        w: &[f32],
        agg: &dyn Aggregator,
    ) -> (Result<MergeOutcome, LoraError>, Received) {
        let mut got = Vec::new();
        let r = merge_lora(plan, views, w, agg, |m, dw| -> Result<(), Infallible> {
            got.push((m.base.clone(), dw.to_vec()));
            Ok(())
        });
        (r, got)
    }

    /// Independent reference: `(alpha/r)·B·A` of one node and module in f64, and the same
    /// sum over absolute values (the scale the f32 rounding error is relative to).
    fn ref_dw(view: &DeltaView<'_>, m: &LoraModule, plan: &LoraPlan) -> (Vec<f64>, Vec<f64>) {
        let a = view.to_f32(view.tensor(&m.lora_a).unwrap());
        let b = view.to_f32(view.tensor(&m.lora_b).unwrap());
        let (r, o_n, i_n) = (plan.rank, m.out_features, m.in_features);
        let s = f64::from(plan.alpha) / r as f64;
        let mut dw = vec![0.0; o_n * i_n];
        let mut mag = vec![0.0; o_n * i_n];
        for o in 0..o_n {
            for j in 0..i_n {
                for k in 0..r {
                    let p = f64::from(b[o * r + k]) * f64::from(a[k * i_n + j]);
                    dw[o * i_n + j] += s * p;
                    mag[o * i_n + j] += s * p.abs();
                }
            }
        }
        (dw, mag)
    }

    /// Dense weighted mean of the nodes' f64 products: (value, magnitude) per module.
    fn ref_weighted(
        plan: &LoraPlan,
        views: &[DeltaView<'_>],
        w: &[f32],
    ) -> Vec<(String, Vec<f64>, Vec<f64>)> {
        let sum: f64 = w.iter().map(|&x| f64::from(x)).sum();
        plan.modules
            .iter()
            .map(|m| {
                let mut v = vec![0.0; m.weight_len()];
                let mut mag = vec![0.0; m.weight_len()];
                for (view, &wi) in views.iter().zip(w) {
                    let (d, a) = ref_dw(view, m, plan);
                    let c = f64::from(wi) / sum;
                    for j in 0..v.len() {
                        v[j] += c * d[j];
                        mag[j] += c * a[j];
                    }
                }
                (m.base.clone(), v, mag)
            })
            .collect()
    }

    /// f32 products and aggregation carry about `(r + N + 2)·2⁻²⁴ ≈ 1e-6` relative error
    /// with respect to the magnitude sum (r ≤ 16, N ≤ 5 here); `1e-5` leaves margin.
    const REL_TOL: f64 = 1e-5;

    fn assert_close(got: f32, want: f64, mag: f64, what: &str) {
        let err = (f64::from(got) - want).abs();
        assert!(
            err <= REL_TOL * mag + 1e-30,
            "{what}: got {got}, want {want} (|err| {err:e}, scale {mag:e})"
        );
    }

    // (a) The weighted mean of two LoRA deltas is the dense weighted mean of their
    // products.
    #[test]
    fn weighted_mean_of_two_equals_dense_mean_of_products() {
        let plan = tiny_plan(3, &["q_proj", "v_proj", "down_proj"], 16.0);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let bytes = vec![
            encode(
                DeltaKind::Lora,
                DeltaDtype::F32,
                &random_adapter(&plan, &mut rng),
            ),
            // Another dtype: the factors are decoded before the product.
            encode(
                DeltaKind::Lora,
                DeltaDtype::Bf16,
                &random_adapter(&plan, &mut rng),
            ),
        ];
        let views = parse_all(&bytes);
        let w = [0.3, 1.7];
        let (r, got) = collect(&plan, &views, &w, &WeightedMean);
        assert_eq!(
            r.unwrap(),
            MergeOutcome::Merged {
                aggregator: "weighted_mean",
                used: 2
            }
        );
        let want = ref_weighted(&plan, &views, &w);
        // One call per module, in base-name order.
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        let want_names: Vec<&str> = want.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names, want_names);
        assert!(names.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(names.len(), 2 * 3);
        for ((name, g), (_, v, mag)) in got.iter().zip(&want) {
            assert_eq!(g.len(), v.len());
            for j in 0..g.len() {
                assert_close(g[j], v[j], mag[j], &format!("{name}[{j}]"));
            }
        }
    }

    // (b) Averaging the factors is not averaging the updates: the reason aggregators must
    // act on ΔWᵢ.
    #[test]
    fn averaging_factors_differs_from_averaging_updates() {
        let module = LoraModule {
            base: "m.weight".into(),
            lora_a: "base_model.model.m.lora_A.weight".into(),
            lora_b: "base_model.model.m.lora_B.weight".into(),
            out_features: 2,
            in_features: 2,
        };
        let plan = LoraPlan {
            modules: vec![module.clone()],
            rank: 1,
            alpha: 1.0,
        };
        let delta = |a: [f32; 2], b: [f32; 2]| {
            let mut t = Tensors::new();
            t.insert(module.lora_a.clone(), (vec![1, 2], a.to_vec()));
            t.insert(module.lora_b.clone(), (vec![2, 1], b.to_vec()));
            encode(DeltaKind::Lora, DeltaDtype::F32, &t)
        };
        let merged = |bytes: &[Vec<u8>]| {
            let views = parse_all(bytes);
            let (r, got) = collect(&plan, &views, &[1.0; 2], &WeightedMean);
            r.unwrap();
            got[0].1.clone()
        };
        // Factor-averaged "merge": mean A, mean B, then the product (r = 1, s = 1).
        let product_of_means = |a: [[f32; 2]; 2], b: [[f32; 2]; 2]| {
            let ma = [(a[0][0] + a[1][0]) / 2.0, (a[0][1] + a[1][1]) / 2.0];
            let mb = [(b[0][0] + b[1][0]) / 2.0, (b[0][1] + b[1][1]) / 2.0];
            [mb[0] * ma[0], mb[0] * ma[1], mb[1] * ma[0], mb[1] * ma[1]]
        };
        let max_diff = |x: &[f32], y: &[f32]| {
            x.iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0f32, f32::max)
        };

        // Two nodes adapting orthogonal directions: ΔW₁ = e₁e₁ᵀ, ΔW₂ = e₂e₂ᵀ. The mean
        // update is diag(½, ½) (rank 2); the product of mean factors is ¼·𝟙𝟙ᵀ (rank 1,
        // with off-diagonal terms neither node proposed).
        let (a, b) = ([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]);
        let m = merged(&[delta(a[0], b[0]), delta(a[1], b[1])]);
        assert_eq!(m, [0.5, 0.0, 0.0, 0.5]);
        let f = product_of_means(a, b);
        assert_eq!(f, [0.25; 4]);
        assert!(max_diff(&m, &f) > 0.2, "{m:?} vs {f:?}");

        // The same update factored two ways, (B, A) and (2B, A/2): the merge of two equal
        // updates is that update, but mean factors give (1.5B)(0.75A) = 1.125·ΔW.
        let (a, b) = ([[1.0, 2.0], [0.5, 1.0]], [[1.0, -1.0], [2.0, -2.0]]);
        let m = merged(&[delta(a[0], b[0]), delta(a[1], b[1])]);
        assert_eq!(m, [1.0, 2.0, -1.0, -2.0]);
        let f = product_of_means(a, b);
        assert!(max_diff(&m, &f) > 0.2, "{m:?} vs {f:?}");
    }

    /// A plan of `dims.len()` modules `layers.{i}.proj` with the given `(out, in)`.
    fn custom_plan(rank: usize, dims: &[(usize, usize)], alpha: f32) -> LoraPlan {
        let modules = dims
            .iter()
            .enumerate()
            .map(|(i, &(o, n))| LoraModule {
                base: format!("layers.{i}.proj.weight"),
                lora_a: format!("{PEFT_PREFIX}layers.{i}.proj{LORA_A_SUFFIX}"),
                lora_b: format!("{PEFT_PREFIX}layers.{i}.proj{LORA_B_SUFFIX}"),
                out_features: o,
                in_features: n,
            })
            .collect();
        LoraPlan {
            modules,
            rank,
            alpha,
        }
    }

    fn weight_strategy() -> impl Strategy<Value = f32> {
        prop_oneof![1 => Just(0.0f32), 3 => 0.01f32..10.0]
    }

    // (c) Over shapes, ranks, node counts and weights (zeros included).
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn merge_matches_dense_reference(
            rank in 1usize..=4,
            dims in prop::collection::vec((1usize..=9, 1usize..=9), 1..=3),
            w in prop::collection::vec(weight_strategy(), 1..=5),
            alpha in 0.5f32..64.0,
            seed in any::<u64>(),
        ) {
            let plan = custom_plan(rank, &dims, alpha);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let bytes: Vec<Vec<u8>> = w
                .iter()
                .map(|_| encode(DeltaKind::Lora, DeltaDtype::F32, &random_adapter(&plan, &mut rng)))
                .collect();
            let views = parse_all(&bytes);
            let used: Vec<usize> = (0..w.len()).filter(|&i| w[i] > 0.0).collect();

            // Weighted mean: the dense weighted mean of the products.
            let (r, got) = collect(&plan, &views, &w, &WeightedMean);
            if used.is_empty() {
                prop_assert_eq!(
                    r.unwrap(),
                    MergeOutcome::KeepPrevious { reason: KeepReason::AllWeightsZero }
                );
                prop_assert!(got.is_empty());
                return Ok(());
            }
            prop_assert_eq!(
                r.unwrap(),
                MergeOutcome::Merged { aggregator: "weighted_mean", used: used.len() }
            );
            for ((name, g), (_, v, mag)) in got.iter().zip(ref_weighted(&plan, &views, &w)) {
                for j in 0..g.len() {
                    let err = (f64::from(g[j]) - v[j]).abs();
                    prop_assert!(err <= REL_TOL * mag[j] + 1e-30, "{}[{}] {} vs {}", name, j, g[j], v[j]);
                }
            }

            // Coordinate median: each coordinate is the median of that coordinate's ΔWᵢ
            // over the nodes of non-zero weight.
            let (r, got) = collect(&plan, &views, &w, &CoordinateMedian);
            prop_assert_eq!(
                r.unwrap(),
                MergeOutcome::Merged { aggregator: "median", used: used.len() }
            );
            prop_assert_eq!(got.len(), plan.modules.len());
            for (m, (name, g)) in plan.modules.iter().zip(&got) {
                prop_assert_eq!(&m.base, name);
                let per_node: Vec<(Vec<f64>, Vec<f64>)> =
                    used.iter().map(|&i| ref_dw(&views[i], m, &plan)).collect();
                for j in 0..g.len() {
                    let mut col: Vec<f64> = per_node.iter().map(|(d, _)| d[j]).collect();
                    col.sort_by(|a, b| a.total_cmp(b));
                    let n = col.len();
                    let med = (col[(n - 1) / 2] + col[n / 2]) / 2.0;
                    // The median is 1-Lipschitz in each input: the f32 products' errors
                    // bound its error.
                    let scale = per_node.iter().map(|(_, a)| a[j]).fold(0.0, f64::max);
                    let err = (f64::from(g[j]) - med).abs();
                    prop_assert!(err <= REL_TOL * scale + 1e-30, "{}[{}] {} vs {}", name, j, g[j], med);
                }
            }
        }
    }

    /// A delta with weight 0 takes no part: the result equals the merge without it, bit
    /// for bit, and `used` does not count it.
    #[test]
    fn zero_weight_delta_takes_no_part() {
        let plan = tiny_plan(2, &["k_proj"], 4.0);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let bytes: Vec<Vec<u8>> = (0..3)
            .map(|_| {
                encode(
                    DeltaKind::Lora,
                    DeltaDtype::F32,
                    &random_adapter(&plan, &mut rng),
                )
            })
            .collect();
        let views = parse_all(&bytes);
        for agg in [&WeightedMean as &dyn Aggregator, &CoordinateMedian] {
            let (r3, g3) = collect(&plan, &views, &[1.0, 0.0, 2.0], agg);
            let pair = [views[0].clone(), views[2].clone()];
            let (r2, g2) = collect(&plan, &pair, &[1.0, 2.0], agg);
            assert_eq!(r3.unwrap(), r2.unwrap());
            assert_eq!(g3, g2);
        }
        let (r, _) = collect(&plan, &views, &[1.0, 0.0, 2.0], &WeightedMean);
        assert_eq!(
            r.unwrap(),
            MergeOutcome::Merged {
                aggregator: "weighted_mean",
                used: 2
            }
        );
    }

    #[test]
    fn nothing_to_merge_keeps_previous_without_calling_the_sink() {
        let plan = tiny_plan(2, &["q_proj"], 8.0);
        let (r, got) = collect::<DeltaView<'_>>(&plan, &[], &[], &WeightedMean);
        assert_eq!(
            r.unwrap(),
            MergeOutcome::KeepPrevious {
                reason: KeepReason::NoDeltas
            }
        );
        assert!(got.is_empty());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let bytes = vec![encode(
            DeltaKind::Lora,
            DeltaDtype::F32,
            &random_adapter(&plan, &mut rng),
        )];
        let views = parse_all(&bytes);
        let (r, got) = collect(&plan, &views, &[0.0], &CoordinateMedian);
        assert_eq!(
            r.unwrap(),
            MergeOutcome::KeepPrevious {
                reason: KeepReason::AllWeightsZero
            }
        );
        assert!(got.is_empty());
    }

    /// A tiny plan, two valid deltas' tensors, and a way to merge edited copies.
    fn error_fixture() -> (LoraPlan, Tensors) {
        let plan = tiny_plan(2, &["q_proj", "up_proj"], 8.0);
        let t = random_adapter(&plan, &mut ChaCha8Rng::seed_from_u64(4));
        (plan, t)
    }

    fn merge_err(plan: &LoraPlan, bytes: &[Vec<u8>], w: &[f32], agg: &dyn Aggregator) -> LoraError {
        let views = parse_all(bytes);
        let (r, got) = collect(plan, &views, w, agg);
        assert!(
            got.is_empty(),
            "the sink must not be called on an input error"
        );
        r.unwrap_err()
    }

    // (d) Typed errors, all before the sink's first call.
    #[test]
    fn wrong_adapter_shape() {
        let (plan, t) = error_fixture();
        let mut bad = t.clone();
        let m = &plan.modules[1];
        // A as [r+1, in] instead of [r, in].
        bad.insert(
            m.lora_a.clone(),
            (vec![3, m.in_features], vec![0.5; 3 * m.in_features]),
        );
        let bytes = [
            encode(DeltaKind::Lora, DeltaDtype::F32, &t),
            encode(DeltaKind::Lora, DeltaDtype::F32, &bad),
        ];
        match merge_err(&plan, &bytes, &[1.0, 1.0], &WeightedMean) {
            LoraError::WrongShape {
                index: 1,
                tensor,
                expected,
                found,
            } => {
                assert_eq!(tensor, m.lora_a);
                assert_eq!(expected, [2, m.in_features]);
                assert_eq!(found, [3, m.in_features]);
            }
            other => panic!("{other:?}"),
        }
        // B transposed.
        let mut bad = t.clone();
        bad.insert(
            m.lora_b.clone(),
            (vec![2, m.out_features], vec![0.5; 2 * m.out_features]),
        );
        let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &bad)];
        assert!(matches!(
            merge_err(&plan, &bytes, &[1.0], &WeightedMean),
            LoraError::WrongShape { index: 0, ref tensor, .. } if *tensor == m.lora_b
        ));
    }

    #[test]
    fn missing_and_unexpected_tensors() {
        let (plan, t) = error_fixture();
        let mut missing = t.clone();
        missing.remove(&plan.modules[0].lora_b);
        let bytes = [
            encode(DeltaKind::Lora, DeltaDtype::F32, &t),
            encode(DeltaKind::Lora, DeltaDtype::Bf16, &missing),
        ];
        // Checked even when the delta's weight is zero, as merge.rs checks lengths.
        assert!(matches!(
            merge_err(&plan, &bytes, &[1.0, 0.0], &WeightedMean),
            LoraError::MissingTensor { index: 1, ref tensor } if *tensor == plan.modules[0].lora_b
        ));
        let mut extra = t.clone();
        let name = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight";
        extra.insert(name.into(), (vec![2, 8], vec![0.0; 16]));
        let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &extra)];
        assert!(matches!(
            merge_err(&plan, &bytes, &[1.0], &WeightedMean),
            LoraError::UnexpectedTensor { index: 0, ref tensor } if tensor == name
        ));
    }

    #[test]
    fn mismatched_delta_kind() {
        let (plan, t) = error_fixture();
        let bytes = [
            encode(DeltaKind::Lora, DeltaDtype::F32, &t),
            encode(DeltaKind::Full, DeltaDtype::F32, &t),
        ];
        assert!(matches!(
            merge_err(&plan, &bytes, &[1.0, 1.0], &CoordinateMedian),
            LoraError::WrongKind {
                index: 1,
                found: DeltaKind::Full
            }
        ));
    }

    #[test]
    fn weight_errors_and_aggregator_errors() {
        let (plan, t) = error_fixture();
        let bytes = [
            encode(DeltaKind::Lora, DeltaDtype::F32, &t),
            encode(DeltaKind::Lora, DeltaDtype::F32, &t),
        ];
        assert!(matches!(
            merge_err(&plan, &bytes, &[1.0], &WeightedMean),
            LoraError::Merge(MergeError::WeightCount {
                deltas: 2,
                weights: 1
            })
        ));
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            assert!(matches!(
                merge_err(&plan, &bytes, &[1.0, bad], &WeightedMean),
                LoraError::Merge(MergeError::BadWeight { index: 1, .. })
            ));
        }
        // The aggregator's own refusal comes at the first module, before the sink.
        assert!(matches!(
            merge_err(&plan, &bytes, &[1.0, 1.0], &TrimmedMean { trim: 0.7 }),
            LoraError::Merge(MergeError::BadTrim(_))
        ));
    }

    #[test]
    fn data_length_of_a_hand_built_view() {
        let (plan, t) = error_fixture();
        let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &t)];
        let mut views = parse_all(&bytes);
        let i = views[0]
            .tensors
            .iter()
            .position(|x| x.name == plan.modules[0].lora_a)
            .unwrap();
        let d = views[0].tensors[i].data;
        views[0].tensors[i].data = &d[..d.len() - 4];
        let (r, got) = collect(&plan, &views, &[1.0], &WeightedMean);
        assert!(got.is_empty());
        assert!(matches!(r, Err(LoraError::DataLength { index: 0, .. })));
    }

    #[test]
    fn plan_errors() {
        let (plan, t) = error_fixture();
        let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &t)];
        type Expect = fn(&LoraError) -> bool;
        let cases: [(LoraPlan, Expect); 5] = [
            (
                LoraPlan {
                    rank: 0,
                    ..plan.clone()
                },
                |e| matches!(e, LoraError::ZeroRank),
            ),
            (
                LoraPlan {
                    alpha: 0.0,
                    ..plan.clone()
                },
                |e| matches!(e, LoraError::BadAlpha(_)),
            ),
            (
                LoraPlan {
                    alpha: f32::NAN,
                    ..plan.clone()
                },
                |e| matches!(e, LoraError::BadAlpha(_)),
            ),
            (
                LoraPlan {
                    modules: vec![],
                    ..plan.clone()
                },
                |e| matches!(e, LoraError::NoModules),
            ),
            (
                LoraPlan {
                    modules: plan.modules.iter().rev().cloned().collect(),
                    ..plan.clone()
                },
                |e| matches!(e, LoraError::ModuleOrder { .. }),
            ),
        ];
        for (p, ok) in cases {
            let e = merge_err(&p, &bytes, &[1.0], &WeightedMean);
            assert!(ok(&e), "{e:?}");
        }
        assert!(matches!(
            LoraPlan::from_spec(&tiny_base(), 8.0),
            Err(LoraError::NotLoraSpec(_))
        ));
        let mut spec = tiny_base().lora_spec(2, &["q_proj"]).unwrap();
        let b = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight";
        spec.params.insert(b.into(), vec![8, 3]);
        assert!(matches!(
            lora_modules(&spec),
            Err(LoraError::BadSpec { ref tensor, .. }) if tensor == b
        ));
        spec.params.remove(b);
        assert!(matches!(
            lora_modules(&spec),
            Err(LoraError::BadSpec { ref tensor, .. }) if tensor == b
        ));
        let mut spec = tiny_base().lora_spec(2, &["q_proj"]).unwrap();
        spec.params.insert("model.norm.weight".into(), vec![8]);
        assert!(matches!(
            lora_modules(&spec),
            Err(LoraError::BadSpec { .. })
        ));
    }

    #[test]
    fn sink_error_stops_the_merge() {
        let (plan, t) = error_fixture();
        let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &t)];
        let views = parse_all(&bytes);
        let mut calls = 0;
        let r = merge_lora(&plan, &views, &[1.0], &WeightedMean, |_, _| {
            calls += 1;
            Err("disk full")
        });
        assert_eq!(calls, 1);
        match r {
            Err(LoraError::Sink { module, source }) => {
                assert_eq!(module, plan.modules[0].base);
                assert_eq!(source.to_string(), "disk full");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn overflowing_update_is_refused() {
        let (plan, mut t) = error_fixture();
        for (_, v) in t.values_mut() {
            v.iter_mut().for_each(|x| *x = 3e38);
        }
        let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &t)];
        let views = parse_all(&bytes);
        let (r, got) = collect(&plan, &views, &[1.0], &WeightedMean);
        assert!(got.is_empty());
        assert!(matches!(r, Err(LoraError::NonFiniteDelta { index: 0, .. })));
    }

    // (e) Applying to base weights: adapted tensors get outer_lr·ΔW, every other tensor
    // keeps its bits.
    #[test]
    fn apply_updates_only_the_adapted_tensors() {
        let spec = tiny_base();
        let layout = Arc::new(Layout::new(&spec).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let data = (0..layout.len())
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let before = Weights::from_vec(layout.clone(), data).unwrap();
        let plan = LoraPlan::from_spec(&spec.lora_spec(4, &["q_proj", "down_proj"]).unwrap(), 8.0)
            .unwrap();
        let bytes: Vec<Vec<u8>> = (0..3)
            .map(|_| {
                encode(
                    DeltaKind::Lora,
                    DeltaDtype::Bf16,
                    &random_adapter(&plan, &mut rng),
                )
            })
            .collect();
        let views = parse_all(&bytes);
        let w = [1.0, 0.5, 2.0];
        let lr = 0.7f32;

        let mut after = before.clone();
        let r = apply_lora_merge(&mut after, &plan, &views, &w, &WeightedMean, lr).unwrap();
        assert_eq!(
            r,
            MergeOutcome::Merged {
                aggregator: "weighted_mean",
                used: 3
            }
        );
        let adapted: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = ref_weighted(&plan, &views, &w)
            .into_iter()
            .map(|(n, v, m)| {
                (
                    plan.modules
                        .iter()
                        .find(|x| x.base == n)
                        .unwrap()
                        .base
                        .as_str(),
                    (v, m),
                )
            })
            .collect();
        assert_eq!(adapted.len(), 4);
        for e in layout.entries() {
            let (b, a) = (
                before.tensor(&e.name).unwrap(),
                after.tensor(&e.name).unwrap(),
            );
            match adapted.get(e.name.as_str()) {
                None => {
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(a), bits(b), "{} changed", e.name);
                }
                Some((dw, mag)) => {
                    for j in 0..a.len() {
                        let want = f64::from(b[j]) + f64::from(lr) * dw[j];
                        // One more f32 rounding of w + lr·ΔW, relative to |w|.
                        let scale = f64::from(lr) * mag[j] + f64::from(b[j].abs());
                        assert_close(a[j], want, scale, &format!("{}[{j}]", e.name));
                    }
                }
            }
        }

        // Nothing to merge: the base keeps every bit.
        let mut same = before.clone();
        let r = apply_lora_merge(&mut same, &plan, &views, &[0.0; 3], &WeightedMean, lr).unwrap();
        assert!(matches!(r, MergeOutcome::KeepPrevious { .. }));
        assert_eq!(same, before);
    }

    #[test]
    fn apply_refuses_a_base_it_cannot_update() {
        let spec = tiny_base();
        let layout = Arc::new(Layout::new(&spec).unwrap());
        let base = Weights::zeros(layout);
        let plan = tiny_plan(2, &["q_proj"], 8.0);
        let bytes = [encode(
            DeltaKind::Lora,
            DeltaDtype::F32,
            &random_adapter(&plan, &mut ChaCha8Rng::seed_from_u64(6)),
        )];
        let views = parse_all(&bytes);

        let mut w = base.clone();
        assert!(matches!(
            apply_lora_merge(&mut w, &plan, &views, &[1.0], &WeightedMean, f32::NAN),
            Err(LoraError::BadLearningRate(_))
        ));
        let mut other = plan.clone();
        other.modules[0].base = "model.layers.0.self_attn.x_proj.weight".into();
        assert!(matches!(
            apply_lora_merge(&mut w, &other, &views, &[1.0], &WeightedMean, 1.0),
            Err(LoraError::BaseMissing { .. })
        ));
        let mut other = plan.clone();
        other.modules[0].base = "model.layers.0.self_attn.k_proj.weight".into();
        assert!(matches!(
            apply_lora_merge(&mut w, &other, &views, &[1.0], &WeightedMean, 1.0),
            Err(LoraError::BaseShape { ref found, .. }) if *found == [4, 8]
        ));
        // A merge error surfaces as itself, and the base is untouched.
        assert!(matches!(
            apply_lora_merge(&mut w, &plan, &views, &[1.0, 1.0], &WeightedMean, 1.0),
            Err(LoraError::Merge(MergeError::WeightCount { .. }))
        ));
        assert_eq!(w, base);
        // An overflowing update (lr·ΔW beyond f32 for |ΔW| > 1) is reported as the typed
        // error, not as a wrapped sink error.
        assert!(matches!(
            apply_lora_merge(&mut w, &plan, &views, &[1.0], &WeightedMean, f32::MAX),
            Err(LoraError::NonFiniteWeights { .. })
        ));
    }

    #[test]
    fn qwen3_0_6b_r16_modules() {
        let base = ModelSpec::from_hf_config(QWEN3_0_6B).unwrap();
        let targets = hanzod_protocol::model::LINEAR_MODULES;
        let plan = LoraPlan::from_spec(&base.lora_spec(16, &targets).unwrap(), 32.0).unwrap();
        assert_eq!(plan.modules.len(), 28 * 7);
        assert_eq!(plan.scaling(), 2.0);
        let m = &plan.modules[0];
        assert_eq!(m.base, "model.layers.0.mlp.down_proj.weight");
        assert_eq!(
            m.lora_a,
            "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
        );
        assert_eq!((m.out_features, m.in_features), (1024, 3072));
        for m in &plan.modules {
            assert_eq!(base.params[&m.base], [m.out_features, m.in_features]);
        }
        // 28 × 16 × (q 3072 + k 2048 + v 2048 + o 3072 + gate 4096 + up 4096 + down 4096).
        assert_eq!(plan.adapter_params(), 28 * 16 * 22_528);
        assert_eq!(plan.adapter_params(), 10_092_544);
        assert_eq!(plan.scratch_floats(8), Some(9 * 3072 * 1024));
    }

    /// The AVX2 path (when the CPU has it) and the portable loop give the same bits, and
    /// both match the f64 product, for ranks that exercise every grouping of four.
    #[test]
    fn product_paths_agree() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for r in 1..=17 {
            for (o_n, i_n) in [(1, 1), (3, 5), (16, 33), (7, 64)] {
                let a: Vec<f32> = (0..r * i_n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let b: Vec<f32> = (0..o_n * r).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let s = 1.5;
                let (mut x, mut y) = (vec![9.0; o_n * i_n], vec![-9.0; o_n * i_n]);
                lora_product(&b, &a, r, i_n, s, &mut x);
                lora_product_portable(&b, &a, r, i_n, s, &mut y);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&x), bits(&y), "r={r} {o_n}x{i_n}");
                for o in 0..o_n {
                    for j in 0..i_n {
                        let (mut want, mut mag) = (0.0f64, 0.0f64);
                        for k in 0..r {
                            let p =
                                f64::from(s) * f64::from(b[o * r + k]) * f64::from(a[k * i_n + j]);
                            want += p;
                            mag += p.abs();
                        }
                        assert_close(x[o * i_n + j], want, mag, &format!("r={r} [{o},{j}]"));
                    }
                }
            }
        }
    }

    // (f) Decoded adapters: the f32 sources (`Weights`, `FlatAdapter`) run the same kernel
    // as parsed deltas.

    /// The adapter layout of `plan` (kind LoRA): its A and B tensors, name order.
    fn adapter_layout(plan: &LoraPlan) -> Arc<Layout> {
        let spec = ModelSpec {
            name: "adapter".into(),
            params: plan_tensors(plan)
                .map(|(n, s)| (n.clone(), s.to_vec()))
                .collect(),
            lora: Some(hanzod_protocol::model::LoraConfig {
                rank: plan.rank,
                target_modules: vec!["proj".into()],
            }),
        };
        Arc::new(Layout::new(&spec).unwrap())
    }

    /// `t` decoded into `layout`.
    fn to_weights(layout: &Arc<Layout>, t: &Tensors) -> Weights {
        let data = layout
            .entries()
            .iter()
            .flat_map(|e| t[&e.name].1.iter().copied())
            .collect();
        Weights::from_vec(layout.clone(), data).unwrap()
    }

    /// The full model of a `custom_plan`: every module's base `[out, in]` and one
    /// unadapted tensor `norm.weight [3]`.
    fn full_layout(plan: &LoraPlan) -> Arc<Layout> {
        let mut params: BTreeMap<String, Vec<usize>> = plan
            .modules
            .iter()
            .map(|m| (m.base.clone(), vec![m.out_features, m.in_features]))
            .collect();
        params.insert("norm.weight".into(), vec![3]);
        let spec = ModelSpec {
            name: "full".into(),
            params,
            lora: None,
        };
        Arc::new(Layout::new(&spec).unwrap())
    }

    fn random_vec(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
        (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Over shapes, ranks, node counts and weights: merging decoded adapters (as
        /// `Weights`, as `FlatAdapter`s, by reference) gives the bits of merging the same
        /// factors as parsed f32 deltas, and the weighted mean is the dense f64 weighted
        /// mean of the products within `REL_TOL` of the magnitude sum.
        #[test]
        fn decoded_adapters_merge_like_parsed_deltas_and_the_dense_reference(
            rank in 1usize..=4,
            dims in prop::collection::vec((1usize..=9, 1usize..=9), 1..=3),
            w in prop::collection::vec(weight_strategy(), 1..=5),
            alpha in 0.5f32..64.0,
            seed in any::<u64>(),
        ) {
            let plan = custom_plan(rank, &dims, alpha);
            let layout = adapter_layout(&plan);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let tensors: Vec<Tensors> = w.iter().map(|_| random_adapter(&plan, &mut rng)).collect();
            let bytes: Vec<Vec<u8>> = tensors
                .iter()
                .map(|t| encode(DeltaKind::Lora, DeltaDtype::F32, t))
                .collect();
            let views = parse_all(&bytes);
            let adapters: Vec<Weights> = tensors.iter().map(|t| to_weights(&layout, t)).collect();
            let flats: Vec<FlatAdapter<'_>> =
                adapters.iter().map(|a| FlatAdapter::new(&layout, &a.data)).collect();
            let refs: Vec<&Weights> = adapters.iter().collect();
            for agg in [&WeightedMean as &dyn Aggregator, &CoordinateMedian] {
                let (rv, gv) = collect(&plan, &views, &w, agg);
                let rv = rv.unwrap();
                for (r, g) in [
                    collect(&plan, &adapters, &w, agg),
                    collect(&plan, &flats, &w, agg),
                    collect(&plan, &refs, &w, agg),
                ] {
                    prop_assert_eq!(r.unwrap(), rv);
                    prop_assert_eq!(&g, &gv);
                }
            }
            if w.iter().all(|&x| x == 0.0) {
                return Ok(());
            }
            let (_, got) = collect(&plan, &flats, &w, &WeightedMean);
            for ((name, g), (_, v, mag)) in got.iter().zip(ref_weighted(&plan, &views, &w)) {
                for j in 0..g.len() {
                    let err = (f64::from(g[j]) - v[j]).abs();
                    prop_assert!(err <= REL_TOL * mag[j] + 1e-30, "{}[{}] {} vs {}", name, j, g[j], v[j]);
                }
            }
        }

        /// `add_adapter_update` is `w + scale·ΔW` on the adapted tensors (every other
        /// tensor bit-identical), with `‖ΔW‖₂` and `⟨ΔW, other⟩` of the dense update.
        #[test]
        fn add_adapter_update_is_base_plus_the_scaled_dense_update(
            rank in 1usize..=4,
            dims in prop::collection::vec((1usize..=9, 1usize..=9), 1..=3),
            alpha in 0.5f32..64.0,
            scale in -2.0f32..2.0,
            with_other in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let plan = custom_plan(rank, &dims, alpha);
            let full = full_layout(&plan);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let t = random_adapter(&plan, &mut rng);
            let adapter = to_weights(&adapter_layout(&plan), &t);
            let base = Weights::from_vec(full.clone(), random_vec(&mut rng, full.len())).unwrap();
            let other = with_other.then(|| random_vec(&mut rng, full.len()));
            let mut after = base.clone();
            let stats = add_adapter_update(&mut after, &plan, &adapter, scale, other.as_deref()).unwrap();
            prop_assert_eq!(stats.dot.is_some(), with_other);

            let bytes = [encode(DeltaKind::Lora, DeltaDtype::F32, &t)];
            let views = parse_all(&bytes);
            let (mut norm_sq, mut norm_mag, mut dot, mut dot_mag) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for m in &plan.modules {
                let (dw, mag) = ref_dw(&views[0], m, &plan);
                let e = full.entry(&m.base).unwrap();
                let (b, a) = (base.tensor(&m.base).unwrap(), after.tensor(&m.base).unwrap());
                for j in 0..dw.len() {
                    let want = f64::from(b[j]) + f64::from(scale) * dw[j];
                    let tol = REL_TOL * (f64::from(scale.abs()) * mag[j] + f64::from(b[j].abs()));
                    let err = (f64::from(a[j]) - want).abs();
                    prop_assert!(err <= tol + 1e-30, "{}[{}] {} vs {}", m.base, j, a[j], want);
                    norm_sq += dw[j] * dw[j];
                    norm_mag += mag[j] * mag[j];
                    if let Some(o) = &other {
                        let v = f64::from(o[e.offset + j]);
                        dot += dw[j] * v;
                        dot_mag += mag[j] * v.abs();
                    }
                }
            }
            prop_assert_eq!(after.tensor("norm.weight").unwrap(), base.tensor("norm.weight").unwrap());
            let err = (stats.norm - norm_sq.sqrt()).abs();
            prop_assert!(err <= REL_TOL * norm_mag.sqrt() + 1e-30, "norm {} vs {}", stats.norm, norm_sq.sqrt());
            if let Some(d) = stats.dot {
                prop_assert!((d - dot).abs() <= REL_TOL * dot_mag + 1e-30, "dot {} vs {}", d, dot);
            }
        }
    }

    /// `for_each_update` streams the same `ΔW` bits as a merge of that one adapter.
    #[test]
    fn for_each_update_streams_the_merge_kernel() {
        let plan = tiny_plan(3, &["q_proj", "down_proj"], 6.0);
        let t = random_adapter(&plan, &mut ChaCha8Rng::seed_from_u64(11));
        let adapter = to_weights(&adapter_layout(&plan), &t);
        let (r, merged) = collect(&plan, std::slice::from_ref(&adapter), &[1.0], &WeightedMean);
        r.unwrap();
        let mut streamed = Vec::new();
        for_each_update(&plan, &adapter, |m, dw| -> Result<(), Infallible> {
            streamed.push((m.base.clone(), dw.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(streamed, merged);
    }

    #[test]
    fn decoded_adapter_errors() {
        let (plan, t) = error_fixture();
        let layout = adapter_layout(&plan);
        let good = to_weights(&layout, &t);
        let first_err = |d: &dyn Fn() -> Result<(), LoraError>| d().unwrap_err();

        // Kind: a full-parameter layout.
        let full = Arc::new(Layout::new(&tiny_base()).unwrap());
        let w = Weights::zeros(full.clone());
        assert!(matches!(
            first_err(&|| w.check_factors(&plan, 2)),
            LoraError::WrongKind {
                index: 2,
                found: DeltaKind::Full
            }
        ));
        // A buffer shorter than its layout.
        let short = &good.data[..good.data.len() - 1];
        assert!(matches!(
            first_err(&|| FlatAdapter::new(&layout, short).check_factors(&plan, 0)),
            LoraError::AdapterLength { index: 0, expected, found } if found + 1 == expected
        ));
        // Another rank.
        let other = tiny_plan(3, &["q_proj", "up_proj"], 8.0);
        let r3 = to_weights(
            &adapter_layout(&other),
            &random_adapter(&other, &mut ChaCha8Rng::seed_from_u64(12)),
        );
        match first_err(&|| r3.check_factors(&plan, 1)) {
            LoraError::WrongShape {
                index: 1,
                expected,
                found,
                ..
            } => {
                assert_eq!(expected[0], 2);
                assert_eq!(found[0], 3);
            }
            e => panic!("{e:?}"),
        }
        // Fewer modules than the plan; more modules than the plan.
        let fewer = tiny_plan(2, &["q_proj"], 8.0);
        let w = to_weights(
            &adapter_layout(&fewer),
            &random_adapter(&fewer, &mut ChaCha8Rng::seed_from_u64(13)),
        );
        assert!(matches!(
            first_err(&|| w.check_factors(&plan, 0)),
            LoraError::MissingTensor { .. }
        ));
        let more = tiny_plan(2, &["q_proj", "up_proj", "k_proj"], 8.0);
        let w = to_weights(
            &adapter_layout(&more),
            &random_adapter(&more, &mut ChaCha8Rng::seed_from_u64(14)),
        );
        assert!(matches!(
            first_err(&|| w.check_factors(&plan, 0)),
            LoraError::UnexpectedTensor { ref tensor, .. } if tensor.contains("k_proj")
        ));
        // The merge reports them before its sink's first call.
        let (r, got) = collect(&plan, &[good.clone(), w], &[1.0, 0.0], &WeightedMean);
        assert!(got.is_empty());
        assert!(matches!(
            r,
            Err(LoraError::UnexpectedTensor { index: 1, .. })
        ));
    }

    #[test]
    fn apply_with_update_and_add_adapter_update_refuse_what_they_cannot_use() {
        let spec = tiny_base();
        let full = Arc::new(Layout::new(&spec).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(15);
        let base = Weights::from_vec(full.clone(), random_vec(&mut rng, full.len())).unwrap();
        let plan = tiny_plan(2, &["q_proj", "down_proj"], 8.0);
        let adapters: Vec<Weights> = (0..2)
            .map(|_| to_weights(&adapter_layout(&plan), &random_adapter(&plan, &mut rng)))
            .collect();

        // With the update recorded: the same checkpoint bits as without; the update holds
        // the merged ΔW at the adapted slots and what it held elsewhere.
        let (mut a, mut b) = (base.clone(), base.clone());
        apply_lora_merge(&mut a, &plan, &adapters, &[1.0, 3.0], &WeightedMean, 0.5).unwrap();
        let mut update = vec![7.0f32; full.len()];
        apply_lora_merge_with_update(
            &mut b,
            &plan,
            &adapters,
            &[1.0, 3.0],
            &WeightedMean,
            0.5,
            &mut update,
        )
        .unwrap();
        assert_eq!(a, b);
        let (_, merged) = collect(&plan, &adapters, &[1.0, 3.0], &WeightedMean);
        for e in full.entries() {
            let slot = &update[e.offset..e.offset + e.len];
            match merged.iter().find(|(n, _)| *n == e.name) {
                Some((_, dw)) => assert_eq!(slot, dw.as_slice()),
                None => assert!(slot.iter().all(|&x| x == 7.0), "{}", e.name),
            }
        }
        let mut short = vec![0.0; full.len() - 1];
        let mut c = base.clone();
        assert!(matches!(
            apply_lora_merge_with_update(
                &mut c,
                &plan,
                &adapters,
                &[1.0, 1.0],
                &WeightedMean,
                0.5,
                &mut short
            ),
            Err(LoraError::OtherLength { .. })
        ));
        assert_eq!(c, base);

        let mut c = base.clone();
        assert!(matches!(
            add_adapter_update(&mut c, &plan, &adapters[0], f32::NAN, None),
            Err(LoraError::BadLearningRate(_))
        ));
        assert!(matches!(
            add_adapter_update(&mut c, &plan, &adapters[0], 1.0, Some(&[0.0; 3])),
            Err(LoraError::OtherLength { expected, found: 3 }) if expected == full.len()
        ));
        let mut other = plan.clone();
        other.modules[0].base = "model.layers.0.self_attn.x_proj.weight".into();
        assert!(matches!(
            add_adapter_update(&mut c, &other, &adapters[0], 1.0, None),
            Err(LoraError::BaseMissing { .. })
        ));
        assert!(matches!(
            add_adapter_update(&mut c, &plan, &Weights::zeros(full.clone()), 1.0, None),
            Err(LoraError::WrongKind {
                index: 0,
                found: DeltaKind::Full
            })
        ));
        assert_eq!(c, base, "refused before any write");
        // An overflowing update is the typed error, not a wrapped sink error.
        assert!(matches!(
            add_adapter_update(&mut c, &plan, &adapters[0], f32::MAX, None),
            Err(LoraError::NonFiniteWeights { .. })
        ));
    }
}
