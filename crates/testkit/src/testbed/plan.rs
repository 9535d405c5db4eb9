//! The pure half of the test bed: a [`Topology`] and the [`Plan`] it turns into (rates,
//! addresses, names and the exact `ip`/`tc` commands), with no side effect, so it is tested
//! without root.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// The most nodes a test bed holds: node `k` is `10.77.0.(k + 2)`.
pub const MAX_NODES: usize = 253;

/// The longest Linux interface name, bytes (`IFNAMSIZ` − 1).
pub const MAX_IFNAME: usize = 15;

/// The first three octets of every address of a test bed (its subnet is `10.77.0.0/16`;
/// only `10.77.0.1` to `10.77.0.254` are used).
pub const SUBNET_PREFIX: [u8; 3] = [10, 77, 0];

/// The prefix length of the addresses assigned.
pub const PREFIX_LEN: u8 = 16;

/// The family prefix of every namespace and interface name a test bed creates.
pub const NAME_FAMILY: &str = "hzb";

/// A region: a group of nodes with one rate among themselves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// Its name (unique in the topology).
    pub name: String,
    /// How many nodes it has.
    pub nodes: usize,
    /// The rate from any of its nodes to another of its nodes, Mbit/s.
    pub intra_mbit: f64,
    /// Each node's uplink, Mbit/s, before its [`UplinkFactor`] (default: `intra_mbit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink_mbit: Option<f64>,
}

/// The rate from every node of one region to every node of another, Mbit/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionLink {
    /// The sending region.
    pub from: String,
    /// The receiving region.
    pub to: String,
    /// The rate, Mbit/s. When only one direction of a pair is given, the other has the
    /// same rate; give both for an asymmetric pair.
    pub mbit: f64,
}

/// Scales one node's uplink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UplinkFactor {
    /// The node's index (0-based, nodes numbered region by region in order).
    pub node: usize,
    /// The factor (> 0) applied to its region's uplink.
    pub factor: f64,
}

/// Where the orchestrator sits. It always has its own namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrchestratorPlacement {
    /// Its region. With one, traffic between it and a node is shaped by the region pair's
    /// rate (and a node's uplink); without one, its own egress is unshaped and a node's
    /// traffic to it is shaped at the node's uplink only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// A test bed's topology (loadable from TOML, see `config/testbed.example.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The regions; nodes are numbered region by region, in this order, from 0.
    pub regions: Vec<Region>,
    /// The rates between regions (ordered pairs).
    #[serde(default)]
    pub links: Vec<RegionLink>,
    /// Per-node uplink factors (nodes not listed have 1).
    #[serde(default)]
    pub uplinks: Vec<UplinkFactor>,
    /// The orchestrator's placement.
    #[serde(default)]
    pub orchestrator: OrchestratorPlacement,
}

/// Why a topology is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    /// The TOML text does not parse as a topology.
    #[error("topology TOML: {0}")]
    Toml(String),
    /// The topology is inconsistent.
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// An effective rate (a region's, a link's, or a node's uplink × its factor) is outside
    /// `MIN_MBIT..=MAX_MBIT` ([`MIN_MBIT`], [`MAX_MBIT`]), so `tc` would get `0Mbit` or an
    /// absurd value; found at validation, not at setup.
    #[error("invalid topology: {field}: rate {mbit} Mbit/s is not in [0.001, 1e6]")]
    Rate {
        /// The field, e.g. `region a`, `link a -> b`, `node 3 uplink`.
        field: String,
        /// The rate, Mbit/s.
        mbit: f64,
    },
}

/// The lowest rate accepted, Mbit/s (1 kbit/s: the resolution `tc` is given).
pub const MIN_MBIT: f64 = 0.001;

/// The highest rate accepted, Mbit/s (1 Tbit/s).
pub const MAX_MBIT: f64 = 1_000_000.0;

fn invalid(msg: impl Into<String>) -> TopologyError {
    TopologyError::Invalid(msg.into())
}

