//! [`EvmChain`]: the ledger on an EVM chain over JSON-RPC (DESIGN §8, paper §8).
//!
//! Reads go to `GYMToken.nodeStake(key)` (operator, stake, penalty in one call),
//! `MiningPool.rewardsOf`, `MiningPool.publicationAt` and the contracts' event logs.
//! Writes are transactions from the orchestrator's account ([`super::account`]):
//!
//! - **Idempotent by contract and by check.** The contracts refuse a second
//!   `distributeEpochRewards` for a (job, epoch), a second `slash` with the same evidence
//!   (SHA-256) and a second `recordPublication` for a (job, epoch). Before every attempt
//!   the adapter reads whether the write already happened and, if so, returns the first
//!   one from the chain with `duplicate: true`. A transaction whose answer was lost (the
//!   endpoint died after the send) is therefore never paid twice: the next attempt finds
//!   the epoch paid, and a race with a transaction still in the mempool ends in a revert,
//!   not in a second payment.
//! - **Per orchestrator.** The contracts key payments and records by (orchestrator account,
//!   job, epoch): job ids are each orchestrator's own. [`Ledger::reward_batches`] and
//!   [`Ledger::slashes`] list this account's; [`Ledger::publications`] lists every record on
//!   the pool, whoever made it (a reader checks the signer it trusts).
//! - **`duplicate`** means "not written by this call": a write this call sent, whose answer
//!   was lost, is recognised by its transaction hash and is not a duplicate; one an earlier
//!   call (or process) made is.
//! - **Nonces.** Writes are serialised by one lock and each takes the account's pending
//!   nonce from the node (alloy's simple nonce manager): a failed send cannot leave a gap
//!   that blocks later transactions, as a cached counter would.
//! - **Gas** is estimated per transaction (which also surfaces a revert, decoded into the
//!   contracts' custom errors, before anything is sent); EIP-1559 fees come from the node.
//! - **Receipts** are awaited at most [`EvmOptions::tx_timeout`]; every read and every send
//!   is bounded by [`EvmOptions::call_timeout`]. A write is attempted
//!   [`EvmOptions::attempts`] times with doubling delays, then fails with
//!   [`ChainError::Unavailable`], which the training sink retries every 30 s.
//!
//! Units: amounts in GYM wei (`uint256` on chain, [`GymWei`] here, at most `u128::MAX`);
//! on-chain times are unix seconds, [`Timestamp`]s are unix milliseconds.

use std::collections::HashSet;
use std::future::IntoFuture;
use std::time::Duration;

use alloy::eips::eip2718::Encodable2718;
use alloy::network::{EthereumWallet, TransactionBuilder};
use alloy::primitives::{Address, Bytes, B256, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::client::RpcClient;
use alloy::rpc::types::TransactionReceipt;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolInterface;
use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::contracts::{GYMToken, MiningPool};
use hanzod_actors::ports::{
    check_slash, ChainError, ChainReader, InvalidRequest, Ledger, LedgerError, RewardReceipt,
    SlashReceipt, Standing,
};
use hanzod_actors::publication::{PublicationReceipt, PublicationRecord, SignedPublication};
use hanzod_actors::types::{GymWei, JobId, NodeId, Timestamp};

/// Settings of an [`EvmChain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvmOptions {
    /// The chain id the endpoint must report (36900, the Hanzo chain, by default;
    /// `HANZO_CHAIN_ID`).
    pub chain_id: u64,
    /// The `GYMToken` contract.
    pub token: Address,
    /// The `MiningPool` contract.
    pub pool: Address,
    /// The first block whose logs hold reward batches and slashes (the contracts'
    /// deployment block; 0 scans from genesis).
    pub from_block: u64,
    /// The bound of one JSON-RPC call (a read, a gas estimate, a send).
    pub call_timeout: Duration,
    /// How long a sent transaction's receipt is awaited.
    pub tx_timeout: Duration,
    /// Attempts per write (at least 1) before [`ChainError::Unavailable`].
    pub attempts: u32,
    /// The delay before the second attempt; doubled before each next one.
    pub retry_delay: Duration,
}

impl Default for EvmOptions {
    fn default() -> Self {
        EvmOptions {
            chain_id: 36900,
            token: Address::ZERO,
            pool: Address::ZERO,
            from_block: 0,
            call_timeout: Duration::from_secs(10),
            tx_timeout: Duration::from_secs(60),
            attempts: 3,
            retry_delay: Duration::from_millis(500),
        }
    }
}

