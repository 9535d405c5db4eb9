//! Copies and free-riders among an epoch's accepted deltas in star mode (issue 19 item 3):
//! pure, deterministic, no I/O. Ring mode has the same rules on sketches
//! ([`crate::sketch_score`], rules 1 and 3).
//!
//! # The rules, in order
//!
//! Each delta is flagged by the first rule it meets; every rule flags **every member** of
//! what it finds, never "the later one": in star mode a delta's bytes are private to its
//! node and the orchestrator until the epoch is published, so two nodes with the same (or
//! almost the same) update have shared it, and the orchestrator cannot tell the original
//! from the copy. Flagging both gives colluders nothing to gain by copying; the price is
//! that a node which spends a full local run reproducing another's (deterministic, seeds
//! public) delta can make both lose that epoch's reward, at its own full cost.
//!
//! 1. **Duplicate** ([`Copying::Duplicate`]): the same delta hash as another node's.
//! 2. **No update** ([`Copying::NoUpdate`]): `‖δ‖ = 0`, or `‖δ‖ ≤ lazy_ratio · median ‖δ‖`
//!    over the epoch's deltas (a lazy node that trained nothing, or almost nothing).
//! 3. **The last merged update re-uploaded** ([`Copying::CopiesLastMerged`]): cosine with
//!    the previous epoch's merged update (which anyone can derive from the two public
//!    checkpoints) at least `copy_cosine`: the free-rider's cheapest "update", rescaled
//!    or with small noise.
//! 4. **Near copy** ([`Copying::NearCopy`]): the cosine of two deltas' *residuals* at least
//!    `copy_cosine`, the residual being the delta without its component along the last
//!    merged update (`r = δ − (δ·û) û`, `û` the unit last merged update), so that honest
//!    nodes whose updates share the common descent direction are not taken for copies: what
//!    is left is what each node's own batches taught it. With `copy_cosine` = 0.995, a copy
//!    rescaled by any factor, or with added noise up to about 10 % of its norm
//!    (`1 − cos ≈ ε²/2`), is caught.
//!
//! Rules 3 and 4 judge similarity against the epoch: when the median delta is as close to
//! the last merged update as a re-upload (rule 3), or the median pair of residuals as close
//! as a copy (rule 4), over 3 or more deltas, every node trained alike (a recipe whose
//! batches are most of the data, as `config/job.example.toml`'s 1,024 of 1,279 samples:
//! honest residual cosines of 1.0000), and the rule is not applied that epoch: it would
//! reject every honest node and cannot tell a copy from honest work. Copying is a
//! minority's act; a copying majority is the epoch's consensus, which no rule here can
//! overrule. Such an epoch's copies are caught only by a spot-check's replay.
//!
//! # Consequences (the sink)
//!
//! A flagged delta is rejected ([`crate::validate::Rejection`]): no weight in the merge, no
//! reward. None of the four rules slashes: a duplicate does not prove which node copied;
//! the cosine rules are thresholds on floats, not a recomputable proof (the last merged
//! update can be derived from the checkpoints only up to f32 rounding); and an empty update
//! harms nobody but its node. Slashing stays with the spot-check, whose evidence anyone
//! can replay (DESIGN §6).

use hanzod_actors::types::NodeId;
use serde::{Deserialize, Serialize};

/// Thresholds of the rules (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CopyConfig {
    /// Cosine at or above which two residuals, or a delta and the last merged update, are
    /// the same update (default 0.995, as ring mode's `copy_cosine`).
    pub copy_cosine: f64,
    /// A delta whose norm is at most this fraction of the epoch's median norm is no update
    /// (default 1e-3).
    pub lazy_ratio: f64,
}

impl Default for CopyConfig {
    fn default() -> Self {
        CopyConfig {
            copy_cosine: 0.995,
            lazy_ratio: 1e-3,
        }
    }
}

