//! Ring construction and fault recovery for ring all-reduce (paper §4.2–4.3, DESIGN §4).
//!
//! Everything here is pure: no I/O, no clocks, no async, and randomness only through an
//! explicit seed. Node indices are `usize` positions into a [`BandwidthMatrix`]; the caller
//! maps them to node ids.
//!
//! - [`BandwidthMatrix`]: directed link bandwidths in Mbit/s, measured or estimated.
//! - [`RingBuilder`]: turns a matrix into a ring order (a permutation of `0..n`); in a ring
//!   all-reduce node `order[k]` sends to `order[(k + 1) % n]`, so direction matters.
//! - [`Algorithm1`]: the paper's baseline (region-sorted greedy + 2-opt).
//! - [`ThresholdRingBuilder`]: the default builder (ours): bottleneck-threshold search with
//!   Hamiltonian-cycle heuristics; never worse than [`Algorithm1`].
//! - [`exact_max_bottleneck`]: exact optimum for `n <= 12`, for tests and benches.
//! - [`recover`]: paper Algorithm 2 generalised to several simultaneous failures.
//! - [`plan_probes`]: which links a newly admitted node and its peers should measure, so
//!   measurements replace estimates (works on node ids, not matrix indices).
//!
//! The objective throughout is the ring's *bottleneck*: the minimum bandwidth over its
//! directed edges ([`bottleneck`]), which bounds the throughput of every all-reduce step.

mod algorithm1;
mod exact;
mod graph;
mod instances;
mod matrix;
mod probe;
mod recovery;
mod threshold;

#[cfg(test)]
mod tests;

pub use algorithm1::Algorithm1;
pub use exact::{exact_max_bottleneck, EXACT_MAX_NODES};
pub use instances::{random_clustered, random_uniform};
pub use matrix::{BandwidthMatrix, LinkEstimate};
pub use probe::{plan_probes, ProbePair};
pub use recovery::{recover, RecoveryPlan};
pub use threshold::ThresholdRingBuilder;

/// Builds a ring order from a bandwidth matrix (DESIGN §4).
///
/// `build` returns a permutation of `0..bw.n()`: node `order[k]` sends to
/// `order[(k + 1) % n]`. `regions[i]` is node `i`'s region label (missing entries are
/// treated as an unknown region). For `n <= 2` every order is the same ring and builders
/// return `0..n`. Implementations never panic, whatever the matrix holds.
pub trait RingBuilder: Send + Sync + std::fmt::Debug + 'static {
    /// A short stable name for logs and reports, e.g. `"algorithm1"`.
    fn name(&self) -> &'static str;
    /// The ring order: a permutation of `0..bw.n()`.
    fn build(&self, bw: &BandwidthMatrix, regions: &[String]) -> Vec<usize>;
}

/// The builder hanzod uses unless configured otherwise: [`ThresholdRingBuilder::default`].
pub fn default_builder() -> ThresholdRingBuilder {
    ThresholdRingBuilder::default()
}

/// The ring's bottleneck in Mbit/s: the minimum of `bw.get(order[k], order[(k + 1) % n])`
/// over `k in 0..n` (DESIGN §4 objective).
///
/// Returns `f32::INFINITY` when `order.len() < 2` (no link constrains the ring). Indices out
/// of range of `bw` count as 0 Mbit/s links; `order` need not be a permutation.
pub fn bottleneck(bw: &BandwidthMatrix, order: &[usize]) -> f32 {
    let n = order.len();
    if n < 2 {
        return f32::INFINITY;
    }
    let mut min = f32::INFINITY;
    for k in 0..n {
        let w = bw.get(order[k], order[(k + 1) % n]);
        if w < min {
            min = w;
        }
    }
    min
}

/// Region labels, with missing entries as `None` (which sorts after every label).
fn region_of(regions: &[String], i: usize) -> Option<&str> {
    regions.get(i).map(String::as_str)
}

/// Whether `order` holds each of `0..n` exactly once: the contract of
/// [`RingBuilder::build`], checked before a builder's output is used.
pub fn is_permutation(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
}
