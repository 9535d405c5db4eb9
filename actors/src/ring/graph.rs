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
    /// node's top-`k` out-edges and top-`k` in-edges. One row-major pass, O(n² + n·k·log).
    pub fn build(bw: &BandwidthMatrix, k: usize) -> Graph {
        let n = bw.n();
        let k = k.max(2);
        let mut edges: Vec<(u32, u32)> = Vec::new();
        if n <= k + 1 {
            for i in 0..n {
                for j in 0..n {
                    if i != j {
                        edges.push((i as u32, j as u32));
                    }
                }
            }
        } else {
            // Per-column top-k buffers (in-edges), filled while streaming rows.
            let mut in_buf: Vec<(f32, u32)> = vec![(f32::NEG_INFINITY, u32::MAX); n * k];
            let mut in_min: Vec<f32> = vec![f32::NEG_INFINITY; n];
            let mut in_min_slot: Vec<usize> = vec![0; n];
            let mut out_buf: Vec<(f32, u32)> = Vec::with_capacity(k);
            for i in 0..n {
                let row = bw.row(i);
                out_buf.clear();
                let mut out_min = f32::NEG_INFINITY;
                let mut out_min_slot = 0;
                for (j, &w) in row.iter().enumerate() {
                    if j == i {
                        continue;
                    }
                    if out_buf.len() < k {
                        out_buf.push((w, j as u32));
                        if out_buf.len() == k {
                            (out_min_slot, out_min) = min_slot(&out_buf);
                        }
                    } else if w > out_min {
                        out_buf[out_min_slot] = (w, j as u32);
                        (out_min_slot, out_min) = min_slot(&out_buf);
                    }
                    if w > in_min[j] {
                        let buf = &mut in_buf[j * k..(j + 1) * k];
                        buf[in_min_slot[j]] = (w, i as u32);
                        let (s, m) = min_slot(buf);
                        in_min_slot[j] = s;
                        in_min[j] = m;
                    }
                }
                edges.extend(out_buf.iter().map(|&(_, j)| (i as u32, j)));
            }
            for j in 0..n {
                for &(_, i) in &in_buf[j * k..(j + 1) * k] {
                    if i != u32::MAX {
                        edges.push((i, j as u32));
                    }
                }
            }
            edges.sort_unstable();
            edges.dedup();
        }
        Self::from_edges(bw, n, &edges)
    }

    fn from_edges(bw: &BandwidthMatrix, n: usize, edges: &[(u32, u32)]) -> Graph {
        let mut out_cnt = vec![0usize; n + 1];
        let mut in_cnt = vec![0usize; n + 1];
        for &(i, j) in edges {
            out_cnt[i as usize + 1] += 1;
            in_cnt[j as usize + 1] += 1;
        }
        for v in 0..n {
            out_cnt[v + 1] += out_cnt[v];
            in_cnt[v + 1] += in_cnt[v];
        }
        let m = edges.len();
        let mut out_nbr = vec![0u32; m];
        let mut in_nbr = vec![0u32; m];
        let (mut out_fill, mut in_fill) = (out_cnt.clone(), in_cnt.clone());
        for &(i, j) in edges {
            out_nbr[out_fill[i as usize]] = j;
            out_fill[i as usize] += 1;
            in_nbr[in_fill[j as usize]] = i;
            in_fill[j as usize] += 1;
        }
        for v in 0..n {
            let row = bw.row(v);
            out_nbr[out_cnt[v]..out_cnt[v + 1]]
                .sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
            in_nbr[in_cnt[v]..in_cnt[v + 1]].sort_by(|&a, &b| {
                bw.get(b as usize, v)
                    .total_cmp(&bw.get(a as usize, v))
                    .then(a.cmp(&b))
            });
        }
        let out_w = (0..n)
            .flat_map(|v| {
                out_nbr[out_cnt[v]..out_cnt[v + 1]]
                    .iter()
                    .map(move |&j| (v, j))
            })
            .map(|(v, j)| bw.get(v, j as usize))
            .collect();
        let in_w = (0..n)
            .flat_map(|v| {
                in_nbr[in_cnt[v]..in_cnt[v + 1]]
                    .iter()
                    .map(move |&i| (v, i))
            })
            .map(|(v, i)| bw.get(i as usize, v))
            .collect();
        Graph {
            n,
            out_start: out_cnt,
            out_nbr,
            out_w,
            in_start: in_cnt,
            in_nbr,
            in_w,
        }
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

fn min_slot(buf: &[(f32, u32)]) -> (usize, f32) {
    let mut s = 0;
    let mut m = f32::INFINITY;
    for (idx, &(w, _)) in buf.iter().enumerate() {
        if w < m {
            m = w;
            s = idx;
        }
    }
    (s, m)
}