/// What a delta was found to be (module docs, rules 1–4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Copying {
    /// Rule 1: the same bytes (delta hash) as `of`'s delta.
    Duplicate {
        /// Another node of the group (the smallest id other than this one).
        of: NodeId,
    },
    /// Rule 2: no update (zero, or a vanishing fraction of the epoch's median norm).
    NoUpdate,
    /// Rule 3: the previous epoch's merged update, uploaded as its own.
    CopiesLastMerged {
        /// Cosine with the last merged update.
        cosine: f64,
    },
    /// Rule 4: the same update as `of`'s once the common direction is removed.
    NearCopy {
        /// The node whose residual is closest (highest cosine; ties by smaller id).
        of: NodeId,
        /// That cosine.
        cosine: f64,
    },
}

impl std::fmt::Display for Copying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Copying::Duplicate { of } => write!(f, "the same bytes as {}'s delta", of.short()),
            Copying::NoUpdate => f.write_str("no update (zero, or next to nothing)"),
            Copying::CopiesLastMerged { cosine } => {
                write!(f, "the last merged update re-uploaded (cosine {cosine:.4})")
            }
            Copying::NearCopy { of, cosine } => write!(
                f,
                "a copy of {}'s delta (cosine {cosine:.4} without the common direction)",
                of.short()
            ),
        }
    }
}

/// One accepted delta: its node, its hash and its values (flattened, any layout, all the
/// same length).
#[derive(Debug, Clone, Copy)]
pub struct CopyInput<'a> {
    /// The node.
    pub node: NodeId,
    /// SHA-256 of its payload.
    pub hash: [u8; 32],
    /// The delta.
    pub delta: &'a [f32],
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

fn cosine(ab: f64, aa: f64, bb: f64) -> f64 {
    if aa > 0.0 && bb > 0.0 {
        ab / (aa.sqrt() * bb.sqrt())
    } else {
        0.0
    }
}

