//! Attribution of a wrong round (pure): which member sent a partial sum that is not what the
//! schedule says it should have been, proved from the signed pieces the members received.
//!
//! # What is known after a failed round
//!
//! When the orchestrator's check of a round fails, the epoch falls back to the star
//! (DESIGN §4b): every member uploads its delta `δ_i` (which must hash to its commitment)
//! and its *evidence*, the [`SignedPiece`]s it received from its predecessor. A signed piece
//! binds its sender to the SHA-256 of the payload it sent for (phase, step, chunk, offset,
//! len) of one ring version ([`crate::wire`]).
//!
//! # What each piece should have been
//!
//! With the members' weighted inputs `x_i = w_i · δ_i` ([`weight_in_place`], f32) the
//! schedule fixes every payload bit for bit ([`crate::schedule`], "Summation order"): the
//! reduce-scatter piece of chunk `c` at step `s` is the left fold
//! `((x_c + x_{c+1}) + …) + x_{c+s}` over the piece's range (indices mod `n`), and every
//! all-gather piece of chunk `c` is the complete fold to `x_{c+n−1}`. [`audit`] recomputes
//! the SHA-256 of each evidence piece's expected payload, chunk by chunk, keeping one
//! running fold of a chunk's length (`len / n` f32) at a time; a piece whose fold needs an
//! input that is not held is *unverifiable* and proves nothing, and so is one whose expected
//! values are not all finite (IEEE 754 leaves a NaN's bits to the hardware, so an honest
//! member's bytes could differ from the recomputation).
//!
//! # Who is to blame
//!
//! A *wrong* piece (its signed hash differs from the expected one) from sender `S` at global
//! step `g` proves `S` misbehaved when `S`'s own input to it is known to be right:
//!
//! * at `g = 0` the input is `S`'s weighted delta alone, so `S` is to blame;
//! * at `g > 0` the input is the piece `S` received at `g − 1` for the same chunk and range
//!   (what is received at `g` is what is forwarded at `g + 1`): when `S`'s evidence holds
//!   that piece and it is right, `S` is to blame, and the finding carries both pieces;
//!   when it is wrong too, the fault lies upstream and `S` is not blamed for this piece;
//!   when `S` did not hand it in, `S` is *undetermined* (named, not blamed: a member that
//!   crashed before sending its evidence must not be slashed for its predecessor's fault).
//!
//! An honest member is therefore never blamed: its outgoing piece is wrong only when its
//! input was, and its own evidence shows that input (the predecessor's signature on it
//! cannot be forged). A receiver cannot frame its predecessor either: it can only hand in
//! pieces the predecessor signed. Pieces whose signature does not verify under the
//! receiver's predecessor, of another job, epoch or ring version, or that do not fit the
//! schedule (an honest receiver refuses those during the round) are *refused* and prove
//! nothing.
//!
//! Cost: `O(n · len)` f32 additions and SHA-256 over every evidence piece's payload
//! (`≈ 2(n − 1) · len` elements over all members' evidence); memory: the `n` weighted
//! inputs (`4 · len` bytes each, owned by the audit) plus one chunk.

use std::collections::{BTreeMap, HashMap};

use hanzod_actors::types::NodeId;
use hanzod_protocol::identity;

use crate::schedule::{add_into, weight_in_place, Phase, Schedule};
use crate::wire::{encode_f32s, sha256, SignedPiece};

/// What [`audit`] examines.
#[derive(Debug, Clone)]
pub struct AuditInput<'a> {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The ring version of the round.
    pub ring_version: u64,
    /// The round's members in ring order with the weights the round ran with (member `k`
    /// sends to member `k + 1 mod n`).
    pub ring: &'a [(NodeId, f32)],
    /// Each member's delta in the shared flat order (`hanzod_protocol::round::flat_values`),
    /// in ring order, unweighted; `None` where it is not held (not uploaded, or not matching
    /// its commitment). Known deltas must all have the same length; one that does not is
    /// treated as unknown.
    pub deltas: Vec<Option<Vec<f32>>>,
    /// Per receiving member: the pieces it received (signed by its predecessor).
    pub evidence: &'a [(NodeId, Vec<SignedPiece>)],
}

