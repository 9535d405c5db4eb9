//! Rounds on loopback TCP: results, failures, refused pieces, the memory bound.

use std::time::{Duration, Instant};

use hanzod_actors::types::NodeId;
use hanzod_allreduce::wire::{self, PieceError, PieceHeader, Role, RoundParams};
use hanzod_allreduce::{
    all_reduce, loopback_ring, reference_sum, weight_in_place, Phase, RingLinks, RoundConfig,
    RoundError, RoundOutcome, Schedule,
};
use hanzod_protocol::identity::Identity;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::io::AsyncReadExt;

fn ids(n: usize, salt: u8) -> Vec<Identity> {
    (0..n)
        .map(|i| Identity::from_seed([i as u8 + 1 + salt; 32]))
        .collect()
}

fn config(ids: &[Identity], piece_elems: u32, max_in_flight: usize) -> RoundConfig {
    let mut cfg = RoundConfig::new(11, 3, 7, ids.iter().map(Identity::node_id).collect());
    cfg.piece_elems = piece_elems;
    cfg.max_in_flight = max_in_flight;
    cfg.deadline_floor = Duration::from_secs(5);
    cfg
}

fn params(cfg: &RoundConfig, len: usize) -> RoundParams {
    RoundParams {
        job: cfg.job,
        epoch: cfg.epoch,
        ring_version: cfg.ring_version,
        total_elems: len as u64,
        piece_elems: cfg.piece_elems,
        members: cfg.ring.len() as u32,
    }
}

/// Runs every member whose index is not in `skip`; returns the results by member index.
async fn run_members(
    cfg: &RoundConfig,
    ids: &[Identity],
    links: Vec<Option<RingLinks>>,
    inputs: Vec<Vec<f32>>,
) -> Vec<tokio::task::JoinHandle<(Result<RoundOutcome, RoundError>, Vec<f32>)>> {
    let mut tasks = Vec::new();
    for ((id, link), mut data) in ids.iter().cloned().zip(links).zip(inputs) {
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            let r = all_reduce(&cfg, &id, link, &mut data).await;
            (r, data)
        }));
    }
    tasks
}

fn random_inputs(rng: &mut ChaCha8Rng, n: usize, len: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|_| {
            let mut v: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            weight_in_place(&mut v, rng.gen_range(0.1f32..2.0));
            v
        })
        .collect()
}