fn check_rate(what: &str, mbit: f64) -> Result<(), TopologyError> {
    if mbit.is_finite() && (MIN_MBIT..=MAX_MBIT).contains(&mbit) {
        Ok(())
    } else {
        Err(TopologyError::Rate {
            field: what.to_string(),
            mbit,
        })
    }
}

impl Topology {
    /// Parses and validates a topology from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Topology, TopologyError> {
        let t: Topology = toml::from_str(text).map_err(|e| TopologyError::Toml(e.to_string()))?;
        t.validate()?;
        Ok(t)
    }

    /// The number of nodes.
    pub fn node_count(&self) -> usize {
        self.regions.iter().map(|r| r.nodes).sum()
    }

    /// Node `k`'s region index.
    pub fn region_of(&self, node: usize) -> Option<usize> {
        let mut first = 0;
        for (r, region) in self.regions.iter().enumerate() {
            if node < first + region.nodes {
                return Some(r);
            }
            first += region.nodes;
        }
        None
    }

    /// Each node's region name, node by node (empty for a node out of range: none is, on
    /// a validated topology).
    pub fn node_regions(&self) -> Vec<String> {
        (0..self.node_count())
            .map(|k| {
                self.region_of(k)
                    .map(|r| self.regions[r].name.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    fn region_index(&self, name: &str) -> Option<usize> {
        self.regions.iter().position(|r| r.name == name)
    }

    /// Checks names, counts and rates, and that every pair of regions has a rate.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.regions.is_empty() {
            return Err(invalid("no regions"));
        }
        let mut names = BTreeSet::new();
        for r in &self.regions {
            if r.name.is_empty() || !names.insert(r.name.as_str()) {
                return Err(invalid(format!(
                    "region name {:?} empty or repeated",
                    r.name
                )));
            }
            check_rate(&format!("region {}", r.name), r.intra_mbit)?;
            if let Some(u) = r.uplink_mbit {
                check_rate(&format!("region {} uplink", r.name), u)?;
            }
        }
        let n = self.node_count();
        if n == 0 || n > MAX_NODES {
            return Err(invalid(format!("{n} nodes: 1 to {MAX_NODES} allowed")));
        }
        let mut pairs = BTreeSet::new();
        for l in &self.links {
            let (Some(a), Some(b)) = (self.region_index(&l.from), self.region_index(&l.to)) else {
                return Err(invalid(format!(
                    "link {} -> {}: unknown region",
                    l.from, l.to
                )));
            };
            if a == b {
                return Err(invalid(format!(
                    "link {} -> {}: use the region's intra_mbit",
                    l.from, l.to
                )));
            }
            if !pairs.insert((a, b)) {
                return Err(invalid(format!("link {} -> {} given twice", l.from, l.to)));
            }
            check_rate(&format!("link {} -> {}", l.from, l.to), l.mbit)?;
        }
        for a in 0..self.regions.len() {
            for b in 0..self.regions.len() {
                if a != b && !pairs.contains(&(a, b)) && !pairs.contains(&(b, a)) {
                    return Err(invalid(format!(
                        "no rate between regions {} and {}",
                        self.regions[a].name, self.regions[b].name
                    )));
                }
            }
        }
        let mut seen = BTreeSet::new();
        for u in &self.uplinks {
            if u.node >= n || !seen.insert(u.node) {
                return Err(invalid(format!(
                    "uplink factor for node {}: no such node or given twice",
                    u.node
                )));
            }
            if !(u.factor.is_finite() && u.factor > 0.0) {
                return Err(invalid(format!(
                    "uplink factor {} for node {} is not > 0",
                    u.factor, u.node
                )));
            }
        }
        // The effective uplinks (region uplink × factor): a factor may push one out of range.
        for k in 0..n {
            check_rate(&format!("node {k} uplink"), self.uplink(k))?;
        }
        if let Some(r) = &self.orchestrator.region {
            if self.region_index(r).is_none() {
                return Err(invalid(format!("orchestrator region {r:?} unknown")));
            }
        }
        Ok(())
    }

    /// The rate from region `a` to region `b`, Mbit/s (`a == b`: the intra-region rate).
    /// Only meaningful on a validated topology.
    pub fn region_rate(&self, a: usize, b: usize) -> f64 {
        if a == b {
            return self.regions[a].intra_mbit;
        }
        let find = |x: usize, y: usize| {
            self.links
                .iter()
                .find(|l| l.from == self.regions[x].name && l.to == self.regions[y].name)
                .map(|l| l.mbit)
        };
        find(a, b).or_else(|| find(b, a)).unwrap_or(f64::INFINITY)
    }

    /// Node `k`'s uplink, Mbit/s: its region's uplink (default its intra-region rate) times
    /// its factor.
    pub fn uplink(&self, node: usize) -> f64 {
        let Some(r) = self.region_of(node) else {
            return 0.0;
        };
        let region = &self.regions[r];
        let factor = self
            .uplinks
            .iter()
            .find(|u| u.node == node)
            .map_or(1.0, |u| u.factor);
        region.uplink_mbit.unwrap_or(region.intra_mbit) * factor
    }

    /// The per-directed-link rate matrix, Mbit/s: `m[i][j]` for node `i` → node `j` is
    /// `min(region-pair rate, uplink of i)`; the diagonal is `None`.
    pub fn rate_matrix(&self) -> Vec<Vec<Option<f64>>> {
        let n = self.node_count();
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| (i != j).then(|| self.node_rate(i, j)))
                    .collect()
            })
            .collect()
    }

    fn node_rate(&self, i: usize, j: usize) -> f64 {
        let (ri, rj) = (
            self.region_of(i).unwrap_or(0),
            self.region_of(j).unwrap_or(0),
        );
        self.region_rate(ri, rj).min(self.uplink(i))
    }

    fn orchestrator_region(&self) -> Option<usize> {
        self.orchestrator
            .region
            .as_deref()
            .and_then(|r| self.region_index(r))
    }
}

