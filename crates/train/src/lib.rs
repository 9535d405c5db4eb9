//! # hanzod-train
//!
//! Training math, the only crate that depends on burn (DESIGN §6 quality and spot-check, §11 "training math: burn 0.22, flex CPU
//! backend"): the built-in `wine-mlp` model, its data, deterministic local training, and the
//! losses the delta validator recomputes.
//!
//! - Model: an MLP `11 → hidden → hidden → 1` with ReLU ([`model_spec`]), regression of the
//!   red-wine quality score with mean squared error. Weights are exported with PyTorch names
//!   and `[out, in]` shapes ([`Weights`], one flat f32 buffer); burn's `[in, out]` layout is
//!   internal to this module.
//! - Data: [`Dataset::wine_quality`], a fixed 1,279 / 320 train / validation split,
//!   standardised with training statistics. **Losses are in standardised-target units**
//!   (1.0 = the training variance of the quality score; multiply by
//!   [`Dataset::target_std`]² for quality points²).
//! - Loss: `(1/B) Σ (ŷ_i − y_i)²` over a batch (or the validation shard), with `ŷ` the f32
//!   predictions of burn's forward pass and the sum accumulated in f64 on the host, in
//!   sample order.
//! - Data stream: [`batch_indices`] — any auditor can replay which samples a node used at a
//!   step.
//! - Local training: [`train_local`], plain minibatch SGD; the gradient comes from burn's
//!   autodiff, the update `w ← w − lr·g` is done on the host in f32.
//!
//! Determinism: burn is built without its `rayon` feature, so the flex backend (and the
//! `gemm` crate it calls) runs every kernel on the calling thread with a fixed reduction
//! order; the same inputs give bit-identical weights and losses on one machine (tested).
//! Across machines, `gemm` picks its micro-kernel from the CPU's features at run time
//! (SSE / AVX2+FMA / NEON), so low-order bits of predictions and gradients may differ
//! between CPU families: compare losses with a tolerance (the spot-check's relative 5 %) and
//! re-executed deltas by distance, not bit for bit, when node and validator run on
//! different hardware.
//!
//! Backends: the CPU by default; a GPU with the `cuda` or `wgpu` feature, chosen once per
//! process ([`backend`]).
#![warn(missing_docs)]

pub mod backend;
pub mod catalog;
mod data;
pub mod lm;
mod mlp;
pub mod qwen3;
pub mod recipe;
pub mod text;
mod weights;

use std::sync::Arc;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};

use hanzod_protocol::hzdl::DeltaError;
use hanzod_protocol::model::ModelSpec;

pub use catalog::{recipe_of, trainer_of};
pub use data::{Dataset, FEATURES};
pub use recipe::{trainer_for, RecipeError, Trainer};
pub use weights::{Layout, LayoutEntry, Weights};

use mlp::{BurnLinear, LayerTensors};

/// The built-in model's name ([`ModelSpec::name`], `hanzod delta inspect --model`).
pub const MODEL_NAME: &str = "wine-mlp";

/// Most local steps per epoch [`Recipe::validate`] accepts: a spot-check re-runs them all,
/// so this bounds the validator's work per delta.
pub const MAX_LOCAL_STEPS: u32 = 10_000;

/// Largest hidden width [`Recipe::validate`] accepts.
pub const MAX_HIDDEN: u32 = 4096;

/// Largest batch size [`Recipe::validate`] accepts (bounds what a validator allocates when
/// it replays a recipe it was handed).
pub const MAX_BATCH_SIZE: u32 = 1 << 16;

