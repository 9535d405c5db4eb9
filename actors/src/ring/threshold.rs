//! The default ring builder: bottleneck-threshold search (ours, DESIGN §4).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::algorithm1::{greedy, Algorithm1};
use super::graph::{top_k_edges, Graph};
use super::{bottleneck, BandwidthMatrix, RingBuilder};

const NONE: u32 = u32::MAX;

/// The default ring builder (ours, DESIGN §4): maximises the bottleneck by searching over
/// thresholds.
///
/// A ring's bottleneck is at least `T` Mbit/s exactly when the subgraph of links `>= T` has
/// a directed Hamiltonian cycle. The builder
///
/// 1. starts from [`Algorithm1`]'s ring (or, with `compare_algorithm1 = false`, from its
///    greedy stage), so the result is never worse than that ring;
/// 2. works on a candidate graph: each node's `candidates` (K) widest out-links and widest
///    in-links (all links when `n <= K + 1`). If the candidate links above the starting
///    bottleneck are not strongly connected (e.g. clusters whose top-K lists never leave
///    the cluster), each node's K/4 widest links across that cut are added;
/// 3. binary searches the distinct candidate link values `T` above the starting bottleneck
///    and at most `min_v min(best out-link, best in-link)`. A test at `T` first checks
///    necessary conditions (strong connectivity; a perfect out→in bipartite matching,
///    Hopcroft–Karp), then looks for a Hamiltonian cycle: the matching's cycle cover is
///    merged by successor swaps `a→b'`, `b→a'` (Karp–Steele patching), what cannot be
///    merged is joined by the best swaps available, and links below `T` are repaired by
///    direction-preserving 3-opt segment exchanges (Or-opt is a special case) and 2-opt
///    moves whose reversal does not add weak links. This is repeated with `restarts`
///    seeded random matchings and from the best ring so far; for `n <= search_max_nodes`
///    a depth-first search of `search_budget` extensions follows (exhaustive, hence exact,
///    for small `n`). The search stops once the best ring is within `tolerance` of the
///    smallest threshold not yet ruled out.
///
/// Deterministic for a given configuration. Cost: O(n²) to read the matrix (candidate
/// selection, and Algorithm 1 when enabled) plus about O(n·K) per threshold test, with
/// O(log(n·K)) tests. Measured (release, shared 2-core machine): about 20–45 ms for 1,000
/// nodes and 0.7–1.3 s for 10,000 nodes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThresholdRingBuilder {
    /// Seed of the internal random generator (matching order, move order).
    pub seed: u64,
    /// K: widest out- and in-links kept per node in the candidate graph (default 24).
    pub candidates: usize,
    /// Randomised matching restarts per threshold test (default 3).
    pub restarts: usize,
    /// Depth-first search extensions per threshold test; 0 disables it (default 20,000).
    pub search_budget: usize,
    /// The depth-first search runs only for `n <= search_max_nodes` (default 128).
    pub search_max_nodes: usize,
    /// Stop refining once the best ring is within this relative margin of the smallest
    /// threshold not yet ruled out (default 0.002, i.e. 0.2%).
    pub tolerance: f32,
    /// Also run [`Algorithm1`] and start from its ring (default true).
    pub compare_algorithm1: bool,
}

impl Default for ThresholdRingBuilder {
    fn default() -> Self {
        ThresholdRingBuilder {
            seed: 0x6a09_e667_f3bc_c908,
            candidates: 24,
            restarts: 3,
            search_budget: 20_000,
            search_max_nodes: 128,
            tolerance: 0.002,
            compare_algorithm1: true,
        }
    }
}