/// Why an [`EvmChain`] could not be set up.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EvmError {
    /// The endpoint URL does not parse, or no client can be built for it.
    #[error("bad JSON-RPC URL: {0}")]
    Url(#[from] RpcUrlError),
    /// The endpoint could not be reached or failed a call.
    #[error("chain unavailable: {call}: {reason}")]
    Unavailable {
        /// The call (`eth_chainId`, `MiningPool.token()`).
        call: String,
        /// What the transport said, or that no answer came in time.
        reason: String,
    },
    /// The endpoint serves another chain than the one configured.
    #[error(
        "the endpoint serves chain id {found}, not {expected} (chain.chain_id / HANZO_CHAIN_ID)"
    )]
    WrongChain {
        /// The configured chain id.
        expected: u64,
        /// The endpoint's.
        found: u64,
    },
    /// A configured contract address holds no code, or not the expected contract.
    #[error(transparent)]
    Contract(#[from] ContractMismatch),
}

/// What is wrong with a configured contract address ([`EvmError::Contract`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ContractMismatch {
    /// No code at the address.
    #[error("no contract at {address} (chain.{key}) on chain {chain}")]
    NoCode {
        /// The address.
        address: Address,
        /// The setting that names it (`gym_token`, `mining_pool`).
        key: &'static str,
        /// The chain id.
        chain: u64,
    },
    /// A contract, but `token()` fails on it.
    #[error("{pool} is not a MiningPool (token() failed: {reason})")]
    NotAPool {
        /// The address.
        pool: Address,
        /// What the call said.
        reason: String,
    },
    /// The pool pays in another token than the configured one.
    #[error("the MiningPool at {pool} pays in {pays}, not the configured GYMToken {token}")]
    OtherToken {
        /// The pool.
        pool: Address,
        /// The token it pays in.
        pays: Address,
        /// The configured token.
        token: Address,
    },
}

/// Why a URL does not parse (`url::ParseError`, which reqwest does not re-export).
pub type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// Why no JSON-RPC client can be built for a URL ([`EvmError::Url`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RpcUrlError {
    /// The URL does not parse.
    #[error("{url}: {source}")]
    Parse {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: UrlParseError,
    },
    /// The TLS set-up failed.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The HTTP client could not be built.
    #[error("{message}")]
    Client {
        /// What reqwest said (its error is not `Clone`).
        message: String,
    },
}

/// A write's failure: the call reverted (decoded where the contracts define the error), or
/// the transport failed, in which case the transaction may or may not have been sent.
#[derive(Debug)]
enum SendError {
    Reverted(Option<Revert>, String),
    Transport(String),
}

/// A decoded custom error of either contract.
#[derive(Debug)]
enum Revert {
    Pool(MiningPool::MiningPoolErrors),
    Token(GYMToken::GYMTokenErrors),
}

fn decode_revert(data: &[u8]) -> Option<Revert> {
    if let Ok(e) = MiningPool::MiningPoolErrors::abi_decode(data) {
        return Some(Revert::Pool(e));
    }
    GYMToken::GYMTokenErrors::abi_decode(data)
        .ok()
        .map(Revert::Token)
}

/// `fut` bounded by `bound`, its failures as [`EvmError::Unavailable`] naming `what`.
async fn within<T, E: std::fmt::Display>(
    what: &str,
    bound: Duration,
    fut: impl std::future::IntoFuture<Output = Result<T, E>>,
) -> Result<T, EvmError> {
    match tokio::time::timeout(bound, fut.into_future()).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(EvmError::Unavailable {
            call: what.to_string(),
            reason: e.to_string(),
        }),
        Err(_) => Err(EvmError::Unavailable {
            call: what.to_string(),
            reason: format!("no answer within {bound:?}"),
        }),
    }
}

/// A provider on the JSON-RPC endpoint `url` (http or https, hanzod's rustls set-up), each
/// request bounded by `timeout`, without fillers or wallet: [`EvmChain::send`] builds and
/// signs transactions itself.
fn http_provider(url: &str, timeout: Duration) -> Result<DynProvider, EvmError> {
    Ok(ProviderBuilder::new()
        .disable_recommended_fillers()
        .connect_client(rpc_client(url, Some(timeout))?)
        .erased())
}

/// A JSON-RPC client on `url` (http or https) over hanzod's reqwest/rustls set-up
/// ([`crate::tls::client_builder`]), each request bounded by `timeout` when given.
///
/// Errors: the URL does not parse, or the TLS set-up fails.
pub(crate) fn rpc_client(url: &str, timeout: Option<Duration>) -> Result<RpcClient, RpcUrlError> {
    let parsed = reqwest::Url::parse(url).map_err(|source| RpcUrlError::Parse {
        url: url.to_string(),
        source,
    })?;
    let mut http =
        crate::tls::client_builder(parsed.scheme() == "https", None, crate::tls::Alpn::Http1)?;
    if let Some(t) = timeout {
        http = http.timeout(t).connect_timeout(t);
    }
    let http = http.build().map_err(|e| RpcUrlError::Client {
        message: e.to_string(),
    })?;
    Ok(RpcClient::new_http_with_client(http, parsed))
}

