//! The paper's ring construction (paper Algorithm 1, DESIGN §4): the baseline.

use serde::{Deserialize, Serialize};

use super::{region_of, BandwidthMatrix, RingBuilder};

/// Paper Algorithm 1 (§4.2), kept faithful as the baseline.
///
/// 1. Sort nodes by region label (stable, so ties keep index order; missing labels last).
/// 2. Start the ring at the first node; repeatedly append `argmax_v B(last -> v)` over the
///    unplaced nodes (ties: the earliest in region-sorted order). O(N²).
/// 3. 2-opt local search on the weakest links (DESIGN §4: not only the closing one): each
///    pass takes the weakest edge and applies the best 2-opt move that removes it (reversing
///    either side, every affected edge re-evaluated since `B` may be asymmetric), provided
///    it raises the bottleneck or removes one of several tied weakest edges. O(N) per pass;
///    at most `max_passes` passes (default `n`), so O(N²) overall.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Algorithm1 {
    /// Upper bound on 2-opt passes; `None` means `n` passes.
    pub max_passes: Option<usize>,
}

impl RingBuilder for Algorithm1 {
    fn name(&self) -> &'static str {
        "algorithm1"
    }

    fn build(&self, bw: &BandwidthMatrix, regions: &[String]) -> Vec<usize> {
        let n = bw.n();
        if n <= 2 {
            return (0..n).collect();
        }
        let mut order = greedy(bw, regions);
        two_opt(bw, &mut order, self.max_passes.unwrap_or(n));
        order
    }
}

/// Nodes `0..n` sorted by region label (stable; missing labels last).
pub(crate) fn region_sorted(n: usize, regions: &[String]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| {
        let (ra, rb) = (region_of(regions, a), region_of(regions, b));
        (ra.is_none(), ra).cmp(&(rb.is_none(), rb))
    });
    idx
}

/// Steps 1–2 of Algorithm 1: region-sorted start, then nearest (widest) neighbour.
pub(crate) fn greedy(bw: &BandwidthMatrix, regions: &[String]) -> Vec<usize> {
    let n = bw.n();
    let sorted = region_sorted(n, regions);
    if n == 0 {
        return sorted;
    }
    let mut order = Vec::with_capacity(n);
    order.push(sorted[0]);
    let mut unplaced: Vec<usize> = sorted[1..].to_vec();
    while !unplaced.is_empty() {
        let row = bw.row(*order.last().unwrap_or(&0));
        let mut best = 0;
        let mut best_w = f32::NEG_INFINITY;
        for (k, &v) in unplaced.iter().enumerate() {
            let w = row[v];
            if w > best_w {
                best_w = w;
                best = k;
            }
        }
        order.push(unplaced.remove(best));
    }
    order
}

/// Step 3 of Algorithm 1: 2-opt passes on the weakest edge. `order` is a permutation of
/// `0..bw.n()` with at least 3 nodes.
pub(crate) fn two_opt(bw: &BandwidthMatrix, order: &mut [usize], max_passes: usize) {
    let n = order.len();
    if n < 3 {
        return;
    }
    let w = |a: usize, b: usize| bw.row(a)[b];
    let mut f = vec![0.0f32; n]; // forward internal edges o[k] -> o[k+1], k < n-1
    let mut r = vec![0.0f32; n]; // reversed internal edges o[k+1] -> o[k]
    let mut pf = vec![0.0f32; n + 1]; // pf[i] = min f[0..i)
    let mut sf = vec![0.0f32; n + 1]; // sf[i] = min f[i..n-1)
    let mut pr = vec![0.0f32; n + 1];
    let mut sr = vec![0.0f32; n + 1];
    for _ in 0..max_passes {
        // Rotate so that the weakest edge is the closing edge o[n-1] -> o[0].
        let mut wk = 0;
        let mut cur = f32::INFINITY;
        for k in 0..n {
            let e = w(order[k], order[(k + 1) % n]);
            if e < cur {
                cur = e;
                wk = k;
            }
        }
        order.rotate_left((wk + 1) % n);
        let o = &*order;
        for k in 0..n - 1 {
            f[k] = w(o[k], o[k + 1]);
            r[k] = w(o[k + 1], o[k]);
        }
        pf[0] = f32::INFINITY;
        pr[0] = f32::INFINITY;
        for k in 0..n - 1 {
            pf[k + 1] = pf[k].min(f[k]);
            pr[k + 1] = pr[k].min(r[k]);
        }
        sf[n - 1] = f32::INFINITY;
        sr[n - 1] = f32::INFINITY;
        sf[n] = f32::INFINITY;
        sr[n] = f32::INFINITY;
        for k in (0..n - 1).rev() {
            sf[k] = sf[k + 1].min(f[k]);
            sr[k] = sr[k + 1].min(r[k]);
        }
        // Best move by (new bottleneck, min over touched edges); touched must beat `cur`.
        let mut best: Option<(f32, f32, usize, bool)> = None;
        let mut consider = |val: f32, touched: f32, i: usize, suffix: bool| {
            if touched > cur && best.is_none_or(|(bv, bt, _, _)| (val, touched) > (bv, bt)) {
                best = Some((val, touched, i, suffix));
            }
        };
        for i in 0..n - 1 {
            // Suffix reversal: o[0..=i] + rev(o[i+1..n]); needs a segment of >= 2 nodes.
            if i + 2 < n {
                let touched = w(o[i], o[n - 1]).min(sr[i + 1]).min(w(o[i + 1], o[0]));
                consider(touched.min(pf[i]), touched, i, true);
            }
            // Prefix reversal: rev(o[0..=i]) + o[i+1..n]; needs a segment of >= 2 nodes.
            if i >= 1 {
                let touched = pr[i].min(w(o[0], o[i + 1])).min(w(o[n - 1], o[i]));
                consider(touched.min(sf[i + 1]), touched, i, false);
            }
        }
        match best {
            Some((_, _, i, true)) => order[i + 1..].reverse(),
            Some((_, _, i, false)) => order[..=i].reverse(),
            None => break,
        }
    }
}