impl RingBuilder for ThresholdRingBuilder {
    fn name(&self) -> &'static str {
        "threshold"
    }

    fn build(&self, bw: &BandwidthMatrix, regions: &[String]) -> Vec<usize> {
        let n = bw.n();
        if n <= 2 {
            return (0..n).collect();
        }
        let mut best = if self.compare_algorithm1 {
            Algorithm1::default().build(bw, regions)
        } else {
            greedy(bw, regions)
        };
        let mut best_b = bottleneck(bw, &best);
        let k = self.candidates.max(2);
        let mut g = Graph::build(bw, k);
        if n > k + 1 {
            // Links above the current bottleneck that the candidate lists miss entirely
            // (e.g. between clusters): add each node's widest links across the cut.
            let (count, comp) = g.scc_above(best_b);
            if count > 1 {
                let mut edges = g.edges();
                edges.extend(top_k_edges(bw, (k / 4).max(4), |i, j| comp[i] != comp[j]));
                g = Graph::from_edges(n, edges);
            }
        }
        // Upper bound: every node keeps an out- and an in-link >= T.
        let ub = (0..n)
            .map(|v| g.best_out(v).min(g.best_in(v)))
            .fold(f32::INFINITY, f32::min);
        let mut levels: Vec<f32> = g
            .out_w
            .iter()
            .copied()
            .filter(|&w| w > best_b && w <= ub)
            .collect();
        levels.sort_unstable_by(f32::total_cmp);
        levels.dedup();
        let mut s = Search::new(bw, &g, ChaCha8Rng::seed_from_u64(self.seed));
        // Binary search: levels[..lo] are achieved (<= best_b), levels[hi..] failed.
        let (mut lo, mut hi) = (0, levels.len());
        while lo < hi && levels[hi - 1] > best_b * (1.0 + self.tolerance) {
            let mid = (lo + hi) / 2;
            match s.find_cycle(levels[mid], &best, self) {
                Some(tour) => {
                    let b = bottleneck(bw, &tour);
                    if b > best_b {
                        best = tour;
                        best_b = b;
                    }
                    lo = levels.partition_point(|&l| l <= best_b).max(mid + 1);
                }
                None => hi = mid,
            }
        }
        best
    }
}

/// Scratch state for one `build` call.
struct Search<'a> {
    bw: &'a BandwidthMatrix,
    g: &'a Graph,
    n: usize,
    rng: ChaCha8Rng,
    lim: Vec<u32>,
    match_l: Vec<u32>,
    match_r: Vec<u32>,
    dist: Vec<u32>,
    it: Vec<u32>,
    queue: Vec<u32>,
    stack: Vec<u32>,
    vstack: Vec<u32>,
    succ: Vec<u32>,
    pred: Vec<u32>,
    comp: Vec<u32>,
    uf: Vec<u32>,
    size: Vec<u32>,
    pos: Vec<usize>,
    mark: Vec<bool>,
}

impl<'a> Search<'a> {
    fn new(bw: &'a BandwidthMatrix, g: &'a Graph, rng: ChaCha8Rng) -> Self {
        let n = g.n;
        Search {
            bw,
            g,
            n,
            rng,
            lim: vec![0; n],
            match_l: vec![NONE; n],
            match_r: vec![NONE; n],
            dist: vec![0; n],
            it: vec![0; n],
            queue: Vec::with_capacity(n),
            stack: Vec::new(),
            vstack: Vec::new(),
            succ: vec![0; n],
            pred: vec![0; n],
            comp: vec![0; n],
            uf: Vec::new(),
            size: Vec::new(),
            pos: vec![0; n],
            mark: vec![false; n],
        }
    }

    #[inline]
    fn w(&self, a: usize, b: usize) -> f32 {
        self.bw.row(a)[b]
    }

