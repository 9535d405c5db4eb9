//! `hanzod verify`: check a published checkpoint against its card and signed record.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use hanzod_daemon::config::Config;

use crate::ClientArgs;

#[derive(Args, Debug)]
pub(crate) struct VerifyArgs {
    /// A folder of a published repo, a Hub repo id (`org/name`), or the weights' CID.
    target: String,
    /// Read the publication records from this JSON file (`hanzod demo` writes
    /// `publications.json`) instead of asking the daemon at --endpoint.
    #[arg(long)]
    records: Option<PathBuf>,
    /// Read the publication records from the chain at this JSON-RPC endpoint (the
    /// `MiningPool` at --mining-pool) instead of asking the daemon. Default: the configured
    /// chain.rpc_url (HANZO_RPC) when set.
    #[arg(long)]
    rpc: Option<String>,
    /// The `MiningPool` contract (default: the configured chain.mining_pool).
    #[arg(long)]
    mining_pool: Option<String>,
    /// The orchestrator public key to trust (64 hex digits): records signed by another
    /// key fail. Without it, the key of the daemon at --endpoint is trusted when the records
    /// come from it; records from a --records file or the chain (anyone holding the
    /// orchestrator stake can record) cannot be trusted without it (exit 2).
    #[arg(long)]
    orchestrator: Option<String>,
    /// The Hub, for a repo id.
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    hf_endpoint: String,
    /// Hub token, for private repos.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    hf_token: Option<String>,
    /// The Kubo RPC API to fetch a CID from (default: the configured publish.ipfs_url, else
    /// the local object store: publish.object_dir, else <data_dir>/ipfs; or --object-dir).
    #[arg(long, env = "IPFS_URL")]
    ipfs_url: Option<String>,
    /// A local object store folder (publish.object_dir, <data_dir>/ipfs) to read a CID from.
    #[arg(long)]
    object_dir: Option<PathBuf>,
    /// Keep the files downloaded from the Hub in this folder (default: a temporary folder,
    /// removed afterwards).
    #[arg(long)]
    download_dir: Option<PathBuf>,
    #[command(flatten)]
    client: ClientArgs,
}

