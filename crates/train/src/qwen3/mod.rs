//! Qwen3 causal language models (transformers' `Qwen3ForCausalLM`) on burn: the
//! architecture from a Hugging Face `config.json` ([`Qwen3Config`]), weights in
//! [`Weights`] with exactly the Hugging Face tensor names and `[out, in]` shapes (so
//! `model.safetensors` loads and saves unchanged), the forward pass and its next-token
//! cross-entropy, gradients by burn autodiff, and local training with AdamW ([`AdamW`]).
//!
//! Units: losses are mean next-token cross-entropy in **nats/token** (natural log);
//! perplexity is `exp(loss)`.
//!
//! Device: the process's [`crate::backend`] — burn's flex CPU backend by default,
//! single-threaded (this crate does not enable burn's `rayon`), so the same inputs give
//! bit-identical results on one machine; a GPU with the crate's `cuda` or `wgpu` feature
//! and `hanzod node --device cuda`. The computation is written against burn's
//! device-generic `Tensor`, so the GPU runs the same code; parameters and optimizer moments stay on the device
//! across the local steps and come back to the host once per [`Qwen3::train`] call.

mod config;
mod model;

use std::sync::Arc;

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};

pub use config::{
    ConfigError, Qwen3Config, MAX_HEADS, MAX_HEAD_DIM, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS,
    MAX_POSITIONS, MAX_VOCAB,
};
use hanzod_protocol::model::LINEAR_MODULES;
use model::{AdapterIdx, ParamIdx};

use crate::backend::device;
use crate::mlp::read_any;
use crate::weights::{Layout, Weights};
use crate::TrainError;

/// A Qwen3 model of one configuration: its layout and where each parameter sits. Cheap to
/// clone (the layout is shared).
#[derive(Debug, Clone)]
pub struct Qwen3 {
    cfg: Qwen3Config,
    layout: Arc<Layout>,
    idx: ParamIdx,
}

/// A batch of token sequences: `tokens` is `[batch, seq]` row-major, every id below the
/// vocabulary size, `2 ≤ seq ≤ max_position_embeddings`.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The token ids, `batch × seq` of them.
    pub tokens: &'a [u32],
    /// Number of sequences.
    pub batch: usize,
}

/// A sum of next-token losses: `nll` nats over `tokens` predicted tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NllSum {
    /// Σ −ln p(next token), in nats, accumulated in f64 in token order.
    pub nll: f64,
    /// How many tokens were predicted (`batch × (seq − 1)` per batch).
    pub tokens: u64,
}

impl NllSum {
    /// The mean cross-entropy in nats/token (NaN for no tokens).
    pub fn mean(&self) -> f64 {
        self.nll / self.tokens as f64
    }

    /// Adds another sum (for a loss over several batches).
    pub fn add(&mut self, other: NllSum) {
        self.nll += other.nll;
        self.tokens += other.tokens;
    }
}

/// The AdamW optimizer of the local steps (I. Loshchilov, F. Hutter, "Decoupled Weight
/// Decay Regularization", ICLR 2019), in PyTorch's `torch.optim.AdamW` form, per element in
/// f32 at step `t` (1-based) with gradient `g`:
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `w ← w·(1 − lr·λ)` (matrices only: every
/// 2-D weight, embeddings included; RMSNorm weights are not decayed), then
/// `w ← w − (lr / (1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Learning rate `lr`.
    pub lr: f64,
    /// `β₁`, the first moment's decay.
    pub beta1: f64,
    /// `β₂`, the second moment's decay.
    pub beta2: f64,
    /// `ε`, added to the second moment's root.
    pub eps: f64,
    /// `λ`, the decoupled weight decay.
    pub weight_decay: f64,
}

