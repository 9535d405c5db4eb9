//! Publication ports (DESIGN §7, §11): where each epoch's merged checkpoint goes once the
//! job has merged it.
//!
//! - [`cid`]: the checkpoint's IPFS CID, computed exactly as Kubo's
//!   `ipfs add --cid-version=1` does (raw leaves, 262,144-byte chunks, balanced dag-pb with at
//!   most 174 links a node, sha2-256, base32 CIDv1), so the CID recorded on chain is the one
//!   any IPFS node returns for the same bytes, and [`cid::dag`] gives the blocks to serve.
//! - [`objects`]: the object-store port [`ObjectStore`] (put a file, get it back verified
//!   against its CID, pin it). Embedded default: [`MemoryObjectStore`]; [`FsObjectStore`] is a
//!   local content-addressed block store in a directory.
//! - [`registry`]: the model-registry port [`ModelRegistry`] (publish a checkpoint as a
//!   Hugging Face repo, `{org}/{model}-job-{job}-epoch-{epoch}` for the sink, with
//!   `model.safetensors`, `config.json` and a [`ModelCard`] `README.md` whose YAML front
//!   matter carries the CID). Embedded default: [`FolderRegistry`], the Hub's repo layout in
//!   a local folder.
//! - [`kubo`]: the object store on an IPFS node's Kubo HTTP RPC API (`IPFS_URL`);
//!   [`hub`]: the registry on the Hugging Face Hub HTTP API (`HF_ENDPOINT`, `HF_TOKEN`).
//! - [`record`]: the signed publication record; [`publisher`]: staging and completing a
//!   publication so that a crash resumes it; [`verify`]: the checks of `hanzod verify`.

pub mod cid;
#[cfg(feature = "testkit")]
pub mod fake_hub;
pub mod hub;
#[cfg(feature = "testkit")]
pub mod ipfs_node;
pub mod kubo;
pub mod objects;
pub mod publisher;
pub mod record;
pub mod registry;
pub mod tls;
pub mod verify;

pub use self::cid::{cid_of, dag, dag_of_bytes, Block, Cid, Dag};
pub use self::objects::{FsObjectStore, MemoryObjectStore, ObjectError, ObjectStore};
pub use self::registry::{
    FolderRegistry, Location, ModelCard, ModelRegistry, ModelUpload, Published, RegistryError,
};
