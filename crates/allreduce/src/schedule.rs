//! The ring all-reduce schedule (pure): how a vector is cut into chunks and pieces, who sends
//! which chunk at which step, and the reference sum in the ring's order.
//!
//! # Shapes
//!
//! A round reduces a vector of `len` `f32` elements held by each of the `n` ring members
//! (member `r` sends to member `(r + 1) mod n`). The vector is cut into `n` contiguous
//! *chunks*: the first `len mod n` chunks hold `len / n + 1` elements, the others `len / n`
//! (sizes differ by at most one element; with `len < n` some chunks are empty). Each chunk is
//! cut into *pieces* of at most `piece_elems` elements, the unit that travels and is signed.
//!
//! # Steps (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
//! workstations", J. Parallel Distrib. Comput. 69(2))
//!
//! * reduce-scatter, step `s` in `0..n-1`: member `r` sends chunk `(r − s) mod n` to its
//!   successor and receives chunk `(r − s − 1) mod n` from its predecessor, adding it into
//!   its own copy. After the last step member `r` holds the complete sum of chunk
//!   `(r + 1) mod n` (the chunk's *owner*; chunk `c` is owned by member `(c − 1) mod n`).
//! * all-gather, step `s` in `0..n-1`: member `r` sends chunk `(r + 1 − s) mod n` and
//!   receives chunk `(r − s) mod n`, overwriting its copy.
//!
//! Each member sends and receives `2(n − 1)/n × len` elements, the lower bound for any
//! all-reduce (Patarasuk & Yuan 2009, Theorem 1).
//!
//! The two phases form `2(n − 1)` *global steps* `g`: reduce-scatter step `s` is `g = s`,
//! all-gather step `s` is `g = n − 1 + s`. What a member receives at global step `g` is what
//! it sends at `g + 1` (the same chunk), so a piece can be forwarded as soon as it arrives:
//! that is the pipelining.
//!
//! # Summation order and its consequence
//!
//! The ring's input at member `i` is `w_i · δ_i`, computed locally in `f32` ([`weight_in_place`]).
//! Element `j` of chunk `c` is reduced along the ring starting at member `c`:
//! `acc = x_c[j]`, then for `k = 1..n`: `acc = acc + x_{(c+k) mod n}[j]` (f32 addition, round
//! to nearest even; IEEE addition is commutative, so which operand the receiver holds does
//! not matter, only the order of the additions). The owner `(c − 1) mod n` computes the final value once; the all-gather
//! copies its bytes to every other member, so **every member ends with the same bytes**.
//! [`reference_sum`] computes exactly this order. Floating-point addition is not associative,
//! so the result may differ in its low bits from a star sum `((x_0 + x_1) + x_2) + …` (and
//! from one chunk to another the order differs), but never between members.

use std::ops::Range;

/// The two phases of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Partial sums travel and are added in.
    ReduceScatter,
    /// Complete sums travel and overwrite.
    AllGather,
}

impl Phase {
    /// The wire code: 0 reduce-scatter, 1 all-gather.
    pub fn code(self) -> u8 {
        match self {
            Phase::ReduceScatter => 0,
            Phase::AllGather => 1,
        }
    }

    /// The phase of a wire code; `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<Phase> {
        match code {
            0 => Some(Phase::ReduceScatter),
            1 => Some(Phase::AllGather),
            _ => None,
        }
    }
}

/// The cut of a `len`-element vector among `n` members into chunks and pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// Elements in the vector.
    pub len: usize,
    /// Ring members (≥ 1).
    pub n: usize,
    /// Maximum elements per piece (≥ 1).
    pub piece_elems: usize,
}

impl Schedule {
    /// A schedule; `n` and `piece_elems` are raised to at least 1.
    pub fn new(len: usize, n: usize, piece_elems: usize) -> Schedule {
        Schedule {
            len,
            n: n.max(1),
            piece_elems: piece_elems.max(1),
        }
    }

    /// The element range of chunk `c` (`c < n`): the first `len mod n` chunks hold one
    /// element more.
    pub fn chunk(&self, c: usize) -> Range<usize> {
        let base = self.len / self.n;
        let extra = self.len % self.n;
        let start = c * base + c.min(extra);
        let size = base + usize::from(c < extra);
        start..start + size
    }

    /// Pieces in chunk `c`: `ceil(chunk len / piece_elems)` (0 for an empty chunk).
    pub fn pieces(&self, c: usize) -> usize {
        self.chunk(c).len().div_ceil(self.piece_elems)
    }

