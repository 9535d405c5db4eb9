//! # hanzod-adapters
//!
//! The real components behind the core's and the pipeline's ports (DESIGN §11):
//!
//! - [`valkey`]: the event log and the leader lease on Valkey (`VALKEY_URL`), for the
//!   core's `StateStore` and `LeaderLease`;
//! - [`kubo`]: the object store on an IPFS node's Kubo HTTP RPC API (`IPFS_URL`);
//! - [`hub`]: the model registry on the Hugging Face Hub HTTP API (`HF_ENDPOINT`,
//!   `HF_TOKEN`), and the Hub download client of `hanzod verify`;
//! - [`chain`]: the `Ledger` and `ChainReader` on an EVM chain through the `GYMToken` and
//!   `MiningPool` contracts (`HANZO_RPC`), the orchestrator's EVM account, and deployment;
//! - [`tls`]: the one HTTP/TLS client setup every HTTP adapter uses.
//!
//! Each passes the conformance suite of its port, run against a real server in the tests.
#![warn(missing_docs)]

pub mod chain;
pub mod hub;
pub mod kubo;
pub mod tls;
pub mod valkey;
