//! Sparse candidate graph for the threshold builder (ours): per node, its top-K out-links
//! and top-K in-links (which always include its best out- and in-link), as CSR adjacency
//! lists sorted by bandwidth, widest first.

use super::BandwidthMatrix;

/// Candidate edges in both directions, each list sorted by weight descending.
pub(crate) struct Graph {
    pub n: usize,
    pub out_start: Vec<usize>,
    pub out_nbr: Vec<u32>,
    pub out_w: Vec<f32>,
    pub in_start: Vec<usize>,
    pub in_nbr: Vec<u32>,
    pub in_w: Vec<f32>,
}

impl Graph {
    /// Builds the candidate graph: all edges when `n - 1 <= k`, otherwise the union of each
    /// node's top-`k` out-edges and top-`k` in-edges. One row-major pass, O(n² + n·k·log k).
    pub fn build(bw: &BandwidthMatrix, k: usize) -> Graph {
        let n = bw.n();
        let k = k.max(2);
        let edges = if n <= k + 1 {
            let mut edges = Vec::with_capacity(n * n);
            for i in 0..n {
                let row = bw.row(i);
                for (j, &w) in row.iter().enumerate() {
                    if i != j {
                        edges.push((i as u32, j as u32, w));
                    }
                }
            }
            edges
        } else {
            top_k_edges(bw, k, |_, _| true)
        };
        Self::from_edges(n, edges)
    }

    /// The graph on `n` nodes with the given `(from, to, weight)` edges (duplicates merged).
    pub fn from_edges(n: usize, mut edges: Vec<(u32, u32, f32)>) -> Graph {
        edges.sort_unstable_by_key(|&(i, j, _)| (i, j));
        edges.dedup_by_key(|&mut (i, j, _)| (i, j));
        // Out lists: already grouped by source; sort each group by weight descending.
        let mut out_start = vec![0usize; n + 1];
        let mut in_start = vec![0usize; n + 1];
        for &(i, j, _) in &edges {
            out_start[i as usize + 1] += 1;
            in_start[j as usize + 1] += 1;
        }
        for v in 0..n {
            out_start[v + 1] += out_start[v];
            in_start[v + 1] += in_start[v];
        }
        let by_weight = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        let mut out: Vec<(u32, f32)> = edges.iter().map(|&(_, j, w)| (j, w)).collect();
        let mut inn: Vec<(u32, f32)> = vec![(0, 0.0); edges.len()];
        let mut fill = in_start.clone();
        for &(i, j, w) in &edges {
            inn[fill[j as usize]] = (i, w);
            fill[j as usize] += 1;
        }
        for v in 0..n {
            out[out_start[v]..out_start[v + 1]].sort_unstable_by(by_weight);
            inn[in_start[v]..in_start[v + 1]].sort_unstable_by(by_weight);
        }
        Graph {
            n,
            out_start,
            out_nbr: out.iter().map(|e| e.0).collect(),
            out_w: out.iter().map(|e| e.1).collect(),
            in_start,
            in_nbr: inn.iter().map(|e| e.0).collect(),
            in_w: inn.iter().map(|e| e.1).collect(),
        }
    }

    /// Strongly connected components of the edges with weight `> t` (Kosaraju, iterative):
    /// `(count, component of each node)`.
    pub fn scc_above(&self, t: f32) -> (usize, Vec<u32>) {
        let n = self.n;
        let above = |w: &[f32]| w.partition_point(|&x| x > t);
        let mut seen = vec![false; n];
        let mut finish = Vec::with_capacity(n);
        let mut stack: Vec<(usize, usize)> = Vec::new();
        for s in 0..n {
            if seen[s] {
                continue;
            }
            seen[s] = true;
            stack.push((s, 0));
            while let Some(&mut (v, ref mut idx)) = stack.last_mut() {
                let (a, b) = (self.out_start[v], self.out_start[v + 1]);
                let deg = above(&self.out_w[a..b]);
                if *idx < deg {
                    let u = self.out_nbr[a + *idx] as usize;
                    *idx += 1;
                    if !seen[u] {
                        seen[u] = true;
                        stack.push((u, 0));
                    }
                } else {
                    finish.push(v);
                    stack.pop();
                }
            }
        }
        let mut comp = vec![u32::MAX; n];
        let mut count = 0u32;
        let mut queue = Vec::new();
        for &s in finish.iter().rev() {
            if comp[s] != u32::MAX {
                continue;
            }
            comp[s] = count;
            queue.clear();
            queue.push(s);
            while let Some(v) = queue.pop() {
                let (a, b) = (self.in_start[v], self.in_start[v + 1]);
                let deg = above(&self.in_w[a..b]);
                for &u in &self.in_nbr[a..a + deg] {
                    if comp[u as usize] == u32::MAX {
                        comp[u as usize] = count;
                        queue.push(u as usize);
                    }
                }
            }
            count += 1;
        }
        (count as usize, comp)
    }