impl Default for AdamW {
    /// PyTorch's defaults but the learning rate: `lr 1e-3, β (0.9, 0.999), ε 1e-8, λ 0.01`.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamW {
    /// [`TrainError::InvalidRecipe`] unless `lr > 0`, `0 ≤ β₁, β₂ < 1`, `ε > 0` and
    /// `λ ≥ 0`, all finite in f32.
    pub fn validate(&self) -> Result<(), TrainError> {
        let f = |v: f64| (v as f32).is_finite();
        let ok = f(self.lr)
            && self.lr > 0.0
            && f(self.beta1)
            && (0.0..1.0).contains(&self.beta1)
            && f(self.beta2)
            && (0.0..1.0).contains(&self.beta2)
            && f(self.eps)
            && self.eps > 0.0
            && f(self.weight_decay)
            && self.weight_decay >= 0.0;
        if ok {
            Ok(())
        } else {
            Err(TrainError::InvalidRecipe(format!("adamw {self:?}")))
        }
    }
}

/// A node's AdamW state between local runs: the step count and both moments (layout of the
/// model's weights). It is the node's own: it never leaves the node.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    /// Steps taken so far (`t` of the bias corrections).
    pub step: u64,
    /// First moment `m`.
    pub m: Weights,
    /// Second moment `v`.
    pub v: Weights,
}

/// What one [`Qwen3::train`] call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct LmRun {
    /// The weights after the last step.
    pub weights: Weights,
    /// The optimizer state after the last step.
    pub state: AdamState,
    /// `losses[k]`: the mean cross-entropy (nats/token) of batch `k` under the weights before
    /// its update (`losses[0]` is the start weights' loss on the first batch: what a node
    /// claims).
    pub losses: Vec<f64>,
}

impl Qwen3 {
    /// The model of `cfg` (its layout from [`Qwen3Config::spec`]).
    pub fn new(cfg: Qwen3Config) -> Result<Qwen3, TrainError> {
        let layout = Arc::new(Layout::new(&cfg.spec())?);
        let idx = ParamIdx::new(&cfg, &layout)?;
        Ok(Qwen3 { cfg, layout, idx })
    }

