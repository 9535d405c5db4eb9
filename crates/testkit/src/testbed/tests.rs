use std::collections::BTreeSet;
use std::time::Duration;

use super::plan::{
    burst_bytes, class_id, host_octet, MAX_IFNAME, MAX_MBIT, MAX_NODES, MIN_MBIT, UPLINK_CLASS,
};
use super::*;

/// Two regions (2 + 1 nodes), 100 Mbit/s within, 10 between, node 1's uplink × 0.5.
fn three() -> Topology {
    Topology::from_toml_str(
        r#"
        [[regions]]
        name = "a"
        nodes = 2
        intra_mbit = 100.0
        [[regions]]
        name = "b"
        nodes = 1
        intra_mbit = 100.0
        [[links]]
        from = "a"
        to = "b"
        mbit = 10.0
        [[uplinks]]
        node = 1
        factor = 0.5
        "#,
    )
    .expect("topology")
}

#[test]
fn rate_matrix_takes_the_min_of_region_pair_and_uplink() {
    let t = three();
    let m = t.rate_matrix();
    assert_eq!(m[0], vec![None, Some(100.0), Some(10.0)]);
    assert_eq!(m[1], vec![Some(50.0), None, Some(10.0)]);
    assert_eq!(m[2], vec![Some(10.0), Some(10.0), None]);
    assert_eq!(t.uplink(1), 50.0);
}

#[test]
fn asymmetric_links_and_region_uplinks() {
    let mut t = three();
    t.links.push(RegionLink {
        from: "b".into(),
        to: "a".into(),
        mbit: 30.0,
    });
    t.regions[1].uplink_mbit = Some(20.0);
    let m = t.rate_matrix();
    assert_eq!(m[0][2], Some(10.0));
    assert_eq!(m[2][0], Some(20.0)); // min(30, uplink 20)
    assert_eq!(m[1][2], Some(10.0));
}

#[test]
fn invalid_topologies_are_refused() {
    let bad = |f: &dyn Fn(&mut Topology)| {
        let mut t = three();
        f(&mut t);
        t.validate().expect_err("should be refused")
    };
    bad(&|t| t.links.clear()); // no rate between a and b
    bad(&|t| t.regions[1].name = "a".into());
    bad(&|t| t.regions[0].intra_mbit = 0.0);
    bad(&|t| t.regions[0].intra_mbit = f64::NAN);
    bad(&|t| t.uplinks[0].node = 3);
    bad(&|t| t.uplinks[0].factor = -1.0);
    bad(&|t| t.orchestrator.region = Some("z".into()));
    bad(&|t| t.regions[0].nodes = MAX_NODES);
    bad(&|t| t.links[0].to = "a".into());
    assert!(matches!(
        Topology::from_toml_str("regions = 3"),
        Err(TopologyError::Toml(_))
    ));
}

#[test]
fn effective_rates_out_of_range_are_typed_errors_naming_the_field() {
    let field_of = |f: &dyn Fn(&mut Topology)| {
        let mut t = three();
        f(&mut t);
        match t.validate() {
            Err(TopologyError::Rate { field, .. }) => field,
            other => panic!("expected a rate error, got {other:?}"),
        }
    };
    // Below the resolution `tc` is given (would be "0Mbit"), and above 1e6.
    assert_eq!(field_of(&|t| t.regions[0].intra_mbit = 0.0004), "region a");
    assert_eq!(field_of(&|t| t.regions[1].intra_mbit = 2e6), "region b");
    assert_eq!(
        field_of(&|t| t.regions[0].uplink_mbit = Some(1e-5)),
        "region a uplink"
    );
    assert_eq!(field_of(&|t| t.links[0].mbit = 0.0001), "link a -> b");
    assert_eq!(
        field_of(&|t| t.links[0].mbit = f64::INFINITY),
        "link a -> b"
    );
    // The uplink factor is bounded through the effective uplink (100 × factor).
    assert_eq!(field_of(&|t| t.uplinks[0].factor = 1e9), "node 1 uplink");
    assert_eq!(field_of(&|t| t.uplinks[0].factor = 1e-6), "node 1 uplink");
    let mut t = three();
    t.regions[0].uplink_mbit = Some(0.002); // node 1: 0.002 × 0.5 = 0.001, the lowest
    t.validate().expect("0.001 Mbit/s is accepted");
    t.regions[0].uplink_mbit = None;
    t.uplinks[0].factor = MAX_MBIT / 100.0;
    t.validate().expect("1e6 Mbit/s is accepted");
    assert_eq!(MIN_MBIT, 0.001);
    let err = Topology::from_toml_str(
        r#"
        [[regions]]
        name = "a"
        nodes = 1
        intra_mbit = 0.0001
        "#,
    )
    .expect_err("too low");
    assert!(err.to_string().contains("region a"), "{err}");
}

