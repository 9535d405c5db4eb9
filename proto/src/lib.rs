//! # hanzod-proto
//!
//! Wire types of hanzod's gRPC API (`hanzod.v1`). This crate holds only what travels on the
//! wire — no domain logic — and depends on nothing of ours; `hanzod` converts between these
//! types and the core's in one place.
//!
//! The services (NodeService with challenge–response registration and a per-node session
//! stream, JobService, admin reads) are compiled here from `proto/hanzod/v1/*.proto` once
//! the gRPC issue lands; until then the crate only fixes the package name and version.
#![warn(missing_docs)]

/// The protobuf package of the API.
pub const PACKAGE: &str = "hanzod.v1";

/// The default gRPC port (DESIGN §10).
pub const DEFAULT_GRPC_PORT: u16 = 9550;

/// The default Prometheus metrics port (DESIGN §10).
pub const DEFAULT_METRICS_PORT: u16 = 9551;
