//! # hanzod
//!
//! The orchestrator for decentralized training. This crate is the facade over the
//! workspace's crates (DESIGN §1 has the map): it re-exports each under the paths
//! embedders use, and builds the `hanzod` binary.
//!
//! | path | crate | what |
//! |---|---|---|
//! | [`core`] | `hanzod-actors` | the pure state machines, the supervised actors, the ports |
//! | [`identity`], [`client`], [`delta::format`], [`publish::cid`], [`publish::record`] | `hanzod-protocol` | what node and orchestrator compute identically |
//! | [`train`] | `hanzod-train` | training math (burn) |
//! | [`delta`], [`publish`] | `hanzod-pipeline`, `hanzod-store` | the epoch pipeline and the byte stores |
//! | [`state`], [`chain`], [`publish::kubo`], [`publish::hub`] | `hanzod-adapters` | Valkey, the EVM chain, Kubo, the Hub |
//! | [`serve`], [`grpc`], [`config`], [`replica`], [`health`], [`metrics`] | `hanzod-daemon` | `hanzod serve` |
//! | [`agent`] | `hanzod-node` | `hanzod node` |
//! | [`cli`] | `hanzod-cli` | the command line |
//! | `testkit`, `demo`, `sim`, `bench` (feature `testkit`) | `hanzod-testkit` | the fault-injection test kit |
//!
//! ```no_run
//! # async fn run() -> Result<(), hanzod::OrchestratorError> {
//! let orch = hanzod::Orchestrator::builder().start().await?;
//! // … register nodes, submit jobs …
//! orch.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub use hanzod_actors as core;
pub use hanzod_actors::{Orchestrator, OrchestratorBuilder, OrchestratorError, OrchestratorHandle};

pub use hanzod_cli as cli;
pub use hanzod_daemon::{config, grpc, health, metrics, replica, serve};
pub use hanzod_node as agent;
pub use hanzod_protocol::{client, identity};
pub use hanzod_train as train;

/// Model deltas (DESIGN §6): the `HZDL` format, model descriptions, validation, scoring,
/// merging, the blob store and the epoch sink.
pub mod delta {
    pub use hanzod_pipeline::{budget, copies, epoch, inspect, lora, merge, score, sink, validate};
    /// The `HZDL` wire format and its signed statement (`hanzod_protocol::hzdl`), with the
    /// format check against a model ([`check_against`](format::check_against)).
    pub mod format {
        pub use hanzod_protocol::hzdl::*;
        pub use hanzod_protocol::model::{check_against, intake, intake_hashed, Intake};
    }
    pub use hanzod_protocol::{model, peft, sketch};
    pub use hanzod_store::blobs as store;
    pub use hanzod_train::catalog;
}

/// Publication (DESIGN §7): CIDs, the object store and model registry ports with their
/// adapters, the signed record, the publisher and `hanzod verify`'s checks.
pub mod publish {
    pub use hanzod_adapters::{hub, kubo, tls};
    pub use hanzod_cli::verify;
    pub use hanzod_pipeline::publisher;
    pub use hanzod_protocol::cid::{cid_of, dag, dag_of_bytes, Block, Cid, Dag};
    pub use hanzod_protocol::{cid, record};
    pub use hanzod_store::{objects, registry};
    pub use hanzod_store::{
        FolderRegistry, FsObjectStore, Location, MemoryObjectStore, ModelCard, ModelRegistry,
        ModelUpload, ObjectError, ObjectStore, Published, RegistryError,
    };
    #[cfg(feature = "testkit")]
    pub use hanzod_testkit::{fake_hub, ipfs_node};
}

/// The state store adapter on Valkey (DESIGN §9).
pub mod state {
    pub use hanzod_adapters::valkey;
    #[cfg(feature = "testkit")]
    pub use hanzod_testkit::valkey_server as server;
}

/// The chain (DESIGN §8, §9): the EVM adapter, the orchestrator's account, deployment, and
/// rebuilding jobs from the chain's records.
pub mod chain {
    pub use hanzod_adapters::chain::*;
    pub use hanzod_pipeline::recovery;
    #[cfg(feature = "testkit")]
    pub use hanzod_testkit::anvil;
}

#[cfg(feature = "testkit")]
pub use hanzod_testkit as testkit;
#[cfg(feature = "testkit")]
pub use hanzod_testkit::{bench, demo, sim};
