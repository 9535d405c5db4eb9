//! Size limits of untrusted input (issue 19 item 7, DESIGN §3 "Untrusted input"): every
//! bytes, string and repeated field of a `NodeService` request that arrives unauthenticated
//! or not yet verified has a limit here, checked before the field is decoded, hashed, parsed
//! or logged.
//!
//! One function per request kind ([`challenge`], [`register`], [`signed_node_message`],
//! [`delta_header`], [`delta_trailer`], [`delta_commitment`], [`sketch_submission`],
//! [`reduction_report`], [`round_evidence`], [`fetch_checkpoint`]) looks at lengths only: no
//! decoding, no allocation, O(1) but for the evidence pieces (O(pieces)). It answers a
//! [`FieldError`] naming the field, its length and the limit, never the field's content; the
//! services call it first (after a per-IP rate limit where there is one) and refuse
//! `INVALID_ARGUMENT`. The exact checks (a key is 32 bytes, a nonce was issued, a region is
//! `[a-z0-9-]`, …) come after, on bounded input.
//!
//! Every limit is derived from the field it bounds, in bytes:
//! * fixed-size values at their size: a node id (Ed25519 public key) [`NODE_ID_BYTES`], a
//!   signature [`SIGNATURE_BYTES`], a nonce [`NONCE_BYTES`], a session token
//!   [`SESSION_TOKEN_BYTES`], a SHA-256 [`SHA256_BYTES`];
//! * strings and bytes at the bounds their validation documents ([`MAX_GPU_MODEL_BYTES`],
//!   [`MAX_DRIVER_SIG_BYTES`], [`MAX_REGION_BYTES`], [`MAX_ENDPOINT_BYTES`],
//!   [`MAX_PROBE_ERROR_BYTES`], [`MAX_CHECKPOINT_REF_BYTES`]);
//! * an embedded encoded message ([`MAX_NODE_INFO_BYTES`], [`MAX_NODE_MESSAGE_BYTES`]) at the
//!   sum of its fields at their bounds with their protobuf framing (a one-byte tag, a length
//!   varint, varints at their longest), rounded up to the next power of two: the headroom
//!   keeps a field a newer peer adds from being refused, while a flood of 1 MiB fields is
//!   refused after 2 KiB.

use crate::field::FieldError;
use hanzod_proto::v1 as pb;

/// A node id: an Ed25519 public key, 32 bytes.
pub const NODE_ID_BYTES: usize = 32;
/// An Ed25519 signature, 64 bytes.
pub const SIGNATURE_BYTES: usize = 64;
/// A registration nonce (`ChallengeResponse.nonce`), 32 bytes.
pub const NONCE_BYTES: usize = 32;
/// A session token (`RegisterResponse.session`), 16 bytes.
pub const SESSION_TOKEN_BYTES: usize = 16;
/// A SHA-256 digest, 32 bytes.
pub const SHA256_BYTES: usize = 32;
/// `GpuInfo.model`: 1..=128 bytes (`convert::node_info`, `common.proto`).
pub const MAX_GPU_MODEL_BYTES: usize = 128;
/// `GpuInfo.driver_sig`, the GPU attestation: at most 1,024 bytes (an Ed25519 signature is
/// 64; the rest is room for another attestation scheme). `convert::node_info`.
pub const MAX_DRIVER_SIG_BYTES: usize = 1024;
/// `NodeInfo.region`: 1..=64 bytes of `[a-z0-9-]` (`node.proto`, `convert::node_info`).
pub const MAX_REGION_BYTES: usize = 64;
/// `NodeInfo.endpoint`, `host:port`: at most 255 bytes (a DNS name's limit; `node.proto`,
/// `convert::endpoint`).
pub const MAX_ENDPOINT_BYTES: usize = 255;
/// `ProbeResult.error` as [`MAX_NODE_MESSAGE_BYTES`] is derived for it, bytes. A node's
/// probe errors are `connect <endpoint>: <I/O error>`: an endpoint of at most
/// [`MAX_ENDPOINT_BYTES`] and an error of a line. A longer error is not refused by itself;
/// the whole message is, past [`MAX_NODE_MESSAGE_BYTES`].
pub const MAX_PROBE_ERROR_BYTES: usize = 1024;
/// `FetchCheckpointRequest.checkpoint`, a checkpoint reference: at most 256 bytes, the
/// bound of `spec.training.base` (a job's initial checkpoint) and far above a sha2-256
/// CIDv1 in base32 (59 bytes), the form the daemon hands out in `EpochStart`.
pub const MAX_CHECKPOINT_REF_BYTES: usize = 256;
/// Most pieces one `RoundEvidence` may carry (`node.proto`: 65,536).
pub const MAX_EVIDENCE_PIECES: usize = 65_536;
/// Bytes of one evidence piece: a 73-byte all-reduce piece header
/// (`hanzod_allreduce::wire::PieceHeader`) and its 64-byte Ed25519 signature.
pub const EVIDENCE_PIECE_BYTES: usize = 73 + SIGNATURE_BYTES;
/// Most counters of a `DeltaSketch` (each of `rows` and `abs_rows`): the largest sketch,
/// [`crate::sketch::MAX_ROWS`] (32,768, `node.proto`).
pub const MAX_SKETCH_ROWS: usize = crate::sketch::MAX_ROWS;