    /// All edges as `(from, to, weight)`.
    pub fn edges(&self) -> Vec<(u32, u32, f32)> {
        let mut e = Vec::with_capacity(self.out_nbr.len());
        for v in 0..self.n {
            for x in self.out_start[v]..self.out_start[v + 1] {
                e.push((v as u32, self.out_nbr[x], self.out_w[x]));
            }
        }
        e
    }

    /// Out-neighbours of `v` whose link is `>= t` (a prefix of the sorted list).
    #[inline]
    pub fn out_at_least(&self, v: usize, t: f32) -> &[u32] {
        let (s, e) = (self.out_start[v], self.out_start[v + 1]);
        let cnt = self.out_w[s..e].partition_point(|&w| w >= t);
        &self.out_nbr[s..s + cnt]
    }

    /// In-neighbours of `v` whose link is `>= t` (a prefix of the sorted list).
    #[inline]
    pub fn in_at_least(&self, v: usize, t: f32) -> &[u32] {
        let (s, e) = (self.in_start[v], self.in_start[v + 1]);
        let cnt = self.in_w[s..e].partition_point(|&w| w >= t);
        &self.in_nbr[s..s + cnt]
    }

    /// The widest out-link of `v` (`-inf` when none).
    pub fn best_out(&self, v: usize) -> f32 {
        let s = self.out_start[v];
        if s < self.out_start[v + 1] {
            self.out_w[s]
        } else {
            f32::NEG_INFINITY
        }
    }

    /// The widest in-link of `v` (`-inf` when none).
    pub fn best_in(&self, v: usize) -> f32 {
        let s = self.in_start[v];
        if s < self.in_start[v + 1] {
            self.in_w[s]
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// For every node, its `k` widest out-edges and `k` widest in-edges among the pairs
/// `(i, j)`, `i != j`, accepted by `keep`; one row-major pass over the matrix with a
/// bounded min-heap per node.
pub(crate) fn top_k_edges(
    bw: &BandwidthMatrix,
    k: usize,
    keep: impl Fn(usize, usize) -> bool,
) -> Vec<(u32, u32, f32)> {
    let n = bw.n();
    let mut in_heap: Vec<(f32, u32)> = vec![(0.0, 0); n * k];
    let mut in_len: Vec<usize> = vec![0; n];
    let mut in_min: Vec<f32> = vec![f32::NEG_INFINITY; n];
    let mut out_heap: Vec<(f32, u32)> = vec![(0.0, 0); k];
    let mut edges = Vec::with_capacity(2 * n * k);
    for i in 0..n {
        let row = bw.row(i);
        let mut out_len = 0;
        let mut out_min = f32::NEG_INFINITY;
        for (j, &w) in row.iter().enumerate() {
            if w > out_min.min(in_min[j]) && j != i && keep(i, j) {
                if w > out_min {
                    out_min = heap_offer(&mut out_heap, &mut out_len, (w, j as u32));
                }
                if w > in_min[j] {
                    in_min[j] = heap_offer(
                        &mut in_heap[j * k..(j + 1) * k],
                        &mut in_len[j],
                        (w, i as u32),
                    );
                }
            }
        }
        edges.extend(out_heap[..out_len].iter().map(|&(w, j)| (i as u32, j, w)));
    }
    for j in 0..n {
        edges.extend(
            in_heap[j * k..j * k + in_len[j]]
                .iter()
                .map(|&(w, i)| (i, j as u32, w)),
        );
    }
    edges
}

/// Offers `item` to the bounded min-heap `heap[..len]` (capacity `heap.len()`); returns the
/// weight an item must exceed to enter (`-inf` while not full).
fn heap_offer(heap: &mut [(f32, u32)], len: &mut usize, item: (f32, u32)) -> f32 {
    let cap = heap.len();
    if *len < cap {
        let mut c = *len;
        heap[c] = item;
        *len += 1;
        while c > 0 {
            let p = (c - 1) / 2;
            if heap[c].0 < heap[p].0 {
                heap.swap(c, p);
                c = p;
            } else {
                break;
            }
        }
        return if *len == cap {
            heap[0].0
        } else {
            f32::NEG_INFINITY
        };
    }
    if item.0 <= heap[0].0 {
        return heap[0].0;
    }
    heap[0] = item;
    let mut p = 0;
    loop {
        let (l, r) = (2 * p + 1, 2 * p + 2);
        let mut m = p;
        if l < cap && heap[l].0 < heap[m].0 {
            m = l;
        }
        if r < cap && heap[r].0 < heap[m].0 {
            m = r;
        }
        if m == p {
            break;
        }
        heap.swap(p, m);
        p = m;
    }
    heap[0].0
}
