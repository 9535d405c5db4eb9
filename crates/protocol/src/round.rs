//! What a ring member and the orchestrator compute identically in ring aggregation (DESIGN
//! §6.4, `node.proto` "Ring aggregation"): the epoch's two sketch seeds and their
//! commitments, the flat order of a delta's values, the signed statements of a sketch, of a
//! round's result and of an uploaded result, and the sketch's wire form.
//!
//! A delta's values, for the all-reduce and for a sketch, are its tensors' values converted
//! to f32, tensors in name order ([`DeltaView`] sorts them), each row-major: that is the
//! vector members reduce, and the result is written back as an f32 HZDL payload in the same
//! layout ([`result_payload`]), so its SHA-256 is the result hash every member reports.

use ed25519_dalek::VerifyingKey;
use sha2::{Digest, Sha256};

use crate::convert::FieldError;
use crate::hzdl::{write_delta, DeltaDtype, DeltaError, DeltaKind, DeltaView};
use crate::identity::{verify, Identity, SignatureError};
use crate::sketch::{Sketch, SketchError, Sketcher, MAX_ROWS, MIN_ROWS};
use hanzod_actors::domain;
use hanzod_proto::v1 as pb;

/// Which of the epoch's two seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SeedPurpose {
    /// The scoring seed, revealed after the commitments (step 2).
    Score,
    /// The check seed, revealed after every round member committed to the result (step 4).
    Check,
    /// The post-reduce audit's selection (never revealed on its own; anyone recomputes it
    /// from the spot-check secret once that is revealed with the checkpoint).
    Audit,
}

impl SeedPurpose {
    fn code(self) -> u8 {
        match self {
            SeedPurpose::Score => 0,
            SeedPurpose::Check => 1,
            SeedPurpose::Audit => 2,
        }
    }

    /// `check` of `SketchRequest` / `SketchSubmission`.
    pub fn from_check(check: bool) -> SeedPurpose {
        if check {
            SeedPurpose::Check
        } else {
            SeedPurpose::Score
        }
    }
}

/// The epoch's seed for `purpose`: SHA-256(`SKETCH_SEED || purpose (1 byte) ||` the epoch's
/// spot-check secret). Nobody without the secret can compute it; revealing it reveals
/// nothing of the secret (a preimage).
pub fn epoch_seed(spot_check_secret: &[u8; 32], purpose: SeedPurpose) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain::SKETCH_SEED);
    h.update([purpose.code()]);
    h.update(spot_check_secret);
    h.finalize().into()
}

/// The commitment to a seed published at epoch start: SHA-256(seed).
pub fn seed_commitment(seed: &[u8; 32]) -> [u8; 32] {
    Sha256::digest(seed).into()
}

/// Whether `seed` (as revealed on the wire) is the one `commitment` promised: 32 bytes whose
/// SHA-256 is the commitment. Returns the seed.
pub fn check_reveal(commitment: &[u8], seed: &[u8]) -> Option<[u8; 32]> {
    let seed: [u8; 32] = seed.try_into().ok()?;
    (seed_commitment(&seed).as_slice() == commitment).then_some(seed)
}

/// The delta's values as f32, tensors in name order, each row-major (module docs).
pub fn flat_values(view: &DeltaView<'_>) -> Vec<f32> {
    let total: u64 = view.tensors.iter().map(|t| t.len()).sum();
    let mut out = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    for t in &view.tensors {
        out.extend(view.to_f32(t));
    }
    out
}

/// The sketch of a parsed delta's values (in [`flat_values`]' order, streamed tensor by
/// tensor without a flat copy) under `seed` with `rows` rows.
///
/// Errors: [`SketchError::Rows`].
pub fn sketch_delta(
    view: &DeltaView<'_>,
    seed: &[u8; 32],
    rows: usize,
) -> Result<Sketch, SketchError> {
    let mut s = Sketcher::new(seed, rows)?;
    for t in &view.tensors {
        s.update(&view.to_f32(t));
    }
    Ok(s.finish())
}