/// Bytes of `v` as a protobuf varint (1..=10).
const fn varint_len(v: u64) -> usize {
    let mut n = 1;
    let mut v = v >> 7;
    while v > 0 {
        n += 1;
        v >>= 7;
    }
    n
}

/// A length-delimited field of `len` bytes with its tag and its length varint. The tag is
/// one byte for field numbers below 16 (`(n << 3) | wire type < 128`): every field counted
/// here is numbered 1..=12.
const fn len_field(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// A `uint64` field at its longest: tag and a 10-byte varint.
const U64_FIELD: usize = 1 + 10;
/// A `uint32` field at its longest: tag and a 5-byte varint.
const U32_FIELD: usize = 1 + 5;
/// A `float` field: tag and 4 bytes.
const FLOAT_FIELD: usize = 1 + 4;

/// `GpuInfo` with every field at its bound: model, vram_bytes, compute_cap_major and
/// minor, driver_sig.
const GPU_INFO_MAX: usize =
    len_field(MAX_GPU_MODEL_BYTES) + U64_FIELD + 2 * U32_FIELD + len_field(MAX_DRIVER_SIG_BYTES);

/// The longest valid encoded `NodeInfo`, bytes: node_id, gpu (model, vram_bytes, compute
/// capability, driver_sig at their bounds: 1,184 bytes framed), bandwidth
/// (two floats), region and endpoint at their bounds, each with its framing (1,554 bytes).
pub const NODE_INFO_ENCODED_MAX: usize = len_field(NODE_ID_BYTES)
    + len_field(GPU_INFO_MAX)
    + len_field(2 * FLOAT_FIELD)
    + len_field(MAX_REGION_BYTES)
    + len_field(MAX_ENDPOINT_BYTES);

/// `RegisterRequest.info`, an encoded `NodeInfo`: [`NODE_INFO_ENCODED_MAX`] (1,554 bytes)
/// rounded up to the next power of two, 2,048 bytes.
pub const MAX_NODE_INFO_BYTES: usize = NODE_INFO_ENCODED_MAX.next_power_of_two();

/// The largest `NodeMessage` body: a `ProbeResult` (probe_id, peer, mbps, bytes,
/// elapsed_us, an error of [`MAX_PROBE_ERROR_BYTES`]); a `Heartbeat` (27 bytes) and a
/// `RingAck` (22) are smaller.
const PROBE_RESULT_MAX: usize = U64_FIELD
    + len_field(NODE_ID_BYTES)
    + FLOAT_FIELD
    + 2 * U64_FIELD
    + len_field(MAX_PROBE_ERROR_BYTES);

/// The longest valid encoded `NodeMessage`, bytes: session token, seq, timestamp_ms and
/// the largest body (a `ProbeResult` with a [`MAX_PROBE_ERROR_BYTES`] error: 1,102 bytes
/// framed) with its framing (1,142 bytes).
pub const NODE_MESSAGE_ENCODED_MAX: usize =
    len_field(SESSION_TOKEN_BYTES) + 2 * U64_FIELD + len_field(PROBE_RESULT_MAX);

/// `SignedNodeMessage.payload`, an encoded `NodeMessage`: [`NODE_MESSAGE_ENCODED_MAX`]
/// (1,142 bytes) rounded up to the next power of two, 2,048 bytes.
pub const MAX_NODE_MESSAGE_BYTES: usize = NODE_MESSAGE_ENCODED_MAX.next_power_of_two();

// The figures the docs quote.
const _: () = assert!(len_field(GPU_INFO_MAX) == 1184 && len_field(PROBE_RESULT_MAX) == 1102);
const _: () = assert!(NODE_INFO_ENCODED_MAX == 1554 && MAX_NODE_INFO_BYTES == 2048);
const _: () = assert!(NODE_MESSAGE_ENCODED_MAX == 1142 && MAX_NODE_MESSAGE_BYTES == 2048);

/// `field` of `len` bytes against its limit of `max` bytes: the error names both, not the
/// content.
fn at_most(field: &'static str, len: usize, max: usize) -> Result<(), FieldError> {
    if len <= max {
        Ok(())
    } else {
        Err(FieldError {
            field,
            reason: format!("{len} bytes, over its limit of {max} bytes"),
        })
    }
}

/// `ChallengeRequest`: `node_id` at most [`NODE_ID_BYTES`].
pub fn challenge(r: &pb::ChallengeRequest) -> Result<(), FieldError> {
    at_most("node_id", r.node_id.len(), NODE_ID_BYTES)
}

/// `RegisterRequest`, before its `info` is decoded: `info` at most
/// [`MAX_NODE_INFO_BYTES`], `nonce` at most [`NONCE_BYTES`], `signature` at most
/// [`SIGNATURE_BYTES`].
pub fn register(r: &pb::RegisterRequest) -> Result<(), FieldError> {
    at_most("info", r.info.len(), MAX_NODE_INFO_BYTES)?;
    at_most("nonce", r.nonce.len(), NONCE_BYTES)?;
    at_most("signature", r.signature.len(), SIGNATURE_BYTES)
}

/// A session's `SignedNodeMessage` (the first and every later one), before its payload is
/// decoded or its signature verified: `payload` at most [`MAX_NODE_MESSAGE_BYTES`],
/// `signature` at most [`SIGNATURE_BYTES`].
pub fn signed_node_message(m: &pb::SignedNodeMessage) -> Result<(), FieldError> {
    at_most("payload", m.payload.len(), MAX_NODE_MESSAGE_BYTES)?;
    at_most("signature", m.signature.len(), SIGNATURE_BYTES)
}

/// An upload's `DeltaHeader`: `header.session` at most [`SESSION_TOKEN_BYTES`] (its
/// numbers are checked by the upload).
pub fn delta_header(h: &pb::DeltaHeader) -> Result<(), FieldError> {
    at_most("header.session", h.session.len(), SESSION_TOKEN_BYTES)
}

/// An upload's `DeltaTrailer`, before its hash is compared or quoted and its signature
/// verified: `trailer.sha256` at most [`SHA256_BYTES`], `trailer.signature` at most
/// [`SIGNATURE_BYTES`].
pub fn delta_trailer(t: &pb::DeltaTrailer) -> Result<(), FieldError> {
    at_most("trailer.sha256", t.sha256.len(), SHA256_BYTES)?;
    at_most("trailer.signature", t.signature.len(), SIGNATURE_BYTES)
}

/// `DeltaCommitment`: `session` at most [`SESSION_TOKEN_BYTES`], `sha256` at most
/// [`SHA256_BYTES`], `signature` at most [`SIGNATURE_BYTES`].
pub fn delta_commitment(r: &pb::DeltaCommitment) -> Result<(), FieldError> {
    at_most("session", r.session.len(), SESSION_TOKEN_BYTES)?;
    at_most("sha256", r.sha256.len(), SHA256_BYTES)?;
    at_most("signature", r.signature.len(), SIGNATURE_BYTES)
}

/// `SketchSubmission`, before the sketch is checked or hashed: `session`, `sha256` and
/// `signature` as in [`delta_commitment`], `sketch.rows` and `sketch.abs_rows` at most
/// [`MAX_SKETCH_ROWS`] counters each.
pub fn sketch_submission(r: &pb::SketchSubmission) -> Result<(), FieldError> {
    at_most("session", r.session.len(), SESSION_TOKEN_BYTES)?;
    at_most("sha256", r.sha256.len(), SHA256_BYTES)?;
    at_most("signature", r.signature.len(), SIGNATURE_BYTES)?;
    if let Some(s) = &r.sketch {
        counters("sketch.rows", s.rows.len(), MAX_SKETCH_ROWS)?;
        counters("sketch.abs_rows", s.abs_rows.len(), MAX_SKETCH_ROWS)?;
    }
    Ok(())
}

/// A repeated `field` of `n` elements against its limit of `max` elements.
fn counters(field: &'static str, n: usize, max: usize) -> Result<(), FieldError> {
    if n <= max {
        Ok(())
    } else {
        Err(FieldError {
            field,
            reason: format!("{n} elements, over its limit of {max}"),
        })
    }
}

/// `ReductionReport`: `session` at most [`SESSION_TOKEN_BYTES`], `result_sha256` at most
/// [`SHA256_BYTES`], `signature` at most [`SIGNATURE_BYTES`].
pub fn reduction_report(r: &pb::ReductionReport) -> Result<(), FieldError> {
    at_most("session", r.session.len(), SESSION_TOKEN_BYTES)?;
    at_most("result_sha256", r.result_sha256.len(), SHA256_BYTES)?;
    at_most("signature", r.signature.len(), SIGNATURE_BYTES)
}

/// `RoundEvidence`: `session` at most [`SESSION_TOKEN_BYTES`], `sender` at most
/// [`NODE_ID_BYTES`], at most [`MAX_EVIDENCE_PIECES`] pieces of at most
/// [`EVIDENCE_PIECE_BYTES`] each (the error names the first piece over it by index).
pub fn round_evidence(r: &pb::RoundEvidence) -> Result<(), FieldError> {
    at_most("session", r.session.len(), SESSION_TOKEN_BYTES)?;
    at_most("sender", r.sender.len(), NODE_ID_BYTES)?;
    counters("pieces", r.pieces.len(), MAX_EVIDENCE_PIECES)?;
    match r.pieces.iter().position(|p| p.len() > EVIDENCE_PIECE_BYTES) {
        None => Ok(()),
        Some(i) => Err(FieldError {
            field: "pieces",
            reason: format!(
                "pieces[{i}] is {} bytes, over its limit of {EVIDENCE_PIECE_BYTES} bytes",
                r.pieces[i].len()
            ),
        }),
    }
}

/// `FetchCheckpointRequest`, before the reference is parsed: `session` at most
/// [`SESSION_TOKEN_BYTES`], `checkpoint` at most [`MAX_CHECKPOINT_REF_BYTES`].
pub fn fetch_checkpoint(r: &pb::FetchCheckpointRequest) -> Result<(), FieldError> {
    at_most("session", r.session.len(), SESSION_TOKEN_BYTES)?;
    at_most("checkpoint", r.checkpoint.len(), MAX_CHECKPOINT_REF_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn varints_and_framing_are_measured_as_protobuf_encodes_them() {
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(127), 1);
        assert_eq!(varint_len(128), 2);
        assert_eq!(varint_len(16_383), 2);
        assert_eq!(varint_len(16_384), 3);
        assert_eq!(varint_len(u64::from(u32::MAX)), 5);
        assert_eq!(varint_len(u64::MAX), 10);
        assert_eq!(len_field(32), 34);
        assert_eq!(len_field(255), 258);
    }

    /// One request kind as the proptest sees it: its fields and their limits, and a
    /// function that builds the request with the given lengths and checks it.
    struct Kind {
        fields: &'static [(&'static str, usize)],
        check: fn(&[usize]) -> Result<(), FieldError>,
    }

    /// `len` bytes of escape characters: content that must never reach an error.
    fn junk(len: usize) -> Vec<u8> {
        vec![0x1b; len]
    }

    fn junk_str(len: usize) -> String {
        "\u{1b}".repeat(len)
    }

    const KINDS: &[Kind] = &[
        Kind {
            fields: &[("node_id", NODE_ID_BYTES)],
            check: |l| {
                challenge(&pb::ChallengeRequest {
                    node_id: junk(l[0]),
                })
            },
        },
        Kind {
            fields: &[
                ("info", MAX_NODE_INFO_BYTES),
                ("nonce", NONCE_BYTES),
                ("signature", SIGNATURE_BYTES),
            ],
            check: |l| {
                register(&pb::RegisterRequest {
                    info: junk(l[0]),
                    nonce: junk(l[1]),
                    signature: junk(l[2]),
                })
            },
        },
        Kind {
            fields: &[
                ("payload", MAX_NODE_MESSAGE_BYTES),
                ("signature", SIGNATURE_BYTES),
            ],
            check: |l| {
                signed_node_message(&pb::SignedNodeMessage {
                    payload: junk(l[0]),
                    signature: junk(l[1]),
                })
            },
        },
        Kind {
            fields: &[("header.session", SESSION_TOKEN_BYTES)],
            check: |l| {
                delta_header(&pb::DeltaHeader {
                    session: junk(l[0]),
                    ..Default::default()
                })
            },
        },
        Kind {
            fields: &[
                ("trailer.sha256", SHA256_BYTES),
                ("trailer.signature", SIGNATURE_BYTES),
            ],
            check: |l| {
                delta_trailer(&pb::DeltaTrailer {
                    sha256: junk(l[0]),
                    signature: junk(l[1]),
                })
            },
        },
        Kind {
            fields: &[
                ("session", SESSION_TOKEN_BYTES),
                ("sha256", SHA256_BYTES),
                ("signature", SIGNATURE_BYTES),
            ],
            check: |l| {
                delta_commitment(&pb::DeltaCommitment {
                    session: junk(l[0]),
                    sha256: junk(l[1]),
                    signature: junk(l[2]),
                    ..Default::default()
                })
            },
        },
        Kind {
            fields: &[
                ("session", SESSION_TOKEN_BYTES),
                ("sha256", SHA256_BYTES),
                ("signature", SIGNATURE_BYTES),
                ("sketch.rows", MAX_SKETCH_ROWS),
                ("sketch.abs_rows", MAX_SKETCH_ROWS),
            ],
            check: |l| {
                sketch_submission(&pb::SketchSubmission {
                    session: junk(l[0]),
                    sha256: junk(l[1]),
                    signature: junk(l[2]),
                    sketch: Some(pb::DeltaSketch {
                        rows: vec![f64::NAN; l[3]],
                        abs_rows: vec![f64::NAN; l[4]],
                        len: 0,
                    }),
                    ..Default::default()
                })
            },
        },
        Kind {
            fields: &[
                ("session", SESSION_TOKEN_BYTES),
                ("result_sha256", SHA256_BYTES),
                ("signature", SIGNATURE_BYTES),
            ],
            check: |l| {
                reduction_report(&pb::ReductionReport {
                    session: junk(l[0]),
                    result_sha256: junk(l[1]),
                    signature: junk(l[2]),
                    ..Default::default()
                })
            },
        },
        Kind {
            // The count of pieces, and the length of the last piece.
            fields: &[
                ("session", SESSION_TOKEN_BYTES),
                ("sender", NODE_ID_BYTES),
                ("pieces", MAX_EVIDENCE_PIECES),
                ("pieces", EVIDENCE_PIECE_BYTES),
            ],
            check: |l| {
                let mut pieces = vec![Vec::new(); l[2].max(1)];
                if let Some(last) = pieces.last_mut() {
                    *last = junk(l[3]);
                }
                round_evidence(&pb::RoundEvidence {
                    session: junk(l[0]),
                    sender: junk(l[1]),
                    pieces,
                    ..Default::default()
                })
            },
        },
        Kind {
            fields: &[
                ("session", SESSION_TOKEN_BYTES),
                ("checkpoint", MAX_CHECKPOINT_REF_BYTES),
            ],
            check: |l| {
                fetch_checkpoint(&pb::FetchCheckpointRequest {
                    session: junk(l[0]),
                    checkpoint: junk_str(l[1]),
                })
            },
        },
    ];

    #[test]
    fn every_field_passes_at_its_limit_and_is_named_one_past_it() {
        for kind in KINDS {
            let at: Vec<usize> = kind.fields.iter().map(|&(_, max)| max).collect();
            assert_eq!((kind.check)(&at), Ok(()), "{:?}", kind.fields);
            for (i, &(field, max)) in kind.fields.iter().enumerate() {
                let mut over = at.clone();
                over[i] = max + 1;
                let e = (kind.check)(&over).expect_err(field);
                assert_eq!(e.field, field);
                let text = e.to_string();
                assert!(text.contains(&(max + 1).to_string()), "{text}");
                assert!(text.contains(&max.to_string()), "{text}");
                assert!(!text.contains('\u{1b}'), "{text}");
                assert!(text.len() < 120, "{text}");
            }
        }
    }

    #[test]
    fn empty_and_missing_fields_are_within_the_limits() {
        // Missing fields are for the exact checks after, not for the limits.
        for kind in KINDS {
            let zero = vec![0; kind.fields.len()];
            assert_eq!((kind.check)(&zero), Ok(()), "{:?}", kind.fields);
        }
        assert_eq!(sketch_submission(&pb::SketchSubmission::default()), Ok(()));
    }

    proptest! {
        /// Any request whose fields are within their limits passes; with one field over
        /// its limit, the error names that field and its length (whatever the others).
        #[test]
        fn within_limits_passes_and_the_field_over_is_named(
            kind in 0..KINDS.len(),
            fractions in proptest::collection::vec(0.0..=1.0f64, 5),
            over in proptest::option::of((0usize..5, 1usize..5000)),
        ) {
            let kind = &KINDS[kind];
            let mut lens: Vec<usize> = kind
                .fields
                .iter()
                .zip(&fractions)
                .map(|(&(_, max), f)| (max as f64 * f) as usize)
                .collect();
            match over {
                None => prop_assert_eq!((kind.check)(&lens), Ok(())),
                Some((i, extra)) => {
                    let i = i % lens.len();
                    let (field, max) = kind.fields[i];
                    lens[i] = max + extra;
                    let e = (kind.check)(&lens).expect_err("a field over its limit passed");
                    prop_assert_eq!(e.field, field);
                    prop_assert!(e.reason.contains(&(max + extra).to_string()), "{}", e);
                    prop_assert!(!e.to_string().contains('\u{1b}'), "{}", e);
                }
            }
        }
    }
}
