//! A real EVM node for tests and the chain demo (feature `testkit`): anvil (Foundry 1.7.1,
//! from npm `@foundry-rs/anvil-linux-amd64`, installed by `contracts/build.sh`) on a free
//! loopback port with chain id 36900, and [`Deployment`]: the contracts deployed from the
//! committed artefacts, the pool funded, the orchestrator's account staked, and node
//! operators staked and bound.
//!
//! The anvil binary: `HANZOD_ANVIL`, else `contracts/node_modules/.../bin/anvil`, else
//! `anvil` on `PATH`. Without one, tests skip saying why, unless `CI` is set (then they
//! fail).

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use alloy::network::{EthereumWallet, TransactionBuilder};
use alloy::primitives::{Address, B256, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionRequest;
use alloy::signers::local::PrivateKeySigner;
use sha2::{Digest, Sha256};

use super::contracts::{GYMToken, MiningPool};
use super::EvmOptions;
use crate::core::types::{GymWei, NodeId};
use crate::testkit_process::{found_once, on_free_ports, on_path, ServerProcess};

/// The command that installs anvil (and forge) from npm.
pub const INSTALL_HINT: &str = "contracts/build.sh (or: cd contracts && npm ci)";

/// The chain id tests run on: the Hanzo chain's (DESIGN §8).
pub const CHAIN_ID: u64 = 36900;

/// anvil's first development account (mnemonic `test test … junk`), which deploys the
/// contracts and holds the GYM supply: public test material, never a real key.
pub const DEPLOYER_KEY: &str = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

/// How long anvil may take to answer after it starts.
const START_DEADLINE: Duration = Duration::from_secs(20);

/// Why anvil could not be found or started, or a deployment failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct AnvilError(pub String);

fn discover() -> Result<PathBuf, AnvilError> {
    if let Some(p) = std::env::var_os("HANZOD_ANVIL").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let npm = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contracts/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil");
    if npm.is_file() {
        return Ok(npm);
    }
    on_path("anvil").ok_or_else(|| {
        AnvilError(format!(
            "no anvil: not in contracts/node_modules nor on PATH (install with `{INSTALL_HINT}`, \
             or set HANZOD_ANVIL)"
        ))
    })
}

/// The anvil binary the tests use (looked up once per process; the first call prints it).
pub fn find() -> Result<PathBuf, AnvilError> {
    static FOUND: OnceLock<Result<String, AnvilError>> = OnceLock::new();
    found_once(&FOUND, "test EVM node", || {
        discover().map(|p| p.display().to_string())
    })
    .map(PathBuf::from)
}

/// Whether a test may skip for want of anvil: `Ok(None)` to run, `Ok(Some(why))` to skip
/// (only when `CI` is unset), `Err` to fail.
pub fn skip_reason() -> Result<Option<String>, AnvilError> {
    crate::testkit_process::skip_reason(find().map(|p| p.display().to_string())).map_err(AnvilError)
}

/// For a test about to start anvil: `true` (after printing `SKIPPED: why`) when there is
/// none and `CI` is unset; `false` to run.
///
/// # Panics
/// When there is no anvil and `CI` is set: under CI a missing node is a failure.
pub fn skip_test() -> bool {
    match skip_reason() {
        Ok(None) => false,
        Ok(Some(why)) => {
            eprintln!("SKIPPED: {why}");
            true
        }
        Err(e) => panic!("{e}"),
    }
}

/// `eth_chainId` over a plain socket: the chain id when the node answers.
fn chain_id(port: u16) -> Option<u64> {
    use std::io::{Read, Write};
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
    s.write_all(
        format!(
            "POST / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .ok()?;
    let mut reply = Vec::new();
    s.take(64 << 10).read_to_end(&mut reply).ok()?;
    let text = String::from_utf8_lossy(&reply);
    let json: serde_json::Value = serde_json::from_str(text.split("\r\n\r\n").nth(1)?).ok()?;
    u64::from_str_radix(json.get("result")?.as_str()?.trim_start_matches("0x"), 16).ok()
}

/// An anvil node on `127.0.0.1` with chain id [`CHAIN_ID`], mining each transaction at
/// once. Killed (SIGKILL) and its directory removed when dropped.
#[derive(Debug)]
pub struct AnvilNode {
    process: Option<ServerProcess>,
    port: u16,
    dir: PathBuf,
}

impl AnvilNode {
    /// Starts anvil ([`find`]) on a free loopback port and waits until it answers
    /// `eth_chainId` with [`CHAIN_ID`].
    ///
    /// Errors: no anvil, or it exits or does not answer in time (quoting its log).
    pub async fn start() -> Result<AnvilNode, AnvilError> {
        let anvil = find()?;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hanzod-anvil-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| AnvilError(format!("cannot create {}: {e}", dir.display())))?;
        let mut node = AnvilNode {
            process: None,
            port: 0,
            dir,
        };
        let log = node.dir.join("anvil.log");
        let (anvil, log) = (&anvil, log.as_path());
        let (port, process) = on_free_ports(3, |port, _| async move {
            let mut cmd = Command::new(anvil);
            cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--chain-id", &CHAIN_ID.to_string()])
                .args(["--accounts", "2", "--balance", "1000000"])
                .arg("--no-request-size-limit")
                .stdin(std::process::Stdio::null());
            let process = ServerProcess::spawn(&mut cmd, log, &anvil.display())?;
            let (process, _) = process
                .wait_ready(
                    START_DEADLINE,
                    Duration::from_millis(50),
                    "eth_chainId",
                    || async move { chain_id(port).filter(|&id| id == CHAIN_ID) },
                )
                .await
                .map_err(|e| format!("anvil on port {port}: {e}"))?;
            Ok((port, process))
        })
        .await
        .map_err(AnvilError)?;
        node.port = port;
        node.process = Some(process);
        Ok(node)
    }

    /// `http://127.0.0.1:<port>`: the `HANZO_RPC` of this node.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the process (SIGKILL). Does nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}

impl Drop for AnvilNode {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rpc_client(url: &str) -> Result<alloy::rpc::client::RpcClient, AnvilError> {
    super::evm::rpc_client(url, None).map_err(AnvilError)
}

/// A provider on `url` that signs with `signer` (alloy's recommended fillers).
pub fn wallet_provider(url: &str, signer: PrivateKeySigner) -> Result<DynProvider, AnvilError> {
    Ok(ProviderBuilder::new()
        .wallet(EthereumWallet::from(signer))
        .connect_client(rpc_client(url)?)
        .erased())
}

/// A read-only provider on `url`.
pub fn read_provider(url: &str) -> Result<DynProvider, AnvilError> {
    Ok(ProviderBuilder::new()
        .disable_recommended_fillers()
        .connect_client(rpc_client(url)?)
        .erased())
}

/// The deployer's signer ([`DEPLOYER_KEY`]).
pub fn deployer() -> PrivateKeySigner {
    DEPLOYER_KEY.parse().expect("a valid key literal")
}

/// The test operator account of `node`: a key derived from the node key (SHA-256 of a
/// domain and the key), so runs are reproducible.
pub fn operator_of(node: &NodeId) -> PrivateKeySigner {
    let mut secret: [u8; 32] =
        Sha256::digest([b"hanzod/test-operator/v1\0".as_slice(), &node.0].concat()).into();
    loop {
        if let Ok(s) = PrivateKeySigner::from_bytes(&secret.into()) {
            return s;
        }
        secret = Sha256::digest(secret).into();
    }
}

/// What [`Deployment::deploy`] sets up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployOptions {
    /// The GYM supply minted to the deployer, GYM wei.
    pub supply: GymWei,
    /// `GYMToken.unbondingDelay`, seconds.
    pub unbonding_delay_s: u64,
    /// `GYMToken.penaltyWindow`, seconds.
    pub penalty_window_s: u64,
    /// GYM sent to the MiningPool for rewards, GYM wei.
    pub pool_funding: GymWei,
}

impl Default for DeployOptions {
    fn default() -> Self {
        DeployOptions {
            supply: GymWei::gym(100_000_000),
            unbonding_delay_s: 7 * 24 * 3600,
            penalty_window_s: 24 * 3600,
            pool_funding: GymWei::gym(1_000_000),
        }
    }
}

/// The contracts on a node, and the deployer's provider for setting up accounts.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// The node's URL.
    pub url: String,
    /// The `GYMToken` contract.
    pub token: Address,
    /// The `MiningPool` contract.
    pub pool: Address,
    /// The block the token was deployed in.
    pub from_block: u64,
    deployer: DynProvider,
}

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> AnvilError + '_ {
    move |e| AnvilError(format!("{what}: {e}"))
}

/// Awaits `send`'s transaction and checks it succeeded.
async fn mined<F, T>(what: &str, send: F) -> Result<(), AnvilError>
where
    F: std::future::Future<
        Output = Result<alloy::providers::PendingTransactionBuilder<alloy::network::Ethereum>, T>,
    >,
    T: std::fmt::Display,
{
    let receipt = send
        .await
        .map_err(|e| err(what)(&e))?
        .with_timeout(Some(Duration::from_secs(30)))
        .get_receipt()
        .await
        .map_err(|e| err(what)(&e))?;
    if !receipt.status() {
        return Err(AnvilError(format!("{what}: reverted")));
    }
    Ok(())
}

impl Deployment {
    /// Deploys `GYMToken` and `MiningPool` from the committed artefacts with the
    /// [`deployer`] on the node at `url`, and funds the pool.
    ///
    /// Errors: any transaction failing (the message names it).
    pub async fn deploy(url: &str, opts: &DeployOptions) -> Result<Deployment, AnvilError> {
        Deployment::deploy_with(url, self::deployer(), opts).await
    }

    /// As [`Deployment::deploy`], from `deployer` (which must hold gas), which receives the
    /// GYM supply.
    ///
    /// Errors: any transaction failing (the message names it).
    pub async fn deploy_with(
        url: &str,
        deployer: PrivateKeySigner,
        opts: &DeployOptions,
    ) -> Result<Deployment, AnvilError> {
        let holder = deployer.address();
        let deployer = wallet_provider(url, deployer)?;
        let token = GYMToken::deploy(
            deployer.clone(),
            holder,
            U256::from(opts.supply.0),
            opts.unbonding_delay_s,
            opts.penalty_window_s,
        )
        .await
        .map_err(|e| err("deploying GYMToken")(&e))?;
        let from_block = deployer
            .get_block_number()
            .await
            .map_err(|e| err("eth_blockNumber")(&e))?;
        let pool = MiningPool::deploy(deployer.clone(), *token.address())
            .await
            .map_err(|e| err("deploying MiningPool")(&e))?;
        let d = Deployment {
            url: url.to_string(),
            token: *token.address(),
            pool: *pool.address(),
            from_block,
            deployer,
        };
        d.transfer_gym(d.pool, opts.pool_funding).await?;
        Ok(d)
    }

    /// The adapter options for this deployment.
    pub fn options(&self) -> EvmOptions {
        EvmOptions {
            chain_id: CHAIN_ID,
            token: self.token,
            pool: self.pool,
            from_block: self.from_block,
            ..EvmOptions::default()
        }
    }

    /// Sends `amount` GYM wei from the deployer to `to`.
    pub async fn transfer_gym(&self, to: Address, amount: GymWei) -> Result<(), AnvilError> {
        let token = GYMToken::new(self.token, self.deployer.clone());
        mined(
            "GYM transfer",
            token.transfer(to, U256::from(amount.0)).send(),
        )
        .await
    }

    /// Gives `account` 10 ETH for gas and `stake` GYM, and stakes it from `account`.
    pub async fn fund_and_stake(
        &self,
        account: &PrivateKeySigner,
        stake: GymWei,
    ) -> Result<(), AnvilError> {
        let to = account.address();
        let eth = TransactionRequest::default()
            .with_to(to)
            .with_value(U256::from(10u128 * 1_000_000_000_000_000_000));
        mined("ETH transfer", self.deployer.send_transaction(eth)).await?;
        self.transfer_gym(to, stake).await?;
        let own = wallet_provider(&self.url, account.clone())?;
        let token = GYMToken::new(self.token, own);
        mined("stake", token.stake(U256::from(stake.0)).send()).await
    }

    /// Funds and stakes `stake` for `node`'s [`operator_of`] account (a test account) and
    /// binds the node key to it; returns the operator's address.
    pub async fn stake_and_bind(
        &self,
        node: &NodeId,
        stake: GymWei,
    ) -> Result<Address, AnvilError> {
        let operator = operator_of(node);
        self.fund_and_stake(&operator, stake).await?;
        let own = wallet_provider(&self.url, operator.clone())?;
        let token = GYMToken::new(self.token, own);
        mined("bindNode", token.bindNode(B256::from(node.0)).send()).await?;
        Ok(operator.address())
    }

    /// The GYM balance of `account`, GYM wei.
    pub async fn gym_balance(&self, account: Address) -> Result<GymWei, AnvilError> {
        let token = GYMToken::new(self.token, self.deployer.clone());
        let b = token
            .balanceOf(account)
            .call()
            .await
            .map_err(|e| err("balanceOf")(&e))?;
        u128::try_from(b)
            .map(GymWei)
            .map_err(|_| AnvilError(format!("balance {b} exceeds u128")))
    }

    /// Sets the timestamp of the next block (anvil's `evm_setNextBlockTimestamp`), unix
    /// seconds.
    pub async fn set_next_block_timestamp(&self, seconds: u64) -> Result<(), AnvilError> {
        self.deployer
            .raw_request::<_, serde_json::Value>("evm_setNextBlockTimestamp".into(), (seconds,))
            .await
            .map(|_| ())
            .map_err(|e| err("evm_setNextBlockTimestamp")(&e))
    }

    /// The latest block's timestamp, unix seconds.
    pub async fn latest_timestamp(&self) -> Result<u64, AnvilError> {
        let block = self
            .deployer
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await
            .map_err(|e| err("eth_getBlockByNumber")(&e))?
            .ok_or_else(|| AnvilError("no latest block".into()))?;
        Ok(block.header.timestamp)
    }
}

/// What an [`RpcProxy`] does with the requests it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards every request and its answer.
    Forward,
    /// Answers every request 503 without forwarding it: the endpoint is down.
    Down,
    /// Forwards every request, but loses the answer to each `eth_sendRawTransaction`
    /// (answers 502): the transaction is sent and mined, the sender never hears of it.
    LoseSendAnswers,
}

