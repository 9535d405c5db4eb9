//! The Kubo RPC adapter ([`KuboObjectStore`]) against a real IPFS node (DESIGN §7, §11):
//! js-ipfs 0.66.1 on a free loopback port, started per test by
//! [`hanzod::publish::ipfs_node::IpfsNode`] from `tools/js-ipfs` (install:
//! `cd tools/js-ipfs && npm ci`). Without it a test prints a SKIP banner and passes, unless
//! `CI` is set: then it fails.
//!
//! - the object-store conformance suite ([`hanzod::publish::objects::conformance`]), as
//!   tests/publish.rs runs it on the embedded stores;
//! - the CID cross-check: the node's `add --cid-version=1 --raw-leaves` CID equals
//!   [`cid_of`] and its root block equals [`dag`]'s, for seeded random sizes (the seed is
//!   printed; `HANZOD_SEED` replays one), the chunk and layer boundaries and a ~50 MB file;
//! - damage: a proxy in front of the node flips a byte of `cat`, of `block/get`, or makes
//!   the node import with other settings, and the adapter reports Corrupt;
//! - errors: an unreachable URL is Io at once; a CID the node lacks is absent within the
//!   lookup bound; malformed CIDs never reach the node.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use hanzod::publish::cid::{CHUNK_SIZE, MAX_LINKS};
use hanzod::publish::ipfs_node::{skip_reason, IpfsNode};
use hanzod::publish::kubo::{KuboObjectStore, KuboOptions};
use hanzod::publish::objects::conformance::{self, pattern};
use hanzod::publish::tls::{self, Alpn};
use hanzod::publish::{cid_of, dag, Cid, ObjectError, ObjectStore};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::support::test_tls;

/// The node-side bound on lookups in these tests: a missing block is reported within it.
const LOOKUP: Duration = Duration::from_secs(2);

fn options() -> KuboOptions {
    KuboOptions {
        timeout: Duration::from_secs(60),
        connect_timeout: Duration::from_secs(2),
        lookup_timeout: LOOKUP,
        ca_file: None,
    }
}