/// The token the `MiningPool` at `pool` pays in, bounded by `bound`: an endpoint that
/// cannot be reached is [`EvmError::Unavailable`]; a call that fails at the address (no
/// such function, no code) is [`EvmError::Contract`].
async fn pool_token<P: Provider>(
    provider: P,
    pool: Address,
    bound: Duration,
) -> Result<Address, EvmError> {
    match tokio::time::timeout(
        bound,
        MiningPool::new(pool, provider).token().call().into_future(),
    )
    .await
    {
        Ok(Ok(token)) => Ok(token),
        Ok(Err(alloy::contract::Error::TransportError(e))) if e.is_transport_error() => {
            Err(EvmError::Unavailable {
                call: "MiningPool.token()".into(),
                reason: e.to_string(),
            })
        }
        Ok(Err(e)) => Err(ContractMismatch::NotAPool {
            pool,
            reason: e.to_string(),
        }
        .into()),
        Err(_) => Err(EvmError::Unavailable {
            call: "MiningPool.token()".into(),
            reason: format!("no answer within {bound:?}"),
        }),
    }
}

fn node_key(node: &NodeId) -> B256 {
    B256::from(node.0)
}

fn wei(v: GymWei) -> U256 {
    U256::from(v.0)
}

fn gym_wei(v: U256, what: &str) -> Result<GymWei, ChainError> {
    u128::try_from(v)
        .map(GymWei)
        .map_err(|_| ChainError::Unavailable(format!("{what} {v} exceeds u128 GYM wei")))
}

fn seconds_to_ts(s: u64) -> Timestamp {
    Timestamp(s.saturating_mul(1000))
}

fn topic(v: u64) -> B256 {
    B256::from(U256::from(v))
}

/// The ledger on an EVM chain (see the module docs). Generic over the alloy provider `P`;
/// [`EvmChain::connect`] builds one over HTTP(S) with the orchestrator's signer.
pub struct EvmChain<P: Provider + Clone = DynProvider> {
    provider: P,
    token: GYMToken::GYMTokenInstance<P>,
    pool: MiningPool::MiningPoolInstance<P>,
    account: Address,
    wallet: EthereumWallet,
    opts: EvmOptions,
    writes: tokio::sync::Mutex<()>,
}

impl<P: Provider + Clone> std::fmt::Debug for EvmChain<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvmChain")
            .field("account", &self.account)
            .field("options", &self.opts)
            .finish()
    }
}

impl EvmChain<DynProvider> {
    /// Connects to the JSON-RPC endpoint `url` (http or https) with `signer` as the sending
    /// account, then checks the chain as [`EvmChain::new`] does.
    ///
    /// Errors: [`EvmError::Url`] for a URL that does not parse, else those of
    /// [`EvmChain::new`].
    pub async fn connect(
        url: &str,
        signer: PrivateKeySigner,
        opts: EvmOptions,
    ) -> Result<EvmChain<DynProvider>, EvmError> {
        let provider = http_provider(url, opts.call_timeout)?;
        EvmChain::new(provider, signer, opts).await
    }
}

impl EvmChain<DynProvider> {
    /// A read-only adapter (for `hanzod verify`): the `MiningPool` at `pool` on the
    /// endpoint `url`, its token read from the pool, checked as [`EvmChain::new`] does.
    /// It has no key: a write is refused by the chain (its account holds no stake).
    ///
    /// Errors: as [`EvmChain::connect`].
    pub async fn reader(
        url: &str,
        pool: Address,
        chain_id: u64,
        call_timeout: Duration,
    ) -> Result<EvmChain<DynProvider>, EvmError> {
        let provider = http_provider(url, call_timeout)?;
        let token = pool_token(provider.clone(), pool, call_timeout).await?;
        let opts = EvmOptions {
            chain_id,
            token,
            pool,
            call_timeout,
            ..EvmOptions::default()
        };
        EvmChain::new(provider, PrivateKeySigner::random(), opts).await
    }
}

