//! One real ring all-reduce round (`hanzod_allreduce::all_reduce`) among the nodes of an up
//! test bed: each member on its own thread inside its node's namespace with its own tokio
//! runtime, listening on its test-bed address, linked to its ring neighbours over the
//! shaped links (`connect_links`), reducing a seeded random `f32` delta. The round's wall
//! time is compared with the bandwidth bound of a ring all-reduce:
//!
//! `bound = 2(N − 1)/N × bytes × 8 / bottleneck` s, with `bytes` the delta's size and
//! `bottleneck` the ring's slowest configured link in bit/s (Patarasuk & Yuan 2009: each
//! member sends and receives `2(N − 1)/N` of the vector through its links).
//!
//! The configured rate is on the wire, so TCP payload can reach about
//! [`GOODPUT_FACTOR`] (0.956) of it: a ratio `bound / elapsed`
//! near 0.95 is the most a round can show.
//!
//! Correctness: every member must end with the same bytes (their result hashes), and each
//! member checks the chunk it owns (whose sum it computed) against the sum computed here in
//! the schedule's order (`hanzod_allreduce::schedule`); together the owners cover the whole
//! vector, so every member's whole result equals the reference bit for bit.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hanzod_actors::ring::{bottleneck, default_builder, is_permutation, RingBuilder};
use hanzod_allreduce::{all_reduce, connect_links, RoundConfig, Schedule};
use hanzod_protocol::identity::Identity;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::probe::{matrix_of, GOODPUT_FACTOR};
use super::{in_namespace, Endpoint, Testbed, TestbedError};

/// The elements the reference is computed in at a time (a block of every member's input).
const BLOCK: usize = 16 * 1024;

/// How long a member waits to link with its neighbours.
const LINK_TIMEOUT: Duration = Duration::from_secs(20);

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct AllReduceSpec {
    /// The delta's size per member, bytes (a multiple of 4: `bytes / 4` f32 elements).
    pub bytes: u64,
    /// Seeds every member's delta, weight and key.
    pub seed: u64,
    /// Elements (f32) per piece (`RoundConfig::piece_elems`).
    pub piece_elems: u32,
    /// Outgoing pieces held at once per member (`RoundConfig::max_in_flight`).
    pub max_in_flight: usize,
    /// The ring over node indices (`ring[k]` sends to `ring[k + 1]`); `None`: the project's
    /// default builder on the configured matrix.
    pub ring: Option<Vec<usize>>,
}

impl AllReduceSpec {
    /// `bytes` per member with the round's defaults (256 KiB pieces, 4 in flight), seed 1,
    /// the built ring.
    pub fn new(bytes: u64) -> AllReduceSpec {
        let d = RoundConfig::new(0, 0, 0, vec![]);
        AllReduceSpec {
            bytes,
            seed: 1,
            piece_elems: d.piece_elems,
            max_in_flight: d.max_in_flight,
            ring: None,
        }
    }
}

/// What a round on the bed did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AllReduceReport {
    /// Ring members (the bed's nodes).
    pub nodes: usize,
    /// The delta's size per member, bytes.
    pub bytes: u64,
    /// Elements per piece.
    pub piece_elems: u32,
    /// Outgoing pieces in flight per member.
    pub max_in_flight: usize,
    /// The ring, node indices in order.
    pub ring: Vec<usize>,
    /// The ring's slowest configured link, Mbit/s.
    pub bottleneck_mbit: f64,
    /// `2(N − 1)/N × bytes × 8 / (bottleneck × 10⁶)`, s.
    pub bound_s: f64,
    /// The round's wall time: the last member's end minus the first member's start (all
    /// start together once every link is connected; the handshake is included), s.
    pub elapsed_s: f64,
    /// Each member's own round time, s, by ring position.
    pub member_s: Vec<f64>,
    /// `bound_s / elapsed_s` (1 = at the bound; about 0.95 is the most TCP over the
    /// shaped links allows).
    pub ratio: f64,
    /// The ring's payload goodput per link: `2(N − 1)/N × bytes × 8 / elapsed`, Mbit/s.
    pub goodput_mbit: f64,
    /// SHA-256 of the result, hex (equal on every member).
    pub result_sha256: String,
    /// The most outgoing pieces any member held at once.
    pub peak_in_flight: usize,
}

