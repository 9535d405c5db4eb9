//! # hanzod-actors
//!
//! The core of hanzod, the orchestrator for decentralized training: supervised ractor
//! actors ([`actor`]), the pure state machines they wrap ([`job`], [`sched`], [`ring`],
//! [`node`], [`uptime`], [`supervision`]), and the ports through which they reach the world
//! ([`ports`]). No concrete I/O client lives here; `hanzod` plugs the adapters in.
//!
//! Start with [`orchestrator::Orchestrator::builder`].
#![warn(missing_docs)]

pub mod actor;
pub mod config;
pub mod events;
pub mod job;
pub mod node;
pub mod orchestrator;
pub mod ports;
pub mod publication;
pub mod replay;
pub mod rewards;
pub mod ring;
pub mod sched;
pub mod supervision;
pub mod types;
pub mod uptime;

pub use orchestrator::{Orchestrator, OrchestratorBuilder, OrchestratorError, OrchestratorHandle};
