//! `hanzod delta`: inspect, sign and verify model delta files (HZDL).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use hanzod_protocol::peft::{AdapterConfig, AdapterConfigError, MAX_ADAPTER_CONFIG_BYTES};

/// The statement a delta is signed with (DESIGN §6).
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct StatementArgs {
    /// Job id.
    #[arg(long)]
    job: u64,
    /// Epoch, 0-based.
    #[arg(long)]
    epoch: u32,
    /// The node's local step.
    #[arg(long)]
    step: u64,
    /// The training loss claimed at that step.
    #[arg(long)]
    loss: f64,
}

impl StatementArgs {
    fn statement(&self) -> hanzod_protocol::hzdl::Statement {
        hanzod_protocol::hzdl::Statement {
            job: self.job,
            epoch: self.epoch,
            step: self.step,
            claimed_loss: self.loss,
        }
    }
}

#[derive(Subcommand, Debug)]
pub(crate) enum DeltaCommand {
    /// Print the header and tensors (name, dtype, shape, L2 norm) and the verdict of the
    /// format check; exit 0 when valid, 1 otherwise.
    #[command(after_help = "\
Examples:
  hanzod delta inspect delta.hzdl
  hanzod delta inspect delta.hzdl --model wine-mlp
  hanzod delta inspect delta.hzdl --model Qwen3-0.6B/config.json
  hanzod delta inspect adapter.hzdl --model config.json --lora-rank 16 --lora-targets q_proj,v_proj --json
  hanzod delta inspect adapter.hzdl --model config.json --adapter-config adapter_config.json")]
    Inspect {
        /// The delta file.
        file: PathBuf,
        /// The model to check names and shapes against: a built-in name (`wine-mlp`) or a
        /// Hugging Face config.json (Llama / Qwen family).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Check as a LoRA adapter of this rank (with --model).
        #[arg(long, requires = "model", conflicts_with = "adapter_config")]
        lora_rank: Option<usize>,
        /// The adapter's target modules, comma-separated (with --lora-rank).
        #[arg(
            long,
            value_delimiter = ',',
            requires = "lora_rank",
            default_value = "q_proj,v_proj"
        )]
        lora_targets: Vec<String>,
        /// Check as the LoRA adapter a PEFT `adapter_config.json` describes (its `r` and
        /// `target_modules`; with --model, instead of --lora-rank and --lora-targets).
        #[arg(long, requires = "model", value_name = "PATH")]
        adapter_config: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a LoRA job's delta as a PEFT adapter folder: `adapter_model.safetensors` (f32,
    /// the delta's PEFT tensor names) and the `adapter_config.json` the job implies (its
    /// rank, `lora_alpha`, target modules; `base_model_name_or_path` = the checkpoint the
    /// adapter was trained on), loadable with `peft.PeftModel.from_pretrained(model,
    /// folder)` on that checkpoint. An epoch-e adapter belongs on the checkpoint published
    /// for epoch e − 1 (`--base`); for epoch 0 that is the job's `base`, or its seed's
    /// weights (the model name).
    #[command(
        after_help = "Example:\n  hanzod delta to-peft node-3.hzdl --job config/job.lora.example.toml --out adapter/"
    )]
    ToPeft {
        /// The delta file (HZDL, kind LoRA).
        file: PathBuf,
        /// The job file (TOML) the delta was trained for (`mode = "lora"`).
        #[arg(long)]
        job: PathBuf,
        /// The folder to write (created if missing; the two files are replaced).
        #[arg(long)]
        out: PathBuf,
        /// The checkpoint the adapter was trained on (its CID or Hub repo): required for a
        /// delta of epoch 1 or later (its header's base version).
        #[arg(long)]
        base: Option<String>,
    },
    /// Sign a delta's statement with a node key; prints the signature (hex).
    #[command(
        after_help = "Example:\n  hanzod delta sign delta.hzdl --key node.key --job 1 --epoch 0 --step 500 --loss 2.31"
    )]
    Sign {
        /// The delta file.
        file: PathBuf,
        /// The node key.
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        statement: StatementArgs,
    },
    /// Verify a delta's signed statement; exit 0 when valid, 1 otherwise.
    #[command(
        after_help = "Example:\n  hanzod delta verify delta.hzdl --node <hex id> --signature <hex> --job 1 --epoch 0 --step 500 --loss 2.31"
    )]
    Verify {
        /// The delta file.
        file: PathBuf,
        /// The signing node's id (hex public key).
        #[arg(long)]
        node: String,
        /// The signature (hex, 64 bytes).
        #[arg(long)]
        signature: String,
        #[command(flatten)]
        statement: StatementArgs,
    },
}