/// Why a round on the bed failed or was refused.
#[derive(Debug, thiserror::Error)]
pub enum AllReduceError {
    /// The specification does not fit the bed (size, ring, pieces), or memory.
    #[error("all-reduce on the test bed: {0}")]
    Spec(String),
    /// Entering a namespace failed.
    #[error(transparent)]
    Testbed(#[from] TestbedError),
    /// A member could not set up (runtime, listener, links) or its round failed.
    #[error("member n{node} (ring position {position}): {detail}")]
    Member {
        /// Its node index.
        node: usize,
        /// Its ring position.
        position: usize,
        /// What failed.
        detail: String,
    },
    /// The members ended with different results.
    #[error("results differ: n{a} has {hash_a}, n{b} has {hash_b}")]
    Diverged {
        /// One node.
        a: usize,
        /// Its result hash (hex).
        hash_a: String,
        /// Another node.
        b: usize,
        /// Its result hash (hex).
        hash_b: String,
    },
    /// A member's owned chunk differs from the reference sum.
    #[error(
        "n{node}: element {index} is {got:e} (bits {got_bits:#010x}), the reference sum is \
         {want:e} (bits {want_bits:#010x})"
    )]
    WrongSum {
        /// The node.
        node: usize,
        /// The element.
        index: usize,
        /// Its value.
        got: f32,
        /// Its bits.
        got_bits: u32,
        /// The reference value.
        want: f32,
        /// Its bits.
        want_bits: u32,
    },
}

/// The bound of a ring all-reduce, s: `2(N − 1)/N × bytes × 8 / (bottleneck_mbit × 10⁶)`
/// (0 for `nodes < 2`, infinite for a bottleneck ≤ 0).
pub fn ring_bound_s(nodes: usize, bytes: u64, bottleneck_mbit: f64) -> f64 {
    if nodes < 2 {
        return 0.0;
    }
    if bottleneck_mbit.is_nan() || bottleneck_mbit <= 0.0 {
        return f64::INFINITY;
    }
    let n = nodes as f64;
    2.0 * (n - 1.0) / n * bytes as f64 * 8.0 / (bottleneck_mbit * 1e6)
}