/// A started node, or `None` after a loud SKIP banner (only without the node and without
/// `CI`; under `CI` a missing node fails the test).
async fn node_or_skip(test: &str) -> Option<IpfsNode> {
    match skip_reason() {
        Ok(None) => Some(IpfsNode::start().await.expect("start the js-ipfs node")),
        Ok(Some(why)) => {
            // Straight to stderr: the test harness captures `eprintln!` of passing tests.
            let banner = format!(
                "\n========== SKIP {test}: no IPFS test node ==========\n{why}\n\
                 (with CI set this is a failure)\n"
            );
            let _ = std::io::stderr().write_all(banner.as_bytes());
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

/// The seed of this run: `HANZOD_SEED`, else random; printed either way.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("HANZOD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: HANZOD_SEED={seed}");
    seed
}

/// A plain HTTP client for talking to the node directly (reqwest needs a TLS backend even
/// for http: the adapters' rustls configuration, without roots).
fn http_client() -> reqwest::Client {
    tls::client_builder(false, None, Alpn::Http1)
        .expect("TLS configuration")
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("HTTP client")
}

/// `ipfs add --cid-version=1 --raw-leaves` (the node's defaults otherwise) of `data`,
/// straight to the node: the CID it reports.
async fn node_add(client: &reqwest::Client, url: &str, data: &[u8]) -> Cid {
    let boundary = "hanzod-test-boundary-7f3a9c";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let reply = client
        .post(format!(
            "{url}/api/v0/add?cid-version=1&raw-leaves=true&pin=false&progress=false"
        ))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .expect("add")
        .error_for_status()
        .expect("add status")
        .text()
        .await
        .expect("add reply");
    let last = reply.lines().last().expect("an add line");
    let v: serde_json::Value = serde_json::from_str(last).expect("add JSON");
    Cid::try_from(v["Hash"].as_str().expect("Hash")).expect("a CID")
}

/// The node's `block/get` of `cid`.
async fn node_block(client: &reqwest::Client, url: &str, cid: &Cid) -> Bytes {
    client
        .post(format!("{url}/api/v0/block/get?arg={cid}&timeout=10s"))
        .send()
        .await
        .expect("block/get")
        .error_for_status()
        .expect("block/get status")
        .bytes()
        .await
        .expect("block bytes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubo_store_conforms() {
    let Some(node) = node_or_skip("kubo_store_conforms").await else {
        return;
    };
    let store = KuboObjectStore::connect(&node.url(), options())
        .await
        .expect("connect");
    assert_eq!(store.version(), node.version());
    assert!(!store.version().is_empty());
    assert_eq!(store.url(), node.url());
    let started = Instant::now();
    conformance::object_store(&store).await;
    eprintln!(
        "conformance against {}: {:?}",
        node.url(),
        started.elapsed()
    );
    // A file of two layers round-trips through add and cat; the CID is the reference one.
    conformance::two_layer_file(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_cids_and_root_blocks_match_ours() {
    let Some(node) = node_or_skip("node_cids_and_root_blocks_match_ours").await else {
        return;
    };
    let url = node.url();
    let client = http_client();
    let mut rng = ChaCha8Rng::seed_from_u64(seed("node_cids_and_root_blocks_match_ours"));
    let layer = MAX_LINKS * CHUNK_SIZE;
    let mut sizes = vec![0, 1, 262_143, 262_144, 262_145, layer, layer + 1];
    sizes.extend((0..6).map(|_| rng.gen_range(0..4 * CHUNK_SIZE)));
    sizes.extend((0..2).map(|_| rng.gen_range(4 * CHUNK_SIZE..12 * CHUNK_SIZE)));
    sizes.push(50_000_000 + rng.gen_range(0..CHUNK_SIZE));
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let mut data = vec![0u8; largest + CHUNK_SIZE];
    rng.fill_bytes(&mut data);

    let started = Instant::now();
    for &len in &sizes {
        // Each file starts at its own offset, so files of similar sizes share no chunks.
        let at = rng.gen_range(0..CHUNK_SIZE);
        let bytes = &data[at..at + len];
        let ours = dag(bytes);
        assert_eq!(ours.root, cid_of(bytes), "dag and cid_of of {len} bytes");
        let theirs = node_add(&client, &url, bytes).await;
        assert_eq!(theirs, ours.root, "CID of {len} bytes (offset {at})");
        let root = ours.root_block().expect("a root block");
        let block = node_block(&client, &url, &theirs).await;
        assert!(block == root.data, "root block of {len} bytes differs");
    }
    eprintln!(
        "{} files, {} bytes in all, cross-checked in {:?}",
        sizes.len(),
        sizes.iter().sum::<usize>(),
        started.elapsed()
    );
}

/// How the proxy in front of the node misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    /// Forwards faithfully.
    None,
    /// Flips one byte of every `cat` reply.
    FlipCat,
    /// Flips one byte of every `block/get` reply.
    FlipBlock,
    /// Makes the node import with dag-pb leaves (`raw-leaves=false`): other settings.
    OtherImporter,
}

#[derive(Clone)]
struct Proxy {
    node: String,
    client: reqwest::Client,
    damage: Arc<Mutex<Damage>>,
}

impl Proxy {
    fn set(&self, damage: Damage) {
        *self.damage.lock().unwrap_or_else(|p| p.into_inner()) = damage;
    }
}

async fn forward(State(proxy): State<Proxy>, req: Request) -> Response {
    let damage = *proxy.damage.lock().unwrap_or_else(|p| p.into_inner());
    let path = req.uri().path().to_string();
    let mut query = req.uri().query().unwrap_or("").to_string();
    if damage == Damage::OtherImporter && path.ends_with("/add") {
        query = query.replace("raw-leaves=true", "raw-leaves=false");
    }
    let content_type = req.headers().get("content-type").cloned();
    let body = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .expect("request body");
    let mut out = proxy
        .client
        .post(format!("{}{path}?{query}", proxy.node))
        .body(body);
    if let Some(ct) = content_type {
        out = out.header("content-type", ct);
    }
    let reply = out.send().await.expect("forward");
    let status = reply.status();
    let mut bytes = reply.bytes().await.expect("reply body").to_vec();
    let flip = match damage {
        Damage::FlipCat => path.ends_with("/cat"),
        Damage::FlipBlock => path.ends_with("/block/get"),
        _ => false,
    };
    if flip && status.is_success() && !bytes.is_empty() {
        let at = bytes.len() / 2;
        bytes[at] ^= 0x01;
    }
    Response::builder()
        .status(status.as_u16())
        .body(Body::from(bytes))
        .expect("response")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_between_node_and_adapter_is_corrupt() {
    let Some(node) = node_or_skip("damage_between_node_and_adapter_is_corrupt").await else {
        return;
    };
    let proxy = Proxy {
        node: node.url(),
        client: http_client(),
        damage: Arc::new(Mutex::new(Damage::None)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let proxy_url = format!("http://{}", listener.local_addr().expect("addr"));
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(proxy.clone());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let store = KuboObjectStore::connect(&proxy_url, options())
        .await
        .expect("connect through the proxy");
    let big = pattern(3 * CHUNK_SIZE + 17);
    let small = b"a single raw block".to_vec();
    let big_cid = store.put(Bytes::from(big.clone())).await.expect("put big");
    let small_cid = store.put(Bytes::from(small.clone())).await.expect("put");
    assert_eq!(&store.get(&big_cid).await.expect("get")[..], &big[..]);

    // A flipped byte in the file as served: the reassembled file is not the CID asked for.
    proxy.set(Damage::FlipCat);
    match store.get(&big_cid).await {
        Err(ObjectError::Corrupt { expected, found }) => {
            assert_eq!(expected, big_cid);
            let mut flipped = big.clone();
            flipped[big.len() / 2] ^= 0x01;
            assert_eq!(found, cid_of(&flipped).to_string());
        }
        other => panic!("cat damaged, get gave {other:?}"),
    }

    // A flipped byte in a root block (the whole of a small file, or a big file's root).
    proxy.set(Damage::FlipBlock);
    for cid in [&small_cid, &big_cid] {
        match store.get(cid).await {
            Err(ObjectError::Corrupt { expected, found }) => {
                assert_eq!(&expected, cid);
                assert_ne!(&found, cid);
            }
            other => panic!("block/get damaged, get of {cid} gave {other:?}"),
        }
    }

    // A node importing with other settings (dag-pb leaves): put refuses its CID.
    proxy.set(Damage::OtherImporter);
    let fresh = pattern(2 * CHUNK_SIZE + 5);
    match store.put(Bytes::from(fresh.clone())).await {
        Err(ObjectError::Corrupt { expected, found }) => {
            assert_eq!(expected, cid_of(&fresh).to_string());
            assert!(found.starts_with("bafy") && found != expected, "{found}");
        }
        other => panic!("other importer settings, put gave {other:?}"),
    }

    proxy.set(Damage::None);
    assert_eq!(&store.get(&small_cid).await.expect("get")[..], &small[..]);
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_precise_and_bounded() {
    // Nothing listens: Io at once, naming the URL.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dead = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    match KuboObjectStore::connect(&dead, options()).await {
        Err(ObjectError::Io { message: m }) => {
            assert!(m.contains(&dead) && m.contains("connect"), "{m}")
        }
        other => panic!("unreachable node gave {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    for bad in ["127.0.0.1:5001", "ftp://127.0.0.1:5001", "http://"] {
        match KuboObjectStore::connect(bad, options()).await {
            Err(ObjectError::Io { message: m }) => assert!(m.contains("IPFS_URL"), "{m}"),
            other => panic!("{bad:?} gave {other:?}"),
        }
    }

    let Some(mut node) = node_or_skip("errors_are_precise_and_bounded").await else {
        return;
    };
    let store = KuboObjectStore::connect(&node.url(), options())
        .await
        .expect("connect");

    // Absent CIDs, one raw and one dag-pb: answered within the lookup bound, not hung.
    let bound = LOOKUP + Duration::from_secs(3);
    let raw = cid_of(b"not on this node").to_string();
    let pb = cid_of(&pattern(CHUNK_SIZE + 1)).to_string();
    for absent in [&raw, &pb] {
        let t = Instant::now();
        assert!(!store.contains(absent).await.expect("contains"));
        assert!(t.elapsed() < bound, "contains took {:?}", t.elapsed());
        let t = Instant::now();
        assert_eq!(
            store.get(absent).await,
            Err(ObjectError::NotFound {
                cid: absent.clone()
            })
        );
        assert!(t.elapsed() < bound, "get took {:?}", t.elapsed());
        let t = Instant::now();
        assert_eq!(
            store.pin(absent).await,
            Err(ObjectError::NotFound {
                cid: absent.clone()
            })
        );
        assert!(t.elapsed() < bound, "pin took {:?}", t.elapsed());
        assert!(!store.is_pinned(absent).await.expect("is_pinned"));
    }

    // A file whose leaf is missing: its root is there, so get names the missing leaf.
    let data = pattern(2 * CHUNK_SIZE + 1);
    let d = dag(&data);
    let root = d.root_block().expect("root");
    let client = http_client();
    let stored = client
        .post(format!(
            "{}/api/v0/block/put?format=dag-pb&version=1&cid-codec=dag-pb&mhtype=sha2-256&cid-base=base32",
            node.url()
        ))
        .header(
            "content-type",
            "multipart/form-data; boundary=hanzod-test-boundary",
        )
        .body(
            [
                &b"--hanzod-test-boundary\r\nContent-Disposition: form-data; name=\"file\"; \
                   filename=\"b\"\r\nContent-Type: application/octet-stream\r\n\r\n"[..],
                &root.data[..],
                &b"\r\n--hanzod-test-boundary--\r\n"[..],
            ]
            .concat(),
        )
        .send()
        .await
        .expect("block/put")
        .text()
        .await
        .expect("block/put reply");
    assert!(stored.contains(&d.root.to_string()), "{stored}");
    let t = Instant::now();
    let cid = d.root.to_string();
    assert!(!store.contains(&cid).await.expect("contains"));
    match store.get(&cid).await {
        Err(ObjectError::NotFound { cid: missing }) => {
            assert!(
                d.blocks[..d.blocks.len() - 1]
                    .iter()
                    .any(|b| b.cid.to_string() == missing),
                "{missing} is not a leaf of {cid}"
            );
        }
        other => panic!("a missing leaf gave {other:?}"),
    }
    assert!(t.elapsed() < 2 * bound, "took {:?}", t.elapsed());

    // The node goes away: Io naming it; malformed CIDs are still refused locally.
    node.kill();
    let t = Instant::now();
    match store.contains(&raw).await {
        Err(ObjectError::Io { message: m }) => assert!(m.contains(&node.url()), "{m}"),
        other => panic!("a dead node gave {other:?}"),
    }
    match store.put(Bytes::from_static(b"x")).await {
        Err(ObjectError::Io { message: m }) => assert!(m.contains("/api/v0/add"), "{m}"),
        other => panic!("a dead node gave {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(matches!(
        store.get("bafy-not-a-cid").await,
        Err(ObjectError::BadCid { reason: _ })
    ));
    assert!(matches!(
        store.pin("QmNotACid").await,
        Err(ObjectError::BadCid { reason: _ })
    ));
}

/// An `https://` URL goes through the adapter's own rustls configuration (ring, the roots
/// of `ca_file`): a TLS terminator with a test CA in front of the node answers, without
/// that CA its certificate is refused, and an unreadable `ca_file` is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_uses_the_ring_tls_configuration() {
    let Some(node) = node_or_skip("https_uses_the_ring_tls_configuration").await else {
        return;
    };
    let ca_file = node.dir().join("test-ca.pem");
    let acceptor = test_tls::localhost_acceptor("hanzod ipfs test CA", &ca_file, &[]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let upstream = format!("127.0.0.1:{}", node.port());
    let terminator = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });

    let url = format!("https://localhost:{port}");
    let store = KuboObjectStore::connect(
        &url,
        KuboOptions {
            ca_file: Some(ca_file),
            ..options()
        },
    )
    .await
    .expect("connect over https with the test CA");
    let data = pattern(CHUNK_SIZE + 3);
    let cid = store.put(Bytes::from(data.clone())).await.expect("put");
    assert_eq!(&store.get(&cid).await.expect("get")[..], &data[..]);

    if std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").is_file()
        && std::env::var_os("SSL_CERT_FILE").is_none()
    {
        match KuboObjectStore::connect(&url, options()).await {
            Err(ObjectError::Io { message: m }) => {
                assert!(m.to_lowercase().contains("certificate"), "{m}")
            }
            other => panic!("a test CA's certificate was accepted: {other:?}"),
        }
    }
    let missing_ca = KuboOptions {
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..options()
    };
    match KuboObjectStore::connect(&url, missing_ca).await {
        Err(ObjectError::Io { message: m }) => assert!(m.contains("/nonexistent/ca.pem"), "{m}"),
        other => panic!("a missing CA file gave {other:?}"),
    }
    terminator.abort();
}

/// `len` bytes in `d`, as `seconds (MB/s)` (MB: 10^6 bytes).
fn timing(len: usize, d: Duration) -> String {
    format!(
        "{:>8.3} s ({:>7.1} MB/s)",
        d.as_secs_f64(),
        len as f64 / 1e6 / d.as_secs_f64().max(1e-9)
    )
}

/// A measurement, not a check of speed (run by hand: `cargo test --test integration ipfs:: -- --ignored
/// --nocapture publication_timings`): against the js-ipfs node, for checkpoints of 1, 64
/// and 256 MiB of seeded random bytes, the time of [`KuboObjectStore`]'s `put` (which
/// includes the adapter's own [`cid_of`] to check the node's CID), `pin` (the `refs` walk,
/// then `pin/add`) and `get` (root, `refs`, streamed `cat`, [`cid_of`] of the result), and
/// of [`cid_of`] alone on the same bytes. It asserts only that the bytes round-trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn publication_timings() {
    let Some(node) = node_or_skip("publication_timings").await else {
        return;
    };
    let store = KuboObjectStore::connect(
        &node.url(),
        KuboOptions {
            timeout: Duration::from_secs(1800),
            lookup_timeout: Duration::from_secs(300),
            ..options()
        },
    )
    .await
    .expect("connect");
    let mut rng = ChaCha8Rng::seed_from_u64(seed("publication_timings"));
    println!("publication_timings: {} on {}", node.version(), node.url());
    println!(
        "{:>8} | {:>26} | {:>26} | {:>26} | {:>26}",
        "size", "put", "pin", "get", "cid_of"
    );
    for mib in [1usize, 64, 256] {
        let len = mib << 20;
        let mut data = vec![0u8; len];
        rng.fill_bytes(&mut data);
        let bytes = Bytes::from(data);

        let t = Instant::now();
        let cid = store.put(bytes.clone()).await.expect("put");
        let put = t.elapsed();
        let t = Instant::now();
        store.pin(&cid).await.expect("pin");
        let pin = t.elapsed();
        let t = Instant::now();
        let got = store.get(&cid).await.expect("get");
        let get = t.elapsed();
        assert!(got[..] == bytes[..], "{mib} MiB read back differ");
        drop(got);
        let t = Instant::now();
        let ours = cid_of(&bytes);
        let hashed = t.elapsed();
        assert_eq!(ours.to_string(), cid);
        println!(
            "{:>4} MiB | {} | {} | {} | {}",
            mib,
            timing(len, put),
            timing(len, pin),
            timing(len, get),
            timing(len, hashed)
        );
    }
}