    /// The element range of piece `p` of chunk `c` (`p < pieces(c)`).
    pub fn piece(&self, c: usize, p: usize) -> Range<usize> {
        let ch = self.chunk(c);
        let start = ch.start + p * self.piece_elems;
        start..(start + self.piece_elems).min(ch.end)
    }

    /// The piece index of the piece of chunk `c` that starts at element `offset` and holds
    /// `len` elements; `None` when no piece of the chunk has exactly those bounds.
    pub fn piece_index(&self, c: usize, offset: u64, len: u64) -> Option<usize> {
        let ch = self.chunk(c);
        let offset = usize::try_from(offset).ok()?;
        if offset < ch.start || offset >= ch.end {
            return None;
        }
        let rel = offset - ch.start;
        if !rel.is_multiple_of(self.piece_elems) {
            return None;
        }
        let p = rel / self.piece_elems;
        (self.piece(c, p).len() as u64 == len).then_some(p)
    }

    /// Global steps in a round: `2(n − 1)`.
    pub fn global_steps(&self) -> usize {
        2 * (self.n - 1)
    }

    /// The (phase, step within the phase) of global step `g`.
    pub fn phase_of(&self, g: usize) -> (Phase, usize) {
        if g < self.n - 1 {
            (Phase::ReduceScatter, g)
        } else {
            (Phase::AllGather, g - (self.n - 1))
        }
    }

    /// The global step of (phase, step); `None` when the step is out of range.
    pub fn global_step(&self, phase: Phase, step: u64) -> Option<usize> {
        let step = usize::try_from(step).ok()?;
        if step >= self.n - 1 {
            return None;
        }
        Some(match phase {
            Phase::ReduceScatter => step,
            Phase::AllGather => self.n - 1 + step,
        })
    }

    /// The chunk member `r` sends at global step `g`.
    pub fn send_chunk(&self, r: usize, g: usize) -> usize {
        let n = self.n;
        match self.phase_of(g) {
            (Phase::ReduceScatter, s) => (r + n - s % n) % n,
            (Phase::AllGather, s) => (r + 1 + n - s % n) % n,
        }
    }

    /// The chunk member `r` receives at global step `g` (from its predecessor).
    pub fn recv_chunk(&self, r: usize, g: usize) -> usize {
        let n = self.n;
        match self.phase_of(g) {
            (Phase::ReduceScatter, s) => (r + 2 * n - s % n - 1) % n,
            (Phase::AllGather, s) => (r + n - s % n) % n,
        }
    }

    /// Pieces member `r` sends (and, by symmetry, receives) in a whole round.
    pub fn pieces_per_round(&self, r: usize) -> usize {
        (0..self.global_steps())
            .map(|g| self.pieces(self.send_chunk(r, g)))
            .sum()
    }
}

/// Multiplies `data` by `w` in place (f32): the ring's input `w_i · δ_i`.
pub fn weight_in_place(data: &mut [f32], w: f32) {
    for x in data {
        *x *= w;
    }
}

/// Adds `incoming` into `own` element by element (`own[j] = own[j] + incoming[j]`, f32):
/// the reduce-scatter step. Lengths must match (the shorter one bounds the loop).
pub fn add_into(own: &mut [f32], incoming: &[f32]) {
    for (o, i) in own.iter_mut().zip(incoming) {
        *o += *i;
    }
}

/// The sum `Σ inputs[i]` in the ring's order (module docs): for element `j` of chunk `c`,
/// `acc = x_c[j]`, then `acc = acc + x_{(c+k) mod n}[j]` for `k = 1..n`. `inputs` holds the
/// `n` members' (already weighted) vectors in ring order, all of the same length; the result
/// is what every member holds after a round, bit for bit.
pub fn reference_sum(inputs: &[&[f32]]) -> Vec<f32> {
    let n = inputs.len();
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    let sched = Schedule::new(first.len(), n, 1);
    let mut out = vec![0f32; first.len()];
    for c in 0..n {
        for j in sched.chunk(c) {
            let mut acc = inputs[c][j];
            for k in 1..n {
                acc += inputs[(c + k) % n][j];
            }
            out[j] = acc;
        }
    }
    out
}

