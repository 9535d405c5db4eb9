//! In-memory implementations of every port: the embedded defaults (the main job runs with
//! no setup) and the test doubles. Each is safe to share between tasks; none is global, so
//! two orchestrators in one process never see each other's data.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{
    check_slash, ChainError, ChainReader, CheckpointError, CheckpointSink, Clock, Counter,
    DeltaReceipt, EpochInput, Histogram, LeaderLease, Lease, Ledger, LedgerError, LinkError,
    Metrics, NodeCommand, NodeLink, PublishedEpoch, RewardReceipt, SlashReceipt, Snapshot,
    StateStore, StoreError,
};
use crate::events::{Event, Record};
use crate::publication::{PublicationReceipt, SignedPublication};
use crate::types::{GymWei, JobId, NodeId, Timestamp};

/// A clock that follows tokio's clock: wall time at creation plus the tokio time elapsed
/// since. Under `tokio::time::pause()` it advances exactly as the runtime's timers do, so
/// watchdogs and timestamps agree in tests.
#[derive(Debug, Clone)]
pub struct TokioClock {
    base_ms: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock starting at the current wall time.
    pub fn new() -> Self {
        Self::starting_at(super::SystemClock.now())
    }

    /// A clock starting at `at` (useful for reproducible runs).
    pub fn starting_at(at: Timestamp) -> Self {
        TokioClock {
            base_ms: at.0,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.base_ms + self.start.elapsed().as_millis() as u64)
    }
}

/// The in-memory event log and leader lease. Its contents live as long as the value
/// (clone the `Arc` to share it between an orchestrator and its restarted successor in a
/// test); handles made by [`StateStore::fenced`] share them.
///
/// [`MemoryStateStore::set_available`] simulates an outage: while off, every call returns
/// [`StoreError::Unavailable`]. Lease expiry follows tokio's clock, so paused-time tests
/// can expire a lease without sleeping.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    inner: Arc<MemoryLog>,
    fence: Option<u64>,
}

#[derive(Debug)]
struct MemoryLog {
    log: Mutex<Vec<Record>>,
    /// Event ids of [`StateStore::append_once`] → their sequence numbers.
    ids: Mutex<HashMap<u128, u64>>,
    snapshots: Mutex<HashMap<String, Snapshot>>,
    unavailable: AtomicBool,
    log_id: [u8; 16],
    /// The live lease, with its expiry, and the last token granted. Writes check the token
    /// under this lock, so a grant and a fenced write are ordered.
    lease: Mutex<LeaseBook>,
}

#[derive(Debug, Default)]
struct LeaseBook {
    held: Option<(Lease, tokio::time::Instant)>,
    token: u64,
}

impl Default for MemoryLog {
    fn default() -> Self {
        MemoryLog {
            log: Mutex::default(),
            ids: Mutex::default(),
            snapshots: Mutex::default(),
            unavailable: AtomicBool::new(false),
            log_id: rand::random(),
            lease: Mutex::default(),
        }
    }
}

fn unpoison<T>(
    r: std::sync::LockResult<std::sync::MutexGuard<'_, T>>,
) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave a half-written value; recover.
    r.unwrap_or_else(|p| p.into_inner())
}

