//! IPFS content identifiers of files, computed as Kubo's `ipfs add --cid-version=1` does
//! (DESIGN §7), so that a CID computed here equals the one Kubo returns for the same bytes.
//!
//! The importer parameters are Kubo's defaults for CIDv1:
//!
//! | parameter | value |
//! |---|---|
//! | chunker | fixed size, [`CHUNK_SIZE`] = 262,144 bytes (`size-262144`) |
//! | leaves | raw blocks (multicodec `raw`, 0x55): the chunk's bytes, nothing else |
//! | inner nodes | dag-pb (0x70) with a UnixFS `File` payload |
//! | layout | balanced, at most [`MAX_LINKS`] = 174 links per inner node |
//! | hash | sha2-256 (multihash 0x12), CIDv1, rendered base32 lowercase |
//!
//! A file of at most one chunk (the empty file included) is a single raw block, and its CID
//! is that block's (`bafk…`); a longer file's root is a dag-pb node (`bafy…`).
//!
//! The balanced layout is Kubo's (`boxo/ipld/unixfs/importer/balanced`): the chunks are
//! grouped, in order, 174 at a time under inner nodes, those nodes 174 at a time under the
//! next layer, and so on until one node is left. A group of one still gets its own inner node
//! (a 175-chunk file's root links a full 174-link node and a node with one link), only the
//! whole-file single chunk is reduced to itself.
//!
//! Each inner node is a dag-pb `PBNode` whose links carry the child's CID, the name `""` and
//! `Tsize` = the encoded size of the child's whole subtree in bytes (its own block plus the
//! `Tsize` of its links; a raw leaf's is its length), and whose `Data` is a UnixFS message
//! `{Type: File, filesize: Σ children, blocksizes: [each child's file bytes]}`.
//!
//! The dag-pb envelope is encoded by `ipld-dagpb` (the IPLD project's codec: canonical order,
//! `Links` before `Data`). No maintained Rust crate builds Kubo-layout UnixFS files (the
//! `ipfs-unixfs`/`unixfs-v1` lineage has been unmaintained since 2021 and its forks are
//! alphas), so the UnixFS `Data` message — three protobuf fields — is encoded by
//! [`unixfs_file_data`] here.

use std::collections::HashSet;
use std::ops::Range;

use bytes::Bytes;
use cid::multihash::Multihash;
pub use cid::Cid;
use ipld_dagpb::{PbLink, PbNode};
use sha2::{Digest, Sha256};

/// The fixed chunk size of Kubo's default chunker, in bytes.
pub const CHUNK_SIZE: usize = 262_144;

/// The most links an inner node has in Kubo's balanced layout.
pub const MAX_LINKS: usize = 174;

/// Multicodec `raw`: a block that is plain bytes (a leaf).
pub const RAW: u64 = 0x55;

/// Multicodec `dag-pb`: a protobuf `PBNode` (an inner node of a file).
pub const DAG_PB: u64 = 0x70;

/// Multihash code of sha2-256.
pub const SHA2_256: u64 = 0x12;

/// UnixFS `Data.DataType.File`.
const UNIXFS_FILE: u64 = 2;

/// One block of a file's DAG: its CID and its encoded bytes (a raw leaf's bytes are the
/// chunk itself; an inner node's are the dag-pb encoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The block's CIDv1: codec [`RAW`] or [`DAG_PB`], sha2-256 of [`Block::data`].
    pub cid: Cid,
    /// The block's bytes, as stored and served.
    pub data: Bytes,
}

/// The DAG of one file, as [`dag`] builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    /// The file's CID: the root block's.
    pub root: Cid,
    /// Every distinct block, children before their parents and the root last (a chunk that
    /// repeats in the file, e.g. runs of zeros, is listed once). Never empty.
    pub blocks: Vec<Block>,
    /// The file's length in bytes.
    pub file_size: u64,
    /// The root's `Tsize`: the bytes of every block of the tree counted once per link, as
    /// Kubo reports a file's cumulative size.
    pub cumulative_size: u64,
}

impl Dag {
    /// The root block (the last of [`Dag::blocks`]).
    pub fn root_block(&self) -> Option<&Block> {
        self.blocks.last()
    }
}

/// A child of an inner node while the tree is built.
#[derive(Debug, Clone, Copy)]
struct Child {
    cid: Cid,
    /// Encoded bytes of the child's subtree (the link's `Tsize`).
    tsize: u64,
    /// File bytes under the child (its `blocksizes` entry).
    file_size: u64,
}

