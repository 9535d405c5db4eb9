//! Exact maximum-bottleneck ring for small `n`, for tests and benches (ours).

use super::BandwidthMatrix;

/// The largest `n` [`exact_max_bottleneck`] accepts.
pub const EXACT_MAX_NODES: usize = 12;

/// The exact maximum-bottleneck directed ring, for `n <= 12` ([`EXACT_MAX_NODES`]); `None`
/// above. Meant for tests and benches (ours), not for production use.
///
/// Returns `(bottleneck in Mbit/s, order)` with `order` a permutation of `0..n` starting at
/// node 0. Dynamic programming over subsets: `best[mask][v]` = the largest minimum edge of a
/// path from node 0 through exactly the nodes of `mask` ending at `v`; O(2^n · n²) time,
/// O(2^n · n) memory. For `n < 2` the bottleneck is `f32::INFINITY`.
pub fn exact_max_bottleneck(bw: &BandwidthMatrix) -> Option<(f32, Vec<usize>)> {
    let n = bw.n();
    if n > EXACT_MAX_NODES {
        return None;
    }
    if n < 2 {
        return Some((f32::INFINITY, (0..n).collect()));
    }
    let full = 1usize << n;
    let mut best = vec![f32::NEG_INFINITY; full * n];
    let mut parent = vec![u8::MAX; full * n];
    best[n] = f32::INFINITY; // mask = 1 (node 0), v = 0
    for mask in (1..full).step_by(2) {
        for v in 0..n {
            let cur = best[mask * n + v];
            if mask >> v & 1 == 0 || cur == f32::NEG_INFINITY {
                continue;
            }
            for u in 1..n {
                if mask >> u & 1 == 1 {
                    continue;
                }
                let val = cur.min(bw.get(v, u));
                let next = (mask | 1 << u) * n + u;
                if val > best[next] {
                    best[next] = val;
                    parent[next] = v as u8;
                }
            }
        }
    }
    let last_mask = full - 1;
    let mut end = 1;
    let mut value = f32::NEG_INFINITY;
    for v in 1..n {
        let val = best[last_mask * n + v].min(bw.get(v, 0));
        if val > value {
            value = val;
            end = v;
        }
    }
    let mut order = Vec::with_capacity(n);
    let (mut mask, mut v) = (last_mask, end);
    while v != 0 {
        order.push(v);
        let p = parent[mask * n + v] as usize;
        mask &= !(1 << v);
        v = p;
    }
    order.push(0);
    order.reverse();
    Some((value, order))
}
