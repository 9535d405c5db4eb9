//! # hanzod-proto
//!
//! Wire types of hanzod's gRPC API (`hanzod.v1`), generated from `proto/hanzod/v1/*.proto`
//! (which document every message and field). This crate holds only what travels on the
//! wire — no domain logic — and depends on nothing of ours; `hanzod` converts between these
//! types and the core's in one place (`hanzod::grpc::convert`).
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

/// Signature domains: every signed byte string starts with one of these, so a signature
/// made for one purpose can never be replayed as another. None is a prefix of another
/// (checked by a test).
pub mod domain {
    /// Registration: `REGISTER || nonce || NodeInfo bytes`.
    pub const REGISTER: &[u8] = b"hanzod.v1.register";
    /// Session messages: `SESSION || NodeMessage bytes`.
    pub const SESSION: &[u8] = b"hanzod.v1.session";
    /// GPU attestation: `GPU || node id || model || vram (u64 BE) || major || minor`.
    pub const GPU: &[u8] = b"hanzod.v1.gpu";
    /// Delta statements (DESIGN §6): the node signs SHA-256(`DELTA || job id || epoch ||
    /// step || claimed loss || SHA-256(payload)`), little endian.
    pub const DELTA: &[u8] = b"hanzod-delta-v1";
    /// The orchestrator's spot-check seed (DESIGN §6): SHA-256 of its Ed25519 signature over
    /// `SPOT_CHECK_SEED` alone (deterministic, and nobody without the key can compute it).
    pub const SPOT_CHECK_SEED: &[u8] = b"hanzod.v1.spot-check-seed";

    /// Every domain, for the check that none is a prefix of another (so a signed byte
    /// string for one purpose can never parse as one for another).
    pub const ALL: [&[u8]; 5] = [REGISTER, SESSION, GPU, DELTA, SPOT_CHECK_SEED];
}

#[cfg(test)]
mod tests {
    #[test]
    fn signature_domains_are_prefix_free() {
        for (i, a) in super::domain::ALL.iter().enumerate() {
            for (j, b) in super::domain::ALL.iter().enumerate() {
                assert!(
                    i == j || !b.starts_with(a),
                    "{:?} is a prefix of {:?}",
                    String::from_utf8_lossy(a),
                    String::from_utf8_lossy(b)
                );
            }
        }
    }
}