/// Why a training-math call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TrainError {
    /// Weights, deltas or buffers whose layouts (tensor names, shapes, lengths) differ, or a
    /// layout that is not a `wine-mlp` (or not the recipe's hidden width).
    #[error("layout mismatch: {0}")]
    LayoutMismatch(String),
    /// A NaN or ±Inf in weights, a delta, a scale or a loss (where it was found).
    #[error("non-finite value: {0}")]
    NonFinite(String),
    /// The data set could not be loaded, split or standardised.
    #[error("dataset: {0}")]
    Dataset(String),
    /// A recipe field out of range (zero steps, zero batch, non-positive learning rate, …).
    #[error("invalid recipe: {0}")]
    InvalidRecipe(String),
    /// An HZDL delta that failed the format check against the layout's model.
    #[error(transparent)]
    Delta(#[from] DeltaError),
    /// A safetensors checkpoint that is malformed or is not of the layout's model.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// burn failed to execute or read back a tensor.
    #[error("burn backend: {0}")]
    Backend(String),
}

/// A job's training recipe: everything [`init`], [`batch_indices`] and [`train_local`]
/// depend on besides the data, the node key and the step, so a run is reproducible from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recipe {
    /// Seeds the initial weights and every node's data stream.
    pub seed: u64,
    /// The job id: salts every node's data stream ([`batch_indices`]), so the same node
    /// never produces byte-identical deltas in two jobs of the same seed (deltas are stored
    /// content-addressed).
    pub job: u64,
    /// SGD steps per [`train_local`] call (the inner steps between merges).
    pub local_steps: u32,
    /// Samples per step.
    pub batch_size: u32,
    /// SGD learning rate of the local (inner) steps, applied in f32.
    pub local_lr: f64,
    /// Width of both hidden layers.
    pub hidden: u32,
}

impl Default for Recipe {
    /// `seed 0, job 0, local_steps 20, batch_size 32, local_lr 0.05, hidden 32`.
    fn default() -> Self {
        Recipe {
            seed: 0,
            job: 0,
            local_steps: 20,
            batch_size: 32,
            local_lr: 0.05,
            hidden: 32,
        }
    }
}

impl Recipe {
    /// [`TrainError::InvalidRecipe`] unless `local_steps ≥ 1`,
    /// `1 ≤ batch_size ≤ MAX_BATCH_SIZE`, `1 ≤ hidden ≤ MAX_HIDDEN`, and `local_lr` is
    /// finite and positive in f32.
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::InvalidRecipe(m));
        if self.local_steps == 0 || self.local_steps > MAX_LOCAL_STEPS {
            return bad(format!(
                "local_steps {} (1 to {MAX_LOCAL_STEPS})",
                self.local_steps
            ));
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return bad(format!(
                "batch_size {} (1 to {MAX_BATCH_SIZE})",
                self.batch_size
            ));
        }
        if self.hidden == 0 || self.hidden > MAX_HIDDEN {
            return bad(format!("hidden {} (1 to {MAX_HIDDEN})", self.hidden));
        }
        let lr = self.local_lr as f32;
        if !(lr.is_finite() && lr > 0.0) {
            return bad(format!("local_lr {}", self.local_lr));
        }
        Ok(())
    }
}

/// A model built into this crate, by name: `"wine-mlp"` ([`MODEL_NAME`]) is
/// [`model_spec`]`(32)` (the default recipe's hidden width), `"qwen3-tiny"` is
/// [`lm::qwen3_tiny`]; `None` for any other name.
pub fn builtin_model(name: &str) -> Option<ModelSpec> {
    match name {
        MODEL_NAME => Some(model_spec(32)),
        lm::QWEN3_TINY => Some(lm::qwen3_tiny().spec()),
        _ => None,
    }
}