/// A proved wrong partial sum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The member that signed and sent the wrong piece.
    pub sender: NodeId,
    /// The member that received it and handed it in.
    pub receiver: NodeId,
    /// The wrong piece.
    pub piece: SignedPiece,
    /// SHA-256 of the payload the schedule says the piece should have carried.
    pub expected: [u8; 32],
    /// The right piece the sender had received as its input (`None` at global step 0,
    /// where its input is its own weighted delta).
    pub input: Option<SignedPiece>,
}

/// What [`audit`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// One finding per member proved to have sent a wrong piece (its earliest), in ring
    /// order.
    pub guilty: Vec<Finding>,
    /// Members that sent a wrong piece but did not hand in the input it was computed from
    /// (not blamed), in ring order.
    pub undetermined: Vec<NodeId>,
    /// Pieces whose expected hash was computed.
    pub checked: usize,
    /// Of those, pieces whose hash differs.
    pub wrong: usize,
    /// Pieces whose fold needs a delta that is not held.
    pub unverifiable: usize,
    /// Pieces refused (bad signature, another round, not in the schedule, duplicates).
    pub refused: usize,
}

/// One admitted evidence piece.
struct Entry {
    /// The receiver's rank (the sender is the rank before it).
    receiver: usize,
    /// Global step.
    g: usize,
    chunk: usize,
    start: usize,
    end: usize,
    piece: SignedPiece,
    expected: Option<[u8; 32]>,
}