    /// The architecture.
    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }

    /// The weights' layout (Hugging Face names, name order).
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    /// Number of parameters (tied embeddings counted once).
    pub fn param_count(&self) -> usize {
        self.layout.len()
    }

    /// Initial weights, deterministic in `seed`: ChaCha20 seeded with
    /// SHA-256(`"hanzod-qwen3-init-v1"` ‖ seed u64 LE) fills the layout in order, each
    /// linear and embedding weight `N(0, initializer_range²)` by the Box–Muller transform of
    /// two 24-bit uniforms (`u₁ ∈ (0, 1]`, `u₂ ∈ [0, 1)`: `√(−2 ln u₁)·cos(2πu₂)`,
    /// computed in f64), as transformers' `_init_weights`; every RMSNorm weight 1.
    pub fn init(&self, seed: u64) -> Weights {
        let mut h = Sha256::new();
        h.update(hanzod_actors::domain::QWEN3_INIT);
        h.update(seed.to_le_bytes());
        let mut rng = ChaCha20Rng::from_seed(h.finalize().into());
        let std = self.cfg.initializer_range;
        let mut w = Weights::zeros(self.layout.clone());
        for e in self.layout.entries() {
            let values = &mut w.data[e.offset..e.offset + e.len];
            if e.shape.len() == 1 {
                values.fill(1.0);
                continue;
            }
            for v in values {
                let u1 = 1.0 - f64::from(crate::unit_f32(&mut rng));
                let u2 = f64::from(crate::unit_f32(&mut rng));
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                *v = (z * std) as f32;
            }
        }
        w
    }

    /// Checks `w` is this model's and finite, and `batch` well formed.
    fn check(&self, w: &Weights, batch: &Batch<'_>) -> Result<usize, TrainError> {
        if *w.layout != *self.layout {
            return Err(TrainError::LayoutMismatch(format!(
                "weights of {:?} ({} values) are not this qwen3's ({} values)",
                w.layout.name(),
                w.data.len(),
                self.layout.len()
            )));
        }
        w.check_finite()?;
        self.seq_len(batch)
    }

    /// The sequence length of `batch`, or [`TrainError::InvalidRecipe`] when the batch is
    /// empty, ragged, shorter than 2 tokens, longer than the model's positions, or holds a
    /// token outside the vocabulary.
    fn seq_len(&self, batch: &Batch<'_>) -> Result<usize, TrainError> {
        let bad = |m: String| Err(TrainError::InvalidRecipe(m));
        if batch.batch == 0
            || batch.tokens.is_empty()
            || !batch.tokens.len().is_multiple_of(batch.batch)
        {
            return bad(format!(
                "{} tokens do not make {} equal sequences",
                batch.tokens.len(),
                batch.batch
            ));
        }
        let seq = batch.tokens.len() / batch.batch;
        if seq < 2 || seq > self.cfg.max_position_embeddings {
            return bad(format!(
                "sequence of {seq} tokens (2 to {})",
                self.cfg.max_position_embeddings
            ));
        }
        if let Some(t) = batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= self.cfg.vocab_size)
        {
            return bad(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab_size
            ));
        }
        Ok(seq)
    }

    /// Every tensor of `w` as a 2-D tensor on `device` (vectors as `[1, d]`), layout order.
    fn upload(&self, w: &Weights, device: &Device) -> Vec<Tensor<2>> {
        w.layout
            .entries()
            .iter()
            .map(|e| {
                let shape = match e.shape[..] {
                    [rows, cols] => [rows, cols],
                    _ => [1, e.len],
                };
                let v = w.data[e.offset..e.offset + e.len].to_vec();
                Tensor::<2>::from_data(TensorData::new(v, shape), (device, DType::F32))
            })
            .collect()
    }

    /// Reads 2-D tensors in `layout`'s order back into one [`Weights`].
    fn download(
        &self,
        layout: &Arc<Layout>,
        tensors: Vec<Tensor<2>>,
    ) -> Result<Weights, TrainError> {
        let mut data = Vec::with_capacity(layout.len());
        for t in tensors {
            data.extend(read_any(t)?);
        }
        Weights::from_vec(layout.clone(), data)
    }

    fn tokens(batch: &Batch<'_>, seq: usize, device: &Device) -> Tensor<2, Int> {
        let ids: Vec<i64> = batch.tokens.iter().map(|&t| i64::from(t)).collect();
        Tensor::<2, Int>::from_data(TensorData::new(ids, [batch.batch, seq]), device)
    }

    /// The logits of `batch` under `w`: `[batch, seq, vocab]` row-major, f32.
    ///
    /// Errors: weights not of this model or not finite, a malformed batch.
    pub fn logits(&self, w: &Weights, batch: Batch<'_>) -> Result<Vec<f32>, TrainError> {
        read_any(self.forward(w, None, batch)?.0)
    }

    /// The next-token loss of `batch` under `w` (forward only): what validation and the
    /// spot-check compute. Per-token losses come back to the host and are summed in f64 in
    /// token order, so the sum does not depend on a device's reduction order.
    ///
    /// Errors: as [`Qwen3::logits`], and [`TrainError::NonFinite`] for a non-finite loss.
    pub fn nll(&self, w: &Weights, batch: Batch<'_>) -> Result<NllSum, TrainError> {
        let (logits, tokens) = self.forward(w, None, batch)?;
        nll_sum(model::next_token_nll(logits, tokens))
    }

    /// The forward pass of `batch` under `w` (with a LoRA adapter when given) on the plain
    /// device: the logits `[batch, seq, vocab]` and the token ids `[batch, seq]`, after the
    /// checks of [`Qwen3::logits`] (and of the adapter against its shape).
    fn forward(
        &self,
        w: &Weights,
        lora: Option<(&LoraShape, &Weights)>,
        batch: Batch<'_>,
    ) -> Result<(Tensor<3>, Tensor<2, Int>), TrainError> {
        let seq = match lora {
            None => self.check(w, &batch)?,
            Some((shape, adapter)) => {
                self.check_lora(w, shape, adapter)?;
                self.seq_len(&batch)?
            }
        };
        let device = device();
        let params = self.upload(w, &device);
        let factors = lora.map(|(shape, adapter)| (&shape.idx, self.upload(adapter, &device)));
        let rope = model::rope_tables(&self.cfg, seq, &device);
        let tokens = Self::tokens(&batch, seq, &device);
        let logits = model::logits(
            &self.cfg,
            &self.idx,
            &params,
            factors.as_ref().map(|(idx, f)| (*idx, &f[..])),
            tokens.clone(),
            &rope,
            &device,
        );
        Ok((logits, tokens))
    }

    /// The mean next-token loss of `batch` (nats/token) and its gradient with respect to
    /// every parameter (layout of `w`), by burn autodiff.
    ///
    /// Errors: as [`Qwen3::nll`]; [`TrainError::Backend`] when autodiff returns no gradient.
    pub fn loss_and_grads(
        &self,
        w: &Weights,
        batch: Batch<'_>,
    ) -> Result<(f64, Weights), TrainError> {
        let seq = self.check(w, &batch)?;
        let device = device().autodiff();
        let leaves: Vec<Tensor<2>> = self
            .upload(w, &device)
            .into_iter()
            .map(Tensor::require_grad)
            .collect();
        let (loss, grads) = self.step_grads(&leaves, None, &batch, seq, &device)?;
        Ok((loss.mean(), self.download(&self.layout, grads)?))
    }

    /// One forward and backward pass: the batch's loss and each leaf's gradient (plain,
    /// non-autodiff tensors, layout order). The leaves are the model's parameters, or with
    /// `lora` = (frozen base parameters, adapter) the adapter's factors.
    fn step_grads(
        &self,
        leaves: &[Tensor<2>],
        lora: Option<(&[Tensor<2>], &AdapterIdx)>,
        batch: &Batch<'_>,
        seq: usize,
        device: &Device,
    ) -> Result<(NllSum, Vec<Tensor<2>>), TrainError> {
        let rope = model::rope_tables(&self.cfg, seq, device);
        let tokens = Self::tokens(batch, seq, device);
        let logits = match lora {
            None => model::logits(
                &self.cfg,
                &self.idx,
                leaves,
                None,
                tokens.clone(),
                &rope,
                device,
            ),
            Some((base, a)) => model::logits(
                &self.cfg,
                &self.idx,
                base,
                Some((a, leaves)),
                tokens.clone(),
                &rope,
                device,
            ),
        };
        let nll = model::next_token_nll(logits, tokens);
        let sum = nll_sum(nll.clone().inner())?;
        let grads = nll.mean().backward();
        let grads = leaves
            .iter()
            .map(|l| {
                l.grad(&grads)
                    .ok_or_else(|| TrainError::Backend("autodiff returned no gradient".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((sum, grads))
    }

    /// Local training from `start`: one AdamW step ([`AdamW`]) per batch of `batches`, in
    /// order, continuing `state` (a fresh state when `None`). Parameters and moments stay on
    /// the device for the whole run.
    ///
    /// Errors: an invalid optimizer, weights or state not of this model, a malformed batch,
    /// a non-finite loss or weight (a diverging learning rate).
    pub fn train<'a>(
        &self,
        start: &Weights,
        state: Option<AdamState>,
        opt: &AdamW,
        batches: impl IntoIterator<Item = Batch<'a>>,
    ) -> Result<LmRun, TrainError> {
        if *start.layout != *self.layout {
            return Err(TrainError::LayoutMismatch(
                "start weights are not this qwen3's".into(),
            ));
        }
        self.adamw(start, None, state, opt, batches)
    }

    /// Local LoRA training: the base weights `base` stay frozen and one AdamW step per batch
    /// updates the adapter `start` (layout [`LoraShape::layout`]) through the LoRA forward
    /// ([`Qwen3::lora_nll`]), continuing `state` (of the adapter's layout). The run's
    /// `weights` are the adapter after the last step.
    ///
    /// Errors: as [`Qwen3::train`]; base weights not of this model, an adapter or state
    /// not of `lora`.
    pub fn train_lora<'a>(
        &self,
        base: &Weights,
        lora: &LoraShape,
        start: &Weights,
        state: Option<AdamState>,
        opt: &AdamW,
        batches: impl IntoIterator<Item = Batch<'a>>,
    ) -> Result<LmRun, TrainError> {
        self.check_lora(base, lora, start)?;
        let frozen = self.upload(base, &device().autodiff());
        self.adamw(start, Some((&frozen, &lora.idx)), state, opt, batches)
    }

    /// Checks `base` is this model's and finite, `adapter` is `lora`'s and finite.
    fn check_lora(
        &self,
        base: &Weights,
        lora: &LoraShape,
        adapter: &Weights,
    ) -> Result<(), TrainError> {
        if *base.layout != *self.layout {
            return Err(TrainError::LayoutMismatch(
                "base weights are not this qwen3's".into(),
            ));
        }
        if *adapter.layout != *lora.layout {
            return Err(TrainError::LayoutMismatch(format!(
                "adapter of {:?} is not {:?}",
                adapter.layout.name(),
                lora.layout.name()
            )));
        }
        base.check_finite()?;
        adapter.check_finite()
    }

    /// The AdamW loop of [`Qwen3::train`] and [`Qwen3::train_lora`] over the tensors of
    /// `start` (the model's, or an adapter's with its frozen base).
    fn adamw<'a>(
        &self,
        start: &Weights,
        lora: Option<(&[Tensor<2>], &AdapterIdx)>,
        state: Option<AdamState>,
        opt: &AdamW,
        batches: impl IntoIterator<Item = Batch<'a>>,
    ) -> Result<LmRun, TrainError> {
        opt.validate()?;
        start.check_finite()?;
        let layout = start.layout.clone();
        let state = match state {
            Some(s) if *s.m.layout == *layout && *s.v.layout == *layout => s,
            Some(_) => {
                return Err(TrainError::LayoutMismatch(
                    "optimizer state is not of the trained tensors' layout".into(),
                ))
            }
            None => AdamState {
                step: 0,
                m: Weights::zeros(layout.clone()),
                v: Weights::zeros(layout.clone()),
            },
        };
        let plain = device();
        let ad = plain.clone().autodiff();
        let mut w = self.upload(start, &plain);
        let mut m = self.upload(&state.m, &plain);
        let mut v = self.upload(&state.v, &plain);
        let decayed: Vec<bool> = layout
            .entries()
            .iter()
            .map(|e| e.shape.len() == 2)
            .collect();
        let mut t = state.step;
        let mut losses = Vec::new();
        for batch in batches {
            let seq = self.seq_len(&batch)?;
            let leaves: Vec<Tensor<2>> = w
                .iter()
                .map(|p| p.clone().autodiff().require_grad())
                .collect();
            let (loss, grads) = self.step_grads(&leaves, lora, &batch, seq, &ad)?;
            let loss = loss.mean();
            if !loss.is_finite() {
                return Err(TrainError::NonFinite(format!(
                    "loss {loss} at local step {}",
                    losses.len()
                )));
            }
            losses.push(loss);
            t += 1;
            let bc1 = 1.0 - opt.beta1.powf(t as f64);
            let bc2 = 1.0 - opt.beta2.powf(t as f64);
            for (i, g) in grads.into_iter().enumerate() {
                m[i] = m[i].clone().mul_scalar(opt.beta1) + g.clone().mul_scalar(1.0 - opt.beta1);
                v[i] = v[i].clone().mul_scalar(opt.beta2) + g.square().mul_scalar(1.0 - opt.beta2);
                let mut p = w[i].clone();
                if decayed[i] && opt.weight_decay > 0.0 {
                    p = p.mul_scalar(1.0 - opt.lr * opt.weight_decay);
                }
                let denom = v[i]
                    .clone()
                    .sqrt()
                    .div_scalar(bc2.sqrt())
                    .add_scalar(opt.eps);
                w[i] = p - m[i].clone().div(denom).mul_scalar(opt.lr / bc1);
            }
        }
        let weights = self.download(&layout, w)?;
        weights.check_finite()?;
        Ok(LmRun {
            weights,
            state: AdamState {
                step: t,
                m: self.download(&layout, m)?,
                v: self.download(&layout, v)?,
            },
            losses,
        })
    }
}

