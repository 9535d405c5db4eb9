//! Language-model jobs: a [`Qwen3`] trained on a text corpus ([`TextData`]) with AdamW,
//! each node on its own replayable batch stream, validated by held-out cross-entropy.
//!
//! Units: every loss is the mean next-token cross-entropy in **nats/token**.
//!
//! The recipe ([`LmRecipe`]) fixes everything a run depends on besides the node key and the
//! step, so a validator can replay it:
//! - node `n`'s batch at global step `s`: the windows [`text::batch_windows`]`(seed, job,
//!   n, s, batch_size, seq_len, train_len)` of `seq_len + 1` tokens;
//! - the validation shard: [`text::validation_windows`]`(validation_len, seq_len,
//!   validation_tokens)`, the same for every node and validator;
//! - local training: `local_steps` AdamW steps ([`AdamW`]) from the epoch's checkpoint,
//!   **starting from zero moments every epoch**. The moments are the node's own and never
//!   leave it; resetting them makes a node's whole local run a function of (checkpoint,
//!   recipe, node, step), so the spot-check can re-execute it (DESIGN §6). Keeping them
//!   across epochs (as DiLoCo does) would leave nothing to replay against.
//! - LoRA jobs ([`LmTask::with_lora`]): the epoch's checkpoint stays frozen and each node
//!   trains a fresh adapter ([`LmTask::init_adapter`]: `B = 0`, `A` seeded by the job and
//!   the epoch's first step, the same for every node) through the LoRA forward; its delta
//!   is the adapter itself, PEFT-named factors whose update `ΔW = (alpha/r)·B·A` the
//!   validator and the merge apply to the full checkpoint. The next epoch starts from the
//!   merged full model and a fresh adapter again.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::qwen3::{AdamW, Batch, LoraShape, NllSum, Qwen3, Qwen3Config};
use crate::text::{self, TextData};
use crate::weights::{Layout, Weights};
use crate::{LocalRun, TrainError};

/// The built-in language model's name ([`qwen3_tiny`]).
pub const QWEN3_TINY: &str = "qwen3-tiny";

/// The model name of a Qwen3 whose architecture the job spec gives (a `config.json`).
pub const QWEN3: &str = "qwen3";

/// Longest sequence a recipe may ask for, tokens.
pub const MAX_SEQ_LEN: u32 = 8192;

/// Most sequences per step a recipe may ask for.
pub const MAX_LM_BATCH: u32 = 1024;

/// Most validation tokens a recipe may ask for (the daemon's budget is usually lower).
pub const MAX_VALIDATION_TOKENS: u64 = 1 << 24;

/// Sequences per forward pass when scoring the validation shard (bounds the logits held:
/// `VALIDATION_CHUNK × seq_len × vocab` floats).
pub const VALIDATION_CHUNK: usize = 8;

/// `qwen3-tiny`: a 4-layer Qwen3 of 1.05 M parameters for the built-in tokenizer
/// (vocabulary [`text::AUSTEN_VOCAB`] = 2,048): hidden 128, MLP 384, 4 query heads and 2
/// key/value heads of 32, tied embeddings, RMSNorm ε 1e-6, rotary θ 1,000,000 (Qwen3's),
/// 512 positions, initial std 0.02. Small enough to train visibly on two CPU cores.
pub fn qwen3_tiny() -> Qwen3Config {
    let tokenizer = text::Tokenizer::austen();
    Qwen3Config {
        vocab_size: text::AUSTEN_VOCAB,
        hidden_size: 128,
        intermediate_size: 384,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 512,
        tie_word_embeddings: true,
        initializer_range: 0.02,
        bos_token_id: None,
        eos_token_id: Some(tokenizer.eos_id()),
    }
}