/// One end of the test bed: a node or the orchestrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// Node `k` (0-based).
    Node(usize),
    /// The orchestrator.
    Orchestrator,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Node(k) => write!(f, "n{k}"),
            Endpoint::Orchestrator => f.write_str("orch"),
        }
    }
}

/// The last octet of an endpoint's address: 1 for the orchestrator, `k + 2` for node `k`.
pub fn host_octet(e: Endpoint) -> u8 {
    match e {
        Endpoint::Orchestrator => 1,
        Endpoint::Node(k) => u8::try_from(k + 2).unwrap_or(u8::MAX),
    }
}

/// An endpoint's address: `10.77.0.1` for the orchestrator, `10.77.0.(k + 2)` for node `k`.
pub fn address(e: Endpoint) -> Ipv4Addr {
    let [a, b, c] = SUBNET_PREFIX;
    Ipv4Addr::new(a, b, c, host_octet(e))
}

/// The per-run name prefix: `hzb` + the pid in 5 base-36 digits + one base-36 sequence
/// digit (9 bytes), so the longest name (`<prefix>p252`) is 13 bytes.
pub fn name_prefix(pid: u32, seq: u8) -> String {
    format!(
        "{NAME_FAMILY}{}{}",
        base36(u64::from(pid), 5),
        base36(u64::from(seq % 36), 1)
    )
}

