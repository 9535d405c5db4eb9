//! # hanzod-daemon
//!
//! `hanzod serve`, the orchestrator daemon (DESIGN §9, §10): the configuration tree
//! ([`config`]), the daemon's assembly and lifecycle ([`serve`]), the gRPC services
//! ([`grpc`]), active–passive replicas on Valkey ([`replica`]), `/healthz` and `/readyz`
//! ([`health`]) and the Prometheus exporter ([`metrics`]).
//!
//! Start one in-process with [`serve::Daemon::start`]; `hanzod serve` runs
//! [`replica::run`].
#![warn(missing_docs)]

pub mod config;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod replica;
pub mod serve;
