//! `hanzod chain`: the orchestrator's account, deploying the contracts, staking and binding node keys.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use hanzod_daemon::config::Config;

#[derive(Subcommand, Debug)]
pub(crate) enum ChainCommand {
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

/// `hanzod chain …`.
pub(crate) async fn run_chain(cfg: &Config, command: ChainCommand) -> ExitCode {
    use hanzod_actors::types::GymWei;
    use hanzod_adapters::chain::deploy::{self, DeployOptions, Deployment};
    let signer = |text: &str, what: &str| {
        text.trim()
            .trim_start_matches("0x")
            .parse::<alloy::signers::local::PrivateKeySigner>()
            .map_err(|e| format!("{what}: not a secp256k1 key (64 hex digits): {e}"))
    };
    let orchestrator = || -> Result<Option<hanzod_protocol::identity::Identity>, String> {
        if cfg.orchestrator.key.is_empty() {
            return Ok(None);
        }
        hanzod_daemon::serve::orchestrator_identity(&cfg.orchestrator.key)
            .map(Some)
            .map_err(|e| e.to_string())
    };
    let result: Result<(), String> = async {
        match command {
            ChainCommand::Account => {
                let id = orchestrator()?.ok_or(
                    "ORCHESTRATOR_KEY (orchestrator.key) is not set: the account derives from it",
                )?;
                println!("{}", hanzod_adapters::chain::account::address(&id));
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
                    None => deploy::deployer(),
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
                    let account = hanzod_adapters::chain::account::signer(&id);
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
                let node = hanzod_protocol::identity::Identity::load(&node_key)
                    .map_err(|e| format!("{}: {e}", node_key.display()))?
                    .node_id();
                let address = operator.address();
                deploy::stake_and_bind_with(&rpc, token, operator, &node, GymWei::gym(stake_gym))
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
