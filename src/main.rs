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
}

fn init_logging(cfg: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log.filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    }
}
