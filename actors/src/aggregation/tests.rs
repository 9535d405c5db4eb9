use super::*;
use proptest::prelude::*;

fn node(i: u8) -> NodeId {
    NodeId([i; 32])
}

fn t(ms: u64) -> Timestamp {
    Timestamp(ms)
}

fn commit(i: u8) -> Commit {
    Commit {
        hash: [i ^ 0x5a; 32],
        claimed_loss: 2.0,
        total_bytes: 1024,
    }
}

const COMMIT_DEADLINE: u64 = 10_000;
const REDUCE_MS: u64 = 5_000;

fn round(n: u8, min: usize) -> RingRound {
    RingRound::new(
        3,
        1,
        (1..=n).map(node).collect(),
        min,
        t(COMMIT_DEADLINE),
        RoundTimeouts::default(),
        REDUCE_MS,
    )
}

fn equal_weights(nodes: &[NodeId]) -> BTreeMap<NodeId, f64> {
    nodes.iter().map(|n| (*n, 1.0)).collect()
}

/// Drives `r` from Commit to the start of the first round, every member honest and none
/// selected; returns the StartReduce's members.
fn to_reduce(r: &mut RingRound, n: u8) -> Vec<(NodeId, f32)> {
    let mut effects = Vec::new();
    for i in 1..=n {
        effects.extend(r.apply(
            Input::Committed {
                node: node(i),
                commit: commit(i),
            },
            t(100),
        ));
    }
    assert_eq!(
        effects,
        vec![Effect::Reveal {
            to: (1..=n).map(node).collect()
        }]
    );
    assert!(r
        .apply(
            Input::Selected {
                nodes: BTreeSet::new()
            },
            t(110)
        )
        .is_empty());
    let mut effects = Vec::new();
    for i in 1..=n {
        effects.extend(r.apply(Input::Sketched { node: node(i) }, t(200)));
    }
    let [Effect::Score { members }] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    let effects = r.apply(
        Input::Scored {
            weights: equal_weights(members),
        },
        t(300),
    );
    let [Effect::StartReduce { version, members }] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    assert_eq!(*version, 1);
    members.clone()
}

fn report_all(
    r: &mut RingRound,
    members: &[(NodeId, f32)],
    version: u64,
    result: [u8; 32],
) -> Vec<Effect> {
    members
        .iter()
        .flat_map(|(n, _)| {
            r.apply(
                Input::Reported {
                    node: *n,
                    version,
                    result,
                },
                t(400),
            )
        })
        .collect()
}

fn check_sketch_all(r: &mut RingRound, members: &[(NodeId, f32)], version: u64) -> Vec<Effect> {
    members
        .iter()
        .flat_map(|(n, _)| r.apply(Input::CheckSketched { node: *n, version }, t(450)))
        .collect()
}

#[test]
fn an_honest_round_commits_sketches_reduces_verifies_and_accepts() {
    let mut r = round(4, 2);
    let members = to_reduce(&mut r, 4);
    assert_eq!(members.len(), 4);
    assert!(members.iter().all(|(_, w)| (*w - 0.25).abs() < 1e-7));
    assert_eq!(r.deadline(), Some(t(300 + REDUCE_MS)));
    let effects = report_all(&mut r, &members, 1, [7; 32]);
    // Epoch 3 of 4 members: the upload rotation starts at member 3 % 4 = 3 (ring order).
    assert_eq!(
        effects,
        vec![
            Effect::RevealCheck {
                version: 1,
                to: (1..=4).map(node).collect()
            },
            Effect::RequestMerged {
                from: node(4),
                version: 1
            }
        ]
    );
    assert!(r
        .apply(
            Input::MergedUploaded {
                node: node(4),
                hash: [7; 32],
            },
            t(500),
        )
        .is_empty());
    let effects = check_sketch_all(&mut r, &members, 1);
    assert_eq!(
        effects,
        vec![Effect::Check {
            version: 1,
            result: [7; 32],
            members: members.clone()
        }]
    );
    assert_eq!(r.deadline(), None, "the check waits on the caller");
    let effects = r.apply(
        Input::Checked {
            version: 1,
            outcome: Ok(()),
        },
        t(600),
    );
    assert_eq!(
        effects,
        vec![Effect::Accept {
            result: [7; 32],
            members
        }]
    );
    assert_eq!(r.step(), &Step::Done);
    assert!(r
        .apply(
            Input::Tick {
                now: t(u64::MAX / 2)
            },
            t(1)
        )
        .is_empty());
}