/// The round's result as the f32 HZDL payload a member uploads (kind full, `base_version`
/// the epoch's base): the tensors of `layout` (name, shape; any order) filled from `values`
/// in name order. Its SHA-256 is the result hash.
///
/// Errors: [`DeltaError::WrongShape`] when `values` is not the layout's element count.
pub fn result_payload(
    layout: &[(String, Vec<usize>)],
    base_version: u64,
    values: &[f32],
) -> Result<Vec<u8>, DeltaError> {
    let mut sorted: Vec<&(String, Vec<usize>)> = layout.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let total: u64 = sorted.iter().map(|(_, s)| crate::hzdl::elements(s)).sum();
    if total != values.len() as u64 {
        return Err(DeltaError::WrongShape {
            tensor: "<all>".into(),
            expected: vec![usize::try_from(total).unwrap_or(usize::MAX)],
            found: vec![values.len()],
        });
    }
    let mut at = 0usize;
    let mut tensors = Vec::with_capacity(sorted.len());
    for (name, shape) in sorted {
        let n = usize::try_from(crate::hzdl::elements(shape)).unwrap_or(usize::MAX);
        tensors.push((name.as_str(), shape.as_slice(), &values[at..at + n]));
        at += n;
    }
    write_delta(DeltaKind::Full, base_version, DeltaDtype::F32, &tensors)
}

fn sketch_bytes(h: &mut Sha256, s: &Sketch) {
    h.update((s.rows.len() as u32).to_le_bytes());
    h.update(s.len.to_le_bytes());
    for r in &s.rows {
        h.update(r.to_le_bytes());
    }
    for r in &s.abs_rows {
        h.update(r.to_le_bytes());
    }
}

/// SHA-256(`SKETCH || job (u64 LE) || epoch (u32 LE) || check (1 byte) || delta hash ||
/// rows (u32 LE) || len (u64 LE) || rows (f64 LE) || abs_rows (f64 LE)`): what a member signs
/// for a sketch of its committed delta (`SketchSubmission.signature`).
pub fn sketch_digest(
    job: u64,
    epoch: u32,
    purpose: SeedPurpose,
    delta_hash: &[u8; 32],
    sketch: &Sketch,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain::SKETCH);
    h.update(job.to_le_bytes());
    h.update(epoch.to_le_bytes());
    h.update([purpose.code()]);
    h.update(delta_hash);
    sketch_bytes(&mut h, sketch);
    h.finalize().into()
}

/// SHA-256(`REDUCTION || job (u64 LE) || epoch (u32 LE) || ring version (u64 LE) || result
/// hash`): what a member signs to commit to a round's result (`ReductionReport.signature`).
pub fn reduction_digest(job: u64, epoch: u32, ring_version: u64, result: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain::REDUCTION);
    h.update(job.to_le_bytes());
    h.update(epoch.to_le_bytes());
    h.update(ring_version.to_le_bytes());
    h.update(result);
    h.finalize().into()
}

/// SHA-256(`MERGED || job (u64 LE) || epoch (u32 LE) || payload hash`): what the uploader of
/// a round's result signs (the trailer of an UploadDelta of kind MERGED).
pub fn merged_digest(job: u64, epoch: u32, payload_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain::MERGED);
    h.update(job.to_le_bytes());
    h.update(epoch.to_le_bytes());
    h.update(payload_hash);
    h.finalize().into()
}

/// Signs a digest of this module (Ed25519, no further domain: the digest carries it).
pub fn sign_digest(identity: &Identity, digest: &[u8; 32]) -> [u8; 64] {
    identity.sign(&[], &[digest])
}

/// Verifies a signature made by [`sign_digest`].
///
/// Errors: [`SignatureError`] for any failure.
pub fn verify_digest(
    key: &VerifyingKey,
    digest: &[u8; 32],
    signature: &[u8],
) -> Result<(), SignatureError> {
    verify(key, &[], &[digest], signature)
}

/// A sketch on the wire.
pub fn sketch_to_wire(s: &Sketch) -> pb::DeltaSketch {
    pb::DeltaSketch {
        rows: s.rows.clone(),
        abs_rows: s.abs_rows.clone(),
        len: s.len,
    }
}