/// The `wine-mlp` parameters, PyTorch names and `[out, in]` shapes:
/// `fc1.weight [hidden, 11]`, `fc1.bias [hidden]`, `fc2.weight [hidden, hidden]`,
/// `fc2.bias [hidden]`, `fc3.weight [1, hidden]`, `fc3.bias [1]`
/// (`hidden² + 14·hidden + 1` values; 1,473 for hidden 32).
pub fn model_spec(hidden: u32) -> ModelSpec {
    let h = hidden as usize;
    let params = [
        ("fc1.weight", vec![h, FEATURES]),
        ("fc1.bias", vec![h]),
        ("fc2.weight", vec![h, h]),
        ("fc2.bias", vec![h]),
        ("fc3.weight", vec![1, h]),
        ("fc3.bias", vec![1]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    ModelSpec {
        name: MODEL_NAME.to_string(),
        params,
        lora: None,
    }
}

/// The shared layout of [`model_spec`]`(hidden)`.
pub fn layout(hidden: u32) -> Arc<Layout> {
    Arc::new(Layout::new(&model_spec(hidden)).expect("wine-mlp sizes fit in usize"))
}

/// A uniform value in `[0, 1)`: the top 24 bits of a ChaCha `next_u32`, × 2⁻²⁴ (exact in
/// f32; independent of `rand`'s float conversion).
fn unit_f32(rng: &mut ChaCha20Rng) -> f32 {
    (rng.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
}

/// The initial weights of `recipe` (deterministic in `recipe.seed` and `recipe.hidden`):
/// ChaCha20 seeded with SHA-256(`"hanzod-wine-mlp-init-v1"` ‖ seed as u64 LE ‖ hidden as
/// u32 LE) fills the layout in order (tensors in name order, row-major), one draw `u` (see
/// `unit_f32`: 24 bits, `[0, 1)`) per weight element: `w = (2u − 1)·bound` with
/// `bound = √(6 / fan_in)` for the ReLU layers fc1, fc2 (He uniform: K. He et al., "Delving
/// Deep into Rectifiers", ICCV 2015) and `√(3 / fan_in)` for the linear output fc3 (LeCun
/// uniform, gain 1). Biases are 0 (no draws).
///
/// # Panics
/// Never for a recipe that passes [`Recipe::validate`]; a hidden width of 0 gives empty
/// hidden layers.
pub fn init(recipe: &Recipe) -> Weights {
    let layout = layout(recipe.hidden);
    let mut h = Sha256::new();
    h.update(hanzod_actors::domain::WINE_MLP_INIT);
    h.update(recipe.seed.to_le_bytes());
    h.update(recipe.hidden.to_le_bytes());
    let mut rng = ChaCha20Rng::from_seed(h.finalize().into());
    let mut w = Weights::zeros(layout.clone());
    for e in layout.entries() {
        if e.name.ends_with(".bias") {
            continue;
        }
        let fan_in = e.shape[1] as f32;
        let gain2 = if e.name == "fc3.weight" { 3.0 } else { 6.0 };
        let bound = (gain2 / fan_in).sqrt();
        for v in &mut w.data[e.offset..e.offset + e.len] {
            *v = (2.0 * unit_f32(&mut rng) - 1.0) * bound;
        }
    }
    w
}

/// The sample indices (into the training shard, `0..data.train_len()`) of `node`'s batch at
/// global step `step`: `recipe.batch_size` independent uniform draws (with replacement)
/// from ChaCha20 seeded with SHA-256(`recipe.seed` as u64 LE ‖ `recipe.job` as u64 LE ‖
/// the node's 32 key bytes ‖ `step` as u64 LE); each draw takes 32-bit outputs `r`, rejects `r ≥ 2³² − (2³² mod n)`
/// and returns `r mod n` (`n = train_len`). A deterministic per-node data stream any
/// auditor can replay. (Allocates `batch_size` entries; [`Recipe::validate`] bounds it.)
pub fn batch_indices(recipe: &Recipe, data: &Dataset, node: &[u8; 32], step: u64) -> Vec<usize> {
    let mut h = Sha256::new();
    h.update(recipe.seed.to_le_bytes());
    h.update(recipe.job.to_le_bytes());
    h.update(node);
    h.update(step.to_le_bytes());
    let mut rng = ChaCha20Rng::from_seed(h.finalize().into());
    let n = data.train_len();
    (0..recipe.batch_size)
        .map(|_| data::uniform_index(&mut rng, n))
        .collect()
}

/// Fails with [`TrainError::LayoutMismatch`] unless `w` is a `wine-mlp` of the recipe's
/// hidden width.
fn check_model(w: &Weights, recipe: &Recipe) -> Result<(), TrainError> {
    let want = Layout::new(&model_spec(recipe.hidden))?;
    if *w.layout != want || w.data.len() != want.len() {
        return Err(TrainError::LayoutMismatch(format!(
            "weights of {:?} ({} values) are not a wine-mlp of hidden width {}",
            w.layout.name(),
            w.data.len(),
            recipe.hidden
        )));
    }
    Ok(())
}

/// Predictions `[n]` of `w` for the standardised features `x` (`[n × 11]`), forward pass
/// on the plain (non-autodiff) flex device.
fn predict(w: &Weights, x: Vec<f32>) -> Result<Vec<f32>, TrainError> {
    let n = x.len() / FEATURES;
    let device = backend::device();
    let layers = mlp::to_burn(w)?
        .each_ref()
        .map(|l| LayerTensors::new(l, &device, false));
    let pred = mlp::forward(&layers, mlp::tensor(x, [n, FEATURES], &device));
    mlp::read(pred)
}

/// Mean squared error of `w` on the validation shard (320 samples), in standardised-target
/// units (module documentation). [`TrainError::NonFinite`] when the weights or the loss are
/// not finite; [`TrainError::LayoutMismatch`] when `w` is not a `wine-mlp`.
pub fn validation_loss(w: &Weights, data: &Dataset) -> Result<f64, TrainError> {
    w.check_finite()?;
    let (x, y) = data.validation();
    let pred = predict(w, x.to_vec())?;
    finite(mlp::mse(&pred, y), "validation loss")
}

fn finite(v: f64, what: &str) -> Result<f64, TrainError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(TrainError::NonFinite(format!("{what} = {v}")))
    }
}

/// The loss of `w` on `node`'s batch of `step` ([`batch_indices`]): what the spot-check
/// recomputes to compare with a node's claimed loss (DESIGN §6). Same units as
/// [`validation_loss`]; `w` must be a `wine-mlp` of `recipe.hidden`.
pub fn batch_loss(
    w: &Weights,
    data: &Dataset,
    recipe: &Recipe,
    node: &[u8; 32],
    step: u64,
) -> Result<f64, TrainError> {
    recipe.validate()?;
    check_model(w, recipe)?;
    w.check_finite()?;
    let (x, y) = data.gather_train(&batch_indices(recipe, data, node, step));
    let pred = predict(w, x)?;
    finite(mlp::mse(&pred, &y), "batch loss")
}

/// What one [`train_local`] call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalRun {
    /// The weights after the last local step (the delta to upload is
    /// `weights.sub(global)`).
    pub weights: Weights,
    /// The loss of the pre-delta (global) weights on the batch of `first_step`: what the node
    /// signs, and what the spot-check recomputes with [`batch_loss`] (equal, bit for bit, on
    /// the same machine).
    pub claimed_loss: f64,
    /// The last step run: `first_step + local_steps − 1` (the next call starts at
    /// `last_step + 1`).
    pub last_step: u64,
    /// `losses[k]`: the loss on step `first_step + k`'s batch of the weights before that
    /// step's update (`losses[0] == claimed_loss`).
    pub losses: Vec<f64>,
}