#[test]
fn the_check_waits_for_the_audited_uploads_and_falls_back_when_one_is_withheld() {
    for withhold in [false, true] {
        let mut r = round(4, 2);
        let members = to_reduce(&mut r, 4);
        report_all(&mut r, &members, 1, [7; 32]);
        // The caller draws the audit when it reveals the check seed: members 2 and 3 (and
        // one from outside the round, ignored).
        let audited: BTreeSet<NodeId> = [node(2), node(3), node(9)].into();
        assert!(r
            .apply(Input::Audited { nodes: audited }, t(410))
            .is_empty());
        assert!(r.wants_upload(&node(2)) && r.wants_upload(&node(3)));
        assert!(!r.wants_upload(&node(1)) && !r.wants_upload(&node(9)));
        r.apply(
            Input::MergedUploaded {
                node: node(4),
                hash: [7; 32],
            },
            t(500),
        );
        assert!(
            check_sketch_all(&mut r, &members, 1).is_empty(),
            "waits for audits"
        );
        assert!(r
            .apply(Input::Uploaded { node: node(2) }, t(520))
            .is_empty());
        assert!(!r.wants_upload(&node(2)));
        // An upload outside the audit changes nothing.
        assert!(r
            .apply(Input::Uploaded { node: node(1) }, t(525))
            .is_empty());
        if withhold {
            let effects = r.apply(
                Input::Tick {
                    now: t(u64::MAX / 2),
                },
                t(1),
            );
            assert!(
                matches!(
                    effects.as_slice(),
                    [Effect::Fallback { reason: Fallback::AuditWithheld(late), evidence: Some(1), .. }]
                        if late == &vec![node(3)]
                ),
                "{effects:?}"
            );
        } else {
            let effects = r.apply(Input::Uploaded { node: node(3) }, t(530));
            assert!(
                matches!(effects.as_slice(), [Effect::Check { version: 1, .. }]),
                "{effects:?}"
            );
        }
    }
}

#[test]
fn a_member_lost_mid_round_restarts_it_on_the_new_version_without_its_weight() {
    let mut r = round(4, 2);
    let members = to_reduce(&mut r, 4);
    // Two members report on version 1, then member 2 dies.
    for (n, _) in &members[..2] {
        assert!(r
            .apply(
                Input::Reported {
                    node: *n,
                    version: 1,
                    result: [1; 32]
                },
                t(350)
            )
            .is_empty());
    }
    let survivors = vec![node(1), node(3), node(4)];
    let effects = r.apply(
        Input::RingChanged {
            version: 2,
            members: survivors.clone(),
        },
        t(360),
    );
    let [Effect::StartReduce {
        version: 2,
        members,
    }] = effects.as_slice()
    else {
        panic!("{effects:?}")
    };
    assert_eq!(
        members.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        survivors
    );
    let sum: f32 = members.iter().map(|(_, w)| w).sum();
    assert!((sum - 1.0).abs() < 1e-6, "{sum}");
    assert!(members.iter().all(|(_, w)| (*w - 1.0 / 3.0).abs() < 1e-6));
    // A late report of version 1 is ignored; version 2's complete the round.
    assert!(r
        .apply(
            Input::Reported {
                node: node(4),
                version: 1,
                result: [1; 32]
            },
            t(370)
        )
        .is_empty());
    let effects = report_all(&mut r, members, 2, [2; 32]);
    assert!(
        matches!(effects.as_slice(), [Effect::RevealCheck { version: 2, to }, Effect::RequestMerged { version: 2, .. }] if *to == survivors),
        "{effects:?}"
    );
}