/// A LoRA adapter's shape on one [`Qwen3`] (E. Hu et al., "LoRA: Low-Rank Adaptation of
/// Large Language Models", ICLR 2022; PEFT's `LoraConfig`): rank `r`, `lora_alpha`, the
/// target modules, and the adapter's tensors with PEFT names
/// (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight [r, in]`,
/// `….lora_B.weight [out, r]`; [`hanzod_protocol::model::ModelSpec::lora_spec`]).
/// `ΔW = (lora_alpha / r)·B·A` per adapted module.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraShape {
    rank: usize,
    alpha: f64,
    target_modules: Vec<String>,
    layout: Arc<Layout>,
    idx: AdapterIdx,
}

impl LoraShape {
    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// PEFT's `lora_alpha`.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// PEFT's `scaling = lora_alpha / r`, as an f32 (alpha rounded to f32, the quotient
    /// rounded once).
    pub fn scaling(&self) -> f64 {
        self.idx.scale
    }

    /// The adapted module names (PEFT `target_modules`), as given.
    pub fn target_modules(&self) -> &[String] {
        &self.target_modules
    }

    /// The adapter's tensors (PEFT names, name order); its spec is of kind LoRA.
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }
}

/// Most LoRA rank a job may ask for.
pub const MAX_LORA_RANK: usize = 1024;