#[test]
fn addresses_and_names() {
    assert_eq!(address(Endpoint::Orchestrator), Ipv4Addr::new(10, 77, 0, 1));
    assert_eq!(address(Endpoint::Node(0)), Ipv4Addr::new(10, 77, 0, 2));
    assert_eq!(address(Endpoint::Node(252)), Ipv4Addr::new(10, 77, 0, 254));
    assert_eq!(host_octet(Endpoint::Node(7)), 9);
    assert_eq!(class_id(Endpoint::Node(14)), "1:10");

    let prefix = name_prefix(4_194_304, 35); // the largest pid_max, the last digit
    assert_eq!(prefix.len(), 9);
    assert_eq!(parse_name(&format!("{prefix}n252")), Some((4_194_304, 35)));
    // A bed of the most nodes: every name fits and is unique.
    let t = Topology {
        regions: vec![Region {
            name: "r".into(),
            nodes: MAX_NODES,
            intra_mbit: 1000.0,
            uplink_mbit: None,
        }],
        links: vec![],
        uplinks: vec![],
        orchestrator: OrchestratorPlacement::default(),
    };
    let plan = Plan::new(&t, &prefix).expect("plan");
    let ifs = plan.interfaces();
    assert_eq!(ifs.len(), 1 + 2 * (MAX_NODES + 1));
    assert_eq!(ifs.iter().collect::<BTreeSet<_>>().len(), ifs.len());
    let ns = plan.namespaces();
    assert_eq!(ns.iter().collect::<BTreeSet<_>>().len(), ns.len());
    for name in ifs.iter().chain(&ns) {
        assert!(name.len() <= MAX_IFNAME, "{name} is too long");
        assert_eq!(parse_name(name), Some((4_194_304, 35)), "{name}");
    }
    // Other names are never taken for ours.
    for other in [
        "hzb",
        "hzb00001",
        "hzb000010x",
        "hzb000010n",
        "hzb000010n1234",
        "hzbABCDE0h",
        "eth0",
        "hzb000010h0",
        "xhzb000010h",
    ] {
        assert_eq!(parse_name(other), None, "{other}");
    }
    assert_eq!(parse_name("hzb000010h"), Some((1, 0)));
    // Different pids or sequence digits give different prefixes.
    assert_ne!(name_prefix(1, 0), name_prefix(1, 1));
    assert_ne!(name_prefix(1, 0), name_prefix(36, 0));
}