/// A language-model job's recipe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LmRecipe {
    /// Seeds the initial weights and every node's batch stream.
    pub seed: u64,
    /// The job id, salting every node's batch stream.
    pub job: u64,
    /// Tokens each sequence predicts (windows are `seq_len + 1` tokens).
    pub seq_len: u32,
    /// Sequences per local step.
    pub batch_size: u32,
    /// AdamW steps per epoch.
    pub local_steps: u32,
    /// The local optimizer.
    pub adamw: AdamW,
    /// Tokens of the validation shard ([`text::validation_windows`]).
    pub validation_tokens: u64,
}

impl LmRecipe {
    /// [`TrainError::InvalidRecipe`] unless `1 ≤ local_steps ≤ MAX_LOCAL_STEPS`,
    /// `1 ≤ batch_size ≤ MAX_LM_BATCH`, `2 ≤ seq_len ≤ min(MAX_SEQ_LEN, positions − 1)`,
    /// `seq_len ≤ validation_tokens ≤ MAX_VALIDATION_TOKENS`, and the optimizer is valid.
    pub fn validate(&self, cfg: &Qwen3Config) -> Result<(), TrainError> {
        let bad = |m: String| Err(TrainError::InvalidRecipe(m));
        if self.local_steps == 0 || self.local_steps > crate::MAX_LOCAL_STEPS {
            return bad(format!(
                "local_steps {} (1 to {})",
                self.local_steps,
                crate::MAX_LOCAL_STEPS
            ));
        }
        if self.batch_size == 0 || self.batch_size > MAX_LM_BATCH {
            return bad(format!(
                "batch_size {} (1 to {MAX_LM_BATCH})",
                self.batch_size
            ));
        }
        // A window of `seq_len + 1` tokens goes through the model whole.
        let positions = u32::try_from(cfg.max_position_embeddings).unwrap_or(u32::MAX);
        let max_seq = MAX_SEQ_LEN.min(positions - 1);
        if self.seq_len < 2 || self.seq_len > max_seq {
            return bad(format!("seq_len {} (2 to {max_seq})", self.seq_len));
        }
        if self.validation_tokens < u64::from(self.seq_len)
            || self.validation_tokens > MAX_VALIDATION_TOKENS
        {
            return bad(format!(
                "validation_tokens {} ({} to {MAX_VALIDATION_TOKENS})",
                self.validation_tokens, self.seq_len
            ));
        }
        self.adamw.validate()
    }
}

/// A language-model job's training math: the model, its recipe and its corpus.
#[derive(Debug, Clone)]
pub struct LmTask {
    model: Qwen3,
    recipe: LmRecipe,
    data: &'static TextData,
    lora: Option<LoraShape>,
}

/// What a node's local run of one epoch produced, in the form it uploads.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalDelta {
    /// The delta, in [`LmTask::delta_layout`]: the weight change `trained − start` of a
    /// full-parameter job, the trained adapter (PEFT-named `lora_A`/`lora_B`) of a LoRA
    /// job.
    pub delta: Weights,
    /// The loss (nats/token for a language model) of the start weights on the first step's
    /// batch: what the node signs.
    pub claimed_loss: f64,
    /// The last step run.
    pub last_step: u64,
    /// The loss of each step's batch before that step's update.
    pub losses: Vec<f64>,
}

fn text_error(e: text::TextError) -> TrainError {
    TrainError::Dataset(e.to_string())
}

impl LmTask {
    /// The task of `recipe` on `cfg` over `data`. Errors: an invalid recipe, a model whose
    /// vocabulary does not cover the tokenizer's, a corpus too short for one window.
    pub fn new(
        cfg: Qwen3Config,
        recipe: LmRecipe,
        data: &'static TextData,
    ) -> Result<LmTask, TrainError> {
        recipe.validate(&cfg)?;
        if data.tokenizer().vocab_size() > cfg.vocab_size {
            return Err(TrainError::LayoutMismatch(format!(
                "the tokenizer has {} tokens, the model's vocabulary {}",
                data.tokenizer().vocab_size(),
                cfg.vocab_size
            )));
        }
        text::validation_windows(
            data.validation_len(),
            recipe.seq_len,
            recipe.validation_tokens,
        )
        .map_err(text_error)?;
        Ok(LmTask {
            model: Qwen3::new(cfg)?,
            recipe,
            data,
            lora: None,
        })
    }

