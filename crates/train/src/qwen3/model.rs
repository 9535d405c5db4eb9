//! The Qwen3 decoder on burn, written as functions of the parameter tensors (no burn
//! `Module`): parameters stay in the Hugging Face layout (`[out, in]` linear weights,
//! `y = x·Wᵀ`), so weights, gradients and deltas move between burn and [`Weights`] without a
//! transpose or a rename.
//!
//! The computation is transformers' `modeling_qwen3.py` (`Qwen3ForCausalLM`, eager
//! attention), checked against it by the parity fixtures (`tests/fixtures/qwen3`):
//! - `RMSNorm(x) = w ⊙ x / √(mean(x²) + ε)` over the last dimension (B. Zhang, R. Sennrich,
//!   "Root Mean Square Layer Normalization", NeurIPS 2019);
//! - attention: `q = RMSNorm_q(view(x·W_qᵀ, heads))`, `k` likewise with `k_norm`, then the
//!   rotary embedding in the `rotate_half` convention (J. Su et al., "RoFormer", 2021, as
//!   transformers lays it out: the two halves of a head, not interleaved pairs), key/value
//!   heads shared by `num_attention_heads / num_key_value_heads` query heads (query head
//!   `h` reads key/value head `h / group`; J. Ainslie et al., "GQA", 2023), scores scaled by
//!   `1/√head_dim`, causal mask, softmax, `·W_oᵀ`;
//! - MLP: `(silu(x·W_gateᵀ) ⊙ x·W_upᵀ)·W_downᵀ` (N. Shazeer, "GLU Variants Improve
//!   Transformer", 2020);
//! - pre-norm residual blocks, final norm, `lm_head` (or the embedding matrix when tied);
//! - with a LoRA adapter on a linear module (E. Hu et al., "LoRA: Low-Rank Adaptation of
//!   Large Language Models", ICLR 2022, eq. 3, as PEFT's `lora.Linear.forward`):
//!   `y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ`, `A [r, in]`, `B [out, r]`, `s = lora_alpha / r`, dropout 0.

use burn::tensor::activation::{log_softmax, silu, softmax};
use burn::tensor::module::embedding;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use hanzod_protocol::model::LINEAR_MODULES;

use super::Qwen3Config;
use crate::weights::Layout;
use crate::TrainError;

/// Where each parameter of one decoder layer sits in the parameter list (layout order).
#[derive(Debug, Clone)]
pub(crate) struct LayerIdx {
    q: usize,
    k: usize,
    v: usize,
    o: usize,
    q_norm: usize,
    k_norm: usize,
    gate: usize,
    up: usize,
    down: usize,
    input_norm: usize,
    post_norm: usize,
}

impl LayerIdx {
    /// The parameter index of linear module `m` ([`LINEAR_MODULES`] order).
    fn linear(&self, m: usize) -> usize {
        [
            self.q, self.k, self.v, self.o, self.gate, self.up, self.down,
        ][m]
    }
}

/// Where each factor of a LoRA adapter sits in the adapter's parameter list (its
/// [`Layout`]'s order): per layer, per linear module ([`LINEAR_MODULES`] order), `(A, B)` when the
/// module is adapted; and the scaling `s = lora_alpha / r`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AdapterIdx {
    pub(crate) layers: Vec<[Option<(usize, usize)>; 7]>,
    pub(crate) scale: f64,
}

impl AdapterIdx {
    /// Finds the factors of every adapted module of `cfg` in the adapter `layout` (PEFT
    /// names, `base_model.model.model.layers.N.{self_attn|mlp}.M.lora_{A,B}.weight`);
    /// [`TrainError::LayoutMismatch`] for a tensor outside the decoder layers' linear
    /// modules (e.g. an adapted `lm_head`).
    pub(crate) fn new(
        cfg: &Qwen3Config,
        layout: &Layout,
        scale: f64,
    ) -> Result<AdapterIdx, TrainError> {
        let mut layers = vec![[None; 7]; cfg.num_hidden_layers];
        let mut found = 0;
        for (i, layer) in layers.iter_mut().enumerate() {
            for (m, name) in LINEAR_MODULES.iter().enumerate() {
                let part = if m < 4 { "self_attn" } else { "mlp" };
                let base = format!("base_model.model.model.layers.{i}.{part}.{name}");
                let pos = |s: &str| {
                    let n = format!("{base}.{s}.weight");
                    layout.entries().iter().position(|e| e.name == n)
                };
                match (pos("lora_A"), pos("lora_B")) {
                    (Some(a), Some(b)) => {
                        layer[m] = Some((a, b));
                        found += 2;
                    }
                    (None, None) => {}
                    _ => {
                        return Err(TrainError::LayoutMismatch(format!(
                            "{base} has one LoRA factor without the other"
                        )))
                    }
                }
            }
        }
        if found != layout.entries().len() {
            let known: Vec<usize> = layers
                .iter()
                .flatten()
                .flatten()
                .flat_map(|&(a, b)| [a, b])
                .collect();
            let stray = layout
                .entries()
                .iter()
                .enumerate()
                .find(|(i, _)| !known.contains(i))
                .map(|(_, e)| e.name.clone())
                .unwrap_or_default();
            return Err(TrainError::LayoutMismatch(format!(
                "LoRA adapter tensor {stray} is not on a decoder layer's linear module"
            )));
        }
        Ok(AdapterIdx { layers, scale })
    }
}