/// `hanzod verify`: exit 0 verified, 1 a check failed, 2 could not verify.
pub(crate) async fn run_verify(cfg: &Config, args: VerifyArgs) -> ExitCode {
    use crate::verify::{self, FetchError, Target};
    use hanzod_store::ObjectError;
    let json = args.client.json;
    let target_text = args.target.clone();
    let cannot = |e: &dyn std::fmt::Display| {
        if json {
            let out = serde_json::json!({
                "target": target_text,
                "status": "unverifiable",
                "verified": false,
                "exit": 2,
                "error": e.to_string(),
            });
            println!("{out:#}");
        } else {
            eprintln!("error: could not verify: {e}");
        }
        ExitCode::from(2)
    };
    let trusted = match args.orchestrator.as_deref().map(parse_key).transpose() {
        Ok(k) => k,
        Err(e) => return cannot(&e),
    };
    let target = match Target::parse(&args.target) {
        Ok(t) => t,
        Err(e) => return cannot(&e),
    };
    let mut _tmp = None;
    let fetched = match &target {
        Target::Folder(dir) => verify::read_folder(dir).await,
        Target::Repo(repo) => {
            let options = hanzod_adapters::hub::HubOptions {
                endpoint: args.hf_endpoint.clone(),
                token: args.hf_token.clone().filter(|t| !t.trim().is_empty()),
                ..Default::default()
            };
            let hub = match hanzod_adapters::hub::HubClient::new(&options) {
                Ok(h) => h,
                Err(e) => return cannot(&e),
            };
            let dir = match &args.download_dir {
                Some(d) => d.clone(),
                None => {
                    let d = std::env::temp_dir().join(format!(
                        "hanzod-verify-{}-{}",
                        std::process::id(),
                        rand::random::<u32>()
                    ));
                    _tmp = Some(TempDir(d.clone()));
                    d
                }
            };
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return cannot(&format!("{}: {e}", dir.display()));
            }
            let bar = (!args.client.json).then(download_bar);
            let files = verify::fetch_repo(&hub, repo, &dir, bar.as_ref()).await;
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            files
        }
        Target::Cid(cid) => {
            let url = args
                .ipfs_url
                .clone()
                .filter(|u| !u.trim().is_empty())
                .or_else(|| Some(cfg.publish.ipfs_url.clone()).filter(|u| !u.is_empty()));
            // --object-dir, else --ipfs-url / IPFS_URL, else the configured object store.
            let dir = args
                .object_dir
                .clone()
                .or_else(|| cfg.object_dir().filter(|_| url.is_none()));
            let objects: std::sync::Arc<dyn hanzod_store::ObjectStore> = match (dir, url) {
                // Reading must not create a store where there is none.
                (Some(dir), _) if !dir.join("blocks").is_dir() => {
                    return cannot(&format!(
                        "no object store at {} (no blocks/ folder; give --object-dir, \
                         or --ipfs-url for an IPFS node)",
                        dir.display()
                    ))
                }
                (Some(dir), _) => match hanzod_store::FsObjectStore::open(dir).await {
                    Ok(s) => std::sync::Arc::new(s),
                    Err(e) => return cannot(&e),
                },
                (None, Some(url)) => {
                    match hanzod_adapters::kubo::KuboObjectStore::connect(&url, Default::default())
                        .await
                    {
                        Ok(s) => std::sync::Arc::new(s),
                        Err(e) => return cannot(&e),
                    }
                }
                (None, None) => {
                    return cannot(&"a CID needs --ipfs-url (or IPFS_URL) or --object-dir")
                }
            };
            match verify::fetch_cid(&*objects, cid).await {
                // Bytes that do not hash to the CID asked for are a failed check, not an
                // unreachable source.
                Err(FetchError::Objects(ObjectError::Corrupt { expected, found })) => {
                    let verdict = verify::Verdict {
                        cid: found.clone(),
                        checks: vec![verify::Check {
                            name: "weights CID",
                            passed: false,
                            expected: Some(expected),
                            found,
                        }],
                        incomplete: None,
                    };
                    return print_verdict(&args.target, &verdict, args.client.json);
                }
                other => other,
            }
        }
    };
    let files = match fetched {
        Ok(f) => f,
        Err(e) => return cannot(&e),
    };
    // A CID target was checked against its CID by the object store as it was read.
    let (files, cid) = match &target {
        Target::Cid(cid) => match hanzod_store::objects::parse_cid(cid) {
            Ok(parsed) => (files, parsed.to_string()),
            Err(e) => return cannot(&e),
        },
        _ => match tokio::task::spawn_blocking(move || {
            let cid = hanzod_protocol::cid::cid_of(&files.weights).to_string();
            (files, cid)
        })
        .await
        {
            Ok(hashed) => hashed,
            Err(e) => return cannot(&e),
        },
    };
    let card = files.readme.as_deref().and_then(verify::card_epoch);
    let mut trusted = trusted;
    let records = match &args.records {
        Some(path) => std::fs::read(path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|b| verify::parse_records(&b).map_err(|e| format!("{}: {e}", path.display())))
            .map(|(records, skipped)| {
                for (i, why) in skipped {
                    eprintln!("warning: {}: record {i} skipped: {why}", path.display());
                }
                records
            }),
        None if args.mining_pool.is_some()
            && args.rpc.is_none()
            && cfg.chain.rpc_url.is_empty() =>
        {
            Err("--mining-pool needs --rpc (or HANZO_RPC): the chain to read it on".to_string())
        }
        None if args.rpc.is_some() || !cfg.chain.rpc_url.is_empty() => {
            let url = args
                .rpc
                .clone()
                .unwrap_or_else(|| cfg.chain.rpc_url.clone());
            let pool = args
                .mining_pool
                .clone()
                .unwrap_or_else(|| cfg.chain.mining_pool.clone());
            let pool = match pool.parse() {
                Ok(p) => p,
                Err(e) => {
                    return cannot(&format!(
                        "--mining-pool {pool:?} is not a contract address: {e}"
                    ))
                }
            };
            let timeout = std::time::Duration::from_millis(cfg.chain.call_timeout_ms);
            match hanzod_adapters::chain::EvmChain::reader(&url, pool, cfg.chain.chain_id, timeout)
                .await
            {
                Ok(chain) => {
                    use hanzod_actors::ports::Ledger;
                    chain.publications().await.map_err(|e| e.to_string())
                }
                Err(e) => {
                    // The URL may carry credentials: name it redacted.
                    let mut shown = cfg.clone();
                    shown.chain.rpc_url = url.clone();
                    Err(format!(
                        "the chain at {}: {e}",
                        shown.redacted().chain.rpc_url
                    ))
                }
            }
        }
        None => {
            let endpoint = args.client.endpoint.clone();
            let answer = match crate::client_cmds::Clients::connect(args.client.options()).await {
                Ok(mut c) => c.publications(&cid, card).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            // Without --orchestrator, the daemon the user chose to ask (over TLS when the
            // endpoint is https) vouches for its own key.
            let answer = answer.map(|(records, key)| {
                if trusted.is_none() {
                    trusted = key;
                    if let Some(k) = key {
                        eprintln!(
                            "trusting the key of the orchestrator at {endpoint}: {}",
                            hex::encode(k)
                        );
                    }
                }
                records
            });
            answer
        }
    };
    let record = records.map(|all| {
        verify::find_record(
            &all,
            verify::Lookup {
                cid: &cid,
                card,
                repo: files.repo.as_deref(),
                trusted,
            },
        )
    });
    let verdict = verify::check(&files, &cid, record, trusted);
    print_verdict(&args.target, &verdict, args.client.json)
}

