//! The training demo with a real EVM node as the chain (DESIGN §8, §11): anvil started by
//! the test on a free loopback port with chain id 36900, the contracts deployed from the
//! committed artefacts, the orchestrator's account and every node's operator staked and
//! the node keys bound. The demo trains 3 epochs with a lying node caught by spot-checks,
//! and its chain endpoint dies for a few seconds when epoch 1 starts. Afterwards the
//! operators' GYM balances show the rewards, the Byzantine node's operator is slashed,
//! every epoch is paid exactly once and recorded, and `hanzod verify` reads the records
//! from the chain.

use std::path::PathBuf;

use hanzod::agent::trainer::Behaviour;
use hanzod::chain::anvil::{operator_of, AnvilNode, DeployOptions, Deployment};
use hanzod::core::ports::Ledger;
use hanzod::core::types::GymWei;
use hanzod::demo::{self, Attack, DemoArgs, DemoChain, DEMO_NODE_STAKE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_on_anvil_pays_slashes_records_and_survives_an_endpoint_outage() {
    if hanzod::chain::anvil::skip_test() {
        return;
    }
    let out = std::env::temp_dir().join(format!("hanzod-chain-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut plan = DemoArgs {
        nodes: Some(4),
        epochs: Some(3),
        byzantine: Some(1),
        attack: Some(Attack::LieLoss),
        spot_check_rate: Some(1.0),
        out: Some(out.clone()),
        timeout_s: Some(240),
        ..DemoArgs::default()
    }
    .plan(PathBuf::from(env!("CARGO_BIN_EXE_hanzod")))
    .expect("a valid plan");
    plan.progress = false;
    let anvil = AnvilNode::start().await.expect("anvil");
    let deployment = Deployment::deploy(&anvil.url(), &DeployOptions::default())
        .await
        .expect("contracts deployed");
    demo::stake_accounts(&plan, &deployment)
        .await
        .expect("accounts staked and bound");
    plan.chain = Some(DemoChain {
        url: anvil.url(),
        options: deployment.options(),
    });
    plan.chain_outage = Some((1, 4));
    let operators: Vec<_> = (0..plan.nodes)
        .map(|i| operator_of(&demo::node_identity(plan.seed, i).node_id()).address())
        .collect();
    let mut before = Vec::new();
    for a in &operators {
        before.push(deployment.gym_balance(*a).await.expect("balance"));
    }

    let s = demo::run(plan).await.expect("the demo runs");
    eprintln!("{}", demo::render(&s));
    assert!(s.succeeded(), "{:?}", s.failure);
    let chain = s.chain.clone().expect("a chain summary");
    assert!(
        chain.refused_during_outage > 0,
        "the outage hit the orchestrator's chain calls"
    );
    assert_eq!(chain.publications, 3, "every epoch is recorded on chain");
    let paid_epochs = s.epochs.iter().filter(|e| e.aggregator != "kept").count();
    assert_eq!(
        chain.reward_batches, paid_epochs,
        "every merged epoch is paid"
    );

    // What the chain holds, read back through the adapter.
    // The orchestrator's own view: its batches and slashes (the contracts key them by
    // account).
    let orchestrator =
        hanzod::identity::Identity::from_hex(&demo::orchestrator_key(s.plan.seed), "the demo key")
            .expect("key");
    let reader = hanzod::chain::EvmChain::connect(
        &anvil.url(),
        hanzod::chain::account::signer(&orchestrator),
        deployment.options(),
    )
    .await
    .expect("reader");
    let batches = reader.reward_batches().await.expect("batches");
    let mut epochs: Vec<u32> = batches.iter().map(|b| b.epoch).collect();
    epochs.dedup();
    assert_eq!(
        epochs.len(),
        batches.len(),
        "no epoch paid twice: {epochs:?}"
    );
    let pool = GymWei::gym(100).0;
    for b in &batches {
        assert_eq!(b.total.0, pool, "epoch {} pays its pool exactly", b.epoch);
    }
    let mut paid_to = vec![0u128; operators.len()];
    for b in &batches {
        for (node, amount) in &b.paid {
            let i = s
                .nodes
                .iter()
                .position(|n| n.node == hex::encode(node.0))
                .expect("a demo node");
            paid_to[i] += amount.0;
        }
    }
    for (i, n) in s.nodes.iter().enumerate() {
        let after = deployment.gym_balance(operators[i]).await.expect("balance");
        assert_eq!(
            after.0 - before[i].0,
            paid_to[i],
            "node {i}'s operator holds exactly its rewards"
        );
        assert_eq!(n.rewards_wei, paid_to[i].to_string());
        match n.behaviour {
            Behaviour::Honest => {
                assert!(paid_to[i] > 0, "honest node {i} is paid");
                assert_eq!(n.stake_wei, DEMO_NODE_STAKE.0.to_string());
            }
            _ => {
                assert_eq!(paid_to[i], 0, "the liar is not paid");
                assert!(n.spot_checks_failed > 0);
                let stake: u128 = n.stake_wei.parse().expect("stake");
                assert!(stake < DEMO_NODE_STAKE.0, "the liar's operator is slashed");
                assert_eq!(
                    n.slashed_wei.parse::<u128>().expect("slashed"),
                    DEMO_NODE_STAKE.0 - stake
                );
            }
        }
    }
    let slashes = reader.slashes().await.expect("slashes");
    assert_eq!(
        slashes.len(),
        s.nodes.iter().map(|n| n.spot_checks_failed).sum::<usize>(),
        "one slash per failed spot-check, none twice"
    );

    // `hanzod verify` reads the records from the chain.
    for e in &s.epochs {
        let dir = e.published.as_ref().expect("published");
        let verify = std::process::Command::new(env!("CARGO_BIN_EXE_hanzod"))
            .arg("verify")
            .arg(dir)
            .args(["--rpc", &anvil.url()])
            .args(["--mining-pool", &deployment.pool.to_string()])
            .args(["--orchestrator", &s.orchestrator])
            .output()
            .expect("hanzod verify runs");
        let text = String::from_utf8_lossy(&verify.stdout).into_owned()
            + &String::from_utf8_lossy(&verify.stderr);
        assert_eq!(verify.status.code(), Some(0), "epoch {}: {text}", e.epoch);
        assert!(text.contains("VERIFIED"), "{text}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
