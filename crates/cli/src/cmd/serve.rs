//! `hanzod serve`: the daemon, until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use hanzod_daemon::config::Config;

use crate::fail;

/// `hanzod serve`: one daemon on the in-memory store, or, with `VALKEY_URL`, one replica
/// under leader election (`hanzod_daemon::replica`).
pub(crate) async fn serve(cfg: Config) -> ExitCode {
    if cfg.state.valkey_url.is_empty() {
        let daemon = match hanzod_daemon::serve::Daemon::start(&cfg).await {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        hanzod_daemon::serve::termination().await;
        tracing::info!("shutting down");
        daemon.stop().await;
        return ExitCode::SUCCESS;
    }
    let store = match hanzod_adapters::valkey::ValkeyStateStore::connect(&cfg.state).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let health = hanzod_daemon::health::Health::new(hanzod_daemon::health::Role::Standby);
    {
        let store = store.clone();
        health.watch_store(move || store.health());
    }
    let outcome = hanzod_daemon::replica::run(
        &cfg,
        std::sync::Arc::new(store),
        hanzod_daemon::serve::DaemonParts::default(),
        health,
        hanzod_daemon::serve::termination(),
    )
    .await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
