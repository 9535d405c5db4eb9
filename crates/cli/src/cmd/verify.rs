//! `hanzod verify`: check a published checkpoint against its card and signed record. Also
//! where a checkpoint named by CID is found (the record source and object store flags,
//! [`SourceArgs`], and [`verify_cid`]), for `hanzod eval` and `hanzod generate` too.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use hanzod_daemon::config::Config;
use hanzod_protocol::record::SignedPublication;
use hanzod_store::ObjectStore;

use crate::verify::{self, Files, Lookup, Target, Verdict};
use crate::ClientArgs;

/// Where the signed publication records and the objects of a checkpoint are read: the
/// flags `hanzod verify`, `hanzod eval` and `hanzod generate` share.
#[derive(Args, Debug, Clone)]
pub(crate) struct SourceArgs {
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
    /// The Kubo RPC API to fetch a CID from (default: the configured publish.ipfs_url, else
    /// the local object store: publish.object_dir, else <data_dir>/ipfs; or --object-dir).
    #[arg(long, env = "IPFS_URL")]
    ipfs_url: Option<String>,
    /// A local object store folder (publish.object_dir, <data_dir>/ipfs; `hanzod demo`
    /// writes <out>/ipfs) to read a CID from.
    #[arg(long)]
    object_dir: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

impl SourceArgs {
    /// The --orchestrator key, if given. Errors: it is not 64 hex digits.
    pub(crate) fn trusted(&self) -> Result<Option<[u8; 32]>, String> {
        self.orchestrator.as_deref().map(parse_key).transpose()
    }
}

/// The object store to read a CID from: --object-dir, else --ipfs-url (IPFS_URL), else the
/// configured one (publish.ipfs_url, else publish.object_dir or <data_dir>/ipfs). Errors:
/// none is given, or it cannot be opened (a folder without `blocks/` is no store: reading
/// creates none).
pub(crate) async fn open_objects(
    cfg: &Config,
    source: &SourceArgs,
) -> Result<Arc<dyn ObjectStore>, String> {
    let url = source
        .ipfs_url
        .clone()
        .filter(|u| !u.trim().is_empty())
        .or_else(|| Some(cfg.publish.ipfs_url.clone()).filter(|u| !u.is_empty()));
    let dir = source
        .object_dir
        .clone()
        .or_else(|| cfg.object_dir().filter(|_| url.is_none()));
    match (dir, url) {
        (Some(dir), _) if !dir.join("blocks").is_dir() => Err(format!(
            "no object store at {} (no blocks/ folder; give --object-dir, or --ipfs-url for \
             an IPFS node)",
            dir.display()
        )),
        (Some(dir), _) => match hanzod_store::FsObjectStore::open(dir).await {
            Ok(s) => Ok(Arc::new(s)),
            Err(e) => Err(e.to_string()),
        },
        (None, Some(url)) => {
            match hanzod_adapters::kubo::KuboObjectStore::connect(&url, Default::default()).await {
                Ok(s) => Ok(Arc::new(s)),
                Err(e) => Err(e.to_string()),
            }
        }
        (None, None) => Err("a CID needs --ipfs-url (or IPFS_URL) or --object-dir".into()),
    }
}

/// Every publication record the source holds (--records, else the chain, else the daemon
/// at --endpoint, asked for the records of `cid` and of `card`'s (job, epoch)). Without a
/// trusted key, the daemon asked vouches for its own: `trusted` is set to it (and stderr
/// says so). Errors: the source could not be read, in words naming it.
async fn read_records(
    cfg: &Config,
    source: &SourceArgs,
    cid: &str,
    card: Option<(u64, u32)>,
    trusted: &mut Option<[u8; 32]>,
) -> Result<Vec<SignedPublication>, String> {
    if let Some(path) = &source.records {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (records, skipped) =
            verify::parse_records(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        for (i, why) in skipped {
            eprintln!("warning: {}: record {i} skipped: {why}", path.display());
        }
        return Ok(records);
    }
    if source.rpc.is_some() || !cfg.chain.rpc_url.is_empty() {
        let url = source
            .rpc
            .clone()
            .unwrap_or_else(|| cfg.chain.rpc_url.clone());
        let pool = source
            .mining_pool
            .clone()
            .unwrap_or_else(|| cfg.chain.mining_pool.clone());
        let pool = pool
            .parse()
            .map_err(|e| format!("--mining-pool {pool:?} is not a contract address: {e}"))?;
        let timeout = std::time::Duration::from_millis(cfg.chain.call_timeout_ms);
        return match hanzod_adapters::chain::EvmChain::reader(
            &url,
            pool,
            cfg.chain.chain_id,
            timeout,
        )
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
        };
    }
    if source.mining_pool.is_some() {
        return Err("--mining-pool needs --rpc (or HANZO_RPC): the chain to read it on".into());
    }
    let endpoint = &source.client.endpoint;
    let (records, key) = crate::client_cmds::Clients::connect(source.client.options())
        .await
        .map_err(|e| e.to_string())?
        .publications(cid, card)
        .await
        .map_err(|e| e.to_string())?;
    // Without --orchestrator, the daemon the user chose to ask (over TLS when the endpoint
    // is https) vouches for its own key.
    if trusted.is_none() {
        *trusted = key;
        if let Some(k) = key {
            eprintln!(
                "trusting the key of the orchestrator at {endpoint}: {}",
                hex::encode(k)
            );
        }
    }
    Ok(records)
}

/// The record that speaks for the checkpoint `lookup` describes ([`verify::find_record`]
/// among the records of `source`: `Ok(None)` when none does, `Err` when they could not be
/// read), and the orchestrator key trusted: `lookup.trusted`, else the daemon's own when
/// the records came from it.
pub(crate) async fn find_publication(
    cfg: &Config,
    source: &SourceArgs,
    mut lookup: Lookup<'_>,
) -> (Result<Option<SignedPublication>, String>, Option<[u8; 32]>) {
    let records = read_records(cfg, source, lookup.cid, lookup.card, &mut lookup.trusted).await;
    (
        records.map(|all| verify::find_record(&all, lookup)),
        lookup.trusted,
    )
}

/// A checkpoint named by the CID of its weights, fetched and checked ([`verify_cid`]).
#[derive(Debug)]
pub(crate) struct CidVerdict {
    /// The weights' CID, in its canonical form.
    pub(crate) cid: String,
    /// The files fetched: the whole repo when a record was found.
    pub(crate) files: Files,
    /// The verdict on them.
    pub(crate) verdict: Verdict,
    /// The record found for the weights, if any.
    pub(crate) record: Option<SignedPublication>,
}

/// Finds the record of the weights `cid` in `source`'s records, fetches the repo it names
/// from `source`'s object store ([`verify::fetch_published`]) and checks it
/// ([`verify::check_fetched`]), trusting `trusted` (or the daemon's key, see
/// [`find_publication`]).
///
/// Errors (no verdict can be reached): `cid` is not a CID, there is no object store, or a
/// file the record or card names is not in it (named, with its CID).
pub(crate) async fn verify_cid(
    cfg: &Config,
    source: &SourceArgs,
    cid: &str,
    trusted: Option<[u8; 32]>,
) -> Result<CidVerdict, String> {
    let cid = hanzod_store::objects::parse_cid(cid)
        .map_err(|e| e.to_string())?
        .to_string();
    let objects = open_objects(cfg, source).await?;
    let lookup = Lookup {
        cid: &cid,
        card: None,
        repo: None,
        trusted,
    };
    let (record, trusted) = find_publication(cfg, source, lookup).await;
    let found = record.as_ref().ok().and_then(Option::as_ref);
    let fetched = verify::fetch_published(&*objects, &cid, found.map(|p| &p.record))
        .await
        .map_err(|e| e.to_string())?;
    let found = found.cloned();
    let verdict = verify::check_fetched(&fetched, &cid, record, trusted);
    Ok(CidVerdict {
        cid,
        files: fetched.files,
        verdict,
        record: found,
    })
}

#[derive(Args, Debug)]
pub(crate) struct VerifyArgs {
    /// A folder of a published repo, a Hub repo id (`org/name`), or the weights' CID (the
    /// whole repo is fetched from the object store through the signed record and the card).
    target: String,
    /// The Hub, for a repo id.
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    hf_endpoint: String,
    /// Hub token, for private repos.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    hf_token: Option<String>,
    /// Keep the files downloaded from the Hub in this folder (default: a temporary folder,
    /// removed afterwards).
    #[arg(long)]
    download_dir: Option<PathBuf>,
    #[command(flatten)]
    source: SourceArgs,
}

/// `hanzod verify`: exit 0 verified, 1 a check failed, 2 could not verify.
pub(crate) async fn run_verify(cfg: &Config, args: VerifyArgs) -> ExitCode {
    let json = args.source.client.json;
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
    let trusted = match args.source.trusted() {
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
                Some(d) => match std::fs::create_dir_all(d) {
                    Ok(()) => d.clone(),
                    Err(e) => return cannot(&format!("{}: {e}", d.display())),
                },
                None => match TempDir::new("hanzod-verify") {
                    Ok(t) => _tmp.insert(t).path().to_path_buf(),
                    Err(e) => return cannot(&e),
                },
            };
            let bar = (!json).then(download_bar);
            let files = verify::fetch_repo(&hub, repo, &dir, bar.as_ref()).await;
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            files
        }
        // The whole repo, fetched through its record and checked.
        Target::Cid(cid) => {
            return match verify_cid(cfg, &args.source, cid, trusted).await {
                Ok(found) => print_verdict(&args.target, &found.verdict, json),
                Err(e) => cannot(&e),
            }
        }
    };
    let files = match fetched {
        Ok(f) => f,
        Err(e) => return cannot(&e),
    };
    let hashed = tokio::task::spawn_blocking(move || {
        let cid = hanzod_protocol::cid::cid_of(&files.weights).to_string();
        (files, cid)
    })
    .await;
    let (files, cid) = match hashed {
        Ok(hashed) => hashed,
        Err(e) => return cannot(&e),
    };
    let card = files.readme.as_deref().and_then(verify::card_epoch);
    let lookup = Lookup {
        cid: &cid,
        card,
        repo: files.repo.as_deref(),
        trusted,
    };
    let (record, trusted) = find_publication(cfg, &args.source, lookup).await;
    let verdict = verify::check(&files, &cid, record, trusted);
    print_verdict(&args.target, &verdict, json)
}

/// A temporary folder, removed when dropped.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates a fresh folder `<prefix>-<pid>-<random>` in the system's temporary folder.
    /// Errors: it cannot be created (naming it).
    pub(crate) fn new(prefix: &str) -> Result<TempDir, String> {
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(TempDir(dir))
    }

    /// The folder.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

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
