//! `hanzod eval` and `hanzod generate`: use a published language-model checkpoint: a
//! Hugging Face repo folder (`config.json`, `model.safetensors`, `tokenizer.json`), or the
//! CID of its weights, whose repo is fetched from the object store through its signed
//! publication record and verified first, as `hanzod verify <CID>` does it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use hanzod_daemon::config::Config;
use hanzod_protocol::status::quote_bounded;
use hanzod_train::lm::{eval_text, LmCheckpoint, TextEval};
use hanzod_train::qwen3::Sampling;

use crate::cmd::verify::{verify_cid, SourceArgs, TempDir};
use crate::verify::{Target, TargetError};

/// Largest `--text` file read, bytes.
const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Most tokens `generate --max-tokens` produces.
const MAX_NEW_TOKENS: usize = 4096;

/// Longest untrusted text (a path, a check's values) quoted in a message, characters.
const MAX_QUOTED: usize = 200;

/// The checkpoint `eval` and `generate` use, and where a CID is fetched from.
#[derive(Args, Debug)]
pub(crate) struct CheckpointArgs {
    /// A language-model checkpoint: a folder (a published repo: config.json,
    /// model.safetensors, tokenizer.json), or the CID of its weights: the repo is then
    /// fetched from the object store (--object-dir, --ipfs-url) through its signed
    /// publication record (--records, --rpc, or the daemon at --endpoint) and verified as
    /// `hanzod verify` does (exit 1, nothing used, when a check fails; a warning when it
    /// cannot be verified, e.g. without --orchestrator).
    checkpoint: PathBuf,
    /// Use this tokenizer.json instead of the checkpoint's.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    #[command(flatten)]
    source: SourceArgs,
}

#[derive(Args, Debug)]
pub(crate) struct EvalArgs {
    /// The text to score (UTF-8; at most 64 MiB read).
    #[arg(long)]
    text: PathBuf,
    /// Score at most this many tokens (from the start of the text).
    #[arg(long, default_value_t = 32_768)]
    max_tokens: u64,
    #[command(flatten)]
    checkpoint: CheckpointArgs,
}

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
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
    #[command(flatten)]
    checkpoint: CheckpointArgs,
}

/// Why a command stopped: its exit status and the error line.
#[derive(Debug)]
struct Failure {
    /// 1: the checkpoint is not what was published; 2: it or an argument cannot be used.
    code: u8,
    /// What went wrong, naming the file, CID or argument.
    message: String,
}

impl Failure {
    fn usage(message: impl std::fmt::Display) -> Failure {
        Failure {
            code: 2,
            message: message.to_string(),
        }
    }

    /// Prints the error line on stderr; the exit status.
    fn exit(self) -> ExitCode {
        eprintln!("error: {}", self.message);
        ExitCode::from(self.code)
    }
}

/// Where a checkpoint named by CID came from.
#[derive(Debug, Clone)]
struct Provenance {
    /// The weights' CID.
    cid: String,
    /// Whether every check passed.
    verified: bool,
    /// The line printed on stderr: `verified: …`, or a warning saying what could not be
    /// verified.
    note: String,
}

/// A checkpoint loaded, and its provenance when it was named by CID.
struct Opened {
    ck: LmCheckpoint,
    fetched: Option<Provenance>,
}

fn load(dir: &Path, tokenizer: Option<&Path>, name: &str) -> Result<LmCheckpoint, Failure> {
    LmCheckpoint::load(dir, tokenizer)
        .map_err(|e| Failure::usage(format!("checkpoint {name}: {e}")))
}