#[test]
fn setup_and_teardown_commands() {
    let plan = Plan::new(&three(), "hzb000010").expect("plan");
    let cmds: Vec<String> = plan
        .setup_commands()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let has = |s: &str| cmds.iter().any(|c| c == s);
    assert_eq!(cmds[0], "ip netns add hzb000010h");
    assert!(has("ip netns add hzb000010n2"));
    assert!(has("ip netns add hzb000010o"));
    assert!(has(
        "ip -n hzb000010h link add name hzb000010br type bridge"
    ));
    assert!(has(
        "ip -n hzb000010h link add name hzb000010p1 type veth peer name hzb000010n1 netns hzb000010n1"
    ));
    assert!(has(
        "ip -n hzb000010h link set hzb000010p1 master hzb000010br"
    ));
    assert!(has(
        "ip -n hzb000010n1 addr add 10.77.0.3/16 dev hzb000010n1"
    ));
    assert!(has("ip -n hzb000010o addr add 10.77.0.1/16 dev hzb000010o"));
    assert!(has(
        "tc -n hzb000010n1 qdisc add dev hzb000010n1 root handle 1: htb"
    ));
    // Node 1's uplink (50 Mbit/s) is one parent class that its destinations share.
    let b50 = burst_bytes(50.0);
    let b10 = burst_bytes(10.0);
    assert!(has(&format!(
        "tc -n hzb000010n1 class add dev hzb000010n1 parent 1: classid 1:100 htb rate 50Mbit ceil 50Mbit burst {b50} cburst {b50}"
    )));
    // Node 1 → node 0 capped at 50 Mbit/s (its uplink), → node 2 at 10, → orchestrator at
    // 50; each guaranteed a third of the uplink (at most its cap), borrowing the rest.
    assert!(has(&format!(
        "tc -n hzb000010n1 class add dev hzb000010n1 parent 1:100 classid 1:2 htb rate 16666666bit ceil 50Mbit burst {b50} cburst {b50}"
    )));
    assert!(has(&format!(
        "tc -n hzb000010n1 class add dev hzb000010n1 parent 1:100 classid 1:4 htb rate 10000000bit ceil 10Mbit burst {b10} cburst {b10}"
    )));
    assert!(has(&format!(
        "tc -n hzb000010n1 class add dev hzb000010n1 parent 1:100 classid 1:1 htb rate 16666666bit ceil 50Mbit burst {b50} cburst {b50}"
    )));
    assert!(has(
        "tc -n hzb000010n1 filter add dev hzb000010n1 parent 1: protocol ip prio 1 u32 match ip dst 10.77.0.2/32 flowid 1:2"
    ));
    assert!(has(
        "tc -n hzb000010n1 filter add dev hzb000010n1 parent 1: protocol ip prio 1 u32 match ip dst 10.77.0.1/32 flowid 1:1"
    ));
    assert!(cmds.iter().any(|c| c.starts_with(
        "tc -n hzb000010n0 class add dev hzb000010n0 parent 1:100 classid 1:4 htb rate 10000000bit ceil 10Mbit"
    )));
    assert!(has(
        "tc -n hzb000010n0 class add dev hzb000010n0 parent 1: classid 1:100 htb rate 100Mbit ceil 100Mbit burst 125000 cburst 125000"
    ));
    // No class id collides with the uplink class, and every node's guarantees fit under
    // its uplink (htb lets a class under its guarantee send past its parent's limit).
    assert!(!class_id(Endpoint::Node(MAX_NODES - 1)).eq(UPLINK_CLASS));
    for e in plan.endpoints.iter().filter(|e| e.uplink.is_some()) {
        let prefix = format!("tc -n {} class add dev {} parent 1:100 ", e.netns, e.dev);
        let guaranteed: f64 = cmds
            .iter()
            .filter_map(|c| c.strip_prefix(&prefix))
            .map(|rest| {
                let bits = rest
                    .split(" rate ")
                    .nth(1)
                    .and_then(|r| r.split("bit ").next())
                    .expect("rate");
                bits.parse::<f64>().expect("bit/s") / 1e6
            })
            .sum();
        let up = e.uplink.expect("uplink");
        assert!(
            guaranteed > 0.0 && guaranteed <= up,
            "{}: {guaranteed} > {up}",
            e.netns
        );
    }
    // The orchestrator has no region: its egress is unshaped.
    assert!(!cmds.iter().any(|c| c.starts_with("tc -n hzb000010o ")));
    // Every command runs in a namespace of the bed (never the caller's), but `netns add`.
    for c in &plan.setup_commands() {
        let in_bed = c
            .args
            .windows(2)
            .any(|w| w[0] == "-n" && w[1].starts_with("hzb000010"));
        assert!(in_bed || c.args[..2] == ["netns", "add"], "{c}");
    }
    // Per node: the uplink class, then one class and one filter per other node, plus the
    // orchestrator.
    let classes = cmds.iter().filter(|c| c.contains(" class add ")).count();
    assert_eq!(classes, 3 * (1 + 3));
    let filters = cmds.iter().filter(|c| c.contains(" filter add ")).count();
    assert_eq!(filters, 3 * 3);

    let down: Vec<String> = plan
        .teardown_commands()
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert_eq!(
        down,
        [
            "ip netns del hzb000010n0",
            "ip netns del hzb000010n1",
            "ip netns del hzb000010n2",
            "ip netns del hzb000010o",
            "ip netns del hzb000010h",
        ]
    );
}

