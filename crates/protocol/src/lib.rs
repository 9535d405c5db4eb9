//! # hanzod-protocol
//!
//! What a node, the orchestrator and any auditor must compute identically (DESIGN §3, §6,
//! §7): the Ed25519 [`identity`] and its signatures, the signature and hash [`domain`]s,
//! the `HZDL` delta format and its signed statement ([`hzdl`]) with the model descriptions
//! it is checked against ([`model`]), PEFT's LoRA `adapter_config.json` ([`peft`]), the IPFS [`cid`] of a checkpoint (as Kubo computes
//! it), the signed publication [`record`], the linear [`sketch`] of a delta a ring member reports, the wire ↔ domain conversions ([`convert`]), the size limits of untrusted input ([`limits`]),
//! the gRPC client setup ([`client`]) and the status conventions ([`status`]).
//!
//! No I/O beyond a gRPC channel; no burn, no chain client, no state store.
#![warn(missing_docs)]

pub mod cid;
pub mod client;
pub mod convert;
pub mod field;
pub mod human;
pub mod hzdl;
pub mod identity;
pub mod limits;
pub mod model;
pub mod peft;
pub mod record;
pub mod round;
pub mod sketch;
pub mod status;

pub use hanzod_actors::domain;
