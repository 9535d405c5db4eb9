//! `hanzod delta inspect`: what a delta file holds and whether it passes the format check
//! (DESIGN §6), as a report for people (`Display`) or scripts (serde).

use serde::Serialize;

use hanzod_protocol::hzdl::{payload_hash, DeltaView};
use hanzod_protocol::model::check_layout;
use hanzod_protocol::model::ModelSpec;

/// One tensor of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorReport {
    /// Name.
    pub name: String,
    /// Element type (the header's).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// L2 norm of its values (f64 accumulation).
    pub l2_norm: f64,
}

/// What `inspect` found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InspectReport {
    /// File size, bytes.
    pub bytes: u64,
    /// SHA-256 of the whole file (the delta hash), hex.
    pub sha256: String,
    /// Header fields, when the header parsed.
    pub header: Option<HeaderReport>,
    /// Tensors, when the body parsed.
    pub tensors: Vec<TensorReport>,
    /// L2 norm over every tensor.
    pub total_l2_norm: Option<f64>,
    /// The model the delta was checked against, if any.
    pub model: Option<String>,
    /// True when the format check passed.
    pub valid: bool,
    /// Why not, when it did not (the typed error's message).
    pub error: Option<String>,
}

/// The 24-byte header, as reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeaderReport {
    /// Format version.
    pub version: u16,
    /// Element type of every tensor.
    pub dtype: String,
    /// `full` or `lora`.
    pub kind: String,
    /// Checkpoint version the delta was computed against.
    pub base_version: u64,
    /// Body length, bytes.
    pub body_len: u64,
}

/// Parses `bytes`, checks every value is finite and, with `spec`, that names, shapes,
/// dtype and kind match the model. Never panics; a malformed file gives `valid: false` and
/// the precise error. The hash and the finite check are one pass over the bytes
/// ([`DeltaView::hash_and_check_finite`]), the norms a second.
pub fn inspect(bytes: &[u8], spec: Option<&ModelSpec>) -> InspectReport {
    let mut report = InspectReport {
        bytes: bytes.len() as u64,
        sha256: String::new(),
        header: None,
        tensors: Vec::new(),
        total_l2_norm: None,
        model: spec.map(|s| s.name.clone()),
        valid: false,
        error: None,
    };
    let view = match DeltaView::parse(bytes) {
        Ok(v) => v,
        Err(e) => {
            report.sha256 = hex::encode(payload_hash(bytes));
            report.error = Some(e.to_string());
            return report;
        }
    };
    let (sha256, finite) = view.hash_and_check_finite(bytes);
    report.sha256 = hex::encode(sha256);
    let h = view.header;
    report.header = Some(HeaderReport {
        version: h.version,
        dtype: h.dtype.to_string(),
        kind: h.kind.to_string(),
        base_version: h.base_version,
        body_len: h.body_len,
    });
    report.tensors = view
        .tensors
        .iter()
        .map(|t| TensorReport {
            name: t.name.clone(),
            dtype: h.dtype.to_string(),
            shape: t.shape.clone(),
            l2_norm: view.l2_norm(t),
        })
        .collect();
    // `DeltaView::total_l2_norm` from the norms just computed (same sum, same order).
    report.total_l2_norm = Some(
        report
            .tensors
            .iter()
            .map(|t| t.l2_norm.powi(2))
            .sum::<f64>()
            .sqrt(),
    );
    // `check_against`'s order: the layout against the model, then the values.
    let verdict = match spec {
        Some(spec) => check_layout(&view, spec).and(finite),
        None => finite,
    };
    match verdict {
        Ok(()) => report.valid = true,
        Err(e) => report.error = Some(e.to_string()),
    }
    report
}

impl std::fmt::Display for InspectReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} bytes, sha256 {}", self.bytes, self.sha256)?;
        if let Some(h) = &self.header {
            writeln!(
                f,
                "HZDL v{}: {} {} delta, base version {} ({}), body {} bytes",
                h.version,
                h.kind,
                h.dtype,
                h.base_version,
                match h.base_version {
                    0 => "epoch 0: trained from the job's start".to_string(),
                    v => format!("trained from the checkpoint published for epoch {}", v - 1),
                },
                h.body_len
            )?;
        }
        if !self.tensors.is_empty() {
            let width = self
                .tensors
                .iter()
                .map(|t| t.name.len())
                .max()
                .unwrap_or(0)
                .max("TENSOR".len());
            writeln!(
                f,
                "{:<width$}  {:<5} {:<20} {:>14}",
                "TENSOR", "DTYPE", "SHAPE", "L2 NORM"
            )?;
            for t in &self.tensors {
                writeln!(
                    f,
                    "{:<width$}  {:<5} {:<20} {:>14.6}",
                    t.name,
                    t.dtype,
                    format!("{:?}", t.shape),
                    t.l2_norm + 0.0
                )?;
            }
        }
        if let Some(n) = self.total_l2_norm {
            let count = self.tensors.len();
            let noun = if count == 1 { "tensor" } else { "tensors" };
            // `+ 0.0` prints a negative zero (an empty sum) as 0.
            writeln!(f, "{count} {noun}, total L2 norm {:.6}", n + 0.0)?;
        }
        let against = self
            .model
            .as_ref()
            .map(|m| format!(" against {m}"))
            .unwrap_or_default();
        match &self.error {
            None => write!(f, "valid{against}"),
            Some(e) => write!(f, "INVALID{against}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/deltas")
            .join(name);
        std::fs::read(p).expect("fixture")
    }

    #[test]
    fn reports_the_fixtures() {
        let ok = inspect(&fixture("tiny_f32.hzdl"), None);
        assert!(ok.valid, "{ok}");
        assert_eq!(ok.header.as_ref().unwrap().base_version, 7);
        let names: Vec<_> = ok.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a.weight", "b.bias"]);
        // b.bias = [1, 2, -2, 0.25]: its norm, computed here.
        let want = (1.0f64 + 4.0 + 4.0 + 0.0625).sqrt();
        assert!((ok.tensors[1].l2_norm - want).abs() < 1e-9);
        let nan = inspect(&fixture("tiny_nan_f32.hzdl"), None);
        assert!(!nan.valid);
        assert!(nan.error.as_ref().unwrap().contains("b.bias"), "{nan}");
        let magic = inspect(&fixture("tiny_bad_magic.hzdl"), None);
        assert!(!magic.valid && magic.header.is_none(), "{magic}");
        assert!(!inspect(&fixture("tiny_truncated.hzdl"), None).valid);
        assert!(!inspect(&[], None).valid);
    }

    #[test]
    fn hash_and_norms_are_the_multi_pass_ones() {
        for name in ["tiny_f32.hzdl", "tiny_nan_f32.hzdl", "tiny_bad_magic.hzdl"] {
            let bytes = fixture(name);
            let r = inspect(&bytes, None);
            assert_eq!(r.sha256, hex::encode(payload_hash(&bytes)), "{name}");
            // Bits: the NaN fixture's norm is NaN.
            let total = DeltaView::parse(&bytes)
                .ok()
                .map(|v| v.total_l2_norm().to_bits());
            assert_eq!(r.total_l2_norm.map(f64::to_bits), total, "{name}");
        }
    }
}
