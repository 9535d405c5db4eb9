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

use std::time::{Duration, Instant};

use hanzod_actors::types::NodeId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

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
pub async fn serve(listener: TcpListener, me: NodeId) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(8));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            if let Err(e) = answer(stream, me).await {
                tracing::debug!(%peer, "probe not answered: {e}");
            }
            drop(permit);
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

    #[test]
    fn mbps_is_bits_per_microsecond() {
        let m = Measurement {
            bytes: 1_250_000,
            elapsed: Duration::from_millis(100),
        };
        assert!((m.mbps() - 100.0).abs() < 1e-3, "{}", m.mbps());
    }
}