/// Loads the checkpoint `args` names: a folder as it is; a CID fetched, verified and
/// written to a temporary folder first ([`fetch`]), its note printed on stderr.
fn open(cfg: &Config, args: &CheckpointArgs) -> Result<Opened, Failure> {
    let path = &args.checkpoint;
    let shown = || quote_bounded(&path.display().to_string(), MAX_QUOTED);
    let cid = if path.is_dir() {
        None
    } else {
        match path.to_str().map(Target::parse) {
            Some(Ok(Target::Folder(_))) => None,
            Some(Ok(Target::Cid(cid))) => Some(cid),
            Some(Err(e @ (TargetError::IsAFile { .. } | TargetError::NoSuchFolder { .. }))) => {
                return Err(Failure::usage(e))
            }
            _ => {
                return Err(Failure::usage(format!(
                    "{}: no such folder, and not a CID",
                    shown()
                )))
            }
        }
    };
    let tokenizer = args.tokenizer.as_deref();
    let Some(cid) = cid else {
        return Ok(Opened {
            ck: load(path, tokenizer, &path.display().to_string())?,
            fetched: None,
        });
    };
    let (dir, provenance) = fetch(cfg, &args.source, &cid)?;
    eprintln!("{}", provenance.note);
    let ck = load(dir.path(), tokenizer, &provenance.cid)?;
    Ok(Opened {
        ck,
        fetched: Some(provenance),
    })
}

/// Fetches the repo of the weights `cid` and verifies it ([`verify_cid`]), then writes it
/// into a temporary folder (removed when the returned [`TempDir`] is dropped).
///
/// Errors: exit 1 when a check fails (named, expected vs found); exit 2 when the repo
/// cannot be fetched (no store, a file missing from it, no record naming its files).
fn fetch(cfg: &Config, source: &SourceArgs, cid: &str) -> Result<(TempDir, Provenance), Failure> {
    let trusted = source.trusted().map_err(Failure::usage)?;
    let found = crate::runtime()
        .map_err(Failure::usage)?
        .block_on(verify_cid(cfg, source, cid, trusted))
        .map_err(|e| Failure::usage(format!("{cid}: {e}")))?;
    let (cid, v) = (&found.cid, &found.verdict);
    if v.refuted() {
        let failed: Vec<String> = v
            .failures()
            .map(|c| {
                let found = quote_bounded(&c.found, MAX_QUOTED);
                match &c.expected {
                    Some(e) => format!(
                        "{} failed (expected {}, found {found})",
                        c.name,
                        quote_bounded(e, MAX_QUOTED)
                    ),
                    None => format!("{} failed ({found})", c.name),
                }
            })
            .collect();
        return Err(Failure {
            code: 1,
            message: format!(
                "{cid} is not what was published, not used: {} (`hanzod verify {cid}` shows \
                 every check)",
                failed.join("; ")
            ),
        });
    }
    let Some(record) = &found.record else {
        let why = v.incomplete.as_deref().unwrap_or("no publication record");
        return Err(Failure::usage(format!(
            "{cid}: {}: its config.json and tokenizer.json are found through its signed \
             publication record",
            quote_bounded(why, MAX_QUOTED)
        )));
    };
    let note = if v.verified() {
        let signer = hex::encode(record.signer);
        format!(
            "verified: job {} epoch {} signed by {}…",
            record.record.job.0,
            record.record.epoch,
            &signer[..16]
        )
    } else {
        let why = v
            .incomplete
            .as_deref()
            .unwrap_or("a check could not be made");
        format!(
            "warning: {cid} not verified: {}; using it anyway",
            quote_bounded(why, MAX_QUOTED)
        )
    };
    let dir = TempDir::new("hanzod-checkpoint").map_err(Failure::usage)?;
    found
        .files
        .write_folder(dir.path())
        .map_err(|e| Failure::usage(format!("{cid}: writing the repo: {e}")))?;
    let provenance = Provenance {
        cid: cid.clone(),
        verified: v.verified(),
        note,
    };
    Ok((dir, provenance))
}

/// `--json` output `out` with the CID and whether it verified, when the checkpoint was
/// named by CID.
fn with_provenance(mut out: serde_json::Value, fetched: Option<&Provenance>) -> serde_json::Value {
    if let (Some(p), Some(map)) = (fetched, out.as_object_mut()) {
        map.insert("cid".into(), p.cid.clone().into());
        map.insert("verified".into(), p.verified.into());
    }
    out
}

