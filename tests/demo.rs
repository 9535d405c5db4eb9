//! The main job end to end (`hanzod demo`): the orchestrator in this process, real
//! `hanzod node` processes on loopback training the built-in wine-mlp with burn, faults
//! injected by killing processes and by Byzantine nodes.
//!
//! Spot-checks run at rate 1.0 where a test needs one to fire: the selection is a
//! commit–reveal hash of the delta, and delta bytes may differ in the last bit between
//! CPUs (SIMD kernels), so no seed is guaranteed to select a given delta on every machine.

use std::path::PathBuf;

use hanzod::agent::trainer::Behaviour;
use hanzod::demo::{Attack, DemoArgs, DemoPlan, DemoSummary};
use hanzod::train;
use hanzod_actors::job::TrainingSpec;
use hanzod_actors::types::{GymWei, JobId};

fn plan(name: &str, nodes: usize, epochs: u32) -> DemoPlan {
    plan_of(
        name,
        DemoArgs {
            nodes: Some(nodes),
            epochs: Some(epochs),
            timeout_s: Some(120),
            ..DemoArgs::default()
        },
    )
}

/// The plan of `args` writing into a fresh temporary folder named after `name`, without
/// the live view.
fn plan_of(name: &str, args: DemoArgs) -> DemoPlan {
    let out = std::env::temp_dir().join(format!("hanzod-demo-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let args = DemoArgs {
        out: Some(out),
        ..args
    };
    let mut plan = args
        .plan(PathBuf::from(env!("CARGO_BIN_EXE_hanzod")))
        .expect("a valid plan");
    plan.progress = false;
    plan
}

async fn run(plan: DemoPlan) -> DemoSummary {
    eprintln!("demo plan: {}", serde_json::to_string(&plan).unwrap());
    let s = hanzod::demo::run(plan).await.expect("the demo runs");
    eprintln!("{}", hanzod::demo::render(&s));
    s
}

/// `hanzod verify` on every published epoch: each verifies against the demo's exported
/// ledger records and key (exit 0); a copy with one flipped byte in any of its files (the
/// three core ones, and a language model's tokenizer and generation files, which its card
/// declares) fails (exit 1), naming the check; a copy without one of them, or with an
/// undeclared file more, fails the `files` check naming it; an unknown signer fails; a
/// missing records file cannot be verified (exit 2).
fn verify_cli(s: &DemoSummary) {
    // The README's quick start trusts the demo orchestrator's key of the default seed.
    if s.plan.seed
        == DemoArgs::default()
            .plan(PathBuf::from("hanzod"))
            .expect("plan")
            .seed
    {
        let readme = include_str!("../README.md");
        assert!(
            readme.contains(&format!("--orchestrator {}", s.orchestrator)),
            "README.md's verify example should trust {}",
            s.orchestrator
        );
    }
    // Regression: the printed hint said `hanzod verify …`, which does not run after
    // `cargo run -- demo` (no hanzod on the PATH): it names the binary by its path and runs
    // as printed.
    let rendered = hanzod::demo::render(s);
    let hint = rendered
        .lines()
        .find_map(|l| l.strip_prefix("verify it: "))
        .expect("the summary prints how to verify");
    let printed = std::process::Command::new("sh")
        .args(["-c", hint])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("sh runs");
    assert_eq!(
        printed.status.code(),
        Some(0),
        "{hint}: {}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let records = s.out.join(hanzod::demo::PUBLICATIONS_FILE);
    let verify = |dir: &std::path::Path, key: &str, records: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hanzod"))
            .arg("verify")
            .arg(dir)
            .arg("--records")
            .arg(records)
            .args(["--orchestrator", key])
            .output()
            .expect("hanzod verify runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    for e in &s.epochs {
        let dir = PathBuf::from(e.published.as_ref().expect("published"));
        let (code, text) = verify(&dir, &s.orchestrator, &records);
        assert_eq!(code, Some(0), "{text}");
        assert!(
            text.contains("VERIFIED") && text.contains(&e.checkpoint),
            "{text}"
        );
    }
    let dir = PathBuf::from(s.epochs[0].published.as_ref().expect("published"));
    // The repo holds the files its card declares: the three core ones, and for a language
    // model its tokenizer and generation files, so that transformers loads it.
    let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let card = hanzod::publish::ModelCard::parse(&card).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, card.repo_files());
    let lm = [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ];
    if s.plan.model == "qwen3-tiny" {
        assert_eq!(files.len(), 6, "{files:?}");
        for f in lm {
            assert_eq!(
                card.files[f],
                hanzod::publish::cid_of(&std::fs::read(dir.join(f)).unwrap()).to_string()
            );
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("tokenizer.json")).unwrap(),
            train::text::Tokenizer::austen().to_json()
        );
    } else {
        assert_eq!(files.len(), 3, "{files:?}");
    }
    let copy_of = |name: String| {
        let copy = s.out.join(name);
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(&copy).unwrap();
        for f in &files {
            std::fs::copy(dir.join(f), copy.join(f)).unwrap();
        }
        copy
    };
    let checks = [
        ("model.safetensors", "weights CID"),
        ("config.json", "record: config"),
        ("README.md", "record: card"),
        ("tokenizer.json", "tokenizer.json CID"),
        ("tokenizer_config.json", "tokenizer_config.json CID"),
        ("generation_config.json", "generation_config.json CID"),
    ];
    for (file, check) in checks
        .into_iter()
        .filter(|(f, _)| files.iter().any(|g| g == f))
    {
        let copy = copy_of(format!("tampered-{file}"));
        let mut bytes = std::fs::read(copy.join(file)).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x01;
        std::fs::write(copy.join(file), bytes).unwrap();
        let (code, text) = verify(&copy, &s.orchestrator, &records);
        assert_eq!(code, Some(1), "{file}: {text}");
        let verdict = text
            .lines()
            .find(|l| l.starts_with("NOT VERIFIED: "))
            .unwrap_or_default();
        assert!(verdict.contains(check), "{file}: {text}");
    }
    // A copy without its config.json (or its tokenizer), or with a file more, is not the
    // published repo: the `files` check names what differs.
    let mut changes = vec![
        ("missing-config", "config.json", "(missing config.json)"),
        (
            "extra",
            "pytorch_model.bin",
            "(undeclared extra file pytorch_model.bin)",
        ),
    ];
    if files.iter().any(|f| f == "tokenizer.json") {
        changes.push((
            "missing-tokenizer",
            "tokenizer.json",
            "(missing tokenizer.json)",
        ));
    }
    for (name, file, why) in changes {
        let copy = copy_of(format!("files-{name}"));
        match copy.join(file) {
            path if path.exists() => std::fs::remove_file(path).unwrap(),
            path => std::fs::write(path, b"unsigned").unwrap(),
        }
        let (code, text) = verify(&copy, &s.orchestrator, &records);
        assert_eq!(code, Some(1), "{name}: {text}");
        assert!(
            text.contains("FAIL files") && text.contains(why),
            "{name}: {text}"
        );
    }
    let stranger = "ab".repeat(32);
    let (code, text) = verify(&dir, &stranger, &records);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("signature"), "{text}");
    let (code, text) = verify(&dir, &s.orchestrator, &s.out.join("no-such-file.json"));
    assert_eq!(code, Some(2), "{text}");
}

