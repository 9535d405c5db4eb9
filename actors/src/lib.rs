//! # hanzod-actors
//!
//! The core of hanzod, the orchestrator for decentralized training: supervised ractor
//! actors ([`actor`]), the pure state machines they wrap ([`job`], [`sched`], [`ring`],
//! [`node`], [`uptime`], [`supervision`], [`rewards`], [`replay`]), the ports through which
//! they reach the world ([`ports`]), and every signature and hash domain string
//! ([`domain`]). No concrete I/O client lives here: `hanzod-adapters` holds the real
//! adapters and `hanzod-daemon` plugs them in (DESIGN §1).
//!
//! Start with [`orchestrator::Orchestrator::builder`].
#![warn(missing_docs)]

pub mod actor;
pub mod aggregation;
pub mod config;
pub mod domain;
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