/// The rules of the module docs over `inputs`: one verdict per input (None: none
/// applies), in input order. `last_merged` is the previous epoch's merged update in the
/// deltas' layout (None in a job's first epoch, or when the layouts differ: rules 3 and 4
/// then use no common direction). Deltas of another length than the first, or not finite,
/// are left to the other checks (None here). Permutation-equivariant: the verdicts do not
/// depend on the order of `inputs`. Cost: `O(n² · len)` for `n` deltas of `len` values.
pub fn find_copies(
    inputs: &[CopyInput<'_>],
    last_merged: Option<&[f32]>,
    cfg: &CopyConfig,
) -> Vec<Option<Copying>> {
    let n = inputs.len();
    let mut out: Vec<Option<Copying>> = vec![None; n];
    let Some(len) = inputs.first().map(|i| i.delta.len()) else {
        return out;
    };
    let usable: Vec<bool> = inputs
        .iter()
        .map(|i| i.delta.len() == len && i.delta.iter().all(|x| x.is_finite()))
        .collect();
    // Rule 1: shared hashes.
    for i in 0..n {
        let of = (0..n)
            .filter(|&j| j != i && inputs[j].hash == inputs[i].hash)
            .map(|j| inputs[j].node)
            .filter(|o| *o != inputs[i].node)
            .min();
        if let Some(of) = of {
            out[i] = Some(Copying::Duplicate { of });
        }
    }
    // Rule 2: no update, against the median norm of the usable deltas.
    let sq: Vec<f64> = inputs
        .iter()
        .zip(&usable)
        .map(|(i, &u)| if u { dot(i.delta, i.delta) } else { 0.0 })
        .collect();
    let mut norms: Vec<f64> = (0..n)
        .filter(|&i| usable[i])
        .map(|i| sq[i].sqrt())
        .collect();
    norms.sort_by(f64::total_cmp);
    let median = match norms.len() {
        0 => 0.0,
        k => (norms[(k - 1) / 2] + norms[k / 2]) / 2.0,
    };
    for i in 0..n {
        if !usable[i] || out[i].is_some() {
            continue;
        }
        let norm = sq[i].sqrt();
        if norm == 0.0 || norm <= cfg.lazy_ratio * median {
            out[i] = Some(Copying::NoUpdate);
        }
    }
    // Rule 3: the last merged update.
    let last = last_merged.filter(|l| l.len() == len && l.iter().all(|x| x.is_finite()));
    let last_sq = last.map_or(0.0, |l| dot(l, l));
    let along: Vec<f64> = inputs
        .iter()
        .zip(&usable)
        .map(|(i, &u)| match last {
            Some(l) if u => dot(i.delta, l),
            _ => 0.0,
        })
        .collect();
    if last_sq > 0.0 {
        let with_last: Vec<(usize, f64)> = (0..n)
            .filter(|&i| usable[i] && out[i].is_none())
            .map(|i| (i, cosine(along[i], sq[i], last_sq)))
            .collect();
        // An epoch that goes on as the last one went (most deltas along it) is descending,
        // not re-uploading: the rule says nothing there.
        let cosines: Vec<f64> = with_last.iter().map(|(_, c)| *c).collect();
        if !all_alike(&cosines, with_last.len(), cfg.copy_cosine) {
            for (i, c) in with_last {
                if c >= cfg.copy_cosine {
                    out[i] = Some(Copying::CopiesLastMerged { cosine: c });
                }
            }
        }
    }
    // Rule 4: residual cosines among the deltas no earlier rule flagged.
    let open: Vec<usize> = (0..n).filter(|&i| usable[i] && out[i].is_none()).collect();
    // r_i · r_j = δ_i·δ_j − (δ_i·l)(δ_j·l)/‖l‖², and ‖r_i‖² likewise.
    let proj = |i: usize, j: usize| {
        if last_sq > 0.0 {
            along[i] * along[j] / last_sq
        } else {
            0.0
        }
    };
    let res_sq: Vec<f64> = (0..n).map(|i| (sq[i] - proj(i, i)).max(0.0)).collect();
    let mut pairs: Vec<(usize, usize, f64)> = Vec::new();
    for (a, &i) in open.iter().enumerate() {
        for &j in &open[a + 1..] {
            let c = cosine(
                dot(inputs[i].delta, inputs[j].delta) - proj(i, j),
                res_sq[i],
                res_sq[j],
            );
            pairs.push((i, j, c));
        }
    }
    // Every node trained alike (a recipe whose batches are most of the data): similarity is
    // no evidence of copying, and the rule would reject every honest node.
    let cosines: Vec<f64> = pairs.iter().map(|(.., c)| *c).collect();
    if all_alike(&cosines, open.len(), cfg.copy_cosine) {
        pairs.clear();
    }
    let mut best: Vec<Option<(NodeId, f64)>> = vec![None; n];
    for (i, j, c) in pairs {
        if c < cfg.copy_cosine {
            continue;
        }
        for (me, other) in [(i, j), (j, i)] {
            let candidate = (inputs[other].node, c);
            let better = match best[me] {
                None => true,
                Some((node, bc)) => c > bc || (c == bc && candidate.0 < node),
            };
            if better {
                best[me] = Some(candidate);
            }
        }
    }
    for i in open {
        if let Some((of, cosine)) = best[i] {
            out[i] = Some(Copying::NearCopy { of, cosine });
        }
    }
    out
}

/// Whether an epoch's similarities (`cosines`, over `deltas` deltas) say that its nodes all
/// trained alike rather than that some copied: at least [`ALIKE_MIN_DELTAS`] deltas and the
/// median of `cosines` at or above `threshold`. Copies are a minority's act; when the
/// typical pair (or the typical delta against the last merged update) is as similar as a
/// copy, the rules that measure similarity cannot tell a copy from honest work, and are not
/// applied (rules 1 and 2 still are).
fn all_alike(cosines: &[f64], deltas: usize, threshold: f64) -> bool {
    if deltas < ALIKE_MIN_DELTAS || cosines.is_empty() {
        return false;
    }
    let mut sorted = cosines.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[(sorted.len() - 1) / 2] >= threshold
}

/// Fewest deltas for which an epoch can be judged to have trained alike (module docs): with
/// two, a pair of copies and two honest nodes that trained alike look the same, and the
/// rules apply as for copies.
pub const ALIKE_MIN_DELTAS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    fn node(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    fn hash(i: u8) -> [u8; 32] {
        [i; 32]
    }

    /// `n` independent honest-looking deltas sharing a common direction `shared` of weight
    /// `common` (trained alike), from `seed`.
    fn honest(n: usize, len: usize, common: f32, seed: u64) -> (Vec<Vec<f32>>, Vec<f32>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let shared: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let deltas = (0..n)
            .map(|_| {
                shared
                    .iter()
                    .map(|s| common * s + rng.gen_range(-1.0f32..1.0))
                    .collect()
            })
            .collect();
        (deltas, shared)
    }

    fn inputs(d: &[Vec<f32>]) -> Vec<CopyInput<'_>> {
        d.iter()
            .enumerate()
            .map(|(i, v)| CopyInput {
                node: node(i as u8),
                hash: hash(i as u8),
                delta: v,
            })
            .collect()
    }

    #[test]
    fn each_kind_of_copy_is_found_and_honest_nodes_that_trained_alike_are_not() {
        // Five honest deltas dominated by the common direction (cosine ≈ 0.9 between any
        // two), the last merged update being that direction.
        let (mut d, shared) = honest(5, 4096, 3.0, 7);
        let plain = find_copies(&inputs(&d), Some(&shared), &CopyConfig::default());
        assert!(plain.iter().all(Option::is_none), "{plain:?}");
        // 5: a rescaled copy of 0 with 5 % noise; 6: the last merged update ×0.8; 7: zero.
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let copy: Vec<f32> = d[0]
            .iter()
            .map(|x| 1.7 * x + 0.02 * rng.gen_range(-1.0f32..1.0))
            .collect();
        d.push(copy);
        d.push(shared.iter().map(|x| 0.8 * x).collect());
        d.push(vec![0.0; 4096]);
        let mut ins = inputs(&d);
        // 8: node 3's exact bytes under its own key.
        ins.push(CopyInput {
            node: node(8),
            hash: hash(3),
            delta: &d[3],
        });
        let v = find_copies(&ins, Some(&shared), &CopyConfig::default());
        assert_eq!(v[1], None);
        assert_eq!(v[2], None);
        assert_eq!(v[4], None);
        assert!(
            matches!(v[0], Some(Copying::NearCopy { of, .. }) if of == node(5)),
            "{:?}",
            v[0]
        );
        assert!(matches!(v[5], Some(Copying::NearCopy { of, .. }) if of == node(0)));
        assert!(matches!(v[6], Some(Copying::CopiesLastMerged { cosine }) if cosine > 0.999));
        assert_eq!(v[7], Some(Copying::NoUpdate));
        assert_eq!(v[3], Some(Copying::Duplicate { of: node(8) }));
        assert_eq!(v[8], Some(Copying::Duplicate { of: node(3) }));
        // The honest ones are alike (cosine ≈ 0.9) in the common direction, not beyond it.
        let c = cosine(dot(&d[1], &d[2]), dot(&d[1], &d[1]), dot(&d[2], &d[2]));
        assert!(c > 0.85, "{c}");
    }

    #[test]
    fn a_lazy_delta_is_no_update_and_odd_inputs_are_left_to_other_checks() {
        let (mut d, _) = honest(4, 256, 0.0, 9);
        d.push(d[1].iter().map(|x| x * 1e-4).collect());
        d.push(vec![f32::NAN; 256]);
        d.push(vec![1.0; 3]);
        let v = find_copies(&inputs(&d), None, &CopyConfig::default());
        assert_eq!(v[4], Some(Copying::NoUpdate));
        assert_eq!((v[5].clone(), v[6].clone()), (None, None));
        assert!(find_copies(&[], None, &CopyConfig::default()).is_empty());
    }

    /// Every node trained alike (most of the data in every batch): honest residual cosines
    /// of 0.9999+ are no evidence, and neither rule 3 nor rule 4 rejects anyone; shared bytes
    /// still are duplicates; two deltas alone are judged as copies.
    #[test]
    fn an_epoch_whose_nodes_all_trained_alike_is_not_taken_for_copies() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let common: Vec<f32> = (0..2048).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let last: Vec<f32> = (0..2048).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let alike = |rng: &mut rand::rngs::StdRng, base: &[f32]| -> Vec<f32> {
            base.iter()
                .map(|x| x + 1e-3 * rng.gen_range(-1.0f32..1.0))
                .collect()
        };
        let mut d: Vec<Vec<f32>> = (0..5).map(|_| alike(&mut rng, &common)).collect();
        // Alike beyond the last merged update too: residual cosines ≈ 1.
        let r = |i: usize, j: usize| {
            let l = dot(&last, &last);
            let p = |k: usize| dot(&d[k], &last);
            cosine(
                dot(&d[i], &d[j]) - p(i) * p(j) / l,
                dot(&d[i], &d[i]) - p(i) * p(i) / l,
                dot(&d[j], &d[j]) - p(j) * p(j) / l,
            )
        };
        assert!(r(0, 1) > 0.9999, "{}", r(0, 1));
        let v = find_copies(&inputs(&d), Some(&last), &CopyConfig::default());
        assert!(v.iter().all(Option::is_none), "{v:?}");
        // A descent that continues the last update: every delta along it, none a re-upload.
        let along: Vec<Vec<f32>> = (0..4).map(|_| alike(&mut rng, &last)).collect();
        let v = find_copies(&inputs(&along), Some(&last), &CopyConfig::default());
        assert!(v.iter().all(Option::is_none), "{v:?}");
        // The same bytes under two keys are still duplicates.
        let mut ins = inputs(&d);
        ins.push(CopyInput {
            node: node(9),
            hash: hash(2),
            delta: &d[2],
        });
        let v = find_copies(&ins, Some(&last), &CopyConfig::default());
        assert_eq!(v[2], Some(Copying::Duplicate { of: node(9) }));
        assert!(v[..2].iter().all(Option::is_none), "{v:?}");
        // Two deltas alone: a pair of copies and two alike honest nodes look the same, and
        // are taken for copies.
        d.truncate(2);
        let v = find_copies(&inputs(&d), Some(&last), &CopyConfig::default());
        assert!(
            v.iter()
                .all(|c| matches!(c, Some(Copying::NearCopy { .. }))),
            "{v:?}"
        );
        assert_eq!(ALIKE_MIN_DELTAS, 3);
    }

    proptest! {
        /// Reordering the inputs reorders the verdicts and changes nothing else.
        #[test]
        fn verdicts_do_not_depend_on_the_order(
            seed in any::<u64>(),
            n in 4usize..8,
            copies in proptest::collection::vec((0usize..7, 0usize..7, 0.5f32..2.0), 0..3),
            rotate in 0usize..7,
        ) {
            let (mut d, shared) = honest(n, 64, 1.0, seed);
            for (from, _, scale) in &copies {
                let src = d[from % n].clone();
                d.push(src.iter().map(|x| x * scale).collect());
            }
            let ins = inputs(&d);
            let v = find_copies(&ins, Some(&shared), &CopyConfig::default());
            let k = rotate % ins.len();
            let mut moved = ins.clone();
            moved.rotate_left(k);
            let mut w = find_copies(&moved, Some(&shared), &CopyConfig::default());
            w.rotate_right(k);
            for (a, b) in v.iter().zip(&w) {
                match (a, b) {
                    (Some(Copying::NearCopy { of: x, cosine: c }), Some(Copying::NearCopy { of: y, cosine: e })) => {
                        prop_assert!((c - e).abs() < 1e-9);
                        prop_assert!(x == y || (c - e).abs() < 1e-9);
                    }
                    (Some(Copying::CopiesLastMerged { cosine: c }), Some(Copying::CopiesLastMerged { cosine: e })) => {
                        prop_assert!((c - e).abs() < 1e-9);
                    }
                    _ => prop_assert_eq!(a, b),
                }
            }
            // Every scaled copy is flagged, with its source.
            for (k, _) in copies.iter().enumerate() {
                prop_assert!(v[n + k].is_some(), "copy {} not flagged: {:?}", k, v);
            }
        }
    }
}