impl<P: Provider + Clone> EvmChain<P> {
    /// An adapter on `provider` that signs its transactions with `signer` (the provider
    /// itself needs no wallet: transactions are built and signed here). Checks, each call bounded by
    /// the call timeout: the endpoint's chain id is `opts.chain_id`; both addresses hold
    /// code; the pool's `token()` is the configured token.
    ///
    /// Errors: [`EvmError::Unavailable`], [`EvmError::WrongChain`], [`EvmError::Contract`].
    pub async fn new(
        provider: P,
        signer: PrivateKeySigner,
        opts: EvmOptions,
    ) -> Result<Self, EvmError> {
        let account = signer.address();
        let bound = opts.call_timeout;
        let found = within("eth_chainId", bound, provider.get_chain_id()).await?;
        if found != opts.chain_id {
            return Err(EvmError::WrongChain {
                expected: opts.chain_id,
                found,
            });
        }
        for (name, address) in [("GYMToken", opts.token), ("MiningPool", opts.pool)] {
            let code = within("eth_getCode", bound, provider.get_code_at(address)).await?;
            if code.is_empty() {
                return Err(ContractMismatch::NoCode {
                    address,
                    key: if name == "GYMToken" {
                        "gym_token"
                    } else {
                        "mining_pool"
                    },
                    chain: found,
                }
                .into());
            }
        }
        let token = GYMToken::new(opts.token, provider.clone());
        let pool = MiningPool::new(opts.pool, provider.clone());
        let pool_token = pool_token(provider.clone(), opts.pool, bound).await?;
        if pool_token != opts.token {
            return Err(ContractMismatch::OtherToken {
                pool: opts.pool,
                pays: pool_token,
                token: opts.token,
            }
            .into());
        }
        Ok(EvmChain {
            provider,
            token,
            pool,
            account,
            wallet: EthereumWallet::from(signer),
            opts,
            writes: tokio::sync::Mutex::new(()),
        })
    }

    /// The account transactions are sent from.
    pub fn account(&self) -> Address {
        self.account
    }

    /// The settings.
    pub fn options(&self) -> &EvmOptions {
        &self.opts
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// Bounds `fut`, a read, by the call timeout, mapping failures to
    /// [`ChainError::Unavailable`] naming `what`.
    async fn read<T, E: std::fmt::Display>(
        &self,
        what: &str,
        fut: impl std::future::IntoFuture<Output = Result<T, E>>,
    ) -> Result<T, ChainError> {
        match tokio::time::timeout(self.opts.call_timeout, fut.into_future()).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(ChainError::Unavailable(format!("{what}: {e}"))),
            Err(_) => Err(ChainError::Unavailable(format!(
                "{what}: no answer within {:?}",
                self.opts.call_timeout
            ))),
        }
    }

    /// Sends the transaction `call` describes and awaits its receipt. The transaction is
    /// built here: the account's pending nonce, an estimated gas limit (+20 %; a revert is
    /// seen here, before anything is sent, and decoded), EIP-1559 fees from the node, the
    /// chain id; then signed, and its hash added to `sent` *before* it is broadcast, so
    /// that a later attempt recognises it on chain even when the broadcast's answer was
    /// lost.
    async fn send<D: alloy::contract::CallDecoder>(
        &self,
        what: &str,
        call: alloy::contract::CallBuilder<&P, D>,
        sent: &mut HashSet<B256>,
    ) -> Result<TransactionReceipt, SendError> {
        let transport = |e: &dyn std::fmt::Display| SendError::Transport(format!("{what}: {e}"));
        let mut tx = call.into_transaction_request();
        tx.set_from(self.account);
        tx.set_chain_id(self.opts.chain_id);
        let nonce = self
            .read(
                "eth_getTransactionCount",
                self.provider.get_transaction_count(self.account).pending(),
            )
            .await
            .map_err(|e| transport(&e))?;
        tx.set_nonce(nonce);
        let gas = match tokio::time::timeout(
            self.opts.call_timeout,
            self.provider.estimate_gas(tx.clone()).into_future(),
        )
        .await
        {
            Ok(Ok(gas)) => gas,
            Ok(Err(e)) => {
                return Err(match e.as_error_resp().and_then(|r| r.as_revert_data()) {
                    Some(data) => SendError::Reverted(decode_revert(&data), format!("{what}: {e}")),
                    None => transport(&e),
                })
            }
            Err(_) => return Err(transport(&"gas estimation timed out")),
        };
        tx.set_gas_limit(gas.saturating_add(gas / 5));
        let fees = self
            .read("fee estimation", self.provider.estimate_eip1559_fees())
            .await
            .map_err(|e| transport(&e))?;
        tx.set_max_fee_per_gas(fees.max_fee_per_gas);
        tx.set_max_priority_fee_per_gas(fees.max_priority_fee_per_gas);
        let envelope = tx.build(&self.wallet).await.map_err(|e| transport(&e))?;
        let hash = *envelope.tx_hash();
        sent.insert(hash);
        let raw = envelope.encoded_2718();
        let pending = match tokio::time::timeout(
            self.opts.call_timeout,
            self.provider.send_raw_transaction(&raw),
        )
        .await
        {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(transport(&format!("transaction {hash}: {e}"))),
            Err(_) => {
                return Err(transport(&format!(
                    "transaction {hash}: the send got no answer"
                )))
            }
        };
        tracing::debug!(%hash, nonce, gas, what, "transaction sent");
        let receipt = pending
            .with_timeout(Some(self.opts.tx_timeout))
            .get_receipt()
            .await
            .map_err(|e| transport(&format!("transaction {hash}: {e}")))?;
        if !receipt.status() {
            return Err(SendError::Reverted(
                None,
                format!("{what}: transaction {hash} reverted on chain"),
            ));
        }
        Ok(receipt)
    }

