//! Link probes: a timed TCP transfer from one node to a peer (DESIGN §4: Mbit/s measured,
//! not assumed).
//!
//! Protocol, on a fresh TCP connection to the peer's endpoint:
//! 1. prober → peer: `"HZPROBE1"`, the peer's node id (32 bytes), the length `n` (u64 BE);
//! 2. peer → prober: `"HZPROBE1"` when the id is its own (else it closes), so a probe never
//!    floods an endpoint that is not the named hanzod node;
//! 3. prober → peer: `n` bytes; peer → prober: the count received (u64 BE).
//!
//! Throughput = n × 8 / (time from the first byte sent to the count received) / 10^6, in
//! Mbit/s. The round trip of the final count is included, which under-reads short probes
//! on long paths by one RTT; probes of a few MiB keep that small.
//!
//! The same endpoint carries ring links (`crate::ring`): [`serve_peers`] looks at the first
//! 8 bytes of each connection without consuming them ([`MAGIC`] or
//! [`crate::ring::LINK_MAGIC`]) and hands it to the probe answerer or the ring router.

use std::time::{Duration, Instant};

use hanzod_actors::types::NodeId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The handshake magic.
pub const MAGIC: &[u8; 8] = b"HZPROBE1";
/// A peer accepts at most this many bytes per probe (64 MiB).
pub const MAX_PROBE_BYTES: u64 = 64 << 20;
/// Deadline of a whole probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// One measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measurement {
    /// Bytes transferred.
    pub bytes: u64,
    /// From the first byte sent to the peer's count received.
    pub elapsed: Duration,
}

impl Measurement {
    /// Throughput in Mbit/s: bytes × 8 / seconds / 10^6.
    pub fn mbps(&self) -> f32 {
        let us = self.elapsed.as_micros().max(1) as f64;
        (self.bytes as f64 * 8.0 / us) as f32
    }
}

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Connecting or transferring failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The endpoint did not answer as the named node.
    #[error("peer at the endpoint is not the named node")]
    WrongPeer,
    /// The peer counted another number of bytes than were sent.
    #[error("peer received {got} bytes of {sent}")]
    Short {
        /// Sent.
        sent: u64,
        /// Counted by the peer.
        got: u64,
    },
    /// Took longer than [`PROBE_TIMEOUT`].
    #[error("probe timed out")]
    Timeout,
}

/// Runs a probe of `bytes` bytes over `stream` (already connected to the peer's endpoint).
pub async fn probe<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: NodeId,
    bytes: u64,
) -> Result<Measurement, ProbeError> {
    let bytes = bytes.min(MAX_PROBE_BYTES);
    let run = async {
        let mut header = Vec::with_capacity(48);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(peer.as_bytes());
        header.extend_from_slice(&bytes.to_be_bytes());
        stream.write_all(&header).await?;
        let mut reply = [0u8; 8];
        if stream.read_exact(&mut reply).await.is_err() || &reply != MAGIC {
            return Err(ProbeError::WrongPeer);
        }
        let chunk = vec![0x5a_u8; 64 * 1024];
        let started = Instant::now();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            stream.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
        stream.flush().await?;
        let got = stream.read_u64().await?;
        let elapsed = started.elapsed();
        if got != bytes {
            return Err(ProbeError::Short { sent: bytes, got });
        }
        Ok(Measurement { bytes, elapsed })
    };
    tokio::time::timeout(PROBE_TIMEOUT, run)
        .await
        .map_err(|_| ProbeError::Timeout)?
}

/// Answers one probe on `stream` for node `me`; returns the bytes received.
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    me: NodeId,
) -> Result<u64, ProbeError> {
    let run = async {
        let mut header = [0u8; 48];
        stream.read_exact(&mut header).await?;
        if &header[..8] != MAGIC || header[8..40] != me.0 {
            return Err(ProbeError::WrongPeer);
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&header[40..48]);
        let want = u64::from_be_bytes(n).min(MAX_PROBE_BYTES);
        stream.write_all(MAGIC).await?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        while got < want {
            let cap = (want - got).min(buf.len() as u64) as usize;
            let r = stream.read(&mut buf[..cap]).await?;
            if r == 0 {
                break;
            }
            got += r as u64;
        }
        stream.write_u64(got).await?;
        stream.flush().await?;
        Ok(got)
    };
    tokio::time::timeout(PROBE_TIMEOUT, run)
        .await
        .map_err(|_| ProbeError::Timeout)?
}

/// Answers probes on `listener` for node `me` until the task is dropped; at most 8 at once.
/// Ring links are closed (see [`serve_peers`]).
pub async fn serve(listener: TcpListener, me: NodeId) {
    serve_peers(listener, me, None, FIRST_BYTES_TIMEOUT).await
}

/// How long an accepted peer connection may take to send its first 8 bytes, and a ring
/// link its preamble.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(5);
/// Probes answered at once at most.
pub const MAX_CONCURRENT_PROBES: usize = 8;
/// Accepted connections whose first bytes are awaited at once at most (more are closed).
pub const MAX_UNCLASSIFIED: usize = 32;

/// What a peer connection is, by its first 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    /// A link probe ([`MAGIC`]).
    Probe,
    /// A ring link ([`crate::ring::LINK_MAGIC`]).
    RingLink,
    /// Anything else (closed).
    Unknown,
}

