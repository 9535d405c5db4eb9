//! # hanzod
//!
//! The orchestrator for decentralized training. This crate is the facade: it re-exports
//! the actor core ([`hanzod_actors`]), and adds configuration, the CLI and (feature
//! `testkit`) the fault-injection harness. Later: the gRPC server and node agent, and the
//! adapters for Valkey, IPFS, the Hugging Face Hub, the EVM chain and burn.
//!
//! ```no_run
//! # async fn run() -> Result<(), hanzod::OrchestratorError> {
//! let orch = hanzod::Orchestrator::builder().start().await?;
//! // … register nodes, submit jobs …
//! orch.shutdown().await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod agent;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod delta;
pub mod demo;
pub mod grpc;
pub mod identity;
pub mod metrics;
pub mod publish;
pub mod serve;
#[cfg(feature = "testkit")]
pub mod sim;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod train;

pub use hanzod_actors as core;
pub use hanzod_actors::{Orchestrator, OrchestratorBuilder, OrchestratorError, OrchestratorHandle};