    /// A revert that is the request's fault or names an unbound node, as a [`LedgerError`];
    /// anything else is [`ChainError::Unavailable`] (retrying may succeed: the pool funded,
    /// the account restaked, the endpoint back).
    fn refusal(&self, revert: Option<&Revert>, message: String) -> LedgerError {
        use GYMToken::GYMTokenErrors as T;
        use MiningPool::MiningPoolErrors as M;
        match revert {
            Some(Revert::Pool(M::Unbound(u))) => ChainError::Unbound(NodeId(u.node.0)).into(),
            Some(Revert::Token(T::Unbound(u))) => ChainError::Unbound(NodeId(u.node.0)).into(),
            Some(Revert::Token(T::BadPercentage(_)))
            | Some(Revert::Token(T::EmptyEvidence(_)))
            | Some(Revert::Token(T::ZeroReporter(_)))
            | Some(Revert::Pool(M::LengthMismatch(_)))
            | Some(Revert::Pool(M::BadSignatureLength(_))) => {
                LedgerError::Invalid(InvalidRequest::Reverted {
                    message,
                    revert: format!("{revert:?}"),
                })
            }
            Some(Revert::Pool(M::NotOrchestrator(_)))
            | Some(Revert::Token(T::NotOrchestrator(_))) => ChainError::Unavailable(format!(
                "{message}: the orchestrator account {} holds less than 50,000 GYM stake",
                self.account
            ))
            .into(),
            Some(Revert::Token(T::ERC20InsufficientBalance(b))) => {
                ChainError::Unavailable(format!(
                    "{message}: the MiningPool holds {} GYM wei, the batch needs {}",
                    b.balance, b.needed
                ))
                .into()
            }
            Some(r) => ChainError::Unavailable(format!("{message} ({r:?})")).into(),
            None => ChainError::Unavailable(message).into(),
        }
    }

    /// A retry budget for one write: [`EvmOptions::attempts`] attempts, doubling delays.
    fn retry(&self, what: &'static str) -> Retry {
        Retry {
            what,
            left: self.opts.attempts.max(1),
            delay: self.opts.retry_delay,
        }
    }

    /// This account's `EpochRewarded` log of (`job`, `epoch`) as a receipt, with the hash of
    /// the transaction that wrote it. Job ids are per orchestrator: the contract keys
    /// payments by (orchestrator, job, epoch), and so does this lookup.
    async fn paid_batch(
        &self,
        job: JobId,
        epoch: u32,
    ) -> Result<Option<(RewardReceipt, Option<B256>)>, ChainError> {
        let logs = self
            .read(
                "EpochRewarded logs",
                self.pool
                    .EpochRewarded_filter()
                    .topic1(topic(job.0))
                    .topic2(topic(u64::from(epoch)))
                    .topic3(self.account.into_word())
                    .from_block(self.opts.from_block)
                    .query(),
            )
            .await?;
        match logs.into_iter().next() {
            Some((e, log)) => Ok(Some((batch_receipt(&e)?, log.transaction_hash))),
            None => Ok(None),
        }
    }

    /// The `Slashed` log of `evidence_hash`, with the hash of its transaction.
    async fn applied_slash(
        &self,
        evidence_hash: B256,
    ) -> Result<Option<(SlashReceipt, Option<B256>)>, ChainError> {
        let logs = self
            .read(
                "Slashed logs",
                self.token
                    .Slashed_filter()
                    .topic3(evidence_hash)
                    .from_block(self.opts.from_block)
                    .query(),
            )
            .await?;
        match logs.into_iter().next() {
            Some((e, log)) => Ok(Some((slash_receipt(&e)?, log.transaction_hash))),
            None => Ok(None),
        }
    }

    /// The publication this account recorded for (`job`, `epoch`), if any.
    async fn recorded(
        &self,
        job: JobId,
        epoch: u32,
    ) -> Result<Option<SignedPublication>, ChainError> {
        let is = self
            .read(
                "MiningPool.isRecorded",
                self.pool.isRecorded(self.account, job.0, epoch).call(),
            )
            .await?;
        if !is {
            return Ok(None);
        }
        let p = self
            .read(
                "MiningPool.publication",
                self.pool.publication(self.account, job.0, epoch).call(),
            )
            .await?;
        publication_from(p).map(Some)
    }

