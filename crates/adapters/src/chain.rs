//! The chain (DESIGN §8, paper §8): stakes, epoch rewards, slashing and publication records
//! on an EVM chain, through the `GYMToken` and `MiningPool` contracts in `contracts/`.
//!
//! - [`contracts`]: the `sol!` bindings, generated from the committed artefacts
//!   (`contracts/artifacts/*.json`), generic over the alloy provider;
//! - [`EvmChain`]: the [`Ledger`](hanzod_actors::ports::Ledger) and
//!   [`ChainReader`](hanzod_actors::ports::ChainReader) adapter over JSON-RPC (`HANZO_RPC`);
//!   the embedded default is [`MemoryChain`](hanzod_actors::ports::memory::MemoryChain), with
//!   the same semantics (the ledger conformance suite runs on both);
//! - [`account`]: the orchestrator's EVM account, derived from its Ed25519 key
//!   (`ORCHESTRATOR_KEY`), so one secret is the orchestrator's whole identity;
//! - [`deploy`]: deploying the contracts, funding the pool, staking and binding node keys
//!   (`hanzod chain deploy`, `hanzod chain bind`; the test kit's anvil node uses it too).

pub mod account;
pub mod contracts;
pub mod deploy;
mod evm;

pub use evm::{ContractMismatch, EvmChain, EvmError, EvmOptions, RpcUrlError};

/// The stake an orchestrator must hold to lead, sign rewards and slash: 50,000 GYM in GYM
/// wei (paper §1.1 "Design Principles"; `GYMToken.ORCHESTRATOR_MIN_STAKE`).
pub const ORCHESTRATOR_MIN_STAKE: hanzod_actors::types::GymWei =
    hanzod_actors::types::GymWei(50_000 * 1_000_000_000_000_000_000);
