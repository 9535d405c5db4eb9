//! `hanzod node`: the node agent.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::{fail, ClientArgs};

#[derive(Args, Debug)]
pub(crate) struct NodeArgs {
    /// The node key; generated there if missing.
    #[arg(long, default_value = "hanzod-node.key")]
    key: PathBuf,
    /// Region label ([a-z0-9-]).
    #[arg(long, default_value = "local")]
    region: String,
    /// Where to accept peer traffic: link probes and ring all-reduce links.
    #[arg(long, default_value = "0.0.0.0:9560")]
    listen: String,
    /// host:port that peers use to reach --listen (default: 127.0.0.1 and the bound port).
    #[arg(long)]
    advertise: Option<String>,
    /// GPU model, as shown to operators (nothing is detected).
    #[arg(long, default_value = "unspecified")]
    gpu_model: String,
    /// GPU memory this node offers jobs, GiB (required: nothing is detected, and jobs are
    /// placed only on nodes with at least their `min_vram_bytes`; the example job needs 8).
    #[arg(long, value_name = "GIB")]
    vram_gib: Option<u64>,
    /// CUDA compute capability, major.minor.
    #[arg(long, default_value = "8.0")]
    compute_cap: String,
    /// Attestation signature, hex (empty in development mode).
    #[arg(long, default_value = "")]
    driver_sig: String,
    /// Declared upload capacity, Mbit/s.
    #[arg(long, default_value_t = 1000.0)]
    up_mbps: f32,
    /// Declared download capacity, Mbit/s.
    #[arg(long, default_value_t = 1000.0)]
    down_mbps: f32,
    /// First reconnect delay, ms (doubles up to --backoff-max-ms, with jitter).
    #[arg(long, default_value_t = 500)]
    backoff_min_ms: u64,
    /// Longest reconnect delay, ms.
    #[arg(long, default_value_t = 30_000)]
    backoff_max_ms: u64,
    /// Fault injection: train as a Byzantine node. `poison[:scale]` uploads −scale × the
    /// honest delta (scale 10); `lie-loss[:factor]` claims factor × the measured loss
    /// (0.5). The validator must reject or down-weight it, and a spot-check slash it.
    /// In ring aggregation: `tamper-allreduce[:perturbation]` adds the perturbation (1.0)
    /// to every value of its weighted contribution to the all-reduce (the sketch check
    /// must catch it); `substitute[:perturbation]` commits to its honest delta but
    /// reduces and sketches it plus the perturbation (0.001; a spot-check or the
    /// post-reduce audit must catch it); `free-ride` skips training and commits the previous
    /// epoch's global update as its delta.
    /// The attack suite (issue 19): `sign-flip` (−δ), `scale:<k>` (k·δ), `noise[:sigma]`
    /// (Gaussian noise of norm sigma·‖δ‖, 1), `alie[:z]` ("A little is enough": the
    /// colluders' mean + z·std, z the paper's z_max by default), `ipm[:eps]` (−eps × the
    /// colluders' mean, 0.5), `copy-peer[:rescale[:noise]]` (a colluder's delta, 1, 0),
    /// `copy-last[:rescale[:noise]]` (the last merged update, 1, 0), `lazy[:scale]`
    /// (scale·δ, 0), `stale[:epochs]` (trains from the base of that many epochs ago, 1;
    /// at most 16), `identical` (every colluder uploads the colluders' mean). alie, ipm,
    /// copy-peer and identical read the colluders' deltas through --collude; without it
    /// they forge from this node's delta alone.
    #[arg(long, default_value = "honest", value_name = "BEHAVIOUR")]
    byzantine: hanzod_node::trainer::Byzantine,
    /// Fault injection: a folder shared by the colluding Byzantine node processes (one
    /// host, or a shared mount), where each writes its honest delta per epoch and reads the
    /// others' before forging its upload (needs --colluders). Only the colluding attacks
    /// (alie, ipm, copy-peer, identical) use it.
    #[arg(long, value_name = "DIR")]
    collude: Option<PathBuf>,
    /// With --collude: how many colluders (this node included) to wait for, each epoch, at
    /// most 5 s or until the epoch's deadline (then it forges from those it found).
    #[arg(long, value_name = "N")]
    colluders: Option<usize>,
    /// Where this node trains: `cpu`, `cuda` (device 0), `cuda:N` or `wgpu`. A GPU needs a
    /// build with `--features cuda` (or `wgpu`).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    device: String,
    /// Stop when standard input reaches end of file: a supervising parent (`hanzod demo`)
    /// holds the other end, so its death stops the node.
    #[arg(long, hide = true)]
    parent_stdin: bool,
    /// Hold the session only and ignore epoch assignments (transport and recovery tests).
    #[arg(long, hide = true)]
    no_train: bool,
    #[command(flatten)]
    client: ClientArgs,
}