fn base36(mut v: u64, width: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(v % 36) as usize];
        v /= 36;
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The pid and sequence digit a test bed name was made with, when `name` is exactly one of
/// the names [`Plan`] makes (`<prefix>h`, `<prefix>o`, `<prefix>br`, `<prefix>n<k>`,
/// `<prefix>p<k>`, `<prefix>po`); `None` for any other name.
pub fn parse_name(name: &str) -> Option<(u32, u8)> {
    let rest = name.strip_prefix(NAME_FAMILY)?;
    if rest.len() < 7 || !rest.is_ascii() {
        return None;
    }
    let (digits, suffix) = rest.split_at(6);
    let ok_suffix = matches!(suffix, "h" | "o" | "br" | "po")
        || suffix
            .strip_prefix('n')
            .or_else(|| suffix.strip_prefix('p'))
            .is_some_and(|k| {
                !k.is_empty() && k.len() <= 3 && k.bytes().all(|b| b.is_ascii_digit())
            });
    if !ok_suffix {
        return None;
    }
    let mut pid = 0u64;
    for c in digits[..5].chars() {
        pid = pid * 36 + u64::from(c.to_digit(36)?);
    }
    let seq = digits[5..].chars().next()?.to_digit(36)?;
    if digits.chars().any(|c| c.is_ascii_uppercase()) {
        return None;
    }
    Some((u32::try_from(pid).ok()?, u8::try_from(seq).ok()?))
}

/// One command with its argument vector (never passed through a shell).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    /// The program (`ip` or `tc`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Cmd {
    fn new(program: &str, args: &[&str]) -> Cmd {
        Cmd {
            program: program.into(),
            args: args.iter().map(|a| (*a).to_string()).collect(),
        }
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}

/// One endpoint's namespace, interface and egress rates.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointPlan {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// Its network namespace.
    pub netns: String,
    /// Its end of the veth pair (inside `netns`).
    pub dev: String,
    /// The hub's end of the pair (inside the hub namespace, on the bridge).
    pub hub_dev: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// Egress rate limits: (destination, Mbit/s). Destinations not listed are unshaped.
    pub egress: Vec<(Endpoint, f64)>,
    /// The node's uplink, Mbit/s, shared by all its shaped destinations (an htb parent
    /// class, [`UPLINK_CLASS`]); `None` for the orchestrator (each destination capped on its
    /// own).
    pub uplink: Option<f64>,
}

/// Everything a test bed does, computed from a topology and a name prefix.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The name prefix (see [`name_prefix`]).
    pub prefix: String,
    /// The hub namespace, holding the bridge.
    pub hub_netns: String,
    /// The bridge's name (in the hub namespace).
    pub bridge: String,
    /// The nodes, in order, then the orchestrator last.
    pub endpoints: Vec<EndpointPlan>,
    /// Node `i` → node `j`, Mbit/s (see [`Topology::rate_matrix`]).
    pub rates: Vec<Vec<Option<f64>>>,
}

/// The htb burst for a rate, bytes: 10 ms at the rate, at least 16 KiB (so one 64 KiB GSO
/// segment at low rates costs a short debt, not a stall).
pub fn burst_bytes(mbit: f64) -> u64 {
    let per_10ms = (mbit * 1e6 / 8.0 / 100.0).ceil() as u64;
    per_10ms.max(16 * 1024)
}

/// The htb class id of traffic to `dest` (`1:<host octet in hex>`).
pub fn class_id(dest: Endpoint) -> String {
    format!("1:{:x}", host_octet(dest))
}

/// The htb class id of a node's uplink, the parent of its per-destination classes
/// (`1:100`: above every host octet, so never a destination's class; `1:1` is the
/// orchestrator's).
pub const UPLINK_CLASS: &str = "1:100";

/// A rate for `tc` in whole bit/s (at least 8), for guaranteed rates that may be tiny.
fn fmt_bit(mbit: f64) -> String {
    format!("{}bit", ((mbit * 1e6).floor() as u64).max(8))
}

fn fmt_mbit(mbit: f64) -> String {
    // Enough precision for tc, no float noise: 12.5 → "12.5", 100 → "100".
    let rounded = (mbit * 1000.0).round() / 1000.0;
    format!("{rounded}Mbit")
}

