//! Seeded random instances for tests, benches and reports (ours).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::BandwidthMatrix;

/// A random `n x n` matrix with i.i.d. uniform bandwidths in `[1, 1000)` Mbit/s, all
/// measured; deterministic in `seed`. For tests, benches and reports (ours).
pub fn random_uniform(n: usize, seed: u64) -> BandwidthMatrix {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    BandwidthMatrix::from_fn(n, |_, _| rng.gen_range(1.0f32..1000.0))
}

/// A random clustered instance: `n` nodes spread evenly (in shuffled order) over `regions`
/// regions labelled `r0`, `r1`, …; intra-region links `U[400, 1000)` Mbit/s, inter-region
/// links `U[20, 200)` Mbit/s, each directed link then scaled by independent noise
/// `U[0.7, 1.3)` (asymmetric). Returns the matrix and the region labels; deterministic in
/// `seed`. For tests, benches and reports (ours). `regions = 0` is treated as 1.
pub fn random_clustered(n: usize, regions: usize, seed: u64) -> (BandwidthMatrix, Vec<String>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let r = regions.max(1);
    let mut region: Vec<usize> = (0..n).map(|i| i % r).collect();
    region.shuffle(&mut rng);
    let bw = BandwidthMatrix::from_fn(n, |i, j| {
        let base = if region[i] == region[j] {
            rng.gen_range(400.0f32..1000.0)
        } else {
            rng.gen_range(20.0f32..200.0)
        };
        base * rng.gen_range(0.7f32..1.3)
    });
    (bw, region.iter().map(|g| format!("r{g}")).collect())
}