/// Why `--adapter-config` could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdapterFileError {
    /// The file could not be opened or read.
    #[error("--adapter-config {path}: {source}")]
    Io {
        /// The path, as given.
        path: String,
        /// The file system's error.
        source: std::io::Error,
    },
    /// The file is larger than the bound (checked before reading it).
    #[error("--adapter-config {path}: {source}")]
    TooLarge {
        /// The path, as given.
        path: String,
        /// The size refusal.
        source: AdapterConfigError,
    },
    /// The file is not UTF-8 text.
    #[error("--adapter-config {path}: not UTF-8 text")]
    NotText {
        /// The path, as given.
        path: String,
    },
    /// The file is read but refused ([`AdapterConfigError`]).
    #[error("--adapter-config {path}: {source}")]
    Refused {
        /// The path, as given.
        path: String,
        /// Why.
        source: AdapterConfigError,
    },
}

/// Reads a PEFT `adapter_config.json` at `path`: its size is checked against
/// [`MAX_ADAPTER_CONFIG_BYTES`] before it is read (and the read stops one byte past the
/// bound, should the file grow meanwhile), then [`AdapterConfig::from_json`].
///
/// Errors: [`AdapterFileError`].
pub(crate) fn read_adapter_config(
    path: &std::path::Path,
) -> Result<AdapterConfig, AdapterFileError> {
    use std::io::Read;
    let shown = path.display().to_string();
    let io = |source| AdapterFileError::Io {
        path: shown.clone(),
        source,
    };
    let too_large = |bytes| AdapterFileError::TooLarge {
        path: shown.clone(),
        source: AdapterConfigError::TooLarge { bytes },
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > MAX_ADAPTER_CONFIG_BYTES {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(MAX_ADAPTER_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_ADAPTER_CONFIG_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|_| AdapterFileError::NotText {
        path: shown.clone(),
    })?;
    AdapterConfig::from_json(&text).map_err(|source| AdapterFileError::Refused {
        path: shown.clone(),
        source,
    })
}

/// The PEFT adapter folder of a LoRA delta ([`DeltaCommand::ToPeft`]): `(file name, bytes)`
/// of `adapter_model.safetensors` (the delta's factors in f32, checked against the job's
/// adapter layout: kind, names, shapes, finite) and `adapter_config.json`
/// ([`hanzod_protocol::peft::adapter_config_json`] of the job's `[training.lora]`, with
/// `base_model_name_or_path` = `base`, else for a delta of base version 0 the job's `base`
/// or model name).
///
/// Errors: a job that is not a LoRA job or has no trainer, a delta that does not parse or
/// is not that adapter, a delta of a later epoch without `base`.
pub(crate) fn to_peft(
    delta: &[u8],
    training: &hanzod_actors::job::TrainingSpec,
    base: Option<&str>,
) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
    let trainer = hanzod_train::trainer_of(training, hanzod_actors::types::JobId(0))?;
    let Some(lora) = trainer.lora() else {
        anyhow::bail!(
            "the job trains every parameter (mode = \"full\"): its deltas are not adapters"
        );
    };
    let view = hanzod_protocol::hzdl::DeltaView::parse(delta)?;
    let adapter = hanzod_train::Weights::from_delta_view(&view, trainer.delta_layout())?;
    if let Some(b) = base {
        let ok = !b.is_empty()
            && b.len() <= 256
            && !b.chars().any(|c| c.is_whitespace() || c.is_control());
        if !ok {
            anyhow::bail!(
                "--base {:?} is not a checkpoint CID or Hub repo id (1 to 256 characters, no spaces)",
                hanzod_protocol::status::quote_bounded(b, 64)
            );
        }
    }
    let version = view.header.base_version;
    let base = match (base, version) {
        (Some(b), _) => b,
        (None, 0) => training.base.as_deref().unwrap_or(training.model.as_str()),
        (None, v) => anyhow::bail!(
            "the delta was trained on the checkpoint published for epoch {}: name it with --base",
            v - 1
        ),
    };
    let config = hanzod_protocol::peft::adapter_config_json(
        lora.rank() as u32,
        lora.alpha(),
        lora.target_modules(),
        Some(base),
    );
    Ok(vec![
        ("adapter_model.safetensors", adapter.to_safetensors()),
        ("adapter_config.json", config.into_bytes()),
    ])
}

pub(crate) fn run_delta(cmd: DeltaCommand) -> ExitCode {
    use hanzod_protocol::hzdl::{payload_hash, sign_statement, verify_statement};
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let r: Result<ExitCode, String> = (|| match cmd {
        DeltaCommand::Inspect {
            file,
            model,
            lora_rank,
            lora_targets,
            adapter_config,
            json,
        } => {
            // Read before the delta: a refused adapter config says so whatever the file.
            let adapter = adapter_config
                .as_deref()
                .map(read_adapter_config)
                .transpose()
                .map_err(|e| e.to_string())?;
            let bytes = read(&file)?;
            let spec = match &model {
                None => None,
                Some(p) => {
                    use hanzod_protocol::model::ModelSpec;
                    // A built-in name (`wine-mlp`), else a Hugging Face config.json.
                    let spec = match p.to_str().and_then(hanzod_train::builtin_model) {
                        Some(spec) => spec,
                        None => {
                            let text = std::fs::read_to_string(p).map_err(|e| {
                                format!(
                                    "--model {}: not a built-in model ({}) nor a readable \
                                     config.json: {e}",
                                    p.display(),
                                    hanzod_train::catalog::BUILTIN_MODELS.join(", ")
                                )
                            })?;
                            ModelSpec::from_hf_config(&text)
                                .map_err(|e| format!("{}: {e}", p.display()))?
                        }
                    };
                    let lora = match (&adapter, lora_rank) {
                        (Some(a), _) => Some((a.rank as usize, a.target_modules.clone())),
                        (None, Some(r)) => Some((r, lora_targets.clone())),
                        (None, None) => None,
                    };
                    Some(match lora {
                        None => spec,
                        Some((r, targets)) => {
                            let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
                            spec.lora_spec(r, &targets).map_err(|e| e.to_string())?
                        }
                    })
                }
            };
            let report = hanzod_pipeline::inspect::inspect(&bytes, spec.as_ref());
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
                );
            } else {
                println!("{report}");
            }
            Ok(if report.valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        DeltaCommand::ToPeft {
            file,
            job,
            out,
            base,
        } => {
            let spec = crate::client_cmds::JobSpecFile::load(&job).map_err(|e| e.to_string())?;
            let files = to_peft(&read(&file)?, &spec.training, base.as_deref())
                .map_err(|e| e.to_string())?;
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            for (name, bytes) in files {
                let path = out.join(name);
                std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            println!(
                "wrote {} (adapter_model.safetensors, adapter_config.json)",
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        DeltaCommand::Sign {
            file,
            key,
            statement,
        } => {
            let bytes = read(&file)?;
            let id = hanzod_protocol::identity::Identity::load(&key).map_err(|e| e.to_string())?;
            let sig = sign_statement(&id, &statement.statement(), &payload_hash(&bytes));
            println!("{}", hex::encode(sig));
            eprintln!("signed by node {}", id.node_id());
            Ok(ExitCode::SUCCESS)
        }
        DeltaCommand::Verify {
            file,
            node,
            signature,
            statement,
        } => {
            let bytes = read(&file)?;
            let node: hanzod_actors::types::NodeId =
                node.parse().map_err(|e| format!("--node: {e}"))?;
            let key = hanzod_protocol::identity::verifying_key(&node)
                .map_err(|e| format!("--node: {e}"))?;
            let sig = hex::decode(signature.trim()).map_err(|e| format!("--signature: {e}"))?;
            match verify_statement(&key, &statement.statement(), &payload_hash(&bytes), &sig) {
                Ok(()) => {
                    println!("valid: signed by {node}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    println!("INVALID: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    })();
    r.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        delta: DeltaCommand,
    }

    fn parse(args: &[&str]) -> Result<DeltaCommand, String> {
        Cli::try_parse_from(std::iter::once("delta").chain(args.iter().copied()))
            .map(|c| c.delta)
            .map_err(|e| e.to_string())
    }

    /// The LoRA adapter fixture PEFT 0.21.2 wrote (r 4, alpha 8, q/v/down_proj).
    fn peft_fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../train/tests/fixtures/qwen3/lora/adapter_config.json")
    }

    fn temp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hanzod-adapter-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn a_lora_delta_becomes_a_peft_folder_that_reads_back() {
        use hanzod_actors::job::{LoraSpec, TrainMode, TrainingSpec};
        let training = TrainingSpec {
            model: "qwen3-tiny".into(),
            dataset: "austen".into(),
            mode: TrainMode::Lora,
            lora: LoraSpec {
                rank: 4,
                alpha: 8.0,
                target_modules: vec!["v_proj".into(), "q_proj".into()],
                dropout: 0.0,
            },
            local_steps: 1,
            batch_size: 2,
            seq_len: 16,
            validation_tokens: 64,
            local_lr: 3e-3,
            ..TrainingSpec::default()
        };
        let trainer = hanzod_train::trainer_of(&training, hanzod_actors::types::JobId(0)).unwrap();
        let run = trainer.local_delta(&trainer.init(), &[5; 32], 0).unwrap();
        let bytes = run.delta.to_delta_bytes(0).unwrap();
        let files = to_peft(&bytes, &training, None).unwrap();
        let get = |n: &str| &files.iter().find(|(f, _)| *f == n).unwrap().1;
        // The weights: exactly the delta's factors under their PEFT names.
        let back = hanzod_train::Weights::from_safetensors(
            get("adapter_model.safetensors"),
            trainer.delta_layout(),
        )
        .unwrap();
        assert_eq!(back, run.delta);
        // The config: what the job says, readable by the parser PEFT's own files pass.
        let cfg =
            AdapterConfig::from_json(std::str::from_utf8(get("adapter_config.json")).unwrap())
                .unwrap();
        assert_eq!((cfg.rank, cfg.alpha), (4, 8.0));
        assert_eq!(cfg.target_modules, ["q_proj", "v_proj"]);
        assert_eq!(cfg.base_model_name_or_path.as_deref(), Some("qwen3-tiny"));
        // A full-parameter job has no adapter; a delta of another adapter is refused.
        let full = TrainingSpec {
            mode: TrainMode::Full,
            lora: LoraSpec::default(),
            ..training.clone()
        };
        assert!(to_peft(&bytes, &full, None)
            .unwrap_err()
            .to_string()
            .contains("full"));
        // A later epoch's adapter needs the checkpoint it was trained on.
        let later = run.delta.to_delta_bytes(3).unwrap();
        assert!(to_peft(&later, &training, None)
            .unwrap_err()
            .to_string()
            .contains("epoch 2"));
        assert!(to_peft(&later, &training, Some("hello world")).is_err());
        let files = to_peft(&later, &training, Some("bafkreib")).unwrap();
        let cfg = AdapterConfig::from_json(std::str::from_utf8(&files[1].1).unwrap()).unwrap();
        assert_eq!(cfg.base_model_name_or_path.as_deref(), Some("bafkreib"));
        let other = TrainingSpec {
            lora: LoraSpec {
                rank: 8,
                ..training.lora.clone()
            },
            ..training
        };
        assert!(to_peft(&bytes, &other, None).is_err());
    }

    #[test]
    fn adapter_config_conflicts_with_lora_rank_and_needs_a_model() {
        let err = parse(&[
            "inspect",
            "d.hzdl",
            "--model",
            "c.json",
            "--lora-rank",
            "4",
            "--adapter-config",
            "a.json",
        ])
        .map(|_| ())
        .unwrap_err();
        assert!(err.contains("cannot be used with"), "{err}");
        let err = parse(&["inspect", "d.hzdl", "--adapter-config", "a.json"])
            .map(|_| ())
            .unwrap_err();
        assert!(err.contains("--model"), "{err}");
        // --lora-targets' default does not count as given.
        match parse(&[
            "inspect",
            "d.hzdl",
            "--model",
            "c.json",
            "--adapter-config",
            "a.json",
        ])
        .unwrap()
        {
            DeltaCommand::Inspect {
                adapter_config,
                lora_rank,
                ..
            } => {
                assert_eq!(adapter_config, Some(PathBuf::from("a.json")));
                assert_eq!(lora_rank, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_the_adapter_config_peft_wrote() {
        let c = read_adapter_config(&peft_fixture()).unwrap();
        assert_eq!((c.rank, c.alpha), (4, 8.0));
        assert_eq!(c.target_modules, ["down_proj", "q_proj", "v_proj"]);
    }

    #[test]
    fn adapter_config_files_are_bounded_and_refusals_typed() {
        let big = temp(
            "big.json",
            &vec![b' '; MAX_ADAPTER_CONFIG_BYTES as usize + 1],
        );
        match read_adapter_config(&big).unwrap_err() {
            AdapterFileError::TooLarge { source, .. } => assert_eq!(
                source,
                AdapterConfigError::TooLarge {
                    bytes: MAX_ADAPTER_CONFIG_BYTES + 1
                }
            ),
            other => panic!("{other}"),
        }
        let regex = temp(
            "regex.json",
            br#"{"peft_type": "LORA", "r": 8, "target_modules": ".*\\.(q|v)_proj"}"#,
        );
        let e = read_adapter_config(&regex).unwrap_err();
        assert!(
            matches!(
                &e,
                AdapterFileError::Refused {
                    source: AdapterConfigError::TargetPattern { .. },
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("regular expression"), "{e}");
        let binary = temp("binary.json", &[0xff, 0xfe, 0x00]);
        assert!(matches!(
            read_adapter_config(&binary).unwrap_err(),
            AdapterFileError::NotText { .. }
        ));
        assert!(matches!(
            read_adapter_config(std::path::Path::new("/nonexistent/adapter_config.json"))
                .unwrap_err(),
            AdapterFileError::Io { .. }
        ));
    }
}