/// The CIDv1 (`codec`, sha2-256) of a block's bytes.
pub fn block_cid(codec: u64, block: &[u8]) -> Cid {
    let digest = Sha256::digest(block);
    // `wrap` fails only for a digest longer than the 64-byte capacity; sha2-256 has 32.
    let hash = Multihash::<64>::wrap(SHA2_256, &digest).unwrap_or_default();
    Cid::new_v1(codec, hash)
}

/// The CID that `ipfs add --cid-version=1` (Kubo defaults otherwise) gives `bytes`.
///
/// Computed without keeping the blocks: the leaves are hashed in place. Cost: one SHA-256
/// pass over `bytes` (~1.5 GB/s with SHA-NI) plus ~8.7 KB of dag-pb per 45.6 MB; run it on a
/// blocking thread for large files.
pub fn cid_of(bytes: &[u8]) -> Cid {
    build(bytes, &mut |_, _| {}).0
}

/// The whole DAG of `bytes`: every block with its CID, the root last. The leaves copy
/// `bytes` once; see [`dag_of_bytes`] to share them instead.
pub fn dag(bytes: &[u8]) -> Dag {
    dag_of_bytes(Bytes::copy_from_slice(bytes))
}

/// [`dag`] of a shared buffer: the raw leaves are slices of `bytes`, not copies.
pub fn dag_of_bytes(bytes: Bytes) -> Dag {
    let mut blocks = Vec::new();
    let mut seen = HashSet::new();
    let (root, cumulative_size) = build(&bytes, &mut |cid, block| {
        if seen.insert(cid) {
            let data = match block {
                Built::Leaf(range) => bytes.slice(range),
                Built::Node(node) => Bytes::from(node),
            };
            blocks.push(Block { cid, data });
        }
    });
    Dag {
        root,
        blocks,
        file_size: bytes.len() as u64,
        cumulative_size,
    }
}

/// A block as [`build`] produces it.
enum Built {
    /// A raw leaf: this range of the file.
    Leaf(Range<usize>),
    /// An inner node: its dag-pb encoding.
    Node(Vec<u8>),
}

/// Builds the balanced DAG of `data`, calling `emit(cid, block)` for every block, children
/// before parents. Returns the root CID and its `Tsize`.
fn build(data: &[u8], emit: &mut dyn FnMut(Cid, Built)) -> (Cid, u64) {
    // The empty file is one empty chunk.
    let chunk_count = data.len().div_ceil(CHUNK_SIZE).max(1);
    let mut level: Vec<Child> = Vec::with_capacity(chunk_count);
    for i in 0..chunk_count {
        let start = i * CHUNK_SIZE;
        let end = (start + CHUNK_SIZE).min(data.len());
        let cid = block_cid(RAW, &data[start..end]);
        emit(cid, Built::Leaf(start..end));
        let len = (end - start) as u64;
        level.push(Child {
            cid,
            tsize: len,
            file_size: len,
        });
    }
    while level.len() > 1 {
        level = level
            .chunks(MAX_LINKS)
            .map(|group| {
                let node = encode_file_node(group);
                let cid = block_cid(DAG_PB, &node);
                let child = Child {
                    cid,
                    tsize: node.len() as u64 + group.iter().map(|c| c.tsize).sum::<u64>(),
                    file_size: group.iter().map(|c| c.file_size).sum(),
                };
                emit(cid, Built::Node(node));
                child
            })
            .collect();
    }
    // `level` holds exactly one child: the loop above ends at one, and starts at ≥ 1.
    match level.first() {
        Some(root) => (root.cid, root.tsize),
        None => (block_cid(RAW, &[]), 0),
    }
}

/// The dag-pb encoding of a UnixFS `File` node over `children`, in order.
fn encode_file_node(children: &[Child]) -> Vec<u8> {
    let sizes: Vec<u64> = children.iter().map(|c| c.file_size).collect();
    let node = PbNode {
        links: children
            .iter()
            .map(|c| PbLink {
                cid: c.cid,
                name: Some(String::new()),
                size: Some(c.tsize),
            })
            .collect(),
        data: Some(Bytes::from(unixfs_file_data(&sizes))),
    };
    node.into_bytes()
}

