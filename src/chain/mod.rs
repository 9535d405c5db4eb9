//! The chain (DESIGN §8, paper §8): stakes, epoch rewards, slashing and publication records
//! on an EVM chain, through the `GYMToken` and `MiningPool` contracts in `contracts/`.
//!
//! - [`contracts`]: the `sol!` bindings, generated from the committed artefacts
//!   (`contracts/artifacts/*.json`), generic over the alloy provider;
//! - [`EvmChain`]: the [`Ledger`](crate::core::ports::Ledger) and
//!   [`ChainReader`](crate::core::ports::ChainReader) adapter over JSON-RPC (`HANZO_RPC`);
//!   the embedded default is [`MemoryChain`](crate::core::ports::memory::MemoryChain), with
//!   the same semantics (the ledger conformance suite runs on both);
//! - [`account`]: the orchestrator's EVM account, derived from its Ed25519 key
//!   (`ORCHESTRATOR_KEY`), so one secret is the orchestrator's whole identity;
//! - [`anvil`] (feature `testkit`): a real EVM node (anvil) started on loopback with the
//!   contracts deployed and operators staked and bound, for tests and the chain demo.

pub mod account;
#[cfg(feature = "testkit")]
pub mod anvil;
pub mod contracts;
mod evm;
pub mod recovery;

pub use evm::{EvmChain, EvmError, EvmOptions};

/// The stake an orchestrator must hold to lead, sign rewards and slash: 50,000 GYM in GYM
/// wei (paper §1.1 "Design Principles"; `GYMToken.ORCHESTRATOR_MIN_STAKE`).
pub const ORCHESTRATOR_MIN_STAKE: crate::core::types::GymWei =
    crate::core::types::GymWei(50_000 * 1_000_000_000_000_000_000);