impl MemoryStateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Turns the simulated outage off (`true`) or on (`false`).
    pub fn set_available(&self, available: bool) {
        self.inner.unavailable.store(!available, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.inner.unavailable.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable {
                message: "simulated outage".into(),
            })
        } else {
            Ok(())
        }
    }

    /// Runs `write` if this handle may write (unfenced, or its token is the newest),
    /// holding the lease lock so no grant interleaves.
    fn write<T>(&self, write: impl FnOnce() -> T) -> Result<T, StoreError> {
        self.check()?;
        let book = unpoison(self.inner.lease.lock());
        if let Some(token) = self.fence {
            if token != book.token {
                return Err(StoreError::Fenced {
                    token,
                    current: book.token,
                });
            }
        }
        Ok(write())
    }

    fn push(&self, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        self.write(|| {
            let mut log = unpoison(self.inner.log.lock());
            let seq = log.len() as u64 + 1;
            log.push(Record { seq, at, event });
            seq
        })
    }

    fn lease_book(&self) -> std::sync::MutexGuard<'_, LeaseBook> {
        let mut book = unpoison(self.inner.lease.lock());
        if book
            .held
            .as_ref()
            .is_some_and(|(_, until)| *until <= tokio::time::Instant::now())
        {
            book.held = None;
        }
        book
    }
}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn append(&self, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        self.push(at, event)
    }

    async fn append_once(&self, id: u128, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        self.check()?;
        let mut ids = unpoison(self.inner.ids.lock());
        if let Some(seq) = ids.get(&id) {
            return Ok(*seq);
        }
        let seq = self.push(at, event)?;
        ids.insert(id, seq);
        Ok(seq)
    }

    async fn read_after(&self, after: u64) -> Result<Vec<Record>, StoreError> {
        self.check()?;
        let log = unpoison(self.inner.log.lock());
        let start = (after as usize).min(log.len());
        Ok(log[start..].to_vec())
    }

    async fn last_seq(&self) -> Result<u64, StoreError> {
        self.check()?;
        Ok(unpoison(self.inner.log.lock()).len() as u64)
    }

    async fn put_snapshot(&self, key: &str, snapshot: Snapshot) -> Result<(), StoreError> {
        self.write(|| {
            let mut snaps = unpoison(self.inner.snapshots.lock());
            if snaps.get(key).is_none_or(|old| old.seq <= snapshot.seq) {
                snaps.insert(key.to_string(), snapshot);
            }
        })
    }

    async fn get_snapshot(&self, key: &str) -> Result<Option<Snapshot>, StoreError> {
        self.check()?;
        Ok(unpoison(self.inner.snapshots.lock()).get(key).cloned())
    }

    async fn log_id(&self) -> Result<[u8; 16], StoreError> {
        self.check()?;
        Ok(self.inner.log_id)
    }

    fn fenced(&self, token: u64) -> Arc<dyn StateStore> {
        Arc::new(MemoryStateStore {
            inner: self.inner.clone(),
            fence: Some(token),
        })
    }
}

#[async_trait]
impl LeaderLease for MemoryStateStore {
    async fn campaign(
        &self,
        holder: &str,
        endpoint: &str,
        ttl_ms: u64,
    ) -> Result<Option<Lease>, StoreError> {
        self.check()?;
        let mut book = self.lease_book();
        let until = tokio::time::Instant::now() + std::time::Duration::from_millis(ttl_ms);
        match &mut book.held {
            Some((lease, expiry)) if lease.holder == holder => {
                *expiry = until;
                Ok(Some(lease.clone()))
            }
            Some(_) => Ok(None),
            None => {
                book.token += 1;
                let lease = Lease {
                    holder: holder.to_string(),
                    token: book.token,
                    endpoint: endpoint.to_string(),
                };
                book.held = Some((lease.clone(), until));
                Ok(Some(lease))
            }
        }
    }

