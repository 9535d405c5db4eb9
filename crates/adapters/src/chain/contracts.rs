//! `sol!` bindings of the contracts (DESIGN §8), read from the artefacts committed under
//! `contracts/artifacts/` (ABI and bytecode; `contracts/build.sh --check` proves in CI that
//! they are the sources' build), so building hanzod needs no Solidity toolchain.
//!
//! Each binding is generic over the alloy provider: `GYMToken::new(address, provider)`
//! gives a `GYMTokenInstance<P>` whose methods build calls and transactions;
//! `GYMToken::deploy(provider, …)` deploys the bytecode.
#![allow(missing_docs, clippy::too_many_arguments)]

alloy::sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    GYMToken,
    "../../contracts/artifacts/GYMToken.json"
);

alloy::sol!(
    #[sol(rpc)]
    #[derive(Debug, PartialEq, Eq)]
    MiningPool,
    "../../contracts/artifacts/MiningPool.json"
);