/// A LoRA adapter's tensors on a device (the adapter layout's order, 2-D) with where each
/// module's factors sit.
pub(crate) type Adapter<'a> = (&'a AdapterIdx, &'a [Tensor<2>]);

/// Where each parameter sits in the parameter list, which follows the [`Layout`]'s order.
#[derive(Debug, Clone)]
pub(crate) struct ParamIdx {
    embed: usize,
    layers: Vec<LayerIdx>,
    norm: usize,
    lm_head: Option<usize>,
}

impl ParamIdx {
    /// Finds every tensor of `cfg` in `layout`; [`TrainError::LayoutMismatch`] when the
    /// layout is not exactly this configuration's ([`Qwen3Config::spec`]).
    pub(crate) fn new(cfg: &Qwen3Config, layout: &Layout) -> Result<ParamIdx, TrainError> {
        if layout.spec().params != cfg.spec().params {
            return Err(TrainError::LayoutMismatch(format!(
                "weights of {:?} ({} values) are not this qwen3 configuration's",
                layout.name(),
                layout.len()
            )));
        }
        let at = |name: &str| {
            layout
                .entries()
                .iter()
                .position(|e| e.name == name)
                .ok_or_else(|| TrainError::LayoutMismatch(format!("no tensor {name}")))
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = |s: &str| at(&format!("model.layers.{i}.{s}.weight"));
            layers.push(LayerIdx {
                q: p("self_attn.q_proj")?,
                k: p("self_attn.k_proj")?,
                v: p("self_attn.v_proj")?,
                o: p("self_attn.o_proj")?,
                q_norm: p("self_attn.q_norm")?,
                k_norm: p("self_attn.k_norm")?,
                gate: p("mlp.gate_proj")?,
                up: p("mlp.up_proj")?,
                down: p("mlp.down_proj")?,
                input_norm: p("input_layernorm")?,
                post_norm: p("post_attention_layernorm")?,
            });
        }
        Ok(ParamIdx {
            embed: at("model.embed_tokens.weight")?,
            layers,
            norm: at("model.norm.weight")?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(at("lm_head.weight")?)
            },
        })
    }
}

/// The rotary tables for positions `0..seq`: `cos`, `sin`, each `[1, 1, seq, head_dim]`,
/// computed as transformers does in f32: `inv_freq[i] = 1 / θ^(2i / head_dim)`,
/// `angle = position · inv_freq[i]` (f32 product), the table `[angle, angle]` (the two
/// halves repeated), then cos and sin of the f32 angle.
pub(crate) fn rope_tables(
    cfg: &Qwen3Config,
    seq: usize,
    device: &Device,
) -> (Tensor<4>, Tensor<4>) {
    let d = cfg.head_dim;
    let half = d / 2;
    let theta = cfg.rope_theta as f32;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32))
        .collect();
    let mut cos = Vec::with_capacity(seq * d);
    let mut sin = Vec::with_capacity(seq * d);
    for p in 0..seq {
        for _half in 0..2 {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(f64::from(a).cos() as f32);
                sin.push(f64::from(a).sin() as f32);
            }
        }
    }
    let t = |v: Vec<f32>| {
        Tensor::<4>::from_data(TensorData::new(v, [1, 1, seq, d]), (device, DType::F32))
    };
    (t(cos), t(sin))
}