/// The text of `--text`, at most [`MAX_TEXT_BYTES`], UTF-8.
fn read_text(path: &Path) -> Result<String, Failure> {
    let bytes = std::fs::metadata(path).and_then(|m| {
        if m.len() > MAX_TEXT_BYTES {
            Err(std::io::Error::other(format!(
                "{} bytes, more than the {MAX_TEXT_BYTES} read",
                m.len()
            )))
        } else {
            std::fs::read(path)
        }
    });
    match bytes {
        Ok(b) => String::from_utf8(b)
            .map_err(|_| Failure::usage(format!("--text {}: not UTF-8", path.display()))),
        Err(e) => Err(Failure::usage(format!("--text {}: {e}", path.display()))),
    }
}

/// Scores `--text` with the checkpoint; its provenance when it was named by CID.
fn eval(cfg: &Config, args: &EvalArgs) -> Result<(TextEval, Option<Provenance>), Failure> {
    let text = read_text(&args.text)?;
    let Opened { ck, fetched } = open(cfg, &args.checkpoint)?;
    let ev = eval_text(
        &ck.model,
        &ck.weights,
        &ck.tokenizer,
        &text,
        args.max_tokens,
    )
    .map_err(|e| Failure::usage(format!("--text {}: {e}", args.text.display())))?;
    Ok((ev, fetched))
}

