//! From a job's training spec to the [`Trainer`] a node runs and the validator replays
//! (DESIGN §5, §6): the `wine-mlp` on Wine Quality ([`Recipe`], SGD) or a Qwen3 language
//! model on a text corpus ([`LmTask`], AdamW).

use std::sync::{Arc, OnceLock};

use hanzod_actors::job::{TrainMode, TrainingSpec};
use hanzod_actors::types::JobId;
use hanzod_protocol::hzdl::DeltaDtype;
use hanzod_protocol::model::ModelSpec;

use crate::lm::{self, LmRecipe, LmTask, LocalDelta};
use crate::qwen3::{AdamW, LoraShape, Qwen3Config};
use crate::text::{self, TextData};
use crate::weights::{Layout, Weights};
use crate::{Dataset, LocalRun, Recipe, TrainError};

/// Why a job's training spec has no trainer here.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecipeError {
    /// The model is not one this trainer can run.
    #[error(
        "model {model:?} has no trainer here (hanzod trains {}-style MLPs and qwen3 language models)",
        crate::MODEL_NAME
    )]
    NoTrainer {
        /// The model named by the spec.
        model: String,
    },
    /// The model is not one of the built-in models.
    #[error("model {model:?} is not built in")]
    NotBuiltIn {
        /// The model named by the spec.
        model: String,
    },
    /// The dataset is not one this model's trainer reads.
    #[error("dataset {dataset:?} has no trainer for model {model:?} (it reads {expected})")]
    UnknownDataset {
        /// The dataset named by the spec.
        dataset: String,
        /// The model named by the spec.
        model: String,
        /// The dataset that model's trainer reads.
        expected: &'static str,
    },
    /// The outer learning rate is not a positive f32.
    #[error("outer_lr {0} is not a positive f32")]
    OuterLr(f64),
    /// `delta_dtype` is not `f32` or `bf16`.
    #[error("delta_dtype {0:?} is not \"f32\" or \"bf16\"")]
    DeltaDtype(String),
    /// A language-model field given to a model that has none (the MLP trains with SGD,
    /// full-parameter, from its seed).
    #[error("{field} does not apply to model {model:?}")]
    NotApplicable {
        /// The field.
        field: &'static str,
        /// The model.
        model: String,
    },
    /// `model = "qwen3"` without a valid `architecture` (a Hugging Face config.json).
    #[error("architecture: {0}")]
    Architecture(String),
    /// The LoRA adapter is not trainable here.
    #[error("lora: {0}")]
    Lora(String),
    /// The recipe is out of its bounds ([`Recipe::validate`], [`LmRecipe::validate`]).
    #[error("{0}")]
    Invalid(TrainError),
}

/// The architecture a language-model spec names: `qwen3-tiny` ([`lm::qwen3_tiny`]) or
/// `qwen3` with its `architecture` text; `Ok(None)` for a model that is not a language
/// model.
pub fn lm_config(training: &TrainingSpec) -> Result<Option<Qwen3Config>, RecipeError> {
    match training.model.as_str() {
        lm::QWEN3_TINY => match &training.architecture {
            None => Ok(Some(lm::qwen3_tiny())),
            Some(_) => Err(RecipeError::NotApplicable {
                field: "architecture",
                model: training.model.clone(),
            }),
        },
        lm::QWEN3 => {
            let text = training.architecture.as_deref().ok_or_else(|| {
                RecipeError::Architecture(
                    "model \"qwen3\" needs its config.json (training.architecture)".into(),
                )
            })?;
            Qwen3Config::from_json(text)
                .map(Some)
                .map_err(|e| RecipeError::Architecture(e.to_string()))
        }
        _ => Ok(None),
    }
}

/// The element type a job's deltas are uploaded in.
pub fn delta_dtype(training: &TrainingSpec) -> Result<DeltaDtype, RecipeError> {
    match training.delta_dtype.as_str() {
        "f32" => Ok(DeltaDtype::F32),
        "bf16" => Ok(DeltaDtype::Bf16),
        other => Err(RecipeError::DeltaDtype(other.to_string())),
    }
}