    /// One attempt of [`Ledger::distribute_epoch_rewards`]: the batch from the chain if
    /// the epoch is paid (ours when its transaction is in `sent`), else one transaction.
    async fn distribute_once(
        &self,
        job: JobId,
        epoch: u32,
        nodes: &[B256],
        amounts: &[U256],
        sent: &mut HashSet<B256>,
    ) -> Result<RewardReceipt, LedgerError> {
        if let Some((first, tx)) = self.paid_batch(job, epoch).await? {
            let ours = tx.is_some_and(|h| sent.contains(&h));
            return Ok(RewardReceipt {
                duplicate: !ours,
                ..first
            });
        }
        let call = self
            .pool
            .distributeEpochRewards(job.0, epoch, nodes.to_vec(), amounts.to_vec());
        match self.send("distributeEpochRewards", call, sent).await {
            Ok(receipt) => {
                let e = receipt
                    .decoded_log::<MiningPool::EpochRewarded>()
                    .ok_or_else(|| {
                        ChainError::Unavailable(
                            "distributeEpochRewards: no EpochRewarded log in the receipt".into(),
                        )
                    })?;
                Ok(batch_receipt(&e.data)?)
            }
            Err(SendError::Reverted(
                Some(Revert::Pool(MiningPool::MiningPoolErrors::EpochAlreadyPaid(_))),
                why,
            )) => Err(ChainError::Unavailable(format!("{why}: paid meanwhile; re-reading")).into()),
            Err(SendError::Reverted(r, why)) => Err(self.refusal(r.as_ref(), why)),
            Err(SendError::Transport(why)) => Err(ChainError::Unavailable(why).into()),
        }
    }

    /// One attempt of [`Ledger::slash`]: the slash from the chain if the evidence was
    /// used (ours when its transaction is in `sent`), else one transaction.
    async fn slash_once(
        &self,
        node: &NodeId,
        pct: u8,
        evidence: &[u8],
        hash: B256,
        sent: &mut HashSet<B256>,
    ) -> Result<SlashReceipt, LedgerError> {
        let used = self
            .read(
                "GYMToken.evidenceUsed",
                self.token.evidenceUsed(hash).call(),
            )
            .await?;
        if used {
            if let Some((first, tx)) = self.applied_slash(hash).await? {
                let ours = tx.is_some_and(|h| sent.contains(&h));
                return Ok(SlashReceipt {
                    duplicate: !ours,
                    ..first
                });
            }
            return Err(ChainError::Unavailable(format!(
                "evidence {hash} is used but its Slashed log is not found from block {}",
                self.opts.from_block
            ))
            .into());
        }
        let call = self.token.slash(
            node_key(node),
            pct,
            self.account,
            Bytes::copy_from_slice(evidence),
        );
        match self.send("slash", call, sent).await {
            Ok(receipt) => {
                let e = receipt.decoded_log::<GYMToken::Slashed>().ok_or_else(|| {
                    ChainError::Unavailable("slash: no Slashed log in the receipt".into())
                })?;
                Ok(slash_receipt(&e.data)?)
            }
            Err(SendError::Reverted(
                Some(Revert::Token(GYMToken::GYMTokenErrors::EvidenceUsed(_))),
                why,
            )) => {
                Err(ChainError::Unavailable(format!("{why}: slashed meanwhile; re-reading")).into())
            }
            Err(SendError::Reverted(r, why)) => Err(self.refusal(r.as_ref(), why)),
            Err(SendError::Transport(why)) => Err(ChainError::Unavailable(why).into()),
        }
    }

    /// One attempt of [`Ledger::record_publication`]: the record from the chain if the
    /// epoch has one (ours when we sent a transaction and it is the same record), else one
    /// transaction.
    async fn record_once(
        &self,
        publication: &SignedPublication,
        on_chain: &MiningPool::Publication,
        sent: &mut HashSet<B256>,
    ) -> Result<PublicationReceipt, LedgerError> {
        let (job, epoch) = (publication.record.job, publication.record.epoch);
        if let Some(first) = self.recorded(job, epoch).await? {
            let ours = !sent.is_empty() && first == *publication;
            return Ok(PublicationReceipt {
                publication: first,
                duplicate: !ours,
            });
        }
        let call = self.pool.recordPublication(on_chain.clone());
        match self.send("recordPublication", call, sent).await {
            Ok(_) => Ok(PublicationReceipt {
                publication: publication.clone(),
                duplicate: false,
            }),
            Err(SendError::Reverted(
                Some(Revert::Pool(MiningPool::MiningPoolErrors::AlreadyRecorded(_))),
                why,
            )) => Err(
                ChainError::Unavailable(format!("{why}: recorded meanwhile; re-reading")).into(),
            ),
            Err(SendError::Reverted(r, why)) => Err(self.refusal(r.as_ref(), why)),
            Err(SendError::Transport(why)) => Err(ChainError::Unavailable(why).into()),
        }
    }