/// Runs the steps `first_step .. first_step + recipe.local_steps` from `global` with plain
/// minibatch SGD: at step `s`, the batch [`batch_indices`]`(recipe, data, node, s)`, the
/// gradient `g` of the batch MSE `(1/B) Σ (ŷ_i − y_i)²` by burn autodiff (flex device,
/// f32), then `w ← w − lr·g` element-wise in f32 with `lr = recipe.local_lr as f32` (no
/// momentum, no weight decay, no clipping). Deterministic: the same inputs give
/// bit-identical results on one machine.
///
/// Errors: an invalid recipe, weights that are not a `wine-mlp` of `recipe.hidden`,
/// non-finite weights or losses (a diverging learning rate), or a step range past
/// `u64::MAX`.
pub fn train_local(
    global: &Weights,
    data: &Dataset,
    recipe: &Recipe,
    node: &[u8; 32],
    first_step: u64,
) -> Result<LocalRun, TrainError> {
    recipe.validate()?;
    check_model(global, recipe)?;
    global.check_finite()?;
    let last_step = first_step
        .checked_add(u64::from(recipe.local_steps) - 1)
        .ok_or_else(|| TrainError::InvalidRecipe("step range passes u64::MAX".into()))?;
    let device = backend::device().autodiff();
    let lr = recipe.local_lr as f32;
    let b = recipe.batch_size as usize;
    let mut w = global.clone();
    let mut grad = Weights::zeros(global.layout.clone());
    let mut losses = Vec::with_capacity(recipe.local_steps as usize);
    for step in first_step..=last_step {
        let (x, y) = data.gather_train(&batch_indices(recipe, data, node, step));
        let layers = mlp::to_burn(&w)?;
        let leaves = layers
            .each_ref()
            .map(|l| LayerTensors::new(l, &device, true));
        let pred = mlp::forward(&leaves, mlp::tensor(x, [b, FEATURES], &device));
        let loss = finite(
            mlp::mse(&mlp::read(pred.clone())?, &y),
            &format!("loss at step {step}"),
        )?;
        losses.push(loss);
        let target = mlp::tensor(y, [b, 1], &device);
        let grads = (pred - target).square().mean().backward();
        let mut g = Vec::with_capacity(3);
        for (t, l) in leaves.iter().zip(&layers) {
            let missing = || TrainError::Backend("autodiff returned no gradient".into());
            g.push(BurnLinear {
                d_in: l.d_in,
                d_out: l.d_out,
                weight: mlp::read(t.weight.grad(&grads).ok_or_else(missing)?)?,
                bias: mlp::read_any(t.bias.grad(&grads).ok_or_else(missing)?)?,
            });
        }
        let g: [BurnLinear; 3] = g
            .try_into()
            .map_err(|_| TrainError::Backend("three layers".into()))?;
        mlp::from_burn(&g, &mut grad)?;
        for (wi, gi) in w.data.iter_mut().zip(&grad.data) {
            *wi -= lr * gi;
        }
    }
    w.check_finite()?;
    Ok(LocalRun {
        weights: w,
        claimed_loss: losses[0],
        last_step,
        losses,
    })
}

