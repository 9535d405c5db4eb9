//! The order-statistic aggregators: coordinate-wise median and trimmed mean.
//!
//! Both run one comparator network per group of [`LANES`] coordinates (16 above
//! [`WIDE_MAX_ROWS`] deltas): the group's values, one row per delta gathered straight from
//! the deltas (with software prefetch, the deltas being read as N interleaved streams), sit
//! in L1 (at most 16 KiB) while every comparator is an element-wise min/max of two rows —
//! straight-line vector code, no data-dependent branches. The network is Batcher's odd–even
//! merge sort: its first five stages (sorting each aligned block of 32 rows) run in
//! registers on AVX-512, the rest is pruned to the comparators that feed the needed rows.
//! Large inputs are split over threads by coordinate range ([`super::par`]). The kernel is
//! compiled for AVX-512 and AVX2 besides the baseline and picked at run time; all three give
//! identical results (the same comparators in the same order).

use super::par::{for_each_chunk, threads_for};
use super::{validate, Aggregator, MergeError, MergeOutcome};

/// Coordinates per group: one row of the network is `LANES` floats (two 512-bit vectors).
/// Above [`WIDE_MAX_ROWS`] deltas the groups are half as wide, so that `n` rows still fit in
/// L1 (256 rows × 64 B = 16 KiB).
pub(super) const LANES: usize = 32;

/// The most deltas merged with [`LANES`]-wide groups (128 × 128 B = 16 KiB).
const WIDE_MAX_ROWS: usize = 128;

/// How many groups ahead the gather prefetches.
const PREFETCH: usize = 16;

