//! From a job's training spec to the [`Recipe`] a node runs and the validator replays
//! (DESIGN §5, §6).

use hanzod_actors::job::TrainingSpec;
use hanzod_actors::types::JobId;
use hanzod_protocol::model::ModelSpec;

use crate::{Recipe, TrainError};

/// Why a job's training spec has no recipe here.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecipeError {
    /// The model is not one this trainer can run.
    #[error(
        "model {model:?} has no trainer here (hanzod trains {}-style MLPs)",
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
    /// The dataset is not one this trainer reads.
    #[error("dataset {dataset:?} has no trainer here (known: {WINE_QUALITY})")]
    UnknownDataset {
        /// The dataset named by the spec.
        dataset: String,
    },
    /// The outer learning rate is not a positive f32.
    #[error("outer_lr {0} is not a positive f32")]
    OuterLr(f64),
    /// The recipe is out of its bounds ([`Recipe::validate`]).
    #[error("{0}")]
    Invalid(TrainError),
}

/// The trainer recipe of `job`'s training spec, whose model the catalog resolved to
/// `model`: the model must be a `wine-mlp` of some hidden width (the trainer hanzod ships,
/// [`crate::model_spec`]) and the dataset `wine-quality-red`; the recipe must pass
/// [`Recipe::validate`] (bounded steps and batch, learning rates finite in f32).
///
/// Errors: [`RecipeError`], for `INVALID_ARGUMENT` at SubmitJob and for a failed
/// publication should a job get past that.
pub fn recipe_for(
    training: &TrainingSpec,
    model: &ModelSpec,
    job: JobId,
) -> Result<Recipe, RecipeError> {
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
        });
    }
    let outer = training.outer_lr as f32;
    if !(outer.is_finite() && outer > 0.0) {
        return Err(RecipeError::OuterLr(training.outer_lr));
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
    Ok(recipe)
}

/// [`recipe_for`] with the built-in model named by `training.model`.
pub fn recipe_of(training: &TrainingSpec, job: JobId) -> Result<Recipe, RecipeError> {
    let model = crate::builtin_model(&training.model).ok_or_else(|| RecipeError::NotBuiltIn {
        model: training.model.clone(),
    })?;
    recipe_for(training, &model, job)
}

/// The dataset the trainer reads.
const WINE_QUALITY: &str = "wine-quality-red";
