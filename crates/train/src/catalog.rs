//! The models and datasets a daemon knows (DESIGN §6): a job's `training.model` names a
//! [`ModelSpec`] here, which bounds the size of every delta uploaded for the job and is the
//! format check's reference; `training.dataset` names a dataset here.
//!
//! [`ModelCatalog::builtin`] holds what this crate ships ([`BUILTIN_MODELS`],
//! [`BUILTIN_DATASETS`]); library users add their own with [`ModelCatalog::insert`] and
//! [`ModelCatalog::insert_dataset`] and hand the catalog to the daemon
//! (`serve::DaemonParts`).

use std::collections::{BTreeMap, BTreeSet};

use hanzod_actors::job::TrainingSpec;

use hanzod_protocol::model::ModelSpec;

/// The models built into this crate ([`crate::builtin_model`]): the `wine-mlp` and
/// `qwen3-tiny` ([`crate::lm::qwen3_tiny`]). A job may also name `qwen3` with its own
/// architecture (a `config.json` in `training.architecture`).
pub const BUILTIN_MODELS: &[&str] = &["wine-mlp", crate::lm::QWEN3_TINY];

/// The datasets built into this crate: the UCI red-wine quality data
/// ([`crate::Dataset::wine_quality`]) and Jane Austen's six novels ([`crate::text`]).
pub const BUILTIN_DATASETS: &[&str] = &["wine-quality-red", crate::text::AUSTEN];

/// A name the catalog does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// No model of this name.
    #[error("unknown model {name:?} (known: {})", known.join(", "))]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// Every model the catalog holds, sorted.
        known: Vec<String>,
    },
    /// `model = "qwen3"` with an architecture that is missing or not a Qwen3 `config.json`.
    #[error("{0}")]
    Architecture(String),
    /// `mode = "lora"` with an adapter the model has no tensors for (a rank of 0, a target
    /// module it lacks).
    #[error("lora: {0}")]
    Lora(String),
    /// No dataset of this name.
    #[error("unknown dataset {name:?} (known: {})", known.join(", "))]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// Every dataset the catalog holds, sorted.
        known: Vec<String>,
    },
}

/// Model name → [`ModelSpec`], and the set of dataset names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelCatalog {
    models: BTreeMap<String, ModelSpec>,
    datasets: BTreeSet<String>,
}

impl ModelCatalog {
    /// A catalog with nothing in it.
    pub fn empty() -> ModelCatalog {
        ModelCatalog::default()
    }

    /// The built-in models ([`BUILTIN_MODELS`], from [`crate::builtin_model`]) and datasets
    /// ([`BUILTIN_DATASETS`]).
    pub fn builtin() -> ModelCatalog {
        let mut c = ModelCatalog::empty();
        for name in BUILTIN_MODELS {
            if let Some(spec) = crate::builtin_model(name) {
                c.insert(*name, spec);
            }
        }
        for name in BUILTIN_DATASETS {
            c.insert_dataset(*name);
        }
        c
    }

    /// Adds (or replaces) the model `name`; returns the spec it replaced.
    pub fn insert(&mut self, name: impl Into<String>, spec: ModelSpec) -> Option<ModelSpec> {
        self.models.insert(name.into(), spec)
    }

    /// Adds the dataset `name`; returns false when it was already there.
    pub fn insert_dataset(&mut self, name: impl Into<String>) -> bool {
        self.datasets.insert(name.into())
    }

    /// The model `name`, or [`CatalogError::UnknownModel`] listing the known ones.
    pub fn get(&self, name: &str) -> Result<&ModelSpec, CatalogError> {
        self.models
            .get(name)
            .ok_or_else(|| CatalogError::UnknownModel {
                name: name.to_string(),
                known: self.models.keys().cloned().collect(),
            })
    }

    /// `Ok` when the dataset `name` is known, else [`CatalogError::UnknownDataset`].
    pub fn dataset(&self, name: &str) -> Result<(), CatalogError> {
        if self.datasets.contains(name) {
            Ok(())
        } else {
            Err(CatalogError::UnknownDataset {
                name: name.to_string(),
                known: self.datasets.iter().cloned().collect(),
            })
        }
    }

    /// Checks a job's training recipe: its model, then its dataset; returns the model's
    /// parameters. `qwen3` is resolved from the spec's `architecture`
    /// ([`crate::recipe::lm_config`]) unless the catalog holds a model of that name.
    pub fn check_training(&self, training: &TrainingSpec) -> Result<ModelSpec, CatalogError> {
        let model = match self.get(&training.model) {
            Ok(m) => m.clone(),
            Err(e) if training.model == crate::lm::QWEN3 => crate::recipe::lm_config(training)
                .map_err(|e| CatalogError::Architecture(e.to_string()))?
                .map(|c| c.spec())
                .ok_or(e)?,
            Err(e) => return Err(e),
        };
        self.dataset(&training.dataset)?;
        Ok(model)
    }

