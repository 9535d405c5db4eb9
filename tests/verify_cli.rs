//! `hanzod verify` end to end (DESIGN §7): a checkpoint published to the Hub (the fake Hub,
//! a test double following the Hub's published API) and to a local object store, its
//! signed record on a running daemon's ledger; the binary downloads the repo (or reads the
//! CID), asks the daemon for the record over gRPC (`AdminService.ListPublications`) and
//! gives its verdict and exit code. Then a language model's repo (qwen3-tiny, as the sink
//! publishes it): its six files, each checked, from a folder and from the Hub.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use hanzod::config::Config;
use hanzod::core::ports::memory::MemoryStateStore;
use hanzod::core::ports::SystemClock;
use hanzod::identity::Identity;
use hanzod::publish::fake_hub::FakeHub;
use hanzod::publish::hub::{HubOptions, HubRegistry};
use hanzod::publish::publisher::{Checkpoint, Publisher};
use hanzod::publish::registry::CARD_FILE;
use hanzod::publish::{FsObjectStore, ModelCard};
use hanzod::serve::Daemon;
use hanzod_actors::types::JobId;

const REPO: &str = "hanzo-gym/wine-mlp-job-9-epoch-4";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hanzod-verify-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `hanzod verify <args…>`; returns the exit code and stdout + stderr.
async fn verify<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hanzod"))
        .arg("verify")
        .args(args)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .env_remove("IPFS_URL")
        .env_remove("HANZOD_ENDPOINT")
        .output()
        .await
        .expect("hanzod verify runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

fn flip_a_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_the_hub_or_the_object_store_and_the_daemons_ledger() {
    let mut cfg = Config::load(None, |_| None).unwrap();
    cfg.data_dir.clear(); // memory-only: nothing written into the working directory
    cfg.server.grpc_addr = "127.0.0.1:0".into();
    cfg.server.metrics_addr = String::new();
    // The daemon signs with this key: the records below are its own.
    cfg.orchestrator.key = hex::encode([21u8; 32]);
    let daemon = Daemon::start(&cfg).await.expect("daemon starts");
    let endpoint = format!("http://{}", daemon.grpc_addr);

    let hub = FakeHub::start().await.expect("fake hub");
    let objects_dir = scratch("objects");
    let key = Identity::from_seed([21; 32]);
    let trusted = hex::encode(key.node_id().0);
    let publisher = Publisher {
        objects: Arc::new(FsObjectStore::open(&objects_dir).await.unwrap()),
        registry: Some(Arc::new(
            HubRegistry::new(HubOptions {
                endpoint: hub.url(),
                token: Some(hub.token().to_string()),
                ..HubOptions::default()
            })
            .unwrap(),
        )),
        journal: Arc::new(MemoryStateStore::new()),
        signer: key.clone(),
        clock: Arc::new(SystemClock),
    };
    // 600 KB of weights: three chunks, a dag-pb root (`bafy…`), LFS on the Hub.
    let weights: Vec<u8> = (0..600_000u32).map(|i| (i * 13 + i / 7) as u8).collect();
    let (staged, _) = publisher
        .stage(Checkpoint {
            job: JobId(9),
            epoch: 4,
            weights: Bytes::from(weights),
            config_json: br#"{"model_type": "wine-mlp"}"#.to_vec(),
            files: Default::default(),
            card: ModelCard {
                cid: String::new(),
                epoch: 4,
                job: 9,
                quality: 0.61,
                base_model: Some("bafkreibase".into()),
                license: "apache-2.0".into(),
                model: "wine-mlp".into(),
                dataset: "wine-quality-red".into(),
                files: Default::default(),
            },
            repo: Some(REPO.into()),
            report: serde_json::json!({}),
        })
        .await
        .unwrap();
    let w = publisher.weights(&staged).await.unwrap();
    let pushed = publisher.complete(&staged, w).await.unwrap();
    assert!(matches!(pushed, Some(Ok(_))), "{pushed:?}");
    daemon
        .ledger()
        .record_publication(&staged.publication)
        .await
        .unwrap();
    let cid = staged.cid().to_string();
    let object_dir = objects_dir.display().to_string();
    let hub_url = hub.url();
    // `hanzod verify <repo>` on the fake Hub, the record from the daemon at `ledger`.
    let hub_args = |repo: &str, ledger: &str| -> Vec<String> {
        [
            repo,
            "--hf-endpoint",
            &hub_url,
            "--hf-token",
            hub.token(),
            "--endpoint",
            ledger,
            "--orchestrator",
            &trusted,
        ]
        .map(str::to_string)
        .to_vec()
    };
    let from_hub = hub_args(REPO, &endpoint);

    // From the Hub, the record from the daemon: verified.
    let (code, text) = verify(&from_hub).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("VERIFIED") && text.contains(&cid), "{text}");
    assert!(text.contains("record: repo"), "{text}");
    // By CID from the object store: verified; --json says the same.
    let by_cid = [
        cid.as_str(),
        "--object-dir",
        &object_dir,
        "--endpoint",
        &endpoint,
        "--orchestrator",
        &trusted,
    ];
    let (code, text) = verify(&by_cid).await;
    assert_eq!(code, Some(0), "{text}");
    let (code, text) = verify(&[&by_cid[..], &["--json"]].concat()).await;
    assert_eq!(code, Some(0), "{text}");
    let json: serde_json::Value = serde_json::from_str(
        text.lines()
            .filter(|l| !l.starts_with("trusting"))
            .collect::<String>()
            .as_str(),
    )
    .expect("JSON verdict");
    assert_eq!(json["verified"], true);
    assert_eq!(json["cid"], cid.as_str());
    // Without --orchestrator the daemon asked vouches for its own key, and says so.
    let (code, text) = verify(&by_cid[..5]).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "trusting the key of the orchestrator at {endpoint}: {trusted}"
        )),
        "{text}"
    );
    // A records file is trusted only with a key: without one, exit 2.
    let records_file = objects_dir.join("records.json");
    let records = daemon.ledger().publications().await.unwrap();
    std::fs::write(&records_file, serde_json::to_vec(&records).unwrap()).unwrap();
    let records_path = records_file.display().to_string();
    let (code, text) = verify(&[
        cid.as_str(),
        "--object-dir",
        &object_dir,
        "--records",
        &records_path,
    ])
    .await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("no orchestrator key is trusted"), "{text}");

    // A daemon that cannot be reached: exit 2 (not verified, not refuted).
    let (code, text) = verify(&hub_args(REPO, "http://127.0.0.1:1")).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("could not read the ledger"), "{text}");
    // Someone pushes another card to the repo: the Hub copy no longer verifies.
    let mut readme = staged.readme.clone().into_bytes();
    let at = readme.len() - 10;
    readme[at] ^= 0x01;
    hub.seed(REPO, &[(CARD_FILE, &readme)]);
    let (code, text) = verify(&from_hub).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("FAIL") && text.contains("record: card"),
        "{text}"
    );

    // A flipped byte in a stored block: the object store refuses it, the verdict names it.
    let blocks: Vec<PathBuf> = std::fs::read_dir(objects_dir.join("blocks"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                // The weights' leaves; config.json and the card are single raw blocks too.
                let record = &staged.publication.record;
                n.starts_with("bafk") && n != record.config_cid && n != record.card_cid
            })
        })
        .collect();
    assert_eq!(blocks.len(), 3, "three raw leaves of the weights");
    flip_a_byte(&blocks[1]);
    let (code, text) = verify(&by_cid).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("weights CID"), "{text}");

    // A target that is nothing: exit 2.
    let (code, text) = verify(&["not a thing!"]).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("neither a folder, a CID nor a Hub repo id"),
        "{text}"
    );
    // A repo the Hub does not have: exit 2, naming it.
    let (code, text) = verify(&hub_args("hanzo-gym/missing-epoch-0", &endpoint)).await;
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("missing-epoch-0"), "{text}");

    daemon.stop().await;
    let _ = std::fs::remove_dir_all(&objects_dir);
}

