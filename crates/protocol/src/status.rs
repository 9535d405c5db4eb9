//! The gRPC status conventions node, client and daemon share: the session refusal
//! clients match on ([`UNKNOWN_SESSION`]), how a status reads as one line
//! ([`status_line`], [`code_name`]), and the chunking of streamed transfers
//! ([`byte_chunks`]).

/// `s` cut to its first `max_chars` characters with `…` appended when longer: how untrusted
/// text (a CID, a tensor name, a peer's error body) is quoted in a log line or a status
/// message, so its size stays bounded whatever was sent.
pub fn quote_bounded(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => s.to_string(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

/// The refusal of a session token the daemon does not hold (expired, replaced, or from
/// before a restart). Clients match it to retry through their new session.
pub const UNKNOWN_SESSION: &str = "unknown or expired session; register again";

/// `bytes` cut into consecutive chunks of at most `chunk_bytes` (at least 1) for a
/// streaming transfer (delta uploads, checkpoint downloads). Lazy: each chunk is copied
/// out of `bytes` when the transport asks for it.
pub fn byte_chunks(
    bytes: std::sync::Arc<[u8]>,
    chunk_bytes: usize,
) -> impl Iterator<Item = Vec<u8>> + Send + 'static {
    let step = chunk_bytes.max(1);
    (0..bytes.len().div_ceil(step)).map(move |i| {
        let end = ((i + 1) * step).min(bytes.len());
        bytes[i * step..end].to_vec()
    })
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await.map(|_| ());
}

/// A gRPC status as one line: `NOT_FOUND: job 9 not found`.
pub fn status_line(s: &tonic::Status) -> String {
    format!("{}: {}", code_name(s.code()), s.message())
}

/// The canonical upper-case name of a gRPC code.
pub fn code_name(c: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match c {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_are_cut_at_a_character_bound() {
        assert_eq!(super::quote_bounded("abc", 3), "abc");
        assert_eq!(super::quote_bounded("abcd", 3), "abc…");
        assert_eq!(super::quote_bounded("ééé", 2), "éé…");
        assert_eq!(super::quote_bounded("", 0), "");
        assert_eq!(super::quote_bounded("x", 0), "…");
    }
}