/// The seed of node `node`'s stream.
fn member_seed(seed: u64, node: usize) -> u64 {
    seed ^ (node as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Node `node`'s weight `w_i`, in [0.5, 1.5).
pub fn member_weight(seed: u64, node: usize) -> f32 {
    let mut rng = ChaCha8Rng::seed_from_u64(member_seed(seed, node));
    rng.set_stream(1);
    rng.gen_range(0.5f32..1.5)
}

/// Fills `out` with elements `offset..offset + out.len()` of node `node`'s weighted input
/// `w_i · δ_i` (δ uniform in [−1, 1), 24 random bits each; element `j` is word `j` of the
/// node's ChaCha8 stream, so any range is computed alone).
pub fn fill_input(seed: u64, node: usize, offset: usize, out: &mut [f32]) {
    let w = member_weight(seed, node);
    let mut rng = ChaCha8Rng::seed_from_u64(member_seed(seed, node));
    rng.set_word_pos(offset as u128);
    let mut words = vec![0u32; BLOCK.min(out.len())];
    for block in out.chunks_mut(BLOCK) {
        let words = &mut words[..block.len()];
        rng.fill(words);
        for (x, &u) in block.iter_mut().zip(words.iter()) {
            let d = (u >> 8) as f32 * (2.0 / 16_777_216.0) - 1.0;
            *x = d * w;
        }
    }
}

/// Elements `range` of the sum of the members' inputs in the schedule's order
/// (`hanzod_allreduce::schedule::reference_sum`), for a range inside chunk `chunk` of a
/// ring of `ring.len()` members (`ring[k]`: the node at position `k`): `acc = x_chunk`,
/// then `acc += x_{(chunk + k) mod n}` for `k = 1..n`.
pub fn reference_range(
    seed: u64,
    ring: &[usize],
    chunk: usize,
    range: std::ops::Range<usize>,
) -> Vec<f32> {
    let n = ring.len();
    let mut acc = vec![0f32; range.len()];
    if n == 0 {
        return acc;
    }
    fill_input(seed, ring[chunk % n], range.start, &mut acc);
    let mut x = vec![0f32; range.len()];
    for k in 1..n {
        fill_input(seed, ring[(chunk + k) % n], range.start, &mut x);
        for (a, b) in acc.iter_mut().zip(&x) {
            *a += *b;
        }
    }
    acc
}

/// Checks `data` (a member's result) on chunk `chunk` against the reference, block by
/// block; returns the first differing element (index, got, want).
fn check_chunk(
    seed: u64,
    ring: &[usize],
    chunk: usize,
    sched: &Schedule,
    data: &[f32],
) -> Option<(usize, f32, f32)> {
    let range = sched.chunk(chunk);
    let mut start = range.start;
    while start < range.end {
        let end = (start + BLOCK).min(range.end);
        let want = reference_range(seed, ring, chunk, start..end);
        for (k, w) in want.iter().enumerate() {
            let got = data[start + k];
            if got.to_bits() != w.to_bits() {
                return Some((start + k, got, *w));
            }
        }
        start = end;
    }
    None
}

/// MemAvailable from /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The memory a round needs, bytes: every member's vector plus its in-flight frames and
/// receive buffer, and the reference blocks.
pub fn memory_needed(nodes: usize, spec: &AllReduceSpec) -> u64 {
    let piece = u64::from(spec.piece_elems) * 4 + 256;
    let per_member = spec.bytes + piece * (spec.max_in_flight as u64 + 2) + (BLOCK as u64 * 12);
    per_member * nodes as u64
}

/// Whether a round of `spec` on `nodes` nodes fits in 90 % of the memory now available
/// (`Err` says how much it needs and how much there is). `Ok` when /proc/meminfo cannot
/// be read.
pub fn check_memory(nodes: usize, spec: &AllReduceSpec) -> Result<(), AllReduceError> {
    let need = memory_needed(nodes, spec);
    match mem_available() {
        Some(avail) if need > avail / 10 * 9 => Err(AllReduceError::Spec(format!(
            "{nodes} members × {} bytes need about {:.1} GB; {:.1} GB is available",
            spec.bytes,
            need as f64 / 1e9,
            avail as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

/// What one member thread reports.
struct MemberDone {
    elapsed: Duration,
    start: Instant,
    end: Instant,
    hash: [u8; 32],
    peak_in_flight: usize,
    wrong: Option<(usize, f32, f32)>,
}

/// Runs one all-reduce round of `spec` among every node of `bed` (blocking; from async
/// code call it through `tokio::task::spawn_blocking`) and checks the results (module
/// docs). Refuses (typed) a size that is not a positive multiple of 4, a ring that is not
/// a permutation of the nodes, fewer than 2 nodes, and a round that does not fit in
/// memory. Each member's runtime is a current-thread tokio runtime on a thread inside its
/// namespace.
pub fn run_allreduce(
    bed: &Testbed,
    spec: &AllReduceSpec,
) -> Result<AllReduceReport, AllReduceError> {
    let n = bed.nodes();
    let spec_err = |m: String| Err(AllReduceError::Spec(m));
    if n < 2 {
        return spec_err(format!("{n} node(s): a ring needs at least 2"));
    }
    if spec.bytes == 0 || !spec.bytes.is_multiple_of(4) {
        return spec_err(format!(
            "delta of {} bytes: a positive multiple of 4 (f32) is needed",
            spec.bytes
        ));
    }
    let elems = usize::try_from(spec.bytes / 4)
        .map_err(|_| AllReduceError::Spec(format!("{} bytes is too large", spec.bytes)))?;
    if spec.piece_elems == 0 || spec.max_in_flight == 0 {
        return spec_err("piece_elems and max_in_flight must be ≥ 1".into());
    }
    check_memory(n, spec)?;
    let truth = matrix_of(&bed.plan().rates);
    let ring = match &spec.ring {
        Some(r) => r.clone(),
        None => default_builder().build(&truth, &[]),
    };
    if !is_permutation(&ring, n) {
        return spec_err(format!(
            "ring {ring:?} is not a permutation of the {n} nodes"
        ));
    }
    let bottleneck_mbit = f64::from(bottleneck(&truth, &ring));
    let bound_s = ring_bound_s(n, spec.bytes, bottleneck_mbit);

    let ids: Vec<Identity> = ring
        .iter()
        .map(|&node| {
            let mut s = [0u8; 32];
            s[..8].copy_from_slice(&member_seed(spec.seed, node).to_le_bytes());
            s[8..16].copy_from_slice(&(node as u64).to_le_bytes());
            Identity::from_seed(s)
        })
        .collect();
    let mut cfg = RoundConfig::new(1, 0, 1, ids.iter().map(Identity::node_id).collect());
    cfg.piece_elems = spec.piece_elems;
    cfg.max_in_flight = spec.max_in_flight;
    cfg.link_mbps = bottleneck_mbit * GOODPUT_FACTOR;
    let sched = Schedule::new(elems, n, spec.piece_elems as usize);

    let (report_tx, report_rx) = mpsc::channel::<(usize, Report)>();
    let mut order_txs = Vec::with_capacity(n);
    let mut threads = Vec::with_capacity(n);
    for (pos, &node) in ring.iter().enumerate() {
        let (order_tx, order_rx) = mpsc::channel::<Order>();
        let netns = bed.netns(Endpoint::Node(node)).to_string();
        let addr = bed.addr(Endpoint::Node(node));
        let args = MemberArgs {
            pos,
            node,
            addr,
            elems,
            seed: spec.seed,
            cfg: cfg.clone(),
            id: ids[pos].clone(),
            ring: ring.clone(),
            sched,
            report: report_tx.clone(),
            orders: order_rx,
        };
        let spawned = std::thread::Builder::new()
            .name(format!("allreduce-n{node}"))
            .spawn(move || in_namespace(&netns, move || member(args)));
        match spawned {
            Ok(t) => {
                threads.push(t);
                order_txs.push(order_tx);
            }
            Err(e) => {
                // Dropping the order channels ends the members already started.
                return Err(AllReduceError::Member {
                    node,
                    position: pos,
                    detail: format!("thread: {e}"),
                });
            }
        }
    }
    drop(report_tx);
    let mut first_err: Option<AllReduceError> = None;
    let mut fail = |pos: usize, detail: String| {
        first_err.get_or_insert(AllReduceError::Member {
            node: ring[pos],
            position: pos,
            detail,
        });
    };
    // Phase 1: every member's listener address; each then learns its successor's (or that
    // there is no round).
    let reports = gather(&report_rx, &threads);
    let mut addrs: Vec<Option<SocketAddr>> = vec![None; n];
    for (pos, r) in reports.into_iter().enumerate() {
        match r {
            Some(Report::Listening(Ok(a))) => addrs[pos] = Some(a),
            Some(Report::Listening(Err(detail))) => fail(pos, detail),
            _ => {} // the thread ended: its join says why
        }
    }
    let all = addrs.iter().all(Option::is_some);
    for (pos, tx) in order_txs.iter().enumerate() {
        let succ = if all { addrs[(pos + 1) % n] } else { None };
        let _ = tx.send(Order::Successor(succ));
    }
    // Phase 2: every member linked; then all start together.
    if all {
        let reports = gather(&report_rx, &threads);
        let mut go = true;
        for (pos, r) in reports.into_iter().enumerate() {
            match r {
                Some(Report::Linked(Ok(()))) => {}
                Some(Report::Linked(Err(detail))) => {
                    go = false;
                    fail(pos, detail);
                }
                _ => go = false,
            }
        }
        for tx in &order_txs {
            let _ = tx.send(Order::Start(go));
        }
    }
    drop(order_txs);
    let mut done = Vec::with_capacity(n);
    for (pos, t) in threads.into_iter().enumerate() {
        let r = t
            .join()
            .map_err(|_| "the member thread panicked".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .and_then(|r| r);
        match r {
            Ok(d) => done.push(d),
            Err(detail) => fail(pos, detail),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    for (pos, d) in done.iter().enumerate() {
        if d.hash != done[0].hash {
            return Err(AllReduceError::Diverged {
                a: ring[0],
                hash_a: hex::encode(done[0].hash),
                b: ring[pos],
                hash_b: hex::encode(d.hash),
            });
        }
        if let Some((index, got, want)) = d.wrong {
            return Err(AllReduceError::WrongSum {
                node: ring[pos],
                index,
                got,
                got_bits: got.to_bits(),
                want,
                want_bits: want.to_bits(),
            });
        }
    }
    let first = done.iter().map(|d| d.start).min();
    let last = done.iter().map(|d| d.end).max();
    let elapsed_s = match (first, last) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let moved_bits = 2.0 * (n as f64 - 1.0) / n as f64 * spec.bytes as f64 * 8.0;
    Ok(AllReduceReport {
        nodes: n,
        bytes: spec.bytes,
        piece_elems: spec.piece_elems,
        max_in_flight: spec.max_in_flight,
        ring,
        bottleneck_mbit,
        bound_s,
        elapsed_s,
        member_s: done.iter().map(|d| d.elapsed.as_secs_f64()).collect(),
        ratio: bound_s / elapsed_s,
        goodput_mbit: moved_bits / elapsed_s / 1e6,
        result_sha256: hex::encode(done[0].hash),
        peak_in_flight: done.iter().map(|d| d.peak_in_flight).max().unwrap_or(0),
    })
}

/// What a member tells the coordinator, once per phase.
enum Report {
    /// Its listener's address, or why it has none.
    Listening(Result<SocketAddr, String>),
    /// Its links are up, or why not.
    Linked(Result<(), String>),
}

/// What the coordinator tells a member.
enum Order {
    /// The successor's address (`None`: no round, a member failed).
    Successor(Option<SocketAddr>),
    /// Start the round (`false`: no round).
    Start(bool),
}

/// Waits until every member thread has sent its report of this phase or ended (a thread
/// that ended without reporting gives `None`): no member's failure leaves the others
/// waiting.
fn gather<T>(
    rx: &mpsc::Receiver<(usize, Report)>,
    threads: &[std::thread::JoinHandle<T>],
) -> Vec<Option<Report>> {
    let mut got: Vec<Option<Report>> = threads.iter().map(|_| None).collect();
    let mut ended = vec![false; threads.len()];
    loop {
        let pending = (0..threads.len()).any(|k| got[k].is_none() && !ended[k]);
        if !pending {
            return got;
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((pos, r)) => {
                if let Some(slot) = got.get_mut(pos) {
                    *slot = Some(r);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                for (k, t) in threads.iter().enumerate() {
                    ended[k] = t.is_finished();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return got,
        }
    }
}

struct MemberArgs {
    pos: usize,
    node: usize,
    addr: std::net::Ipv4Addr,
    elems: usize,
    seed: u64,
    cfg: RoundConfig,
    id: Identity,
    ring: Vec<usize>,
    sched: Schedule,
    report: mpsc::Sender<(usize, Report)>,
    orders: mpsc::Receiver<Order>,
}

/// One member, on a thread inside its namespace: listen, report, link to the successor
/// it is given, report, wait for the start, run the round, check its owned chunk.
fn member(a: MemberArgs) -> Result<MemberDone, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"));
    let listener = rt.as_ref().map_err(String::clone).and_then(|rt| {
        rt.block_on(tokio::net::TcpListener::bind((a.addr, 0)))
            .map_err(|e| format!("binding {}: {e}", a.addr))
    });
    let local = listener
        .as_ref()
        .map_err(String::clone)
        .and_then(|l| l.local_addr().map_err(|e| format!("listener address: {e}")));
    let _ = a.report.send((a.pos, Report::Listening(local.clone())));
    let (rt, listener) = (rt?, listener?);
    let succ = match a.orders.recv() {
        Ok(Order::Successor(Some(s))) => s,
        _ => return Err("another member failed to set up: no round".into()),
    };
    let links = rt.block_on(async {
        tokio::time::timeout(LINK_TIMEOUT, connect_links(&listener, succ)).await
    });
    let links = match links {
        Ok(Ok(l)) => Ok(l),
        Ok(Err(e)) => Err(format!("linking to {succ}: {e}")),
        Err(_) => Err(format!("linking to {succ}: no link in {LINK_TIMEOUT:?}")),
    };
    let mut data = vec![0f32; a.elems];
    fill_input(a.seed, a.node, 0, &mut data);
    let _ = a.report.send((
        a.pos,
        Report::Linked(links.as_ref().map(|_| ()).map_err(String::clone)),
    ));
    let links = links?;
    match a.orders.recv() {
        Ok(Order::Start(true)) => {}
        _ => return Err("another member failed to link: no round".into()),
    }
    let start = Instant::now();
    let outcome = rt.block_on(all_reduce(&a.cfg, &a.id, Some(links), &mut data));
    let end = Instant::now();
    let outcome = outcome.map_err(|e| format!("round: {e}"))?;
    // Member `pos` computed the sum of chunk `pos + 1`.
    let owned = (a.pos + 1) % a.ring.len();
    let wrong = check_chunk(a.seed, &a.ring, owned, &a.sched, &data);
    Ok(MemberDone {
        elapsed: end.duration_since(start),
        start,
        end,
        hash: outcome.result_sha256,
        peak_in_flight: outcome.peak_in_flight,
        wrong,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_allreduce::schedule::{reference_sum, simulate};

    #[test]
    fn any_range_of_an_input_is_the_same_words() {
        let mut whole = vec![0f32; 40_000];
        fill_input(7, 3, 0, &mut whole);
        let mut part = vec![0f32; 1_234];
        fill_input(7, 3, 33_000, &mut part);
        assert_eq!(
            part.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            whole[33_000..34_234]
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        );
        assert!(whole.iter().all(|x| x.abs() < 1.5));
        let mut other = vec![0f32; 16];
        fill_input(7, 4, 0, &mut other);
        assert_ne!(other[..], whole[..16]);
    }

    #[test]
    fn the_streamed_reference_is_the_schedules_sum() {
        for (n, len) in [(2usize, 10usize), (4, 1_003), (5, 40_001), (16, 70_000)] {
            // A ring order that is not the identity.
            let ring: Vec<usize> = (0..n).map(|k| (k * 3 + 1) % n).collect();
            let ring = if is_permutation(&ring, n) {
                ring
            } else {
                (0..n).rev().collect()
            };
            let inputs: Vec<Vec<f32>> = ring
                .iter()
                .map(|&node| {
                    let mut v = vec![0f32; len];
                    fill_input(11, node, 0, &mut v);
                    v
                })
                .collect();
            let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
            let want = reference_sum(&refs);
            let sched = Schedule::new(len, n, 4096);
            for c in 0..n {
                let r = sched.chunk(c);
                let got = reference_range(11, &ring, c, r.clone());
                assert!(
                    got.iter()
                        .zip(&want[r])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "n={n} len={len} chunk {c}"
                );
                assert_eq!(check_chunk(11, &ring, c, &sched, &want), None);
            }
            // And the ring's in-memory run ends there, and a flipped bit is found.
            let mut members = inputs.clone();
            simulate(&mut members, 4096);
            assert_eq!(members[n - 1], want);
            let mut bad = want.clone();
            let j = sched.chunk(n - 1).start;
            bad[j] = f32::from_bits(bad[j].to_bits() ^ 1);
            assert_eq!(
                check_chunk(11, &ring, n - 1, &sched, &bad).map(|w| w.0),
                Some(j)
            );
        }
    }

    #[test]
    fn the_bound() {
        // 4 members, 8 MB, 200 Mbit/s: 1.5 × 64 Mbit / 200 Mbit/s = 0.48 s.
        assert!((ring_bound_s(4, 8_000_000, 200.0) - 0.48).abs() < 1e-12);
        assert_eq!(ring_bound_s(1, 8_000_000, 200.0), 0.0);
        assert_eq!(ring_bound_s(4, 8, 0.0), f64::INFINITY);
        assert_eq!(ring_bound_s(4, 8, f64::NAN), f64::INFINITY);
    }

    #[test]
    fn memory_is_counted_per_member() {
        let spec = AllReduceSpec::new(256_000_000);
        let m = memory_needed(16, &spec);
        assert!(m > 16 * 256_000_000 && m < 16 * 260_000_000, "{m}");
        let huge = AllReduceSpec::new(1 << 50);
        assert!(matches!(
            check_memory(16, &huge),
            Err(AllReduceError::Spec(_))
        ));
    }
}