#[test]
fn differing_result_hashes_fall_back_to_the_star_with_the_rounds_evidence() {
    let mut r = round(3, 1);
    let members = to_reduce(&mut r, 3);
    let mut effects = Vec::new();
    for (i, (n, _)) in members.iter().enumerate() {
        effects.extend(r.apply(
            Input::Reported {
                node: *n,
                version: 1,
                result: [if i == 1 { 9 } else { 8 }; 32],
            },
            t(400),
        ));
    }
    assert_eq!(
        effects,
        vec![Effect::Fallback {
            reason: Fallback::HashesDiffer(vec![[8; 32], [9; 32]]),
            members: (1..=3).map(node).collect(),
            evidence: Some(1),
        }]
    );
    assert_eq!(r.step().name(), "star");
}

#[test]
fn a_refused_check_falls_back_and_a_wrong_or_missing_upload_passes_the_turn() {
    let mut r = round(3, 1);
    let members = to_reduce(&mut r, 3);
    let effects = report_all(&mut r, &members, 1, [4; 32]);
    // Epoch 3 of 3 members: the rotation starts at member 0.
    assert_eq!(
        effects[1],
        Effect::RequestMerged {
            from: node(1),
            version: 1
        }
    );
    check_sketch_all(&mut r, &members, 1);
    // node 1 uploads other bytes: the turn passes to node 2.
    let effects = r.apply(
        Input::MergedUploaded {
            node: node(1),
            hash: [5; 32],
        },
        t(600),
    );
    assert_eq!(
        effects,
        vec![Effect::RequestMerged {
            from: node(2),
            version: 1
        }]
    );
    // node 2 times out: node 3.
    let deadline = r.deadline().expect("upload deadline");
    assert!(r
        .apply(
            Input::Tick {
                now: t(deadline.as_millis() - 1)
            },
            t(0)
        )
        .is_empty());
    let effects = r.apply(Input::Tick { now: deadline }, deadline);
    assert_eq!(
        effects,
        vec![Effect::RequestMerged {
            from: node(3),
            version: 1
        }]
    );
    // node 3 fails: nobody is left.
    let effects = r.apply(Input::MergedFailed { node: node(3) }, t(700));
    assert!(matches!(
        effects.as_slice(),
        [Effect::Fallback {
            reason: Fallback::NoUpload,
            ..
        }]
    ));

    // A refused check falls back with the round's evidence.
    let mut r = round(3, 1);
    let members = to_reduce(&mut r, 3);
    report_all(&mut r, &members, 1, [4; 32]);
    r.apply(
        Input::MergedUploaded {
            node: node(1),
            hash: [4; 32],
        },
        t(500),
    );
    let effects = check_sketch_all(&mut r, &members, 1);
    assert!(matches!(effects.as_slice(), [Effect::Check { .. }]));
    let effects = r.apply(
        Input::Checked {
            version: 1,
            outcome: Err("row 3 differs".into()),
        },
        t(500),
    );
    assert!(matches!(
        effects.as_slice(),
        [Effect::Fallback {
            reason: Fallback::CheckFailed(_),
            evidence: Some(1),
            ..
        }]
    ));

    // A member that does not sketch under the check seed makes the round fall back.
    let mut r = round(3, 1);
    let members = to_reduce(&mut r, 3);
    report_all(&mut r, &members, 1, [4; 32]);
    r.apply(
        Input::MergedUploaded {
            node: node(1),
            hash: [4; 32],
        },
        t(500),
    );
    check_sketch_all(&mut r, &members[..2], 1);
    let deadline = r.deadline().expect("verify deadline");
    let effects = r.apply(Input::Tick { now: deadline }, deadline);
    assert!(matches!(
        effects.as_slice(),
        [Effect::Fallback { reason: Fallback::CheckSketchMissing(late), .. }] if late == &vec![node(3)]
    ));
}

