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

/// For people: UTC to the second, `2026-12-02 01:06:52 UTC` (a time beyond chrono's range
/// reads `<ms> ms since the Unix epoch`).
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match i64::try_from(self.0)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis)
        {
            Some(t) => write!(f, "{}", t.format("%Y-%m-%d %H:%M:%S UTC")),
            None => write!(f, "{} ms since the Unix epoch", self.0),
        }
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

/// The ordered members of a job's ring at one version (DESIGN §4).
///
/// Member `k` sends to member `k+1` (and the last to the first) in the ring all-reduce.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingView {
    /// The job this ring serves.
    pub job: JobId,
    /// Strictly increasing per job, starting at 1; a node rejects a lower version than one it has.
    pub version: u64,
    /// Members in ring order.
    pub members: Vec<NodeId>,
    /// The ring's weakest link in Mbit/s (min over ring edges of B), as computed when built.
    pub bottleneck_mbps: f32,
    /// How many of the ring's links were estimated from the nodes' declared capacities
    /// rather than measured by a probe (DESIGN §4); 0 when every link was probed.
    pub estimated_links: u32,
}

/// A node's receipt for its model update in one epoch, as the core sees it: the delta
/// itself is validated and stored by the deltas pipeline; the core keeps its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeltaReceipt {
    /// The job.
    pub job: JobId,
    /// The submitting node.
    pub node: NodeId,
    /// The epoch the delta belongs to.
    pub epoch: u32,
    /// The global step the node's local run of this epoch started at (`epoch × local_steps`).
    pub step: u64,
    /// SHA-256 of the delta payload (DESIGN §6).
    pub delta_hash: [u8; 32],
    /// The loss the node claims for the pre-delta weights on its batch of `step` (checked
    /// by spot-checks, DESIGN §6). Absent in logs written before it existed: 0.
    #[serde(default)]
    pub claimed_loss: f64,
    /// The node's Ed25519 signature (64 bytes) over the delta statement of DESIGN §6
    /// (job, epoch, step, claimed loss, delta hash), kept so anyone can audit the epoch.
    #[serde(default)]
    pub signature: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_read_as_utc_to_the_second() {
        assert_eq!(
            Timestamp(1_764_637_612_345).to_string(),
            "2025-12-02 01:06:52 UTC"
        );
        assert_eq!(Timestamp(0).to_string(), "1970-01-01 00:00:00 UTC");
        assert_eq!(
            Timestamp(u64::MAX).to_string(),
            "18446744073709551615 ms since the Unix epoch"
        );
    }
}