    /// The stake the orchestrator's own account holds, in GYM wei.
    pub async fn own_stake(&self) -> Result<GymWei, ChainError> {
        let s = self
            .read("GYMToken.stakes", self.token.stakes(self.account).call())
            .await?;
        gym_wei(s, "stake")
    }
}

/// The attempts left of one write (see [`EvmChain::retry`]).
struct Retry {
    what: &'static str,
    left: u32,
    delay: Duration,
}

impl Retry {
    /// `Some(outcome)` to return it; `None`, after the delay, to attempt again: the outcome
    /// was [`ChainError::Unavailable`] and attempts are left. Each attempt re-reads the
    /// chain before it writes, so a write whose answer was lost is not repeated.
    async fn settle<T>(
        &mut self,
        outcome: Result<T, LedgerError>,
    ) -> Option<Result<T, LedgerError>> {
        self.left = self.left.saturating_sub(1);
        match outcome {
            Err(LedgerError::Chain(ChainError::Unavailable(why))) if self.left > 0 => {
                tracing::warn!(what = self.what, left = self.left, %why, "chain write failed; re-reading the chain and retrying");
                tokio::time::sleep(self.delay).await;
                self.delay = self.delay.saturating_mul(2);
                None
            }
            other => Some(other),
        }
    }
}

fn batch_receipt(e: &MiningPool::EpochRewarded) -> Result<RewardReceipt, ChainError> {
    let paid = e
        .nodes
        .iter()
        .zip(&e.amounts)
        .map(|(n, a)| Ok((NodeId(n.0), gym_wei(*a, "reward")?)))
        .collect::<Result<Vec<_>, ChainError>>()?;
    Ok(RewardReceipt {
        job: JobId(e.job),
        epoch: e.epoch,
        total: gym_wei(e.total, "reward total")?,
        paid,
        duplicate: false,
    })
}

fn slash_receipt(e: &GYMToken::Slashed) -> Result<SlashReceipt, ChainError> {
    Ok(SlashReceipt {
        node: NodeId(e.node.0),
        pct: e.pct,
        slashed: gym_wei(e.slashed, "slashed amount")?,
        stake_after: gym_wei(e.stakeAfter, "stake")?,
        evidence_hash: e.evidenceHash.0,
        penalty_until: seconds_to_ts(e.penaltyUntil),
        duplicate: false,
    })
}

fn publication_from(p: MiningPool::Publication) -> Result<SignedPublication, ChainError> {
    let signature: [u8; 64] = p.signature.as_ref().try_into().map_err(|_| {
        ChainError::Unavailable(format!(
            "the chain holds a {}-byte publication signature",
            p.signature.len()
        ))
    })?;
    Ok(SignedPublication {
        record: PublicationRecord {
            job: JobId(p.job),
            epoch: p.epoch,
            cid: p.cid,
            config_cid: p.configCid,
            card_cid: p.cardCid,
            hf_repo: p.hfRepo,
            quality: f64::from_bits(p.qualityBits),
            timestamp: Timestamp(p.timestamp),
        },
        signer: p.signer.0,
        signature,
    })
}

fn publication_to(p: &SignedPublication) -> MiningPool::Publication {
    let r = &p.record;
    MiningPool::Publication {
        job: r.job.0,
        epoch: r.epoch,
        cid: r.cid.clone(),
        configCid: r.config_cid.clone(),
        cardCid: r.card_cid.clone(),
        hfRepo: r.hf_repo.clone(),
        qualityBits: r.quality.to_bits(),
        timestamp: r.timestamp.0,
        signer: B256::from(p.signer),
        signature: Bytes::copy_from_slice(&p.signature),
    }
}

#[async_trait]
impl<P: Provider + Clone + 'static> ChainReader for EvmChain<P> {
    async fn stake_of(&self, node: &NodeId) -> Result<GymWei, ChainError> {
        Ok(self.standing(node).await?.stake)
    }

    async fn penalty_until(&self, node: &NodeId) -> Result<Option<Timestamp>, ChainError> {
        let s = self
            .read(
                "GYMToken.penaltyUntil",
                self.token.penaltyUntil(node_key(node)).call(),
            )
            .await?;
        Ok((s != 0).then(|| seconds_to_ts(s)))
    }

    /// One `GYMToken.nodeStake(key)` call: operator, stake and penalty together, so both
    /// facts come from the same block.
    async fn standing(&self, node: &NodeId) -> Result<Standing, ChainError> {
        let s = self
            .read(
                "GYMToken.nodeStake",
                self.token.nodeStake(node_key(node)).call(),
            )
            .await?;
        if s.operator == Address::ZERO {
            return Err(ChainError::Unbound(*node));
        }
        Ok(Standing {
            stake: gym_wei(s.stake, "stake")?,
            penalty_until: (s.penaltyUntil_ != 0).then(|| seconds_to_ts(s.penaltyUntil_)),
        })
    }

    async fn orchestrator_stake(&self) -> Result<GymWei, ChainError> {
        self.own_stake().await
    }
}

