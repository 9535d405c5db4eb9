//! The object-store port (DESIGN §7, §11): files stored as IPFS DAGs, named by their
//! Kubo-identical CID ([`hanzod_protocol::cid`]).
//!
//! | implementation | where | durability |
//! |---|---|---|
//! | [`MemoryObjectStore`] | a hash map of blocks (the embedded default) | the process |
//! | [`FsObjectStore`] | a directory: `<dir>/blocks/<cid>`, `<dir>/pins/<cid>` | fsync'd file and directory |
//!
//! Both keep blocks, not files: a file is split by [`hanzod_protocol::cid::dag`] and [`ObjectStore::get`]
//! reassembles it, checking every block against its CID and the whole file against the CID
//! asked for. The real adapter is `hanzod_adapters::kubo::KuboObjectStore` (Kubo's HTTP RPC,
//! `IPFS_URL`).
//!
//! [`conformance`] is the port's contract as a suite any implementation can run.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use ipld_dagpb::PbNode;

use hanzod_protocol::cid::{block_cid, cid_of, dag_of_bytes, Cid, DAG_PB, RAW};

pub mod conformance;

/// The deepest DAG [`ObjectStore::get`] walks. A file of 174^7 chunks (≈ 1.1 × 10^21 bytes)
/// is 8 levels deep; anything deeper is not a file this store wrote.
const MAX_DEPTH: usize = 16;

/// Why an object-store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The object (or one of its blocks) is not stored; the CID of the missing block.
    #[error("object {cid} not found")]
    NotFound {
        /// The CID of the missing block.
        cid: String,
    },
    /// The string is not a CID this store can hold: unparsable, or not sha2-256 over `raw`
    /// or `dag-pb`. Carries the reason.
    #[error("bad CID: {reason}")]
    BadCid {
        /// Why ([`hanzod_protocol::cid::CidError`], or the IPFS node's refusal).
        reason: String,
    },
    /// The stored bytes are damaged: a block whose bytes hash to `found` instead of its name
    /// `expected`, a file that reassembles to `found` instead of the CID asked for, or (as
    /// `found`) a description of a block that does not decode.
    #[error("object corrupt: expected {expected}, found {found}")]
    Corrupt {
        /// The CID asked for, or of the damaged block.
        expected: String,
        /// The CID the bytes hash to, or what was found instead of a well-formed block.
        found: String,
    },
    /// The backing storage failed (disk full, permissions, a blocking task that died).
    #[error("object store I/O: {message}")]
    Io {
        /// What failed, in the file system's or the IPFS node's words.
        message: String,
    },
}

/// A content-addressed store of files, named by the CID that `ipfs add --cid-version=1`
/// gives them.
///
/// Implementations are cheap to share (`Arc<dyn ObjectStore>`) and never block the async
/// runtime: chunking, hashing and file I/O run on blocking threads.
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `bytes` as a file and returns its CID (base32 CIDv1: `bafk…` for at most
    /// 262,144 bytes, `bafy…` above). Idempotent; durable when it returns `Ok`. Does not pin
    /// (as `ipfs add --pin=false`); see [`ObjectStore::pin`]. Errors: [`ObjectError::Io`].
    async fn put(&self, bytes: Bytes) -> Result<String, ObjectError>;

    /// The file stored under `cid`, reassembled from its blocks and verified: each block
    /// must hash to its CID and the file must recompute to `cid`, else
    /// [`ObjectError::Corrupt`]. [`ObjectError::NotFound`] names the first missing block;
    /// [`ObjectError::BadCid`] for a string that is not a CID of this store's kind.
    async fn get(&self, cid: &str) -> Result<Arc<[u8]>, ObjectError>;

    /// Whether every block of `cid`'s DAG is stored (inner nodes are decoded, leaves only
    /// looked up, not hashed). [`ObjectError::BadCid`] for a bad string,
    /// [`ObjectError::Corrupt`] for an inner node that no longer hashes to its name.
    async fn contains(&self, cid: &str) -> Result<bool, ObjectError>;

    /// Pins `cid` (a record that a later garbage collection must keep its DAG). Idempotent.
    /// [`ObjectError::NotFound`] unless [`ObjectStore::contains`] holds.
    async fn pin(&self, cid: &str) -> Result<(), ObjectError>;

    /// Whether `cid` is pinned. [`ObjectError::BadCid`] for a bad string.
    async fn is_pinned(&self, cid: &str) -> Result<bool, ObjectError>;

    /// Every pinned CID, sorted by its string form.
    async fn pins(&self) -> Result<Vec<String>, ObjectError>;
}