/// A sketch from the wire, refused unless it has `rows` rows (a power of two within
/// [`MIN_ROWS`]`..=`[`MAX_ROWS`]) and masses, covers `len` coordinates and is well formed
/// ([`Sketch::well_formed`]). The caller bounds the message size before decoding (a sketch of
/// [`MAX_ROWS`] rows is 512 KiB).
///
/// Errors: the field at fault (`sketch`, `sketch.rows`, `sketch.abs_rows`, `sketch.len`).
pub fn sketch_from_wire(
    s: Option<&pb::DeltaSketch>,
    rows: usize,
    len: u64,
) -> Result<Sketch, FieldError> {
    let bad = |field: &'static str, reason: String| FieldError { field, reason };
    let s = s.ok_or_else(|| bad("sketch", "missing".into()))?;
    if !(MIN_ROWS..=MAX_ROWS).contains(&rows) || !rows.is_power_of_two() {
        return Err(bad(
            "sketch.rows",
            format!("the round's {rows} rows are not a valid sketch size"),
        ));
    }
    if s.rows.len() != rows {
        return Err(bad(
            "sketch.rows",
            format!("{} rows, not the round's {rows}", s.rows.len()),
        ));
    }
    if s.abs_rows.len() != rows {
        return Err(bad(
            "sketch.abs_rows",
            format!("{} masses, not {rows}", s.abs_rows.len()),
        ));
    }
    if s.len != len {
        return Err(bad(
            "sketch.len",
            format!("{} coordinates, not the delta's {len}", s.len),
        ));
    }
    let sketch = Sketch {
        rows: s.rows.clone(),
        abs_rows: s.abs_rows.clone(),
        len: s.len,
    };
    if !sketch.well_formed() {
        return Err(bad(
            "sketch",
            "not finite, or a row's mass below its magnitude".into(),
        ));
    }
    Ok(sketch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_distinct_per_purpose_and_reveal_against_their_commitment() {
        let secret = [7u8; 32];
        let score = epoch_seed(&secret, SeedPurpose::Score);
        let check = epoch_seed(&secret, SeedPurpose::Check);
        assert_ne!(score, check);
        assert_eq!(check_reveal(&seed_commitment(&score), &score), Some(score));
        assert_eq!(check_reveal(&seed_commitment(&score), &check), None);
        assert_eq!(check_reveal(&seed_commitment(&score), &score[..31]), None);
    }

    #[test]
    fn a_result_payload_round_trips_to_its_values_in_name_order_and_sketches_alike() {
        let layout = vec![("b".to_string(), vec![2, 2]), ("a".to_string(), vec![3])];
        let values: Vec<f32> = (0..7).map(|i| i as f32 * 0.5 - 1.0).collect();
        let payload = result_payload(&layout, 4, &values).unwrap();
        let view = DeltaView::parse(&payload).unwrap();
        assert_eq!(view.header.base_version, 4);
        assert_eq!(flat_values(&view), values);
        let seed = [3u8; 32];
        assert_eq!(
            sketch_delta(&view, &seed, 16).unwrap(),
            crate::sketch::sketch(&seed, 16, &values).unwrap()
        );
        assert!(result_payload(&layout, 4, &values[..6]).is_err());
    }

    #[test]
    fn statements_bind_every_field_and_verify_only_under_the_signer() {
        let id = Identity::from_seed([1; 32]);
        let other = Identity::from_seed([2; 32]);
        let s = crate::sketch::sketch(&[5; 32], 16, &[1.0, -2.0, 3.0]).unwrap();
        let d = sketch_digest(1, 2, SeedPurpose::Score, &[9; 32], &s);
        assert_ne!(d, sketch_digest(1, 2, SeedPurpose::Check, &[9; 32], &s));
        assert_ne!(d, sketch_digest(1, 3, SeedPurpose::Score, &[9; 32], &s));
        let mut t = s.clone();
        t.rows[0] += 1.0;
        assert_ne!(d, sketch_digest(1, 2, SeedPurpose::Score, &[9; 32], &t));
        let sig = sign_digest(&id, &d);
        let key = |i: &Identity| crate::identity::verifying_key(&i.node_id()).unwrap();
        assert!(verify_digest(&key(&id), &d, &sig).is_ok());
        assert!(verify_digest(&key(&other), &d, &sig).is_err());
        assert_ne!(
            reduction_digest(1, 2, 3, &[4; 32]),
            reduction_digest(1, 2, 4, &[4; 32])
        );
        assert_ne!(merged_digest(1, 2, &[4; 32]), merged_digest(2, 2, &[4; 32]));
    }

    #[test]
    fn a_wire_sketch_is_refused_unless_it_has_the_rounds_shape_and_is_well_formed() {
        let s = crate::sketch::sketch(&[5; 32], 16, &[1.0, -2.0, 3.0]).unwrap();
        let w = sketch_to_wire(&s);
        assert_eq!(sketch_from_wire(Some(&w), 16, 3).unwrap(), s);
        assert_eq!(sketch_from_wire(None, 16, 3).unwrap_err().field, "sketch");
        assert_eq!(
            sketch_from_wire(Some(&w), 32, 3).unwrap_err().field,
            "sketch.rows"
        );
        assert_eq!(
            sketch_from_wire(Some(&w), 16, 4).unwrap_err().field,
            "sketch.len"
        );
        let mut nan = w.clone();
        nan.rows[1] = f64::NAN;
        assert_eq!(
            sketch_from_wire(Some(&nan), 16, 3).unwrap_err().field,
            "sketch"
        );
        let mut short = w.clone();
        short.abs_rows.pop();
        assert_eq!(
            sketch_from_wire(Some(&short), 16, 3).unwrap_err().field,
            "sketch.abs_rows"
        );
    }
}
