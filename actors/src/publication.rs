//! The publication record (DESIGN §7, paper §7.2): what an orchestrator signs and records on
//! chain for each published checkpoint, so that anyone holding a copy of the checkpoint can
//! check it against the chain.
//!
//! The record names every file of the published repo by its IPFS CID (Kubo's
//! `ipfs add --cid-version=1`): the weights (`cid`, as in the paper), and, a departure from
//! the paper's record, the `config.json` (`config_cid`) and the model card `README.md`
//! (`card_cid`), so that one flipped byte in any published file fails verification.
//!
//! Signing and checking use Ed25519 over [`PublicationRecord::canonical_bytes`]; the keys live
//! in `hanzod_protocol::record`, this crate only carries the bytes.

use serde::{Deserialize, Serialize};

use crate::types::{JobId, Timestamp};

/// The domain separator that starts [`PublicationRecord::canonical_bytes`], so that a
/// signature over a record can never be replayed as a signature over another message kind.
pub const RECORD_DOMAIN: &[u8] = crate::domain::PUBLICATION_RECORD;

/// One published checkpoint (paper §7.1 `PublishRecord`, plus the job, and the CIDs of the
/// repo's other two files).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublicationRecord {
    /// The job that trained the checkpoint.
    pub job: JobId,
    /// The epoch that produced it, 0-based.
    pub epoch: u32,
    /// The CIDv1 (base32) of the weights, `model.safetensors`.
    pub cid: String,
    /// The CIDv1 (base32) of the repo's `config.json`.
    pub config_cid: String,
    /// The CIDv1 (base32) of the repo's model card, `README.md`.
    pub card_cid: String,
    /// The Hugging Face repo id, `{org}/{model}-job-{job}-epoch-{epoch}`; empty when the
    /// checkpoint was published by CID only (no model registry configured).
    pub hf_repo: String,
    /// The checkpoint's validation loss (lower is better), finite.
    pub quality: f64,
    /// When the orchestrator signed the record, milliseconds since the Unix epoch.
    pub timestamp: Timestamp,
}

/// Appends `bytes` with a big-endian u32 length prefix.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Strings here are CIDs and repo ids (≤ 200 bytes); a longer one is still encoded
    // unambiguously as long as it fits u32, which every in-memory string here does.
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

impl PublicationRecord {
    /// The bytes that are signed: [`RECORD_DOMAIN`], then `job` (u64), `epoch` (u32),
    /// `cid`, `config_cid`, `card_cid`, `hf_repo` (each a u32 length then UTF-8),
    /// `quality` (the IEEE-754 binary64 bits as u64) and `timestamp` (u64 ms), every
    /// integer big-endian. Injective: two different records never give the same bytes.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_DOMAIN.len() + 256);
        out.extend_from_slice(RECORD_DOMAIN);
        out.extend_from_slice(&self.job.0.to_be_bytes());
        out.extend_from_slice(&self.epoch.to_be_bytes());
        for s in [&self.cid, &self.config_cid, &self.card_cid, &self.hf_repo] {
            put_bytes(&mut out, s.as_bytes());
        }
        out.extend_from_slice(&self.quality.to_bits().to_be_bytes());
        out.extend_from_slice(&self.timestamp.0.to_be_bytes());
        out
    }
}

/// A [`PublicationRecord`] with the orchestrator's Ed25519 signature over its
/// [`PublicationRecord::canonical_bytes`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignedPublication {
    /// The record.
    pub record: PublicationRecord,
    /// The signer's Ed25519 public key (32 bytes, hex in JSON).
    #[serde(with = "hex::serde")]
    pub signer: [u8; 32],
    /// The signature (64 bytes, hex in JSON).
    #[serde(with = "hex::serde")]
    pub signature: [u8; 64],
}

/// The outcome of one `Ledger::record_publication`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublicationReceipt {
    /// The publication on record for its (job, epoch): this call's, or the first one's.
    pub publication: SignedPublication,
    /// `true` when the (job, epoch) already had a record: nothing was written and
    /// `publication` is the first one.
    pub duplicate: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> PublicationRecord {
        PublicationRecord {
            job: JobId(7),
            epoch: 3,
            cid: "bafy-weights".into(),
            config_cid: "bafk-config".into(),
            card_cid: "bafk-card".into(),
            hf_repo: "hanzo-gym/wine-job-7-epoch-3".into(),
            quality: 0.5,
            timestamp: Timestamp(1_700_000_000_000),
        }
    }

    #[test]
    fn canonical_bytes_start_with_the_domain_and_change_with_every_field() {
        let base = record();
        let bytes = base.canonical_bytes();
        assert!(bytes.starts_with(RECORD_DOMAIN));
        let variants = [
            PublicationRecord {
                job: JobId(8),
                ..base.clone()
            },
            PublicationRecord {
                epoch: 4,
                ..base.clone()
            },
            PublicationRecord {
                cid: "bafy-weightz".into(),
                ..base.clone()
            },
            PublicationRecord {
                config_cid: "x".into(),
                ..base.clone()
            },
            PublicationRecord {
                card_cid: "x".into(),
                ..base.clone()
            },
            PublicationRecord {
                hf_repo: String::new(),
                ..base.clone()
            },
            PublicationRecord {
                quality: 0.5000001,
                ..base.clone()
            },
            PublicationRecord {
                timestamp: Timestamp(1),
                ..base.clone()
            },
        ];
        for v in variants {
            assert_ne!(v.canonical_bytes(), bytes, "{v:?}");
        }
    }

    proptest::proptest! {
        /// Length prefixes keep the encoding injective: moving bytes between two adjacent
        /// strings changes the encoding.
        #[test]
        fn shifting_bytes_between_fields_changes_the_encoding(a in "[a-z]{0,8}", b in "[a-z]{0,8}", k in 0usize..8) {
            let joined = format!("{a}{b}");
            let k = k.min(joined.len());
            let r1 = PublicationRecord { cid: a.clone(), config_cid: b.clone(), ..record() };
            let r2 = PublicationRecord { cid: joined[..k].to_string(), config_cid: joined[k..].to_string(), ..record() };
            proptest::prop_assert_eq!(r1.canonical_bytes() == r2.canonical_bytes(), r1 == r2);
        }
    }
}