/// Smallest `lora_alpha` a job may ask for (the scaling `alpha / r` stays a normal f32).
pub const MIN_LORA_ALPHA: f64 = 1e-3;

/// Largest `lora_alpha` a job may ask for.
pub const MAX_LORA_ALPHA: f64 = 1e6;

impl Qwen3 {
    /// The LoRA adapter of rank `rank` (1 to [`MAX_LORA_RANK`] and at most every adapted
    /// module's smaller side), `lora_alpha` `alpha` (finite, > 0) on the decoder layers'
    /// linear modules named by `target_modules` (PEFT names: `q_proj`, `k_proj`, `v_proj`,
    /// `o_proj`, `gate_proj`, `up_proj`, `down_proj`; each must match).
    ///
    /// Errors: [`TrainError::InvalidRecipe`] for a bad rank, alpha or target (an unknown
    /// name, or `lm_head`/`embed_tokens`, which this trainer does not adapt).
    pub fn lora(
        &self,
        rank: usize,
        alpha: f64,
        target_modules: &[String],
    ) -> Result<LoraShape, TrainError> {
        let bad = |m: String| Err(TrainError::InvalidRecipe(m));
        if rank == 0 || rank > MAX_LORA_RANK {
            return bad(format!("LoRA rank {rank} (1 to {MAX_LORA_RANK})"));
        }
        if !(MIN_LORA_ALPHA..=MAX_LORA_ALPHA).contains(&alpha) {
            return bad(format!(
                "lora_alpha {alpha} ({MIN_LORA_ALPHA:e} to {MAX_LORA_ALPHA:e})"
            ));
        }
        if target_modules.is_empty() {
            return bad("no LoRA target_modules".into());
        }
        if let Some(t) = target_modules
            .iter()
            .find(|t| !LINEAR_MODULES.contains(&t.as_str()))
        {
            return bad(format!(
                "LoRA target {:?} is not one of {:?}",
                t, LINEAR_MODULES
            ));
        }
        let targets: Vec<&str> = target_modules.iter().map(String::as_str).collect();
        let spec = self
            .layout
            .spec()
            .lora_spec(rank, &targets)
            .map_err(|e| TrainError::InvalidRecipe(e.to_string()))?;
        if let Some((name, shape)) = spec
            .params
            .iter()
            .find(|(_, s)| s.iter().any(|&d| d < rank))
        {
            return bad(format!(
                "LoRA rank {rank} exceeds a side of {name} {shape:?}"
            ));
        }
        let layout = Arc::new(Layout::new(&spec)?);
        // The scaling as the merge computes it (`pipeline::lora::LoraPlan::scaling`): alpha
        // rounded to f32, divided by r in f64, rounded once to f32; so the node's forward
        // and the orchestrator's ΔW use the same factor, bit for bit.
        let scale = f64::from((f64::from(alpha as f32) / rank as f64) as f32);
        let idx = AdapterIdx::new(&self.cfg, &layout, scale)?;
        Ok(LoraShape {
            rank,
            alpha,
            target_modules: target_modules.to_vec(),
            layout,
            idx,
        })
    }