impl Plan {
    /// The plan of `topology` under `prefix` (validates the topology).
    pub fn new(topology: &Topology, prefix: &str) -> Result<Plan, TopologyError> {
        topology.validate()?;
        let n = topology.node_count();
        let rates = topology.rate_matrix();
        let orch_region = topology.orchestrator_region();
        let mut endpoints = Vec::with_capacity(n + 1);
        for (i, row) in rates.iter().enumerate() {
            let mut egress: Vec<(Endpoint, f64)> = row
                .iter()
                .enumerate()
                .filter_map(|(j, r)| r.map(|r| (Endpoint::Node(j), r)))
                .collect();
            let to_orch = match orch_region {
                Some(o) => topology
                    .region_rate(topology.region_of(i).unwrap_or(0), o)
                    .min(topology.uplink(i)),
                None => topology.uplink(i),
            };
            egress.push((Endpoint::Orchestrator, to_orch));
            endpoints.push(EndpointPlan {
                endpoint: Endpoint::Node(i),
                netns: format!("{prefix}n{i}"),
                dev: format!("{prefix}n{i}"),
                hub_dev: format!("{prefix}p{i}"),
                addr: address(Endpoint::Node(i)),
                egress,
                uplink: Some(topology.uplink(i)),
            });
        }
        let orch_egress = match orch_region {
            Some(o) => (0..n)
                .map(|j| {
                    let rj = topology.region_of(j).unwrap_or(0);
                    (Endpoint::Node(j), topology.region_rate(o, rj))
                })
                .collect(),
            None => vec![],
        };
        endpoints.push(EndpointPlan {
            endpoint: Endpoint::Orchestrator,
            netns: format!("{prefix}o"),
            dev: format!("{prefix}o"),
            hub_dev: format!("{prefix}po"),
            addr: address(Endpoint::Orchestrator),
            egress: orch_egress,
            uplink: None,
        });
        Ok(Plan {
            prefix: prefix.to_string(),
            hub_netns: format!("{prefix}h"),
            bridge: format!("{prefix}br"),
            endpoints,
            rates,
        })
    }

    /// The plan of an endpoint.
    pub fn endpoint(&self, e: Endpoint) -> Option<&EndpointPlan> {
        self.endpoints.iter().find(|p| p.endpoint == e)
    }

