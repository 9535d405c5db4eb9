//! Deploying and setting up the contracts on an EVM node (DESIGN §8): [`Deployment`] (the
//! contracts deployed from the committed artefacts, the pool funded, the orchestrator's
//! account staked, node operators staked and bound), for `hanzod chain deploy` and
//! `hanzod chain bind`, and for the test kit's anvil node.

use std::time::Duration;

use alloy::network::{EthereumWallet, TransactionBuilder};
use alloy::primitives::{Address, B256, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionRequest;
use alloy::signers::local::PrivateKeySigner;
use hanzod_actors::types::{GymWei, NodeId};
use sha2::{Digest, Sha256};

use super::contracts::{GYMToken, MiningPool};
use super::EvmOptions;

/// anvil's first development account (mnemonic `test test … junk`), which deploys the
/// contracts and holds the GYM supply: public test material, never a real key.
pub const DEPLOYER_KEY: &str = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

/// The chain id of a local development chain (anvil, compose's `anvil`): 36900, the
/// default `HANZO_CHAIN_ID` (DESIGN §8).
pub const CHAIN_ID: u64 = 36900;

/// Why a deployment or a setup transaction failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct DeployError(pub String);

fn rpc_client(url: &str) -> Result<alloy::rpc::client::RpcClient, DeployError> {
    super::evm::rpc_client(url, None).map_err(|e| DeployError(e.to_string()))
}

/// A provider on `url` that signs with `signer` (alloy's recommended fillers).
pub fn wallet_provider(url: &str, signer: PrivateKeySigner) -> Result<DynProvider, DeployError> {
    Ok(ProviderBuilder::new()
        .wallet(EthereumWallet::from(signer))
        .connect_client(rpc_client(url)?)
        .erased())
}

/// A read-only provider on `url`.
pub fn read_provider(url: &str) -> Result<DynProvider, DeployError> {
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
        Sha256::digest([hanzod_actors::domain::TEST_OPERATOR, &node.0].concat()).into();
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

fn err(what: &str) -> impl Fn(&dyn std::fmt::Display) -> DeployError + '_ {
    move |e| DeployError(format!("{what}: {e}"))
}

/// Awaits `send`'s transaction and checks it succeeded.
async fn mined<F, T>(what: &str, send: F) -> Result<(), DeployError>
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
        return Err(DeployError(format!("{what}: reverted")));
    }
    Ok(())
}

impl Deployment {
    /// Deploys `GYMToken` and `MiningPool` from the committed artefacts with the
    /// [`deployer`] on the node at `url`, and funds the pool.
    ///
    /// Errors: any transaction failing (the message names it).
    pub async fn deploy(url: &str, opts: &DeployOptions) -> Result<Deployment, DeployError> {
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
    ) -> Result<Deployment, DeployError> {
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
    pub async fn transfer_gym(&self, to: Address, amount: GymWei) -> Result<(), DeployError> {
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
    ) -> Result<(), DeployError> {
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
    ) -> Result<Address, DeployError> {
        let operator = operator_of(node);
        self.fund_and_stake(&operator, stake).await?;
        let own = wallet_provider(&self.url, operator.clone())?;
        let token = GYMToken::new(self.token, own);
        mined("bindNode", token.bindNode(B256::from(node.0)).send()).await?;
        Ok(operator.address())
    }

    /// The GYM balance of `account`, GYM wei.
    pub async fn gym_balance(&self, account: Address) -> Result<GymWei, DeployError> {
        let token = GYMToken::new(self.token, self.deployer.clone());
        let b = token
            .balanceOf(account)
            .call()
            .await
            .map_err(|e| err("balanceOf")(&e))?;
        u128::try_from(b)
            .map(GymWei)
            .map_err(|_| DeployError(format!("balance {b} exceeds u128")))
    }

    /// Sets the timestamp of the next block (anvil's `evm_setNextBlockTimestamp`), unix
    /// seconds.
    pub async fn set_next_block_timestamp(&self, seconds: u64) -> Result<(), DeployError> {
        self.deployer
            .raw_request::<_, serde_json::Value>("evm_setNextBlockTimestamp".into(), (seconds,))
            .await
            .map(|_| ())
            .map_err(|e| err("evm_setNextBlockTimestamp")(&e))
    }

    /// The latest block's timestamp, unix seconds.
    pub async fn latest_timestamp(&self) -> Result<u64, DeployError> {
        let block = self
            .deployer
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await
            .map_err(|e| err("eth_getBlockByNumber")(&e))?
            .ok_or_else(|| DeployError("no latest block".into()))?;
        Ok(block.header.timestamp)
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
) -> Result<(), DeployError> {
    let own = wallet_provider(url, operator)?;
    let token = GYMToken::new(token, own);
    if stake.0 > 0 {
        mined("stake", token.stake(U256::from(stake.0)).send()).await?;
    }
    mined("bindNode", token.bindNode(B256::from(node.0)).send()).await
}
