//! The `hanzod` binary: parses arguments, loads configuration, runs a subcommand.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use hanzod::client::ClientOptions;
use hanzod::config::{Config, LogFormat};

/// hanzod — the orchestrator for decentralized training.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None, after_help = "\
Examples:
  hanzod serve                                   the daemon: gRPC on :9550, metrics on :9551
  hanzod keygen --out node.key                   a node identity (Ed25519)
  hanzod node --key node.key --region eu-west --listen 0.0.0.0:9560 --advertise 10.0.0.5:9560
  hanzod job submit config/job.example.toml      submit a training job
  hanzod job watch 1                             follow it until it ends
  hanzod nodes                                   registered nodes
  hanzod ring 1                                  job 1's ring, in order
  hanzod sim                                     64 simulated nodes with seeded faults
  hanzod config                                  the effective configuration
")]
struct Cli {
    /// A TOML file layered over the embedded defaults (config/default.toml).
    #[arg(long, global = true, env = "HANZOD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// How client commands reach the daemon.
#[derive(Args, Debug, Clone)]
struct ClientArgs {
    /// The daemon: http://host:port, or https://host:port for TLS; a comma-separated list
    /// for replicas (the first that answers is used; node agents move to the next when one
    /// fails or stands by).
    #[arg(long, env = "HANZOD_ENDPOINT", default_value = "http://127.0.0.1:9550")]
    endpoint: String,
    /// PEM CA of the daemon's certificate.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// PEM client certificate (mutual TLS).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM client key (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Name to check the daemon's certificate against (default: the endpoint's host).
    #[arg(long)]
    tls_domain: Option<String>,
    /// Bearer token for job and admin calls.
    #[arg(long, env = "HANZOD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Deadline of each call, ms.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl ClientArgs {
    fn options(&self) -> ClientOptions {
        ClientOptions {
            endpoint: self.endpoint.clone(),
            ca: self.ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            domain: self.tls_domain.clone(),
            admin_token: self.admin_token.clone(),
            call_timeout_ms: self.timeout_ms,
            ..ClientOptions::default()
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The main job: start the orchestrator and N node processes on loopback, train the
    /// built-in wine-mlp on Wine Quality (red) to Published, with optional faults, and print
    /// the summary. Exit 0 only when the job reaches Published.
    #[command(after_help = "\
Examples:
  hanzod demo
  hanzod demo --nodes 4 --epochs 3
  hanzod demo --kill 1 --byzantine 2 --attack mixed
  hanzod demo --scenario config/demo.example.toml --json")]
    Demo {
        #[command(flatten)]
        args: hanzod::demo::DemoArgs,
        /// Print the summary as JSON (stdout) instead of tables.
        #[arg(long)]
        json: bool,
        /// No live view: log lines on stderr instead.
        #[arg(long)]
        no_progress: bool,
    },
    /// Run the daemon until SIGTERM or Ctrl-C.
    #[command(after_help = "\
Examples:
  hanzod serve
  hanzod serve --config prod.toml
  HANZOD_ADMIN_TOKEN=s3cret hanzod serve")]
    Serve,
    /// Probe a daemon's metrics listener: `/healthz` (the process runs), or `/readyz` with
    /// --ready (it serves nodes: the leader, or a daemon without replicas). Exit 0 on
    /// HTTP 200, 1 otherwise; for container health checks.
    #[command(
        after_help = "Examples:\n  hanzod health\n  hanzod health --ready --addr 10.0.0.2:9551"
    )]
    Health {
        /// The metrics listener, host:port (default: `server.metrics_addr` of the
        /// configuration, an unspecified host read as 127.0.0.1).
        #[arg(long)]
        addr: Option<String>,
        /// Ask /readyz instead of /healthz.
        #[arg(long)]
        ready: bool,
        /// Give up after this many ms.
        #[arg(long, default_value_t = 3_000)]
        timeout_ms: u64,
    },
    /// Run a node agent: register, heartbeat, answer probes, follow rings, train each
    /// assigned epoch and upload its signed delta, reconnect.
    #[command(after_help = "\
Examples:
  hanzod node --key node.key --region eu-west
  hanzod node --key node.key --endpoint https://orch.example:9550 --ca ca.pem \\
      --listen 0.0.0.0:9560 --advertise 203.0.113.7:9560 --vram-gib 80 --json")]
    Node(NodeArgs),
    /// Generate a node key (Ed25519) and print its node id.
    Keygen {
        /// Where to write the key (mode 0600).
        #[arg(long, default_value = "hanzod-node.key")]
        out: PathBuf,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Submit, inspect, follow and cancel jobs.
    #[command(subcommand)]
    Job(JobCommand),
    /// List registered nodes.
    #[command(
        after_help = "Examples:\n  hanzod nodes\n  hanzod nodes --json --endpoint 10.0.0.2:9550"
    )]
    Nodes {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a job's ring, in order.
    #[command(after_help = "Examples:\n  hanzod ring 1\n  hanzod ring 1 --json")]
    Ring {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Measure the transport: ring repair latency, heartbeat capacity, memory.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Inspect, sign and verify model delta files (HZDL, DESIGN §6).
    #[command(subcommand)]
    Delta(DeltaCommand),
    /// Print the effective configuration (defaults ← file ← environment) as TOML.
    Config,
    /// Verify a published checkpoint (DESIGN §7): recompute the CIDs of its files and check
    /// them against its model card and the signed publication record on the ledger. Exit 0
    /// when every check passes, 1 when one fails (the verdict says which, expected vs
    /// found), 2 when it could not be verified (a file, the Hub, IPFS or the ledger could
    /// not be reached, the ledger holds no record, or no orchestrator key is trusted).
    #[command(after_help = "\
Examples:
  hanzod verify hanzod-demo/models/hanzo-gym/wine-mlp-job-1-epoch-2 --records hanzod-demo/publications.json --orchestrator <the key hanzod demo prints>
  hanzod verify hanzo-gym/wine-mlp-job-1-epoch-2 --orchestrator <hex key>   from the Hub, records from the daemon
  hanzod verify bafybei… --ipfs-url http://127.0.0.1:5001                  weights by CID from IPFS")]
    Verify(VerifyArgs),
    /// Set up a chain for `hanzod serve` (DESIGN §8): the orchestrator's account, deploying
    /// the contracts, staking and binding node keys.
    #[command(subcommand)]
    Chain(ChainCommand),
    /// Run a job on simulated nodes with seeded faults, in simulated time, and report how
    /// failures were detected and rings repaired (the fault-injection harness).
    Sim {
        #[command(flatten)]
        args: hanzod::sim::SimArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
struct VerifyArgs {
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
    /// the local object store publish.object_dir, or --object-dir).
    #[arg(long, env = "IPFS_URL")]
    ipfs_url: Option<String>,
    /// A local object store folder (publish.object_dir) to read a CID from.
    #[arg(long)]
    object_dir: Option<PathBuf>,
    /// Keep the files downloaded from the Hub in this folder (default: a temporary folder,
    /// removed afterwards).
    #[arg(long)]
    download_dir: Option<PathBuf>,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Subcommand, Debug)]
enum ChainCommand {
    /// Print the orchestrator's EVM account, derived from ORCHESTRATOR_KEY
    /// (orchestrator.key): fund it with gas and stake 50,000 GYM from it.
    Account,
    /// Deploy GYMToken and MiningPool from the committed artefacts, fund the pool, and,
    /// when ORCHESTRATOR_KEY is set, fund and stake the orchestrator's account; prints the
    /// settings to use (HANZO_GYM_TOKEN, HANZO_MINING_POOL, chain.from_block).
    #[command(
        after_help = "Example (a local anvil, chain id 36900):\n  anvil --chain-id 36900 &\n  ORCHESTRATOR_KEY=<hex> hanzod chain deploy --rpc http://127.0.0.1:8545"
    )]
    Deploy {
        /// The JSON-RPC endpoint.
        #[arg(long)]
        rpc: String,
        /// The deployer's secp256k1 key (64 hex digits), which pays the gas and receives
        /// the GYM supply [default: anvil's first development account, for local chains].
        #[arg(long, env = "HANZOD_DEPLOYER_KEY", hide_env_values = true)]
        deployer_key: Option<String>,
        /// GYM sent to the MiningPool for rewards.
        #[arg(long, default_value_t = 1_000_000)]
        pool_gym: u64,
        /// GYM staked for the orchestrator's account (at least 50,000 to lead).
        #[arg(long, default_value_t = 50_000)]
        orchestrator_stake_gym: u64,
    },
    /// Stake GYM from an operator account and bind a node key to it (the operator must
    /// hold the GYM and gas).
    Bind {
        /// The JSON-RPC endpoint.
        #[arg(long)]
        rpc: String,
        /// The GYMToken contract.
        #[arg(long)]
        gym_token: String,
        /// The operator's secp256k1 key (64 hex digits).
        #[arg(long, env = "HANZOD_OPERATOR_KEY", hide_env_values = true)]
        operator_key: String,
        /// The node's key file (`hanzod node --key`).
        #[arg(long)]
        node_key: PathBuf,
        /// GYM to stake first (0: bind only).
        #[arg(long, default_value_t = 10_000)]
        stake_gym: u64,
    },
}

#[derive(Subcommand, Debug)]
enum JobCommand {
    /// Submit a job spec (TOML; see config/job.example.toml).
    #[command(after_help = "Example:\n  hanzod job submit config/job.example.toml")]
    Submit {
        /// The spec file.
        spec: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One job's state, ring and checkpoints.
    #[command(after_help = CLIENT_EXAMPLES)]
    Status {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Every job.
    #[command(after_help = CLIENT_EXAMPLES)]
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print each change of a job until it ends; exit 1 when it ends Failed (or cancelled).
    #[command(after_help = CLIENT_EXAMPLES)]
    Watch {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a job.
    #[command(after_help = CLIENT_EXAMPLES)]
    Cancel {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// The statement a delta is signed with (DESIGN §6).
#[derive(Args, Debug, Clone, Copy)]
struct StatementArgs {
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
    fn statement(&self) -> hanzod::delta::format::Statement {
        hanzod::delta::format::Statement {
            job: self.job,
            epoch: self.epoch,
            step: self.step,
            claimed_loss: self.loss,
        }
    }
}

#[derive(Subcommand, Debug)]
enum DeltaCommand {
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

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Crash → every survivor on the new ring, over loopback gRPC with in-process agents.
    #[command(after_help = "Example:\n  hanzod bench recovery --nodes 64 --runs 20")]
    Recovery {
        /// Agents per run.
        #[arg(long, default_value_t = 16)]
        nodes: usize,
        /// Runs (a fresh daemon each).
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Seeds keys and the killed member.
        #[arg(long, env = "HANZOD_SEED", default_value_t = 1)]
        seed: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Heartbeat load against a running daemon: many sessions, signed heartbeats. Use a
    /// daemon of its own: the generated nodes are real registrations (they could be placed
    /// on pending jobs) and stay listed as failed afterwards.
    #[command(after_help = "\
Example (loopback daemon with the per-address limit raised, config/scenarios/load.toml):
  hanzod serve --config config/scenarios/load.toml &
  hanzod bench load --endpoint http://127.0.0.1:19550 --metrics 127.0.0.1:19551 \\
      --sessions 4000 --rate 4 --duration-s 15")]
    Load {
        /// The daemon's metrics endpoint, host:port.
        #[arg(long, default_value = "127.0.0.1:9551")]
        metrics: String,
        /// Sessions (node keys) to open.
        #[arg(long, default_value_t = 2000)]
        sessions: usize,
        /// Sessions per HTTP/2 connection.
        #[arg(long, default_value_t = 250)]
        per_connection: usize,
        /// Heartbeats per session per second.
        #[arg(long, default_value_t = 1.0)]
        rate: f64,
        /// Measurement window, s.
        #[arg(long, default_value_t = 20)]
        duration_s: u64,
        /// Seeds the node keys.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

const CLIENT_EXAMPLES: &str = "\
Examples:
  hanzod job status 1
  hanzod job list --json
  hanzod job watch 1 --endpoint https://orch.example:9550 --ca ca.pem
  hanzod job cancel 1 --admin-token s3cret";

#[derive(Args, Debug)]
struct NodeArgs {
    /// The node key; generated there if missing.
    #[arg(long, default_value = "hanzod-node.key")]
    key: PathBuf,
    /// Region label ([a-z0-9-]).
    #[arg(long, default_value = "local")]
    region: String,
    /// Where to accept probe traffic from peers.
    #[arg(long, default_value = "0.0.0.0:9560")]
    listen: String,
    /// host:port that peers use to reach --listen (default: 127.0.0.1 and the bound port).
    #[arg(long)]
    advertise: Option<String>,
    /// GPU model.
    #[arg(long, default_value = "NVIDIA A100-SXM4-80GB")]
    gpu_model: String,
    /// GPU memory, GiB.
    #[arg(long, default_value_t = 80)]
    vram_gib: u64,
    /// CUDA compute capability, major.minor.
    #[arg(long, default_value = "8.0")]
    compute_cap: String,
    /// Attestation signature, hex (empty in development mode).
    #[arg(long, default_value = "")]
    driver_sig: String,
    /// Declared upload capacity, Mbit/s.
    #[arg(long, default_value_t = 1000.0)]
    up_mbps: f32,
    /// Declared download capacity, Mbit/s.
    #[arg(long, default_value_t = 1000.0)]
    down_mbps: f32,
    /// First reconnect delay, ms (doubles up to --backoff-max-ms, with jitter).
    #[arg(long, default_value_t = 500)]
    backoff_min_ms: u64,
    /// Longest reconnect delay, ms.
    #[arg(long, default_value_t = 30_000)]
    backoff_max_ms: u64,
    /// Fault injection: train as a Byzantine node. `poison[:scale]` uploads −scale × the
    /// honest delta (scale 10); `lie-loss[:factor]` claims factor × the measured loss
    /// (0.5). The validator must reject or down-weight it, and a spot-check slash it.
    #[arg(long, default_value = "honest", value_name = "BEHAVIOUR")]
    byzantine: hanzod::agent::trainer::Behaviour,
    /// Stop when standard input reaches end of file: a supervising parent (`hanzod demo`)
    /// holds the other end, so its death stops the node.
    #[arg(long, hide = true)]
    parent_stdin: bool,
    /// Hold the session only and ignore epoch assignments (transport and recovery tests).
    #[arg(long, hide = true)]
    no_train: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// `hanzod serve`: one daemon on the in-memory store, or, with `VALKEY_URL`, one replica
/// under leader election (`hanzod::replica`).
async fn serve(cfg: Config) -> ExitCode {
    if cfg.state.valkey_url.is_empty() {
        let daemon = match hanzod::serve::Daemon::start(&cfg).await {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        hanzod::serve::termination().await;
        tracing::info!("shutting down");
        daemon.stop().await;
        return ExitCode::SUCCESS;
    }
    let store = match hanzod::state::valkey::ValkeyStateStore::connect(&cfg.state).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let health = hanzod::health::Health::new(hanzod::health::Role::Standby);
    {
        let store = store.clone();
        health.watch_store(move || store.health());
    }
    let outcome = hanzod::replica::run(
        &cfg,
        std::sync::Arc::new(store),
        hanzod::serve::DaemonParts::default(),
        health,
        hanzod::serve::termination(),
    )
    .await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn init_logging(cfg: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match cfg.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

/// `hanzod chain …`.
async fn run_chain(cfg: &Config, command: ChainCommand) -> ExitCode {
    use hanzod::chain::anvil::{self, DeployOptions, Deployment};
    use hanzod_actors::types::GymWei;
    let signer = |text: &str, what: &str| {
        text.trim()
            .trim_start_matches("0x")
            .parse::<alloy::signers::local::PrivateKeySigner>()
            .map_err(|e| format!("{what}: not a secp256k1 key (64 hex digits): {e}"))
    };
    let orchestrator = || -> Result<Option<hanzod::identity::Identity>, String> {
        if cfg.orchestrator.key.is_empty() {
            return Ok(None);
        }
        hanzod::serve::orchestrator_identity(&cfg.orchestrator.key)
            .map(Some)
            .map_err(|e| e.to_string())
    };
    let result: Result<(), String> = async {
        match command {
            ChainCommand::Account => {
                let id = orchestrator()?.ok_or(
                    "ORCHESTRATOR_KEY (orchestrator.key) is not set: the account derives from it",
                )?;
                println!("{}", hanzod::chain::account::address(&id));
                Ok(())
            }
            ChainCommand::Deploy {
                rpc,
                deployer_key,
                pool_gym,
                orchestrator_stake_gym,
            } => {
                let deployer = match deployer_key {
                    Some(k) => signer(&k, "--deployer-key")?,
                    None => anvil::deployer(),
                };
                let d = Deployment::deploy_with(
                    &rpc,
                    deployer,
                    &DeployOptions {
                        pool_funding: GymWei::gym(pool_gym),
                        ..DeployOptions::default()
                    },
                )
                .await
                .map_err(|e| e.to_string())?;
                if let Some(id) = orchestrator()? {
                    let account = hanzod::chain::account::signer(&id);
                    d.fund_and_stake(&account, GymWei::gym(orchestrator_stake_gym))
                        .await
                        .map_err(|e| e.to_string())?;
                    eprintln!(
                        "orchestrator account {} funded and staked {orchestrator_stake_gym} GYM",
                        account.address()
                    );
                } else {
                    eprintln!("ORCHESTRATOR_KEY is not set: no orchestrator account staked");
                }
                println!("HANZO_GYM_TOKEN={}", d.token);
                println!("HANZO_MINING_POOL={}", d.pool);
                println!("# [chain] from_block = {}", d.from_block);
                Ok(())
            }
            ChainCommand::Bind {
                rpc,
                gym_token,
                operator_key,
                node_key,
                stake_gym,
            } => {
                let operator = signer(&operator_key, "--operator-key")?;
                let token = gym_token
                    .parse()
                    .map_err(|e| format!("--gym-token {gym_token:?}: {e}"))?;
                let node = hanzod::identity::Identity::load(&node_key)
                    .map_err(|e| format!("{}: {e}", node_key.display()))?
                    .node_id();
                let address = operator.address();
                anvil::stake_and_bind_with(&rpc, token, operator, &node, GymWei::gym(stake_gym))
                    .await
                    .map_err(|e| e.to_string())?;
                println!("node {node} bound to operator {address} ({stake_gym} GYM staked)");
                Ok(())
            }
        }
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `hanzod verify`: exit 0 verified, 1 a check failed, 2 could not verify.
async fn run_verify(cfg: &Config, args: VerifyArgs) -> ExitCode {
    use hanzod::publish::verify::{self, FetchError, Target};
    use hanzod::publish::ObjectError;
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
            let options = hanzod::publish::hub::HubOptions {
                endpoint: args.hf_endpoint.clone(),
                token: args.hf_token.clone().filter(|t| !t.trim().is_empty()),
                ..Default::default()
            };
            let hub = match hanzod::publish::hub::HubClient::new(&options) {
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
            let dir = args.object_dir.clone().or_else(|| {
                (url.is_none() && !cfg.publish.object_dir.is_empty())
                    .then(|| PathBuf::from(&cfg.publish.object_dir))
            });
            let objects: std::sync::Arc<dyn hanzod::publish::ObjectStore> = match (dir, url) {
                // Reading must not create a store where there is none.
                (Some(dir), _) if !dir.join("blocks").is_dir() => {
                    return cannot(&format!(
                        "no object store at {} (no blocks/ folder)",
                        dir.display()
                    ))
                }
                (Some(dir), _) => match hanzod::publish::FsObjectStore::open(dir).await {
                    Ok(s) => std::sync::Arc::new(s),
                    Err(e) => return cannot(&e),
                },
                (None, Some(url)) => {
                    match hanzod::publish::kubo::KuboObjectStore::connect(&url, Default::default())
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
        Target::Cid(cid) => match hanzod::publish::objects::parse_cid(cid) {
            Ok(parsed) => (files, parsed.to_string()),
            Err(e) => return cannot(&e),
        },
        _ => match tokio::task::spawn_blocking(move || {
            let cid = hanzod::publish::cid_of(&files.weights).to_string();
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
            match hanzod::chain::EvmChain::reader(&url, pool, cfg.chain.chain_id, timeout).await {
                Ok(chain) => {
                    use hanzod::core::ports::Ledger;
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
            let answer = match hanzod::cli::Clients::connect(args.client.options()).await {
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
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn download_bar() -> indicatif::ProgressBar {
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
fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let mut key = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut key)
        .map_err(|_| format!("--orchestrator {text:?}: a public key is 64 hex digits"))?;
    Ok(key)
}

fn print_verdict(target: &str, v: &hanzod::publish::verify::Verdict, json: bool) -> ExitCode {
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

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env_names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    let cfg = match Config::check_env_names(env_names.iter().map(String::as_str))
        .and_then(|_| Config::load(cli.config.as_deref(), |k| std::env::var(k).ok()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if let Command::Demo {
        args,
        json,
        no_progress,
    } = cli.command
    {
        return run_demo(&cfg, args, json, no_progress);
    }
    init_logging(&cfg);
    match cli.command {
        Command::Demo { .. } => ExitCode::SUCCESS,
        Command::Verify(args) => match runtime() {
            Ok(rt) => rt.block_on(run_verify(&cfg, args)),
            Err(e) => fail(e),
        },
        Command::Chain(command) => match runtime() {
            Ok(rt) => rt.block_on(run_chain(&cfg, command)),
            Err(e) => fail(e),
        },
        Command::Config => match toml::to_string_pretty(&cfg.redacted()) {
            Ok(s) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Serve => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => return fail(e),
            };
            rt.block_on(serve(cfg))
        }
        Command::Health {
            addr,
            ready,
            timeout_ms,
        } => match runtime() {
            Ok(rt) => rt.block_on(async {
                let addr = match addr {
                    Some(a) => a,
                    None if cfg.server.metrics_addr.is_empty() => {
                        eprintln!("hanzod health: server.metrics_addr is empty (the metrics listener is off); give --addr");
                        return ExitCode::FAILURE;
                    }
                    None => cfg
                        .server
                        .metrics_addr
                        .replace("0.0.0.0:", "127.0.0.1:")
                        .replace("[::]:", "127.0.0.1:"),
                };
                match hanzod::health::probe(&addr, ready, timeout_ms).await {
                    Ok(body) => {
                        println!("{}", body.trim());
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("hanzod health: {e}");
                        ExitCode::FAILURE
                    }
                }
            }),
            Err(e) => fail(e),
        },
        Command::Keygen { out, force } => {
            let id = hanzod::identity::Identity::generate();
            match id.save(&out, force) {
                Ok(()) => {
                    println!("{}", id.node_id());
                    eprintln!("wrote {} (node id above)", out.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Node(args) => match runtime() {
            Ok(rt) => rt.block_on(run_node(args)),
            Err(e) => fail(e),
        },
        Command::Job(cmd) => match runtime() {
            Ok(rt) => rt.block_on(run_job(cmd)),
            Err(e) => fail(e),
        },
        Command::Nodes { client } => match runtime() {
            Ok(rt) => rt.block_on(async {
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.nodes(client.json).await
            }),
            Err(e) => Err(e.into()),
        }
        .map_or_else(fail, |_| ExitCode::SUCCESS),
        Command::Ring { job, client } => match runtime() {
            Ok(rt) => rt.block_on(async {
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.ring(job, client.json).await
            }),
            Err(e) => Err(e.into()),
        }
        .map_or_else(fail, |_| ExitCode::SUCCESS),
        Command::Sim { args, json } => run_sim(&cfg, args, json),
        Command::Delta(d) => run_delta(d),
        Command::Bench(b) => match runtime() {
            Ok(rt) => rt.block_on(run_bench(&cfg, b)),
            Err(e) => fail(e),
        },
    }
}

fn run_delta(cmd: DeltaCommand) -> ExitCode {
    use hanzod::delta::format::{payload_hash, sign_statement, verify_statement};
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
                    use hanzod::delta::model::ModelSpec;
                    // A built-in name (`wine-mlp`), else a Hugging Face config.json.
                    let spec = match p.to_str().and_then(ModelSpec::builtin) {
                        Some(spec) => spec,
                        None => {
                            let text = std::fs::read_to_string(p)
                                .map_err(|e| format!("{}: {e}", p.display()))?;
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
            let report = hanzod::delta::inspect::inspect(&bytes, spec.as_ref());
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
            let id = hanzod::identity::Identity::load(&key).map_err(|e| e.to_string())?;
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
            let node: hanzod::core::types::NodeId =
                node.parse().map_err(|e| format!("--node: {e}"))?;
            let key = hanzod::identity::verifying_key(&node).map_err(|e| format!("--node: {e}"))?;
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

async fn run_bench(cfg: &Config, cmd: BenchCommand) -> ExitCode {
    let r: anyhow::Result<()> = async {
        match cmd {
            BenchCommand::Recovery {
                nodes,
                runs,
                seed,
                json,
            } => {
                if nodes < 2 || runs < 1 {
                    anyhow::bail!("need --nodes >= 2 and --runs >= 1");
                }
                eprintln!("seed {seed}");
                let r = hanzod::bench::recovery(cfg, nodes, runs, seed).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    println!(
                        "{} nodes, {} runs: kill → all survivors on the new ring p50 {:.1} ms, p99 {:.1} ms (includes the {} ms coalescing window)",
                        r.nodes, r.runs, r.p50_ms, r.p99_ms, r.coalesce_ms
                    );
                }
            }
            BenchCommand::Load {
                metrics,
                sessions,
                per_connection,
                rate,
                duration_s,
                seed,
                client,
            } => {
                let r = hanzod::bench::load(&hanzod::bench::LoadOptions {
                    client: client.options(),
                    metrics,
                    sessions,
                    per_connection,
                    rate,
                    duration_s,
                    seed,
                })
                .await?;
                if client.json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    let ms = |v: f64| if v.is_finite() { format!("{v:.2} ms") } else { "n/a".into() };
                    println!(
                        "{} sessions over {} connections (set up in {:.1} s): offered {:.0} heartbeats/s, \
                         accepted {:.0}/s, {} refused; daemon handling p50 {}, p99 {}; daemon RSS {}",
                        r.sessions,
                        r.connections,
                        r.setup_s,
                        r.offered_per_s,
                        r.accepted_per_s,
                        r.rejected,
                        ms(r.p50_handling_ms),
                        ms(r.p99_handling_ms),
                        r.daemon_rss_bytes
                            .map(|b| format!("{:.0} MiB", b / (1 << 20) as f64))
                            .unwrap_or_else(|| "n/a".into())
                    );
                }
            }
        }
        Ok(())
    }
    .await;
    r.map_or_else(fail, |_| ExitCode::SUCCESS)
}

async fn run_job(cmd: JobCommand) -> ExitCode {
    let r: anyhow::Result<()> = async {
        match cmd {
            JobCommand::Submit { spec, client } => {
                let spec = hanzod::cli::JobSpecFile::load(&spec)?;
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.submit(&spec, client.json).await.map(|_| ())
            }
            JobCommand::Status { job, client } => {
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.status(job, client.json).await
            }
            JobCommand::List { client } => {
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.list(client.json).await
            }
            JobCommand::Watch { job, client } => {
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.watch(job, client.json).await
            }
            JobCommand::Cancel { job, client } => {
                let mut c = hanzod::cli::Clients::connect(client.options()).await?;
                c.cancel(job, client.json).await
            }
        }
    }
    .await;
    r.map_or_else(fail, |_| ExitCode::SUCCESS)
}

async fn run_node(args: NodeArgs) -> ExitCode {
    let (identity, created) = match hanzod::identity::Identity::load_or_generate(&args.key) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    if created {
        tracing::info!(key = %args.key.display(), "generated a new node key");
    }
    let cap = args
        .compute_cap
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u8>().ok()?, b.parse::<u8>().ok()?)));
    let Some(compute_cap) = cap else {
        eprintln!("error: --compute-cap must be major.minor, e.g. 8.0");
        return ExitCode::from(2);
    };
    let Ok(driver_sig) = hex::decode(&args.driver_sig) else {
        eprintln!("error: --driver-sig must be hex");
        return ExitCode::from(2);
    };
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", args.listen)),
    };
    let bound = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let advertise = args.advertise.clone().unwrap_or_else(|| {
        if bound.ip().is_unspecified() {
            tracing::warn!(
                "--advertise not given: peers will be told 127.0.0.1:{}",
                bound.port()
            );
            format!("127.0.0.1:{}", bound.port())
        } else {
            bound.to_string()
        }
    });
    let Some(vram_bytes) = args.vram_gib.checked_mul(1 << 30) else {
        eprintln!("error: --vram-gib {} is too large", args.vram_gib);
        return ExitCode::from(2);
    };
    if !args
        .region
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || args.region.is_empty()
    {
        eprintln!("error: --region must be 1..=64 characters of [a-z0-9-], e.g. eu-west");
        return ExitCode::from(2);
    }
    let settings = hanzod::agent::AgentSettings {
        orchestrator: args.client.options(),
        gpu_model: args.gpu_model,
        vram_bytes,
        compute_cap,
        driver_sig,
        up_mbps: args.up_mbps,
        down_mbps: args.down_mbps,
        region: args.region,
        advertise,
        backoff_min_ms: args.backoff_min_ms,
        backoff_max_ms: args.backoff_max_ms,
        behaviour: args.byzantine,
        train: !args.no_train,
    };
    let agent = hanzod::agent::Agent::new(settings, identity);
    let me = agent.node_id();
    let probes = tokio::spawn(hanzod::agent::probe::serve(listener, me));
    let mut events = agent.subscribe();
    let json = args.client.json;
    // The event printer; stdout closing (the reader went away) stops the node.
    let (gone_tx, mut gone) = tokio::sync::watch::channel(false);
    let printer = tokio::spawn(async move {
        use std::io::Write;
        loop {
            let line = match events.recv().await {
                Ok(e) if json => match serde_json::to_string(&e) {
                    Ok(s) => s,
                    Err(_) => continue,
                },
                Ok(e) => hanzod::agent::describe(&e),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            };
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                let _ = gone_tx.send(true);
                return;
            }
        }
    });
    // With --parent-stdin, stdin reaching EOF (the parent died) stops the node too.
    let parent = args.parent_stdin;
    let orphaned = async move {
        if !parent {
            return std::future::pending().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    eprintln!("node {me}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut run = tokio::spawn(agent.run(stop));
    let result = tokio::select! {
        r = &mut run => r,
        _ = hanzod::serve::termination() => {
            let _ = stop_tx.send(true);
            run.await
        }
        _ = async move {
            if gone.wait_for(|v| *v).await.is_err() {
                std::future::pending::<()>().await;
            }
        } => {
            let _ = stop_tx.send(true);
            run.await
        }
        _ = orphaned => {
            let _ = stop_tx.send(true);
            run.await
        }
    };
    probes.abort();
    // Let the printer write the last events.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    printer.abort();
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => fail(e),
        Err(e) => fail(e),
    }
}

fn run_demo(cfg: &Config, args: hanzod::demo::DemoArgs, json: bool, no_progress: bool) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("cannot find the hanzod executable: {e}")),
    };
    let mut plan = match args.plan(exe) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    plan.progress = !no_progress;
    if let Err(e) = hanzod::demo::prepare_out(&plan.out) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // The orchestrator's log goes to a file: the terminal shows the live view.
    let logs = plan.out.join("logs");
    let log = std::fs::create_dir_all(&logs)
        .and_then(|_| std::fs::File::create(logs.join("orchestrator.log")));
    match log {
        Ok(file) => {
            let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log.filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        Err(e) => return fail(format!("{}: {e}", logs.display())),
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    match rt.block_on(hanzod::demo::run(plan)) {
        Ok(summary) => {
            if json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(e),
                }
            } else {
                print!("{}", hanzod::demo::render(&summary));
            }
            if summary.succeeded() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(e),
    }
}

fn run_sim(cfg: &Config, args: hanzod::sim::SimArgs, json: bool) -> ExitCode {
    if args.job_nodes < 2 || args.nodes < args.job_nodes as usize {
        eprintln!("error: need 2 <= --job-nodes <= --nodes");
        return ExitCode::from(2);
    }
    if args.crash + args.hang > args.job_nodes as usize {
        eprintln!("note: --crash + --hang exceed the ring size; every member is hit");
    }
    // Injected actor panics are faults of the simulation, not crashes of hanzod:
    // report them in one line instead of a panic message and backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if msg.starts_with("injected fault") {
            tracing::warn!("{msg}");
        } else {
            default_hook(info);
        }
    }));
    // Simulated time: timers fire as soon as nothing else can run.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("runtime: {e}")),
    };
    let report = rt.block_on(hanzod::sim::run(cfg, &args));
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: {e}"),
        }
    } else {
        hanzod::sim::print_human(&report);
    }
    if matches!(report.phase, hanzod::core::job::JobPhase::Published { .. }) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