/// The `wine-mlp`'s training math: its recipe and the Wine Quality data.
#[derive(Debug, Clone)]
pub struct MlpTask {
    /// The recipe.
    pub recipe: Recipe,
    data: Arc<Dataset>,
}

/// A job's training math, resolved from its spec by [`trainer_for`]: what a node trains
/// and a validator replays. Every method is deterministic on one machine.
#[derive(Debug, Clone)]
pub enum Trainer {
    /// The `wine-mlp` (SGD, mean squared error in standardised-target units).
    Mlp(MlpTask),
    /// A Qwen3 language model (AdamW, cross-entropy in nats/token).
    Lm(Box<LmTask>),
}

impl PartialEq for Trainer {
    /// Same model, same recipe (the data are the built-in ones each trainer names).
    fn eq(&self, other: &Trainer) -> bool {
        match (self, other) {
            (Trainer::Mlp(a), Trainer::Mlp(b)) => a.recipe == b.recipe,
            (Trainer::Lm(a), Trainer::Lm(b)) => {
                a.model().config() == b.model().config()
                    && a.recipe() == b.recipe()
                    && a.lora() == b.lora()
            }
            _ => false,
        }
    }
}

/// The shared Wine Quality data (loaded once per process).
fn wine_quality() -> Result<Arc<Dataset>, TrainError> {
    static DATA: OnceLock<Result<Arc<Dataset>, TrainError>> = OnceLock::new();
    DATA.get_or_init(|| Dataset::wine_quality().map(Arc::new))
        .clone()
}

impl Trainer {
    /// The weights' layout (every tensor of the model, name order).
    pub fn layout(&self) -> Arc<Layout> {
        match self {
            Trainer::Mlp(t) => crate::layout(t.recipe.hidden),
            Trainer::Lm(t) => t.layout(),
        }
    }

    /// The layout of the deltas nodes upload: the model's for full-parameter training, the
    /// LoRA adapter's (PEFT names, kind LoRA) for a LoRA job.
    pub fn delta_layout(&self) -> Arc<Layout> {
        match self {
            Trainer::Mlp(t) => crate::layout(t.recipe.hidden),
            Trainer::Lm(t) => t.delta_layout(),
        }
    }

    /// The adapter of a LoRA job (`None` for full-parameter training).
    pub fn lora(&self) -> Option<&LoraShape> {
        match self {
            Trainer::Mlp(_) => None,
            Trainer::Lm(t) => t.lora(),
        }
    }

    /// The adapter every node of a LoRA job starts the epoch beginning at `first_step` from
    /// ([`LmTask::init_adapter`]; `None` for full-parameter training).
    pub fn init_adapter(&self, first_step: u64) -> Option<Weights> {
        match self {
            Trainer::Mlp(_) => None,
            Trainer::Lm(t) => t.init_adapter(first_step),
        }
    }

    /// `node`'s local run of an epoch from `global`, steps `first_step ..`, as the delta it
    /// uploads (layout [`Trainer::delta_layout`]; [`LmTask::local_delta`]): what the node
    /// trains and the spot-check re-executes.
    pub fn local_delta(
        &self,
        global: &Weights,
        node: &[u8; 32],
        first_step: u64,
    ) -> Result<LocalDelta, TrainError> {
        match self {
            Trainer::Mlp(t) => {
                let run = crate::train_local(global, &t.data, &t.recipe, node, first_step)?;
                Ok(LocalDelta {
                    delta: run.weights.sub(global)?,
                    claimed_loss: run.claimed_loss,
                    last_step: run.last_step,
                    losses: run.losses,
                })
            }
            Trainer::Lm(t) => t.local_delta(global, node, first_step),
        }
    }

    /// The initial weights of the recipe's seed.
    pub fn init(&self) -> Weights {
        match self {
            Trainer::Mlp(t) => crate::init(&t.recipe),
            Trainer::Lm(t) => t.init(),
        }
    }

    /// Local steps per epoch.
    pub fn local_steps(&self) -> u32 {
        match self {
            Trainer::Mlp(t) => t.recipe.local_steps,
            Trainer::Lm(t) => t.recipe().local_steps,
        }
    }