    /// What every delta of the job must hold ([`ModelCatalog::check_training`]'s model, or
    /// for `mode = "lora"` its PEFT adapter spec, [`ModelSpec::lora_spec`] of the job's
    /// rank and target modules): the spec an upload's format check and size bound use.
    pub fn delta_spec(&self, training: &TrainingSpec) -> Result<ModelSpec, CatalogError> {
        let model = self.check_training(training)?;
        match training.mode {
            hanzod_actors::job::TrainMode::Full => Ok(model),
            hanzod_actors::job::TrainMode::Lora => {
                let targets: Vec<&str> = training
                    .lora
                    .target_modules
                    .iter()
                    .map(String::as_str)
                    .collect();
                model
                    .lora_spec(training.lora.rank as usize, &targets)
                    .map_err(|e| CatalogError::Lora(e.to_string()))
            }
        }
    }

    /// The model names, sorted.
    pub fn models(&self) -> impl Iterator<Item = &str> {
        self.models.keys().map(String::as_str)
    }

    /// The dataset names, sorted.
    pub fn datasets(&self) -> impl Iterator<Item = &str> {
        self.datasets.iter().map(String::as_str)
    }
}

/// [`trainer_for`](crate::recipe::trainer_for) with the model the spec names resolved by the built-in catalog
/// ([`ModelCatalog::builtin`]).
pub fn trainer_of(
    training: &TrainingSpec,
    job: hanzod_actors::types::JobId,
) -> Result<crate::recipe::Trainer, crate::recipe::RecipeError> {
    let model = ModelCatalog::builtin()
        .check_training(training)
        .map_err(|_| crate::recipe::RecipeError::NotBuiltIn {
            model: training.model.clone(),
        })?;
    crate::recipe::trainer_for(training, &model, job)
}

/// The `wine-mlp` recipe of a spec ([`trainer_of`]'s MLP case); [`crate::recipe::RecipeError::NoTrainer`]
/// for a language model.
pub fn recipe_of(
    training: &TrainingSpec,
    job: hanzod_actors::types::JobId,
) -> Result<crate::Recipe, crate::recipe::RecipeError> {
    match trainer_of(training, job)? {
        crate::recipe::Trainer::Mlp(t) => Ok(t.recipe),
        crate::recipe::Trainer::Lm(_) => Err(crate::recipe::RecipeError::NoTrainer {
            model: training.model.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_protocol::hzdl::DeltaDtype;

    #[test]
    fn builtin_holds_wine_mlp_and_wine_quality() {
        let c = ModelCatalog::builtin();
        let m = c.get("wine-mlp").unwrap();
        assert_eq!(m, &crate::builtin_model("wine-mlp").unwrap());
        assert!(m.max_delta_bytes(DeltaDtype::F32) > 24);
        c.dataset("wine-quality-red").unwrap();
        assert_eq!(c.models().collect::<Vec<_>>(), ["qwen3-tiny", "wine-mlp"]);
        assert_eq!(
            c.datasets().collect::<Vec<_>>(),
            ["austen", "wine-quality-red"]
        );
        assert_eq!(
            c.get("qwen3-tiny").unwrap().params,
            crate::lm::qwen3_tiny().spec().params
        );
        assert!(c.check_training(&TrainingSpec::default()).is_ok());
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let mut c = ModelCatalog::builtin();
        let e = c.get("gpt-5").unwrap_err();
        assert_eq!(
            e,
            CatalogError::UnknownModel {
                name: "gpt-5".into(),
                known: vec!["qwen3-tiny".into(), "wine-mlp".into()]
            }
        );
        assert_eq!(
            e.to_string(),
            "unknown model \"gpt-5\" (known: qwen3-tiny, wine-mlp)"
        );
        let e = c.dataset("imagenet").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown dataset \"imagenet\" (known: austen, wine-quality-red)"
        );
        let t = TrainingSpec {
            dataset: "imagenet".into(),
            ..TrainingSpec::default()
        };
        assert!(matches!(
            c.check_training(&t),
            Err(CatalogError::UnknownDataset { .. })
        ));

        // Library users add their own.
        let spec = crate::builtin_model("wine-mlp").unwrap();
        assert!(c.insert("tiny", spec.clone()).is_none());
        assert_eq!(c.insert("tiny", spec.clone()), Some(spec));
        assert!(c.insert_dataset("imagenet"));
        assert!(!c.insert_dataset("imagenet"));
        assert!(c
            .check_training(&TrainingSpec {
                model: "tiny".into(),
                ..t
            })
            .is_ok());
        assert_eq!(
            c.get("nope").unwrap_err().to_string(),
            "unknown model \"nope\" (known: qwen3-tiny, tiny, wine-mlp)"
        );
        assert!(ModelCatalog::empty().get("wine-mlp").is_err());
    }
}
