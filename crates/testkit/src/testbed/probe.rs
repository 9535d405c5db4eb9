//! Every directed node→node link of an up test bed measured with the node agent's own probe
//! protocol (`hanzod_node::probe`: a timed TCP transfer of a given size, the count echoed
//! back), against the configured rate; then the ring the project builds on the measured
//! matrix, judged on the configured ("true") one. This is what the orchestrator would do
//! with real probes, so the figures are the probe's error and what that error costs the
//! ring.
//!
//! Rates are Mbit/s (10⁶ bit/s). The configured rate is on the wire (Ethernet frames, see
//! the [module](super) docs) while a probe measures TCP payload, so a perfect probe reads
//! about [`GOODPUT_FACTOR`] × the configured rate; both errors are reported.

use std::net::SocketAddr;
use std::time::Duration;

use hanzod_actors::ring::{
    bottleneck, default_builder, exact_max_bottleneck, BandwidthMatrix, RingBuilder,
    EXACT_MAX_NODES,
};
use hanzod_actors::types::NodeId;
use hanzod_node::probe::{self as node_probe, ProbeError};
use serde::Serialize;

use super::{in_namespace, Endpoint, Testbed, TestbedError};

/// TCP payload per Ethernet frame at MTU 1500 with TCP timestamps: 1448 / 1514 bytes
/// (htb counts the 14-byte Ethernet header, not the preamble or FCS). A probe that is
/// exact reads this fraction of the configured wire rate.
pub const GOODPUT_FACTOR: f64 = 1448.0 / 1514.0;

/// The node agent's default probe size, bytes (`core.probe.probe_bytes`, 2 MiB).
pub const DEFAULT_PROBE_BYTES: u64 = 2 << 20;

/// One measured link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkProbe {
    /// The sending node.
    pub from: usize,
    /// The receiving node.
    pub to: usize,
    /// The configured (wire) rate, Mbit/s.
    pub configured_mbit: f64,
    /// What the probe measured (payload), Mbit/s.
    pub measured_mbit: f64,
    /// Bytes the probe sent.
    pub bytes: u64,
    /// The probe's timed span, s (first byte sent to the count received).
    pub seconds: f64,
}

impl LinkProbe {
    /// (measured − configured) / configured.
    pub fn relative_error(&self) -> f64 {
        (self.measured_mbit - self.configured_mbit) / self.configured_mbit
    }

    /// (measured − [`GOODPUT_FACTOR`] × configured) / ([`GOODPUT_FACTOR`] × configured):
    /// the error against what a perfect payload measurement would read.
    pub fn goodput_error(&self) -> f64 {
        let want = self.configured_mbit * GOODPUT_FACTOR;
        (self.measured_mbit - want) / want
    }
}

/// The ring built on the measured matrix against the best ring on the configured matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RingComparison {
    /// The builder used (the project's default, `ThresholdRingBuilder`).
    pub builder: String,
    /// The ring built on the measured matrix (node indices; node `order[k]` sends to
    /// `order[k + 1]`).
    pub measured_ring: Vec<usize>,
    /// Its bottleneck on the measured matrix, Mbit/s.
    pub measured_ring_on_measured_mbit: f64,
    /// Its bottleneck on the configured matrix, Mbit/s.
    pub measured_ring_on_true_mbit: f64,
    /// The ring the builder makes on the configured matrix.
    pub true_ring: Vec<usize>,
    /// Its bottleneck on the configured matrix, Mbit/s.
    pub true_ring_on_true_mbit: f64,
    /// The exact best bottleneck on the configured matrix, Mbit/s (`None` above
    /// `EXACT_MAX_NODES` nodes).
    pub exact_on_true_mbit: Option<f64>,
    /// `measured_ring_on_true_mbit` / the best of `true_ring_on_true_mbit` and
    /// `exact_on_true_mbit` (1 = the probes cost the ring nothing).
    pub ratio: f64,
}