    async fn renew(&self, lease: &Lease, ttl_ms: u64) -> Result<bool, StoreError> {
        self.check()?;
        let mut book = self.lease_book();
        let until = tokio::time::Instant::now() + std::time::Duration::from_millis(ttl_ms);
        if book.token != lease.token {
            return Ok(false);
        }
        match &mut book.held {
            Some((held, expiry)) if held == lease => {
                *expiry = until;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => {
                book.held = Some((lease.clone(), until));
                Ok(true)
            }
        }
    }

    async fn resign(&self, lease: &Lease) -> Result<(), StoreError> {
        self.check()?;
        let mut book = self.lease_book();
        if book.held.as_ref().is_some_and(|(held, _)| held == lease) {
            book.held = None;
        }
        Ok(())
    }

    async fn leader(&self) -> Result<Option<Lease>, StoreError> {
        self.check()?;
        Ok(self.lease_book().held.as_ref().map(|(l, _)| l.clone()))
    }
}

/// The default penalty window of [`MemoryChain`]: 24 h, in milliseconds.
pub const DEFAULT_PENALTY_WINDOW_MS: u64 = 86_400_000;

/// The orchestrator's own stake on a fresh [`MemoryChain`]: 50,000 GYM in GYM wei, the
/// minimum to lead (paper §1.1).
pub const ORCHESTRATOR_GENESIS_STAKE: GymWei = GymWei(50_000 * 1_000_000_000_000_000_000);

/// The in-process ledger: stakes and penalties set by config (genesis) or tests (the
/// [`ChainReader`] side), and epoch rewards and slashing (the [`Ledger`] side), with the
/// contracts' semantics (DESIGN §8).
///
/// A node without an entry is unbound ([`ChainError::Unbound`]) unless a default stake is set.
/// Slashing sets a penalty until the ledger clock's now + the penalty window (defaults:
/// [`super::SystemClock`], [`DEFAULT_PENALTY_WINDOW_MS`]; see [`MemoryChain::with_clock`]
/// and [`MemoryChain::with_penalty_window_ms`]).
#[derive(Debug)]
pub struct MemoryChain {
    stakes: RwLock<HashMap<NodeId, GymWei>>,
    penalties: RwLock<HashMap<NodeId, Timestamp>>,
    default_stake: Option<GymWei>,
    ledger: RwLock<LedgerBook>,
    clock: Arc<dyn Clock>,
    penalty_window_ms: u64,
    orchestrator_stake: GymWei,
}

/// The write side's records. Lock order when several are held: `ledger`, then `stakes`,
/// then `penalties`.
#[derive(Debug, Default)]
struct LedgerBook {
    /// Rewards received per node, in GYM wei.
    balances: HashMap<NodeId, GymWei>,
    /// Index into `batches` per paid (job, epoch).
    paid_epochs: HashMap<(JobId, u32), usize>,
    /// Reward batches in payment order.
    batches: Vec<RewardReceipt>,
    /// Index into `slashes` per evidence hash.
    evidence: HashMap<[u8; 32], usize>,
    /// Slashes in application order.
    slashes: Vec<SlashReceipt>,
    /// Index into `publications` per recorded (job, epoch).
    published: HashMap<(JobId, u32), usize>,
    /// Publications in recording order.
    publications: Vec<SignedPublication>,
}

impl Default for MemoryChain {
    fn default() -> Self {
        MemoryChain {
            stakes: RwLock::default(),
            penalties: RwLock::default(),
            default_stake: None,
            ledger: RwLock::default(),
            clock: Arc::new(super::SystemClock),
            penalty_window_ms: DEFAULT_PENALTY_WINDOW_MS,
            orchestrator_stake: ORCHESTRATOR_GENESIS_STAKE,
        }
    }
}

impl MemoryChain {
    /// A ledger where every node is unbound until given a stake.
    pub fn new() -> Self {
        Self::default()
    }

    /// A ledger where any node without an explicit entry has `stake` (development setups).
    pub fn with_default_stake(stake: GymWei) -> Self {
        MemoryChain {
            default_stake: Some(stake),
            ..Self::default()
        }
    }

    /// Uses `clock` to time slashing penalties (default: [`super::SystemClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets how long a slash's penalty lasts, in milliseconds (default
    /// [`DEFAULT_PENALTY_WINDOW_MS`], 24 h).
    pub fn with_penalty_window_ms(mut self, window_ms: u64) -> Self {
        self.penalty_window_ms = window_ms;
        self
    }

    /// Sets the orchestrator's own stake (default [`ORCHESTRATOR_GENESIS_STAKE`]).
    pub fn with_orchestrator_stake(mut self, stake: GymWei) -> Self {
        self.orchestrator_stake = stake;
        self
    }

