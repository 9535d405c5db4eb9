//! `hanzod demo`: the main job (feature `testkit`).

use std::process::ExitCode;

use hanzod_daemon::config::Config;

use crate::{fail, runtime};

pub(crate) fn run_demo(
    cfg: &Config,
    args: hanzod_testkit::demo::DemoArgs,
    json: bool,
    no_progress: bool,
) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("cannot find the hanzod executable: {e}")),
    };
    let mut plan = match args.plan(exe) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    plan.progress = !no_progress;
    // Held until the run ends: a second demo into this folder is refused meanwhile.
    let lock = match hanzod_testkit::demo::prepare_out(&plan.out) {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The orchestrator's log goes to a file: the terminal shows the live view.
    let logs = plan.out.join("logs");
    let log = std::fs::create_dir_all(&logs)
        .and_then(|_| std::fs::File::create(logs.join("orchestrator.log")));
    match log {
        Ok(file) => {
            let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log.filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        Err(e) => return fail(format!("{}: {e}", logs.display())),
    }
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return fail(e),
    };
    match rt.block_on(hanzod_testkit::demo::run_in(plan, lock)) {
        Ok(summary) => {
            if json {
                match serde_json::to_string_pretty(&summary) {
                    Ok(s) => println!("{s}"),
                    Err(e) => return fail(e),
                }
            } else {
                print!("{}", hanzod_testkit::demo::render(&summary));
            }
            if summary.succeeded() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(e),
    }
}