#[test]
fn orchestrator_with_a_region_is_shaped() {
    let mut t = three();
    t.orchestrator.region = Some("b".into());
    let plan = Plan::new(&t, "hzb000010").expect("plan");
    let orch = plan.endpoint(Endpoint::Orchestrator).expect("orch");
    assert_eq!(
        orch.egress,
        vec![
            (Endpoint::Node(0), 10.0),
            (Endpoint::Node(1), 10.0),
            (Endpoint::Node(2), 100.0)
        ]
    );
    assert_eq!(orch.uplink, None);
    let n1 = plan.endpoint(Endpoint::Node(1)).expect("n1");
    assert_eq!(n1.egress.last(), Some(&(Endpoint::Orchestrator, 10.0)));
    assert_eq!(n1.uplink, Some(50.0));
    // The orchestrator has no uplink class: its classes sit under the root, rate = ceil.
    let cmds: Vec<String> = plan
        .setup_commands()
        .iter()
        .map(|c| c.to_string())
        .collect();
    assert!(cmds.iter().any(|c| c.starts_with(
        "tc -n hzb000010o class add dev hzb000010o parent 1: classid 1:2 htb rate 10Mbit ceil 10Mbit "
    )));
    assert!(!cmds
        .iter()
        .any(|c| c.starts_with("tc -n hzb000010o ") && c.contains(UPLINK_CLASS)));
}

#[test]
fn the_example_topology_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/testbed.example.toml"
    );
    let text = std::fs::read_to_string(path).expect("config/testbed.example.toml");
    let t = Topology::from_toml_str(&text).expect("example topology");
    assert_eq!(t.node_count(), 8);
    let m = t.rate_matrix();
    let rates: BTreeSet<u64> = m.iter().flatten().flatten().map(|r| *r as u64).collect();
    assert!(rates.contains(&200) && rates.contains(&20), "{rates:?}");
}

