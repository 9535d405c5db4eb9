//! Model deltas (DESIGN §6, paper §5–§6): the `HZDL` wire format and its signed statement
//! ([`format`]), model descriptions for the format check ([`model`]), score math and the
//! commit–reveal spot-check selection ([`score`]), merging ([`merge`]), the report of
//! `hanzod delta inspect` ([`inspect`]), the content-addressed blob store deltas are kept in
//! ([`store`]), and the catalog of models and datasets jobs may name ([`catalog`]).

pub mod catalog;
pub mod format;
pub mod inspect;
pub mod merge;
pub mod model;
pub mod score;
pub mod sink;
pub mod store;
pub mod validate;