#[derive(Debug)]
struct ProxyState {
    upstream: String,
    http: reqwest::Client,
    mode: std::sync::Mutex<ProxyMode>,
    lost: AtomicU64,
    sends: AtomicU64,
    refused: AtomicU64,
}

/// A JSON-RPC endpoint in front of a node, on a free loopback port, whose failures a test
/// switches ([`ProxyMode`]): the RPC endpoint killed, or answers lost. Stops when dropped.
#[derive(Debug)]
pub struct RpcProxy {
    state: std::sync::Arc<ProxyState>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl RpcProxy {
    /// Starts a proxy to `upstream` (a JSON-RPC URL) in [`ProxyMode::Forward`].
    ///
    /// Errors: no loopback port can be bound.
    pub async fn start(upstream: &str) -> Result<RpcProxy, AnvilError> {
        use axum::body::Bytes;
        use axum::extract::State;
        use axum::http::StatusCode;
        use axum::response::{IntoResponse, Response};
        async fn forward(State(s): State<std::sync::Arc<ProxyState>>, body: Bytes) -> Response {
            let mode = *s.mode.lock().unwrap_or_else(|p| p.into_inner());
            if mode == ProxyMode::Down {
                s.refused.fetch_add(1, Ordering::Relaxed);
                return (StatusCode::SERVICE_UNAVAILABLE, "endpoint down").into_response();
            }
            let is_send =
                std::str::from_utf8(&body).is_ok_and(|b| b.contains("eth_sendRawTransaction"));
            if is_send {
                s.sends.fetch_add(1, Ordering::Relaxed);
            }
            let answer = s
                .http
                .post(&s.upstream)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let answer = match answer {
                Ok(a) => a,
                Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
            };
            let status = answer.status().as_u16();
            let bytes = answer.bytes().await.unwrap_or_default();
            if is_send && mode == ProxyMode::LoseSendAnswers {
                s.lost.fetch_add(1, Ordering::Relaxed);
                return (StatusCode::BAD_GATEWAY, "answer lost").into_response();
            }
            (
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                [("content-type", "application/json")],
                bytes,
            )
                .into_response()
        }
        let state = std::sync::Arc::new(ProxyState {
            upstream: upstream.to_string(),
            // reqwest's own default client has no TLS provider in this build.
            http: crate::publish::tls::client_builder(
                false,
                None,
                crate::publish::tls::Alpn::Http1,
            )
            .and_then(|b| {
                b.build()
                    .map_err(|e| crate::publish::tls::TlsError(e.to_string()))
            })
            .map_err(|e| AnvilError(format!("HTTP client: {e}")))?,
            mode: std::sync::Mutex::new(ProxyMode::Forward),
            lost: AtomicU64::new(0),
            sends: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| AnvilError(format!("cannot bind the proxy: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| AnvilError(format!("proxy address: {e}")))?;
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(RpcProxy { state, addr, task })
    }

    /// The proxy's URL: give it as `HANZO_RPC`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches what the proxy does from now on.
    pub fn set_mode(&self, mode: ProxyMode) {
        *self.state.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }

    /// How many `eth_sendRawTransaction` answers were lost.
    pub fn lost_answers(&self) -> u64 {
        self.state.lost.load(Ordering::Relaxed)
    }

    /// How many requests were refused while the proxy was [`ProxyMode::Down`].
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// How many `eth_sendRawTransaction` requests were forwarded.
    pub fn sends(&self) -> u64 {
        self.state.sends.load(Ordering::Relaxed)
    }
}

impl Drop for RpcProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Stakes `stake` GYM wei from `operator`'s own balance on the `GYMToken` at `token` (on the
/// node at `url`) and binds `node` to it (`hanzod chain bind`). The operator must hold the
/// GYM and gas.
///
/// Errors: a transaction failing (the message names it: `stake` reverts when the balance
/// is short, `bindNode` when another operator holds the key).
pub async fn stake_and_bind_with(
    url: &str,
    token: Address,
    operator: PrivateKeySigner,
    node: &NodeId,
    stake: GymWei,
) -> Result<(), AnvilError> {
    let own = wallet_provider(url, operator)?;
    let token = GYMToken::new(token, own);
    if stake.0 > 0 {
        mined("stake", token.stake(U256::from(stake.0)).send()).await?;
    }
    mined("bindNode", token.bindNode(B256::from(node.0)).send()).await
}