    /// The penalty window, in milliseconds.
    pub fn penalty_window_ms(&self) -> u64 {
        self.penalty_window_ms
    }

    /// Sets `node`'s stake.
    pub fn set_stake(&self, node: NodeId, stake: GymWei) {
        self.stakes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, stake);
    }

    /// Sets (or with `None` clears) `node`'s active penalty.
    pub fn set_penalty(&self, node: NodeId, until: Option<Timestamp>) {
        let mut p = self.penalties.write().unwrap_or_else(|p| p.into_inner());
        match until {
            Some(t) => p.insert(node, t),
            None => p.remove(&node),
        };
    }

    fn is_bound(&self, stakes: &HashMap<NodeId, GymWei>, node: &NodeId) -> bool {
        self.default_stake.is_some() || stakes.contains_key(node)
    }
}

/// `stake × pct / 100` rounded down, without overflow (`pct` ≤ 100).
fn pct_of(stake: u128, pct: u8) -> u128 {
    let pct = u128::from(pct);
    // stake = 100q + r  ⇒  stake·pct/100 = q·pct + r·pct/100, and q·pct ≤ stake.
    (stake / 100) * pct + (stake % 100) * pct / 100
}

#[async_trait]
impl ChainReader for MemoryChain {
    async fn stake_of(&self, node: &NodeId) -> Result<GymWei, ChainError> {
        let stakes = self.stakes.read().unwrap_or_else(|p| p.into_inner());
        stakes
            .get(node)
            .copied()
            .or(self.default_stake)
            .ok_or(ChainError::Unbound(*node))
    }

    async fn penalty_until(&self, node: &NodeId) -> Result<Option<Timestamp>, ChainError> {
        Ok(self
            .penalties
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .copied())
    }

    async fn orchestrator_stake(&self) -> Result<GymWei, ChainError> {
        Ok(self.orchestrator_stake)
    }
}

#[async_trait]
impl Ledger for MemoryChain {
    async fn distribute_epoch_rewards(
        &self,
        job: JobId,
        epoch: u32,
        rewards: &[(NodeId, GymWei)],
    ) -> Result<RewardReceipt, LedgerError> {
        let mut book = self.ledger.write().unwrap_or_else(|p| p.into_inner());
        if let Some(&i) = book.paid_epochs.get(&(job, epoch)) {
            if let Some(first) = book.batches.get(i) {
                return Ok(RewardReceipt {
                    duplicate: true,
                    ..first.clone()
                });
            }
        }
        // Check everything before writing anything: the batch is all or nothing.
        {
            let stakes = self.stakes.read().unwrap_or_else(|p| p.into_inner());
            if let Some((node, _)) = rewards.iter().find(|(n, _)| !self.is_bound(&stakes, n)) {
                return Err(ChainError::Unbound(*node).into());
            }
        }
        let mut total: u128 = 0;
        let mut after: HashMap<NodeId, u128> = HashMap::new();
        for (node, amount) in rewards {
            let overflow =
                || LedgerError::Invalid(super::InvalidRequest::RewardOverflow { node: *node });
            total = total.checked_add(amount.0).ok_or_else(overflow)?;
            let held = match after.get(node) {
                Some(&b) => b,
                None => book.balances.get(node).map_or(0, |b| b.0),
            };
            after.insert(*node, held.checked_add(amount.0).ok_or_else(overflow)?);
        }
        for (node, balance) in after {
            book.balances.insert(node, GymWei(balance));
        }
        let receipt = RewardReceipt {
            job,
            epoch,
            total: GymWei(total),
            paid: rewards.to_vec(),
            duplicate: false,
        };
        let i = book.batches.len();
        book.batches.push(receipt.clone());
        book.paid_epochs.insert((job, epoch), i);
        Ok(receipt)
    }