/// `[1, 1, seq, seq]`: 0 on and below the diagonal, −∞ above (key after query).
fn causal_mask(seq: usize, device: &Device) -> Tensor<4> {
    let v: Vec<f32> = (0..seq * seq)
        .map(|i| {
            if i % seq > i / seq {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::<4>::from_data(TensorData::new(v, [1, 1, seq, seq]), (device, DType::F32))
}

/// RMSNorm over the last dimension with weight `w` `[1, d]`.
fn rms_norm<const D: usize>(x: Tensor<D>, w: &Tensor<2>, eps: f64) -> Tensor<D> {
    let inv = x
        .clone()
        .square()
        .mean_dim(D - 1)
        .add_scalar(eps)
        .sqrt()
        .recip();
    x * inv * w.clone().unsqueeze::<D>()
}

/// `x [B, T, in] · wᵀ` with `w [out, in]` → `[B, T, out]`.
fn linear(x: Tensor<3>, w: &Tensor<2>) -> Tensor<3> {
    let [b, t, d] = x.dims();
    let out = w.dims()[0];
    x.reshape([b * t, d])
        .matmul(w.clone().transpose())
        .reshape([b, t, out])
}

/// `x·cos + rotate_half(x)·sin`, `rotate_half([x₁, x₂]) = [−x₂, x₁]` over the last
/// dimension's halves.
fn rope(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let d = x.dims()[3];
    let x1 = x.clone().narrow(3, 0, d / 2);
    let x2 = x.clone().narrow(3, d / 2, d / 2);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos.clone() + rotated * sin.clone()
}

/// Repeats each key/value head `group` times: `[B, kv, T, d]` → `[B, kv·group, T, d]`,
/// query head `h` reading head `h / group` (transformers' `repeat_kv`).
fn repeat_kv(x: Tensor<4>, group: usize) -> Tensor<4> {
    if group == 1 {
        return x;
    }
    let [b, kv, t, d] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .repeat_dim(2, group)
        .reshape([b, kv * group, t, d])
}

/// The logits `[B, T, vocab]` of `tokens` `[B, T]` under `params` (layout order, every
/// tensor 2-D: vectors as `[1, d]`) and, when given, a LoRA `adapter` on the decoder
/// layers' linear modules. `cos`/`sin` are [`rope_tables`] for at least `T` positions
/// (narrowed here).
pub(crate) fn logits(
    cfg: &Qwen3Config,
    idx: &ParamIdx,
    params: &[Tensor<2>],
    adapter: Option<Adapter<'_>>,
    tokens: Tensor<2, Int>,
    tables: &(Tensor<4>, Tensor<4>),
    device: &Device,
) -> Tensor<3> {
    let [b, t] = tokens.dims();
    let (h, kv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let eps = cfg.rms_norm_eps;
    let cos = tables.0.clone().narrow(2, 0, t);
    let sin = tables.1.clone().narrow(2, 0, t);
    let mask = causal_mask(t, device);
    let scale = 1.0 / (d as f64).sqrt();
    let mut x = embedding(params[idx.embed].clone(), tokens);
    for (i, l) in idx.layers.iter().enumerate() {
        // Linear module `m` of this layer, with its adapter when it has one.
        let proj = |x: Tensor<3>, m: usize| -> Tensor<3> {
            let base = linear(x.clone(), &params[l.linear(m)]);
            match adapter.and_then(|(a, t)| a.layers[i][m].map(|f| (f, a.scale, t))) {
                Some(((fa, fb), s, t)) => base + linear(linear(x, &t[fa]), &t[fb]).mul_scalar(s),
                None => base,
            }
        };
        let n = rms_norm(x.clone(), &params[l.input_norm], eps);
        let q = rms_norm(
            proj(n.clone(), 0).reshape([b, t, h, d]),
            &params[l.q_norm],
            eps,
        )
        .swap_dims(1, 2);
        let k = rms_norm(
            proj(n.clone(), 1).reshape([b, t, kv, d]),
            &params[l.k_norm],
            eps,
        )
        .swap_dims(1, 2);
        let v = proj(n, 2).reshape([b, t, kv, d]).swap_dims(1, 2);
        let q = rope(q, &cos, &sin);
        let k = repeat_kv(rope(k, &cos, &sin), cfg.group());
        let v = repeat_kv(v, cfg.group());
        let scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale) + mask.clone();
        let attn = softmax(scores, 3)
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([b, t, h * d]);
        x = x + proj(attn, 3);
        let n = rms_norm(x.clone(), &params[l.post_norm], eps);
        let mlp = silu(proj(n.clone(), 4)) * proj(n, 5);
        x = x + proj(mlp, 6);
    }
    let x = rms_norm(x, &params[idx.norm], eps);
    linear(x, &params[idx.lm_head.unwrap_or(idx.embed)])
}

/// The negative log-likelihood of each next token, `[B·(T−1)]` in nats, row-major by
/// sequence then position: position `j` of sequence `i` scores `tokens[i][j+1]` under the
/// logits at `j` (the causal-LM shift of transformers' `ForCausalLMLoss`).
pub(crate) fn next_token_nll(logits: Tensor<3>, tokens: Tensor<2, Int>) -> Tensor<1> {
    let [b, t, v] = logits.dims();
    let n = b * (t - 1);
    let logp = log_softmax(logits.narrow(1, 0, t - 1).reshape([n, v]), 1);
    let targets = tokens.narrow(1, 1, t - 1).reshape([n, 1]);
    logp.gather(1, targets).reshape([n]).neg()
}
