//! `hanzod eval` and `hanzod generate`: use a published language-model checkpoint (a
//! Hugging Face repo folder: `config.json`, `model.safetensors`, `tokenizer.json`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use hanzod_train::lm::{eval_text, LmCheckpoint};
use hanzod_train::qwen3::Sampling;

/// Largest `--text` file read, bytes.
const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Most tokens `generate --max-tokens` produces.
const MAX_NEW_TOKENS: usize = 4096;

#[derive(Args, Debug)]
pub(crate) struct EvalArgs {
    /// A language-model checkpoint folder (a published repo: config.json, model.safetensors,
    /// tokenizer.json).
    checkpoint: PathBuf,
    /// The text to score (UTF-8; at most 64 MiB read).
    #[arg(long)]
    text: PathBuf,
    /// Use this tokenizer.json instead of the checkpoint's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Score at most this many tokens (from the start of the text).
    #[arg(long, default_value_t = 32_768)]
    max_tokens: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    /// A language-model checkpoint folder (a published repo: config.json, model.safetensors,
    /// tokenizer.json).
    checkpoint: PathBuf,
    /// The text to continue.
    #[arg(long)]
    prompt: String,
    /// Tokens to generate (1 to 4096).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Seed of the sampling (with a temperature above 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Use this tokenizer.json instead of the checkpoint's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn usage(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(2)
}

fn load(dir: &Path, tokenizer: Option<&Path>) -> Result<LmCheckpoint, ExitCode> {
    LmCheckpoint::load(dir, tokenizer)
        .map_err(|e| usage(format!("checkpoint {}: {e}", dir.display())))
}

/// `hanzod eval`: exit 0 with the mean cross-entropy, 2 when the checkpoint or the text
/// cannot be used.
pub(crate) fn run_eval(args: EvalArgs) -> ExitCode {
    let ck = match load(&args.checkpoint, args.tokenizer.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let text = match std::fs::metadata(&args.text).and_then(|m| {
        if m.len() > MAX_TEXT_BYTES {
            Err(std::io::Error::other(format!(
                "{} bytes, more than the {MAX_TEXT_BYTES} read",
                m.len()
            )))
        } else {
            std::fs::read(&args.text)
        }
    }) {
        Ok(b) => match String::from_utf8(b) {
            Ok(t) => t,
            Err(_) => return usage(format!("--text {}: not UTF-8", args.text.display())),
        },
        Err(e) => return usage(format!("--text {}: {e}", args.text.display())),
    };
    let ev = match eval_text(
        &ck.model,
        &ck.weights,
        &ck.tokenizer,
        &text,
        args.max_tokens,
    ) {
        Ok(ev) => ev,
        Err(e) => return usage(format!("--text {}: {e}", args.text.display())),
    };
    if args.json {
        println!(
            "{:#}",
            serde_json::json!({
                "checkpoint": args.checkpoint,
                "text": args.text,
                "text_tokens": ev.text_tokens,
                "scored_tokens": ev.scored_tokens,
                "window": ev.window,
                "nats_per_token": ev.nats_per_token,
                "perplexity": ev.perplexity,
            })
        );
    } else {
        println!(
            "{:.4} nats/token (perplexity {:.2}) over {} tokens of {} ({} in the text, windows of {})",
            ev.nats_per_token,
            ev.perplexity,
            ev.scored_tokens,
            args.text.display(),
            ev.text_tokens,
            ev.window
        );
    }
    ExitCode::SUCCESS
}

/// `hanzod generate`: prints the prompt's continuation; exit 2 when the checkpoint or an
/// argument cannot be used.
pub(crate) fn run_generate(args: GenerateArgs) -> ExitCode {
    if !(1..=MAX_NEW_TOKENS).contains(&args.max_tokens) {
        return usage(format!(
            "--max-tokens must be within 1..={MAX_NEW_TOKENS}, got {}",
            args.max_tokens
        ));
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return usage(format!(
            "--temperature must be 0 or more, got {}",
            args.temperature
        ));
    }
    let ck = match load(&args.checkpoint, args.tokenizer.as_deref()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let prompt = ck.tokenizer.encode(&args.prompt);
    if prompt.is_empty() {
        return usage("--prompt encodes to no tokens");
    }
    let sampling = Sampling {
        temperature: args.temperature,
        seed: args.seed,
    };
    let eos = Some(ck.tokenizer.eos_id());
    let new = match ck
        .model
        .generate(&ck.weights, &prompt, args.max_tokens, sampling, eos)
    {
        Ok(t) => t,
        Err(e) => return usage(e),
    };
    let continuation = ck.tokenizer.decode(&new);
    if args.json {
        println!(
            "{:#}",
            serde_json::json!({
                "prompt": args.prompt,
                "continuation": continuation,
                "tokens": new,
                "temperature": args.temperature,
                "seed": args.seed,
            })
        );
    } else {
        println!("{}{continuation}", args.prompt);
    }
    ExitCode::SUCCESS
}