/// Hints the cache line holding `src[j]` into L2 (nothing past the end, nothing off x86-64):
/// N streams × [`PREFETCH`] groups ahead would not fit L1 for large N.
#[inline(always)]
fn prefetch(src: &[f32], j: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = src.get(j) {
        // SAFETY: a prefetch never faults and `x` is a valid address anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                (x as *const f32).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (src, j);
}

/// One delta's values of one group of coordinates.
pub(super) type Row<const W: usize = LANES> = [f32; W];

/// Rows per presorted block (see [`OrderNetwork`]).
pub(super) const BLOCK: usize = 32;

/// Expands `$body!(a, b)` for every comparator of [`SORT32`], in order (so that the
/// register version is straight-line code with constant indices).
macro_rules! sort32_network {
    ($body:ident) => {
        sort32_network!(@each $body;
            (0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15),
            (16, 17), (18, 19), (20, 21), (22, 23), (24, 25), (26, 27), (28, 29), (30, 31),
            (0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15),
            (16, 18), (17, 19), (20, 22), (21, 23), (24, 26), (25, 27), (28, 30), (29, 31),
            (1, 2), (5, 6), (9, 10), (13, 14), (17, 18), (21, 22), (25, 26), (29, 30),
            (0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15),
            (16, 20), (17, 21), (18, 22), (19, 23), (24, 28), (25, 29), (26, 30), (27, 31),
            (2, 4), (3, 5), (10, 12), (11, 13), (18, 20), (19, 21), (26, 28), (27, 29),
            (1, 2), (3, 4), (5, 6), (9, 10), (11, 12), (13, 14), (17, 18), (19, 20),
            (21, 22), (25, 26), (27, 28), (29, 30), (0, 8), (1, 9), (2, 10), (3, 11),
            (4, 12), (5, 13), (6, 14), (7, 15), (16, 24), (17, 25), (18, 26), (19, 27),
            (20, 28), (21, 29), (22, 30), (23, 31), (4, 8), (5, 9), (6, 10), (7, 11),
            (20, 24), (21, 25), (22, 26), (23, 27), (2, 4), (3, 5), (6, 8), (7, 9),
            (10, 12), (11, 13), (18, 20), (19, 21), (22, 24), (23, 25), (26, 28), (27, 29),
            (1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (17, 18),
            (19, 20), (21, 22), (23, 24), (25, 26), (27, 28), (29, 30), (0, 16), (1, 17),
            (2, 18), (3, 19), (4, 20), (5, 21), (6, 22), (7, 23), (8, 24), (9, 25),
            (10, 26), (11, 27), (12, 28), (13, 29), (14, 30), (15, 31), (8, 16), (9, 17),
            (10, 18), (11, 19), (12, 20), (13, 21), (14, 22), (15, 23), (4, 8), (5, 9),
            (6, 10), (7, 11), (12, 16), (13, 17), (14, 18), (15, 19), (20, 24), (21, 25),
            (22, 26), (23, 27), (2, 4), (3, 5), (6, 8), (7, 9), (10, 12), (11, 13),
            (14, 16), (15, 17), (18, 20), (19, 21), (22, 24), (23, 25), (26, 28), (27, 29),
            (1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16),
            (17, 18), (19, 20), (21, 22), (23, 24), (25, 26), (27, 28), (29, 30),
        )
    };
    (@each $body:ident; $(($a:literal, $b:literal)),* $(,)?) => {
        $( $body!($a, $b); )*
    };
}

/// Batcher's odd–even merge sort of 32 inputs (191 comparators), in the order its generator
/// (in [`OrderNetwork::new`]) emits them for one aligned block of 32 rows. Sorting 32 rows
/// (16 lanes each) nearly fits the 32 AVX-512 registers, so the AVX-512 [`MinMax::sort32`]
/// runs it with one load and one store per row and a few spills.
pub(super) const SORT32: [(usize, usize); 191] = {
    let mut s = [(0, 0); 191];
    let mut i = 0;
    macro_rules! push {
        ($a:literal, $b:literal) => {
            s[i] = ($a, $b);
            i += 1;
        };
    }
    sort32_network!(push);
    assert!(i == 191);
    s
};

/// A comparator network that leaves the order statistics `lo..hi` of `n` inputs in rows
/// `lo..hi`: Batcher's odd–even merge sort, whose first five stages sort every
/// aligned block of [`BLOCK`] rows ([`MinMax::sort32`], all of [`SORT32`] for each full block),
/// followed by the remaining comparators with those that cannot affect the needed rows
/// pruned. Applied row-wise over a group of coordinates, every comparator is an element-wise
/// min/max over two rows, which vectorises; no data-dependent branches.
#[derive(Debug, Clone)]
pub(super) struct OrderNetwork {
    /// Rows `0 .. blocks·BLOCK` are presorted block by block.
    blocks: usize,
    /// One more than the largest row any comparator touches (0 without comparators).
    rows: usize,
    comparators: Vec<(u32, u32)>,
}

impl OrderNetwork {
    /// The network for rows `lo..hi` of `n` (`lo <= hi <= n`); `lo == hi` needs none.
    pub(super) fn new(n: usize, lo: usize, hi: usize) -> Self {
        if lo >= hi.min(n) {
            return OrderNetwork {
                blocks: 0,
                rows: 0,
                comparators: Vec::new(),
            };
        }
        let blocks = n / BLOCK;
        let mut all = Vec::new();
        let mut p = 1;
        while p < n {
            let mut k = p;
            while k >= 1 {
                let mut j = k % p;
                while j + k < n {
                    for i in 0..k.min(n - j - k) {
                        let (a, b) = (i + j, i + j + k);
                        // Stages p < BLOCK stay inside aligned blocks of BLOCK rows: the full
                        // blocks are presorted instead.
                        let presorted = p < BLOCK && b < blocks * BLOCK;
                        if a / (2 * p) == b / (2 * p) && !presorted {
                            all.push((a, b));
                        }
                    }
                    j += 2 * k;
                }
                k /= 2;
            }
            p *= 2;
        }
        // Walk backwards keeping only comparators that feed a needed row.
        let mut needed = vec![false; n];
        needed[lo..hi].iter_mut().for_each(|x| *x = true);
        let mut comparators: Vec<(u32, u32)> = all
            .into_iter()
            .rev()
            .filter(|&(a, b)| {
                let keep = needed[a] || needed[b];
                if keep {
                    needed[a] = true;
                    needed[b] = true;
                }
                keep
            })
            .map(|(a, b)| (a as u32, b as u32))
            .collect();
        comparators.reverse();
        OrderNetwork {
            blocks,
            rows: comparators
                .iter()
                .map(|&(_, b)| b as usize + 1)
                .max()
                .unwrap_or(0),
            comparators,
        }
    }

    /// Runs the network over `rows` (at least `n` of them) with the comparator `K`.
    ///
    /// # Safety
    ///
    /// The CPU supports `K`'s instructions ([`MinMax`]).
    #[inline(always)]
    pub(super) unsafe fn apply<K: MinMax, const W: usize>(&self, rows: &mut [Row<W>]) {
        for block in rows.chunks_exact_mut(BLOCK).take(self.blocks) {
            // SAFETY: the caller's contract.
            unsafe { K::sort32(block) };
        }
        assert!(
            rows.len() >= self.rows,
            "{} rows for a network of {}",
            rows.len(),
            self.rows
        );
        let base = rows.as_mut_ptr();
        for &(a, b) in &self.comparators {
            // SAFETY: a < b < self.rows <= rows.len() (construction, the assert above), so
            // the two rows are distinct and in bounds; the CPU contract is the caller's.
            unsafe { K::minmax(&mut *base.add(a as usize), &mut *base.add(b as usize)) };
        }
    }

    /// [`apply`](Self::apply) with the baseline comparator.
    #[cfg(test)]
    pub(super) fn apply_portable(&self, rows: &mut [Row]) {
        // SAFETY: `Portable` needs nothing beyond the baseline.
        unsafe { self.apply::<Portable, LANES>(rows) }
    }
}

/// One comparator over a pair of rows: `x[l] ← min(x[l], y[l])`, `y[l] ← max(x[l], y[l])`
/// lane by lane, where `min(p, q) = if q < p { q } else { p }` (and `max` the other one),
/// so every implementation gives the same bits, NaN included. Implemented with explicit
/// min/max instructions: the compiler turns the portable form into compare + masked store,
/// which defeats store-to-load forwarding between consecutive comparators (≈5× slower).
pub(super) trait MinMax {
    /// # Safety
    ///
    /// The CPU supports the implementation's instructions.
    unsafe fn minmax<const W: usize>(x: &mut Row<W>, y: &mut Row<W>);

    /// Sorts `BLOCK` rows with [`SORT32`] (`rows.len() == BLOCK`).
    ///
    /// # Safety
    ///
    /// As [`minmax`](Self::minmax).
    #[inline(always)]
    unsafe fn sort32<const W: usize>(rows: &mut [Row<W>]) {
        for &(a, b) in &SORT32 {
            let (left, right) = rows.split_at_mut(b);
            // SAFETY: the caller's contract.
            unsafe { Self::minmax(&mut left[a], &mut right[0]) };
        }
    }
}

/// Scalar/auto-vectorised comparator for any CPU.
pub(super) struct Portable;

impl MinMax for Portable {
    #[inline(always)]
    unsafe fn minmax<const W: usize>(x: &mut Row<W>, y: &mut Row<W>) {
        for (p, q) in x.iter_mut().zip(y.iter_mut()) {
            let (a, b) = (*p, *q);
            *p = if b < a { b } else { a };
            *q = if b < a { a } else { b };
        }
    }
}

/// AVX-512 comparator: two 16-lane `vminps`/`vmaxps` per row pair.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl MinMax for Avx512 {
    #[inline(always)]
    unsafe fn minmax<const W: usize>(x: &mut Row<W>, y: &mut Row<W>) {
        use std::arch::x86_64::{_mm512_loadu_ps, _mm512_max_ps, _mm512_min_ps, _mm512_storeu_ps};
        for h in 0..W / 16 {
            // SAFETY: 16 lanes at 16·h are inside both rows; AVX-512F is the caller's
            // contract. `_mm512_min_ps(b, a)` is `b < a ? b : a`, `_mm512_max_ps(a, b)` is
            // `a > b ? a : b`, as `Portable`.
            unsafe {
                let (px, py) = (x.as_mut_ptr().add(16 * h), y.as_mut_ptr().add(16 * h));
                let (a, b) = (_mm512_loadu_ps(px), _mm512_loadu_ps(py));
                _mm512_storeu_ps(px, _mm512_min_ps(b, a));
                _mm512_storeu_ps(py, _mm512_max_ps(a, b));
            }
        }
    }

    /// [`SORT32`] on 32 registers per 16 lanes: one load and one store per row (the
    /// compiler spills a few registers; still far fewer memory operations than 191
    /// comparators through memory).
    #[inline(always)]
    unsafe fn sort32<const W: usize>(rows: &mut [Row<W>]) {
        use std::arch::x86_64::{
            __m512, _mm512_loadu_ps, _mm512_max_ps, _mm512_min_ps, _mm512_storeu_ps,
        };
        let rows: &mut [Row<W>; BLOCK] = rows.try_into().expect("a block of BLOCK rows");
        for h in 0..W / 16 {
            // SAFETY: 16 lanes at 16·h are inside every row; AVX-512F is the caller's
            // contract. Same operand order as `minmax`.
            unsafe {
                let mut r: [__m512; BLOCK] =
                    std::array::from_fn(|i| _mm512_loadu_ps(rows[i].as_ptr().add(16 * h)));
                // Straight-line code on constant indices: `r` lives in registers.
                macro_rules! cmp {
                    ($a:literal, $b:literal) => {
                        let (x, y) = (r[$a], r[$b]);
                        r[$a] = _mm512_min_ps(y, x);
                        r[$b] = _mm512_max_ps(x, y);
                    };
                }
                sort32_network!(cmp);
                for (row, v) in rows.iter_mut().zip(r) {
                    _mm512_storeu_ps(row.as_mut_ptr().add(16 * h), v);
                }
            }
        }
    }
}

/// AVX2 comparator: four 8-lane `vminps`/`vmaxps` per row pair.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl MinMax for Avx2 {
    #[inline(always)]
    unsafe fn minmax<const W: usize>(x: &mut Row<W>, y: &mut Row<W>) {
        use std::arch::x86_64::{_mm256_loadu_ps, _mm256_max_ps, _mm256_min_ps, _mm256_storeu_ps};
        for h in 0..W / 8 {
            // SAFETY: 8 lanes at 8·h are inside both rows; AVX2 is the caller's contract.
            // Same operand order as `Avx512`.
            unsafe {
                let (px, py) = (x.as_mut_ptr().add(8 * h), y.as_mut_ptr().add(8 * h));
                let (a, b) = (_mm256_loadu_ps(px), _mm256_loadu_ps(py));
                _mm256_storeu_ps(px, _mm256_min_ps(b, a));
                _mm256_storeu_ps(py, _mm256_max_ps(a, b));
            }
        }
    }
}