/// Held by the tests that measure rates or load the links, so that they do not disturb
/// each other's figures (the other bed tests run alongside).
static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Skips (returns `None`) when the machine cannot host a bed, unless `CI` is set.
fn up_or_skip(t: &Topology) -> Option<Testbed> {
    match Testbed::up(t) {
        Ok(bed) => Some(bed),
        Err(e) if e.is_unsupported() && std::env::var_os("CI").is_none() => {
            eprintln!("SKIPPED: the WAN test bed needs root and network namespaces: {e}");
            None
        }
        Err(e) => panic!("test bed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_bed_shapes_each_link() {
    let _serial = MEASURING.lock().await;
    let topo = three();
    let Some(bed) = tokio::task::spawn_blocking(move || up_or_skip(&topo))
        .await
        .expect("join")
    else {
        return;
    };
    // A process inside a node's namespace sees only its own address.
    let out = bed
        .command_at(Endpoint::Node(2), "ip", ["-4", "-brief", "addr"])
        .output()
        .await
        .expect("ip netns exec");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("10.77.0.4/16"),
        "{text}"
    );
    assert!(!text.contains("10.77.0.2/"), "{text}");

    let links = [
        (Endpoint::Node(0), Endpoint::Node(1), 100.0), // within a region
        (Endpoint::Node(1), Endpoint::Node(0), 50.0),  // node 1's uplink × 0.5
        (Endpoint::Node(0), Endpoint::Node(2), 10.0),  // between regions
        (Endpoint::Node(2), Endpoint::Node(1), 10.0),
        (Endpoint::Node(1), Endpoint::Orchestrator, 50.0), // to the orchestrator: uplink
    ];
    let bed = std::sync::Arc::new(bed);
    let mut rows = vec![];
    for (from, to, configured) in links {
        let b = bed.clone();
        let got = tokio::task::spawn_blocking(move || {
            b.measure_tcp(from, to, Duration::from_millis(500), Duration::from_secs(2))
        })
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
        rows.push((from, to, configured, got));
    }
    eprintln!("link        configured Mbit/s   measured goodput Mbit/s   ratio");
    for (from, to, configured, got) in &rows {
        eprintln!(
            "{:<5}-> {:<5} {:>10.1}   {:>14.2}   {:>6.3}",
            from.to_string(),
            to.to_string(),
            configured,
            got.mbit,
            got.mbit / configured
        );
    }
    for (from, to, configured, got) in &rows {
        let ratio = got.mbit / configured;
        assert!(
            (0.85..=1.15).contains(&ratio),
            "{from} -> {to}: measured {:.2} Mbit/s, configured {configured}",
            got.mbit
        );
    }
    let namespaces = bed.plan().namespaces();
    let bed = std::sync::Arc::into_inner(bed).expect("one owner");
    tokio::task::spawn_blocking(move || bed.down())
        .await
        .expect("join")
        .expect("down");
    for ns in namespaces {
        assert!(!Path::new("/run/netns").join(&ns).exists(), "{ns} left");
    }
}

#[test]
fn a_dropped_bed_and_a_stale_one_are_removed() {
    let t = three();
    let Some(bed) = up_or_skip(&t) else {
        return;
    };
    let namespaces = bed.plan().namespaces();
    assert!(namespaces.iter().all(|ns| netns_exists(ns)));
    drop(bed);
    assert!(namespaces.iter().all(|ns| !netns_exists(ns)));

    // A namespace of this family whose pid is dead is removed by the next `up`; one of
    // another family is left alone.
    let dead = (4_000_000..4_194_304u32)
        .rev()
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a dead pid");
    let stale = format!("{}h", name_prefix(dead, 3));
    let foreign = format!("hzbx{}", std::process::id() % 100_000);
    for ns in [&stale, &foreign] {
        run_cmd(&Cmd {
            program: "ip".into(),
            args: vec!["netns".into(), "add".into(), ns.clone()],
        })
        .expect("netns add");
    }
    let bed = Testbed::up(&t).expect("up");
    assert!(!netns_exists(&stale), "{stale} not removed");
    assert!(netns_exists(&foreign), "{foreign} removed");
    let _ = remove_netns(&foreign);
    bed.down().expect("down");
}

/// One region of `nodes` nodes at `mbit` Mbit/s.
fn lan(nodes: usize, mbit: f64) -> Topology {
    Topology {
        regions: vec![Region {
            name: "lan".into(),
            nodes,
            intra_mbit: mbit,
            uplink_mbit: None,
        }],
        links: vec![],
        uplinks: vec![],
        orchestrator: OrchestratorPlacement::default(),
    }
}

#[test]
fn a_ring_all_reduce_on_the_bed_ends_with_the_reference_sum_everywhere() {
    let _serial = MEASURING.blocking_lock();
    let Some(bed) = up_or_skip(&lan(4, 200.0)) else {
        return;
    };
    let spec = allreduce::AllReduceSpec::new(8_000_000);
    let r = allreduce::run_allreduce(&bed, &spec).unwrap_or_else(|e| panic!("round: {e}"));
    // run_allreduce has checked every member's hash and each owner's chunk against the
    // reference; what is left to check is what it reports.
    assert_eq!(r.nodes, 4);
    assert_eq!(r.bottleneck_mbit, 200.0);
    assert!((r.bound_s - 0.48).abs() < 1e-9, "{}", r.bound_s);
    assert_eq!(r.member_s.len(), 4);
    assert!(r.elapsed_s > 0.0 && r.ratio.is_finite());
    assert!(r.peak_in_flight >= 1 && r.peak_in_flight <= spec.max_in_flight);
    assert_eq!(r.result_sha256.len(), 64);
    eprintln!(
        "all-reduce on the bed: N=4, 8 MB, bottleneck {} Mbit/s: bound {:.3} s, measured {:.3} s, ratio {:.3}",
        r.bottleneck_mbit, r.bound_s, r.elapsed_s, r.ratio
    );
    // The same seed gives the same sum; another ring order a different one (the summation
    // order differs), still checked against its own reference.
    let again = allreduce::run_allreduce(&bed, &spec).expect("again");
    assert_eq!(again.result_sha256, r.result_sha256);
    let reversed = allreduce::AllReduceSpec {
        ring: Some(vec![3, 2, 1, 0]),
        piece_elems: 10_000, // pieces that do not divide the chunks
        ..spec.clone()
    };
    let other = allreduce::run_allreduce(&bed, &reversed).expect("reversed ring");
    assert_eq!(other.ring, vec![3, 2, 1, 0]);
    // Bad specifications are refused, typed, before anything runs.
    for bad in [
        allreduce::AllReduceSpec::new(7),
        allreduce::AllReduceSpec {
            ring: Some(vec![0, 1, 1, 2]),
            ..spec.clone()
        },
        allreduce::AllReduceSpec {
            max_in_flight: 0,
            ..spec.clone()
        },
    ] {
        assert!(matches!(
            allreduce::run_allreduce(&bed, &bad),
            Err(allreduce::AllReduceError::Spec(_))
        ));
    }
    bed.down().expect("down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_on_the_bed_measure_every_link_and_the_ring_is_compared() {
    let _serial = MEASURING.lock().await;
    let topo = three();
    let regions = topo.node_regions();
    assert_eq!(regions, ["a", "a", "b"]);
    let Some(bed) = tokio::task::spawn_blocking(move || up_or_skip(&topo))
        .await
        .expect("join")
    else {
        return;
    };
    let report = probe::probe_links(&bed, 512 * 1024, &regions)
        .await
        .unwrap_or_else(|e| panic!("probes: {e}"));
    assert_eq!(report.links.len(), 6);
    for l in &report.links {
        assert_eq!(Some(l.configured_mbit), bed.rate(l.from, l.to));
        assert_eq!(l.bytes, 512 * 1024);
        assert!(l.measured_mbit > 0.0 && l.seconds > 0.0, "{l:?}");
        eprintln!(
            "n{} -> n{}: configured {:.1}, measured {:.2} Mbit/s ({:+.1} %)",
            l.from,
            l.to,
            l.configured_mbit,
            l.measured_mbit,
            100.0 * l.relative_error()
        );
    }
    // Every 3-node ring has the same two edges out of region b's node: 10 Mbit/s.
    assert_eq!(report.ring.true_ring_on_true_mbit, 10.0);
    assert_eq!(report.ring.exact_on_true_mbit, Some(10.0));
    assert_eq!(report.ring.measured_ring.len(), 3);
    assert!(report.ring.ratio > 0.0 && report.ring.ratio <= 1.0);
    assert!(matches!(
        probe::probe_links(&bed, 0, &regions).await,
        Err(probe::ProbeRunError::BadSize(0))
    ));
    drop(bed);
}

#[test]
fn ring_comparison_on_given_measurements() {
    // Measurements 5 % under every configured rate change no choice: the ring built on
    // them is as good on the truth (ratio 1), and its bottleneck on them is 0.95 × 10.
    let rates = three().rate_matrix();
    let mut links = vec![];
    for (i, row) in rates.iter().enumerate() {
        for (j, r) in row.iter().enumerate() {
            if let Some(r) = r {
                links.push(probe::LinkProbe {
                    from: i,
                    to: j,
                    configured_mbit: *r,
                    measured_mbit: *r * 0.95,
                    bytes: 1,
                    seconds: 1.0,
                });
            }
        }
    }
    let regions = three().node_regions();
    let cmp = probe::compare_rings(&rates, &links, &regions);
    assert_eq!(cmp.ratio, 1.0);
    assert!((cmp.measured_ring_on_measured_mbit - 9.5).abs() < 1e-4);
    assert!((links[0].relative_error() + 0.05).abs() < 1e-12);
    assert!((links[0].goodput_error() - (0.95 / probe::GOODPUT_FACTOR - 1.0)).abs() < 1e-12);
}

#[test]
fn clean_needs_root_or_removes_only_dead_beds() {
    if !is_root() {
        assert!(matches!(clean_stale(), Err(TestbedError::NotRoot(_))));
        return;
    }
    let dead = (4_000_000..4_194_304u32)
        .rev()
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a dead pid");
    let stale = format!("{}n0", name_prefix(dead, 5));
    if run_cmd(&cmd("ip", &["netns", "add", &stale])).is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "ip netns add refused under CI"
        );
        eprintln!("SKIPPED: ip netns add refused");
        return;
    }
    // (A bed coming up in a parallel test may remove it first: only its absence is sure.)
    clean_stale().expect("clean");
    assert!(!netns_exists(&stale), "{stale} left");
}