async fn check_ring(n: usize, len: usize, piece_elems: u32, max_in_flight: usize, seed: u64) {
    println!("n={n} len={len} piece_elems={piece_elems} max_in_flight={max_in_flight} seed={seed}");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ids = ids(n, 0);
    let cfg = config(&ids, piece_elems, max_in_flight);
    let inputs = random_inputs(&mut rng, n, len);
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let want: Vec<u32> = reference_sum(&refs).iter().map(|x| x.to_bits()).collect();
    let links: Vec<Option<RingLinks>> = if n == 1 {
        vec![None]
    } else {
        loopback_ring(n)
            .await
            .unwrap()
            .into_iter()
            .map(Some)
            .collect()
    };
    let sched = Schedule::new(len, n, piece_elems as usize);
    let mut hashes = Vec::new();
    for (r, t) in run_members(&cfg, &ids, links, inputs)
        .await
        .into_iter()
        .enumerate()
    {
        let (out, data) = t.await.unwrap();
        let out = out.unwrap_or_else(|e| panic!("member {r}: {e}"));
        let got: Vec<u32> = data.iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, want, "member {r} (seed {seed})");
        assert!(
            out.peak_in_flight <= max_in_flight,
            "member {r}: {} pieces held, bound {max_in_flight}",
            out.peak_in_flight
        );
        assert_eq!(out.evidence.len(), sched.pieces_per_round((r + n - 1) % n));
        let pred_key =
            hanzod_protocol::identity::verifying_key(&cfg.ring[(r + n - 1) % n]).unwrap();
        for sp in &out.evidence {
            sp.verify(&pred_key).unwrap();
        }
        hashes.push(out.result_sha256);
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_end_bit_identical_and_equal_to_the_reference_sum() {
    let seed: u64 = rand::random();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    println!("outer seed {seed}");
    for n in [1usize, 2, 3, 5, 8] {
        check_ring(
            n,
            rng.gen_range(500..3000),
            rng.gen_range(1..200),
            3,
            rng.gen(),
        )
        .await;
        // Fewer elements than members: some chunks are empty.
        check_ring(n, n.saturating_sub(1), 1, 2, rng.gen()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_pieces_never_exceed_max_in_flight() {
    for max in [1usize, 2, 5] {
        // Hundreds of pieces per member, so the bound is what limits the queue.
        check_ring(4, 20_000, 16, max, 42 + max as u64).await;
    }
}

/// The fake member's handshakes: the member plays `me` at index `r` of `cfg.ring`.
async fn fake_handshakes(
    cfg: &RoundConfig,
    me: &Identity,
    r: usize,
    len: usize,
    links: &mut RingLinks,
) {
    let n = cfg.ring.len();
    let p = params(cfg, len);
    let (a, b) = tokio::join!(
        wire::handshake(
            &mut links.send_to,
            me,
            Role::Upstream,
            cfg.ring[(r + 1) % n],
            &p
        ),
        wire::handshake(
            &mut links.recv_from,
            me,
            Role::Downstream,
            cfg.ring[(r + n - 1) % n],
            &p
        ),
    );
    a.unwrap();
    b.unwrap();
}

async fn survivors_suspect(n: usize, victim: usize, silent: bool) {
    let ids = ids(n, 20);
    let mut cfg = config(&ids, 8, 2);
    cfg.deadline_floor = Duration::from_millis(if silent { 400 } else { 3000 });
    let len = 4000;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let inputs = random_inputs(&mut rng, n, len);
    let mut links: Vec<Option<RingLinks>> = loopback_ring(n)
        .await
        .unwrap()
        .into_iter()
        .map(Some)
        .collect();
    let mut victim_links = links[victim].take().unwrap();
    let vcfg = cfg.clone();
    let vid = ids[victim].clone();
    let fake = tokio::spawn(async move {
        fake_handshakes(&vcfg, &vid, victim, len, &mut victim_links).await;
        // Read a little of the round, then vanish (or go silent).
        let mut buf = [0u8; 1000];
        let _ = victim_links.recv_from.read_exact(&mut buf).await;
        if silent {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        drop(victim_links);
    });
    let start = Instant::now();
    let tasks = run_members(&cfg, &ids, links, inputs).await;
    for (r, t) in tasks.into_iter().enumerate() {
        if r == victim {
            // Its slot ran with no links: a configuration error, not part of the ring.
            let (out, _) = t.await.unwrap();
            assert!(matches!(out, Err(RoundError::Config(_))));
            continue;
        }
        let (out, _) = t.await.unwrap();
        let err = out.expect_err("a survivor cannot finish without the victim");
        println!("member {r}: {err}");
        assert_eq!(
            err.suspect(),
            Some(ids[victim].node_id()),
            "member {r}: {err}"
        );
        if r == (victim + 1) % n {
            if silent {
                assert!(matches!(err, RoundError::Timeout { .. }), "{err}");
            } else {
                assert!(matches!(err, RoundError::PeerLost { .. }), "{err}");
            }
        }
    }
    let took = start.elapsed();
    assert!(
        took < cfg.deadline_floor * 4,
        "survivors took {took:?}, deadline {:?}",
        cfg.deadline_floor
    );
    fake.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_member_is_named_by_every_survivor() {
    survivors_suspect(5, 2, false).await;
    survivors_suspect(3, 0, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_member_is_named_after_the_deadline() {
    survivors_suspect(3, 1, true).await;
}

/// Member 0 is real; member 1 (of 2) is a fake that sends `frame` as its first piece.
async fn refused(make: impl FnOnce(&RoundConfig, &Identity, usize) -> Vec<u8>) -> RoundError {
    use tokio::io::AsyncWriteExt;
    let ids = ids(2, 40);
    let cfg = config(&ids, 4, 2);
    let len = 20;
    let mut links = loopback_ring(2).await.unwrap();
    let mut fake_links = links.pop().unwrap();
    let frame = make(&cfg, &ids[1], len);
    let fcfg = cfg.clone();
    let fid = ids[1].clone();
    let fake = tokio::spawn(async move {
        fake_handshakes(&fcfg, &fid, 1, len, &mut fake_links).await;
        fake_links.send_to.write_all(&frame).await.unwrap();
        let mut sink = Vec::new();
        let _ = fake_links.recv_from.read_to_end(&mut sink).await;
    });
    let mut data = vec![1.0f32; len];
    let err = all_reduce(&cfg, &ids[0], links.pop(), &mut data)
        .await
        .expect_err("the piece must be refused");
    fake.abort();
    assert_eq!(err.suspect(), Some(ids[1].node_id()));
    err
}

/// The first piece member 0 of 2 expects: reduce-scatter step 0, chunk 1, piece 0.
fn first_piece(cfg: &RoundConfig, len: usize) -> (PieceHeader, Vec<f32>) {
    let s = Schedule::new(len, 2, cfg.piece_elems as usize);
    let range = s.piece(1, 0);
    (
        PieceHeader {
            job: cfg.job,
            epoch: cfg.epoch,
            ring_version: cfg.ring_version,
            phase: Phase::ReduceScatter,
            step: 0,
            chunk: 1,
            offset: range.start as u64,
            len: range.len() as u32,
            payload_sha256: [0; 32],
        },
        vec![2.0; range.len()],
    )
}

#[tokio::test]
async fn a_tampered_payload_is_refused() {
    let err = refused(|cfg, me, len| {
        let (h, v) = first_piece(cfg, len);
        let mut f = wire::piece_frame(h, &v, me);
        let last = f.len() - 1;
        f[last] ^= 0x40;
        f
    })
    .await;
    assert!(
        matches!(
            err,
            RoundError::BadPiece {
                reason: PieceError::HashMismatch,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_piece_of_another_ring_version_is_refused() {
    let err = refused(|cfg, me, len| {
        let (mut h, v) = first_piece(cfg, len);
        h.ring_version += 1;
        wire::piece_frame(h, &v, me)
    })
    .await;
    assert!(
        matches!(
            err,
            RoundError::BadPiece {
                reason: PieceError::WrongRingVersion { ours: 7, theirs: 8 },
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_piece_signed_by_another_key_is_refused() {
    let err = refused(|cfg, _me, len| {
        let (h, v) = first_piece(cfg, len);
        wire::piece_frame(h, &v, &Identity::from_seed([99; 32]))
    })
    .await;
    assert!(
        matches!(
            err,
            RoundError::BadPiece {
                reason: PieceError::BadSignature(_),
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_piece_the_schedule_does_not_expect_is_refused() {
    let err = refused(|cfg, me, len| {
        let (mut h, v) = first_piece(cfg, len);
        h.chunk = 0;
        wire::piece_frame(h, &v, me)
    })
    .await;
    assert!(
        matches!(
            err,
            RoundError::BadPiece {
                reason: PieceError::Unexpected(_),
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_stranger_in_the_neighbours_place_fails_the_handshake() {
    let ids = ids(2, 60);
    let cfg = config(&ids, 4, 2);
    let stranger = Identity::from_seed([123; 32]);
    let mut links = loopback_ring(2).await.unwrap();
    let fake_links = links.pop().unwrap();
    let mut scfg = cfg.clone();
    scfg.ring[1] = stranger.node_id();
    let s = tokio::spawn(async move {
        let mut d = vec![0f32; 10];
        all_reduce(&scfg, &stranger, Some(fake_links), &mut d).await
    });
    let mut data = vec![0f32; 10];
    let err = all_reduce(&cfg, &ids[0], links.pop(), &mut data)
        .await
        .expect_err("stranger");
    let _ = s.await;
    assert!(
        matches!(
            &err,
            RoundError::Handshake { peer, source: wire::HandshakeError::UnexpectedPeer { .. } }
                if *peer == ids[1].node_id()
        ),
        "{err}"
    );
    let _: NodeId = err.suspect().unwrap();
}