/// What an order-statistic merge writes from the ordered rows of a group.
#[derive(Debug, Clone, Copy)]
enum Emit {
    /// The mean of rows `lo` and `hi` (`lo == hi` for an odd count): the median.
    Median { lo: usize, hi: usize },
    /// `scale · Σ rows k..n−k`, summed in row order: the trimmed mean.
    Trimmed { k: usize, scale: f32 },
}

impl Emit {
    #[inline(always)]
    fn write<const W: usize>(self, rows: &[Row<W>], n: usize, out: &mut [f32]) {
        let m = out.len();
        match self {
            Emit::Median { lo, hi } if lo == hi => out.copy_from_slice(&rows[lo][..m]),
            Emit::Median { lo, hi } => {
                let (a, b) = (&rows[lo], &rows[hi]);
                for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                    // Halving is exact, so this is the correctly rounded mean and cannot
                    // overflow.
                    *o = 0.5 * x + 0.5 * y;
                }
            }
            Emit::Trimmed { k, scale } => {
                let mut acc = rows[k];
                for row in &rows[k + 1..n - k] {
                    for (a, &x) in acc.iter_mut().zip(row) {
                        *a += x;
                    }
                }
                for (o, &a) in out.iter_mut().zip(&acc) {
                    *o = a * scale;
                }
            }
        }
    }
}