/// The UnixFS `Data` message of a `File` node whose children hold `blocksizes` file bytes
/// each: `Type` (field 1) = File, `filesize` (field 3) = their sum, one `blocksizes`
/// (field 4, unpacked as proto2 writes it) per child, no `Data` field — byte for byte what
/// `boxo`'s `FSNode.GetBytes` writes for an inner node.
pub fn unixfs_file_data(blocksizes: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 11 * (blocksizes.len() + 1));
    out.push(0x08); // field 1, varint
    put_varint(&mut out, UNIXFS_FILE);
    out.push(0x18); // field 3, varint
    put_varint(&mut out, blocksizes.iter().sum());
    for &size in blocksizes {
        out.push(0x20); // field 4, varint
        put_varint(&mut out, size);
    }
    out
}

/// Appends `value` as a protobuf base-128 varint.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A string that is not a sha2-256 CID of a `raw` or `dag-pb` block: the string and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidError {
    /// Not a CID at all.
    #[error("{cid:?}: {message}")]
    Malformed {
        /// The string.
        cid: String,
        /// What the `cid` crate says (its error is neither `Clone` nor `PartialEq`).
        message: String,
    },
    /// A CID whose multihash is not sha2-256.
    #[error("{cid}: multihash {code:#x} is not sha2-256")]
    NotSha256 {
        /// The CID.
        cid: String,
        /// Its multihash code.
        code: u64,
    },
    /// A CID of another codec than `raw` or `dag-pb`.
    #[error("{cid}: codec {codec:#x} is neither raw nor dag-pb")]
    Codec {
        /// The CID.
        cid: String,
        /// Its codec.
        codec: u64,
    },
}

