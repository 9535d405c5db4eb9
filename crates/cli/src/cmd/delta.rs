//! `hanzod delta`: inspect, sign and verify model delta files (HZDL).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

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
  hanzod delta inspect adapter.hzdl --model config.json --lora-rank 16 --lora-targets q_proj,v_proj --json")]
    Inspect {
        /// The delta file.
        file: PathBuf,
        /// The model to check names and shapes against: a built-in name (`wine-mlp`) or a
        /// Hugging Face config.json (Llama / Qwen family).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Check as a LoRA adapter of this rank (with --model).
        #[arg(long, requires = "model")]
        lora_rank: Option<usize>,
        /// The adapter's target modules, comma-separated (with --lora-rank).
        #[arg(
            long,
            value_delimiter = ',',
            requires = "lora_rank",
            default_value = "q_proj,v_proj"
        )]
        lora_targets: Vec<String>,
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

pub(crate) fn run_delta(cmd: DeltaCommand) -> ExitCode {
    use hanzod_protocol::hzdl::{payload_hash, sign_statement, verify_statement};
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let r: Result<ExitCode, String> = (|| match cmd {
        DeltaCommand::Inspect {
            file,
            model,
            lora_rank,
            lora_targets,
            json,
        } => {
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
                    Some(match lora_rank {
                        None => spec,
                        Some(r) => {
                            let targets: Vec<&str> =
                                lora_targets.iter().map(String::as_str).collect();
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