/// Every link's measurement, their error summary and the ring comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeReport {
    /// Bytes per probe.
    pub probe_bytes: u64,
    /// One entry per directed node→node link, row by row.
    pub links: Vec<LinkProbe>,
    /// Mean of |relative error| over the links.
    pub mean_abs_error: f64,
    /// Max of |relative error| over the links.
    pub max_abs_error: f64,
    /// Mean of |goodput error| over the links.
    pub mean_abs_goodput_error: f64,
    /// Max of |goodput error| over the links.
    pub max_abs_goodput_error: f64,
    /// The ring comparison.
    pub ring: RingComparison,
}

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeRunError {
    /// Setting up a socket in a namespace failed.
    #[error(transparent)]
    Testbed(#[from] TestbedError),
    /// A probe failed.
    #[error("probe n{from} -> n{to}: {source}")]
    Probe {
        /// The sending node.
        from: usize,
        /// The receiving node.
        to: usize,
        /// Why.
        #[source]
        source: ProbeError,
    },
    /// The bed has fewer than two nodes: no link to measure.
    #[error("the test bed has {0} node(s): at least 2 are needed")]
    TooFewNodes(usize),
    /// `bytes` is 0 or above the probe's limit.
    #[error("probe size {0} bytes: 1 to {max} allowed", max = node_probe::MAX_PROBE_BYTES)]
    BadSize(u64),
}

/// The id a node answers probes for (any 32 bytes do: the probe only checks that the
/// endpoint answers for the id it was asked for).
fn probe_id(node: usize) -> NodeId {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&(node as u64 + 1).to_le_bytes());
    NodeId(b)
}

/// Measures every directed node→node link of `bed`, one at a time (as an agent runs its
/// probes: concurrent probes from one node would share its uplink), with probes of `bytes`
/// bytes; then compares the rings (see [`compare_rings`]; `regions[k]` is node `k`'s
/// region, [`Topology::node_regions`](super::Topology::node_regions)). Each node answers with the
/// agent's own `serve` on a listener bound to its test-bed address; each probe is the
/// agent's `probe` on a connection opened from the sender's namespace. Must run on a tokio
/// runtime; the connects block the calling thread briefly.
pub async fn probe_links(
    bed: &Testbed,
    bytes: u64,
    regions: &[String],
) -> Result<ProbeReport, ProbeRunError> {
    let n = bed.nodes();
    if n < 2 {
        return Err(ProbeRunError::TooFewNodes(n));
    }
    if bytes == 0 || bytes > node_probe::MAX_PROBE_BYTES {
        return Err(ProbeRunError::BadSize(bytes));
    }
    let mut servers = Vec::with_capacity(n);
    let mut targets: Vec<SocketAddr> = Vec::with_capacity(n);
    for j in 0..n {
        let e = Endpoint::Node(j);
        let addr = bed.addr(e);
        let std_listener = in_namespace(bed.netns(e), || std::net::TcpListener::bind((addr, 0)))?
            .map_err(|e| TestbedError::Io {
            what: format!("binding the probe listener of n{j}"),
            source: e,
        })?;
        let io = |what: &str, e: std::io::Error| TestbedError::Io {
            what: format!("{what} (n{j})"),
            source: e,
        };
        targets.push(
            std_listener
                .local_addr()
                .map_err(|e| io("listener address", e))?,
        );
        std_listener
            .set_nonblocking(true)
            .map_err(|e| io("listener", e))?;
        let listener =
            tokio::net::TcpListener::from_std(std_listener).map_err(|e| io("listener", e))?;
        servers.push(AbortOnDrop(tokio::spawn(node_probe::serve(
            listener,
            probe_id(j),
        ))));
    }
    let mut links = Vec::with_capacity(n * (n - 1));
    for i in 0..n {
        for (j, &target) in targets.iter().enumerate() {
            let Some(configured) = bed.rate(i, j) else {
                continue;
            };
            let stream = in_namespace(bed.netns(Endpoint::Node(i)), || {
                std::net::TcpStream::connect_timeout(&target, Duration::from_secs(5))
            })?
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .and_then(tokio::net::TcpStream::from_std)
            .map_err(|e| ProbeRunError::Probe {
                from: i,
                to: j,
                source: ProbeError::Io(e),
            })?;
            let m = node_probe::probe(stream, probe_id(j), bytes)
                .await
                .map_err(|source| ProbeRunError::Probe {
                    from: i,
                    to: j,
                    source,
                })?;
            links.push(LinkProbe {
                from: i,
                to: j,
                configured_mbit: configured,
                measured_mbit: f64::from(m.mbps()),
                bytes: m.bytes,
                seconds: m.elapsed.as_secs_f64(),
            });
        }
    }
    drop(servers);
    let ring = compare_rings(&bed.plan().rates, &links, regions);
    Ok(summarize(bytes, links, ring))
}