#[cfg(test)]
mod tests {
    use super::mlp::{from_burn, to_burn, transpose};
    use super::*;

    /// `y = x·Wᵀ + b` per layer, in f64, PyTorch convention on the exported buffer.
    fn reference_forward(w: &Weights, x: &[f32]) -> Vec<f64> {
        let layer = |name: &str, input: &[f64], relu: bool| -> Vec<f64> {
            let e = w.layout.entry(&format!("{name}.weight")).unwrap();
            let (out, inp) = (e.shape[0], e.shape[1]);
            let wt = w.tensor(&format!("{name}.weight")).unwrap();
            let b = w.tensor(&format!("{name}.bias")).unwrap();
            let n = input.len() / inp;
            let mut y = vec![0.0; n * out];
            for s in 0..n {
                for o in 0..out {
                    let mut acc = f64::from(b[o]);
                    for i in 0..inp {
                        acc += f64::from(wt[o * inp + i]) * input[s * inp + i];
                    }
                    y[s * out + o] = if relu { acc.max(0.0) } else { acc };
                }
            }
            y
        };
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let h1 = layer("fc1", &x, true);
        let h2 = layer("fc2", &h1, true);
        layer("fc3", &h2, false)
    }

    #[test]
    fn burn_forward_matches_pytorch_convention() {
        let recipe = Recipe {
            hidden: 7,
            ..Recipe::default()
        };
        let mut w = init(&recipe);
        // Non-zero biases so a mix-up of bias and weight would show.
        for (i, v) in w.tensor_mut("fc1.bias").unwrap().iter_mut().enumerate() {
            *v = 0.1 * i as f32 - 0.2;
        }
        w.tensor_mut("fc3.bias").unwrap()[0] = 0.3;
        let data = Dataset::wine_quality().unwrap();
        let (x, _) = data.gather_train(&[0, 1, 2, 500, 1000]);
        let got = predict(&w, x.clone()).unwrap();
        let want = reference_forward(&w, &x);
        assert_eq!(got.len(), 5);
        for (g, r) in got.iter().zip(&want) {
            assert!((f64::from(*g) - r).abs() < 1e-4, "{g} vs {r}");
        }
    }

