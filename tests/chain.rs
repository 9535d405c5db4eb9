//! The EVM ledger adapter (`hanzod::chain::EvmChain`) against a real anvil started by each
//! test on a free loopback port with chain id 36900 and the contracts deployed from the
//! committed artefacts (DESIGN §8, §11): the ledger conformance suite that the embedded
//! ledger also runs (actors/tests/ledger.rs), then what only a real chain has: the chain
//! id and contract checks at start, the orchestrator stake, a lost transaction answer and
//! an RPC endpoint that dies, none of which pays anything twice.
//!
//! Without anvil (`contracts/build.sh` installs it) the tests say SKIPPED, unless `CI` is
//! set.

use std::time::{Duration, Instant};

use hanzod::chain::anvil::{AnvilNode, DeployOptions, Deployment, ProxyMode, RpcProxy};
use hanzod::chain::contracts::GYMToken;
use hanzod::chain::{
    account, ContractMismatch, EvmChain, EvmError, EvmOptions, ORCHESTRATOR_MIN_STAKE,
};
use hanzod::core::ports::ledger_conformance::{self as suite, staked, STAKE};
use hanzod::core::ports::{ChainError, ChainReader, Ledger, LedgerError};
use hanzod::core::types::{GymWei, JobId, Timestamp};
use hanzod::identity::Identity;

/// The fixture's penalty window: 1 h, as the embedded ledger's fixture.
const WINDOW_S: u64 = 3600;

fn skip() -> bool {
    hanzod::chain::anvil::skip_test()
}

/// A node, the contracts, the orchestrator's account staked with `orchestrator_stake`,
/// and the suite's staked nodes 1..=4 bound with [`STAKE`] each.
struct Fixture {
    node: AnvilNode,
    deployment: Deployment,
    orchestrator: Identity,
}

impl Fixture {
    async fn start(orchestrator_stake: GymWei) -> Fixture {
        let node = AnvilNode::start().await.expect("anvil starts");
        let deployment = Deployment::deploy(
            &node.url(),
            &DeployOptions {
                penalty_window_s: WINDOW_S,
                ..DeployOptions::default()
            },
        )
        .await
        .expect("contracts deploy");
        let orchestrator = Identity::from_seed([9; 32]);
        deployment
            .fund_and_stake(&account::signer(&orchestrator), orchestrator_stake)
            .await
            .expect("orchestrator staked");
        for i in 1..=4 {
            deployment
                .stake_and_bind(&staked(i), STAKE)
                .await
                .expect("operator staked and bound");
        }
        Fixture {
            node,
            deployment,
            orchestrator,
        }
    }

    async fn chain_at(&self, url: &str, opts: EvmOptions) -> EvmChain {
        EvmChain::connect(url, account::signer(&self.orchestrator), opts)
            .await
            .expect("adapter connects")
    }

    /// An [`RpcProxy`] in front of the node, and an adapter through it retrying after
    /// `retry_delay`.
    async fn behind_proxy(&self, retry_delay: Duration) -> (RpcProxy, EvmChain) {
        let proxy = RpcProxy::start(&self.node.url()).await.expect("proxy");
        let chain = self
            .chain_at(
                &proxy.url(),
                EvmOptions {
                    retry_delay,
                    ..self.deployment.options()
                },
            )
            .await;
        (proxy, chain)
    }

    async fn chain(&self) -> EvmChain {
        self.chain_at(&self.node.url(), self.deployment.options())
            .await
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            if skip() {
                return;
            }
            let f = Fixture::start(ORCHESTRATOR_MIN_STAKE).await;
            suite::$name(&f.chain().await).await;
        }
    )*};
}

conformance!(
    rewards_are_credited,
    same_epoch_pays_once,
    other_epochs_and_jobs_pay,
    batch_with_unbound_node_pays_nothing,
    slash_rounds_down,
    same_evidence_slashes_once,
    bad_pct_is_refused,
    empty_evidence_is_refused,
    unbound_slash_is_refused,
    history_is_listed_in_order,
    publication_is_recorded_once_per_epoch,
);

#[tokio::test]
async fn slash_reduces_stake_and_sets_penalty() {
    if skip() {
        return;
    }
    let f = Fixture::start(ORCHESTRATOR_MIN_STAKE).await;
    let chain = f.chain().await;
    // The slash is the next block: pin its time so the penalty's end is known exactly.
    let t = f.deployment.latest_timestamp().await.expect("time") + 100;
    f.deployment
        .set_next_block_timestamp(t)
        .await
        .expect("set time");
    suite::slash_reduces_stake_and_sets_penalty(&chain, Timestamp(t * 1000), WINDOW_S * 1000).await;
}