    /// This task training a LoRA adapter ([`Qwen3::lora`]: rank, `lora_alpha`, target
    /// modules) instead of every parameter. Errors: [`TrainError::InvalidRecipe`] for an
    /// adapter the model cannot carry.
    pub fn with_lora(
        mut self,
        rank: usize,
        alpha: f64,
        target_modules: &[String],
    ) -> Result<LmTask, TrainError> {
        self.lora = Some(self.model.lora(rank, alpha, target_modules)?);
        Ok(self)
    }

    /// The adapter of a LoRA task.
    pub fn lora(&self) -> Option<&LoraShape> {
        self.lora.as_ref()
    }

    /// The layout of this task's deltas: the model's ([`LmTask::layout`]) for
    /// full-parameter training, the adapter's ([`LoraShape::layout`]) for LoRA.
    pub fn delta_layout(&self) -> Arc<Layout> {
        match &self.lora {
            Some(l) => l.layout().clone(),
            None => self.layout(),
        }
    }

    /// The adapter every node of a LoRA task starts the epoch beginning at global step
    /// `first_step` from: [`Qwen3::init_lora`] seeded with SHA-256(`"hanzod-lora-init-v1"` ‖
    /// seed u64 LE ‖ job u64 LE ‖ first_step u64 LE). `None` for a full-parameter task.
    pub fn init_adapter(&self, first_step: u64) -> Option<Weights> {
        let lora = self.lora.as_ref()?;
        let mut h = Sha256::new();
        h.update(hanzod_actors::domain::LORA_INIT);
        h.update(self.recipe.seed.to_le_bytes());
        h.update(self.recipe.job.to_le_bytes());
        h.update(first_step.to_le_bytes());
        Some(self.model.init_lora(lora, h.finalize().into()))
    }

    /// The model.
    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// The recipe.
    pub fn recipe(&self) -> &LmRecipe {
        &self.recipe
    }

