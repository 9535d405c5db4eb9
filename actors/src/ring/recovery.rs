//! Ring fault recovery (paper Algorithm 2, DESIGN §4).

use serde::{Deserialize, Serialize};

use super::{bottleneck, BandwidthMatrix};

/// The outcome of [`recover`]: the new ring and what changed (paper Algorithm 2).
///
/// All indices refer to the [`BandwidthMatrix`] passed to [`recover`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecoveryPlan {
    /// The new ring order: the survivors in their previous relative order, with the
    /// inserted standbys.
    pub order: Vec<usize>,
    /// The failed nodes that were in the ring and have been removed, in ring order.
    pub removed: Vec<usize>,
    /// `(standby, position)` for each inserted standby, in the order they were given;
    /// `position` is the standby's index in the final `order`.
    pub inserted: Vec<(usize, usize)>,
    /// Failed indices that were not ring members (ignored), deduplicated, in input order.
    pub ignored_failed: Vec<usize>,
    /// Standby indices not inserted: out of range of the matrix, already a ring member,
    /// failed, or repeated.
    pub skipped_standby: Vec<usize>,
    /// The new ring's bottleneck in Mbit/s ([`bottleneck`]; `f32::INFINITY` below 2 nodes).
    pub bottleneck: f32,
}

/// Paper Algorithm 2 (§4.3), generalised to several simultaneous failures (DESIGN §4:
/// several failures at once are one reconfiguration).
///
/// `order` is the current ring, `failed` the nodes that failed, `standby` the spare nodes
/// available, all as indices into `bw` (which covers members and standbys; links to indices
/// out of range count as 0 Mbit/s). Every failed member is removed at once, so each
/// survivor's predecessor is connected to its next surviving successor. Then each usable
/// standby, in the given order, is inserted at the position that maximises the ring's
/// resulting bottleneck (ties: the larger minimum of its two new links, then the earliest
/// position). If appending all standbys at the end in the given order gives a strictly
/// higher bottleneck, that is used instead, so the result is never worse than appending.
///
/// Never panics: an empty ring, all members failed, duplicates anywhere (a ring's repeated
/// member keeps its first occurrence), and out-of-range indices are all handled.
/// O((|order| + |standby|) · |standby|).
pub fn recover(
    order: &[usize],
    failed: &[usize],
    standby: &[usize],
    bw: &BandwidthMatrix,
) -> RecoveryPlan {
    let mut seen = std::collections::HashSet::new();
    let ring: Vec<usize> = order.iter().copied().filter(|v| seen.insert(*v)).collect();
    let members: std::collections::HashSet<usize> = ring.iter().copied().collect();
    let failed_set: std::collections::HashSet<usize> = failed.iter().copied().collect();

    let removed: Vec<usize> = ring
        .iter()
        .copied()
        .filter(|v| failed_set.contains(v))
        .collect();
    let mut ignored_failed = Vec::new();
    let mut dedup = std::collections::HashSet::new();
    for &f in failed {
        if dedup.insert(f) && !members.contains(&f) {
            ignored_failed.push(f);
        }
    }
    let survivors: Vec<usize> = ring
        .iter()
        .copied()
        .filter(|v| !failed_set.contains(v))
        .collect();

    let mut usable = Vec::new();
    let mut skipped_standby = Vec::new();
    let mut taken = std::collections::HashSet::new();
    for &s in standby {
        if s >= bw.n() || members.contains(&s) || failed_set.contains(&s) || !taken.insert(s) {
            skipped_standby.push(s);
        } else {
            usable.push(s);
        }
    }

    let mut best_insert = survivors.clone();
    for &s in &usable {
        let pos = best_position(&best_insert, s, bw);
        best_insert.insert(pos, s);
    }
    let mut appended = survivors;
    appended.extend_from_slice(&usable);
    let (b_ins, b_app) = (bottleneck(bw, &best_insert), bottleneck(bw, &appended));
    let (order, bottleneck) = if b_app > b_ins {
        (appended, b_app)
    } else {
        (best_insert, b_ins)
    };

    let inserted = usable
        .iter()
        .map(|&s| (s, order.iter().position(|&v| v == s).unwrap_or(usize::MAX)))
        .collect();
    RecoveryPlan {
        order,
        removed,
        inserted,
        ignored_failed,
        skipped_standby,
        bottleneck,
    }
}

/// The index at which to insert `s` into `ring` (between `ring[p-1]` and `ring[p]`, with
/// `p = len` meaning between the last and the first) maximising the resulting bottleneck.
fn best_position(ring: &[usize], s: usize, bw: &BandwidthMatrix) -> usize {
    let m = ring.len();
    if m == 0 {
        return 0;
    }
    if m == 1 {
        return 1;
    }
    // edge k: ring[k] -> ring[k+1 mod m]; inserting at p = k+1 replaces edge k.
    let e: Vec<f32> = (0..m).map(|k| bw.get(ring[k], ring[(k + 1) % m])).collect();
    let mut pre = vec![f32::INFINITY; m + 1];
    let mut suf = vec![f32::INFINITY; m + 1];
    for k in 0..m {
        pre[k + 1] = pre[k].min(e[k]);
    }
    for k in (0..m).rev() {
        suf[k] = suf[k + 1].min(e[k]);
    }
    let mut best = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    let mut best_p = m;
    for k in 0..m {
        let (a, b) = (ring[k], ring[(k + 1) % m]);
        let new_min = bw.get(a, s).min(bw.get(s, b));
        let key = (pre[k].min(suf[k + 1]).min(new_min), new_min);
        if key > best {
            best = key;
            best_p = k + 1;
        }
    }
    best_p
}
