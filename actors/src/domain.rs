//! Every domain string hanzod hashes or signs under, in one place (DESIGN §3, §6, §7, §8).
//!
//! Each signed or hashed byte string starts with one of these, so a signature or a digest
//! made for one purpose can never be replayed as, or collide with, one for another. None is
//! a prefix of another ([`ALL`], checked by a test). Node, orchestrator and auditor compute
//! the same bytes, so these constants are protocol: changing one is a new protocol version.

/// Registration: the node signs `REGISTER || nonce || NodeInfo bytes` (DESIGN §3).
pub const REGISTER: &[u8] = b"hanzod.v1.register";
/// Session messages: the node signs `SESSION || NodeMessage bytes` (DESIGN §3).
pub const SESSION: &[u8] = b"hanzod.v1.session";
/// GPU attestation: the attester signs `GPU || node id || model || vram (u64 BE) || major ||
/// minor` (DESIGN §3).
pub const GPU: &[u8] = b"hanzod.v1.gpu";
/// Delta statements (DESIGN §6): the node signs SHA-256(`DELTA || job id || epoch || step ||
/// claimed loss || SHA-256(payload)`), little endian.
pub const DELTA: &[u8] = b"hanzod-delta-v1";
/// The orchestrator's spot-check seed (DESIGN §6): SHA-256 of its Ed25519 signature over
/// `SPOT_CHECK_SEED` alone (deterministic, and nobody without the key can compute it).
pub const SPOT_CHECK_SEED: &[u8] = b"hanzod.v1.spot-check-seed";
/// An epoch's spot-check secret (DESIGN §6): SHA-256(`SPOT_CHECK || seed || job u64 LE ||
/// epoch u32 LE`).
pub const SPOT_CHECK: &[u8] = b"hanzod-spot-check-v1";
/// Slashing evidence (DESIGN §8): the `domain` field of the evidence JSON whose SHA-256 the
/// chain keys a slash by.
pub const SLASH_EVIDENCE: &[u8] = b"hanzod-slash-v2";
/// Ring tamper evidence (DESIGN §4b, §8): the `domain` field of the evidence JSON that
/// proves a ring member sent a wrong partial sum, whose SHA-256 the chain keys its slash by.
pub const RING_TAMPER_EVIDENCE: &[u8] = b"hanzod-ring-tamper-v1";
/// The publication record (DESIGN §7): the orchestrator signs `PUBLICATION_RECORD ||`
/// the record's canonical bytes.
pub const PUBLICATION_RECORD: &[u8] = b"hanzod/publication-record/v1\0";
/// A delta receipt's event id (DESIGN §9): the first 16 bytes of SHA-256(`RECEIPT || job ||
/// node || epoch || delta hash`), so a retried append is recorded once.
pub const RECEIPT: &[u8] = b"hanzod.receipt.v1";
/// The orchestrator's EVM account (DESIGN §8): the secp256k1 key is SHA-256(`EVM_ACCOUNT ||`
/// the Ed25519 signature of `EVM_ACCOUNT`).
pub const EVM_ACCOUNT: &[u8] = b"hanzod/evm-account/v1\0";
/// The built-in Wine Quality data's train/validation split: its shuffle seed is
/// SHA-256(`WINE_SPLIT`).
pub const WINE_SPLIT: &[u8] = b"hanzod-wine-split-v1";
/// The built-in MLP's initial weights: their seed is SHA-256(`WINE_MLP_INIT || seed`).
pub const WINE_MLP_INIT: &[u8] = b"hanzod-wine-mlp-init-v1";
/// A Qwen3 model's initial weights: their seed is SHA-256(`QWEN3_INIT || seed`).
pub const QWEN3_INIT: &[u8] = b"hanzod-qwen3-init-v1";
/// A LoRA adapter's initial `A` factors of one epoch: their seed is
/// SHA-256(`LORA_INIT || seed || job || first step`).
pub const LORA_INIT: &[u8] = b"hanzod-lora-init-v1";
/// A test or demo node operator's EVM key: SHA-256(`TEST_OPERATOR || node key`).
pub const TEST_OPERATOR: &[u8] = b"hanzod/test-operator/v1\0";
/// A demo node's key: SHA-256(`DEMO_NODE || seed || index`).
pub const DEMO_NODE: &[u8] = b"hanzod-demo-node";
/// The demo orchestrator's key: SHA-256(`DEMO_ORCHESTRATOR || seed`).
pub const DEMO_ORCHESTRATOR: &[u8] = b"hanzod-demo-orchestrator";

/// Ring all-reduce link handshake (DESIGN §6.4): each end signs `RING_HANDSHAKE ||` the
/// round parameters and both nonces.
pub const RING_HANDSHAKE: &[u8] = b"hanzod.v1.ring-handshake";
/// A forwarded ring piece (DESIGN §6.4): the sender signs `RING_PIECE ||` the 73-byte piece
/// header.
pub const RING_PIECE: &[u8] = b"hanzod.v1.ring-piece";
/// A ring round's abort notice (DESIGN §6.4): `RING_ABORT ||` the notice body.
pub const RING_ABORT: &[u8] = b"hanzod.v1.ring-abort";
/// An epoch's two sketch seeds (DESIGN §6.4): SHA-256(`SKETCH_SEED || purpose ||` the
/// epoch's spot-check secret), purpose 0 scoring and 1 check, each committed as its SHA-256
/// at epoch start.
pub const SKETCH_SEED: &[u8] = b"hanzod-sketch-seed-v1";
/// A ring member's sketch of its committed delta (DESIGN §6.4): the member signs
/// SHA-256(`SKETCH || job || epoch || delta hash || sketch`).
pub const SKETCH: &[u8] = b"hanzod.v1.sketch";
/// A ring round's reported result (DESIGN §6.4): the member signs SHA-256(`REDUCTION || job
/// || epoch || ring version || result hash`).
pub const REDUCTION: &[u8] = b"hanzod.v1.reduction";
/// An uploaded ring round result (DESIGN §6.4): the uploader signs SHA-256(`MERGED || job ||
/// epoch || payload hash`).
pub const MERGED: &[u8] = b"hanzod.v1.merged";
/// A LoRA epoch's random projection of the adapters' updates (DESIGN §6, "Copies and
/// free-riders"): its seed is SHA-256(`LORA_SKETCH ||` the epoch's spot-check secret).
pub const LORA_SKETCH: &[u8] = b"hanzod-lora-sketch-v1";

/// Every domain, for the check that none is a prefix of another.
pub const ALL: [&[u8]; 26] = [
    REGISTER,
    SESSION,
    GPU,
    DELTA,
    SPOT_CHECK_SEED,
    SPOT_CHECK,
    SLASH_EVIDENCE,
    RING_TAMPER_EVIDENCE,
    PUBLICATION_RECORD,
    RECEIPT,
    EVM_ACCOUNT,
    WINE_SPLIT,
    WINE_MLP_INIT,
    QWEN3_INIT,
    LORA_INIT,
    TEST_OPERATOR,
    DEMO_NODE,
    DEMO_ORCHESTRATOR,
    RING_HANDSHAKE,
    RING_PIECE,
    RING_ABORT,
    SKETCH_SEED,
    SKETCH,
    REDUCTION,
    MERGED,
    LORA_SKETCH,
];

#[cfg(test)]
mod tests {
    #[test]
    fn signature_and_hash_domains_are_prefix_free() {
        for (i, a) in super::ALL.iter().enumerate() {
            for (j, b) in super::ALL.iter().enumerate() {
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