    /// `node`'s local run of an epoch from `global`, steps `first_step ..`, every parameter
    /// trained (see [`crate::train_local`] and [`LmTask::train_local`]; a LoRA job refuses
    /// it: [`Trainer::local_delta`] is what its nodes run).
    pub fn train_local(
        &self,
        global: &Weights,
        node: &[u8; 32],
        first_step: u64,
    ) -> Result<LocalRun, TrainError> {
        match self {
            Trainer::Mlp(t) => crate::train_local(global, &t.data, &t.recipe, node, first_step),
            Trainer::Lm(t) => t.train_local(global, node, first_step),
        }
    }

    /// The loss of `w` on `node`'s batch of `step`: what the spot-check compares with a
    /// claimed loss.
    pub fn batch_loss(&self, w: &Weights, node: &[u8; 32], step: u64) -> Result<f64, TrainError> {
        match self {
            Trainer::Mlp(t) => crate::batch_loss(w, &t.data, &t.recipe, node, step),
            Trainer::Lm(t) => t.batch_loss(w, node, step),
        }
    }

    /// The held-out loss of `w` (the quality score's input).
    pub fn validation_loss(&self, w: &Weights) -> Result<f64, TrainError> {
        match self {
            Trainer::Mlp(t) => crate::validation_loss(w, &t.data),
            Trainer::Lm(t) => t.validation_loss(w),
        }
    }

    /// The unit of [`Trainer::validation_loss`] and [`Trainer::batch_loss`], for messages.
    pub fn loss_unit(&self) -> &'static str {
        match self {
            Trainer::Mlp(_) => "MSE, standardised units",
            Trainer::Lm(_) => "nats/token",
        }
    }
}

/// The trainer of `job`'s training spec, whose model the catalog resolved to `model`:
/// - a `wine-mlp` of some hidden width ([`crate::model_spec`]) on `wine-quality-red`,
///   SGD, full-parameter, from its seed (no language-model field set);
/// - `qwen3-tiny`, or `qwen3` with its `architecture`, on `austen`, AdamW, full-parameter
///   or (`mode = "lora"`) a LoRA adapter of `training.lora` (dropout 0: training must
///   replay).
///
/// `base` (a published checkpoint to start from) applies to every model: the trainer does
/// not read it; the job's first epoch fetches it.
///
/// The recipe must pass its bounds (bounded steps, batch and validation shard, learning
/// rates finite in f32), the outer learning rate be a positive f32, and `delta_dtype` be
/// `f32` or `bf16`.
///
/// Errors: [`RecipeError`], for `INVALID_ARGUMENT` at SubmitJob and for a failed
/// publication should a job get past that.
pub fn trainer_for(
    training: &TrainingSpec,
    model: &ModelSpec,
    job: JobId,
) -> Result<Trainer, RecipeError> {
    let outer = training.outer_lr as f32;
    if !(outer.is_finite() && outer > 0.0) {
        return Err(RecipeError::OuterLr(training.outer_lr));
    }
    delta_dtype(training)?;
    if let Some(cfg) = lm_config(training)? {
        if training.dataset != text::AUSTEN {
            return Err(RecipeError::UnknownDataset {
                dataset: training.dataset.clone(),
                model: training.model.clone(),
                expected: text::AUSTEN,
            });
        }
        if cfg.spec().params != model.params {
            return Err(RecipeError::NoTrainer {
                model: training.model.clone(),
            });
        }
        let lora_default = hanzod_actors::job::LoraSpec::default();
        if training.mode == TrainMode::Full && training.lora != lora_default {
            return Err(RecipeError::Lora(
                "[training.lora] is set but mode is \"full\" (set mode = \"lora\")".into(),
            ));
        }
        let a = &training.adamw;
        let recipe = LmRecipe {
            seed: training.seed,
            job: job.0,
            seq_len: training.seq_len,
            batch_size: training.batch_size,
            local_steps: training.local_steps,
            adamw: AdamW {
                lr: training.local_lr,
                beta1: a.beta1,
                beta2: a.beta2,
                eps: a.eps,
                weight_decay: a.weight_decay,
            },
            validation_tokens: training.validation_tokens,
        };
        let task = LmTask::new(cfg, recipe, TextData::austen()).map_err(RecipeError::Invalid)?;
        let task = match training.mode {
            TrainMode::Full => task,
            TrainMode::Lora => {
                let l = &training.lora;
                if l.dropout != 0.0 {
                    return Err(RecipeError::Lora(format!(
                        "dropout {} (must be 0: a spot-check replays the node's steps)",
                        l.dropout
                    )));
                }
                task.with_lora(l.rank as usize, l.alpha, &l.target_modules)
                    .map_err(|e| RecipeError::Lora(e.to_string()))?
            }
        };
        return Ok(Trainer::Lm(Box::new(task)));
    }
    let hidden = model
        .params
        .get("fc1.bias")
        .and_then(|s| s.first().copied())
        .and_then(|h| u32::try_from(h).ok())
        .filter(|&h| {
            (1..=crate::MAX_HIDDEN).contains(&h) && crate::model_spec(h).params == model.params
        })
        .ok_or_else(|| RecipeError::NoTrainer {
            model: training.model.clone(),
        })?;
    if training.dataset != WINE_QUALITY {
        return Err(RecipeError::UnknownDataset {
            dataset: training.dataset.clone(),
            model: training.model.clone(),
            expected: WINE_QUALITY,
        });
    }
    let d = TrainingSpec::default();
    for (field, set) in [
        ("mode", training.mode != d.mode),
        ("lora", training.lora != d.lora),
        ("adamw", training.adamw != d.adamw),
        ("architecture", training.architecture.is_some()),
        ("seq_len", training.seq_len != d.seq_len),
        (
            "validation_tokens",
            training.validation_tokens != d.validation_tokens,
        ),
    ] {
        if set {
            return Err(RecipeError::NotApplicable {
                field,
                model: training.model.clone(),
            });
        }
    }
    let recipe = Recipe {
        seed: training.seed,
        job: job.0,
        local_steps: training.local_steps,
        batch_size: training.batch_size,
        local_lr: training.local_lr,
        hidden,
    };
    recipe.validate().map_err(RecipeError::Invalid)?;
    Ok(Trainer::Mlp(MlpTask {
        recipe,
        data: wine_quality().map_err(RecipeError::Invalid)?,
    }))
}

