//! A member's two TCP links: to its successor (it sends pieces) and from its predecessor
//! (it receives them), and a helper that wires a whole ring on loopback.
//!
//! Who connects is fixed: each member connects to its successor's listener and accepts
//! its predecessor on its own. Nothing is trusted from the accept: the round's handshake
//! (`wire::handshake`) proves the peer is the expected neighbour.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

/// A member's links for one round.
#[derive(Debug)]
pub struct RingLinks {
    /// The stream to the successor (`ring[(r + 1) mod n]`).
    pub send_to: TcpStream,
    /// The stream from the predecessor (`ring[(r − 1) mod n]`).
    pub recv_from: TcpStream,
}

/// Connects to the successor at `successor` while accepting one connection on `listener`
/// (the predecessor's), both at once; sets `TCP_NODELAY` on both.
pub async fn connect_links(
    listener: &TcpListener,
    successor: SocketAddr,
) -> std::io::Result<RingLinks> {
    let (send_to, accepted) = tokio::join!(TcpStream::connect(successor), listener.accept());
    let send_to = send_to?;
    let (recv_from, _) = accepted?;
    send_to.set_nodelay(true)?;
    recv_from.set_nodelay(true)?;
    Ok(RingLinks { send_to, recv_from })
}

/// Wires a ring of `n` members on 127.0.0.1 (one listener per member on an ephemeral
/// port): element `r` of the result is member `r`'s links. Returns an empty vector for
/// `n < 2` (a lone member needs no links). For tests and benches.
pub async fn loopback_ring(n: usize) -> std::io::Result<Vec<RingLinks>> {
    if n < 2 {
        return Ok(Vec::new());
    }
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        listeners.push(TcpListener::bind("127.0.0.1:0").await?);
    }
    let addrs = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut tasks = Vec::with_capacity(n);
    for (r, listener) in listeners.into_iter().enumerate() {
        let succ = addrs[(r + 1) % n];
        tasks.push(tokio::spawn(
            async move { connect_links(&listener, succ).await },
        ));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.map_err(std::io::Error::other)??);
    }
    Ok(out)
}
