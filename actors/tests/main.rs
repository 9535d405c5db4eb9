//! The integration tests, one binary for the crate (each file below is a module).

mod ledger;
mod probes;
mod ring_quality;
mod state_store;
