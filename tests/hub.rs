//! The Hugging Face Hub adapter (`hanzod::publish::hub`) against the fake Hub
//! (`hanzod::publish::fake_hub::FakeHub`, a test double following the Hub's published API):
//! one commit of the three files with the weights through LFS (a language model's six,
//! with its tokenizer and generation files), idempotent republication,
//! conflicts, retried 429/503 bursts, bounded failures, bad tokens, a crash between the LFS
//! upload and the commit, and streamed downloads. Then the download path against a real
//! Hub-compatible server: olah (PyPI `olah==0.5.4`) serving a git mirror offline. Without
//! olah the last test is skipped loudly, and fails under `CI`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hanzod::publish::fake_hub::{
    olah_skip_reason, write_git_mirror, FakeHub, Fault, MirrorFile, OlahServer, OLAH_INSTALL_HINT,
};
use hanzod::publish::hub::{
    git_blob_oid, sha256_hex, HubClient, HubOptions, HubRegistry, RetryPolicy,
};
use hanzod::publish::registry::{
    CARD_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
    WEIGHTS_FILE,
};
use hanzod::publish::{cid_of, Location, ModelCard, ModelRegistry, ModelUpload, RegistryError};
use rand::{Rng, SeedableRng};

use crate::support::test_tls;

/// Random bytes from a printed seed.
fn random_bytes(len: usize, what: &str) -> Vec<u8> {
    let seed: u64 = rand::random();
    eprintln!("{what}: {len} random bytes, seed {seed}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut out = vec![0u8; len];
    rng.fill(&mut out[..]);
    out
}

fn upload(weights: &[u8], epoch: u32) -> ModelUpload {
    ModelUpload {
        repo: ModelUpload::repo_id("hanzo", "gpt2-small", epoch),
        weights: Arc::from(weights),
        config_json: br#"{"n_layer": 2, "n_embd": 64}"#.to_vec(),
        card: ModelCard {
            cid: cid_of(weights).to_string(),
            epoch,
            job: 7,
            quality: 2.5,
            base_model: None,
            license: "apache-2.0".into(),
            model: "gpt2-small".into(),
            dataset: "wikitext-2".into(),
            files: Default::default(),
        },
        files: Default::default(),
    }
}

/// Fast retries: 4 tries, 5–40 ms apart, `Retry-After` capped at 2 s.
fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        max_elapsed: Duration::from_secs(10),
        min_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(40),
        max_retry_after: Duration::from_secs(2),
    }
}

fn options(endpoint: &str, token: Option<&str>) -> HubOptions {
    HubOptions {
        endpoint: endpoint.to_string(),
        token: token.map(str::to_string),
        timeout: Duration::from_secs(10),
        retry: fast_retry(),
        ..HubOptions::default()
    }
}

