//! # hanzod-cli
//!
//! The `hanzod` command line: parses arguments, loads configuration, runs a subcommand.
//! [`main`] is the whole binary. The client commands (jobs, nodes, rings over gRPC) are in
//! [`client_cmds`]; `hanzod verify`'s checks in [`verify`]. `demo`, `sim`, `bench` and
//! `testbed` need the `testkit` feature.
#![warn(missing_docs)]

pub mod client_cmds;
mod cmd;
pub mod epochs;
pub mod verify;

pub use client_cmds::*;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use hanzod_daemon::config::{Config, LogFormat};
use hanzod_protocol::client::ClientOptions;

/// hanzod — the orchestrator for decentralized training.
#[derive(Parser, Debug)]
#[command(version, about = "hanzod — the orchestrator for decentralized training.", long_about = None, after_help = "\
Examples:
  hanzod serve                                   the daemon: gRPC on :9550, metrics on :9551
  hanzod keygen --out node.key                   a node identity (Ed25519)
  hanzod node --key node.key --region eu-west --vram-gib 24 --listen 0.0.0.0:9560 --advertise 10.0.0.5:9560
  hanzod job submit config/job.example.toml      submit a training job; prints its id
  hanzod job watch <id>                          follow it until it ends
  hanzod nodes                                   registered nodes
  hanzod ring <id>                               the job's ring, in order
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
pub(crate) struct ClientArgs {
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
    /// The main job: start the orchestrator and N node processes on loopback, train a
    /// built-in model to Published (`--model qwen3-tiny`: a Qwen3 language model on Jane
    /// Austen's novels, about two minutes; the default `wine-mlp` on Wine Quality: seconds),
    /// with optional faults, and print the summary. Exit 0 only when the job reaches
    /// Published.
    #[command(after_help = "\
Examples:
  hanzod demo --model qwen3-tiny
  hanzod demo --model qwen3-tiny --lora --epochs 2
  hanzod demo
  hanzod demo --nodes 4 --epochs 3
  hanzod demo --kill 1 --byzantine 2 --attack mixed
  hanzod demo --scenario config/demo.example.toml --json")]
    #[cfg(feature = "testkit")]
    Demo {
        #[command(flatten)]
        args: hanzod_testkit::demo::DemoArgs,
        /// Print the summary as JSON (stdout) instead of tables.
        #[arg(long)]
        json: bool,
        /// No live view: log lines on stderr instead.
        #[arg(long)]
        no_progress: bool,
    },
    /// Run the daemon until SIGTERM or Ctrl-C. Published checkpoints and model folders go
    /// to the data directory (`data_dir`, default ./hanzod-data: ipfs/ and models/).
    #[command(after_help = "\
Examples:
  hanzod serve                                   checkpoints in ./hanzod-data/ipfs, models in ./hanzod-data/models
  hanzod serve --data-dir /srv/hanzod
  hanzod serve --memory-only                     nothing written to disk
  hanzod serve --config prod.toml
  HANZOD_ADMIN_TOKEN=s3cret hanzod serve")]
    Serve(cmd::serve::ServeArgs),
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
  hanzod node --key node.key --region eu-west --vram-gib 24
  hanzod node --key node.key --endpoint https://orch.example:9550 --ca ca.pem \\
      --listen 0.0.0.0:9560 --advertise 203.0.113.7:9560 --vram-gib 80 --json")]
    Node(cmd::node::NodeArgs),
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
    Job(cmd::job::JobCommand),
    /// List registered nodes.
    #[command(
        after_help = "Examples:\n  hanzod nodes\n  hanzod nodes --json --endpoint 10.0.0.2:9550"
    )]
    Nodes {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the signed publication records on the daemon's ledger (DESIGN §7), oldest
    /// first: one per published epoch, with its CIDs, quality and signer; each signature
    /// is checked, and a record not signed by this daemon's key is marked. Exit 1 when a
    /// signature does not hold.
    #[command(after_help = "\
Examples:
  hanzod publications
  hanzod publications --job 1 --epoch 4
  hanzod publications --cid bafkrei… --json")]
    Publications {
        /// Only this job's records.
        #[arg(long)]
        job: Option<u64>,
        /// Only this epoch's records (0-based).
        #[arg(long)]
        epoch: Option<u32>,
        /// Only the record of this weights CID.
        #[arg(long)]
        cid: Option<String>,
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
    #[cfg(feature = "testkit")]
    Bench(cmd::bench::BenchCommand),
    /// Inspect, sign and verify model delta files (HZDL, DESIGN §6).
    #[command(subcommand)]
    Delta(cmd::delta::DeltaCommand),
    /// Print the effective configuration (defaults ← file ← environment) as TOML.
    Config,
    /// Verify a published checkpoint (DESIGN §7): recompute the CIDs of its files and check
    /// them against its model card and the signed publication record on the ledger. By CID,
    /// the whole repo is fetched (config.json and the card named by the record, the other
    /// files by the card) and checked. Exit 0 when every check passes, 1 when one fails (the
    /// verdict says which, expected vs found), 2 when it could not be verified (a file, the
    /// Hub, IPFS or the ledger could not be reached, the ledger holds no record, or no
    /// orchestrator key is trusted).
    #[command(after_help = "\
Examples:
  hanzod verify hanzod-demo/models/hanzo-gym/wine-mlp-job-1-epoch-2 --records hanzod-demo/publications.json --orchestrator <the key hanzod demo prints>
  hanzod verify hanzo-gym/wine-mlp-job-1-epoch-2 --orchestrator <hex key>   from the Hub, records from the daemon
  hanzod verify bafybei… --ipfs-url http://127.0.0.1:5001                  the repo by its weights' CID from IPFS
  hanzod verify bafybei… --object-dir hanzod-demo/ipfs --records hanzod-demo/publications.json --orchestrator <hex key>")]
    Verify(cmd::verify::VerifyArgs),
    /// Score a language-model checkpoint on a text: mean next-token cross-entropy
    /// (nats/token) and perplexity, with the checkpoint's own tokenizer. The checkpoint is a
    /// folder, or the CID of its weights: the repo is then fetched through its signed
    /// publication record and verified first (exit 1 when a check fails).
    #[command(after_help = "\
Examples:
  hanzod eval hanzod-demo/models/hanzo-gym/qwen3-tiny-job-1-epoch-7 --text crates/train/data/austen/persuasion.txt
  hanzod eval <folder> --text notes.txt --max-tokens 4096 --json
  hanzod eval bafybei… --text t.txt --object-dir hanzod-demo/ipfs --records hanzod-demo/publications.json --orchestrator <the key hanzod demo prints>")]
    Eval(cmd::lm::EvalArgs),
    /// Continue a prompt with a language-model checkpoint (greedy, or sampled with
    /// --temperature and --seed): a folder, or the CID of its weights (fetched and verified
    /// as `hanzod eval` does).
    #[command(after_help = "\
Examples:
  hanzod generate hanzod-demo/models/hanzo-gym/qwen3-tiny-job-1-epoch-7 --prompt \"It is a truth universally acknowledged\"
  hanzod generate <folder> --prompt \"Emma\" --max-tokens 100 --temperature 0.8 --seed 7
  hanzod generate bafybei… --prompt \"Emma\" --object-dir hanzod-demo/ipfs --records hanzod-demo/publications.json --orchestrator <hex key>")]
    Generate(cmd::lm::GenerateArgs),
    /// Set up a chain for `hanzod serve` (DESIGN §8): the orchestrator's account, deploying
    /// the contracts, staking and binding node keys.
    #[command(subcommand)]
    Chain(cmd::chain::ChainCommand),
    /// Run a job on simulated nodes with seeded faults, in simulated time, and report how
    /// failures were detected and rings repaired (the fault-injection harness).
    #[cfg(feature = "testkit")]
    Sim {
        #[command(flatten)]
        args: hanzod_testkit::sim::SimArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A WAN test bed on this machine (root): one network namespace per node, shaped
    /// links. Bring one up, measure its links with the node agent's probe, run ring
    /// all-reduce rounds on it, remove what dead runs left.
    #[cfg(feature = "testkit")]
    #[command(subcommand)]
    Testbed(cmd::testbed::TestbedCommand),
}

