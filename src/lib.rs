//! # hanzod
//!
//! The orchestrator for decentralized training. This crate is the facade: it re-exports
//! the actor core ([`hanzod_actors`]), and adds configuration, the CLI, the gRPC server
//! ([`grpc`], [`serve`]) and the node agent ([`agent`]), the deltas pipeline ([`delta`]),
//! training with burn ([`train`]), the publication ports ([`publish`]), the main job
//! ([`demo`]) and (feature `testkit`) the fault-injection harness. Later: the adapters for
//! Valkey, Kubo, the Hugging Face Hub and the EVM chain.
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
pub mod chain;
pub mod cli;
pub mod client;
pub mod config;
pub mod delta;
pub mod demo;
pub mod grpc;
pub mod health;
pub mod identity;
pub mod metrics;
pub mod publish;
pub mod replica;
pub mod serve;
#[cfg(feature = "testkit")]
pub mod sim;
pub mod state;
#[cfg(feature = "testkit")]
pub mod testkit;
#[cfg(feature = "testkit")]
mod testkit_process;
pub mod train;

pub use hanzod_actors as core;
pub use hanzod_actors::{Orchestrator, OrchestratorBuilder, OrchestratorError, OrchestratorHandle};