    /// A fresh adapter, deterministic in `seed`: every `B` zero (so the adapter starts as
    /// the identity update, as PEFT's default `init_lora_weights=True`), every `A` drawn
    /// uniformly from `[−1/√in, 1/√in)` — the bound of PEFT's
    /// `kaiming_uniform_(a=√5)` — by ChaCha20 seeded with `seed`, one 24-bit uniform `u`
    /// per element in layout order (`A = (2u − 1)/√in`).
    pub fn init_lora(&self, lora: &LoraShape, seed: [u8; 32]) -> Weights {
        let mut rng = ChaCha20Rng::from_seed(seed);
        let mut w = Weights::zeros(lora.layout.clone());
        for e in lora.layout.entries() {
            if !e.name.ends_with(".lora_A.weight") {
                continue;
            }
            let bound = 1.0 / (e.shape[1] as f32).sqrt();
            for v in &mut w.data[e.offset..e.offset + e.len] {
                *v = (2.0 * crate::unit_f32(&mut rng) - 1.0) * bound;
            }
        }
        w
    }

    /// The logits of `batch` under `w` with `adapter` (`[batch, seq, vocab]`, f32).
    ///
    /// Errors: as [`Qwen3::logits`]; an adapter not of `lora`.
    pub fn lora_logits(
        &self,
        w: &Weights,
        lora: &LoraShape,
        adapter: &Weights,
        batch: Batch<'_>,
    ) -> Result<Vec<f32>, TrainError> {
        read_any(self.forward(w, Some((lora, adapter)), batch)?.0)
    }