/// `hanzod eval`: exit 0 with the mean cross-entropy, 1 when a checkpoint named by CID is
/// not what was published, 2 when the checkpoint or the text cannot be used.
pub(crate) fn run_eval(cfg: &Config, args: EvalArgs) -> ExitCode {
    let (ev, fetched) = match eval(cfg, &args) {
        Ok(done) => done,
        Err(failure) => return failure.exit(),
    };
    if args.checkpoint.source.client.json {
        let out = serde_json::json!({
            "checkpoint": args.checkpoint.checkpoint,
            "text": args.text,
            "text_tokens": ev.text_tokens,
            "scored_tokens": ev.scored_tokens,
            "window": ev.window,
            "nats_per_token": ev.nats_per_token,
            "perplexity": ev.perplexity,
        });
        println!("{:#}", with_provenance(out, fetched.as_ref()));
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

/// The continuation of `--prompt` (token ids) and its text; the checkpoint's provenance
/// when it was named by CID.
fn generate(
    cfg: &Config,
    args: &GenerateArgs,
) -> Result<(Vec<u32>, String, Option<Provenance>), Failure> {
    if !(1..=MAX_NEW_TOKENS).contains(&args.max_tokens) {
        return Err(Failure::usage(format!(
            "--max-tokens must be within 1..={MAX_NEW_TOKENS}, got {}",
            args.max_tokens
        )));
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(Failure::usage(format!(
            "--temperature must be 0 or more, got {}",
            args.temperature
        )));
    }
    let Opened { ck, fetched } = open(cfg, &args.checkpoint)?;
    let prompt = ck.tokenizer.encode(&args.prompt);
    if prompt.is_empty() {
        return Err(Failure::usage("--prompt encodes to no tokens"));
    }
    let sampling = Sampling {
        temperature: args.temperature,
        seed: args.seed,
    };
    let eos = Some(ck.tokenizer.eos_id());
    let new = ck
        .model
        .generate(&ck.weights, &prompt, args.max_tokens, sampling, eos)
        .map_err(Failure::usage)?;
    let continuation = ck.tokenizer.decode(&new);
    Ok((new, continuation, fetched))
}

/// `hanzod generate`: prints the prompt's continuation; exit 1 when a checkpoint named by
/// CID is not what was published, 2 when the checkpoint or an argument cannot be used.
pub(crate) fn run_generate(cfg: &Config, args: GenerateArgs) -> ExitCode {
    let (new, continuation, fetched) = match generate(cfg, &args) {
        Ok(done) => done,
        Err(failure) => return failure.exit(),
    };
    if args.checkpoint.source.client.json {
        let out = serde_json::json!({
            "prompt": args.prompt,
            "continuation": continuation,
            "tokens": new,
            "temperature": args.temperature,
            "seed": args.seed,
        });
        println!("{:#}", with_provenance(out, fetched.as_ref()));
    } else {
        println!("{}{continuation}", args.prompt);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use hanzod_actors::types::{JobId, Timestamp};
    use hanzod_protocol::cid::cid_of;
    use hanzod_protocol::identity::Identity;
    use hanzod_protocol::record::{sign, PublicationRecord};
    use hanzod_store::registry::{ModelCard, TOKENIZER_FILE};
    use hanzod_train::qwen3::{Qwen3, Qwen3Config};
    use hanzod_train::text::{Tokenizer, AUSTEN_VOCAB};

    #[derive(Parser)]
    struct Eval {
        #[command(flatten)]
        args: EvalArgs,
    }

    /// A checkpoint published as the sink publishes one: a folder, an object store holding
    /// each file by CID, and a records file holding its signed record.
    struct Published {
        scratch: PathBuf,
        folder: PathBuf,
        objects: PathBuf,
        records: PathBuf,
        text: PathBuf,
        cid: String,
        config_cid: String,
        key: String,
    }

    impl Drop for Published {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.scratch);
        }
    }

    /// A Qwen3 far smaller than qwen3-tiny, for the built-in tokenizer.
    fn tiny() -> Qwen3Config {
        Qwen3Config {
            vocab_size: AUSTEN_VOCAB,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 16,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            max_position_embeddings: 64,
            tie_word_embeddings: true,
            initializer_range: 0.02,
            bos_token_id: None,
            eos_token_id: Some(Tokenizer::austen().eos_id()),
        }
    }

    fn publish(name: &str) -> Published {
        let scratch = std::env::temp_dir().join(format!("hanzod-lm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let folder = scratch.join("repo");
        std::fs::create_dir_all(&folder).expect("dir");
        let model = Qwen3::new(tiny()).expect("model");
        let weights = model.init(3).to_safetensors();
        let config = model.config().to_json().into_bytes();
        let tokenizer = Tokenizer::austen().to_json().into_bytes();
        let card = ModelCard {
            cid: cid_of(&weights).to_string(),
            epoch: 1,
            job: 5,
            quality: 6.5,
            base_model: None,
            license: "apache-2.0".into(),
            model: "qwen3-tiny".into(),
            dataset: "austen".into(),
            files: [(TOKENIZER_FILE.to_string(), cid_of(&tokenizer).to_string())].into(),
        };
        let files = crate::verify::Files {
            weights,
            config: Some(config),
            readme: Some(card.render().into_bytes()),
            others: [(TOKENIZER_FILE.to_string(), tokenizer)].into(),
            ..Default::default()
        };
        files.write_folder(&folder).expect("folder");
        let objects = scratch.join("ipfs");
        crate::runtime()
            .expect("runtime")
            .block_on(crate::verify::stored_in(&objects, &files));
        let key = Identity::from_seed([5; 32]);
        let record = sign(
            PublicationRecord {
                job: JobId(5),
                epoch: 1,
                cid: card.cid.clone(),
                config_cid: cid_of(files.config.as_deref().unwrap_or_default()).to_string(),
                card_cid: cid_of(files.readme.as_deref().unwrap_or_default()).to_string(),
                hf_repo: String::new(),
                quality: card.quality,
                timestamp: Timestamp(1_700_000_000_000),
            },
            &key,
        );
        let records = scratch.join("publications.json");
        std::fs::write(&records, serde_json::to_vec(&[&record]).expect("json")).expect("write");
        let text = scratch.join("text.txt");
        let passage = "It is a truth universally acknowledged, that a single man in possession \
                       of a good fortune, must be in want of a wife. ";
        std::fs::write(&text, passage.repeat(8)).expect("write");
        Published {
            folder,
            objects,
            records,
            text,
            cid: card.cid,
            config_cid: record.record.config_cid.clone(),
            key: hex::encode(key.node_id().0),
            scratch,
        }
    }

    fn config() -> Config {
        let mut cfg = Config::load(None, |_| None).expect("config");
        cfg.data_dir.clear();
        cfg
    }

    /// `hanzod eval <checkpoint> --text … <extra…>` of `p`, scoring 200 tokens at most.
    fn eval_of(
        p: &Published,
        checkpoint: &str,
        extra: &[&str],
    ) -> Result<(TextEval, Option<Provenance>), Failure> {
        let text = p.text.display().to_string();
        let objects = p.objects.display().to_string();
        let records = p.records.display().to_string();
        let mut argv = vec![
            "eval",
            checkpoint,
            "--text",
            &text,
            "--max-tokens",
            "200",
            "--object-dir",
            &objects,
            "--records",
            &records,
        ];
        argv.extend(extra);
        let args = Eval::try_parse_from(argv).expect("arguments").args;
        eval(&config(), &args)
    }

    #[test]
    fn eval_by_cid_scores_as_the_published_folder_does() {
        let p = publish("eval");
        let folder = p.folder.display().to_string();
        let (by_folder, none) = eval_of(&p, &folder, &[])
            .map_err(|f| f.message)
            .expect("eval");
        assert!(none.is_none());
        assert!(by_folder.scored_tokens > 50, "{by_folder:?}");
        let (by_cid, fetched) = eval_of(&p, &p.cid, &["--orchestrator", &p.key])
            .map_err(|f| f.message)
            .expect("eval by CID");
        assert_eq!(by_cid, by_folder);
        let fetched = fetched.expect("provenance");
        assert!(fetched.verified);
        assert_eq!(fetched.cid, p.cid);
        assert_eq!(
            fetched.note,
            format!("verified: job 5 epoch 1 signed by {}…", &p.key[..16])
        );
        // Without a trusted key it cannot be verified: used, with a warning saying why.
        let (unverified, fetched) = eval_of(&p, &p.cid, &[])
            .map_err(|f| f.message)
            .expect("eval by CID");
        assert_eq!(unverified, by_folder);
        let fetched = fetched.expect("provenance");
        assert!(!fetched.verified);
        assert!(
            fetched.note.starts_with("warning: ")
                && fetched.note.contains("no orchestrator key is trusted"),
            "{}",
            fetched.note
        );
        let json = with_provenance(serde_json::json!({"nats_per_token": 1.0}), Some(&fetched));
        assert_eq!(json["cid"], p.cid.as_str());
        assert_eq!(json["verified"], false);
    }

    #[test]
    fn a_refuted_or_incomplete_checkpoint_is_not_evaluated() {
        let p = publish("refuted");
        // The file of the block named `cid` in the object store of `p`.
        let block = |p: &Published, cid: &str| {
            p.objects.join("blocks").join(
                hanzod_store::objects::parse_cid(cid)
                    .expect("cid")
                    .to_string(),
            )
        };
        // Another config.json under the signed config's CID: exit 1, naming the check.
        std::fs::write(block(&p, &p.config_cid), br#"{"model_type": "qwen3"}"#).expect("write");
        let f = eval_of(&p, &p.cid, &["--orchestrator", &p.key]).expect_err("refuted");
        assert_eq!(f.code, 1, "{}", f.message);
        assert!(
            f.message.contains("record: config failed") && f.message.contains(&p.config_cid),
            "{}",
            f.message
        );
        // The tokenizer missing from the store: exit 2, naming it and its CID.
        let p = publish("missing");
        let card =
            ModelCard::parse(&std::fs::read_to_string(p.folder.join("README.md")).expect("card"))
                .expect("card");
        let tokenizer_cid = &card.files[TOKENIZER_FILE];
        std::fs::remove_file(block(&p, tokenizer_cid)).expect("rm");
        let f = eval_of(&p, &p.cid, &["--orchestrator", &p.key]).expect_err("missing");
        assert_eq!(f.code, 2, "{}", f.message);
        assert!(
            f.message.contains(TOKENIZER_FILE) && f.message.contains(tokenizer_cid.as_str()),
            "{}",
            f.message
        );
        // No record of these weights: exit 2, saying their files cannot be found.
        std::fs::write(&p.records, b"[]").expect("write");
        let f = eval_of(&p, &p.cid, &["--orchestrator", &p.key]).expect_err("no record");
        assert_eq!(f.code, 2, "{}", f.message);
        assert!(f.message.contains("holds no record"), "{}", f.message);
        // Neither a folder nor a CID.
        let f = eval_of(&p, "nothing-here", &[]).expect_err("nothing");
        assert_eq!(f.code, 2);
        assert!(
            f.message.contains("no such folder, and not a CID"),
            "{}",
            f.message
        );
    }
}