#[test]
fn the_commit_step_closes_at_its_deadline_with_those_that_committed_or_fails_below_the_minimum() {
    let mut r = round(4, 2);
    r.apply(
        Input::Committed {
            node: node(2),
            commit: commit(2),
        },
        t(10),
    );
    r.apply(
        Input::Committed {
            node: node(4),
            commit: commit(4),
        },
        t(10),
    );
    // A second commitment of node 2 with another hash changes nothing.
    r.apply(
        Input::Committed {
            node: node(2),
            commit: commit(9),
        },
        t(11),
    );
    assert_eq!(r.commits()[&node(2)], commit(2));
    assert!(r
        .apply(
            Input::Tick {
                now: t(COMMIT_DEADLINE - 1)
            },
            t(0)
        )
        .is_empty());
    let effects = r.apply(
        Input::Tick {
            now: t(COMMIT_DEADLINE),
        },
        t(COMMIT_DEADLINE),
    );
    assert_eq!(
        effects,
        vec![Effect::Reveal {
            to: vec![node(2), node(4)]
        }]
    );

    let mut r = round(4, 2);
    r.apply(
        Input::Committed {
            node: node(1),
            commit: commit(1),
        },
        t(10),
    );
    let effects = r.apply(
        Input::Tick {
            now: t(COMMIT_DEADLINE),
        },
        t(COMMIT_DEADLINE),
    );
    assert_eq!(
        effects,
        vec![Effect::TooFew {
            committed: 1,
            needed: 2
        }]
    );
    assert!(r.step().is_terminal());
}

#[test]
fn a_selected_member_that_withholds_its_delta_is_reported_and_left_out() {
    let mut r = round(3, 1);
    for i in 1..=3 {
        r.apply(
            Input::Committed {
                node: node(i),
                commit: commit(i),
            },
            t(10),
        );
    }
    r.apply(
        Input::Selected {
            nodes: [node(2)].into_iter().collect(),
        },
        t(20),
    );
    for i in 1..=3 {
        assert!(r.apply(Input::Sketched { node: node(i) }, t(30)).is_empty());
    }
    let deadline = r.deadline().expect("sketch deadline");
    let effects = r.apply(Input::Tick { now: deadline }, deadline);
    assert_eq!(
        effects,
        vec![
            Effect::Withheld { node: node(2) },
            Effect::Score {
                members: vec![node(1), node(3)]
            }
        ]
    );
    // Weights for a member that was not scored are ignored.
    let effects = r.apply(
        Input::Scored {
            weights: [(node(1), 3.0), (node(2), 5.0), (node(3), 1.0)]
                .into_iter()
                .collect(),
        },
        deadline,
    );
    assert_eq!(
        effects,
        vec![Effect::StartReduce {
            version: 1,
            members: vec![(node(1), 0.75), (node(3), 0.25)]
        }]
    );
}

#[test]
fn every_member_excluded_keeps_the_base_and_a_reduce_timeout_names_the_late() {
    let mut r = round(2, 1);
    for i in 1..=2 {
        r.apply(
            Input::Committed {
                node: node(i),
                commit: commit(i),
            },
            t(10),
        );
    }
    r.apply(
        Input::Selected {
            nodes: BTreeSet::new(),
        },
        t(10),
    );
    r.apply(Input::Sketched { node: node(1) }, t(10));
    r.apply(Input::Sketched { node: node(2) }, t(10));
    let effects = r.apply(
        Input::Scored {
            weights: [(node(1), 0.0), (node(2), f64::NAN)].into_iter().collect(),
        },
        t(20),
    );
    assert_eq!(effects, vec![Effect::KeepBase]);

    let mut r = round(3, 1);
    let members = to_reduce(&mut r, 3);
    r.apply(
        Input::Reported {
            node: members[0].0,
            version: 1,
            result: [1; 32],
        },
        t(400),
    );
    let deadline = r.deadline().expect("reduce deadline");
    let effects = r.apply(Input::Tick { now: deadline }, deadline);
    assert!(matches!(
        effects.as_slice(),
        [Effect::Fallback { reason: Fallback::ReduceTimedOut(late), .. }] if late == &vec![node(2), node(3)]
    ));
}

