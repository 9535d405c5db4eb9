//! Domain types shared by every part of the core: identities, amounts, time.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A node's identity: its Ed25519 public key (32 bytes). Shown as 64 lowercase hex digits.
///
/// DESIGN §3: `NodeId` = the public key; the chain binds it to an operator address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct NodeId(#[serde(with = "hex_32")] pub [u8; 32]);

impl NodeId {
    /// The raw 32 key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A short form for logs and tables: the first 8 hex digits.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..4])
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.short())
    }
}

/// Error parsing a [`NodeId`] from text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node id must be 64 hex digits (an Ed25519 public key): {0}")]
pub struct ParseNodeIdError(String);

impl FromStr for NodeId {
    type Err = ParseNodeIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| ParseNodeIdError(e.to_string()))?;
        Ok(NodeId(out))
    }
}

mod hex_32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = String::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(out)
    }
}

/// A training job's identifier, assigned by the orchestrator in submission order (1, 2, …).
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize, Default,
)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job-{}", self.0)
    }
}

/// An amount of GYM in wei (10^-18 GYM), the chain's smallest unit.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, Serialize, Deserialize,
)]
pub struct GymWei(pub u128);

impl GymWei {
    /// Wei per whole GYM (10^18).
    pub const PER_GYM: u128 = 1_000_000_000_000_000_000;

    /// `n` whole GYM.
    pub const fn gym(n: u64) -> Self {
        GymWei(n as u128 * Self::PER_GYM)
    }

    /// The amount in whole GYM as a float, for display and scoring only.
    pub fn as_gym_f64(&self) -> f64 {
        self.0 as f64 / Self::PER_GYM as f64
    }
}

impl fmt::Display for GymWei {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.0 / Self::PER_GYM;
        let frac = self.0 % Self::PER_GYM;
        if frac == 0 {
            write!(f, "{whole} GYM")
        } else {
            let s = format!("{frac:018}");
            write!(f, "{whole}.{} GYM", s.trim_end_matches('0'))
        }
    }
}

/// Wall-clock time in milliseconds since the Unix epoch, as given by the [`crate::ports::Clock`].
///
/// Pure cores take a `Timestamp` as an argument and never read a clock themselves.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, Serialize, Deserialize,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds since the Unix epoch.
    pub fn as_millis(&self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating.
    pub fn plus_ms(&self, ms: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, 0 when `earlier` is later.
    pub fn since(&self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// One GPU as a node describes it at registration (paper §4.1, `GpuInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GpuInfo {
    /// Marketing name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub model: String,
    /// Memory in bytes, e.g. 85,899,345,920 for 80 GiB.
    pub vram_bytes: u64,
    /// CUDA compute capability (major, minor), e.g. (8, 0).
    pub compute_cap: (u8, u8),
    /// The attestation: a signature by a trusted attester over the fields above
    /// (verified at admission; an empty trusted set is development mode).
    pub driver_sig: Vec<u8>,
}

/// What a node declares about its network when it registers; used to estimate links
/// that have not been probed yet (DESIGN §4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct LinkProfile {
    /// Upload capacity in Mbit/s.
    pub up_mbps: f32,
    /// Download capacity in Mbit/s.
    pub down_mbps: f32,
}

/// Everything a node declares at registration (paper §4.1 `NodeInfo`, minus the stake,
/// which the orchestrator reads from the chain instead of trusting the node).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeInfo {
    /// The node's Ed25519 public key.
    pub id: NodeId,
    /// Its GPU.
    pub gpu: GpuInfo,
    /// Declared up/down capacity.
    pub link: LinkProfile,
    /// Region label, e.g. `eu-west`; rings start region-sorted (paper Algorithm 1).
    pub region: String,
}