/// Attributes a wrong round (module docs). Deterministic: the same input gives the same
/// audit.
pub fn audit(input: AuditInput<'_>) -> Audit {
    let mut out = Audit::default();
    let n = input.ring.len();
    let total_pieces: usize = input.evidence.iter().map(|(_, p)| p.len()).sum();
    // The length every known delta must have: the most common one.
    let mut lens: BTreeMap<usize, usize> = BTreeMap::new();
    for d in input.deltas.iter().flatten() {
        *lens.entry(d.len()).or_default() += 1;
    }
    let len = lens.iter().max_by_key(|(l, c)| (**c, **l)).map(|(l, _)| *l);
    let (Some(len), true) = (len, n >= 2 && input.deltas.len() == n) else {
        out.unverifiable = total_pieces;
        return out;
    };
    let inputs: Vec<Option<Vec<f32>>> = input
        .deltas
        .into_iter()
        .zip(input.ring)
        .map(|(d, (_, w))| {
            d.filter(|d| d.len() == len).map(|mut d| {
                weight_in_place(&mut d, *w);
                d
            })
        })
        .collect();
    let rank: HashMap<NodeId, usize> = input
        .ring
        .iter()
        .enumerate()
        .map(|(i, (id, _))| (*id, i))
        .collect();
    let sched = Schedule::new(len, n, 1);

    // Admit the pieces that verify and fit the schedule.
    let mut entries: Vec<Entry> = Vec::new();
    let mut seen: HashMap<(usize, usize, usize, usize), usize> = HashMap::new();
    for (receiver, pieces) in input.evidence {
        let Some(&r) = rank.get(receiver) else {
            out.refused += pieces.len();
            continue;
        };
        let sender = (r + n - 1) % n;
        let key = identity::verifying_key(&input.ring[sender].0).ok();
        for piece in pieces {
            let h = &piece.header;
            let admitted = key.as_ref().is_some_and(|k| piece.verify(k).is_ok())
                && (h.job, h.epoch, h.ring_version) == (input.job, input.epoch, input.ring_version);
            let placed = admitted
                .then(|| sched.global_step(h.phase, u64::from(h.step)))
                .flatten()
                .and_then(|g| {
                    let chunk = h.chunk as usize;
                    if chunk >= n {
                        return None;
                    }
                    let range = sched.chunk(chunk);
                    let start = usize::try_from(h.offset).ok()?;
                    let end = start.checked_add(h.len as usize)?;
                    (sched.send_chunk(sender, g) == chunk
                        && h.len > 0
                        && start >= range.start
                        && end <= range.end)
                        .then_some((g, chunk, start, end))
                });
            let Some((g, chunk, start, end)) = placed else {
                out.refused += 1;
                continue;
            };
            if seen.insert((r, g, start, end), entries.len()).is_some() {
                out.refused += 1;
                continue;
            }
            entries.push(Entry {
                receiver: r,
                g,
                chunk,
                start,
                end,
                piece: *piece,
                expected: None,
            });
        }
    }

    // Expected hashes, chunk by chunk: fold depth s for reduce-scatter step s, n − 1 for
    // the all-gather.
    let mut by_chunk: Vec<BTreeMap<usize, Vec<usize>>> = vec![BTreeMap::new(); n];
    for (i, e) in entries.iter().enumerate() {
        let depth = match sched.phase_of(e.g) {
            (Phase::ReduceScatter, s) => s,
            (Phase::AllGather, _) => n - 1,
        };
        by_chunk[e.chunk].entry(depth).or_default().push(i);
    }
    let mut bytes = Vec::new();
    for (c, depths) in by_chunk.iter().enumerate() {
        if depths.is_empty() {
            continue;
        }
        let range = sched.chunk(c);
        let mut acc: Option<Vec<f32>> = inputs[c].as_ref().map(|x| x[range.clone()].to_vec());
        for k in 0..n {
            if k > 0 {
                acc = match (acc, &inputs[(c + k) % n]) {
                    (Some(mut a), Some(x)) => {
                        add_into(&mut a, &x[range.clone()]);
                        Some(a)
                    }
                    _ => None,
                };
            }
            let Some(ids) = depths.get(&k) else { continue };
            for &i in ids {
                let e = &mut entries[i];
                e.expected = acc.as_ref().and_then(|a| {
                    let values = &a[e.start - range.start..e.end - range.start];
                    if !values.iter().all(|v| v.is_finite()) {
                        return None;
                    }
                    bytes.clear();
                    encode_f32s(values, &mut bytes);
                    Some(sha256(&bytes))
                });
            }
        }
    }

    // Blame (module docs).
    let mut guilty: BTreeMap<usize, Finding> = BTreeMap::new();
    let mut earliest: BTreeMap<usize, usize> = BTreeMap::new();
    let mut undetermined: BTreeMap<usize, ()> = BTreeMap::new();
    for e in &entries {
        let Some(expected) = e.expected else {
            out.unverifiable += 1;
            continue;
        };
        out.checked += 1;
        if expected == e.piece.header.payload_sha256 {
            continue;
        }
        out.wrong += 1;
        let sender = (e.receiver + n - 1) % n;
        let input_piece = if e.g == 0 {
            Some(None)
        } else {
            match seen
                .get(&(sender, e.g - 1, e.start, e.end))
                .map(|&i| &entries[i])
            {
                Some(prev) if prev.expected == Some(prev.piece.header.payload_sha256) => {
                    Some(Some(prev.piece))
                }
                // The input was wrong too: the fault lies upstream.
                Some(_) => continue,
                None => None,
            }
        };
        match input_piece {
            Some(proof) => {
                if earliest.get(&sender).is_none_or(|g| e.g < *g) {
                    earliest.insert(sender, e.g);
                    guilty.insert(
                        sender,
                        Finding {
                            sender: input.ring[sender].0,
                            receiver: input.ring[e.receiver].0,
                            piece: e.piece,
                            expected,
                            input: proof,
                        },
                    );
                }
            }
            None => {
                undetermined.insert(sender, ());
            }
        }
    }
    out.undetermined = undetermined
        .keys()
        .filter(|s| !guilty.contains_key(s))
        .map(|s| input.ring[*s].0)
        .collect();
    out.guilty = guilty.into_values().collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PieceHeader;
    use hanzod_protocol::identity::Identity;
    use proptest::prelude::*;

    const JOB: u64 = 7;
    const EPOCH: u32 = 3;
    const VERSION: u64 = 5;

    /// A fault in the simulated round: `member` adds `by` to the first element of every
    /// piece it sends at global step `g`.
    #[derive(Debug, Clone, Copy)]
    struct Tamper {
        member: usize,
        g: usize,
        by: f32,
    }

    fn ids(n: usize) -> Vec<Identity> {
        (0..n)
            .map(|i| Identity::from_seed([i as u8 + 1; 32]))
            .collect()
    }

    /// Runs the schedule in memory as [`crate::schedule::simulate`] does, signing every
    /// piece, and returns each member's evidence (what it received).
    fn signed_round(
        keys: &[Identity],
        deltas: &[Vec<f32>],
        weights: &[f32],
        piece: usize,
        tamper: Option<Tamper>,
    ) -> Vec<(NodeId, Vec<SignedPiece>)> {
        let n = keys.len();
        let mut m: Vec<Vec<f32>> = deltas
            .iter()
            .zip(weights)
            .map(|(d, w)| {
                let mut d = d.clone();
                weight_in_place(&mut d, *w);
                d
            })
            .collect();
        let len = m[0].len();
        let sched = Schedule::new(len, n, piece);
        let mut evidence: Vec<Vec<SignedPiece>> = vec![Vec::new(); n];
        for g in 0..sched.global_steps() {
            let (phase, step) = sched.phase_of(g);
            let mut sent = Vec::new();
            for r in 0..n {
                let c = sched.send_chunk(r, g);
                for p in 0..sched.pieces(c) {
                    let range = sched.piece(c, p);
                    let mut payload = m[r][range.clone()].to_vec();
                    if let Some(t) = tamper.filter(|t| t.member == r && t.g == g) {
                        payload[0] += t.by;
                    }
                    let mut b = Vec::new();
                    encode_f32s(&payload, &mut b);
                    let header = PieceHeader {
                        job: JOB,
                        epoch: EPOCH,
                        ring_version: VERSION,
                        phase,
                        step: step as u32,
                        chunk: c as u32,
                        offset: range.start as u64,
                        len: range.len() as u32,
                        payload_sha256: sha256(&b),
                    };
                    sent.push((
                        (r + 1) % n,
                        range,
                        payload,
                        SignedPiece::sign(header, &keys[r]),
                    ));
                }
            }
            for (to, range, payload, signed) in sent {
                match phase {
                    Phase::ReduceScatter => add_into(&mut m[to][range], &payload),
                    Phase::AllGather => m[to][range].copy_from_slice(&payload),
                }
                evidence[to].push(signed);
            }
        }
        keys.iter().map(|k| k.node_id()).zip(evidence).collect()
    }

    fn ring_of(keys: &[Identity], weights: &[f32]) -> Vec<(NodeId, f32)> {
        keys.iter()
            .map(|k| k.node_id())
            .zip(weights.iter().copied())
            .collect()
    }

    fn run(
        keys: &[Identity],
        deltas: &[Vec<f32>],
        weights: &[f32],
        evidence: &[(NodeId, Vec<SignedPiece>)],
        known: &[bool],
    ) -> Audit {
        let ring = ring_of(keys, weights);
        audit(AuditInput {
            job: JOB,
            epoch: EPOCH,
            ring_version: VERSION,
            ring: &ring,
            deltas: deltas
                .iter()
                .zip(known)
                .map(|(d, k)| k.then(|| d.clone()))
                .collect(),
            evidence,
        })
    }

    fn deltas(n: usize, len: usize) -> Vec<Vec<f32>> {
        (0..n)
            .map(|i| {
                (0..len)
                    .map(|j| ((i * 31 + j * 7) % 13) as f32 * 0.37 - 2.0)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn an_honest_round_has_nothing_wrong() {
        let keys = ids(4);
        let d = deltas(4, 50);
        let w = [0.1, 0.2, 0.3, 0.4];
        let ev = signed_round(&keys, &d, &w, 4, None);
        let a = run(&keys, &d, &w, &ev, &[true; 4]);
        let total: usize = ev.iter().map(|(_, p)| p.len()).sum();
        assert_eq!(a.checked, total);
        assert_eq!((a.wrong, a.unverifiable, a.refused), (0, 0, 0));
        assert!(a.guilty.is_empty() && a.undetermined.is_empty());
    }

    #[test]
    fn a_tampered_input_is_attributed_to_its_sender() {
        for n in 2..=6 {
            let keys = ids(n);
            let d = deltas(n, 37);
            let w = vec![1.0 / n as f32; n];
            for t in 0..n {
                let tamper = Tamper {
                    member: t,
                    g: 0,
                    by: 0.5,
                };
                let ev = signed_round(&keys, &d, &w, 3, Some(tamper));
                let a = run(&keys, &d, &w, &ev, &vec![true; n]);
                assert_eq!(a.guilty.len(), 1, "n={n} t={t}: {a:?}");
                let f = &a.guilty[0];
                assert_eq!(f.sender, keys[t].node_id());
                assert_eq!(f.receiver, keys[(t + 1) % n].node_id());
                assert_eq!(f.input, None);
                assert_ne!(f.expected, f.piece.header.payload_sha256);
                assert!(a.undetermined.is_empty());
            }
        }
    }

    #[test]
    fn a_tampered_forward_carries_the_right_input_as_proof() {
        let (n, t, g) = (5, 2, 3);
        let keys = ids(n);
        let d = deltas(n, 40);
        let w = [0.2f32; 5];
        let ev = signed_round(
            &keys,
            &d,
            &w,
            8,
            Some(Tamper {
                member: t,
                g,
                by: 1e-3,
            }),
        );
        let a = run(&keys, &d, &w, &ev, &[true; 5]);
        assert_eq!(a.guilty.len(), 1, "{a:?}");
        let f = &a.guilty[0];
        assert_eq!(f.sender, keys[t].node_id());
        let input = f.input.expect("a forwarded piece's input is proof");
        assert_eq!(
            (input.header.chunk, input.header.offset, input.header.len),
            (
                f.piece.header.chunk,
                f.piece.header.offset,
                f.piece.header.len
            )
        );
        // The input piece was signed by the tamperer's predecessor.
        let pred = identity::verifying_key(&keys[t - 1].node_id()).unwrap();
        input.verify(&pred).unwrap();
        // Every wrong piece downstream is explained; the wrong ones are all counted.
        assert!(a.wrong >= 1);
    }

    #[test]
    fn a_withheld_input_leaves_the_sender_undetermined_not_blamed() {
        let (n, t) = (4, 1);
        let keys = ids(n);
        let d = deltas(n, 33);
        let w = [0.25f32; 4];
        let mut ev = signed_round(
            &keys,
            &d,
            &w,
            4,
            Some(Tamper {
                member: t,
                g: 2,
                by: 2.0,
            }),
        );
        ev.retain(|(r, _)| *r != keys[t].node_id());
        let a = run(&keys, &d, &w, &ev, &[true; 4]);
        assert!(a.guilty.is_empty(), "{a:?}");
        assert_eq!(a.undetermined, vec![keys[t].node_id()]);
    }

    #[test]
    fn forged_and_foreign_pieces_are_refused() {
        let keys = ids(3);
        let d = deltas(3, 12);
        let w = [0.5f32, 0.25, 0.25];
        let mut ev = signed_round(&keys, &d, &w, 2, None);
        // A receiver hands in a piece "from its predecessor" that it signed itself, with a
        // wrong hash: refused, nobody blamed.
        let mut forged = ev[1].1[0];
        forged.header.payload_sha256 = [9; 32];
        ev[1].1.push(SignedPiece::sign(forged.header, &keys[1]));
        // A piece of another ring version.
        let mut other = ev[2].1[0].header;
        other.ring_version = VERSION + 1;
        ev[2].1.push(SignedPiece::sign(other, &keys[1]));
        // A duplicate.
        let dup = ev[0].1[0];
        ev[0].1.push(dup);
        let a = run(&keys, &d, &w, &ev, &[true; 3]);
        assert_eq!(a.refused, 3);
        assert_eq!(a.wrong, 0);
        assert!(a.guilty.is_empty());
    }

    #[test]
    fn pieces_needing_an_unknown_delta_are_unverifiable() {
        let keys = ids(3);
        let d = deltas(3, 30);
        let w = [0.5f32, 0.25, 0.25];
        let ev = signed_round(
            &keys,
            &d,
            &w,
            5,
            Some(Tamper {
                member: 1,
                g: 0,
                by: 1.0,
            }),
        );
        // Member 1's own delta is unknown: its step-0 piece cannot be judged.
        let a = run(&keys, &d, &w, &ev, &[true, false, true]);
        assert!(a.guilty.is_empty(), "{a:?}");
        assert!(a.unverifiable > 0);
        // Step-0 pieces of members 0 and 2 are still checked.
        assert!(a.checked > 0);
    }

    #[test]
    fn a_fold_that_is_not_finite_is_unverifiable_not_blamed() {
        let keys = ids(3);
        let mut d = deltas(3, 9);
        // ∞ + (−∞) is a NaN whose bits the hardware picks: nothing past it is judged.
        d[0][0] = f32::INFINITY;
        d[1][0] = f32::NEG_INFINITY;
        let w = [0.5f32, 0.25, 0.25];
        let mut ev = signed_round(&keys, &d, &w, 2, None);
        // A member that forwarded other NaN bits would look wrong: simulate it by
        // re-signing member 1's pieces with a different hash where the expected is NaN.
        for p in ev[2].1.iter_mut().filter(|p| p.header.offset == 0) {
            let mut h = p.header;
            h.payload_sha256 = [3; 32];
            *p = SignedPiece::sign(h, &keys[1]);
        }
        let a = run(&keys, &d, &w, &ev, &[true; 3]);
        assert!(a.guilty.is_empty() && a.undetermined.is_empty(), "{a:?}");
        assert!(a.unverifiable > 0 && a.checked > 0, "{a:?}");
    }

    proptest! {
        /// Whatever the ring, the tamper point, the withheld evidence and the unknown
        /// deltas, only the tamperer is ever blamed; and it is blamed whenever the proof
        /// exists (its successor's evidence, its delta and, past step 0, its own evidence).
        #[test]
        fn only_the_tamperer_is_ever_blamed(
            n in 2usize..=6,
            len in 1usize..40,
            piece in 1usize..7,
            t in 0usize..6,
            g in 0usize..10,
            withheld in proptest::collection::vec(any::<bool>(), 6),
            unknown in proptest::collection::vec(any::<bool>(), 6),
            honest in any::<bool>(),
        ) {
            let (t, g) = (t % n, g % (2 * (n - 1)));
            let keys = ids(n);
            let d = deltas(n, len);
            let w: Vec<f32> = (0..n).map(|i| 0.1 + i as f32 * 0.05).collect();
            let tamper = (!honest).then_some(Tamper { member: t, g, by: 0.75 });
            let mut ev = signed_round(&keys, &d, &w, piece, tamper);
            let kept: Vec<bool> = (0..n).map(|i| !withheld[i]).collect();
            let known: Vec<bool> = (0..n).map(|i| !unknown[i]).collect();
            ev.retain(|(r, _)| kept[keys.iter().position(|k| k.node_id() == *r).unwrap()]);
            let a = run(&keys, &d, &w, &ev, &known);
            let tamperer = keys[t].node_id();
            for f in &a.guilty {
                prop_assert!(!honest && f.sender == tamperer, "blamed {:?}: {:?}", f.sender, a);
            }
            // Undetermined are only members that withheld their evidence (an honest one
            // downstream of the tamperer may be among them).
            for u in &a.undetermined {
                let r = keys.iter().position(|k| k.node_id() == *u).unwrap();
                prop_assert!(!honest && !kept[r], "undetermined {:?}", u);
            }
            if honest {
                prop_assert_eq!(a.wrong, 0);
            }
            // The proof exists when the tamperer sent something at g, every delta is known,
            // the successor handed in its evidence and, past step 0, so did the tamperer.
            let sends = Schedule::new(len, n, piece).pieces(Schedule::new(len, n, piece).send_chunk(t, g)) > 0;
            let proof = !honest
                && sends
                && known.iter().all(|k| *k)
                && kept[(t + 1) % n]
                && (g == 0 || kept[t]);
            if proof {
                prop_assert_eq!(a.guilty.len(), 1, "{:?}", a);
            }
        }
    }
}