/// One order-statistic merge: the participating deltas, the network and the output rule.
struct OrderJob<'a> {
    deltas: &'a [&'a [f32]],
    used: &'a [usize],
    net: OrderNetwork,
    emit: Emit,
}

impl OrderJob<'_> {
    /// Merges coordinates `start..start + out.len()` into `out`.
    fn run(&self, start: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F, checked just above.
                return unsafe { self.run_avx512(start, out) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, checked just above.
                return unsafe { self.run_avx2(start, out) };
            }
        }
        self.run_portable(start, out);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn run_avx512(&self, start: usize, out: &mut [f32]) {
        // SAFETY: this function requires AVX-512F.
        unsafe {
            if self.used.len() > WIDE_MAX_ROWS {
                self.run_with::<Avx512, { LANES / 2 }>(start, out)
            } else {
                self.run_with::<Avx512, LANES>(start, out)
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn run_avx2(&self, start: usize, out: &mut [f32]) {
        // SAFETY: this function requires AVX2.
        unsafe {
            if self.used.len() > WIDE_MAX_ROWS {
                self.run_with::<Avx2, { LANES / 2 }>(start, out)
            } else {
                self.run_with::<Avx2, LANES>(start, out)
            }
        }
    }

    fn run_portable(&self, start: usize, out: &mut [f32]) {
        // SAFETY: `Portable` needs nothing beyond the baseline.
        unsafe {
            if self.used.len() > WIDE_MAX_ROWS {
                self.run_with::<Portable, { LANES / 2 }>(start, out)
            } else {
                self.run_with::<Portable, LANES>(start, out)
            }
        }
    }

    /// Group by group: gathers the group's `n` rows (prefetching the rows [`PREFETCH`]
    /// groups ahead into L2, as the deltas are read as `n` interleaved streams), runs the network
    /// and writes the group of `out`.
    ///
    /// # Safety
    ///
    /// The CPU supports `K`'s instructions.
    #[inline(always)]
    unsafe fn run_with<K: MinMax, const W: usize>(&self, start: usize, out: &mut [f32]) {
        let n = self.used.len();
        let len = out.len();
        let rows_of: Vec<&[f32]> = self
            .used
            .iter()
            .map(|&i| &self.deltas[i][start..start + len])
            .collect();
        let mut rows = vec![[0.0f32; W]; n];
        for (g, o) in out.chunks_mut(W).enumerate() {
            let s = g * W;
            let ahead = s + PREFETCH * W;
            for (row, src) in rows.iter_mut().zip(&rows_of) {
                prefetch(src, ahead);
                if W > 16 {
                    prefetch(src, ahead + 16);
                }
                match src[s..].first_chunk::<W>() {
                    Some(part) => *row = *part,
                    None => row[..len - s].copy_from_slice(&src[s..]),
                }
            }
            // SAFETY: the caller's contract.
            unsafe { self.net.apply::<K, W>(&mut rows) };
            self.emit.write(&rows, n, o);
        }
    }

    /// Merges all of `out`, split over threads when it is large.
    fn run_all(&self, out: &mut [f32]) {
        let threads = threads_for(self.used.len(), out.len());
        for_each_chunk(out, threads, LANES, |start, chunk| self.run(start, chunk));
    }
}

/// Coordinate-wise median (paper §6: the Byzantine-robust replacement for the weighted
/// average; DESIGN §6): `out[j] = median{dᵢ[j] : wᵢ > 0}`; for an even count, the mean of
/// the two middle values. Weights are otherwise ignored.
///
/// Selection runs on groups of 32 (or 16) coordinates with a sorting network (Batcher's
/// odd–even merge sort, only the comparators feeding the middle rows), so each step is a
/// vectorised min/max over data in L1; large inputs use several threads
/// ([`PAR_MIN_FLOATS`](super::PAR_MIN_FLOATS)).
#[derive(Debug, Clone, Copy, Default)]
pub struct CoordinateMedian;

impl Aggregator for CoordinateMedian {
    fn name(&self) -> &'static str {
        "median"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        let used = match validate(deltas, weights, out.len())? {
            Ok((used, _)) => used,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let n = used.len();
        let (lo, hi) = ((n - 1) / 2, n / 2);
        let job = OrderJob {
            deltas,
            used: &used,
            net: OrderNetwork::new(n, lo, hi + 1),
            emit: Emit::Median { lo, hi },
        };
        job.run_all(out);
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: n,
        })
    }
}