/// Parses `cid` and checks that it is a sha2-256 CID of a `raw` or `dag-pb` block
/// ([`hanzod_protocol::cid::parse_cid`]); [`ObjectError::BadCid`] otherwise.
pub fn parse_cid(cid: &str) -> Result<Cid, ObjectError> {
    hanzod_protocol::cid::parse_cid(cid).map_err(|e| ObjectError::BadCid {
        reason: e.to_string(),
    })
}

/// Synchronous block access, shared by the two stores' DAG walks (run on blocking threads).
trait BlockSource {
    /// The bytes stored under `cid`, unverified; `None` when absent.
    fn block(&self, cid: &Cid) -> Result<Option<Bytes>, ObjectError>;
    /// Whether `cid` is stored, without reading it.
    fn has_block(&self, cid: &Cid) -> Result<bool, ObjectError>;
}

/// The block under `cid`, checked against its name.
fn verified_block(src: &dyn BlockSource, cid: &Cid) -> Result<Bytes, ObjectError> {
    let bytes = src.block(cid)?.ok_or_else(|| ObjectError::NotFound {
        cid: cid.to_string(),
    })?;
    let found = block_cid(cid.codec(), &bytes);
    if found != *cid {
        return Err(ObjectError::Corrupt {
            expected: cid.to_string(),
            found: found.to_string(),
        });
    }
    Ok(bytes)
}

/// The links of the verified dag-pb block `cid`, in order.
fn node_links(src: &dyn BlockSource, cid: &Cid) -> Result<Vec<Cid>, ObjectError> {
    let bytes = verified_block(src, cid)?;
    let node = PbNode::from_bytes(bytes).map_err(|e| ObjectError::Corrupt {
        expected: cid.to_string(),
        found: format!("an undecodable dag-pb node ({e})"),
    })?;
    Ok(node.links.into_iter().map(|l| l.cid).collect())
}

fn too_deep(root: &Cid) -> ObjectError {
    ObjectError::Corrupt {
        expected: root.to_string(),
        found: format!("a DAG deeper than {MAX_DEPTH} levels"),
    }
}

/// Appends the file bytes under `cid` to `out`, checking every block.
fn append_file(
    src: &dyn BlockSource,
    root: &Cid,
    cid: &Cid,
    depth: usize,
    out: &mut Vec<u8>,
) -> Result<(), ObjectError> {
    if depth > MAX_DEPTH {
        return Err(too_deep(root));
    }
    match cid.codec() {
        RAW => {
            out.extend_from_slice(&verified_block(src, cid)?);
            Ok(())
        }
        DAG_PB => {
            for link in node_links(src, cid)? {
                append_file(src, root, &link, depth + 1, out)?;
            }
            Ok(())
        }
        other => Err(ObjectError::Corrupt {
            expected: root.to_string(),
            found: format!("a link to {cid} of codec {other:#x}"),
        }),
    }
}

/// The file under `root`, reassembled and verified (see [`ObjectStore::get`]).
fn read_file(src: &dyn BlockSource, root: &Cid) -> Result<Arc<[u8]>, ObjectError> {
    let mut out = Vec::new();
    append_file(src, root, root, 0, &mut out)?;
    let found = cid_of(&out);
    if found != *root {
        return Err(ObjectError::Corrupt {
            expected: root.to_string(),
            found: found.to_string(),
        });
    }
    Ok(Arc::from(out))
}

