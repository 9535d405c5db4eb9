//! One module per `hanzod` subcommand: its arguments and what it runs.

#[cfg(feature = "testkit")]
pub(crate) mod bench;
pub(crate) mod chain;
pub(crate) mod delta;
#[cfg(feature = "testkit")]
pub(crate) mod demo;
pub(crate) mod job;
pub(crate) mod lm;
pub(crate) mod node;
pub(crate) mod serve;
#[cfg(feature = "testkit")]
pub(crate) mod sim;
#[cfg(feature = "testkit")]
pub(crate) mod testbed;
pub(crate) mod verify;