#[tokio::test]
async fn start_checks_chain_id_and_contracts() {
    if skip() {
        return;
    }
    let f = Fixture::start(ORCHESTRATOR_MIN_STAKE).await;
    let signer = || account::signer(&f.orchestrator);
    let wrong = EvmChain::connect(
        &f.node.url(),
        signer(),
        EvmOptions {
            chain_id: 1,
            ..f.deployment.options()
        },
    )
    .await;
    assert_eq!(
        wrong.err(),
        Some(EvmError::WrongChain {
            expected: 1,
            found: 36900
        })
    );
    let no_code = EvmChain::connect(
        &f.node.url(),
        signer(),
        EvmOptions {
            token: alloy::primitives::Address::repeat_byte(0x42),
            ..f.deployment.options()
        },
    )
    .await;
    assert!(
        matches!(
            &no_code,
            Err(EvmError::Contract(ContractMismatch::NoCode { .. }))
        ),
        "{no_code:?}"
    );
    // The token given as the pool: a contract, but not a MiningPool.
    let swapped = EvmChain::connect(
        &f.node.url(),
        signer(),
        EvmOptions {
            pool: f.deployment.token,
            ..f.deployment.options()
        },
    )
    .await;
    assert!(
        matches!(&swapped, Err(EvmError::Contract(_))),
        "{swapped:?}"
    );
    let dead = EvmChain::connect(
        "http://127.0.0.1:9",
        signer(),
        EvmOptions {
            call_timeout: Duration::from_secs(2),
            ..f.deployment.options()
        },
    )
    .await;
    assert!(
        matches!(dead, Err(EvmError::Unavailable { .. })),
        "{dead:?}"
    );
    // A reader (hanzod verify) says the endpoint is unreachable, not that the address is
    // not a pool; an address that is not a pool is a contract error.
    let unreachable = EvmChain::reader(
        "http://127.0.0.1:9",
        f.deployment.pool,
        36900,
        Duration::from_secs(2),
    )
    .await;
    assert!(
        matches!(unreachable, Err(EvmError::Unavailable { .. })),
        "{unreachable:?}"
    );
    let not_a_pool = EvmChain::reader(
        &f.node.url(),
        f.deployment.token,
        36900,
        Duration::from_secs(2),
    )
    .await;
    assert!(
        matches!(not_a_pool, Err(EvmError::Contract(_))),
        "{not_a_pool:?}"
    );
}

#[tokio::test]
async fn an_orchestrator_below_the_minimum_stake_cannot_pay_or_slash() {
    if skip() {
        return;
    }
    let short = GymWei(ORCHESTRATOR_MIN_STAKE.0 - 1);
    let f = Fixture::start(short).await;
    let chain = f
        .chain_at(
            &f.node.url(),
            EvmOptions {
                attempts: 1,
                ..f.deployment.options()
            },
        )
        .await;
    assert_eq!(chain.orchestrator_stake().await, Ok(short));
    let paid = chain
        .distribute_epoch_rewards(JobId(1), 0, &[(staked(1), GymWei(5))])
        .await;
    assert!(
        matches!(&paid, Err(LedgerError::Chain(ChainError::Unavailable(m))) if m.contains("50,000 GYM")),
        "{paid:?}"
    );
    let slashed = chain.slash(&staked(1), 10, b"evidence").await;
    assert!(
        matches!(&slashed, Err(LedgerError::Chain(ChainError::Unavailable(m))) if m.contains("50,000 GYM")),
        "{slashed:?}"
    );
    assert_eq!(chain.balance_of(&staked(1)).await, Ok(GymWei(0)));
    assert_eq!(chain.stake_of(&staked(1)).await, Ok(STAKE));
}

