//! # hanzod-store
//!
//! The byte-storage ports of the epoch pipeline and their embedded defaults (DESIGN §6, §7,
//! §11), with no network client:
//!
//! - [`objects`]: the object-store port [`ObjectStore`] (put a file, get it back verified
//!   against its CID, pin it). Embedded defaults: [`MemoryObjectStore`], and
//!   [`FsObjectStore`], a local content-addressed block store in a directory. The real
//!   adapter (Kubo's HTTP RPC) is `hanzod_adapters::kubo`. [`objects::conformance`] is the
//!   suite every implementation passes.
//! - [`registry`]: the model-registry port [`ModelRegistry`] (publish a checkpoint as a
//!   Hugging Face repo with `model.safetensors`, `config.json` and a [`ModelCard`]
//!   `README.md` whose YAML front matter carries the CID). Embedded default:
//!   [`FolderRegistry`], the Hub's repo layout in a local folder; the Hub adapter is
//!   `hanzod_adapters::hub`.
//! - [`blobs`]: the content-addressed store delta uploads are kept in ([`BlobStore`]), in
//!   memory or in a directory.
#![warn(missing_docs)]

pub mod blobs;
pub mod objects;
pub mod registry;

pub use blobs::{BlobError, BlobStore, FsBlobStore, MemoryBlobStore};
pub use objects::{FsObjectStore, MemoryObjectStore, ObjectError, ObjectStore};
pub use registry::{
    FolderRegistry, Location, ModelCard, ModelRegistry, ModelUpload, Published, RegistryError,
};