/// Classifies a connection by its first 8 bytes.
pub fn classify(first: &[u8; 8]) -> PeerKind {
    if first == MAGIC {
        PeerKind::Probe
    } else if first == crate::ring::LINK_MAGIC {
        PeerKind::RingLink
    } else {
        PeerKind::Unknown
    }
}

/// Peeks (without consuming) the first 8 bytes of `stream` within `timeout`; `Ok(None)` when
/// the peer closed first.
pub async fn peek_first_bytes(
    stream: &TcpStream,
    timeout: Duration,
) -> Result<Option<[u8; 8]>, ProbeError> {
    let run = async {
        let mut buf = [0u8; 8];
        loop {
            let n = stream.peek(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            if n >= buf.len() {
                return Ok(Some(buf));
            }
            let prefix = &buf[..n];
            if !MAGIC.starts_with(prefix) && !crate::ring::LINK_MAGIC.starts_with(prefix) {
                return Ok(Some(buf));
            }
            // A peek returns at once while the bytes it saw are queued: wait a moment for
            // the rest of the 8 rather than spin.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| ProbeError::Timeout)?
}

/// Serves node `me`'s peer endpoint on `listener` until the task is dropped: link probes
/// (at most [`MAX_CONCURRENT_PROBES`] at once) and, with a `router`, ring links, told apart
/// by their first 8 bytes ([`classify`], peeked within `first_bytes_timeout`, the ring
/// preamble read within it too). A ring link without a router, an unknown or silent
/// connection, and connections beyond [`MAX_UNCLASSIFIED`] still being classified are
/// closed.
pub async fn serve_peers(
    listener: TcpListener,
    me: NodeId,
    router: Option<crate::ring::RingRouter>,
    first_bytes_timeout: Duration,
) {
    use std::sync::Arc;
    let probes = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_PROBES));
    let unclassified = Arc::new(tokio::sync::Semaphore::new(MAX_UNCLASSIFIED));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(pending) = unclassified.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (probes, router) = (probes.clone(), router.clone());
        tokio::spawn(async move {
            let first = match peek_first_bytes(&stream, first_bytes_timeout).await {
                Ok(Some(first)) => first,
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(%peer, "peer connection closed: {e}");
                    return;
                }
            };
            match (classify(&first), router) {
                (PeerKind::Probe, _) => {
                    drop(pending);
                    let Ok(_slot) = probes.try_acquire_owned() else {
                        return;
                    };
                    if let Err(e) = answer(stream, me).await {
                        tracing::debug!(%peer, "probe not answered: {e}");
                    }
                }
                (PeerKind::RingLink, Some(router)) => {
                    let r =
                        crate::ring::accept_link(stream, me, &router, first_bytes_timeout).await;
                    drop(pending);
                    match r {
                        Ok(offered) => tracing::debug!(%peer, ?offered, "ring link"),
                        Err(e) => tracing::debug!(%peer, "ring link closed: {e}"),
                    }
                }
                (PeerKind::RingLink, None) | (PeerKind::Unknown, _) => {
                    tracing::debug!(%peer, "peer connection closed: not a probe or ring link");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn probe_over_loopback_measures_and_refuses_wrong_peer() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let me = NodeId([3; 32]);
        let server = tokio::spawn(serve(l, me));
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let m = probe(s, me, 4 << 20).await.unwrap();
        assert_eq!(m.bytes, 4 << 20);
        assert!(m.mbps() > 0.0 && m.mbps().is_finite());
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(matches!(
            probe(s, NodeId([4; 32]), 1024).await,
            Err(ProbeError::WrongPeer)
        ));
        server.abort();
    }

    #[tokio::test]
    async fn one_endpoint_serves_probes_and_ring_links_and_closes_the_rest() {
        use crate::ring::{link_preamble, LinkKey, RingRouter};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let me = NodeId([3; 32]);
        let router = RingRouter::new();
        let server = tokio::spawn(serve_peers(
            l,
            me,
            Some(router.clone()),
            Duration::from_millis(200),
        ));
        // A probe.
        let s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(probe(s, me, 1 << 20).await.unwrap().bytes, 1 << 20);
        // A ring link, to the round waiting for it, its preamble consumed.
        let key = LinkKey {
            job: 4,
            epoch: 1,
            ring_version: 2,
            from: NodeId([8; 32]),
        };
        let waiting = router.expect(key);
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&link_preamble(&key, &me)).await.unwrap();
        c.write_all(b"HZRING01").await.unwrap();
        let mut got = waiting.await.unwrap();
        let mut magic = [0u8; 8];
        got.read_exact(&mut magic).await.unwrap();
        assert_eq!(&magic, b"HZRING01");
        // Silent, unknown, or a handshake without a preamble: closed.
        let mut buf = [0u8; 8];
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert_eq!(silent.read(&mut buf).await.unwrap_or(0), 0);
        for first in [&b"GET / HTTP/1.1\r\n"[..], b"HZRING01xxxxxxxx", b"HZ"] {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(first).await.unwrap();
            assert_eq!(c.read(&mut buf).await.unwrap_or(0), 0, "{first:?}");
        }
        server.abort();
    }

    #[test]
    fn mbps_is_bits_per_microsecond() {
        let m = Measurement {
            bytes: 1_250_000,
            elapsed: Duration::from_millis(100),
        };
        assert!((m.mbps() - 100.0).abs() < 1e-3, "{}", m.mbps());
    }
}
