//! The score-weighted mean (paper §6 `merge_deltas`).

use super::{validate, Aggregator, MergeError, MergeOutcome};

/// Coordinates per block for [`WeightedMean`]: 16 KiB of `out` that stays in L1 while every
/// delta streams over it once.
pub(super) const MEAN_BLOCK: usize = 4096;

/// Score-weighted average, the paper's `merge_deltas` (paper §6; weights = composite
/// scores, DESIGN §6): `out[j] = Σᵢ wᵢ·dᵢ[j] / Σᵢ wᵢ`.
///
/// The normalised coefficients `wᵢ / Σ w` are computed in `f64` and applied in `f32`.
/// `out` is processed in L1-sized blocks; within a block the deltas are streamed one after
/// the other, four per pass, so each delta is read exactly once and `out` is written once
/// per block pass. `Σ w = 0` → [`MergeOutcome::KeepPrevious`] (DESIGN §12).
#[derive(Debug, Clone, Copy, Default)]
pub struct WeightedMean;

impl WeightedMean {
    /// `out = a·x`.
    fn scale(out: &mut [f32], x: &[f32], a: f32) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = a * x;
        }
    }

    /// `out += a·x + b·y + c·z + d·w`, element-wise; auto-vectorises (one load of `out`,
    /// four streams, one store per lane group).
    fn axpy4(out: &mut [f32], xs: [&[f32]; 4], cs: [f32; 4]) {
        const LANES: usize = 16;
        let n = out.len();
        let [x0, x1, x2, x3] = xs.map(|x| &x[..n]);
        let [c0, c1, c2, c3] = cs;
        let mut o = out.chunks_exact_mut(LANES);
        let mut it = x0
            .chunks_exact(LANES)
            .zip(x1.chunks_exact(LANES))
            .zip(x2.chunks_exact(LANES))
            .zip(x3.chunks_exact(LANES));
        for (oc, (((a, b), c), d)) in (&mut o).zip(&mut it) {
            for l in 0..LANES {
                oc[l] += c0 * a[l] + c1 * b[l] + c2 * c[l] + c3 * d[l];
            }
        }
        let done = n - o.into_remainder().len();
        for j in done..n {
            out[j] += c0 * x0[j] + c1 * x1[j] + c2 * x2[j] + c3 * x3[j];
        }
    }

    /// `out += a·x`, element-wise.
    fn axpy(out: &mut [f32], x: &[f32], a: f32) {
        const LANES: usize = 16;
        let x = &x[..out.len()];
        let mut o = out.chunks_exact_mut(LANES);
        let mut xi = x.chunks_exact(LANES);
        for (oc, xc) in (&mut o).zip(&mut xi) {
            for l in 0..LANES {
                oc[l] += a * xc[l];
            }
        }
        for (o, &x) in o.into_remainder().iter_mut().zip(xi.remainder()) {
            *o += a * x;
        }
    }
}

impl Aggregator for WeightedMean {
    fn name(&self) -> &'static str {
        "weighted_mean"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        let (used, sum) = match validate(deltas, weights, out.len())? {
            Ok(v) => v,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let coef: Vec<(&[f32], f32)> = used
            .iter()
            .map(|&i| (deltas[i], (f64::from(weights[i]) / sum) as f32))
            .collect();
        let (first, rest) = coef.split_first().expect("validate returns at least one");
        for (b, blk) in out.chunks_mut(MEAN_BLOCK).enumerate() {
            let s = b * MEAN_BLOCK;
            let e = s + blk.len();
            Self::scale(blk, &first.0[s..e], first.1);
            let mut quads = rest.chunks_exact(4);
            for q in &mut quads {
                Self::axpy4(
                    blk,
                    [&q[0].0[s..e], &q[1].0[s..e], &q[2].0[s..e], &q[3].0[s..e]],
                    [q[0].1, q[1].1, q[2].1, q[3].1],
                );
            }
            for &(d, c) in quads.remainder() {
                Self::axpy(blk, &d[s..e], c);
            }
        }
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: used.len(),
        })
    }
}