pub(crate) const CLIENT_EXAMPLES: &str = "\
Examples:
  hanzod job status 1
  hanzod job list --json
  hanzod job watch 1 --endpoint https://orch.example:9550 --ca ca.pem
  hanzod job cancel 1 --admin-token s3cret";

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

/// Ends the process quietly, with status 141 (as a Unix tool killed by SIGPIPE), when
/// its standard output is a closed pipe (`hanzod nodes | head -1`): Rust ignores SIGPIPE,
/// so a write to it fails and `println!` panics; that one panic is the reader having gone
/// away, not a bug. SIGPIPE itself stays ignored, so a peer that resets a socket is an
/// error the command reports, not a silent death. Every other panic is reported as before.
fn quiet_on_a_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        // std's message: "failed printing to stdout: Broken pipe (os error 32)".
        if message.starts_with("failed printing to stdout")
            && message.to_ascii_lowercase().contains("broken pipe")
        {
            std::process::exit(141);
        }
        report(info)
    }));
}

pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

pub(crate) fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// Runs the `hanzod` command line: parses the arguments, loads the configuration and runs
/// the subcommand. The exit code: 0 success, 1 failure, 2 bad configuration or usage.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    quiet_on_a_closed_stdout();
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
    #[cfg(feature = "testkit")]
    if let Command::Demo {
        args,
        json,
        no_progress,
    } = cli.command
    {
        return cmd::demo::run_demo(&cfg, args, json, no_progress);
    }
    init_logging(&cfg);
    match cli.command {
        #[cfg(feature = "testkit")]
        Command::Demo { .. } => ExitCode::SUCCESS,
        Command::Eval(args) => cmd::lm::run_eval(&cfg, args),
        Command::Generate(args) => cmd::lm::run_generate(&cfg, args),
        Command::Verify(args) => match runtime() {
            Ok(rt) => rt.block_on(cmd::verify::run_verify(&cfg, args)),
            Err(e) => fail(e),
        },
        Command::Chain(command) => match runtime() {
            Ok(rt) => rt.block_on(cmd::chain::run_chain(&cfg, command)),
            Err(e) => fail(e),
        },
        Command::Config => match toml::to_string_pretty(&cfg.redacted()) {
            Ok(s) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Serve(args) => {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => return fail(e),
            };
            rt.block_on(cmd::serve::serve(args.apply(cfg)))
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
                match hanzod_daemon::health::probe(&addr, ready, timeout_ms).await {
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
            let id = hanzod_protocol::identity::Identity::generate();
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
            Ok(rt) => rt.block_on(cmd::node::run_node(args)),
            Err(e) => fail(e),
        },
        Command::Job(cmd) => match runtime() {
            Ok(rt) => rt.block_on(cmd::job::run_job(cmd)),
            Err(e) => fail(e),
        },
        Command::Nodes { client } => match runtime() {
            Ok(rt) => rt.block_on(async {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.nodes(client.json).await
            }),
            Err(e) => Err(e.into()),
        }
        .map_or_else(fail, |_| ExitCode::SUCCESS),
        Command::Publications {
            job,
            epoch,
            cid,
            client,
        } => match runtime() {
            Ok(rt) => rt.block_on(async {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                let query = hanzod_proto::v1::ListPublicationsRequest {
                    cid: cid.unwrap_or_default(),
                    job_id: job,
                    epoch,
                };
                c.list_publications(query, client.json).await
            }),
            Err(e) => Err(e.into()),
        }
        .map_or_else(fail, |_| ExitCode::SUCCESS),
        Command::Ring { job, client } => match runtime() {
            Ok(rt) => rt.block_on(async {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.ring(job, client.json).await
            }),
            Err(e) => Err(e.into()),
        }
        .map_or_else(fail, |_| ExitCode::SUCCESS),
        #[cfg(feature = "testkit")]
        Command::Sim { args, json } => cmd::sim::run_sim(&cfg, args, json),
        Command::Delta(d) => cmd::delta::run_delta(d),
        #[cfg(feature = "testkit")]
        Command::Testbed(t) => cmd::testbed::run_testbed(t),
        #[cfg(feature = "testkit")]
        Command::Bench(b) => match runtime() {
            Ok(rt) => rt.block_on(cmd::bench::run_bench(&cfg, b)),
            Err(e) => fail(e),
        },
    }
}