fn wei(s: &str) -> u128 {
    s.parse().expect("a decimal wei amount")
}

const STAKE: u128 = 10_000 * GymWei::PER_GYM;

/// A node's stake after `n` slashes of 10 % each (the demo's `slash_pct`), compounding and
/// rounded down as the ledger does.
fn stake_after_slashes(n: usize) -> u128 {
    (0..n).fold(STAKE, |stake, _| stake - stake / 10)
}
const POOL: u128 = 100 * GymWei::PER_GYM;

/// The validation loss of one process training on the same data with the same compute:
/// each round takes `local_steps` steps with a batch of `nodes × batch_size` (the samples
/// all nodes see in a round, i.e. synchronous data-parallel SGD), for `epochs` rounds.
fn single_process(p: &DemoPlan, job: JobId) -> f64 {
    let training = TrainingSpec {
        local_steps: p.local_steps * p.epochs,
        batch_size: p.batch_size * p.nodes as u32,
        local_lr: p.local_lr,
        seed: p.seed,
        ..TrainingSpec::default()
    };
    let recipe = hanzod::delta::sink::recipe_of(&training, job).unwrap();
    let data = train::Dataset::wine_quality().unwrap();
    let init = train::init(&recipe);
    let run = train::train_local(&init, &data, &recipe, &[0; 32], 0).unwrap();
    train::validation_loss(&run.weights, &data).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_honest_nodes_train_three_epochs_to_published_and_are_paid() {
    let p = plan("honest", 4, 3);
    let s = run(p.clone()).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    assert_eq!(s.epochs.len(), 3);
    // Validation loss falls epoch over epoch, from the initial weights on.
    let mut last = s.initial_loss.expect("initial loss");
    for e in &s.epochs {
        assert_eq!(
            e.loss_before, last,
            "epoch {} starts from the last checkpoint",
            e.epoch
        );
        assert!(
            e.loss_after < e.loss_before,
            "epoch {}: {} → {}",
            e.epoch,
            e.loss_before,
            e.loss_after
        );
        assert_eq!((e.accepted, e.rejected), (4, 0), "epoch {}", e.epoch);
        assert_eq!(e.aggregator, "weighted_mean");
        last = e.loss_after;
    }
    // Every epoch published a distinct checkpoint, named by its Kubo CID, as a Hugging
    // Face repo folder whose model card carries that CID.
    let mut cps: Vec<&str> = s.epochs.iter().map(|e| e.checkpoint.as_str()).collect();
    cps.dedup();
    assert_eq!(cps.len(), 3);
    for e in &s.epochs {
        let dir = PathBuf::from(e.published.as_ref().expect("published as a repo folder"));
        assert!(dir.ends_with(format!(
            "hanzo-gym/wine-mlp-job-{}-epoch-{}",
            s.job, e.epoch
        )));
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        assert_eq!(hanzod::publish::cid_of(&weights).to_string(), e.checkpoint);
        let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
        let card = hanzod::publish::ModelCard::parse(&card).unwrap();
        assert_eq!(
            (card.cid.as_str(), card.epoch, card.job),
            (e.checkpoint.as_str(), e.epoch, s.job)
        );
        assert_eq!(card.quality, e.loss_after);
        let w = train::Weights::from_safetensors(&weights, train::layout(32)).unwrap();
        let data = train::Dataset::wine_quality().unwrap();
        assert_eq!(train::validation_loss(&w, &data).unwrap(), e.loss_after);
    }
    verify_cli(&s);
    // The pools are paid in full, to every node; nobody is slashed.
    let paid: u128 = s.nodes.iter().map(|n| wei(&n.rewards_wei)).sum();
    assert_eq!(paid, 3 * POOL);
    for n in &s.nodes {
        assert!(wei(&n.rewards_wei) > 0, "node {} unpaid", n.index);
        assert_eq!(wei(&n.slashed_wei), 0);
        assert_eq!(wei(&n.stake_wei), STAKE);
        assert_eq!((n.accepted, n.rejected), (3, 0));
    }
    // Federated training matches one process with the same data and compute within 5 %.
    let single = single_process(&p, JobId(s.job));
    let federated = last;
    let gap = (federated - single).abs() / single;
    eprintln!(
        "federated {federated:.4} vs single-process {single:.4}: {:.2} %",
        gap * 100.0
    );
    assert!(
        gap <= 0.05,
        "federated {federated} vs single-process {single}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_node_is_repaired_out_of_the_ring_and_the_job_still_publishes() {
    let mut p = plan("kill", 4, 3);
    p.kill = 1;
    p.kill_epoch = 1;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let killed: Vec<_> = s.nodes.iter().filter(|n| n.killed).collect();
    assert_eq!(killed.len(), 1);
    // The ring was rebuilt without it (formation is version 1).
    assert!(s.ring_version >= 2, "ring version {}", s.ring_version);
    assert_eq!(s.ring_repair_ms.len(), 1, "one repair for the kill");
    // It delivered epoch 0 (and epoch 1 only if it beat the SIGKILL); the last epoch
    // merged the three survivors.
    assert!((1..=2).contains(&killed[0].accepted), "{:?}", killed[0]);
    for e in s.epochs.iter().skip(2) {
        assert_eq!(e.accepted + e.rejected, 3, "epoch {}", e.epoch);
    }
    let mut last = s.initial_loss.unwrap();
    for e in &s.epochs {
        assert!(e.loss_after < last, "epoch {}", e.epoch);
        last = e.loss_after;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn byzantine_nodes_are_rejected_by_spot_checks_and_slashed() {
    let mut p = plan("byzantine", 5, 3);
    p.byzantine = 2;
    p.attack = Attack::Mixed;
    p.spot_check_rate = 1.0;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let kinds: Vec<Behaviour> = s.nodes.iter().map(|n| n.behaviour).collect();
    assert!(
        kinds.contains(&Behaviour::Poison { scale: 10.0 }),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&Behaviour::LieLoss { factor: 0.5 }),
        "{kinds:?}"
    );
    // Caught and slashed 10 % in epoch 0, then out of the ring (under its penalty) for
    // the rest of the job (DESIGN §3, "Standing"): 10,000 × 0.9.
    let slashed_stake = STAKE / 10 * 9;
    for n in &s.nodes {
        match n.behaviour {
            Behaviour::Honest => {
                assert_eq!((n.accepted, n.rejected), (3, 0), "honest node {}", n.index);
                assert_eq!(n.spot_checks_failed, 0);
                assert_eq!(wei(&n.stake_wei), STAKE);
                assert!(wei(&n.rewards_wei) > 0);
            }
            _ => {
                assert_eq!(
                    (n.accepted, n.rejected),
                    (0, 1),
                    "byzantine node {}: rejected once, then left the ring",
                    n.index
                );
                assert_eq!(n.spot_checks_failed, 1, "caught in epoch 0");
                assert_eq!(wei(&n.rewards_wei), 0, "no reward for a rejected delta");
                assert_eq!(wei(&n.stake_wei), slashed_stake);
                assert_eq!(wei(&n.slashed_wei), STAKE - slashed_stake);
            }
        }
    }
    // The poisoned and the lying deltas stayed out of the merge: training still converges.
    let mut last = s.initial_loss.unwrap();
    for e in &s.epochs {
        let rejected = if e.epoch == 0 { 2 } else { 0 };
        assert_eq!(e.rejected, rejected, "epoch {}", e.epoch);
        assert_eq!(e.accepted, 3, "epoch {}: the honest nodes", e.epoch);
        assert!(e.loss_after < last, "epoch {}", e.epoch);
        last = e.loss_after;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ring_job_all_reduces_among_the_nodes_survives_a_kill_and_publishes_every_epoch() {
    let mut p = plan("ring", 4, 3);
    p.aggregation = hanzod_actors::job::Aggregation::Ring;
    p.kill = 1;
    p.kill_epoch = 1;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    assert_eq!(s.epochs.len(), 3);
    assert!(s.ring_version >= 2, "ring version {}", s.ring_version);
    let mut last = s.initial_loss.expect("initial loss");
    for e in &s.epochs {
        assert_eq!(
            e.loss_before, last,
            "epoch {} starts from the last checkpoint",
            e.epoch
        );
        assert!(
            e.loss_after < e.loss_before,
            "epoch {}: {} → {}",
            e.epoch,
            e.loss_before,
            e.loss_after
        );
        last = e.loss_after;
    }
    verify_cli(&s);
    // Every live member is paid by its weight; nobody is slashed.
    for n in s.nodes.iter().filter(|n| !n.killed) {
        assert!(wei(&n.rewards_wei) > 0, "node {} unpaid", n.index);
        assert_eq!(wei(&n.slashed_wei), 0);
    }
}

/// The nodes' JSON events of a demo run (`logs/node-<i>.events.jsonl`), per node index.
fn node_events(s: &DemoSummary) -> Vec<Vec<serde_json::Value>> {
    (0..s.plan.nodes)
        .map(|i| {
            let path = s.out.join("logs").join(format!("node-{i}.events.jsonl"));
            std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tampered_all_reduce_is_caught_attributed_and_slashed_and_the_epoch_falls_back_to_the_star(
) {
    let mut p = plan("ring-tamper", 4, 2);
    p.aggregation = hanzod_actors::job::Aggregation::Ring;
    p.byzantine = 1;
    p.attack = Attack::TamperAllreduce;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let events = node_events(&s);
    for e in &s.epochs {
        // Every member reduced the same (tampered) sum; the orchestrator's check refused it
        // and the epoch merged the members' uploaded deltas as a star.
        let hashes: std::collections::BTreeSet<String> = events
            .iter()
            .flat_map(|n| n.iter())
            .filter(|v| v["event"] == "round_finished" && v["epoch"] == e.epoch)
            .map(|v| v["result_hash"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(hashes.len(), 1, "epoch {}: {hashes:?}", e.epoch);
        assert!(e.loss_after < e.loss_before, "epoch {}", e.epoch);
        if e.epoch == 0 {
            assert_ne!(e.aggregator, "ring", "epoch 0 accepted a tampered sum");
            assert_eq!(e.accepted + e.rejected, 4, "epoch 0: every member uploaded");
            // The signed pieces proved who sent the wrong partial sum: its delta stays
            // out of the merge, everyone else's goes in.
            assert_eq!((e.accepted, e.rejected), (3, 1), "the tamperer is rejected");
        } else {
            // Slashed, the tamperer left the ring at the end of epoch 0: the three honest
            // members' sum is accepted as it is.
            assert_eq!(e.aggregator, "ring", "epoch {}", e.epoch);
            assert_eq!((e.accepted, e.rejected), (3, 0), "epoch {}", e.epoch);
        }
    }
    // The tamperer is slashed once (10 %), then leaves, and is paid nothing; the honest
    // members are paid and not slashed.
    let tamperer = s
        .nodes
        .iter()
        .find(|n| {
            matches!(
                n.ring_fault,
                hanzod::agent::trainer::RingFault::TamperAllreduce { .. }
            )
        })
        .expect("a tamperer");
    assert_eq!(wei(&tamperer.stake_wei), STAKE / 10 * 9, "{tamperer:?}");
    assert_eq!(wei(&tamperer.slashed_wei), STAKE / 10);
    assert_eq!(wei(&tamperer.rewards_wei), 0);
    for n in s.nodes.iter().filter(|n| n.index != tamperer.index) {
        assert_eq!(wei(&n.slashed_wei), 0, "honest node {} slashed", n.index);
        assert!(wei(&n.rewards_wei) > 0, "honest node {} unpaid", n.index);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_that_reduces_another_update_than_it_committed_is_caught_by_the_audit() {
    let mut p = plan("ring-substitute", 4, 8);
    p.aggregation = hanzod_actors::job::Aggregation::Ring;
    p.byzantine = 1;
    p.attack = Attack::Substitute;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let cheat = s
        .nodes
        .iter()
        .find(|n| {
            matches!(
                n.ring_fault,
                hanzod::agent::trainer::RingFault::Substitute { .. }
            )
        })
        .expect("a substituting member");
    // Its sketches are consistent with what it reduces, so the check alone passes. Which
    // epochs sample it depends on its delta hashes (the ring's summation order, hence the
    // bits, follows the measured links), so each epoch is judged by what the cheat was
    // asked: spot-checked (its delta with the scoring seed): excluded before the reduce,
    // the round accepted without it; audited (its delta with the check seed): the check
    // refuses, the signed pieces prove its first piece is not w·δ of its upload, and it is
    // rejected and slashed; neither: the round passes (what the audit rate bounds).
    let events = node_events(&s);
    let asked = |epoch: u32, check: bool| {
        events[cheat.index].iter().any(|v| {
            v["event"] == "sketch_submitted"
                && v["epoch"] == epoch
                && v["check"] == check
                && v["delta_upload"] == true
        })
    };
    let mut audited = 0u32;
    let mut outcomes = Vec::new();
    for e in &s.epochs {
        let (spot, audit) = (asked(e.epoch, false), asked(e.epoch, true));
        outcomes.push(format!(
            "epoch {}: spot-checked {spot}, audited {audit}, {}",
            e.epoch, e.aggregator
        ));
        if audit {
            audited += 1;
            assert_ne!(e.aggregator, "ring", "epoch {}: the audit refuses", e.epoch);
            assert_eq!(
                (e.accepted, e.rejected),
                (3, 1),
                "epoch {}: the cheat is rejected",
                e.epoch
            );
        } else {
            // The round is accepted; its merge is published unless it would put the
            // validation loss more than 2 % above the job's best checkpoint (kept).
            assert!(
                e.aggregator == "ring" || e.aggregator == "kept",
                "epoch {}: {}",
                e.epoch,
                e.aggregator
            );
            assert_eq!(e.rejected, 0, "epoch {}", e.epoch);
        }
        if spot {
            assert!(e.suspect >= 1, "epoch {}: the cheat is excluded", e.epoch);
        }
    }
    eprintln!("substitute (seed {}): {}", s.plan.seed, outcomes.join("; "));
    // Slashed 10 % per audited epoch, compounding; paid nothing in those.
    let stake = stake_after_slashes(audited as usize);
    assert_eq!(wei(&cheat.stake_wei), stake, "{cheat:?}");
    assert_eq!(wei(&cheat.slashed_wei), STAKE - stake);
    // Sampled at least once in 8 epochs (each misses both samples with probability 1/4
    // at rate 0.5: 1.5e-5 for the run).
    assert!(
        cheat.suspect > 0 || audited > 0,
        "never sampled: {outcomes:?}"
    );
    for n in s.nodes.iter().filter(|n| n.index != cheat.index) {
        assert_eq!(wei(&n.slashed_wei), 0, "honest node {} slashed", n.index);
        assert!(wei(&n.rewards_wei) > 0, "honest node {} unpaid", n.index);
    }
    // Training goes on (an epoch of three SGD deltas may lose a little; the run does not).
    let (first, last) = (&s.epochs[0], s.epochs.last().unwrap());
    assert!(last.loss_after < first.loss_after, "{first:?} → {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_free_rider_gets_no_weight_and_no_reward_in_ring_aggregation() {
    let mut p = plan("ring-free-ride", 4, 3);
    p.aggregation = hanzod_actors::job::Aggregation::Ring;
    p.byzantine = 1;
    p.attack = Attack::FreeRide;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let rider = s
        .nodes
        .iter()
        .find(|n| n.ring_fault == hanzod::agent::trainer::RingFault::FreeRide)
        .expect("a free-rider");
    assert_eq!(wei(&rider.rewards_wei), 0, "{rider:?}");
    // A spot-checked free-rider's re-run is not its delta: slashed 10 % per failed check.
    let stake = stake_after_slashes(rider.spot_checks_failed);
    assert_eq!(wei(&rider.stake_wei), stake, "{rider:?}");
    for n in s.nodes.iter().filter(|n| n.index != rider.index) {
        assert!(wei(&n.rewards_wei) > 0, "honest node {} unpaid", n.index);
    }
    for e in &s.epochs {
        assert_eq!(e.aggregator, "ring", "epoch {}", e.epoch);
        assert!(e.loss_after < e.loss_before, "epoch {}", e.epoch);
    }
}

/// Issue 19 (attack suite): the two Byzantine nodes of six collude through the side
/// channel under --out and upload the same delta (the mean of their honest ones). The
/// star-mode copy rule (`pipeline::copies`, duplicates) rejects both every epoch: no
/// weight, no reward, no slash (a duplicate does not prove who copied; spot-checks are off
/// so that only the copy rule acts); the honest nodes are paid and training converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_colluders_are_rejected_as_copies_and_unpaid() {
    let mut p = plan("identical", 6, 2);
    p.byzantine = 2;
    p.attack = Attack::Identical;
    p.spot_check_rate = 0.0;
    let s = run(p).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let identical = Behaviour::Attack {
        attack: hanzod::agent::attack::Attack::Identical,
    };
    let colluders: Vec<_> = s
        .nodes
        .iter()
        .filter(|n| n.behaviour == identical)
        .collect();
    assert_eq!(colluders.len(), 2, "{:?}", s.nodes);
    // They found each other: both colluders' deltas are in the side channel.
    let shared = s.out.join("collude").join(format!("job-{}-epoch-1", s.job));
    let files = std::fs::read_dir(&shared).map(|d| d.count()).unwrap_or(0);
    assert_eq!(files, 2, "{}", shared.display());
    for n in &colluders {
        assert_eq!(
            (n.accepted, n.rejected),
            (0, 2),
            "colluder {}: {n:?}",
            n.index
        );
        assert_eq!(wei(&n.rewards_wei), 0, "colluder {} paid", n.index);
        assert_eq!(wei(&n.stake_wei), STAKE, "a copy is not slashed");
    }
    for n in s.nodes.iter().filter(|n| n.behaviour == Behaviour::Honest) {
        assert_eq!((n.accepted, n.rejected), (2, 0), "honest node {}", n.index);
        assert!(wei(&n.rewards_wei) > 0, "honest node {} unpaid", n.index);
    }
    let mut last = s.initial_loss.unwrap();
    for e in &s.epochs {
        assert_eq!((e.accepted, e.rejected), (4, 2), "epoch {}", e.epoch);
        assert!(e.loss_after < last, "epoch {}", e.epoch);
        last = e.loss_after;
    }
}

#[test]
fn the_attack_suite_gives_the_byzantine_nodes_the_agents_attacks() {
    use hanzod::agent::attack::Attack as Suite;
    let exe = PathBuf::from("hanzod");
    for (attack, want) in [
        (Attack::SignFlip, Suite::SignFlip),
        (Attack::Scale, Suite::Scale { k: 10.0 }),
        (Attack::Alie, Suite::Alie { z: None }),
        (Attack::Ipm, Suite::Ipm { eps: 0.5 }),
        (Attack::Stale, Suite::Stale { epochs: 1 }),
        (Attack::Identical, Suite::Identical),
    ] {
        let p = DemoArgs {
            nodes: Some(6),
            byzantine: Some(2),
            attack: Some(attack),
            ..DemoArgs::default()
        }
        .plan(exe.clone())
        .unwrap();
        let (roles, _) = p.roles();
        let byzantine: Vec<_> = roles.iter().filter(|b| **b != Behaviour::Honest).collect();
        assert_eq!(
            byzantine,
            [&Behaviour::Attack { attack: want }; 2],
            "{attack:?}"
        );
    }
    // From a scenario file too (kebab-case, as on the command line).
    let dir = std::env::temp_dir().join(format!("hanzod-demo-suite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.toml");
    std::fs::write(&file, "byzantine = 1\nattack = \"copy-last\"\n").unwrap();
    let p = DemoArgs {
        scenario: Some(file),
        ..DemoArgs::default()
    }
    .plan(exe)
    .unwrap();
    assert_eq!(p.attack, Attack::CopyLast);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_plans_come_from_flags_over_a_scenario_file_and_bad_ones_name_the_flag() {
    let dir = std::env::temp_dir().join(format!("hanzod-demo-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.toml");
    std::fs::write(
        &file,
        "nodes = 6\nepochs = 4\nkill = 1\nbyzantine = 1\nattack = \"poison\"\n",
    )
    .unwrap();
    let exe = PathBuf::from("hanzod");
    let args = DemoArgs {
        scenario: Some(file.clone()),
        epochs: Some(2),
        ..DemoArgs::default()
    };
    let p = args.plan(exe.clone()).unwrap();
    assert_eq!((p.nodes, p.epochs, p.kill, p.byzantine), (6, 2, 1, 1));
    assert_eq!(p.attack, Attack::Poison);
    let (roles, killed) = p.roles();
    assert_eq!(roles.iter().filter(|b| **b != Behaviour::Honest).count(), 1);
    assert_eq!(killed.len(), 1);
    assert_eq!(
        roles[killed[0]],
        Behaviour::Honest,
        "only honest nodes are killed"
    );
    // The same seed gives the same roles.
    assert_eq!(args.plan(exe.clone()).unwrap().roles(), (roles, killed));

    for (args, flag) in [
        (
            DemoArgs {
                nodes: Some(0),
                ..DemoArgs::default()
            },
            "--nodes",
        ),
        (
            DemoArgs {
                epochs: Some(0),
                ..DemoArgs::default()
            },
            "--epochs",
        ),
        (
            DemoArgs {
                nodes: Some(3),
                kill: Some(2),
                byzantine: Some(1),
                ..DemoArgs::default()
            },
            "--kill",
        ),
        (
            DemoArgs {
                epochs: Some(2),
                kill: Some(1),
                kill_epoch: Some(2),
                ..DemoArgs::default()
            },
            "--kill-epoch",
        ),
        (
            DemoArgs {
                spot_check_rate: Some(1.5),
                ..DemoArgs::default()
            },
            "--spot-check-rate",
        ),
        (
            DemoArgs {
                local_lr: Some(f64::NAN),
                ..DemoArgs::default()
            },
            "--local-lr",
        ),
        (
            DemoArgs {
                local_steps: Some(0),
                ..DemoArgs::default()
            },
            "recipe",
        ),
        (
            DemoArgs {
                kill: Some(1),
                kill_at: Some(hanzod::demo::KillAt::Reduce),
                ..DemoArgs::default()
            },
            "--kill-at",
        ),
        (
            DemoArgs {
                nodes: Some(4),
                testbed: Some(
                    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/testbed.demo.toml"),
                ),
                ..DemoArgs::default()
            },
            "--testbed",
        ),
        (
            DemoArgs {
                testbed: Some(dir.join("no-such-topology.toml")),
                ..DemoArgs::default()
            },
            "--testbed",
        ),
    ] {
        let err = args.plan(exe.clone()).unwrap_err().to_string();
        assert!(err.contains(flag), "{flag}: {err}");
    }
    // A test bed's topology gives the node count.
    let p = DemoArgs {
        testbed: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/testbed.demo.toml")),
        ..DemoArgs::default()
    }
    .plan(exe.clone())
    .expect("config/testbed.demo.toml makes a valid plan");
    assert_eq!(p.nodes, 8);
    // The example scenario the help names is valid.
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/demo.example.toml");
    let p = DemoArgs {
        scenario: Some(example),
        ..DemoArgs::default()
    }
    .plan(exe.clone())
    .expect("config/demo.example.toml is a valid scenario");
    assert_eq!((p.nodes, p.kill, p.byzantine), (8, 1, 2));

    std::fs::write(&file, "nodez = 6\n").unwrap();
    let err = DemoArgs {
        scenario: Some(file),
        ..DemoArgs::default()
    }
    .plan(exe)
    .unwrap_err()
    .to_string();
    assert!(err.contains("nodez"), "{err}");
}

#[test]
fn the_demo_writes_only_into_its_own_folder() {
    let root = std::env::temp_dir().join(format!("hanzod-demo-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    // A new folder becomes the demo's; a rerun replaces its store and model folders only.
    let out = root.join("run");
    hanzod::demo::prepare_out(&out).unwrap();
    assert!(out.join(hanzod::demo::MARKER).exists());
    for sub in ["ipfs", "models", "keys"] {
        std::fs::create_dir_all(out.join(sub)).unwrap();
    }
    hanzod::demo::prepare_out(&out).unwrap();
    assert!(!out.join("ipfs").exists() && !out.join("models").exists());
    assert!(out.join("keys").exists());
    // A folder with other contents, or a file, is refused and left alone.
    let foreign = root.join("home");
    std::fs::create_dir_all(foreign.join("models")).unwrap();
    let err = hanzod::demo::prepare_out(&foreign).unwrap_err().to_string();
    assert!(err.contains("not made by hanzod demo"), "{err}");
    assert!(foreign.join("models").exists());
    let file = root.join("file");
    std::fs::write(&file, "x").unwrap();
    let err = hanzod::demo::prepare_out(&file).unwrap_err().to_string();
    assert!(err.contains("not a folder"), "{err}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Regression: two demos into one `--out` shared its keys and overwrote each other's
/// results while both exited 0. The folder is locked for the run: a second one is refused
/// until the first lets go.
#[test]
fn two_demos_into_one_folder_are_refused() {
    let out = std::env::temp_dir().join(format!("hanzod-demo-lock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let first = hanzod::demo::prepare_out(&out).unwrap();
    let err = hanzod::demo::prepare_out(&out).unwrap_err().to_string();
    assert!(err.contains("another hanzod demo is running"), "{err}");
    drop(first);
    let again = hanzod::demo::prepare_out(&out);
    assert!(again.is_ok(), "{again:?}");
    drop(again);
    let _ = std::fs::remove_dir_all(&out);
}

/// The language-model job end to end: `hanzod demo --model qwen3-tiny` with three node
/// processes. The held-out cross-entropy (nats/token) falls every epoch from the untrained
/// model's ≈ ln 2048; every published repo folder is a Hugging Face Qwen3 checkpoint
/// (config.json of model_type qwen3, model.safetensors with Hugging Face names) whose loss
/// the validator recomputes exactly; the federated run ends within 10 % of a single process
/// that trains as many tokens with the nodes' combined batch (synchronous data
/// parallelism, which averaging AdamW deltas approximates).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_language_model_job_trains_qwen3_tiny_on_the_corpus() {
    let p = plan_of(
        "lm",
        DemoArgs {
            model: Some("qwen3-tiny".into()),
            nodes: Some(3),
            epochs: Some(3),
            timeout_s: Some(300),
            ..DemoArgs::default()
        },
    );
    let s = run(p.clone()).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let initial = s.initial_loss.expect("initial loss");
    assert!((initial - 2048f64.ln()).abs() < 0.1, "{initial}");
    let trainer = train::trainer_of(&p.training(), JobId(s.job)).unwrap();
    let mut last = initial;
    for e in &s.epochs {
        assert_eq!(e.loss_before, last, "epoch {}", e.epoch);
        assert!(
            e.loss_after < e.loss_before,
            "epoch {}: {} → {}",
            e.epoch,
            e.loss_before,
            e.loss_after
        );
        assert_eq!((e.accepted, e.rejected), (3, 0), "epoch {}", e.epoch);
        let dir = PathBuf::from(e.published.as_ref().expect("published as a repo folder"));
        assert!(dir.ends_with(format!(
            "hanzo-gym/qwen3-tiny-job-{}-epoch-{}",
            s.job, e.epoch
        )));
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let cfg = train::qwen3::Qwen3Config::from_json(&config).expect("a Qwen3 config.json");
        assert_eq!(cfg, train::lm::qwen3_tiny());
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let w = train::Weights::from_safetensors(&weights, trainer.layout()).unwrap();
        assert!(w.tensor("model.layers.3.self_attn.q_norm.weight").is_some());
        assert_eq!(trainer.validation_loss(&w).unwrap(), e.loss_after);
        last = e.loss_after;
    }
    verify_cli(&s);
    // One process training as many tokens (its own stream, not the nodes' windows):
    // `epochs × local_steps` AdamW steps on batches of `nodes × batch_size` sequences
    // (synchronous data parallelism).
    let single = {
        let t = TrainingSpec {
            local_steps: p.local_steps * p.epochs,
            batch_size: p.batch_size * p.nodes as u32,
            ..p.training()
        };
        let single = train::trainer_of(&t, JobId(s.job)).unwrap();
        let run = single.train_local(&single.init(), &[0; 32], 0).unwrap();
        single.validation_loss(&run.weights).unwrap()
    };
    let gap = (last - single) / single;
    eprintln!(
        "federated {last:.4} vs single-process {single:.4} nats/token: {:+.2} %",
        gap * 100.0
    );
    assert!(
        gap.abs() <= 0.10,
        "federated {last} vs single-process {single}"
    );
}

/// `W + s·B·A` for every adapted module of `adapter` (PEFT names), computed naively in f64
/// (the test's own reference for the merge the orchestrator runs).
fn apply_adapter(base: &train::Weights, adapter: &train::Weights, scaling: f64) -> train::Weights {
    let mut w = base.clone();
    for e in adapter.layout.entries() {
        let Some(module) = e
            .name
            .strip_prefix("base_model.model.")
            .and_then(|m| m.strip_suffix(".lora_A.weight"))
        else {
            continue;
        };
        let a = adapter.tensor(&e.name).unwrap();
        let b = adapter
            .tensor(&format!("base_model.model.{module}.lora_B.weight"))
            .unwrap();
        let (r, inp) = (e.shape[0], e.shape[1]);
        let out = b.len() / r;
        let target = w.tensor_mut(&format!("{module}.weight")).unwrap();
        for o in 0..out {
            for i in 0..inp {
                let dw: f64 = (0..r)
                    .map(|k| f64::from(b[o * r + k]) * f64::from(a[k * inp + i]))
                    .sum();
                target[o * inp + i] += (scaling * dw) as f32;
            }
        }
    }
    w
}

/// Pretrain, then fine-tune, as two jobs: a full-parameter qwen3-tiny job, then a LoRA job
/// whose `base` is the first job's last checkpoint (by its CID, read from the same demo
/// folder's object store). The LoRA job starts at exactly the loss the pretraining ended
/// at, trains adapters that every spot-check re-executes, and publishes full checkpoints
/// (base + merged ΔW) whose card names the base; federated against one process training as
/// many tokens from the same base.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_pretrains_then_a_lora_job_fine_tunes_its_checkpoint() {
    let pretrain = plan_of(
        "pretrain",
        DemoArgs {
            model: Some("qwen3-tiny".into()),
            nodes: Some(3),
            epochs: Some(1),
            local_steps: Some(8),
            spot_check_rate: Some(1.0),
            timeout_s: Some(300),
            ..DemoArgs::default()
        },
    );
    let a = run(pretrain.clone()).await;
    assert!(a.succeeded(), "{:?}", a.failure);
    let pretrained = a.epochs.last().expect("a pretraining epoch");
    assert!(pretrained.loss_after < a.initial_loss.expect("initial loss"));
    // The second job, in the same folder, names the first one's checkpoint by its CID.
    let mut p = DemoArgs {
        model: Some("qwen3-tiny".into()),
        lora: true,
        base: Some(pretrained.checkpoint.clone()),
        nodes: Some(3),
        epochs: Some(2),
        local_steps: Some(8),
        spot_check_rate: Some(1.0),
        timeout_s: Some(300),
        out: Some(pretrain.out.clone()),
        ..DemoArgs::default()
    }
    .plan(PathBuf::from(env!("CARGO_BIN_EXE_hanzod")))
    .expect("a fine-tuning plan");
    p.progress = false;
    let base_weights = p.base.as_ref().expect("the base was read").weights.clone();
    let s = run(p.clone()).await;
    assert!(s.succeeded(), "{:?}", s.failure);
    let trainer = train::trainer_of(&p.training(), JobId(s.job)).unwrap();
    let lora = trainer.lora().expect("a LoRA job").clone();
    let base = train::Weights::from_safetensors(&base_weights, trainer.layout()).unwrap();
    // Fine-tuning starts exactly where pretraining ended (same weights, same shard).
    assert_eq!(s.initial_loss, Some(pretrained.loss_after));
    let mut last = pretrained.loss_after;
    for e in &s.epochs {
        assert_eq!(e.loss_before, last, "epoch {}", e.epoch);
        assert!(
            e.loss_after < e.loss_before,
            "epoch {}: {} → {}",
            e.epoch,
            e.loss_before,
            e.loss_after
        );
        // Every adapter accepted, every one spot-checked (rate 1): replay and re-execution
        // of the adapter training pass.
        assert_eq!((e.accepted, e.rejected), (3, 0), "epoch {}", e.epoch);
        assert_eq!(
            (e.spot_checks, e.spot_check_failures),
            (3, 0),
            "epoch {}",
            e.epoch
        );
        // The published checkpoint is a full model (the merged ΔW applied), not an adapter,
        // and its card names what it was trained from: the pretrained checkpoint first.
        let dir = PathBuf::from(e.published.as_ref().expect("published as a repo folder"));
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let w = train::Weights::from_safetensors(&weights, trainer.layout()).unwrap();
        assert_eq!(trainer.validation_loss(&w).unwrap(), e.loss_after);
        let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
        let from = if e.epoch == 0 {
            pretrained.checkpoint.clone()
        } else {
            s.epochs[e.epoch as usize - 1].checkpoint.clone()
        };
        assert!(
            card.contains(&format!("base_model: {from}")),
            "epoch {}: {card}",
            e.epoch
        );
        last = e.loss_after;
    }
    verify_cli(&s);
    // One process training as many tokens (its own stream), epoch by epoch from the same
    // base: an adapter of `local_steps` AdamW steps on batches of `nodes × batch_size`
    // sequences, merged into the base.
    let single = {
        let t = TrainingSpec {
            batch_size: p.batch_size * p.nodes as u32,
            ..p.training()
        };
        let single = train::trainer_of(&t, JobId(s.job)).unwrap();
        let mut w = base;
        for epoch in 0..u64::from(p.epochs) {
            let run = single
                .local_delta(&w, &[0; 32], epoch * u64::from(p.local_steps))
                .unwrap();
            w = apply_adapter(&w, &run.delta, lora.scaling());
        }
        single.validation_loss(&w).unwrap()
    };
    let (first, gap) = (pretrained.loss_after, (last - single) / single);
    eprintln!(
        "LoRA from the pretrained base: {first:.4} → federated {last:.4} vs single-process {single:.4} nats/token: {:+.2} %",
        gap * 100.0
    );
    assert!(
        gap.abs() <= 0.05,
        "federated {last} vs single-process {single}"
    );
}

/// The demo's WAN test bed (`config/testbed.demo.toml`): 8 nodes in two regions of 4,
/// 100 Mbit/s within a region and 10 Mbit/s between them, the orchestrator in its own
/// namespace.
fn two_region_bed() -> hanzod::testkit::testbed::Topology {
    hanzod::testkit::testbed::Topology::from_toml_str(include_str!("../config/testbed.demo.toml"))
        .expect("config/testbed.demo.toml is a valid topology")
}

/// Runs a demo on a test bed; `None` (after saying so) when this machine cannot host one
/// and `CI` is unset. Under CI a machine that cannot is a failure.
async fn run_on_bed(plan: DemoPlan, test: &str) -> Option<DemoSummary> {
    eprintln!("demo plan: {}", serde_json::to_string(&plan).unwrap());
    match hanzod::demo::run(plan).await {
        Ok(s) => {
            eprintln!("{}", hanzod::demo::render(&s));
            Some(s)
        }
        Err(hanzod::demo::DemoError::Testbed(e))
            if e.is_unsupported() && std::env::var_os("CI").is_none() =>
        {
            eprintln!("SKIPPED {test}: the WAN test bed needs root and network namespaces: {e}");
            None
        }
        Err(e) => panic!("the demo runs on the test bed: {e}"),
    }
}

/// Issue 18, item 9: a ring job on the WAN test bed (real namespaces, `tc`-shaped links, a
/// 10× bandwidth gap between the regions) end to end: one member SIGKILLed mid-round in
/// epoch 1 (when it reports that its all-reduce round started), one member tampering with
/// its part of the sum. Every epoch publishes: epoch 0 falls back to the star (the check
/// refuses the tampered sum and the signed pieces name the tamperer), the tamperer is
/// rejected, slashed 10 % and leaves the ring at the end of epoch 0 (DESIGN §3,
/// "Standing"), the victim leaves the ring, the honest live members are paid and never
/// slashed, and the loss falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_wan_test_bed_a_ring_job_survives_a_mid_round_kill_and_a_tamperer_to_published() {
    const TEST: &str = "on_the_wan_test_bed_a_ring_job_survives_a_mid_round_kill_and_a_tamperer";
    let mut p = plan("testbed-ring", 8, 3);
    p.testbed = Some(two_region_bed());
    p.aggregation = hanzod_actors::job::Aggregation::Ring;
    p.kill = 1;
    p.kill_epoch = 1;
    p.kill_at = hanzod::demo::KillAt::Reduce;
    p.byzantine = 1;
    p.attack = Attack::TamperAllreduce;
    let started = std::time::Instant::now();
    let Some(s) = run_on_bed(p, TEST).await else {
        return;
    };
    let wall = started.elapsed();
    assert!(s.succeeded(), "{:?}", s.failure);
    assert_eq!(s.epochs.len(), 3, "every epoch published");
    let events = node_events(&s);
    let tamperer = s
        .nodes
        .iter()
        .find(|n| {
            matches!(
                n.ring_fault,
                hanzod::agent::trainer::RingFault::TamperAllreduce { .. }
            )
        })
        .expect("a tamperer");
    let victim = s.nodes.iter().find(|n| n.killed).expect("a killed node");
    // The victim died in its epoch-1 round: it had reported the round started.
    let victim_round = |name: &str| {
        events[victim.index]
            .iter()
            .any(|v| v["event"] == name && v["epoch"] == 1)
    };
    assert!(
        victim_round("round_started"),
        "node {} never started its round",
        victim.index
    );
    eprintln!(
        "{TEST}: {:.1} s wall; victim node {} (finished its epoch-1 round before the kill \
         landed: {}), tamperer node {}; ring v{}, repaired in {:?} ms",
        wall.as_secs_f64(),
        victim.index,
        victim_round("round_finished"),
        tamperer.index,
        s.ring_version,
        s.ring_repair_ms
    );
    assert!(s.ring_version >= 2, "ring version {}", s.ring_version);
    assert!(
        !s.ring_repair_ms.is_empty(),
        "the ring was rebuilt without the victim"
    );
    let mut last = s.initial_loss.expect("initial loss");
    for e in &s.epochs {
        eprintln!(
            "{TEST}: epoch {}: {} ({} accepted, {} rejected), loss {:.4} -> {:.4}, {} ms, \
             orchestrator ingress {:?} bytes",
            e.epoch,
            e.aggregator,
            e.accepted,
            e.rejected,
            e.loss_before,
            e.loss_after,
            e.ms,
            e.orchestrator_rx_bytes
        );
        assert!(e.published.is_some(), "epoch {} published", e.epoch);
        if e.epoch == 0 {
            // The tampered sum is refused: the members' deltas merge as a star, without
            // the tamperer's.
            assert_ne!(e.aggregator, "ring", "epoch 0 accepted a tampered sum");
            assert_eq!(e.rejected, 1, "epoch 0: only the tamperer is rejected");
            assert_eq!(e.accepted + e.rejected, 8, "epoch 0");
        } else {
            // The tamperer left the ring, slashed: nobody is rejected.
            assert_eq!(e.rejected, 0, "epoch {}", e.epoch);
        }
        if e.epoch == 2 {
            assert_eq!(
                e.accepted, 6,
                "epoch 2: without the tamperer and the victim"
            );
        }
        assert!(
            e.accepted >= 6,
            "epoch {}: {} accepted",
            e.epoch,
            e.accepted
        );
        assert_eq!(
            e.loss_before, last,
            "epoch {} starts from the last checkpoint",
            e.epoch
        );
        assert!(
            e.loss_after < e.loss_before,
            "epoch {}: {} -> {}",
            e.epoch,
            e.loss_before,
            e.loss_after
        );
        last = e.loss_after;
    }
    // Every byte the nodes sent the orchestrator crossed the bed.
    assert!(
        s.orchestrator_rx_bytes.is_some_and(|b| b > 0),
        "ingress {:?}",
        s.orchestrator_rx_bytes
    );
    // The tamperer: rejected and slashed 10 % in epoch 0, then out; paid nothing.
    assert_eq!(
        (tamperer.accepted, tamperer.rejected),
        (0, 1),
        "{tamperer:?}"
    );
    assert_eq!(wei(&tamperer.stake_wei), STAKE / 10 * 9, "{tamperer:?}");
    assert_eq!(wei(&tamperer.slashed_wei), STAKE / 10);
    assert_eq!(wei(&tamperer.rewards_wei), 0);
    // The victim is gone after epoch 1 and was never slashed.
    assert!(victim.accepted + victim.rejected <= 2, "{victim:?}");
    assert_eq!(wei(&victim.slashed_wei), 0);
    // Every honest live member is paid and never slashed.
    for n in s
        .nodes
        .iter()
        .filter(|n| n.index != tamperer.index && !n.killed)
    {
        assert_eq!(wei(&n.slashed_wei), 0, "honest node {} slashed", n.index);
        assert!(wei(&n.rewards_wei) > 0, "honest node {} unpaid", n.index);
        assert_eq!(n.rejected, 0, "honest node {} rejected", n.index);
    }
}

/// The orchestrator's ingress per epoch on the WAN test bed, star against ring, for the
/// same honest job (printed, not asserted: with wine-mlp's ~10 kB deltas the sessions'
/// own traffic is a large part of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_the_wan_test_bed_the_orchestrator_ingress_of_ring_and_star_epochs_is_reported() {
    const TEST: &str = "on_the_wan_test_bed_the_orchestrator_ingress_of_ring_and_star_epochs";
    let mut figures = Vec::new();
    for aggregation in [
        hanzod_actors::job::Aggregation::Star,
        hanzod_actors::job::Aggregation::Ring,
    ] {
        let mut p = plan(&format!("testbed-ingress-{aggregation:?}"), 8, 3);
        p.testbed = Some(two_region_bed());
        p.aggregation = aggregation;
        // The daemon's default rate: a spot-checked delta reaches the orchestrator in
        // ring mode too.
        p.spot_check_rate = 0.1;
        let Some(s) = run_on_bed(p, TEST).await else {
            return;
        };
        assert!(s.succeeded(), "{aggregation:?}: {:?}", s.failure);
        let total = s.orchestrator_rx_bytes.expect("ingress measured");
        figures.push(format!(
            "{aggregation:?} {:.1} kB per epoch ({} spot-checks)",
            total as f64 / 1e3 / f64::from(s.plan.epochs),
            s.epochs.iter().map(|e| e.spot_checks).sum::<usize>()
        ));
    }
    eprintln!(
        "{TEST}: orchestrator ingress from submission to Published, 8 nodes, wine-mlp \
         (6,340-byte deltas): {}",
        figures.join("; ")
    );
}