#[tokio::test]
async fn a_lost_answer_is_never_paid_twice() {
    if skip() {
        return;
    }
    let f = Fixture::start(ORCHESTRATOR_MIN_STAKE).await;
    let (proxy, chain) = f.behind_proxy(Duration::from_millis(50)).await;
    let operator = hanzod::chain::anvil::operator_of(&staked(1)).address();
    let held = f.deployment.gym_balance(operator).await.expect("balance");
    // Every send is mined, but the orchestrator never hears of it.
    proxy.set_mode(ProxyMode::LoseSendAnswers);
    let r = chain
        .distribute_epoch_rewards(JobId(1), 0, &[(staked(1), GymWei(700))])
        .await
        .expect("the retry finds the epoch paid");
    assert!(!r.duplicate, "the batch was this call's own transaction");
    assert_eq!(r.total, GymWei(700));
    let s = chain
        .slash(&staked(2), 10, b"lost slash answer")
        .await
        .expect("the retry finds the slash");
    assert!(!s.duplicate);
    assert_eq!(proxy.lost_answers(), 2);
    assert_eq!(proxy.sends(), 2, "each write was sent once");
    proxy.set_mode(ProxyMode::Forward);
    // A repeat by a restarted caller pays nothing.
    let again = chain
        .distribute_epoch_rewards(JobId(1), 0, &[(staked(1), GymWei(700))])
        .await
        .expect("repeat");
    assert!(again.duplicate);
    assert_eq!(
        f.deployment.gym_balance(operator).await.expect("balance"),
        GymWei(held.0 + 700)
    );
    assert_eq!(chain.balance_of(&staked(1)).await, Ok(GymWei(700)));
    assert_eq!(chain.reward_batches().await.map(|b| b.len()), Ok(1));
    assert_eq!(chain.slashes().await.map(|s| s.len()), Ok(1));
    assert_eq!(
        chain.stake_of(&staked(2)).await,
        Ok(GymWei(STAKE.0 - STAKE.0 / 10))
    );
}

#[tokio::test]
async fn a_dead_endpoint_fails_the_write_and_a_later_retry_pays_once() {
    if skip() {
        return;
    }
    let f = Fixture::start(ORCHESTRATOR_MIN_STAKE).await;
    let (proxy, chain) = f.behind_proxy(Duration::from_millis(20)).await;
    proxy.set_mode(ProxyMode::Down);
    let e = chain
        .distribute_epoch_rewards(JobId(3), 7, &[(staked(3), GymWei(11))])
        .await;
    assert!(
        matches!(e, Err(LedgerError::Chain(ChainError::Unavailable(_)))),
        "{e:?}"
    );
    assert!(matches!(
        chain.stake_of(&staked(3)).await,
        Err(ChainError::Unavailable(_))
    ));
    proxy.set_mode(ProxyMode::Forward);
    for _ in 0..2 {
        chain
            .distribute_epoch_rewards(JobId(3), 7, &[(staked(3), GymWei(11))])
            .await
            .expect("paid once the endpoint is back");
    }
    assert_eq!(chain.balance_of(&staked(3)).await, Ok(GymWei(11)));
    assert_eq!(proxy.sends(), 1);
}

