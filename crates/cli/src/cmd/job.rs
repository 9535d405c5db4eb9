//! `hanzod job`: submit, inspect, follow and cancel jobs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::{fail, ClientArgs, CLIENT_EXAMPLES};

#[derive(Subcommand, Debug)]
pub(crate) enum JobCommand {
    /// Submit a job spec (TOML; see config/job.example.toml).
    #[command(after_help = "Example:\n  hanzod job submit config/job.example.toml")]
    Submit {
        /// The spec file.
        spec: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// One job's state, ring and checkpoints.
    #[command(after_help = CLIENT_EXAMPLES)]
    Status {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Every job.
    #[command(after_help = CLIENT_EXAMPLES)]
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print each change of a job until it ends; exit 1 when it ends Failed (or cancelled).
    #[command(after_help = CLIENT_EXAMPLES)]
    Watch {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a job.
    #[command(after_help = CLIENT_EXAMPLES)]
    Cancel {
        /// The job id.
        job: u64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub(crate) async fn run_job(cmd: JobCommand) -> ExitCode {
    let r: anyhow::Result<()> = async {
        match cmd {
            JobCommand::Submit { spec, client } => {
                let spec = crate::client_cmds::JobSpecFile::load(&spec)?;
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.submit(&spec, client.json).await.map(|_| ())
            }
            JobCommand::Status { job, client } => {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.status(job, client.json).await
            }
            JobCommand::List { client } => {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.list(client.json).await
            }
            JobCommand::Watch { job, client } => {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.watch(job, client.json).await
            }
            JobCommand::Cancel { job, client } => {
                let mut c = crate::client_cmds::Clients::connect(client.options()).await?;
                c.cancel(job, client.json).await
            }
        }
    }
    .await;
    r.map_or_else(fail, |_| ExitCode::SUCCESS)
}
