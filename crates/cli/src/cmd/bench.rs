//! `hanzod bench`: ring repair latency, heartbeat capacity, memory (feature `testkit`).

use std::process::ExitCode;

use clap::Subcommand;
use hanzod_daemon::config::Config;

use crate::{fail, ClientArgs};

#[derive(Subcommand, Debug)]
pub(crate) enum BenchCommand {
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
    /// The attack suite against every aggregator: each attack × aggregator × Byzantine
    /// fraction on in-process star-mode jobs through the daemon's validation and merge,
    /// seeded; final validation loss against the honest-only run, the attackers' share of
    /// the rewards and the stake they lost.
    #[command(after_help = "\
Examples:
  hanzod bench byzantine                       # wine-mlp, the whole suite (a few minutes)
  hanzod bench byzantine --fractions 0.3 --attacks alie,ipm:0.5 --aggregators default,krum
  hanzod bench byzantine --models qwen3-tiny --fractions 0.3 --seeds 1 --json")]
    Byzantine(hanzod_testkit::byzantine::ByzantineArgs),
}

pub(crate) async fn run_bench(cfg: &Config, cmd: BenchCommand) -> ExitCode {
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
                let r = hanzod_testkit::bench::recovery(cfg, nodes, runs, seed).await?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                } else {
                    println!(
                        "{} nodes, {} runs: kill → all survivors on the new ring p50 {:.1} ms, p99 {:.1} ms (a lone crash is applied at once: the {} ms coalescing window holds only the failures that follow it)",
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
                let r = hanzod_testkit::bench::load(&hanzod_testkit::bench::LoadOptions {
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
            BenchCommand::Byzantine(args) => {
                let json = args.json;
                let table = tokio::task::spawn_blocking(move || {
                    hanzod_testkit::byzantine::bench(&args)
                })
                .await?
                .map_err(anyhow::Error::msg)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&table)?);
                } else {
                    print!("{}", hanzod_testkit::byzantine::render(&table));
                }
            }
        }
        Ok(())
    }
    .await;
    r.map_or_else(fail, |_| ExitCode::SUCCESS)
}
