//! [`FieldError`]: a malformed or oversized field of a request, named by its protobuf path.
//! Shared by the conversions from the wire ([`crate::convert`]) and the size limits checked
//! before them ([`crate::limits`]); the services turn it into `INVALID_ARGUMENT`.

use tonic::Status;

/// A malformed field: `field` is its protobuf path (e.g. `info.gpu.vram_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct FieldError {
    /// The field's path.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl From<FieldError> for Status {
    fn from(e: FieldError) -> Status {
        Status::invalid_argument(e.to_string())
    }
}