    /// The corpus.
    pub fn data(&self) -> &'static TextData {
        self.data
    }

    /// The weights' layout.
    pub fn layout(&self) -> Arc<Layout> {
        self.model.layout().clone()
    }

    /// The initial weights ([`Qwen3::init`] of the recipe's seed).
    pub fn init(&self) -> Weights {
        self.model.init(self.recipe.seed)
    }

    /// `node`'s batch at global step `step`: `[batch_size, seq_len + 1]` token ids.
    pub fn batch(&self, node: &[u8; 32], step: u64) -> Result<Vec<u32>, TrainError> {
        let r = &self.recipe;
        let starts = text::batch_windows(
            r.seed,
            r.job,
            node,
            step,
            r.batch_size,
            r.seq_len,
            self.data.train_len(),
        )
        .map_err(text_error)?;
        text::batch_tokens(self.data.train(), &starts, r.seq_len).map_err(text_error)
    }

    /// The loss (nats/token) of `w` on `node`'s batch of `step`: what the spot-check
    /// recomputes against a node's claimed loss.
    pub fn batch_loss(&self, w: &Weights, node: &[u8; 32], step: u64) -> Result<f64, TrainError> {
        let tokens = self.batch(node, step)?;
        let sum = self.model.nll(
            w,
            Batch {
                tokens: &tokens,
                batch: self.recipe.batch_size as usize,
            },
        )?;
        Ok(sum.mean())
    }

    /// The held-out loss of `w` on the job's validation shard (nats/token), scored
    /// [`VALIDATION_CHUNK`] sequences per forward pass and summed in f64 in shard order.
    pub fn validation_loss(&self, w: &Weights) -> Result<f64, TrainError> {
        let r = &self.recipe;
        let starts =
            text::validation_windows(self.data.validation_len(), r.seq_len, r.validation_tokens)
                .map_err(text_error)?;
        let mut total = NllSum::default();
        for chunk in starts.chunks(VALIDATION_CHUNK) {
            let tokens =
                text::batch_tokens(self.data.validation(), chunk, r.seq_len).map_err(text_error)?;
            total.add(self.model.nll(
                w,
                Batch {
                    tokens: &tokens,
                    batch: chunk.len(),
                },
            )?);
        }
        Ok(total.mean())
    }

    /// `node`'s local run of the epoch starting at `first_step` from `global`, as the delta
    /// it uploads ([`LocalDelta`]): [`LmTask::train_local`]'s weight change for a
    /// full-parameter task; for a LoRA task `local_steps` AdamW steps from zero moments on
    /// the adapter [`LmTask::init_adapter`]`(first_step)` with `global` frozen, the trained
    /// adapter being the delta.
    ///
    /// Errors: as [`LmTask::train_local`].
    pub fn local_delta(
        &self,
        global: &Weights,
        node: &[u8; 32],
        first_step: u64,
    ) -> Result<LocalDelta, TrainError> {
        let (Some(lora), Some(start)) = (&self.lora, self.init_adapter(first_step)) else {
            // A full-parameter task: every parameter trained.
            let run = self.train_local(global, node, first_step)?;
            return Ok(LocalDelta {
                delta: run.weights.sub(global)?,
                claimed_loss: run.claimed_loss,
                last_step: run.last_step,
                losses: run.losses,
            });
        };
        let r = &self.recipe;
        let (last_step, batches) = self.batches(node, first_step)?;
        let run = self.model.train_lora(
            global,
            lora,
            &start,
            None,
            &r.adamw,
            self.as_batches(&batches),
        )?;
        Ok(LocalDelta {
            delta: run.weights,
            claimed_loss: run.losses[0],
            last_step,
            losses: run.losses,
        })
    }

    /// `rows` (each a step's `[batch_size, seq_len + 1]` ids) as model batches.
    fn as_batches<'a>(&self, rows: &'a [Vec<u32>]) -> impl Iterator<Item = Batch<'a>> + 'a {
        let batch = self.recipe.batch_size as usize;
        rows.iter().map(move |t| Batch { tokens: t, batch })
    }

    /// The last step and the batches of steps `first_step ..= first_step + local_steps − 1`.
    fn batches(
        &self,
        node: &[u8; 32],
        first_step: u64,
    ) -> Result<(u64, Vec<Vec<u32>>), TrainError> {
        let last_step = first_step
            .checked_add(u64::from(self.recipe.local_steps) - 1)
            .ok_or_else(|| TrainError::InvalidRecipe("step range passes u64::MAX".into()))?;
        let batches = (first_step..=last_step)
            .map(|s| self.batch(node, s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((last_step, batches))
    }

    /// Runs steps `first_step .. first_step + local_steps` from `global` with AdamW from zero
    /// moments (module docs), every parameter trained (a LoRA task's [`LmTask::local_delta`]
    /// trains its adapter instead). `claimed_loss` is the loss of `global` on the first batch
    /// (under the autodiff forward; [`LmTask::batch_loss`] recomputes it equal to f32
    /// rounding).
    ///
    /// Errors: [`TrainError::InvalidRecipe`] for a LoRA task (it trains its adapter:
    /// [`LmTask::local_delta`]); as [`Qwen3::train`].
    pub fn train_local(
        &self,
        global: &Weights,
        node: &[u8; 32],
        first_step: u64,
    ) -> Result<LocalRun, TrainError> {
        if self.lora.is_some() {
            return Err(TrainError::InvalidRecipe(
                "a LoRA task trains its adapter, not every parameter: use local_delta".into(),
            ));
        }
        let r = &self.recipe;
        let (last_step, batches) = self.batches(node, first_step)?;
        let run = self
            .model
            .train(global, None, &r.adamw, self.as_batches(&batches))?;
        Ok(LocalRun {
            weights: run.weights,
            claimed_loss: run.losses[0],
            last_step,
            losses: run.losses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> LmRecipe {
        LmRecipe {
            seed: 3,
            job: 1,
            seq_len: 32,
            batch_size: 4,
            local_steps: 3,
            adamw: AdamW {
                lr: 3e-3,
                ..AdamW::default()
            },
            validation_tokens: 256,
        }
    }

    #[test]
    fn qwen3_tiny_is_about_a_million_parameters() {
        let m = Qwen3::new(qwen3_tiny()).unwrap();
        assert!(
            (1_000_000..1_100_000).contains(&m.param_count()),
            "{}",
            m.param_count()
        );
    }

    #[test]
    fn local_training_lowers_the_loss_and_replays() {
        let task = LmTask::new(qwen3_tiny(), recipe(), TextData::austen()).unwrap();
        let w0 = task.init();
        let node = [7u8; 32];
        let before = task.validation_loss(&w0).unwrap();
        // An untrained model is near uniform over 2,048 tokens.
        assert!((before - (2048f64).ln()).abs() < 0.1, "{before}");
        let run = task.train_local(&w0, &node, 10).unwrap();
        assert_eq!(run.last_step, 12);
        assert_eq!(run.losses.len(), 3);
        let claimed = task.batch_loss(&w0, &node, 10).unwrap();
        assert!((claimed - run.claimed_loss).abs() <= 1e-5 * claimed);
        let after = task.validation_loss(&run.weights).unwrap();
        assert!(after < before - 0.05, "{before} → {after}");
        // Replayable: the same inputs give the same weights.
        assert_eq!(
            task.train_local(&w0, &node, 10).unwrap().weights,
            run.weights
        );
        // Another node trains on other batches.
        assert_ne!(
            task.batch(&node, 10).unwrap(),
            task.batch(&[8; 32], 10).unwrap()
        );
    }

    #[test]
    fn lora_training_trains_only_the_adapter_and_replays() {
        let targets = ["q_proj", "v_proj", "down_proj"].map(String::from);
        let task = LmTask::new(qwen3_tiny(), recipe(), TextData::austen())
            .unwrap()
            .with_lora(4, 8.0, &targets)
            .unwrap();
        let w0 = task.init();
        let node = [7u8; 32];
        let start = task.init_adapter(10).unwrap();
        let lora = task.lora().unwrap();
        // The fresh adapter is the identity update: B = 0, bit for bit the base's loss.
        let tokens = task.batch(&node, 10).unwrap();
        let b = Batch {
            tokens: &tokens,
            batch: 4,
        };
        let base = task.model().nll(&w0, b).unwrap();
        assert_eq!(task.model().lora_nll(&w0, lora, &start, b).unwrap(), base);
        let run = task.local_delta(&w0, &node, 10).unwrap();
        assert_eq!(run.delta.layout, task.delta_layout());
        assert_eq!(run.last_step, 12);
        // The claim is the base's loss on the first batch (the autodiff forward through the
        // zero adapter; equal to f32 rounding).
        let claimed = task.batch_loss(&w0, &node, 10).unwrap();
        assert!((run.claimed_loss - claimed).abs() <= 1e-6 * claimed);
        // PEFT names and shapes: A [r, in], B [out, r]; B moved off zero.
        let a = run
            .delta
            .tensor("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight")
            .unwrap();
        assert_eq!(a.len(), 4 * 384);
        let bq = run
            .delta
            .tensor("base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight")
            .unwrap();
        assert!(bq.iter().any(|&x| x != 0.0));
        // The trained adapter lowers the loss on the batches it saw.
        let after = task.model().lora_nll(&w0, lora, &run.delta, b).unwrap();
        assert!(
            after.mean() < base.mean() - 0.01,
            "{} → {}",
            base.mean(),
            after.mean()
        );
        // Replayable, and every node of an epoch starts from the same adapter.
        assert_eq!(task.local_delta(&w0, &node, 10).unwrap(), run);
        assert_eq!(task.init_adapter(10), task.init_adapter(10));
        assert_ne!(task.init_adapter(10), task.init_adapter(13));
        // A full-parameter task has no adapter and uploads trained − start.
        let full = LmTask::new(qwen3_tiny(), recipe(), TextData::austen()).unwrap();
        assert!(full.init_adapter(10).is_none());
        let d = full.local_delta(&w0, &node, 10).unwrap();
        assert_eq!(
            d.delta,
            full.train_local(&w0, &node, 10)
                .unwrap()
                .weights
                .sub(&w0)
                .unwrap()
        );
    }

    /// Learning curve of one process (for tuning the demo; `--release --ignored
    /// --nocapture`): `HANZOD_LM_STEPS`, `HANZOD_LM_LR`, `HANZOD_LM_BATCH` (8),
    /// `HANZOD_LM_EPOCH` (steps per AdamW restart, 8).
    #[test]
    #[ignore = "tuning report"]
    fn learning_curve() {
        let env = |k: &str, d: f64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let (steps, lr) = (
            env("HANZOD_LM_STEPS", 200.0) as u32,
            env("HANZOD_LM_LR", 3e-3),
        );
        let (batch, epoch) = (
            env("HANZOD_LM_BATCH", 8.0) as u32,
            env("HANZOD_LM_EPOCH", 8.0) as u32,
        );
        let r = LmRecipe {
            seq_len: 64,
            batch_size: batch,
            local_steps: epoch,
            validation_tokens: 2048,
            adamw: AdamW {
                lr,
                ..AdamW::default()
            },
            ..recipe()
        };
        let task = LmTask::new(qwen3_tiny(), r, TextData::austen()).unwrap();
        let mut w = task.init();
        let t0 = std::time::Instant::now();
        let prompt = task
            .data()
            .tokenizer()
            .encode("It is a truth universally acknowledged");
        for e in 0..steps / epoch {
            let run = task
                .train_local(&w, &[1; 32], u64::from(e * epoch))
                .unwrap();
            w = run.weights;
            if (e + 1) % (steps / epoch / 5).max(1) == 0 {
                let v = task.validation_loss(&w).unwrap();
                let out = task
                    .model()
                    .generate(
                        &w,
                        &prompt,
                        24,
                        crate::qwen3::Sampling {
                            temperature: 0.0,
                            seed: 0,
                        },
                        None,
                    )
                    .unwrap();
                eprintln!(
                    "step {:4} {:7.1} s val {v:.4} | {}",
                    (e + 1) * epoch,
                    t0.elapsed().as_secs_f64(),
                    task.data().tokenizer().decode(&out).replace('\n', "⏎")
                );
            }
        }
    }

    #[test]
    fn refuses_recipes_out_of_bounds() {
        let cfg = qwen3_tiny();
        for bad in [
            LmRecipe {
                local_steps: 0,
                ..recipe()
            },
            LmRecipe {
                batch_size: 0,
                ..recipe()
            },
            LmRecipe {
                seq_len: 1,
                ..recipe()
            },
            LmRecipe {
                seq_len: 513,
                ..recipe()
            },
            LmRecipe {
                validation_tokens: 8,
                ..recipe()
            },
            LmRecipe {
                adamw: AdamW {
                    beta2: 1.0,
                    ..AdamW::default()
                },
                ..recipe()
            },
        ] {
            assert!(
                matches!(bad.validate(&cfg), Err(TrainError::InvalidRecipe(_))),
                "{bad:?}"
            );
        }
    }
}

/// Why a language-model checkpoint folder could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What reading it said.
        error: std::io::Error,
    },
    /// `config.json` is not a Qwen3 hanzod can run (the message names the file).
    #[error("{0}")]
    Config(#[from] crate::qwen3::ConfigError),
    /// `model.safetensors` is not this configuration's weights.
    #[error("model.safetensors: {0}")]
    Weights(TrainError),
    /// `tokenizer.json` is not a tokenizer hanzod reads.
    #[error("tokenizer.json: {0}")]
    Tokenizer(text::TextError),
    /// The tokenizer produces ids the model has no embedding for.
    #[error("the tokenizer has {tokenizer} tokens but the model's vocabulary only {model}")]
    Vocabulary {
        /// Tokens the tokenizer knows.
        tokenizer: usize,
        /// The model's `vocab_size`.
        model: usize,
    },
}

/// Largest file [`LmCheckpoint::load`] reads, bytes (16 GiB: a model of about 4 B f32
/// parameters).
pub const MAX_CHECKPOINT_FILE: u64 = 16 << 30;

/// A language-model checkpoint in the Hugging Face layout: `config.json` (Qwen3),
/// `model.safetensors` (F32) and `tokenizer.json`.
#[derive(Debug, Clone)]
pub struct LmCheckpoint {
    /// The model of `config.json`.
    pub model: Qwen3,
    /// The weights of `model.safetensors`.
    pub weights: Weights,
    /// The tokenizer.
    pub tokenizer: text::Tokenizer,
}

fn read_bounded(path: &std::path::Path) -> Result<Vec<u8>, CheckpointError> {
    let io = |error| CheckpointError::Io {
        path: path.to_path_buf(),
        error,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_CHECKPOINT_FILE {
        return Err(io(std::io::Error::other(format!(
            "{len} bytes, more than the {MAX_CHECKPOINT_FILE} read"
        ))));
    }
    std::fs::read(path).map_err(io)
}

impl LmCheckpoint {
    /// Loads the folder `dir`, with the tokenizer at `tokenizer` (default
    /// `dir/tokenizer.json`).
    pub fn load(
        dir: &std::path::Path,
        tokenizer: Option<&std::path::Path>,
    ) -> Result<LmCheckpoint, CheckpointError> {
        let text = |p: std::path::PathBuf| {
            read_bounded(&p).map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        let cfg = Qwen3Config::from_json(&text(dir.join("config.json"))?)?;
        let model = Qwen3::new(cfg).map_err(CheckpointError::Weights)?;
        let bytes = read_bounded(&dir.join("model.safetensors"))?;
        let weights = Weights::from_safetensors(&bytes, model.layout().clone())
            .map_err(CheckpointError::Weights)?;
        let tok_path = tokenizer.map_or_else(|| dir.join("tokenizer.json"), |p| p.to_path_buf());
        let tokenizer =
            text::Tokenizer::from_json(&text(tok_path)?).map_err(CheckpointError::Tokenizer)?;
        let vocab = model.config().vocab_size;
        if tokenizer.vocab_size() > vocab {
            return Err(CheckpointError::Vocabulary {
                tokenizer: tokenizer.vocab_size(),
                model: vocab,
            });
        }
        Ok(LmCheckpoint {
            model,
            weights,
            tokenizer,
        })
    }
}

/// What [`eval_text`] measured.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TextEval {
    /// Tokens the text encodes to.
    pub text_tokens: u64,
    /// Tokens scored (next-token predictions).
    pub scored_tokens: u64,
    /// Mean cross-entropy, nats/token.
    pub nats_per_token: f64,
    /// `exp(nats_per_token)`.
    pub perplexity: f64,
    /// Tokens per window (the context each prediction sees at most).
    pub window: u32,
}

/// The mean next-token cross-entropy of `w` on `text`: the text encoded whole with
/// `tokenizer`, cut into windows of `window + 1` tokens that share one token
/// ([`text::validation_windows`]: every token after the first is scored once, the tail
/// that fills no whole window is dropped), `window = min(512, positions − 1, tokens − 1)`, at
/// most `max_tokens` scored, [`VALIDATION_CHUNK`] windows per forward pass.
///
/// Errors: [`TrainError::Dataset`] for a text of fewer than two tokens; as
/// [`Qwen3::nll`].
pub fn eval_text(
    model: &Qwen3,
    w: &Weights,
    tokenizer: &text::Tokenizer,
    text_in: &str,
    max_tokens: u64,
) -> Result<TextEval, TrainError> {
    let ids = tokenizer.encode(text_in);
    if ids.len() < 2 {
        return Err(TrainError::Dataset(format!(
            "the text encodes to {} token(s): nothing to predict",
            ids.len()
        )));
    }
    let window = 512
        .min(model.config().max_position_embeddings - 1)
        .min(ids.len() - 1) as u32;
    let starts = text::validation_windows(ids.len(), window, max_tokens.max(u64::from(window)))
        .map_err(text_error)?;
    let mut total = NllSum::default();
    for chunk in starts.chunks(VALIDATION_CHUNK) {
        let tokens = text::batch_tokens(&ids, chunk, window).map_err(text_error)?;
        total.add(model.nll(
            w,
            Batch {
                tokens: &tokens,
                batch: chunk.len(),
            },
        )?);
    }
    let mean = total.mean();
    Ok(TextEval {
        text_tokens: ids.len() as u64,
        scored_tokens: total.tokens,
        nats_per_token: mean,
        perplexity: mean.exp(),
        window,
    })
}

#[cfg(test)]
mod eval_tests {
    use super::*;
    use crate::qwen3::Sampling;

    #[test]
    fn a_saved_checkpoint_loads_evaluates_and_generates() {
        let model = Qwen3::new(qwen3_tiny()).unwrap();
        let w = model.init(5);
        let dir = std::env::temp_dir().join(format!("hanzod-lm-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), model.config().to_json()).unwrap();
        std::fs::write(dir.join("model.safetensors"), w.to_safetensors()).unwrap();
        // No tokenizer yet: a typed error naming the file.
        let e = LmCheckpoint::load(&dir, None).unwrap_err();
        assert!(matches!(e, CheckpointError::Io { .. }), "{e}");
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
        let tok = text::Tokenizer::austen();
        std::fs::write(dir.join("tokenizer.json"), tok.to_json()).unwrap();
        let ck = LmCheckpoint::load(&dir, None).unwrap();
        assert_eq!(ck.weights, w);

        let passage = &text::Split::austen().validation[..6000];
        let ev = eval_text(&ck.model, &ck.weights, &ck.tokenizer, passage, 600).unwrap();
        assert_eq!(ev.window, 511);
        assert_eq!(ev.scored_tokens, 511);
        assert!((ev.nats_per_token - (2048f64).ln()).abs() < 0.1, "{ev:?}");
        assert!((ev.perplexity - ev.nats_per_token.exp()).abs() < 1e-9);
        assert!(eval_text(&ck.model, &ck.weights, &ck.tokenizer, "a", 10).is_err());

        let prompt = tok.encode("It is a truth universally acknowledged");
        let greedy = Sampling {
            temperature: 0.0,
            seed: 0,
        };
        let a = ck.model.generate(&w, &prompt, 5, greedy, None).unwrap();
        assert_eq!(a.len(), 5);
        assert_eq!(a, ck.model.generate(&w, &prompt, 5, greedy, None).unwrap());
        let hot = |seed| Sampling {
            temperature: 1.0,
            seed,
        };
        let s1 = ck.model.generate(&w, &prompt, 8, hot(1), None).unwrap();
        assert_eq!(s1, ck.model.generate(&w, &prompt, 8, hot(1), None).unwrap());
        assert_ne!(s1, ck.model.generate(&w, &prompt, 8, hot(2), None).unwrap());
        assert!(s1.iter().all(|&t| (t as usize) < 2048));
        // Stops at the stop token when it is produced.
        let stop = a[0];
        let cut = ck
            .model
            .generate(&w, &prompt, 5, greedy, Some(stop))
            .unwrap();
        assert_eq!(cut, a[..1]);
        assert!(ck.model.generate(&w, &[], 1, greedy, None).is_err());
        assert!(ck
            .model
            .generate(
                &w,
                &prompt,
                1,
                Sampling {
                    temperature: -1.0,
                    seed: 0
                },
                None
            )
            .is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