/// The dataset the MLP trainer reads.
const WINE_QUALITY: &str = "wine-quality-red";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::trainer_of;
    use hanzod_actors::job::LoraSpec;

    fn lm() -> TrainingSpec {
        TrainingSpec {
            model: lm::QWEN3_TINY.into(),
            dataset: text::AUSTEN.into(),
            local_lr: 3e-3,
            seq_len: 32,
            validation_tokens: 256,
            ..TrainingSpec::default()
        }
    }

    #[test]
    fn resolves_both_model_families() {
        let mlp = trainer_of(&TrainingSpec::default(), JobId(3)).unwrap();
        assert!(matches!(&mlp, Trainer::Mlp(t) if t.recipe.job == 3 && t.recipe.hidden == 32));
        assert_eq!(mlp.loss_unit(), "MSE, standardised units");
        let Trainer::Lm(t) = trainer_of(&lm(), JobId(3)).unwrap() else {
            panic!("qwen3-tiny is a language model")
        };
        assert_eq!(t.recipe().adamw.lr, 3e-3);
        assert_eq!(t.recipe().job, 3);
        assert_eq!(t.model().config(), &lm::qwen3_tiny());
        // `qwen3` with the same architecture written out is the same trainer.
        let custom = TrainingSpec {
            model: lm::QWEN3.into(),
            architecture: Some(lm::qwen3_tiny().to_json()),
            ..lm()
        };
        assert_eq!(
            trainer_of(&custom, JobId(3)).unwrap(),
            trainer_of(&lm(), JobId(3)).unwrap()
        );
        assert_ne!(
            trainer_of(&lm(), JobId(4)).unwrap(),
            trainer_of(&lm(), JobId(3)).unwrap()
        );
    }

    #[test]
    fn refusals_are_typed() {
        let mlp = TrainingSpec::default();
        let err = |t: &TrainingSpec| trainer_of(t, JobId(1)).unwrap_err();
        assert!(matches!(
            err(&TrainingSpec {
                mode: TrainMode::Lora,
                ..mlp.clone()
            }),
            RecipeError::NotApplicable { field: "mode", .. }
        ));
        for (field, t) in [
            (
                "seq_len",
                TrainingSpec {
                    seq_len: 64,
                    ..mlp.clone()
                },
            ),
            (
                "validation_tokens",
                TrainingSpec {
                    validation_tokens: 100,
                    ..mlp.clone()
                },
            ),
        ] {
            assert!(
                matches!(err(&t), RecipeError::NotApplicable { field: f, .. } if f == field),
                "{field}"
            );
        }
        // A base checkpoint applies to every model (the first epoch fetches it).
        assert!(trainer_of(
            &TrainingSpec {
                base: Some("bafy".into()),
                ..mlp.clone()
            },
            JobId(1)
        )
        .is_ok());
        assert!(matches!(
            err(&TrainingSpec {
                dataset: text::AUSTEN.into(),
                ..mlp.clone()
            }),
            RecipeError::UnknownDataset {
                expected: "wine-quality-red",
                ..
            }
        ));
        assert!(matches!(
            err(&TrainingSpec {
                dataset: "wine-quality-red".into(),
                ..lm()
            }),
            RecipeError::UnknownDataset {
                expected: "austen",
                ..
            }
        ));
        assert!(matches!(
            err(&TrainingSpec {
                delta_dtype: "f64".into(),
                ..lm()
            }),
            RecipeError::DeltaDtype(_)
        ));
        let lora = |l: LoraSpec| TrainingSpec {
            mode: TrainMode::Lora,
            lora: l,
            ..lm()
        };
        for bad in [
            LoraSpec {
                dropout: 0.1,
                ..LoraSpec::default()
            },
            LoraSpec {
                rank: 0,
                ..LoraSpec::default()
            },
            LoraSpec {
                rank: 65,
                ..LoraSpec::default()
            },
            LoraSpec {
                alpha: f64::NAN,
                ..LoraSpec::default()
            },
            LoraSpec {
                target_modules: vec!["lm_head".into()],
                ..LoraSpec::default()
            },
            LoraSpec {
                target_modules: vec![],
                ..LoraSpec::default()
            },
        ] {
            assert!(
                matches!(err(&lora(bad.clone())), RecipeError::Lora(_)),
                "{bad:?}"
            );
        }
        // [training.lora] without mode = "lora" is a mistake, not ignored.
        assert!(matches!(
            err(&TrainingSpec {
                lora: LoraSpec {
                    rank: 4,
                    ..LoraSpec::default()
                },
                ..lm()
            }),
            RecipeError::Lora(_)
        ));
        let t = trainer_of(&lora(LoraSpec::default()), JobId(1)).unwrap();
        let shape = t.lora().expect("a LoRA trainer");
        assert_eq!((shape.rank(), shape.scaling()), (16, 2.0));
        // 4 layers × 4 attention modules × (A, B).
        assert_eq!(t.delta_layout().entries().len(), 32);
        assert_eq!(
            t.delta_layout().delta_kind(),
            hanzod_protocol::hzdl::DeltaKind::Lora
        );
        assert_eq!(t.layout(), trainer_of(&lm(), JobId(1)).unwrap().layout());
        assert!(matches!(
            err(&TrainingSpec { seq_len: 1, ..lm() }),
            RecipeError::Invalid(TrainError::InvalidRecipe(_))
        ));
        assert!(matches!(
            err(&TrainingSpec {
                outer_lr: 0.0,
                ..lm()
            }),
            RecipeError::OuterLr(_)
        ));
        // `qwen3` without an architecture, or with one that is not Qwen3: the catalog
        // refuses it before a trainer is looked for.
        let catalog = crate::catalog::ModelCatalog::builtin();
        let q = TrainingSpec {
            model: lm::QWEN3.into(),
            ..lm()
        };
        assert!(catalog.check_training(&q).is_err());
        let llama = TrainingSpec {
            architecture: Some(r#"{"model_type": "llama"}"#.into()),
            ..q
        };
        let e = catalog.check_training(&llama).unwrap_err();
        assert!(e.to_string().contains("llama"), "{e}");
        assert_eq!(delta_dtype(&lm()).unwrap(), DeltaDtype::F32);
    }
}