/// Copies the repo folder `dir` to a fresh folder `name` beside it.
fn copy_repo(dir: &Path, to: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to.to_path_buf()
}

/// A language model's checkpoint, staged as the sink stages it (`config.json` its Hugging
/// Face config plus `hanzod_job`, the tokenizer and generation files beside it), published
/// to a folder and to the Hub: `hanzod verify` checks all six files of either, refuses a
/// tampered or deleted tokenizer naming it, and names an undeclared extra file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_checks_every_file_of_a_language_models_repo() {
    use hanzod::delta::sink::{model_config_json, repo_files_of, repo_of, trainer_of};
    use hanzod::publish::registry::{
        GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
    };
    use hanzod::publish::{FolderRegistry, Location};
    use hanzod_actors::job::{JobSpec, TrainingSpec};

    let job = JobId(12);
    let training = TrainingSpec {
        model: "qwen3-tiny".into(),
        dataset: "austen".into(),
        local_lr: 3e-3,
        seq_len: 32,
        validation_tokens: 256,
        ..TrainingSpec::default()
    };
    let spec = JobSpec {
        name: "austen".into(),
        epochs: 2,
        min_nodes: 1,
        max_nodes: 2,
        min_vram_bytes: 0,
        pending_deadline_ms: 60_000,
        epoch_deadline_ms: 60_000,
        utility: 1.0,
        submitter_stake: hanzod_actors::types::GymWei::gym(100_000),
        training: training.clone(),
    };
    let trainer = trainer_of(&training, job).unwrap();
    let model = hanzod::delta::catalog::ModelCatalog::builtin()
        .check_training(&training)
        .unwrap();
    let hf = hanzod::train::recipe::lm_config(&training)
        .unwrap()
        .unwrap()
        .to_json();
    let scratch_dir = scratch("lm");
    let hub = FakeHub::start().await.expect("fake hub");
    let key = Identity::from_seed([33; 32]);
    let trusted = hex::encode(key.node_id().0);
    let repo = repo_of("hanzo-gym", "qwen3-tiny", job, 0);
    let publisher = Publisher {
        objects: Arc::new(
            FsObjectStore::open(scratch_dir.join("objects"))
                .await
                .unwrap(),
        ),
        registry: Some(Arc::new(
            HubRegistry::new(HubOptions {
                endpoint: hub.url(),
                token: Some(hub.token().to_string()),
                ..HubOptions::default()
            })
            .unwrap(),
        )),
        journal: Arc::new(MemoryStateStore::new()),
        signer: key.clone(),
        clock: Arc::new(SystemClock),
    };
    let (staged, _) = publisher
        .stage(Checkpoint {
            job,
            epoch: 0,
            weights: Bytes::from(trainer.init().to_safetensors()),
            config_json: model_config_json(&training.model, &model, Some(&hf), Some((job, &spec))),
            files: repo_files_of(&trainer),
            card: ModelCard {
                cid: String::new(),
                epoch: 0,
                job: job.0,
                quality: 7.5,
                base_model: None,
                license: "apache-2.0".into(),
                model: training.model.clone(),
                dataset: training.dataset.clone(),
                files: Default::default(),
            },
            repo: Some(repo.clone()),
            report: serde_json::json!({}),
        })
        .await
        .unwrap();
    let weights = publisher.weights(&staged).await.unwrap();
    let pushed = publisher.complete(&staged, weights.clone()).await.unwrap();
    assert!(matches!(pushed, Some(Ok(_))), "{pushed:?}");
    // The same publication completed into a folder registry.
    let to_folder = Publisher {
        registry: Some(Arc::new(FolderRegistry::new(scratch_dir.join("models")))),
        ..publisher.clone()
    };
    let Some(Ok(published)) = to_folder.complete(&staged, weights).await.unwrap() else {
        panic!("published to the folder")
    };
    let Location::Path(dir) = published.location else {
        panic!("a folder")
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            CARD_FILE,
            "config.json",
            GENERATION_CONFIG_FILE,
            "model.safetensors",
            TOKENIZER_FILE,
            TOKENIZER_CONFIG_FILE
        ]
    );
    // The Hub holds the same six (and the Hub's .gitattributes).
    let head = hub.head_files(&repo).unwrap();
    for name in &names {
        assert_eq!(
            head[name.as_str()].bytes,
            std::fs::read(dir.join(name)).unwrap(),
            "{name}"
        );
    }
    let records = scratch_dir.join("records.json");
    std::fs::write(
        &records,
        serde_json::to_vec(std::slice::from_ref(&staged.publication)).unwrap(),
    )
    .unwrap();
    let records = records.display().to_string();
    let args = |target: &str| -> Vec<String> {
        [
            target,
            "--records",
            &records,
            "--orchestrator",
            &trusted,
            "--hf-endpoint",
            &hub.url(),
        ]
        .map(str::to_string)
        .to_vec()
    };

    // The folder and the Hub repo verify, every file checked.
    for target in [dir.display().to_string(), repo.clone()] {
        let (code, text) = verify(&args(&target)).await;
        assert_eq!(code, Some(0), "{target}: {text}");
        for check in [
            "tokenizer.json CID",
            "tokenizer_config.json CID",
            "generation_config.json CID",
            "record: card",
            "record: config",
        ] {
            assert!(text.contains(&format!("ok   {check}")), "{check}: {text}");
        }
        assert!(text.contains("VERIFIED"), "{text}");
    }

    // A tampered tokenizer: its CID is not the one the signed card declares.
    let tampered = copy_repo(&dir, &scratch_dir.join("tampered"));
    flip_a_byte(&tampered.join(TOKENIZER_FILE));
    let (code, text) = verify(&args(&tampered.display().to_string())).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL tokenizer.json CID"), "{text}");
    assert!(
        text.contains("NOT VERIFIED: tokenizer.json CID failed"),
        "{text}"
    );
    // A deleted tokenizer: the repo lacks a declared file.
    let deleted = copy_repo(&dir, &scratch_dir.join("deleted"));
    std::fs::remove_file(deleted.join(TOKENIZER_FILE)).unwrap();
    let (code, text) = verify(&args(&deleted.display().to_string())).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL files"), "{text}");
    assert!(text.contains("(missing tokenizer.json)"), "{text}");
    assert!(text.contains("NOT VERIFIED: files failed"), "{text}");
    // An extra file nobody declared (nor signed) is reported by name.
    let extra = copy_repo(&dir, &scratch_dir.join("extra"));
    std::fs::write(extra.join("pytorch_model.bin"), b"unsigned").unwrap();
    let (code, text) = verify(&args(&extra.display().to_string())).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("(undeclared extra file pytorch_model.bin)"),
        "{text}"
    );
    // The Hub copy with another tokenizer pushed over it fails the same way.
    hub.seed(&repo, &[(TOKENIZER_FILE, b"{}")]);
    let (code, text) = verify(&args(&repo)).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("FAIL tokenizer.json CID"), "{text}");

    let _ = std::fs::remove_dir_all(&scratch_dir);
}