/// Coordinate-wise trimmed mean (a Byzantine-robust alternative named in DESIGN §6): with
/// N deltas of non-zero weight and `k = floor(trim·N)`, drop the k smallest and k largest
/// values of each coordinate and average the remaining `N − 2k` (unweighted, summed in `f32`
/// in ascending order, then scaled by `1 / (N − 2k)`). `trim` is the fraction cut from *each*
/// end, in `[0, 0.5)`; `trim = 0` is the plain mean.
///
/// # Errors
///
/// [`MergeError::BadTrim`] for a `trim` outside `[0, 0.5)` (NaN included).
#[derive(Debug, Clone, Copy)]
pub struct TrimmedMean {
    /// Fraction trimmed from each end, in `[0, 0.5)` (e.g. `0.2`).
    pub trim: f32,
}

impl Default for TrimmedMean {
    fn default() -> Self {
        TrimmedMean { trim: 0.2 }
    }
}

impl Aggregator for TrimmedMean {
    fn name(&self) -> &'static str {
        "trimmed_mean"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        if !(0.0..0.5).contains(&self.trim) {
            return Err(MergeError::BadTrim(self.trim));
        }
        let used = match validate(deltas, weights, out.len())? {
            Ok((used, _)) => used,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let n = used.len();
        let k = ((f64::from(self.trim) * n as f64).floor() as usize).min((n - 1) / 2);
        let kept = n - 2 * k;
        // Rows k..n−k in order, so the f32 sum (ascending) does not depend on the input
        // order: the result is bitwise permutation-invariant.
        let net = OrderNetwork::new(n, k, n - k);
        let job = OrderJob {
            deltas,
            used: &used,
            net,
            emit: Emit::Trimmed {
                k,
                scale: (1.0 / kept as f64) as f32,
            },
        };
        job.run_all(out);
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: n,
        })
    }
}