/// Removes a temporary folder when dropped.
pub(crate) struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn download_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "downloading {msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// 64 hex digits → 32 bytes.
pub(crate) fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let mut key = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut key)
        .map_err(|_| format!("--orchestrator {text:?}: a public key is 64 hex digits"))?;
    Ok(key)
}

pub(crate) fn print_verdict(target: &str, v: &crate::verify::Verdict, json: bool) -> ExitCode {
    let (exit, status) = if v.verified() {
        (0, "verified")
    } else if v.refuted() {
        (1, "refuted")
    } else {
        (2, "unverifiable")
    };
    let code = ExitCode::from(exit);
    if json {
        let out = serde_json::json!({
            "target": target,
            "status": status,
            "verified": v.verified(),
            "exit": exit,
            "cid": v.cid,
            "checks": v.checks,
            "incomplete": v.incomplete,
        });
        println!("{out:#}");
        return code;
    }
    println!("{target}\n  weights CID {}", v.cid);
    for c in &v.checks {
        let mark = if c.passed { "ok  " } else { "FAIL" };
        match (&c.expected, c.passed) {
            (Some(expected), false) => println!(
                "  {mark} {:<20} expected {expected}\n       {:<20} found    {}",
                c.name, "", c.found
            ),
            _ => println!("  {mark} {:<20} {}", c.name, c.found),
        }
    }
    if v.verified() {
        println!("VERIFIED: every check passed");
    } else if !v.refuted() {
        println!(
            "CANNOT VERIFY: {}",
            v.incomplete.as_deref().unwrap_or("unknown")
        );
    } else {
        let failed: Vec<&str> = v.failures().map(|c| c.name).collect();
        println!("NOT VERIFIED: {} failed", failed.join(", "));
    }
    code
}