    async fn slash(
        &self,
        node: &NodeId,
        pct: u8,
        evidence: &[u8],
    ) -> Result<SlashReceipt, LedgerError> {
        check_slash(pct, evidence)?;
        let evidence_hash: [u8; 32] = Sha256::digest(evidence).into();
        let mut book = self.ledger.write().unwrap_or_else(|p| p.into_inner());
        if let Some(&i) = book.evidence.get(&evidence_hash) {
            if let Some(first) = book.slashes.get(i) {
                return Ok(SlashReceipt {
                    duplicate: true,
                    ..first.clone()
                });
            }
        }
        let (slashed, stake_after) = {
            let mut stakes = self.stakes.write().unwrap_or_else(|p| p.into_inner());
            let stake = stakes
                .get(node)
                .copied()
                .or(self.default_stake)
                .ok_or(ChainError::Unbound(*node))?;
            let slashed = pct_of(stake.0, pct);
            let after = GymWei(stake.0 - slashed);
            // A node on the default stake gets an explicit entry with what is left.
            stakes.insert(*node, after);
            (GymWei(slashed), after)
        };
        let penalty_until = {
            let mut penalties = self.penalties.write().unwrap_or_else(|p| p.into_inner());
            let new = self.clock.now().plus_ms(self.penalty_window_ms);
            let until = penalties.get(node).map_or(new, |&old| old.max(new));
            penalties.insert(*node, until);
            until
        };
        let receipt = SlashReceipt {
            node: *node,
            pct,
            slashed,
            stake_after,
            evidence_hash,
            penalty_until,
            duplicate: false,
        };
        let i = book.slashes.len();
        book.slashes.push(receipt.clone());
        book.evidence.insert(evidence_hash, i);
        Ok(receipt)
    }

    async fn balance_of(&self, node: &NodeId) -> Result<GymWei, LedgerError> {
        if let Some(b) = self
            .ledger
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .balances
            .get(node)
        {
            return Ok(*b);
        }
        let stakes = self.stakes.read().unwrap_or_else(|p| p.into_inner());
        if self.is_bound(&stakes, node) {
            Ok(GymWei(0))
        } else {
            Err(ChainError::Unbound(*node).into())
        }
    }

    async fn slashes(&self) -> Result<Vec<SlashReceipt>, LedgerError> {
        Ok(self
            .ledger
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .slashes
            .clone())
    }

    async fn reward_batches(&self) -> Result<Vec<RewardReceipt>, LedgerError> {
        Ok(self
            .ledger
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .batches
            .clone())
    }

    async fn record_publication(
        &self,
        publication: &SignedPublication,
    ) -> Result<PublicationReceipt, LedgerError> {
        let mut book = self.ledger.write().unwrap_or_else(|p| p.into_inner());
        let key = (publication.record.job, publication.record.epoch);
        if let Some(first) = book
            .published
            .get(&key)
            .and_then(|&i| book.publications.get(i))
        {
            return Ok(PublicationReceipt {
                publication: first.clone(),
                duplicate: true,
            });
        }
        let i = book.publications.len();
        book.publications.push(publication.clone());
        book.published.insert(key, i);
        Ok(PublicationReceipt {
            publication: publication.clone(),
            duplicate: false,
        })
    }

    async fn publications(&self) -> Result<Vec<SignedPublication>, LedgerError> {
        Ok(self
            .ledger
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .publications
            .clone())
    }
}

/// A [`NodeLink`] over in-process channels: each simulated node connects and receives its
/// commands on an unbounded queue.
#[derive(Debug, Default, Clone)]
pub struct ChannelNodeLink {
    sessions: Arc<RwLock<HashMap<NodeId, mpsc::UnboundedSender<NodeCommand>>>>,
}

impl ChannelNodeLink {
    /// A link with no sessions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens (or replaces) `node`'s session; the receiver gets every command sent to it.
    pub fn connect(&self, node: NodeId) -> mpsc::UnboundedReceiver<NodeCommand> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.sessions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, tx);
        rx
    }

    /// Closes `node`'s session.
    pub fn disconnect(&self, node: &NodeId) {
        self.sessions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(node);
    }
}