/// Runs the whole schedule in memory on `members` (one vector per ring member, equal
/// lengths), piece by piece, step by step, as the ring would; afterwards every member holds
/// the sum. For tests and as an executable statement of the schedule.
pub fn simulate(members: &mut [Vec<f32>], piece_elems: usize) {
    let n = members.len();
    let Some(len) = members.first().map(Vec::len) else {
        return;
    };
    let sched = Schedule::new(len, n, piece_elems);
    for g in 0..sched.global_steps() {
        // Every member sends its chunk for step g, computed from its state before the step.
        let sent: Vec<(usize, Vec<f32>)> = (0..n)
            .map(|r| {
                let c = sched.send_chunk(r, g);
                (c, members[r][sched.chunk(c)].to_vec())
            })
            .collect();
        for (r, (c, payload)) in sent.into_iter().enumerate() {
            let to = (r + 1) % n;
            debug_assert_eq!(sched.recv_chunk(to, g), c);
            let base = sched.chunk(c).start;
            for p in 0..sched.pieces(c) {
                let range = sched.piece(c, p);
                let src = &payload[range.start - base..range.end - base];
                match sched.phase_of(g).0 {
                    Phase::ReduceScatter => add_into(&mut members[to][range], src),
                    Phase::AllGather => members[to][range].copy_from_slice(src),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn chunks_cover_the_vector_and_differ_by_at_most_one() {
        for n in 1..=9 {
            for len in 0..40 {
                let s = Schedule::new(len, n, 3);
                let mut next = 0;
                let sizes: Vec<usize> = (0..n).map(|c| s.chunk(c).len()).collect();
                for c in 0..n {
                    assert_eq!(s.chunk(c).start, next);
                    next = s.chunk(c).end;
                    let mut pn = s.chunk(c).start;
                    for p in 0..s.pieces(c) {
                        let r = s.piece(c, p);
                        assert_eq!(r.start, pn);
                        assert!(!r.is_empty() && r.len() <= 3);
                        assert_eq!(s.piece_index(c, r.start as u64, r.len() as u64), Some(p));
                        pn = r.end;
                    }
                    assert_eq!(pn, s.chunk(c).end);
                }
                assert_eq!(next, len);
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn what_is_received_is_what_is_forwarded_next() {
        for n in 2..=9 {
            let s = Schedule::new(100, n, 7);
            for r in 0..n {
                let pred = (r + n - 1) % n;
                for g in 0..s.global_steps() {
                    assert_eq!(s.recv_chunk(r, g), s.send_chunk(pred, g));
                    if g + 1 < s.global_steps() {
                        assert_eq!(s.recv_chunk(r, g), s.send_chunk(r, g + 1));
                    }
                }
                // The last reduce-scatter step leaves member r owning chunk r + 1.
                assert_eq!(s.recv_chunk(r, n - 2), (r + 1) % n);
                assert_eq!(s.send_chunk(r, n - 1), (r + 1) % n);
            }
        }
    }

    #[test]
    fn piece_index_rejects_wrong_bounds() {
        let s = Schedule::new(10, 2, 3); // chunk 0 = 0..5 (pieces 0..3, 3..5)
        assert_eq!(s.piece_index(0, 3, 2), Some(1));
        assert_eq!(s.piece_index(0, 3, 3), None);
        assert_eq!(s.piece_index(0, 1, 2), None);
        assert_eq!(s.piece_index(0, 5, 2), None);
        assert_eq!(s.piece_index(0, u64::MAX, 2), None);
        assert_eq!(s.global_step(Phase::AllGather, 1), None);
        assert_eq!(s.global_step(Phase::AllGather, 0), Some(1));
    }

    fn inputs() -> impl Strategy<Value = (Vec<Vec<f32>>, usize)> {
        (1usize..=9, 0usize..60, 1usize..9).prop_flat_map(|(n, len, piece)| {
            (
                proptest::collection::vec(
                    proptest::collection::vec(-1.0e3f32..1.0e3, len..=len),
                    n..=n,
                ),
                Just(piece),
            )
        })
    }

    proptest! {
        #[test]
        fn simulated_ring_ends_bit_identical_to_the_reference(
            (mut members, piece) in inputs(),
            weights in proptest::collection::vec(-2.0f32..2.0, 9),
        ) {
            for (m, w) in members.iter_mut().zip(&weights) {
                weight_in_place(m, *w);
            }
            let refs: Vec<&[f32]> = members.iter().map(Vec::as_slice).collect();
            let want: Vec<u32> = reference_sum(&refs).iter().map(|x| x.to_bits()).collect();
            simulate(&mut members, piece);
            for m in &members {
                let got: Vec<u32> = m.iter().map(|x| x.to_bits()).collect();
                prop_assert_eq!(&got, &want);
            }
        }
    }
}