fn summarize(probe_bytes: u64, links: Vec<LinkProbe>, ring: RingComparison) -> ProbeReport {
    let count = links.len().max(1) as f64;
    let abs: Vec<f64> = links.iter().map(|l| l.relative_error().abs()).collect();
    let gabs: Vec<f64> = links.iter().map(|l| l.goodput_error().abs()).collect();
    ProbeReport {
        probe_bytes,
        mean_abs_error: abs.iter().sum::<f64>() / count,
        max_abs_error: abs.iter().copied().fold(0.0, f64::max),
        mean_abs_goodput_error: gabs.iter().sum::<f64>() / count,
        max_abs_goodput_error: gabs.iter().copied().fold(0.0, f64::max),
        links,
        ring,
    }
}

/// The matrix of `rates` (Mbit/s, `None` = no link) as the ring code takes it.
pub fn matrix_of(rates: &[Vec<Option<f64>>]) -> BandwidthMatrix {
    BandwidthMatrix::from_fn(rates.len(), |i, j| {
        rates
            .get(i)
            .and_then(|r| r.get(j))
            .copied()
            .flatten()
            .unwrap_or(0.0) as f32
    })
}

/// Builds the ring with the project's default builder on the measured matrix (from
/// `links`; a link not measured counts as 0 Mbit/s) and on the configured `rates`, and
/// evaluates the measured ring's bottleneck on the configured matrix against the best one
/// (the builder's, or the exact optimum when there are at most `EXACT_MAX_NODES` nodes).
/// `regions[k]` is node `k`'s region label.
pub fn compare_rings(
    rates: &[Vec<Option<f64>>],
    links: &[LinkProbe],
    regions: &[String],
) -> RingComparison {
    let n = rates.len();
    let truth = matrix_of(rates);
    let mut measured = vec![vec![None; n]; n];
    for l in links {
        if l.from < n && l.to < n && l.from != l.to {
            measured[l.from][l.to] = Some(l.measured_mbit);
        }
    }
    let measured = matrix_of(&measured);
    let builder = default_builder();
    let measured_ring = builder.build(&measured, regions);
    let true_ring = builder.build(&truth, regions);
    let finite = |x: f32| if x.is_finite() { f64::from(x) } else { 0.0 };
    let measured_ring_on_true_mbit = finite(bottleneck(&truth, &measured_ring));
    let true_ring_on_true_mbit = finite(bottleneck(&truth, &true_ring));
    let exact_on_true_mbit = (n <= EXACT_MAX_NODES)
        .then(|| exact_max_bottleneck(&truth))
        .flatten()
        .map(|(b, _)| finite(b));
    let best = exact_on_true_mbit
        .unwrap_or(0.0)
        .max(true_ring_on_true_mbit);
    RingComparison {
        builder: builder.name().to_string(),
        measured_ring_on_measured_mbit: finite(bottleneck(&measured, &measured_ring)),
        measured_ring,
        measured_ring_on_true_mbit,
        true_ring,
        true_ring_on_true_mbit,
        exact_on_true_mbit,
        ratio: if best > 0.0 {
            measured_ring_on_true_mbit / best
        } else {
            f64::NAN
        },
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