/// Whether every block under `cid` is stored (see [`ObjectStore::contains`]).
fn has_dag(
    src: &dyn BlockSource,
    root: &Cid,
    cid: &Cid,
    depth: usize,
) -> Result<bool, ObjectError> {
    if depth > MAX_DEPTH {
        return Err(too_deep(root));
    }
    if cid.codec() != DAG_PB {
        return src.has_block(cid);
    }
    let links = match node_links(src, cid) {
        Ok(links) => links,
        Err(ObjectError::NotFound { cid: _ }) => return Ok(false),
        Err(e) => return Err(e),
    };
    for link in links {
        if !has_dag(src, root, &link, depth + 1)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs blocking work `f` on tokio's blocking pool; a task that panicked or was cancelled
/// is an [`ObjectError::Io`].
async fn blocking<T, F>(f: F) -> Result<T, ObjectError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ObjectError> + Send + 'static,
{
    crate::blobs::on_blocking_pool(f, |message| ObjectError::Io { message }).await
}

type BlockMap = HashMap<Cid, Bytes>;

/// The embedded default: blocks in a hash map, for the life of the process.
///
/// Verifies on `get` like every store (the bytes are immutable once stored, so this guards
/// only against bugs; it costs one SHA-256 pass, on a blocking thread).
#[derive(Debug, Default, Clone)]
pub struct MemoryObjectStore {
    blocks: Arc<RwLock<BlockMap>>,
    pinned: Arc<RwLock<BTreeSet<String>>>,
}

impl MemoryObjectStore {
    /// An empty store.
    pub fn new() -> MemoryObjectStore {
        MemoryObjectStore::default()
    }

    /// Number of distinct blocks stored.
    pub fn block_count(&self) -> usize {
        read_lock(&self.blocks).len()
    }

    /// Total bytes of the distinct blocks stored.
    pub fn total_bytes(&self) -> u64 {
        read_lock(&self.blocks)
            .values()
            .map(|b| b.len() as u64)
            .sum()
    }
}

// Every critical section is one map operation: a poisoned lock is still consistent.
fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl BlockSource for RwLock<BlockMap> {
    fn block(&self, cid: &Cid) -> Result<Option<Bytes>, ObjectError> {
        Ok(read_lock(self).get(cid).cloned())
    }

    fn has_block(&self, cid: &Cid) -> Result<bool, ObjectError> {
        Ok(read_lock(self).contains_key(cid))
    }
}

#[async_trait::async_trait]
impl ObjectStore for MemoryObjectStore {
    async fn put(&self, bytes: Bytes) -> Result<String, ObjectError> {
        let blocks = Arc::clone(&self.blocks);
        blocking(move || {
            let dag = dag_of_bytes(bytes);
            let mut map = write_lock(&blocks);
            for block in dag.blocks {
                map.entry(block.cid).or_insert(block.data);
            }
            Ok(dag.root.to_string())
        })
        .await
    }

    async fn get(&self, cid: &str) -> Result<Arc<[u8]>, ObjectError> {
        let root = parse_cid(cid)?;
        let blocks = Arc::clone(&self.blocks);
        blocking(move || read_file(&*blocks, &root)).await
    }

    async fn contains(&self, cid: &str) -> Result<bool, ObjectError> {
        let root = parse_cid(cid)?;
        let blocks = Arc::clone(&self.blocks);
        blocking(move || has_dag(&*blocks, &root, &root, 0)).await
    }

    async fn pin(&self, cid: &str) -> Result<(), ObjectError> {
        let root = parse_cid(cid)?;
        if !self.contains(cid).await? {
            return Err(ObjectError::NotFound {
                cid: root.to_string(),
            });
        }
        write_lock(&self.pinned).insert(root.to_string());
        Ok(())
    }

    async fn is_pinned(&self, cid: &str) -> Result<bool, ObjectError> {
        let root = parse_cid(cid)?;
        Ok(read_lock(&self.pinned).contains(&root.to_string()))
    }

    async fn pins(&self) -> Result<Vec<String>, ObjectError> {
        Ok(read_lock(&self.pinned).iter().cloned().collect())
    }
}

/// A local content-addressed block store in a directory:
///
/// - `<dir>/blocks/<cid>`: one file per block, named by its base32 CIDv1, holding the block's
///   bytes (a raw leaf's chunk, or an inner node's dag-pb encoding);
/// - `<dir>/pins/<cid>`: an empty file per pinned CID.
///
/// Each file is written to a temporary name in the same directory, fsync'd, renamed into
/// place, and the directory fsync'd, so a crash leaves either no block or a whole one; a
/// file's blocks are written children first and root last. Blocks are verified on every
/// read.
#[derive(Debug, Clone)]
pub struct FsObjectStore {
    dir: PathBuf,
}

/// Distinguishes the temporary files of concurrent writers within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io_error(what: &str, path: &Path, e: std::io::Error) -> ObjectError {
    ObjectError::Io {
        message: format!("{what} {}: {e}", path.display()),
    }
}

impl FsObjectStore {
    /// Opens (creating if needed) the store in `dir`: creates `dir/blocks` and `dir/pins`.
    /// Errors: [`ObjectError::Io`] when they cannot be created.
    pub async fn open(dir: impl Into<PathBuf>) -> Result<FsObjectStore, ObjectError> {
        let dir = dir.into();
        blocking(move || {
            for sub in ["blocks", "pins"] {
                let path = dir.join(sub);
                std::fs::create_dir_all(&path).map_err(|e| io_error("creating", &path, e))?;
            }
            Ok(FsObjectStore { dir })
        })
        .await
    }

    /// The store already in `dir`, without creating anything (for readers: a folder
    /// without `blocks/` is no store). Blocking (one `stat`).
    ///
    /// Errors: [`ObjectError::Io`] when `dir/blocks` is not a folder.
    pub fn open_existing(dir: impl Into<PathBuf>) -> Result<FsObjectStore, ObjectError> {
        let dir = dir.into();
        let blocks = dir.join("blocks");
        if !blocks.is_dir() {
            return Err(ObjectError::Io {
                message: format!("no object store at {} (no blocks/ folder)", dir.display()),
            });
        }
        Ok(FsObjectStore { dir })
    }

    /// The file stored under `cid`, read on the calling thread (blocking) and checked
    /// against its CID block by block, as [`ObjectStore::get`] does.
    ///
    /// Errors: [`ObjectError::BadCid`], [`ObjectError::NotFound`],
    /// [`ObjectError::Corrupt`], [`ObjectError::Io`], as [`ObjectStore::get`].
    pub fn read_blocking(&self, cid: &str) -> Result<Arc<[u8]>, ObjectError> {
        read_file(self, &parse_cid(cid)?)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the block named `cid` (whether or not it is stored).
    pub fn block_path(&self, cid: &Cid) -> PathBuf {
        self.dir.join("blocks").join(cid.to_string())
    }

    fn pin_path(&self, cid: &Cid) -> PathBuf {
        self.dir.join("pins").join(cid.to_string())
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsync,
/// rename. The caller fsyncs the directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ObjectError> {
    let parent = path.parent().ok_or_else(|| ObjectError::Io {
        message: format!("{} has no parent", path.display()),
    })?;
    let tmp = parent.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp).map_err(|e| io_error("creating", &tmp, e))?;
        file.write_all(bytes)
            .map_err(|e| io_error("writing", &tmp, e))?;
        file.sync_all().map_err(|e| io_error("syncing", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io_error("renaming into", path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// fsyncs directory `dir`, making the renames into it durable.
fn sync_dir(dir: &Path) -> Result<(), ObjectError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("syncing directory", dir, e))
}

impl BlockSource for FsObjectStore {
    fn block(&self, cid: &Cid) -> Result<Option<Bytes>, ObjectError> {
        let path = self.block_path(cid);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("reading", &path, e)),
        }
    }

    fn has_block(&self, cid: &Cid) -> Result<bool, ObjectError> {
        let path = self.block_path(cid);
        path.try_exists()
            .map_err(|e| io_error("checking", &path, e))
    }
}

#[async_trait::async_trait]
impl ObjectStore for FsObjectStore {
    async fn put(&self, bytes: Bytes) -> Result<String, ObjectError> {
        let store = self.clone();
        blocking(move || {
            let dag = dag_of_bytes(bytes);
            let mut wrote = false;
            for block in &dag.blocks {
                if !store.has_block(&block.cid)? {
                    write_atomic(&store.block_path(&block.cid), &block.data)?;
                    wrote = true;
                }
            }
            if wrote {
                sync_dir(&store.dir.join("blocks"))?;
            }
            Ok(dag.root.to_string())
        })
        .await
    }

    async fn get(&self, cid: &str) -> Result<Arc<[u8]>, ObjectError> {
        let (store, cid) = (self.clone(), cid.to_string());
        blocking(move || store.read_blocking(&cid)).await
    }

    async fn contains(&self, cid: &str) -> Result<bool, ObjectError> {
        let root = parse_cid(cid)?;
        let store = self.clone();
        blocking(move || has_dag(&store, &root, &root, 0)).await
    }

    async fn pin(&self, cid: &str) -> Result<(), ObjectError> {
        let root = parse_cid(cid)?;
        if !self.contains(cid).await? {
            return Err(ObjectError::NotFound {
                cid: root.to_string(),
            });
        }
        let store = self.clone();
        blocking(move || {
            let path = store.pin_path(&root);
            if path
                .try_exists()
                .map_err(|e| io_error("checking", &path, e))?
            {
                return Ok(());
            }
            write_atomic(&path, &[])?;
            sync_dir(&store.dir.join("pins"))
        })
        .await
    }

    async fn is_pinned(&self, cid: &str) -> Result<bool, ObjectError> {
        let root = parse_cid(cid)?;
        let path = self.pin_path(&root);
        blocking(move || {
            path.try_exists()
                .map_err(|e| io_error("checking", &path, e))
        })
        .await
    }

    async fn pins(&self) -> Result<Vec<String>, ObjectError> {
        let dir = self.dir.join("pins");
        blocking(move || {
            let entries = std::fs::read_dir(&dir).map_err(|e| io_error("listing", &dir, e))?;
            let mut pins = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| io_error("listing", &dir, e))?;
                // Temporary files (".tmp-…") and anything else that is not a CID are skipped.
                if let Some(name) = entry.file_name().to_str() {
                    if parse_cid(name).is_ok() {
                        pins.push(name.to_string());
                    }
                }
            }
            pins.sort();
            Ok(pins)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_get_detects_a_damaged_block() {
        let store = MemoryObjectStore::new();
        let data = Bytes::from(vec![7u8; 300_000]);
        let cid = store.put(data).await.expect("put");
        {
            let mut map = write_lock(&store.blocks);
            let leaf = map
                .iter()
                .find(|(c, _)| c.codec() == RAW && c.to_string() != cid)
                .map(|(c, b)| (*c, b.clone()))
                .expect("a leaf");
            let mut damaged = leaf.1.to_vec();
            damaged[0] ^= 1;
            map.insert(leaf.0, Bytes::from(damaged));
        }
        match store.get(&cid).await {
            Err(ObjectError::Corrupt { expected, found }) => assert_ne!(expected, found),
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn parse_cid_refuses_other_codecs_and_hashes() {
        assert!(matches!(
            parse_cid("not a cid"),
            Err(ObjectError::BadCid { reason: _ })
        ));
        // dag-cbor (0x71) over sha2-256.
        let cbor = Cid::new_v1(0x71, *block_cid(RAW, b"x").hash());
        assert!(matches!(
            parse_cid(&cbor.to_string()),
            Err(ObjectError::BadCid { reason: _ })
        ));
        let ok = block_cid(RAW, b"x");
        assert_eq!(parse_cid(&ok.to_string()), Ok(ok));
    }
}