#[test]
fn the_allreduce_topology_loads() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../config/testbed.allreduce.toml"
    );
    let text = std::fs::read_to_string(path).expect("config/testbed.allreduce.toml");
    let t = Topology::from_toml_str(&text).expect("all-reduce topology");
    assert_eq!(t.regions.len(), 1);
    assert_eq!(t.node_count(), 4);
    assert_eq!(t.node_regions(), ["lan"; 4]);
    assert!(t
        .rate_matrix()
        .iter()
        .flatten()
        .flatten()
        .all(|r| *r == 100.0));
}

/// A comma-separated list from the environment, or the default.
fn env_list<T: std::str::FromStr + Clone>(name: &str, default: &[T]) -> Vec<T> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: {s:?} does not parse"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// The all-reduce table (`hanzod testbed allreduce` prints the same): N × MB on one region
/// at `HZ_TB_MBIT` Mbit/s (default 100). Nodes `HZ_TB_NODES` (default 4,8,16), sizes
/// `HZ_TB_MB` (default 8,64,256), piece KiB `HZ_TB_PIECE_KIB` (256), in flight
/// `HZ_TB_IN_FLIGHT` (4). Rows that do not fit in memory are skipped, saying so.
#[test]
#[ignore = "minutes of shaped traffic; run by hand as root"]
fn allreduce_table() {
    let _serial = MEASURING.blocking_lock();
    let nodes: Vec<usize> = env_list("HZ_TB_NODES", &[4, 8, 16]);
    let mbs: Vec<u64> = env_list("HZ_TB_MB", &[8, 64, 256]);
    let mbit: f64 = env_list("HZ_TB_MBIT", &[100.0])[0];
    let piece_kib: u32 = env_list("HZ_TB_PIECE_KIB", &[256])[0];
    let in_flight: usize = env_list("HZ_TB_IN_FLIGHT", &[4])[0];
    eprintln!("piece {piece_kib} KiB, {in_flight} in flight, {mbit} Mbit/s");
    eprintln!("  N     MB  bottleneck  bound s  measured s  ratio  goodput  load");
    for n in nodes {
        let Some(bed) = up_or_skip(&lan(n, mbit)) else {
            return;
        };
        for &mb in &mbs {
            let spec = allreduce::AllReduceSpec {
                piece_elems: piece_kib * 256,
                max_in_flight: in_flight,
                ..allreduce::AllReduceSpec::new(mb * 1_000_000)
            };
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let load = load.split_whitespace().next().unwrap_or("-").to_string();
            if let Err(e) = allreduce::check_memory(n, &spec) {
                eprintln!("{n:>3} {mb:>6}  skipped: {e}");
                continue;
            }
            let r = allreduce::run_allreduce(&bed, &spec).unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "{:>3} {:>6} {:>6.1} Mb/s {:>8.3} {:>11.3} {:>6.3} {:>6.1} {:>5}",
                n, mb, r.bottleneck_mbit, r.bound_s, r.elapsed_s, r.ratio, r.goodput_mbit, load
            );
        }
        bed.down().expect("down");
    }
}