    /// Every namespace the plan creates: the hub first, then nodes, then the orchestrator.
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.hub_netns.clone())
            .chain(self.endpoints.iter().map(|e| e.netns.clone()))
            .collect()
    }

    /// Every interface name the plan creates (each in its own namespace).
    pub fn interfaces(&self) -> Vec<String> {
        std::iter::once(self.bridge.clone())
            .chain(
                self.endpoints
                    .iter()
                    .flat_map(|e| [e.dev.clone(), e.hub_dev.clone()]),
            )
            .collect()
    }

    /// The commands that create the bed, in order: namespaces, the bridge, one veth pair
    /// per endpoint (created in the hub namespace, its far end moved straight into the
    /// endpoint's namespace: nothing is created in the caller's namespace), addresses, and
    /// per endpoint an htb root qdisc on its veth with one class and one u32 filter per
    /// shaped destination. Unclassified traffic (ARP, unshaped destinations) goes straight
    /// out, unshaped.
    ///
    /// A node's per-destination classes hang under one parent class ([`UPLINK_CLASS`],
    /// rate = ceil = its uplink), so traffic to several peers at once shares the uplink.
    /// Each child has ceil = its pair rate (≤ the uplink) and a guaranteed rate of
    /// uplink / (number of destinations), capped at the ceil: htb lets a class under its
    /// guaranteed rate send without asking its parent, so guarantees summing past the
    /// uplink would let the node exceed it; above its guarantee a child borrows from the
    /// parent, up to its ceil. A single active link thus still gets its full pair rate.
    /// The orchestrator has no uplink: its classes (rate = ceil) sit under the root.
    pub fn setup_commands(&self) -> Vec<Cmd> {
        let hub = self.hub_netns.as_str();
        let mut cmds = vec![];
        for ns in self.namespaces() {
            cmds.push(Cmd::new("ip", &["netns", "add", &ns]));
        }
        cmds.push(Cmd::new("ip", &["-n", hub, "link", "set", "lo", "up"]));
        cmds.push(Cmd::new(
            "ip",
            &[
                "-n",
                hub,
                "link",
                "add",
                "name",
                &self.bridge,
                "type",
                "bridge",
            ],
        ));
        cmds.push(Cmd::new(
            "ip",
            &["-n", hub, "link", "set", &self.bridge, "up"],
        ));
        for e in &self.endpoints {
            let ns = e.netns.as_str();
            let addr = format!("{}/{PREFIX_LEN}", e.addr);
            cmds.push(Cmd::new(
                "ip",
                &[
                    "-n", hub, "link", "add", "name", &e.hub_dev, "type", "veth", "peer", "name",
                    &e.dev, "netns", ns,
                ],
            ));
            cmds.push(Cmd::new(
                "ip",
                &["-n", hub, "link", "set", &e.hub_dev, "master", &self.bridge],
            ));
            cmds.push(Cmd::new(
                "ip",
                &["-n", hub, "link", "set", &e.hub_dev, "up"],
            ));
            cmds.push(Cmd::new("ip", &["-n", ns, "link", "set", "lo", "up"]));
            cmds.push(Cmd::new(
                "ip",
                &["-n", ns, "addr", "add", &addr, "dev", &e.dev],
            ));
            cmds.push(Cmd::new("ip", &["-n", ns, "link", "set", &e.dev, "up"]));
            if e.egress.is_empty() {
                continue;
            }
            cmds.push(Cmd::new(
                "tc",
                &[
                    "-n", ns, "qdisc", "add", "dev", &e.dev, "root", "handle", "1:", "htb",
                ],
            ));
            let parent = match e.uplink {
                Some(up) => {
                    let rate = fmt_mbit(up);
                    let burst = burst_bytes(up).to_string();
                    cmds.push(Cmd::new(
                        "tc",
                        &[
                            "-n",
                            ns,
                            "class",
                            "add",
                            "dev",
                            &e.dev,
                            "parent",
                            "1:",
                            "classid",
                            UPLINK_CLASS,
                            "htb",
                            "rate",
                            &rate,
                            "ceil",
                            &rate,
                            "burst",
                            &burst,
                            "cburst",
                            &burst,
                        ],
                    ));
                    UPLINK_CLASS
                }
                None => "1:",
            };
            let shares = e.egress.len() as f64;
            for (dest, mbit) in &e.egress {
                let class = class_id(*dest);
                let ceil = fmt_mbit(*mbit);
                let rate = match e.uplink {
                    Some(up) => fmt_bit((up / shares).min(*mbit)),
                    None => ceil.clone(),
                };
                let burst = burst_bytes(*mbit).to_string();
                cmds.push(Cmd::new(
                    "tc",
                    &[
                        "-n", ns, "class", "add", "dev", &e.dev, "parent", parent, "classid",
                        &class, "htb", "rate", &rate, "ceil", &ceil, "burst", &burst, "cburst",
                        &burst,
                    ],
                ));
                let dst = format!("{}/32", address(*dest));
                cmds.push(Cmd::new(
                    "tc",
                    &[
                        "-n", ns, "filter", "add", "dev", &e.dev, "parent", "1:", "protocol", "ip",
                        "prio", "1", "u32", "match", "ip", "dst", &dst, "flowid", &class,
                    ],
                ));
            }
        }
        cmds
    }

    /// The commands that remove the bed: deleting its namespaces (endpoints first, the hub
    /// last) removes every interface, qdisc and address in them.
    pub fn teardown_commands(&self) -> Vec<Cmd> {
        let mut ns = self.namespaces();
        ns.rotate_left(1);
        ns.iter()
            .map(|n| Cmd::new("ip", &["netns", "del", n]))
            .collect()
    }
}