fn registry(hub: &FakeHub) -> HubRegistry {
    HubRegistry::new(options(&hub.url(), Some(hub.token()))).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hanzod-hub-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The requests the fake served, as `METHOD path` lines.
fn calls(hub: &FakeHub) -> Vec<String> {
    hub.requests()
        .iter()
        .map(|r| format!("{} {} {}", r.method, r.path, r.status))
        .collect()
}

#[tokio::test]
async fn publish_makes_one_commit_with_the_weights_through_lfs() {
    let hub = FakeHub::start().await.unwrap();
    let weights = random_bytes(300_000, "weights");
    let up = upload(&weights, 3);
    let repo = up.repo.clone();
    let published = registry(&hub).publish(&up).await.unwrap();
    assert_eq!(published.repo, repo);
    assert_eq!(
        published.location,
        Location::Url(format!("{}/{repo}", hub.url()))
    );

    // The calls, in order, as huggingface_hub makes them.
    let sig = &repo;
    let oid = sha256_hex(&weights);
    assert_eq!(
        calls(&hub),
        vec![
            "POST /api/repos/create 200".to_string(),
            format!("GET /api/models/{sig}/tree/main 200"),
            format!("POST /api/models/{sig}/preupload/main 200"),
            format!("POST /{sig}.git/info/lfs/objects/batch 200"),
            format!("PUT /lfs-upload/{sig}/{oid} 200"),
            format!("POST /lfs-verify/{sig}/{oid} 200"),
            format!("POST /api/models/{sig}/commit/main 200"),
        ]
    );
    assert_eq!(hub.commits(&repo), 1);
    assert_eq!(
        hub.commit_summaries(&repo),
        vec!["initial commit", "hanzod: gpt2-small epoch 3 (job 7)"]
    );
    let head = hub.head_files(&repo).unwrap();
    assert_eq!(
        head.keys().map(String::as_str).collect::<Vec<_>>(),
        vec![".gitattributes", CARD_FILE, CONFIG_FILE, WEIGHTS_FILE]
    );
    assert!(head[WEIGHTS_FILE].lfs);
    assert_eq!(head[WEIGHTS_FILE].bytes, weights);
    assert!(!head[CONFIG_FILE].lfs);
    assert_eq!(head[CONFIG_FILE].bytes, up.config_json);
    assert!(!head[CARD_FILE].lfs);
    assert_eq!(head[CARD_FILE].bytes, up.card.render().into_bytes());
    assert_eq!(hub.lfs_uploads(), 1);
    assert_eq!(hub.lfs_objects(&repo), 1);

    // The tree carries the ids the adapter compares: git blob sha1s and the LFS sha256.
    let client = HubClient::new(&options(&hub.url(), None)).unwrap();
    let tree = client.tree(&repo).await.unwrap();
    let entry = |p: &str| tree.iter().find(|e| e.path == p).unwrap().clone();
    assert_eq!(entry(CONFIG_FILE).oid, git_blob_oid(&up.config_json));
    assert_eq!(
        entry(CARD_FILE).oid,
        git_blob_oid(up.card.render().as_bytes())
    );
    let lfs = entry(WEIGHTS_FILE).lfs.unwrap();
    assert_eq!((lfs.oid.as_str(), lfs.size), (oid.as_str(), 300_000));
}

/// A language model's repo: the tokenizer and generation files go in the same one commit,
/// as regular blobs, and a republication finds them there (no second commit).
#[tokio::test]
async fn a_language_models_tokenizer_and_generation_files_go_in_the_one_commit() {
    let hub = FakeHub::start().await.unwrap();
    let weights = random_bytes(100_000, "weights");
    let mut up = upload(&weights, 0);
    let tokenizer = random_bytes(120_000, "tokenizer.json")
        .iter()
        .map(|b| b'a' + b % 26)
        .collect::<Vec<u8>>();
    up.files = [
        (TOKENIZER_FILE, tokenizer),
        (
            TOKENIZER_CONFIG_FILE,
            br#"{"model_max_length": 512}"#.to_vec(),
        ),
        (GENERATION_CONFIG_FILE, br#"{"eos_token_id": 0}"#.to_vec()),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), Arc::from(b)))
    .collect();
    up.card.files = up
        .files
        .iter()
        .map(|(n, b)| (n.clone(), cid_of(b).to_string()))
        .collect();
    let reg = registry(&hub);
    reg.publish(&up).await.unwrap();
    assert_eq!(hub.commits(&up.repo), 1);
    let head = hub.head_files(&up.repo).unwrap();
    assert_eq!(
        head.keys().map(String::as_str).collect::<Vec<_>>(),
        vec![
            ".gitattributes",
            CARD_FILE,
            CONFIG_FILE,
            GENERATION_CONFIG_FILE,
            WEIGHTS_FILE,
            TOKENIZER_FILE,
            TOKENIZER_CONFIG_FILE
        ]
    );
    for (name, bytes) in &up.files {
        assert!(!head[name.as_str()].lfs, "{name} is a regular blob");
        assert_eq!(head[name.as_str()].bytes, &bytes[..], "{name}");
    }
    assert_eq!(hub.lfs_uploads(), 1, "the weights only");
    // Again: the tree holds all six, nothing is committed.
    reg.publish(&up).await.unwrap();
    assert_eq!(hub.commits(&up.repo), 1);
    // The same repo without the tokenizer files is another publication: a conflict.
    let core = upload(&weights, 0);
    assert_eq!(
        reg.publish(&core).await,
        Err(RegistryError::Conflict {
            repo: up.repo.clone()
        })
    );
}

#[tokio::test]
async fn publishing_the_same_content_again_is_a_no_op() {
    let hub = FakeHub::start().await.unwrap();
    // One entry a page: the check follows the tree's `Link` pages.
    hub.set_tree_page_size(1);
    let up = upload(&random_bytes(50_000, "weights"), 1);
    let reg = registry(&hub);
    let first = reg.publish(&up).await.unwrap();
    let before = hub.requests().len();
    let again = reg.publish(&up).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(hub.commits(&up.repo), 1);
    assert_eq!(hub.lfs_uploads(), 1);
    let after: Vec<String> = calls(&hub)[before..].to_vec();
    assert_eq!(after[0], "POST /api/repos/create 409");
    assert!(
        after[1..].iter().all(|c| c.contains("/tree/main")),
        "only the tree is read again: {after:?}"
    );
    assert_eq!(after.len(), 1 + 4, "4 tree pages of one entry: {after:?}");
}

#[tokio::test]
async fn other_content_in_the_repo_is_a_conflict() {
    let hub = FakeHub::start().await.unwrap();
    let reg = registry(&hub);
    let up = upload(&random_bytes(20_000, "first weights"), 2);
    reg.publish(&up).await.unwrap();
    let other = upload(&random_bytes(20_000, "second weights"), 2);
    assert_eq!(
        reg.publish(&other).await,
        Err(RegistryError::Conflict {
            repo: up.repo.clone()
        })
    );
    assert_eq!(hub.commits(&up.repo), 1);
    assert_eq!(
        hub.head_files(&up.repo).unwrap()[WEIGHTS_FILE].bytes,
        &up.weights[..]
    );

    // A repo someone else filled: also a conflict, and left alone.
    let third = upload(&random_bytes(1_000, "third weights"), 5);
    hub.seed(&third.repo, &[("notes.txt", b"not ours")]);
    assert_eq!(
        reg.publish(&third).await,
        Err(RegistryError::Conflict {
            repo: third.repo.clone()
        })
    );
    assert_eq!(hub.commits(&third.repo), 0);
}

#[tokio::test]
async fn bursts_of_429_and_503_are_retried() {
    let hub = FakeHub::start().await.unwrap();
    let up = upload(&random_bytes(40_000, "weights"), 4);
    // Two 429s (Retry-After: 0) on whatever comes first, one 429 asking for 1 s on the
    // preupload, 503s on the LFS upload and the commit.
    hub.fail_next(2, 429);
    hub.inject(
        1,
        Fault {
            status: 429,
            retry_after: Some("1".into()),
            path_contains: Some("/preupload/".into()),
        },
    );
    for (n, path) in [(1, "/lfs-upload/"), (2, "/commit/")] {
        hub.inject(
            n,
            Fault {
                status: 503,
                retry_after: None,
                path_contains: Some(path.into()),
            },
        );
    }
    let started = Instant::now();
    registry(&hub).publish(&up).await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(950),
        "Retry-After: 1 was honoured ({took:?})"
    );
    assert_eq!(hub.commits(&up.repo), 1);
    assert_eq!(hub.lfs_uploads(), 1);
    // 7 calls of a clean publication, the 6 answered with a fault, and before each commit
    // retry a read of the tree (a lost answer must not commit twice).
    assert_eq!(hub.requests().len(), 7 + 6 + 2, "{:#?}", calls(&hub));
    assert_eq!(hub.count("GET", "/tree/main"), 3);
    assert_eq!(hub.count("POST", "/api/repos/create"), 3);
    assert_eq!(hub.count("POST", "/preupload/"), 2);
    assert_eq!(hub.count("PUT", "/lfs-upload/"), 2);
    assert_eq!(hub.count("POST", "/commit/"), 3);
}

#[tokio::test]
async fn too_many_failures_fail_clearly_and_commit_nothing() {
    let hub = FakeHub::start().await.unwrap();
    let up = upload(&random_bytes(40_000, "weights"), 6);
    hub.inject(
        100,
        Fault {
            status: 503,
            retry_after: None,
            path_contains: Some("/commit/".into()),
        },
    );
    let reg = registry(&hub);
    let err = reg.publish(&up).await.unwrap_err();
    let RegistryError::Io { message } = &err else {
        panic!("want Io, got {err:?}");
    };
    for part in [
        "committing to hanzo/gpt2-small-epoch-6",
        &format!(
            "POST {}/api/models/hanzo/gpt2-small-epoch-6/commit/main",
            hub.url()
        ),
        "503",
        "after 4 attempts",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    // Nothing half-committed: the repo still holds only the Hub's initial commit.
    assert_eq!(hub.commits(&up.repo), 0);
    assert_eq!(
        hub.head_files(&up.repo).unwrap().keys().collect::<Vec<_>>(),
        vec![".gitattributes"]
    );
    assert_eq!(hub.lfs_objects(&up.repo), 1);

    // Resumed: the stored object is not uploaded again, and one commit follows.
    hub.clear_faults();
    reg.publish(&up).await.unwrap();
    assert_eq!(hub.commits(&up.repo), 1);
    assert_eq!(hub.lfs_uploads(), 1);

    // The repo created, nothing else: a later call completes it.
    let up2 = upload(&random_bytes(1_000, "weights"), 8);
    hub.inject(
        100,
        Fault {
            status: 500,
            retry_after: None,
            path_contains: Some("/preupload/".into()),
        },
    );
    assert!(
        matches!(reg.publish(&up2).await, Err(RegistryError::Io { message: m }) if m.contains("preuploading to hanzo/gpt2-small-epoch-8"))
    );
    assert!(hub.exists(&up2.repo));
    hub.clear_faults();
    reg.publish(&up2).await.unwrap();
    assert_eq!(hub.commits(&up2.repo), 1);

    // No server at all: connection errors are retried, then named.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere =
        HubRegistry::new(options(&format!("http://127.0.0.1:{port}"), Some("t"))).unwrap();
    match nowhere.publish(&up).await {
        Err(RegistryError::Io { message: m }) => {
            assert!(m.contains("creating repo hanzo/gpt2-small-epoch-6"), "{m}");
            assert!(m.contains("after 4 attempts"), "{m}");
        }
        other => panic!("want Io, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bad_or_missing_token_is_an_auth_error() {
    let hub = FakeHub::start().await.unwrap();
    let up = upload(&random_bytes(1_000, "weights"), 1);
    for token in [Some("hf_not_the_token"), None] {
        let reg = HubRegistry::new(options(&hub.url(), token)).unwrap();
        match reg.publish(&up).await {
            Err(RegistryError::Unauthorized { message: m }) => {
                assert!(m.contains("HF_TOKEN"), "{m}");
                assert!(m.contains(&up.repo), "{m}");
                assert!(m.contains("creating repo"), "{m}");
            }
            other => panic!("token {token:?}: want Unauthorized, got {other:?}"),
        }
    }
    assert!(!hub.exists(&up.repo));
    // Refusals are not retried.
    assert_eq!(hub.count("POST", "/api/repos/create"), 2);
}

#[tokio::test]
async fn a_crash_between_the_lfs_upload_and_the_commit_resumes_with_one_commit() {
    let hub = FakeHub::start().await.unwrap();
    let up = upload(&random_bytes(80_000, "weights"), 9);
    let reg = Arc::new(registry(&hub));
    hub.halt_after_lfs_upload();
    let task = {
        let (reg, up) = (Arc::clone(&reg), up.clone());
        tokio::spawn(async move { reg.publish(&up).await })
    };
    // The publisher "crashes" once its next request after the upload is in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while hub.held_requests() == 0 {
        assert!(Instant::now() < deadline, "no request after the LFS upload");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    hub.resume();
    assert_eq!(hub.lfs_objects(&up.repo), 1);
    assert_eq!(hub.commits(&up.repo), 0);

    let published = reg.publish(&up).await.unwrap();
    assert_eq!(published.repo, up.repo);
    assert_eq!(hub.commits(&up.repo), 1);
    assert_eq!(
        hub.lfs_uploads(),
        1,
        "the stored object was not uploaded twice"
    );
    assert_eq!(hub.count("PUT", "/lfs-upload/"), 1);
    assert_eq!(
        hub.head_files(&up.repo).unwrap()[WEIGHTS_FILE].bytes,
        &up.weights[..]
    );
}

#[tokio::test]
async fn downloads_stream_the_published_files() {
    let hub = FakeHub::start().await.unwrap();
    let weights = random_bytes(700_000, "weights");
    let up = upload(&weights, 0);
    registry(&hub).publish(&up).await.unwrap();

    let dir = scratch("download");
    let dest = dir.join(WEIGHTS_FILE);
    let client = HubClient::new(&options(&hub.url(), None)).unwrap();
    // A 503 first: the transfer is retried from the start.
    hub.inject(
        1,
        Fault {
            status: 503,
            retry_after: None,
            path_contains: Some("/resolve/".into()),
        },
    );
    let pb = indicatif::ProgressBar::hidden();
    let n = client
        .download(&up.repo, WEIGHTS_FILE, &dest, Some(&pb))
        .await
        .unwrap();
    assert_eq!(n, weights.len() as u64);
    assert_eq!(pb.position(), n);
    assert_eq!(std::fs::read(&dest).unwrap(), weights);
    assert!(!dir.join(format!("{WEIGHTS_FILE}.part")).exists());
    // The weights came through the redirect to the LFS object.
    assert_eq!(hub.count("GET", "/lfs-cdn/"), 1);

    assert_eq!(
        client.fetch_small(&up.repo, CARD_FILE).await.unwrap(),
        up.card.render().into_bytes()
    );
    assert_eq!(
        client.fetch_small(&up.repo, CONFIG_FILE).await.unwrap(),
        up.config_json
    );
    match client.fetch_small(&up.repo, "nope.json").await {
        Err(RegistryError::NotFound { what: m }) => {
            assert!(m.contains(&format!("{}/nope.json", up.repo)), "{m}")
        }
        other => panic!("want NotFound, got {other:?}"),
    }
    let missing = dir.join("missing");
    match client
        .download("hanzo/nothing-epoch-0", WEIGHTS_FILE, &missing, None)
        .await
    {
        Err(RegistryError::NotFound { what: m }) => {
            assert!(m.contains("hanzo/nothing-epoch-0"), "{m}")
        }
        other => panic!("want NotFound, got {other:?}"),
    }
    assert!(!missing.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The download path against olah, a real Hub-compatible server, serving a git mirror
/// offline (the weights as an LFS object, the rest as regular blobs).
#[tokio::test]
async fn olah_serves_what_the_client_downloads() {
    let missing = olah_skip_reason()
        .unwrap_or_else(|e| panic!("{e} (under CI olah is required: `{OLAH_INSTALL_HINT}`)"));
    if let Some(why) = missing {
        eprintln!(
            "\n*** SKIPPED olah_serves_what_the_client_downloads: {why}; \
             install it with `{OLAH_INSTALL_HINT}` ***\n"
        );
        return;
    }
    let dir = scratch("olah");
    let weights = random_bytes(200_000, "weights");
    let up = upload(&weights, 1);
    let readme = up.card.render();
    write_git_mirror(
        &dir.join("mirrors"),
        &up.repo,
        &[
            MirrorFile {
                path: WEIGHTS_FILE,
                bytes: &weights,
                lfs: true,
            },
            MirrorFile {
                path: CONFIG_FILE,
                bytes: &up.config_json,
                lfs: false,
            },
            MirrorFile {
                path: CARD_FILE,
                bytes: readme.as_bytes(),
                lfs: false,
            },
        ],
    )
    .unwrap();
    let olah = OlahServer::start(&dir.join("mirrors"), &dir.join("olah"))
        .await
        .unwrap();
    let client = HubClient::new(&options(&olah.url(), None)).unwrap();

    // The tree: git's own blob ids equal ours, and the LFS entry names the weights.
    let tree = client.tree(&up.repo).await.unwrap_or_else(|e| {
        panic!("{e}\nolah's output:\n{}", olah.output_tail());
    });
    let entry = |p: &str| tree.iter().find(|e| e.path == p).cloned().unwrap();
    assert_eq!(entry(CONFIG_FILE).oid, git_blob_oid(&up.config_json));
    assert_eq!(entry(CARD_FILE).oid, git_blob_oid(readme.as_bytes()));
    let lfs = entry(WEIGHTS_FILE).lfs.expect("weights served as LFS");
    assert_eq!(lfs.oid, sha256_hex(&weights));
    assert_eq!(lfs.size, weights.len() as u64);

    let dest = dir.join("model.safetensors");
    let n = client
        .download(&up.repo, WEIGHTS_FILE, &dest, None)
        .await
        .unwrap();
    assert_eq!(n, weights.len() as u64);
    assert_eq!(std::fs::read(&dest).unwrap(), weights);
    assert_eq!(
        client.fetch_small(&up.repo, CONFIG_FILE).await.unwrap(),
        up.config_json
    );
    let card = client.fetch_small(&up.repo, CARD_FILE).await.unwrap();
    assert_eq!(
        ModelCard::parse(std::str::from_utf8(&card).unwrap()),
        Ok(up.card.clone())
    );
    // olah answers an unknown repo as the Hub does: 401 with X-Error-Code: RepoNotFound.
    match client
        .fetch_small("hanzo/nothing-epoch-0", CONFIG_FILE)
        .await
    {
        Err(RegistryError::NotFound { what: m }) => assert!(m.contains("RepoNotFound"), "{m}"),
        other => panic!("want NotFound, got {other:?}"),
    }
    drop(olah);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `https` endpoints go through the adapter's own rustls configuration (ring, the roots of
/// `ca_file`, ALPN): a TLS server with a test CA answers, and without that CA the
/// certificate is refused.
#[tokio::test]
async fn https_endpoints_use_the_ring_tls_configuration() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = scratch("tls");
    let ca_file = dir.join("ca.pem");
    let acceptor = test_tls::localhost_acceptor("hanzod hub test CA", &ca_file, &[b"http/1.1"]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });

    let endpoint = format!("https://localhost:{port}");
    let trusted = HubClient::new(&HubOptions {
        ca_file: Some(ca_file.clone()),
        ..options(&endpoint, Some("hf_x"))
    })
    .unwrap();
    assert_eq!(
        trusted
            .fetch_small("hanzo/gpt2-small-epoch-0", CONFIG_FILE)
            .await
            .unwrap(),
        b"hello"
    );
    if std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").is_file()
        && std::env::var_os("SSL_CERT_FILE").is_none()
    {
        let system_roots = HubClient::new(&options(&endpoint, None)).unwrap();
        match system_roots
            .fetch_small("hanzo/gpt2-small-epoch-0", CONFIG_FILE)
            .await
        {
            Err(RegistryError::Io { message: m }) => {
                assert!(m.to_lowercase().contains("certificate"), "{m}")
            }
            other => panic!("a test CA's certificate was accepted: {other:?}"),
        }
    }
    served.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A measurement, not a check of speed (run by hand: `cargo test --test integration hub:: -- --ignored
/// --nocapture publication_timings`): [`HubRegistry::publish`] of checkpoints of 1, 64 and
/// 256 MiB of random weights to the fake Hub (in memory, on loopback), the weights through
/// LFS. The time includes the adapter's checks ([`cid_of`] of the weights against the card,
/// sha256 and git blob ids) and the fake Hub's own sha256 of the upload. It asserts only
/// that each publication took the LFS path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn publication_timings() {
    let hub = FakeHub::start().await.unwrap();
    let reg = HubRegistry::new(HubOptions {
        timeout: Duration::from_secs(600),
        ..options(&hub.url(), Some(hub.token()))
    })
    .unwrap();
    println!(
        "publication_timings: HubRegistry::publish to the fake Hub at {}",
        hub.url()
    );
    println!("{:>8} | {:>26}", "size", "publish");
    for (epoch, mib) in [1usize, 64, 256].into_iter().enumerate() {
        let len = mib << 20;
        let weights = random_bytes(len, "weights");
        let up = upload(&weights, epoch as u32);
        let t = Instant::now();
        reg.publish(&up).await.unwrap();
        let took = t.elapsed();
        let lfs_put = format!("PUT /lfs-upload/{}/{} 200", up.repo, sha256_hex(&weights));
        assert!(calls(&hub).contains(&lfs_put), "{mib} MiB not through LFS");
        println!(
            "{mib:>4} MiB | {:>8.3} s ({:>7.1} MB/s)",
            took.as_secs_f64(),
            len as f64 / 1e6 / took.as_secs_f64().max(1e-9)
        );
    }
}
