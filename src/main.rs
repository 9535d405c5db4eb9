//! The `hanzod` binary: parses arguments, loads configuration, runs a subcommand.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hanzod::config::{Config, LogFormat};

/// hanzod — the orchestrator for decentralized training.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None, after_help = "\
Examples:
  hanzod config                      print the effective configuration
  hanzod config --config my.toml     … with a file layered over the defaults
  hanzod sim                         64 simulated nodes, 3 crashes and a hang, 5 epochs
  hanzod sim --nodes 200 --job-nodes 128 --crash 10 --faults 20 --seed 7 --json
")]
struct Cli {
    /// A TOML file layered over the embedded defaults (config/default.toml).
    #[arg(long, global = true, env = "HANZOD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the effective configuration (defaults ← file ← environment) as TOML.
    Config,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match Config::load(cli.config.as_deref(), |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: configuration: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&cfg);
    match cli.command {
        Command::Config => match toml::to_string_pretty(&cfg) {
            Ok(s) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Sim { args, json } => {
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
                Err(e) => {
                    eprintln!("error: runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let report = rt.block_on(hanzod::sim::run(&cfg, &args));
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
    }
}