    /// The next-token loss of `batch` under `w` with `adapter` (forward only).
    ///
    /// Errors: as [`Qwen3::nll`]; an adapter not of `lora`.
    pub fn lora_nll(
        &self,
        w: &Weights,
        lora: &LoraShape,
        adapter: &Weights,
        batch: Batch<'_>,
    ) -> Result<NllSum, TrainError> {
        let (logits, tokens) = self.forward(w, Some((lora, adapter)), batch)?;
        nll_sum(model::next_token_nll(logits, tokens))
    }

    /// The mean next-token loss of `batch` (nats/token) under `w` with `adapter`, and its
    /// gradient with respect to every adapter factor (the adapter's layout); `w` is frozen.
    ///
    /// Errors: as [`Qwen3::loss_and_grads`]; an adapter not of `lora`.
    pub fn lora_loss_and_grads(
        &self,
        w: &Weights,
        lora: &LoraShape,
        adapter: &Weights,
        batch: Batch<'_>,
    ) -> Result<(f64, Weights), TrainError> {
        self.check_lora(w, lora, adapter)?;
        let seq = self.seq_len(&batch)?;
        let device = device().autodiff();
        let frozen = self.upload(w, &device);
        let leaves: Vec<Tensor<2>> = self
            .upload(adapter, &device)
            .into_iter()
            .map(Tensor::require_grad)
            .collect();
        let (loss, grads) =
            self.step_grads(&leaves, Some((&frozen, &lora.idx)), &batch, seq, &device)?;
        Ok((loss.mean(), self.download(&lora.layout, grads)?))
    }
}