#[test]
fn reduce_budget_is_the_ring_bound_stretched_plus_the_floor() {
    // 2(n−1)/n × 100 MB × 8 / 100 Mbit/s = 1.75 × 8 s = 14 s for n = 8, slack 1.
    assert_eq!(reduce_budget(100_000_000, 8, 100.0, 1.0, 0), 14_000);
    assert_eq!(reduce_budget(100_000_000, 8, 100.0, 2.0, 500), 28_500);
    assert_eq!(reduce_budget(100_000_000, 1, 100.0, 2.0, 500), 500);
    assert_eq!(reduce_budget(1_000_000, 2, f64::NAN, 1.0, 0), 8_000);
    assert_eq!(
        reduce_budget(u64::MAX, 64, 0.001, 10.0, 0),
        24 * 3600 * 1000
    );
}

/// One random event for the property test.
#[derive(Debug, Clone)]
enum Ev {
    Commit(u8),
    Select(Vec<u8>),
    Sketch(u8),
    Upload(u8),
    Score(Vec<(u8, u8)>),
    Lose(u8),
    Report(u8, bool, bool),
    Check(bool),
    Merged(u8, bool),
    MergedFail(u8),
    CheckSketch(u8),
    Audit(Vec<u8>),
    Tick(u64),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (1u8..=6).prop_map(Ev::Commit),
        proptest::collection::vec(1u8..=6, 0..3).prop_map(Ev::Select),
        (1u8..=6).prop_map(Ev::Sketch),
        (1u8..=6).prop_map(Ev::Upload),
        proptest::collection::vec((1u8..=6, 0u8..4), 0..7).prop_map(Ev::Score),
        (1u8..=6).prop_map(Ev::Lose),
        (1u8..=6, any::<bool>(), any::<bool>()).prop_map(|(n, o, h)| Ev::Report(n, o, h)),
        any::<bool>().prop_map(Ev::Check),
        (1u8..=6, any::<bool>()).prop_map(|(n, h)| Ev::Merged(n, h)),
        (1u8..=6).prop_map(Ev::MergedFail),
        (1u8..=6).prop_map(Ev::CheckSketch),
        proptest::collection::vec(1u8..=6, 0..3).prop_map(Ev::Audit),
        (0u64..200_000).prop_map(Ev::Tick),
    ]
}