    #[inline]
    fn adj(&self, u: usize) -> &'a [u32] {
        let s = self.g.out_start[u];
        &self.g.out_nbr[s..s + self.lim[u] as usize]
    }

    fn strongly_connected(&mut self, t: f32) -> bool {
        for forward in [true, false] {
            self.mark.fill(false);
            self.queue.clear();
            self.queue.push(0);
            self.mark[0] = true;
            let mut qi = 0;
            while qi < self.queue.len() {
                let u = self.queue[qi] as usize;
                qi += 1;
                let nbrs = if forward {
                    self.g.out_at_least(u, t)
                } else {
                    self.g.in_at_least(u, t)
                };
                for &v in nbrs {
                    if !self.mark[v as usize] {
                        self.mark[v as usize] = true;
                        self.queue.push(v);
                    }
                }
            }
            if self.queue.len() != self.n {
                return false;
            }
        }
        true
    }

    /// Hopcroft–Karp over candidate links `>= t` (out-copy → in-copy). On success (perfect
    /// matching) fills `succ`/`pred` with the resulting cycle cover.
    fn matching(&mut self, t: f32, randomize: bool) -> bool {
        let n = self.n;
        for u in 0..n {
            let l = self.g.out_at_least(u, t).len();
            if l == 0 {
                return false;
            }
            self.lim[u] = l as u32;
        }
        self.match_l.fill(NONE);
        self.match_r.fill(NONE);
        let mut order: Vec<u32> = (0..n as u32).collect();
        if randomize {
            order.shuffle(&mut self.rng);
        }
        for &u in &order {
            let u = u as usize;
            let adj = self.adj(u);
            let start = if randomize {
                self.rng.gen_range(0..adj.len())
            } else {
                0
            };
            for k in 0..adj.len() {
                let v = adj[(start + k) % adj.len()] as usize;
                if self.match_r[v] == NONE {
                    self.match_r[v] = u as u32;
                    self.match_l[u] = v as u32;
                    break;
                }
            }
        }
        loop {
            // BFS layering from free left vertices.
            self.dist.fill(NONE);
            self.queue.clear();
            for u in 0..n {
                if self.match_l[u] == NONE {
                    self.dist[u] = 0;
                    self.queue.push(u as u32);
                }
            }
            if self.queue.is_empty() {
                break;
            }
            let mut found = false;
            let mut qi = 0;
            while qi < self.queue.len() {
                let u = self.queue[qi] as usize;
                qi += 1;
                for &v in self.adj(u) {
                    let u2 = self.match_r[v as usize];
                    if u2 == NONE {
                        found = true;
                    } else if self.dist[u2 as usize] == NONE {
                        self.dist[u2 as usize] = self.dist[u] + 1;
                        self.queue.push(u2);
                    }
                }
            }
            if !found {
                return false;
            }
            self.it.fill(0);
            for root in 0..n {
                if self.match_l[root] == NONE {
                    self.augment(root);
                }
            }
        }
        for u in 0..n {
            let v = self.match_l[u];
            self.succ[u] = v;
            self.pred[v as usize] = u as u32;
        }
        true
    }

    /// One iterative DFS of Hopcroft–Karp from the free left vertex `root`.
    fn augment(&mut self, root: usize) -> bool {
        self.stack.clear();
        self.vstack.clear();
        self.stack.push(root as u32);
        while let Some(&u) = self.stack.last() {
            let u = u as usize;
            let adj = self.adj(u);
            if self.it[u] as usize >= adj.len() {
                self.dist[u] = NONE;
                self.stack.pop();
                self.vstack.pop();
                continue;
            }
            let v = adj[self.it[u] as usize] as usize;
            self.it[u] += 1;
            let u2 = self.match_r[v];
            if u2 == NONE {
                // Augment along the stack.
                let top = self.stack.len() - 1;
                self.match_l[u] = v as u32;
                self.match_r[v] = u as u32;
                for k in (0..top).rev() {
                    let (uk, vk) = (self.stack[k], self.vstack[k]);
                    self.match_l[uk as usize] = vk;
                    self.match_r[vk as usize] = uk;
                }
                return true;
            } else if self.dist[u2 as usize] == self.dist[u].wrapping_add(1) {
                self.stack.push(u2);
                self.vstack.push(v as u32);
            }
        }
        false
    }

    fn find(&mut self, mut x: u32) -> u32 {
        while self.uf[x as usize] != x {
            let p = self.uf[self.uf[x as usize] as usize];
            self.uf[x as usize] = p;
            x = p;
        }
        x
    }

    /// Swaps the successors of `a` and `b`: `a→b'`, `b→a'` (merges two cycles of the cover).
    fn swap_succ(&mut self, a: usize, b: usize) {
        let (a2, b2) = (self.succ[a], self.succ[b]);
        self.succ[a] = b2;
        self.pred[b2 as usize] = a as u32;
        self.succ[b] = a2;
        self.pred[a2 as usize] = b as u32;
        let (ra, rb) = (self.find(self.comp[a]), self.find(self.comp[b]));
        if ra != rb {
            let (big, small) = if self.size[ra as usize] >= self.size[rb as usize] {
                (ra, rb)
            } else {
                (rb, ra)
            };
            self.uf[small as usize] = big;
            self.size[big as usize] += self.size[small as usize];
        }
    }

    /// Turns the cycle cover in `succ` into one Hamiltonian cycle: first merges with swaps
    /// whose two new links are `>= t`, then joins what is left with the best swaps
    /// available. Returns the ring order starting at node 0.
    fn patch(&mut self, t: f32) -> Vec<usize> {
        let n = self.n;
        self.comp.fill(NONE);
        self.uf.clear();
        self.size.clear();
        let mut cycles = 0usize;
        for s in 0..n {
            if self.comp[s] != NONE {
                continue;
            }
            let id = self.uf.len() as u32;
            let mut v = s;
            let mut len = 0;
            while self.comp[v] == NONE {
                self.comp[v] = id;
                len += 1;
                v = self.succ[v] as usize;
            }
            self.uf.push(id);
            self.size.push(len);
            cycles += 1;
        }
        // Candidate links >= t between different cycles. A swap of `x` and `pred(y)`
        // creates `x→y` and `pred(y)→succ(x)`, so every merging swap with at least one new
        // link in the candidate graph is found from this list.
        let mut cross: Vec<(u32, u32)> = Vec::new();
        if cycles > 1 {
            for x in 0..n {
                for &y in self.g.out_at_least(x, t) {
                    if self.comp[x] != self.comp[y as usize] {
                        cross.push((x as u32, y));
                    }
                }
            }
            cross.shuffle(&mut self.rng);
        }
        while cycles > 1 {
            let mut merged = false;
            let mut keep = 0;
            for idx in 0..cross.len() {
                let (x, y) = cross[idx];
                let (x, y) = (x as usize, y as usize);
                if self.find(self.comp[x]) == self.find(self.comp[y]) {
                    continue; // now inside one cycle: drop it
                }
                let b = self.pred[y] as usize;
                if self.w(b, self.succ[x] as usize) >= t {
                    self.swap_succ(x, b);
                    cycles -= 1;
                    merged = true;
                    if cycles == 1 {
                        break;
                    }
                } else {
                    cross[keep] = cross[idx];
                    keep += 1;
                }
            }
            cross.truncate(keep);
            if !merged {
                break;
            }
        }
        // Join what is left, smallest cycles first, each with the best swap available.
        let mut rest: Vec<(u32, usize)> = Vec::new();
        if cycles > 1 {
            let mut seen_root = vec![false; self.uf.len()];
            for v in 0..n {
                let r = self.find(self.comp[v]);
                if !seen_root[r as usize] {
                    seen_root[r as usize] = true;
                    rest.push((self.size[r as usize], v));
                }
            }
            rest.sort_unstable();
        }
        for &(_, rep) in &rest {
            if cycles <= 1 {
                break;
            }
            let c = self.find(self.comp[rep]);
            let mut best: Option<((u8, f32), usize, usize)> = None;
            let mut a = rep;
            loop {
                let a2 = self.succ[a] as usize;
                let s = self.g.out_start[a];
                for &b2 in &self.g.out_nbr[s..self.g.out_start[a + 1]] {
                    let b2 = b2 as usize;
                    if self.find(self.comp[b2]) == c {
                        continue;
                    }
                    let b = self.pred[b2] as usize;
                    let (x, y) = (self.w(a, b2), self.w(b, a2));
                    let key = ((x >= t) as u8 + (y >= t) as u8, x.min(y));
                    if best.is_none_or(|(k, _, _)| key > k) {
                        best = Some((key, a, b));
                    }
                }
                a = a2;
                if a == rep {
                    break;
                }
            }
            let (a, b) = match best {
                Some((_, a, b)) => (a, b),
                None => {
                    let b = (0..n).find(|&v| self.find(self.comp[v]) != c).unwrap_or(0);
                    (rep, b)
                }
            };
            self.swap_succ(a, b);
            cycles -= 1;
        }
        let mut order = Vec::with_capacity(n);
        let mut v = 0;
        for _ in 0..n {
            order.push(v);
            v = self.succ[v] as usize;
        }
        order
    }

    /// Tries to make every link of `order` `>= t` with moves that strictly reduce the number
    /// of links below `t`. Returns whether it succeeded.
    fn repair(&mut self, order: &mut Vec<usize>, t: f32) -> bool {
        let n = self.n;
        let mut bad = Vec::new();
        loop {
            for (k, &v) in order.iter().enumerate() {
                self.pos[v] = k;
            }
            bad.clear();
            for k in 0..n {
                if self.w(order[k], order[(k + 1) % n]) < t {
                    bad.push(k);
                }
            }
            if bad.is_empty() {
                return true;
            }
            let off = self.rng.gen_range(0..bad.len());
            let mut applied = false;
            for idx in 0..bad.len() {
                let k = bad[(idx + off) % bad.len()];
                if let Some(mv) = self.find_move(order, k, t) {
                    *order = apply(order, (k + 1) % n, mv);
                    applied = true;
                    break;
                }
            }
            if !applied {
                return false;
            }
        }
    }

    /// An improving move that removes the bad link `order[k] → order[k+1]`, in coordinates
    /// relative to `order[k+1]` (rel 0) whose predecessor `order[k]` has rel `n-1`.
    fn find_move(&self, order: &[usize], k: usize, t: f32) -> Option<Move> {
        const REV_CAP: usize = 256;
        let n = self.n;
        let a = order[k];
        let base = (k + 1) % n;
        let a2 = order[base];
        let rel = |v: usize| (self.pos[v] + n - base) % n;
        let at = |r: usize| order[(base + r) % n];
        let bad = |x: usize, y: usize| (self.w(x, y) < t) as i32;
        let ins = self.g.in_at_least(a2, t);
        // Segment exchange: S1 = [0, ry2), S2 = [ry2, rx3], S3 = (rx3, n) → S1 S3 S2.
        for &y2 in self.g.out_at_least(a, t) {
            let ry2 = rel(y2 as usize);
            if ry2 == 0 || ry2 > n - 2 {
                continue;
            }
            let x2 = at(ry2 - 1);
            let b_x2y2 = bad(x2, y2 as usize);
            for &x3 in ins {
                let rx3 = rel(x3 as usize);
                if rx3 < ry2 || rx3 > n - 2 {
                    continue;
                }
                let y3 = at(rx3 + 1);
                let gain = 1 + b_x2y2 + bad(x3 as usize, y3) - bad(x2, y3);
                if gain >= 1 {
                    return Some(Move::Exchange { ry2, rx3 });
                }
            }
        }
        // 2-opt, reversing [0, rb]: new links a→b and a2→b2.
        for &b in self.g.out_at_least(a, t) {
            let rb = rel(b as usize);
            if rb == 0 || rb > n - 2 || rb > REV_CAP {
                continue;
            }
            let b2 = at(rb + 1);
            let mut gain = 1 + bad(b as usize, b2) - bad(a2, b2);
            for r in 0..rb {
                gain += bad(at(r), at(r + 1)) - bad(at(r + 1), at(r));
            }
            if gain >= 1 {
                return Some(Move::Reverse { from: 0, to: rb });
            }
        }
        // 2-opt, reversing [rb + 1, n - 1]: new links b→a and b2→a2.
        for &b in self.g.in_at_least(a, t) {
            let rb = rel(b as usize);
            if rb + 3 > n || n - 1 - rb > REV_CAP {
                continue;
            }
            let b2 = at(rb + 1);
            let mut gain = 1 + bad(b as usize, b2) - bad(b2, a2);
            for r in rb + 1..n - 1 {
                gain += bad(at(r), at(r + 1)) - bad(at(r + 1), at(r));
            }
            if gain >= 1 {
                return Some(Move::Reverse {
                    from: rb + 1,
                    to: n - 1,
                });
            }
        }
        None
    }

    /// Tries to find a ring whose links are all `>= t`.
    fn find_cycle(
        &mut self,
        t: f32,
        best: &[usize],
        cfg: &ThresholdRingBuilder,
    ) -> Option<Vec<usize>> {
        let n = self.n;
        // Necessary conditions: strongly connected, and a perfect out→in matching (below).
        if !self.strongly_connected(t) {
            return None;
        }
        for r in 0..cfg.restarts.max(1) {
            if !self.matching(t, r > 0) {
                return None;
            }
            let mut tour = self.patch(t);
            if self.repair(&mut tour, t) {
                return Some(tour);
            }
            if r == 0 {
                let mut tour = best.to_vec();
                let bad = (0..n)
                    .filter(|&k| self.w(tour[k], tour[(k + 1) % n]) < t)
                    .count();
                if bad <= 64 + n / 16 && self.repair(&mut tour, t) {
                    return Some(tour);
                }
            }
        }
        if cfg.search_budget > 0 && n <= cfg.search_max_nodes {
            return self.dfs(t, cfg.search_budget);
        }
        None
    }

    /// Depth-first search for a Hamiltonian cycle among candidate links `>= t`, widest
    /// first, at most `budget` extensions. Exhaustive (exact) when the budget suffices and
    /// the candidate graph is complete.
    fn dfs(&mut self, t: f32, budget: usize) -> Option<Vec<usize>> {
        let n = self.n;
        let start = (0..n).min_by_key(|&v| self.g.in_at_least(v, t).len())?;
        // Unvisited nodes with a link >= t into `start`: the ring must be able to close.
        let closers = self.g.in_at_least(start, t);
        let mut open_closers = closers.len();
        self.mark.fill(false);
        for &c in closers {
            self.mark[c as usize] = true; // temporarily: closer flag
        }
        let is_closer: Vec<bool> = self.mark.clone();
        self.mark.fill(false);
        self.mark[start] = true;
        let mut path = vec![start];
        let mut next: Vec<usize> = vec![0];
        let mut steps = 0;
        while let Some(&u) = path.last() {
            if path.len() == n {
                if self.w(u, start) >= t {
                    return Some(path);
                }
            } else if open_closers > 0 {
                let adj = self.g.out_at_least(u, t);
                let idx = next.last_mut()?;
                while *idx < adj.len() && self.mark[adj[*idx] as usize] {
                    *idx += 1;
                }
                if *idx < adj.len() {
                    let v = adj[*idx] as usize;
                    *idx += 1;
                    steps += 1;
                    if steps > budget {
                        return None;
                    }
                    self.mark[v] = true;
                    if is_closer[v] {
                        open_closers -= 1;
                    }
                    path.push(v);
                    next.push(0);
                    continue;
                }
            }
            // Backtrack.
            path.pop();
            next.pop();
            if u != start {
                self.mark[u] = false;
                if is_closer[u] {
                    open_closers += 1;
                }
            }
        }
        None
    }
}

#[derive(Clone, Copy, Debug)]
enum Move {
    Exchange { ry2: usize, rx3: usize },
    Reverse { from: usize, to: usize },
}

/// Applies `mv` to `order`, with relative coordinates starting at index `base`.
fn apply(order: &[usize], base: usize, mv: Move) -> Vec<usize> {
    let n = order.len();
    let at = |r: usize| order[(base + r) % n];
    match mv {
        Move::Exchange { ry2, rx3 } => (0..ry2)
            .chain(rx3 + 1..n)
            .chain(ry2..=rx3)
            .map(at)
            .collect(),
        Move::Reverse { from, to } => {
            let mut out: Vec<usize> = (0..n).map(at).collect();
            out[from..=to].reverse();
            out
        }
    }
}
