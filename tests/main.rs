//! The integration tests, one binary for the crate (each file below is a module).

mod support {
    pub mod test_tls;

    /// A loopback port for a server a test starts later (the test kit's, drawn below the
    /// ephemeral range so no other test's outgoing connection takes it meanwhile).
    pub fn free_port() -> u16 {
        hanzod::testkit::process::free_port().expect("a free loopback port")
    }
}

mod agent;
mod byzantine;
mod chain;
mod chain_demo;
mod delta_cli;
mod delta_upload;
mod demo;
mod deploy;
mod failover;
mod grpc_abuse;
mod harness_faults;
mod hub;
mod ipfs;
mod lifecycle;
mod metrics_scrape;
mod processes;
mod publish;
mod publish_resume;
mod readme_harness;
mod standing;
mod supervision;
mod train;
mod turmoil_sims;
mod validation;
mod valkey;
mod verify_cli;
