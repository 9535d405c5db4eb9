//! # hanzod-proto
//!
//! Wire types of hanzod's gRPC API (`hanzod.v1`), generated from `proto/hanzod/v1/*.proto`
//! (which document every message and field). This crate holds only what travels on the
//! wire — no domain logic — and depends on nothing of ours; `hanzod` converts between these
//! types and the core's in one place (`hanzod_protocol::convert`).
//!
//! Services: `NodeService` (challenge–response registration and one signed session stream
//! per node, delta upload), `JobService` (submit, get, list, watch, cancel) and
//! `AdminService` (nodes, rings). [`FILE_DESCRIPTOR_SET`] feeds gRPC server reflection, so
//! `grpcurl` works without the .proto files.
#![warn(missing_docs)]

/// The protobuf package `hanzod.v1`: messages, clients (`*_client`) and servers (`*_server`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("hanzod.v1");
}

/// The encoded `FileDescriptorSet` of every `hanzod.v1` file, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/hanzod_v1_descriptor.bin"));

/// The protobuf package of the API.
pub const PACKAGE: &str = "hanzod.v1";

/// The default gRPC port (DESIGN §10).
pub const DEFAULT_GRPC_PORT: u16 = 9550;

/// The default Prometheus metrics port (DESIGN §10).
pub const DEFAULT_METRICS_PORT: u16 = 9551;