/// How [`Qwen3::generate`] picks each token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 picks the most likely token (greedy; ties to the lowest id).
    pub temperature: f64,
    /// Seeds the draws when `temperature > 0`: ChaCha20 seeded with SHA-256(seed u64 LE),
    /// one 24-bit uniform per token, inverted through the cumulative distribution.
    pub seed: u64,
}

impl Qwen3 {
    /// Continues `prompt` (token ids, at least one) by `max_new` tokens, one forward pass
    /// per token over the last `max_position_embeddings` tokens (no key/value cache: the
    /// models this runs on CPU are small). Stops early at `stop` when given. Returns only
    /// the new tokens.
    ///
    /// Errors: weights not of this model, an empty prompt, a token outside the
    /// vocabulary, a temperature that is negative or not finite.
    pub fn generate(
        &self,
        w: &Weights,
        prompt: &[u32],
        max_new: usize,
        sampling: Sampling,
        stop: Option<u32>,
    ) -> Result<Vec<u32>, TrainError> {
        if prompt.is_empty() {
            return Err(TrainError::InvalidRecipe("an empty prompt".into()));
        }
        let t = sampling.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(TrainError::InvalidRecipe(format!("temperature {t}")));
        }
        let mut h = Sha256::new();
        h.update(sampling.seed.to_le_bytes());
        let mut rng = ChaCha20Rng::from_seed(h.finalize().into());
        let mut tokens = prompt.to_vec();
        let vocab = self.cfg.vocab_size;
        let window = self.cfg.max_position_embeddings;
        for _ in 0..max_new {
            let context = &tokens[tokens.len().saturating_sub(window)..];
            let logits = self.last_logits(w, context)?;
            debug_assert_eq!(logits.len(), vocab);
            let next = if t == 0.0 {
                argmax(&logits)
            } else {
                sample(&logits, t, crate::unit_f32(&mut rng))
            };
            tokens.push(next);
            if Some(next) == stop {
                break;
            }
        }
        Ok(tokens.split_off(prompt.len()))
    }

    /// The logits `[vocab]` of the position after `context` (1 ≤ len ≤ positions).
    fn last_logits(&self, w: &Weights, context: &[u32]) -> Result<Vec<f32>, TrainError> {
        if *w.layout != *self.layout {
            return Err(TrainError::LayoutMismatch(
                "weights are not this qwen3's".into(),
            ));
        }
        if let Some(t) = context.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(TrainError::InvalidRecipe(format!(
                "token id {t} is outside the vocabulary of {}",
                self.cfg.vocab_size
            )));
        }
        let device = device();
        let seq = context.len();
        let params = self.upload(w, &device);
        let rope = model::rope_tables(&self.cfg, seq, &device);
        let tokens = Self::tokens(
            &Batch {
                tokens: context,
                batch: 1,
            },
            seq,
            &device,
        );
        let logits = model::logits(&self.cfg, &self.idx, &params, None, tokens, &rope, &device);
        read_any(logits.narrow(1, seq - 1, 1).reshape([self.cfg.vocab_size]))
    }
}

/// The index of the largest value (the first of equal ones).
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Draws from softmax(logits / t) with the uniform `u ∈ [0, 1)`: the first index whose
/// cumulative probability (f64) exceeds `u`.
fn sample(logits: &[f32], t: f64, u: f32) -> u32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let weights: Vec<f64> = logits
        .iter()
        .map(|&x| ((f64::from(x) - f64::from(max)) / t).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let target = f64::from(u) * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if acc > target {
            return i as u32;
        }
    }
    argmax(logits)
}

/// Reads per-token losses back and sums them in f64 in order.
fn nll_sum(nll: Tensor<1>) -> Result<NllSum, TrainError> {
    let v = read_any(nll)?;
    let sum: f64 = v.iter().map(|&x| f64::from(x)).sum();
    if !sum.is_finite() {
        return Err(TrainError::NonFinite(format!("next-token loss sum {sum}")));
    }
    Ok(NllSum {
        nll: sum,
        tokens: v.len() as u64,
    })
}

#[cfg(test)]
mod parity;