/// Parses `cid` and checks that it is a sha2-256 CID of a `raw` or `dag-pb` block;
/// [`CidError`] names the string and what is wrong with it.
pub fn parse_cid(cid: &str) -> Result<Cid, CidError> {
    let parsed = Cid::try_from(cid).map_err(|e| CidError::Malformed {
        cid: cid.to_string(),
        message: e.to_string(),
    })?;
    if parsed.hash().code() != SHA2_256 {
        return Err(CidError::NotSha256 {
            cid: cid.to_string(),
            code: parsed.hash().code(),
        });
    }
    if parsed.codec() != RAW && parsed.codec() != DAG_PB {
        return Err(CidError::Codec {
            cid: cid.to_string(),
            codec: parsed.codec(),
        });
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes a UnixFS `Data` message into (type, filesize, blocksizes).
    fn decode_unixfs(mut buf: &[u8]) -> (u64, u64, Vec<u64>) {
        fn varint(buf: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let b = buf[0];
                *buf = &buf[1..];
                v |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let (mut ty, mut size, mut sizes) = (0, 0, Vec::new());
        while !buf.is_empty() {
            let tag = varint(&mut buf);
            let value = varint(&mut buf);
            match tag {
                0x08 => ty = value,
                0x18 => size = value,
                0x20 => sizes.push(value),
                other => panic!("unexpected UnixFS field tag {other:#x}"),
            }
        }
        (ty, size, sizes)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    /// Checks every inner node of `dag`: links' Tsize and the UnixFS sizes agree with the
    /// children, and every block's CID is its hash. Returns the tree's depth (1 = one block).
    fn check_tree(dag: &Dag) -> usize {
        let by_cid: std::collections::HashMap<Cid, &Block> =
            dag.blocks.iter().map(|b| (b.cid, b)).collect();
        for b in &dag.blocks {
            assert_eq!(block_cid(b.cid.codec(), &b.data), b.cid);
        }
        // (file bytes, tsize, depth) of a subtree.
        fn walk(cid: &Cid, by_cid: &std::collections::HashMap<Cid, &Block>) -> (u64, u64, usize) {
            let block = by_cid[cid];
            if cid.codec() == RAW {
                let n = block.data.len() as u64;
                return (n, n, 1);
            }
            let node = PbNode::from_bytes(block.data.clone()).expect("a dag-pb node");
            assert!(!node.links.is_empty() && node.links.len() <= MAX_LINKS);
            let (ty, filesize, blocksizes) = decode_unixfs(node.data.as_deref().unwrap_or(&[]));
            assert_eq!(ty, UNIXFS_FILE);
            assert_eq!(blocksizes.len(), node.links.len());
            let mut total = 0;
            let mut tsize = block.data.len() as u64;
            let mut depth = None;
            for (link, bs) in node.links.iter().zip(&blocksizes) {
                assert_eq!(link.name.as_deref(), Some(""));
                let (f, t, d) = walk(&link.cid, by_cid);
                assert_eq!(f, *bs, "blocksizes entry");
                assert_eq!(link.size, Some(t), "link Tsize");
                assert!(
                    depth.is_none() || depth == Some(d),
                    "balanced: leaves at one depth"
                );
                depth = Some(d);
                total += f;
                tsize += t;
            }
            assert_eq!(filesize, total);
            (total, tsize, depth.unwrap_or(0) + 1)
        }
        let (file, tsize, depth) = walk(&dag.root, &by_cid);
        assert_eq!(file, dag.file_size);
        assert_eq!(tsize, dag.cumulative_size);
        depth
    }

    #[test]
    fn empty_file_is_the_empty_raw_block() {
        let d = dag(&[]);
        assert_eq!(
            d.root.to_string(),
            "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
        );
        assert_eq!(d.blocks.len(), 1);
        assert_eq!(d.cumulative_size, 0);
        assert_eq!(cid_of(&[]), d.root);
    }

    #[test]
    fn one_chunk_is_a_raw_block() {
        let data = pattern(CHUNK_SIZE);
        let d = dag(&data);
        assert_eq!(d.root.codec(), RAW);
        assert_eq!(d.root, block_cid(RAW, &data));
        assert_eq!(d.blocks.len(), 1);
        assert!(d.root.to_string().starts_with("bafk"));
        assert_eq!(check_tree(&d), 1);
    }

    #[test]
    fn one_mebibyte_root_is_208_bytes() {
        let d = dag(&pattern(1 << 20));
        assert_eq!(d.root.codec(), DAG_PB);
        assert!(d.root.to_string().starts_with("bafy"));
        assert_eq!(d.root_block().map(|b| b.data.len()), Some(208));
        assert_eq!(d.blocks.len(), 5);
        assert_eq!(d.cumulative_size, (1 << 20) + 208);
        assert_eq!(check_tree(&d), 2);
    }

    #[test]
    fn links_come_before_data_in_the_encoding() {
        let d = dag(&pattern(CHUNK_SIZE + 1));
        let root = d.root_block().expect("a root");
        // field 2 (Links), wire type 2 → 0x12; field 1 (Data) → 0x0a comes last.
        assert_eq!(root.data[0], 0x12);
        let node = PbNode::from_bytes(root.data.clone()).expect("decodes");
        assert_eq!(node.links.len(), 2);
        assert_eq!(
            decode_unixfs(node.data.as_deref().unwrap_or(&[])),
            (
                UNIXFS_FILE,
                CHUNK_SIZE as u64 + 1,
                vec![CHUNK_SIZE as u64, 1]
            )
        );
    }

    #[test]
    fn a_175th_chunk_adds_a_layer_with_a_one_link_node() {
        let data = pattern(MAX_LINKS * CHUNK_SIZE + 1);
        let d = dag(&data);
        assert_eq!(check_tree(&d), 3);
        let root = PbNode::from_bytes(d.root_block().expect("root").data.clone()).expect("pb");
        assert_eq!(root.links.len(), 2);
        // The second child is an inner node over the last one-byte chunk, not the leaf.
        assert_eq!(root.links[1].cid.codec(), DAG_PB);
        assert_eq!(cid_of(&data), d.root);

        let full = dag(&data[..MAX_LINKS * CHUNK_SIZE]);
        assert_eq!(check_tree(&full), 2);
        assert_eq!(root.links[0].cid, full.root);
    }

    #[test]
    fn repeated_chunks_are_listed_once() {
        let d = dag(&vec![0u8; 3 * CHUNK_SIZE]);
        assert_eq!(d.blocks.len(), 2);
        assert_eq!(check_tree(&d), 2);
    }

    #[test]
    fn varints_match_protobuf() {
        let mut out = Vec::new();
        put_varint(&mut out, 262_144);
        assert_eq!(out, [0x80, 0x80, 0x10]);
        out.clear();
        put_varint(&mut out, u64::MAX);
        assert_eq!(out.len(), 10);
        assert_eq!(
            unixfs_file_data(&[1, 2]),
            [0x08, 0x02, 0x18, 0x03, 0x20, 0x01, 0x20, 0x02]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn every_block_is_named_by_its_hash(len in 0usize..(5 * CHUNK_SIZE), seed in 0u8..) {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed) ^ (i >> 9) as u8).collect();
            let d = dag(&data);
            check_tree(&d);
            proptest::prop_assert_eq!(cid_of(&data), d.root);
            proptest::prop_assert_eq!(d.root_block().map(|b| b.cid), Some(d.root));
        }
    }
}
