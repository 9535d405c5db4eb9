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
