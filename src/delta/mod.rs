//! Model deltas (DESIGN §6, paper §5–§6): the `HZDL` wire format and its signed statement
//! ([`format`]), model descriptions for the format check ([`model`]), score math and the
//! commit–reveal spot-check selection ([`score`]), merging ([`merge`]), and the report of
//! `hanzod delta inspect` ([`inspect`]).

pub mod format;
pub mod inspect;
pub mod merge;
pub mod model;
pub mod score;
