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
    /// Where to accept probe traffic from peers.
    #[arg(long, default_value = "0.0.0.0:9560")]
    listen: String,
    /// host:port that peers use to reach --listen (default: 127.0.0.1 and the bound port).
    #[arg(long)]
    advertise: Option<String>,
    /// GPU model.
    #[arg(long, default_value = "NVIDIA A100-SXM4-80GB")]
    gpu_model: String,
    /// GPU memory, GiB.
    #[arg(long, default_value_t = 80)]
    vram_gib: u64,
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
    #[arg(long, default_value = "honest", value_name = "BEHAVIOUR")]
    byzantine: hanzod_node::trainer::Behaviour,
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

pub(crate) async fn run_node(args: NodeArgs) -> ExitCode {
    // Every argument is checked before anything is written (a key file) or bound.
    if !args
        .region
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || args.region.is_empty()
    {
        eprintln!("error: --region must be 1..=64 characters of [a-z0-9-], e.g. eu-west");
        return ExitCode::from(2);
    }
    let cap = args
        .compute_cap
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u8>().ok()?, b.parse::<u8>().ok()?)));
    let Some(compute_cap) = cap else {
        eprintln!("error: --compute-cap must be major.minor, e.g. 8.0");
        return ExitCode::from(2);
    };
    let Ok(driver_sig) = hex::decode(&args.driver_sig) else {
        eprintln!("error: --driver-sig must be hex");
        return ExitCode::from(2);
    };
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
    let Some(vram_bytes) = args.vram_gib.checked_mul(1 << 30) else {
        eprintln!("error: --vram-gib {} is too large", args.vram_gib);
        return ExitCode::from(2);
    };
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
        behaviour: args.byzantine,
        train: !args.no_train,
    };
    let agent = hanzod_node::Agent::new(settings, identity);
    let me = agent.node_id();
    let probes = tokio::spawn(hanzod_node::probe::serve(listener, me));
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