/// Gas of one reward batch by its number of nodes, and the time of each on-chain step on
/// anvil. Figures only (run with `--ignored --nocapture`); nothing here is asserted on
/// speed.
#[tokio::test]
#[ignore]
async fn reward_batch_gas_and_step_times() {
    if skip() {
        return;
    }
    let f = Fixture::start(ORCHESTRATOR_MIN_STAKE).await;
    let chain = f.chain().await;
    let mut nodes = Vec::new();
    for i in 0..64u8 {
        let n = hanzod::core::types::NodeId([0x40 + i; 32]);
        f.deployment.stake_and_bind(&n, STAKE).await.expect("bound");
        nodes.push(n);
    }
    use alloy::providers::Provider;
    let provider = hanzod::chain::anvil::read_provider(&f.node.url()).expect("provider");
    for (epoch, n) in [1usize, 4, 16, 64].into_iter().enumerate() {
        for round in 0..2u32 {
            let batch: Vec<_> = nodes[..n].iter().map(|x| (*x, GymWei(1_000))).collect();
            let e = epoch as u32 * 2 + round;
            let t = Instant::now();
            chain
                .distribute_epoch_rewards(JobId(1), e, &batch)
                .await
                .expect("paid");
            let took = t.elapsed();
            let block = provider.get_block_number().await.expect("block");
            let receipts = provider
                .get_block_receipts(block.into())
                .await
                .expect("receipts")
                .unwrap_or_default();
            let gas: u64 = receipts.iter().map(|r| r.gas_used).sum();
            println!(
                "reward batch: {n:>2} nodes ({}): {gas} gas ({} per node), {:.1} ms",
                if round == 0 {
                    "first payout"
                } else {
                    "repeat payout"
                },
                gas / n as u64,
                took.as_secs_f64() * 1e3
            );
        }
    }
    let t = Instant::now();
    chain.stake_of(&nodes[0]).await.expect("stake");
    println!("stake_of: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let t = Instant::now();
    chain
        .slash(&nodes[0], 10, b"gas figure")
        .await
        .expect("slash");
    println!("slash: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
}

/// `hanzod chain deploy` and `hanzod chain bind` set up a chain for `hanzod serve`: the
/// contracts deployed, the orchestrator's account (from ORCHESTRATOR_KEY) staked, a node
/// key bound to an operator; `hanzod serve` on that chain without ORCHESTRATOR_KEY refuses
/// to start rather than send from a throwaway account.
#[tokio::test]
async fn the_chain_commands_set_up_a_chain_for_serve() {
    if skip() {
        return;
    }
    let node = AnvilNode::start().await.expect("anvil");
    let key = "33".repeat(32);
    let bin = env!("CARGO_BIN_EXE_hanzod");
    let out = std::process::Command::new(bin)
        .args(["chain", "deploy", "--rpc", &node.url()])
        .env("ORCHESTRATOR_KEY", &key)
        .output()
        .expect("hanzod chain deploy runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_string()
    };
    let (token, pool) = (value("HANZO_GYM_TOKEN"), value("HANZO_MINING_POOL"));
    let account = std::process::Command::new(bin)
        .args(["chain", "account"])
        .env("ORCHESTRATOR_KEY", &key)
        .output()
        .expect("hanzod chain account runs");
    let identity = Identity::from_hex(&key, "key").expect("key");
    assert_eq!(
        String::from_utf8_lossy(&account.stdout).trim(),
        account::address(&identity).to_string()
    );
    let opts = EvmOptions {
        token: token.parse().expect("token address"),
        pool: pool.parse().expect("pool address"),
        ..EvmOptions::default()
    };
    let chain = EvmChain::connect(&node.url(), account::signer(&identity), opts.clone())
        .await
        .expect("the deployed contracts pass the start checks");
    assert_eq!(chain.orchestrator_stake().await, Ok(ORCHESTRATOR_MIN_STAKE));

    // An operator (funded by the deployer) stakes and binds a node key.
    let deployment = Deployment::deploy(&node.url(), &DeployOptions::default())
        .await
        .expect("a second deployment, for its transfer helpers");
    let operator = alloy::signers::local::PrivateKeySigner::random();
    // Gas and GYM for the operator, from the deployer (anvil's first account holds both
    // the ETH and, from `chain deploy`, the GYM supply of the contracts under test).
    deployment
        .fund_and_stake(&operator, GymWei(1))
        .await
        .expect("gas for the operator");
    let gym = GYMToken::new(
        opts.token,
        hanzod::chain::anvil::wallet_provider(&node.url(), hanzod::chain::anvil::deployer())
            .expect("provider"),
    );
    gym.transfer(operator.address(), alloy::primitives::U256::from(STAKE.0))
        .send()
        .await
        .expect("send")
        .get_receipt()
        .await
        .expect("GYM for the operator");
    let dir = std::env::temp_dir().join(format!("hanzod-chain-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let node_key = dir.join("node.key");
    let node_identity = Identity::from_seed([7; 32]);
    node_identity.save(&node_key, true).expect("node key");
    let bind = std::process::Command::new(bin)
        .args(["chain", "bind", "--rpc", &node.url(), "--gym-token", &token])
        .args(["--operator-key", &hex::encode(operator.to_bytes())])
        .arg("--node-key")
        .arg(&node_key)
        .output()
        .expect("hanzod chain bind runs");
    assert!(
        bind.status.success(),
        "{}",
        String::from_utf8_lossy(&bind.stderr)
    );
    assert_eq!(chain.stake_of(&node_identity.node_id()).await, Ok(STAKE));

    // serve on this chain without ORCHESTRATOR_KEY: refused, naming the variable.
    let serve = std::process::Command::new(bin)
        .arg("serve")
        .env("HANZO_RPC", node.url())
        .env("HANZO_GYM_TOKEN", &token)
        .env("HANZO_MINING_POOL", &pool)
        .env_remove("ORCHESTRATOR_KEY")
        .output()
        .expect("hanzod serve runs");
    assert!(!serve.status.success());
    let err = String::from_utf8_lossy(&serve.stderr);
    assert!(err.contains("ORCHESTRATOR_KEY"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