proptest! {
    /// Whatever happens in whatever order: a round only ever runs on the current ring's
    /// members with positive weights summing to 1 and strictly increasing versions; a result
    /// is accepted only after its check passed and an upload matched the hash every member
    /// reported; the machine says nothing once terminal; and it waits without a deadline only
    /// on the caller (Score, Check).
    #[test]
    fn rounds_are_consistent_under_any_event_order(events in proptest::collection::vec(ev(), 0..80)) {
        let n = 6u8;
        let mut r = round(n, 2);
        let mut ring: Vec<NodeId> = (1..=n).map(node).collect();
        let mut version = 1u64;
        let mut now = 0u64;
        let mut last_start: Option<u64> = None;
        let mut checked_ok: Option<(u64, [u8; 32])> = None;
        let mut reported: BTreeMap<NodeId, [u8; 32]> = BTreeMap::new();
        let mut terminal = false;
        let mut uploaded: Vec<[u8; 32]> = Vec::new();
        for e in events {
            now += 10;
            let running = match r.step() { Step::Reduce { version } => Some(*version), _ => None };
            let input = match e {
                Ev::Commit(i) => Input::Committed { node: node(i), commit: commit(i) },
                Ev::Select(v) => Input::Selected { nodes: v.into_iter().map(node).collect() },
                Ev::Audit(v) => Input::Audited { nodes: v.into_iter().map(node).collect() },
                Ev::Sketch(i) => Input::Sketched { node: node(i) },
                Ev::Upload(i) => Input::Uploaded { node: node(i) },
                Ev::Score(v) => Input::Scored { weights: v.into_iter().map(|(i, w)| (node(i), f64::from(w))).collect() },
                Ev::Lose(i) => {
                    ring.retain(|m| *m != node(i));
                    version += 1;
                    Input::RingChanged { version, members: ring.clone() }
                }
                Ev::Report(i, old, other) => {
                    let v = if old { running.unwrap_or(version).saturating_sub(1) } else { running.unwrap_or(version) };
                    let result = if other { [2; 32] } else { [1; 32] };
                    if running == Some(v) && r.round().iter().any(|(m, _)| *m == node(i)) {
                        reported.entry(node(i)).or_insert(result);
                    }
                    Input::Reported { node: node(i), version: v, result }
                }
                Ev::Check(ok) => {
                    let v = match r.step() { Step::Check { version } => *version, _ => version };
                    Input::Checked { version: v, outcome: if ok { Ok(()) } else { Err("no".into()) } }
                }
                Ev::Merged(i, good) => Input::MergedUploaded { node: node(i), hash: if good { [1; 32] } else { [2; 32] } },
                Ev::MergedFail(i) => Input::MergedFailed { node: node(i) },
                Ev::CheckSketch(i) => {
                    let v = match r.step() { Step::Verify { version, .. } => *version, _ => version };
                    Input::CheckSketched { node: node(i), version: v }
                }
                Ev::Tick(dt) => { now += dt; Input::Tick { now: t(now) } }
            };
            let before = r.step().clone();
            if let (Input::MergedUploaded { node: m, hash }, Step::Verify { from, .. }) = (&input, &before) {
                if m == from { uploaded.push(*hash); }
            }
            let is_check_ok = matches!((&input, &before), (Input::Checked { outcome: Ok(()), .. }, Step::Check { .. }));
            let effects = r.apply(input, t(now));
            if terminal {
                prop_assert!(effects.is_empty());
            }
            if is_check_ok {
                if let Step::Check { version } = before { checked_ok = Some((version, r_agreed(&reported))); }
            }
            for e in &effects {
                match e {
                    Effect::StartReduce { version: v, members } => {
                        prop_assert_eq!(*v, version, "runs on the current version");
                        prop_assert!(last_start.is_none_or(|l| *v > l));
                        last_start = Some(*v);
                        reported.clear();
                        prop_assert!(!members.is_empty());
                        prop_assert!(members.iter().all(|(m, w)| ring.contains(m) && *w > 0.0));
                        let sum: f32 = members.iter().map(|(_, w)| w).sum();
                        prop_assert!((sum - 1.0).abs() < 1e-5, "weights sum to {}", sum);
                        let order: Vec<NodeId> = members.iter().map(|(m, _)| *m).collect();
                        let in_ring: Vec<NodeId> = ring.iter().filter(|m| order.contains(m)).copied().collect();
                        prop_assert_eq!(order, in_ring, "ring order");
                    }
                    Effect::Accept { result, .. } => {
                        let (v, agreed) = checked_ok.expect("accepted without a passed check");
                        prop_assert_eq!(Some(v), last_start);
                        prop_assert_eq!(*result, agreed);
                        prop_assert!(reported.values().all(|h| h == result));
                    }
                    Effect::Check { result, .. } => {
                        prop_assert!(reported.values().all(|h| h == result));
                        prop_assert!(uploaded.contains(result), "checked before the result was uploaded");
                    }
                    _ => {}
                }
            }
            terminal = r.step().is_terminal();
            if !terminal && r.deadline().is_none() {
                prop_assert!(matches!(r.step(), Step::Score | Step::Check { .. }), "{:?}", r.step());
            }
        }
    }
}

fn r_agreed(reported: &BTreeMap<NodeId, [u8; 32]>) -> [u8; 32] {
    reported.values().next().copied().unwrap_or([0; 32])
}