/// What `hanzod node`'s arguments declare, once checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Declared {
    device: hanzod_train::backend::Backend,
    vram_bytes: u64,
    compute_cap: (u8, u8),
    driver_sig: Vec<u8>,
    collusion: Option<hanzod_node::collude::Collusion>,
}

/// Checks every argument of `hanzod node` that could be wrong on the command line, as the
/// daemon would at registration (`INVALID_ARGUMENT`) and more: a usage error, which
/// `hanzod node` reports with exit status 2 (as clap does its own) before it writes a key
/// or binds a port. What can only fail later (a port in use, an unreachable daemon) is a
/// failure, status 1.
pub(crate) fn check_args(args: &NodeArgs) -> Result<Declared, String> {
    let region = &args.region;
    if region.is_empty()
        || region.len() > 64
        || !region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "--region {region:?} must be 1..=64 characters of [a-z0-9-], e.g. eu-west"
        ));
    }
    let Some(vram_gib) = args.vram_gib else {
        return Err(
            "--vram-gib is required: the GPU memory this node offers jobs, in GiB (hanzod \
             node detects no GPU, and declares none it was not told of; \
             config/job.example.toml needs 8: --vram-gib 8)"
                .into(),
        );
    };
    let vram_bytes = match vram_gib.checked_mul(1 << 30) {
        Some(0) => return Err("--vram-gib must be at least 1".into()),
        Some(b) => b,
        None => return Err(format!("--vram-gib {vram_gib} is too large")),
    };
    let model = &args.gpu_model;
    if model.is_empty() || model.len() > 128 || model.chars().any(char::is_control) {
        return Err("--gpu-model must be 1..=128 bytes without control characters".into());
    }
    let compute_cap = args
        .compute_cap
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u8>().ok()?, b.parse::<u8>().ok()?)))
        .ok_or("--compute-cap must be major.minor, e.g. 8.0")?;
    let driver_sig = hex::decode(&args.driver_sig).map_err(|_| "--driver-sig must be hex")?;
    if driver_sig.len() > 1024 {
        return Err("--driver-sig must be at most 1024 bytes".into());
    }
    for (flag, v) in [("--up-mbps", args.up_mbps), ("--down-mbps", args.down_mbps)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(format!("{flag} {v} must be a number >= 0"));
        }
    }
    let port = args
        .listen
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    if !matches!(port, Some((host, Ok(_))) if !host.is_empty()) {
        return Err(format!(
            "--listen {:?} must be host:port, e.g. 0.0.0.0:9560",
            args.listen
        ));
    }
    if let Some(advertise) = &args.advertise {
        hanzod_protocol::convert::endpoint("--advertise", advertise)
            .map_err(|e| format!("{e} (host:port, e.g. 203.0.113.7:9560)"))?;
    }
    for endpoint in args.client.options().endpoints() {
        let only_syntax = hanzod_protocol::client::ClientOptions {
            endpoint,
            ca: None,
            cert: None,
            key: None,
            ..args.client.options()
        };
        only_syntax
            .endpoint()
            .map_err(|e| format!("--endpoint: {e}"))?;
    }
    if args.backoff_min_ms == 0 || args.backoff_min_ms > args.backoff_max_ms {
        return Err(format!(
            "--backoff-min-ms ({}) must be at least 1 and at most --backoff-max-ms ({})",
            args.backoff_min_ms, args.backoff_max_ms
        ));
    }
    let device = args
        .device
        .parse::<hanzod_train::backend::Backend>()
        .and_then(hanzod_train::backend::Backend::check_built)
        .map_err(|e| format!("--device: {e}"))?;
    let collusion = match (&args.collude, args.colluders) {
        (None, None) => None,
        (Some(dir), Some(n)) => {
            Some(hanzod_node::collude::Collusion::new(dir, n).map_err(|e| e.to_string())?)
        }
        (Some(_), None) => {
            return Err("--collude needs --colluders: how many colluders to wait for".into())
        }
        (None, Some(_)) => {
            return Err("--colluders needs --collude: the folder the colluders share".into())
        }
    };
    Ok(Declared {
        device,
        vram_bytes,
        compute_cap,
        driver_sig,
        collusion,
    })
}

