//! `hanzod sim`: a job on simulated nodes with seeded faults (feature `testkit`).

use std::process::ExitCode;

use hanzod_daemon::config::Config;

use crate::fail;

pub(crate) fn run_sim(cfg: &Config, args: hanzod_testkit::sim::SimArgs, json: bool) -> ExitCode {
    if let Err(e) = args.check() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // Injected actor panics are faults of the simulation, not crashes of hanzod:
    // report them in one line instead of a panic message and backtrace.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if msg.starts_with("injected fault") {
            tracing::warn!("{msg}");
        } else {
            default_hook(info);
        }
    }));
    // Simulated time: timers fire as soon as nothing else can run.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("runtime: {e}")),
    };
    let report = rt.block_on(hanzod_testkit::sim::run(cfg, &args));
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: {e}"),
        }
    } else {
        hanzod_testkit::sim::print_human(&report);
    }
    if matches!(report.phase, hanzod_actors::job::JobPhase::Published { .. }) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