#[async_trait]
impl<P: Provider + Clone + 'static> Ledger for EvmChain<P> {
    async fn distribute_epoch_rewards(
        &self,
        job: JobId,
        epoch: u32,
        rewards: &[(NodeId, GymWei)],
    ) -> Result<RewardReceipt, LedgerError> {
        // The embedded ledger's bound: totals fit u128 GYM wei.
        rewards.iter().try_fold(0u128, |t, (n, a)| {
            t.checked_add(a.0)
                .ok_or(LedgerError::Invalid(InvalidRequest::RewardOverflow {
                    node: *n,
                }))
        })?;
        let nodes: Vec<B256> = rewards.iter().map(|(n, _)| node_key(n)).collect();
        let amounts: Vec<U256> = rewards.iter().map(|(_, a)| wei(*a)).collect();
        let _writing = self.writes.lock().await;
        let mut sent = HashSet::new();
        let mut retry = self.retry("distributeEpochRewards");
        loop {
            let outcome = self
                .distribute_once(job, epoch, &nodes, &amounts, &mut sent)
                .await;
            if let Some(done) = retry.settle(outcome).await {
                return done;
            }
        }
    }

    async fn slash(
        &self,
        node: &NodeId,
        pct: u8,
        evidence: &[u8],
    ) -> Result<SlashReceipt, LedgerError> {
        check_slash(pct, evidence)?;
        let hash = B256::from(<[u8; 32]>::from(Sha256::digest(evidence)));
        let _writing = self.writes.lock().await;
        let mut sent = HashSet::new();
        let mut retry = self.retry("slash");
        loop {
            let outcome = self.slash_once(node, pct, evidence, hash, &mut sent).await;
            if let Some(done) = retry.settle(outcome).await {
                return done;
            }
        }
    }

    async fn balance_of(&self, node: &NodeId) -> Result<GymWei, LedgerError> {
        let paid = self
            .read(
                "MiningPool.rewardsOf",
                self.pool.rewardsOf(node_key(node)).call(),
            )
            .await?;
        if paid.is_zero() {
            let op = self
                .read(
                    "GYMToken.nodeOperator",
                    self.token.nodeOperator(node_key(node)).call(),
                )
                .await?;
            if op == Address::ZERO {
                return Err(ChainError::Unbound(*node).into());
            }
        }
        Ok(gym_wei(paid, "rewards")?)
    }

    async fn slashes(&self) -> Result<Vec<SlashReceipt>, LedgerError> {
        let logs = self
            .read(
                "Slashed logs",
                self.token
                    .Slashed_filter()
                    .from_block(self.opts.from_block)
                    .query(),
            )
            .await?;
        Ok(logs
            .iter()
            .filter(|(e, _)| e.reporter == self.account)
            .map(|(e, _)| slash_receipt(e))
            .collect::<Result<_, _>>()?)
    }

    async fn reward_batches(&self) -> Result<Vec<RewardReceipt>, LedgerError> {
        let logs = self
            .read(
                "EpochRewarded logs",
                self.pool
                    .EpochRewarded_filter()
                    .topic3(self.account.into_word())
                    .from_block(self.opts.from_block)
                    .query(),
            )
            .await?;
        Ok(logs
            .iter()
            .map(|(e, _)| batch_receipt(e))
            .collect::<Result<_, _>>()?)
    }

    async fn record_publication(
        &self,
        publication: &SignedPublication,
    ) -> Result<PublicationReceipt, LedgerError> {
        let on_chain = publication_to(publication);
        let _writing = self.writes.lock().await;
        let mut sent = HashSet::new();
        let mut retry = self.retry("recordPublication");
        loop {
            let outcome = self.record_once(publication, &on_chain, &mut sent).await;
            if let Some(done) = retry.settle(outcome).await {
                return done;
            }
        }
    }

    async fn publications(&self) -> Result<Vec<SignedPublication>, LedgerError> {
        let n = self
            .read(
                "MiningPool.publicationCount",
                self.pool.publicationCount().call(),
            )
            .await?;
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        let mut out = Vec::new();
        for i in 0..n {
            let p = self
                .read(
                    "MiningPool.publicationAt",
                    self.pool.publicationAt(U256::from(i)).call(),
                )
                .await?;
            out.push(publication_from(p)?);
        }
        Ok(out)
    }
}