pub(crate) async fn run_node(args: NodeArgs) -> ExitCode {
    // Every argument is checked before anything is written (a key file) or bound; a bad
    // one is a usage error (2), like clap's own.
    let Declared {
        device,
        vram_bytes,
        compute_cap,
        driver_sig,
        collusion,
    } = match check_args(&args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = hanzod_train::backend::select(device) {
        return fail(e);
    }
    let listener = match tokio::net::TcpListener::bind(&args.listen).await {
        Ok(l) => l,
        Err(e) => return fail(format!("cannot listen on {}: {e}", args.listen)),
    };
    let bound = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let advertise = args.advertise.clone().unwrap_or_else(|| {
        if bound.ip().is_unspecified() {
            tracing::warn!(
                "--advertise not given: peers will be told 127.0.0.1:{}",
                bound.port()
            );
            format!("127.0.0.1:{}", bound.port())
        } else {
            bound.to_string()
        }
    });
    let (identity, created) = match hanzod_protocol::identity::Identity::load_or_generate(&args.key)
    {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    if created {
        tracing::info!(key = %args.key.display(), "generated a new node key");
    }
    let settings = hanzod_node::AgentSettings {
        orchestrator: args.client.options(),
        gpu_model: args.gpu_model,
        vram_bytes,
        compute_cap,
        driver_sig,
        up_mbps: args.up_mbps,
        down_mbps: args.down_mbps,
        region: args.region,
        advertise,
        backoff_min_ms: args.backoff_min_ms,
        backoff_max_ms: args.backoff_max_ms,
        behaviour: args.byzantine.behaviour,
        ring_fault: args.byzantine.ring,
        collusion,
        round: hanzod_node::ring::RoundSettings::default(),
        train: !args.no_train,
    };
    let agent = hanzod_node::Agent::new(settings, identity);
    let me = agent.node_id();
    // One endpoint for link probes and ring links (told apart by their first bytes).
    let probes = tokio::spawn(hanzod_node::probe::serve_peers(
        listener,
        me,
        Some(agent.ring_router()),
        hanzod_node::probe::FIRST_BYTES_TIMEOUT,
    ));
    let mut events = agent.subscribe();
    let json = args.client.json;
    // The event printer; stdout closing (the reader went away) stops the node.
    let (gone_tx, mut gone) = tokio::sync::watch::channel(false);
    let printer = tokio::spawn(async move {
        use std::io::Write;
        loop {
            let line = match events.recv().await {
                Ok(e) if json => match serde_json::to_string(&e) {
                    Ok(s) => s,
                    Err(_) => continue,
                },
                Ok(e) => hanzod_node::describe(&e),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            };
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                let _ = gone_tx.send(true);
                return;
            }
        }
    });
    // With --parent-stdin, stdin reaching EOF (the parent died) stops the node too.
    let parent = args.parent_stdin;
    let orphaned = async move {
        if !parent {
            return std::future::pending().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    eprintln!("node {me}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut run = tokio::spawn(agent.run(stop));
    let result = tokio::select! {
        r = &mut run => r,
        _ = hanzod_daemon::serve::termination() => {
            let _ = stop_tx.send(true);
            run.await
        }
        _ = async move {
            if gone.wait_for(|v| *v).await.is_err() {
                std::future::pending::<()>().await;
            }
        } => {
            let _ = stop_tx.send(true);
            run.await
        }
        _ = orphaned => {
            let _ = stop_tx.send(true);
            run.await
        }
    };
    probes.abort();
    // Let the printer write the last events.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    printer.abort();
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => fail(e),
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeArgs,
    }

    fn check(args: &[&str]) -> Result<Declared, String> {
        let cli = Cli::try_parse_from(std::iter::once("node").chain(args.iter().copied()))
            .map_err(|e| format!("clap: {e}"))?;
        check_args(&cli.node)
    }

    /// Regression (issue 16): `hanzod node` declared an NVIDIA A100 with 80 GiB by default,
    /// whatever the machine had. It detects nothing, so it now declares no VRAM it was not
    /// told of: `--vram-gib` is required, and the GPU model defaults to "unspecified".
    #[test]
    fn node_declares_no_vram_it_was_not_told_of() {
        let err = check(&["--region", "eu-west"]).unwrap_err();
        assert!(err.contains("--vram-gib is required"), "{err}");
        assert!(err.contains("--vram-gib 8"), "{err}");
        let d = check(&["--vram-gib", "8"]).unwrap();
        assert_eq!(d.vram_bytes, 8 << 30);
        assert_eq!(d.compute_cap, (8, 0));
        let cli = Cli::try_parse_from(["node", "--vram-gib", "8"]).unwrap();
        assert_eq!(cli.node.gpu_model, "unspecified");
        let err = check(&["--vram-gib", "0"]).unwrap_err();
        assert!(err.contains("at least 1"), "{err}");
    }

    /// Regression (issue 16): a bad `--region` exited 2 but other bad arguments (a region
    /// of 65 characters, a malformed --advertise or --listen, a negative bandwidth) exited
    /// 1 after a key was written, when the daemon refused them. Every argument is now
    /// checked up front, as a usage error (exit 2).
    #[test]
    fn every_bad_node_argument_is_a_usage_error() {
        let long = "a".repeat(65);
        for (args, says) in [
            (vec!["--region", "EU West"], "--region"),
            (vec!["--region", long.as_str()], "--region"),
            (vec!["--region", ""], "--region"),
            (vec!["--gpu-model", ""], "--gpu-model"),
            (vec!["--compute-cap", "8"], "--compute-cap"),
            (vec!["--driver-sig", "xyz"], "--driver-sig"),
            (vec!["--up-mbps=-1"], "--up-mbps"),
            (vec!["--down-mbps", "NaN"], "--down-mbps"),
            (vec!["--listen", "nowhere"], "--listen"),
            (vec!["--listen", "0.0.0.0:99999"], "--listen"),
            (vec!["--advertise", "peer"], "--advertise"),
            (vec!["--advertise", "peer:0"], "--advertise"),
            (vec!["--endpoint", "http://bad host:9550"], "--endpoint"),
            (vec!["--backoff-min-ms", "60000"], "--backoff-min-ms"),
            (vec!["--device", "tpu"], "--device"),
            (vec!["--collude", "/tmp/c"], "--colluders"),
            (vec!["--colluders", "2"], "--collude"),
            (
                vec!["--collude", "/tmp/c", "--colluders", "0"],
                "--colluders",
            ),
        ] {
            let mut full = vec!["--vram-gib", "8"];
            full.extend(args.iter().copied());
            let err = check(&full).expect_err(&format!("{args:?} is refused"));
            assert!(err.contains(says), "{args:?}: {err}");
        }
        // A GPU this build lacks names the feature that adds it.
        for gpu in ["cuda", "cuda:1", "wgpu"] {
            let built = hanzod_train::backend::built();
            let name = gpu.split(':').next().unwrap_or(gpu);
            match check(&["--vram-gib", "8", "--device", gpu]) {
                Ok(d) => assert!(built.contains(&name), "{gpu}: {:?}", d.device),
                Err(e) => assert!(e.contains(&format!("--features {name}")), "{gpu}: {e}"),
            }
        }
        assert_eq!(
            check(&["--vram-gib", "8"]).map(|d| d.device),
            Ok(hanzod_train::backend::Backend::Cpu)
        );
        let sig = "ab".repeat(1025);
        let err = check(&["--vram-gib", "8", "--driver-sig", &sig]).unwrap_err();
        assert!(err.contains("1024 bytes"), "{err}");
        // A bad --byzantine is clap's error, naming the forms.
        let err = check(&["--vram-gib", "8", "--byzantine", "evil"]).unwrap_err();
        assert!(
            err.contains("alie[:z]") && err.contains("free-ride"),
            "{err}"
        );
        let err = check(&["--vram-gib", "8", "--byzantine", "scale:1"]).unwrap_err();
        assert!(err.contains("other than 0 and 1"), "{err}");
        let d = check(&[
            "--vram-gib",
            "8",
            "--byzantine",
            "alie",
            "--collude",
            "/tmp/c",
            "--colluders",
            "3",
        ])
        .unwrap();
        assert_eq!(
            d.collusion,
            Some(hanzod_node::collude::Collusion::new("/tmp/c", 3).unwrap())
        );
        // What is fine stays fine.
        check(&[
            "--vram-gib",
            "24",
            "--region",
            "us-east-1",
            "--listen",
            "[::]:0",
            "--advertise",
            "203.0.113.7:9560",
            "--endpoint",
            "http://127.0.0.1:9550,https://orch.example:9550",
            "--driver-sig",
            "",
        ])
        .unwrap();
    }
}
