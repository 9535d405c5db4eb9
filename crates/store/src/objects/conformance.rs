//! The conformance suite of the object-store port, for adapter authors: run
//! [`object_store`] against your [`ObjectStore`] and it checks the contract publication
//! relies on. The embedded stores ([`MemoryObjectStore`](super::MemoryObjectStore),
//! [`FsObjectStore`](super::FsObjectStore)) and hanzod's Kubo adapter
//! (`hanzod_adapters::kubo::KuboObjectStore`, against a real IPFS node) run the same suite.
//!
//! Each check panics with a message saying which property failed.
//!
//! ```no_run
//! # async fn t() {
//! use hanzod_store::objects::conformance;
//! use hanzod_store::MemoryObjectStore;
//! conformance::object_store(&MemoryObjectStore::new()).await;
//! # }
//! ```

use bytes::Bytes;

use super::{ObjectError, ObjectStore};
use hanzod_protocol::cid::{cid_of, CHUNK_SIZE, MAX_LINKS};

/// The CID of [`pattern`]`(1_048_576)` (four full chunks under one dag-pb root), as
/// `ipfs add --cid-version=1 --raw-leaves` gives it.
pub const ONE_MIB_CID: &str = "bafybeihrgkmwnypyfsnqusee77xnrtloggqf5f2e2rfoui2aswitt5gcuq";

/// The CID of [`pattern`]`(MAX_LINKS * CHUNK_SIZE + 1)`: one byte more than a full layer of
/// 174 chunks, so the DAG has two layers.
pub const TWO_LAYER_CID: &str = "bafybeifqqoascfh7imu7gome742sztv7cea5cenyshi56err7vcj77ajce";

/// The deterministic bytes of the reference vectors: byte `i` is `(i·31 + ⌊i/251⌋) mod 256`.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(i / 251)) as u8)
        .collect()
}

/// The [`ObjectStore`] contract (DESIGN §7), on a fresh store: no file stored, nothing
/// pinned (the pin checks expect [`ObjectStore::pins`] to list only what they pinned).
///
/// Checks: a multi-chunk file round-trips under Kubo's CID ([`ONE_MIB_CID`]) and is
/// contained; `put` is idempotent; single-block files (the empty one included) get `bafk…`
/// CIDs and round-trip; an absent CID is [`ObjectError::NotFound`] naming it and not
/// contained; malformed strings and a CID this store cannot hold (identity hash) are
/// [`ObjectError::BadCid`]; pinning is idempotent, shows in `is_pinned` and `pins`, and an
/// absent CID cannot be pinned.
pub async fn object_store(store: &dyn ObjectStore) {
    let cid = round_trip(store).await;
    single_blocks(store).await;
    let absent = absent_and_malformed(store).await;
    pins(store, &cid, &absent).await;
}

/// A two-layer file ([`TWO_LAYER_CID`], ~45.6 MB) round-trips and is contained: the
/// inner layer of links is stored and walked. Slower than [`object_store`]; any store
/// state.
pub async fn two_layer_file(store: &dyn ObjectStore) {
    let data = pattern(MAX_LINKS * CHUNK_SIZE + 1);
    let cid = store.put(Bytes::from(data.clone())).await.expect("put");
    assert_eq!(cid, TWO_LAYER_CID, "a two-layer file gets Kubo's CID");
    assert!(
        store.contains(&cid).await.expect("contains"),
        "a stored two-layer file is contained"
    );
    assert!(
        store.get(&cid).await.expect("get")[..] == data[..],
        "a two-layer file reads back equal"
    );
}

/// Round trip of a multi-chunk file; returns its CID.
async fn round_trip(store: &dyn ObjectStore) -> String {
    let data = pattern(1_048_576);
    let cid = store.put(Bytes::from(data.clone())).await.expect("put");
    assert_eq!(cid, ONE_MIB_CID, "the CID is Kubo's");
    assert_eq!(
        &store.get(&cid).await.expect("get")[..],
        &data[..],
        "a file reads back equal"
    );
    assert!(
        store.contains(&cid).await.expect("contains"),
        "a stored file is contained"
    );
    assert_eq!(
        store.put(Bytes::from(data)).await.expect("put again"),
        cid,
        "put is idempotent"
    );
    cid
}

/// Single-block files, the empty one included.
async fn single_blocks(store: &dyn ObjectStore) {
    for small in [Vec::new(), b"hello".to_vec()] {
        let c = store
            .put(Bytes::from(small.clone()))
            .await
            .expect("put small");
        assert!(
            c.starts_with("bafk"),
            "a single-block file is a raw CID: {c}"
        );
        assert_eq!(
            &store.get(&c).await.expect("get small")[..],
            &small[..],
            "a single-block file reads back equal"
        );
    }
}

/// Absent, malformed and foreign CIDs; returns the absent one.
async fn absent_and_malformed(store: &dyn ObjectStore) -> String {
    let absent = cid_of(b"never stored").to_string();
    assert_eq!(
        store.get(&absent).await,
        Err(ObjectError::NotFound {
            cid: absent.clone()
        }),
        "an absent file is NotFound, naming its CID"
    );
    assert!(
        !store.contains(&absent).await.expect("contains absent"),
        "an absent file is not contained"
    );
    let malformed = store.get("bafy-not-a-cid").await.map(drop);
    assert!(
        matches!(malformed, Err(ObjectError::BadCid { reason: _ })),
        "get of a malformed CID is BadCid, got {malformed:?}"
    );
    let empty = store.contains("").await;
    assert!(
        matches!(empty, Err(ObjectError::BadCid { reason: _ })),
        "contains of an empty string is BadCid, got {empty:?}"
    );
    // A CIDv1 with the identity hash (0x00) is not one a store holds.
    let identity = store.get("bafkqaaa").await.map(drop);
    assert!(
        matches!(identity, Err(ObjectError::BadCid { reason: _ })),
        "get of an identity-hash CID is BadCid, got {identity:?}"
    );
    absent
}

/// Pins of the stored `cid` and of the `absent` one.
async fn pins(store: &dyn ObjectStore, cid: &str, absent: &str) {
    assert!(
        !store.is_pinned(cid).await.expect("is_pinned"),
        "put does not pin"
    );
    store.pin(cid).await.expect("pin");
    store.pin(cid).await.expect("pin is idempotent");
    assert!(
        store.is_pinned(cid).await.expect("is_pinned"),
        "a pinned file is pinned"
    );
    assert_eq!(
        store.pins().await.expect("pins"),
        vec![cid.to_string()],
        "pins lists the pinned file"
    );
    assert_eq!(
        store.pin(absent).await,
        Err(ObjectError::NotFound {
            cid: absent.to_string()
        }),
        "an absent file cannot be pinned"
    );
    assert!(
        !store.is_pinned(absent).await.expect("is_pinned absent"),
        "an absent file is not pinned"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_protocol::cid::dag;

    #[test]
    fn reference_cids_are_the_patterns() {
        assert_eq!(cid_of(&pattern(1_048_576)).to_string(), ONE_MIB_CID);
        assert_eq!(dag(&pattern(1_048_576)).root.to_string(), ONE_MIB_CID);
    }
}
