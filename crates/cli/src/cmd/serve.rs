//! `hanzod serve`: the daemon, until SIGTERM or Ctrl-C.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use hanzod_daemon::config::Config;

use crate::fail;

/// Where `hanzod serve` keeps what it publishes.
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub(crate) struct ServeArgs {
    /// The data directory (overrides `data_dir`, default ./hanzod-data): published
    /// checkpoints in DIR/ipfs (by IPFS CID), model folders in DIR/models.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Write nothing to disk: checkpoints and deltas in memory, no model folders (clears
    /// data_dir, publish.object_dir, publish.registry_dir and deltas.store_dir). What the
    /// daemon trains is gone when it stops.
    #[arg(long, conflicts_with = "data_dir")]
    memory_only: bool,
}

impl ServeArgs {
    /// `cfg` with these flags applied: `--data-dir` replaces `data_dir`; `--memory-only`
    /// empties every local directory the daemon would write.
    pub(crate) fn apply(&self, mut cfg: Config) -> Config {
        if let Some(dir) = &self.data_dir {
            cfg.data_dir = dir.display().to_string();
        }
        if self.memory_only {
            cfg.data_dir.clear();
            cfg.publish.object_dir.clear();
            cfg.publish.registry_dir.clear();
            cfg.deltas.store_dir.clear();
        }
        cfg
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Config {
        Config::load(None, |_| None).expect("the embedded defaults")
    }

    /// Regression (issue 16): `hanzod serve` on the embedded defaults kept checkpoints in
    /// memory only and wrote no model folder, so a trained model could not be taken out.
    /// It now keeps both under ./hanzod-data (`--data-dir` elsewhere), and `--memory-only`
    /// still writes nothing.
    #[test]
    fn serve_keeps_checkpoints_and_model_folders_in_a_data_dir_by_default() {
        let cfg = ServeArgs::default().apply(defaults());
        assert_eq!(cfg.data_dir, "hanzod-data");
        assert_eq!(cfg.object_dir(), Some(PathBuf::from("hanzod-data/ipfs")));
        assert_eq!(
            cfg.registry_dir(),
            Some(PathBuf::from("hanzod-data/models"))
        );
        assert_eq!(
            cfg.storage_line(Some(std::path::Path::new("/srv"))),
            "checkpoints: /srv/hanzod-data/ipfs, model folders: /srv/hanzod-data/models"
        );

        let elsewhere = ServeArgs {
            data_dir: Some("/var/lib/hanzod".into()),
            memory_only: false,
        }
        .apply(defaults());
        assert_eq!(
            elsewhere.object_dir(),
            Some(PathBuf::from("/var/lib/hanzod/ipfs"))
        );
        assert_eq!(
            elsewhere.registry_dir(),
            Some(PathBuf::from("/var/lib/hanzod/models"))
        );

        // Explicit directories win over the data directory.
        let mut explicit = defaults();
        explicit.publish.object_dir = "/srv/objects".into();
        let explicit = ServeArgs::default().apply(explicit);
        assert_eq!(explicit.object_dir(), Some(PathBuf::from("/srv/objects")));
        assert_eq!(
            explicit.registry_dir(),
            Some(PathBuf::from("hanzod-data/models"))
        );

        let mut everything = defaults();
        everything.publish.object_dir = "/srv/objects".into();
        everything.publish.registry_dir = "/srv/models".into();
        everything.deltas.store_dir = "/srv/deltas".into();
        let memory = ServeArgs {
            data_dir: None,
            memory_only: true,
        }
        .apply(everything);
        assert_eq!((memory.object_dir(), memory.registry_dir()), (None, None));
        assert_eq!(memory.deltas.store_dir, "");
        let line = memory.storage_line(None);
        assert!(line.starts_with("checkpoints: in memory only"), "{line}");
        assert!(line.contains("model folders: none"), "{line}");
    }
}