    #[test]
    fn burn_layout_round_trip() {
        let w = init(&Recipe {
            hidden: 5,
            ..Recipe::default()
        });
        let layers = to_burn(&w).unwrap();
        assert_eq!((layers[0].d_in, layers[0].d_out), (11, 5));
        assert_eq!((layers[2].d_in, layers[2].d_out), (5, 1));
        // burn [in, out] element (i, o) is exported [out, in] element (o, i).
        let fc1 = w.tensor("fc1.weight").unwrap();
        assert_eq!(layers[0].weight[3 * 5 + 2], fc1[2 * 11 + 3]);
        let mut back = Weights::zeros(w.layout.clone());
        from_burn(&layers, &mut back).unwrap();
        assert_eq!(back, w);
        assert_eq!(transpose(&transpose(fc1, 5, 11), 11, 5), fc1);
        // Not a wine-mlp.
        let other = Weights::zeros(layout(5));
        let mut wrong = Weights::zeros(Arc::new(
            Layout::new(&ModelSpec {
                name: "x".into(),
                params: [("fc1.weight".to_string(), vec![5, 11])].into(),
                lora: None,
            })
            .unwrap(),
        ));
        assert!(to_burn(&other).is_ok());
        assert!(matches!(
            to_burn(&wrong),
            Err(TrainError::LayoutMismatch(_))
        ));
        assert!(matches!(
            from_burn(&layers, &mut wrong),
            Err(TrainError::LayoutMismatch(_))
        ));
    }

    #[test]
    fn init_is_deterministic_and_bounded() {
        let r = Recipe::default();
        let a = init(&r);
        assert_eq!(a, init(&r));
        assert_ne!(a, init(&Recipe { seed: 1, ..r }));
        let b1 = (6.0f32 / 11.0).sqrt();
        let fc1 = a.tensor("fc1.weight").unwrap();
        assert!(fc1.iter().all(|v| v.abs() <= b1));
        assert!(fc1.iter().any(|v| v.abs() > 0.9 * b1));
        assert!(a.tensor("fc2.bias").unwrap().iter().all(|&v| v == 0.0));
        let fc3 = a.tensor("fc3.weight").unwrap();
        assert!(fc3.iter().all(|v| v.abs() <= (3.0f32 / 32.0).sqrt()));
        assert_eq!(a.data.len(), 32 * 32 + 14 * 32 + 1);
    }

    #[test]
    fn recipe_validation() {
        let r = Recipe::default();
        assert!(r.validate().is_ok());
        for bad in [
            Recipe {
                local_steps: 0,
                ..r
            },
            Recipe { batch_size: 0, ..r },
            Recipe {
                batch_size: MAX_BATCH_SIZE + 1,
                ..r
            },
            Recipe { hidden: 0, ..r },
            Recipe {
                hidden: MAX_HIDDEN + 1,
                ..r
            },
            Recipe { local_lr: 0.0, ..r },
            Recipe {
                local_lr: f64::NAN,
                ..r
            },
            Recipe {
                local_lr: 1e300,
                ..r
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(TrainError::InvalidRecipe(_))),
                "{bad:?}"
            );
        }
    }
}