#[async_trait]
impl NodeLink for ChannelNodeLink {
    async fn send(&self, node: &NodeId, command: NodeCommand) -> Result<(), LinkError> {
        let sessions = self.sessions.read().unwrap_or_else(|p| p.into_inner());
        let tx = sessions.get(node).ok_or(LinkError::NotConnected(*node))?;
        tx.send(command).map_err(|_| LinkError::Delivery {
            node: *node,
            reason: "session closed".into(),
        })
    }
}

/// What the sink recorded for one epoch: the checkpoint reference and the merged receipts.
type Published = (String, Vec<DeltaReceipt>);

/// A checkpoint sink that records each epoch's accepted delta hashes and returns a
/// content-derived reference `mem:<sha256 hex>` over (job, epoch, sorted delta hashes).
/// Stands in until the validator/merge/publisher pipeline plugs in behind the same port.
#[derive(Debug, Default)]
pub struct MemoryCheckpointSink {
    published: Mutex<BTreeMap<(JobId, u32), Published>>,
    fail: AtomicBool,
}

impl MemoryCheckpointSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every later publication fail (`true`) or succeed (`false`).
    pub fn set_failing(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    /// The checkpoint references published for `job`, in epoch order.
    pub fn checkpoints(&self, job: JobId) -> Vec<(u32, String, usize)> {
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .range((job, 0)..=(job, u32::MAX))
            .map(|((_, e), (cid, d))| (*e, cid.clone(), d.len()))
            .collect()
    }
}

#[async_trait]
impl CheckpointSink for MemoryCheckpointSink {
    async fn publish(&self, input: EpochInput<'_>) -> Result<PublishedEpoch, CheckpointError> {
        let EpochInput {
            job, epoch, deltas, ..
        } = input;
        if self.fail.load(Ordering::SeqCst) {
            return Err(CheckpointError::Failed {
                message: "simulated publication failure".into(),
            });
        }
        if let Some((cid, _)) = self
            .published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(job, epoch))
        {
            return Ok(PublishedEpoch::checkpoint(cid.clone()));
        }
        let mut hashes: Vec<[u8; 32]> = deltas.iter().map(|d| d.delta_hash).collect();
        hashes.sort_unstable();
        let mut h = Sha256::new();
        h.update(job.0.to_le_bytes());
        h.update(epoch.to_le_bytes());
        for d in &hashes {
            h.update(d);
        }
        let cid = format!("mem:{}", hex::encode(h.finalize()));
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((job, epoch), (cid.clone(), deltas.to_vec()));
        Ok(PublishedEpoch::checkpoint(cid))
    }
}

/// Metrics kept in memory: counters by (name, label) and every histogram sample. The
/// embedded default, and what tests read.
#[derive(Debug, Default)]
pub struct MemoryMetrics {
    counters: Mutex<BTreeMap<(Counter, String), u64>>,
    samples: Mutex<BTreeMap<Histogram, Vec<f64>>>,
}

impl MemoryMetrics {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of counter `name{label}` (0 when never incremented).
    pub fn counter(&self, name: Counter, label: &str) -> u64 {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|((n, l), _)| *n == name && l == label)
            .map_or(0, |(_, v)| *v)
    }

    /// Every counter: (name, label, value), sorted.
    pub fn counters(&self) -> Vec<(String, String, u64)> {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((n, l), v)| (n.name().to_string(), l.clone(), *v))
            .collect()
    }

    /// The samples of histogram `name`, in arrival order.
    pub fn samples(&self, name: Histogram) -> Vec<f64> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&name)
            .cloned()
            .unwrap_or_default()
    }
}

impl Metrics for MemoryMetrics {
    fn incr(&self, name: Counter, label: &str, by: u64) {
        *self
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((name, label.to_string()))
            .or_default() += by;
    }

    fn observe(&self, name: Histogram, value: f64) {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name)
            .or_default()
            .push(value);
    }
}
