//! The orchestrator's EVM account (DESIGN §8): the secp256k1 key it sends transactions
//! with, derived from its Ed25519 key, so `ORCHESTRATOR_KEY` alone is its identity on the
//! network and on chain.
//!
//! Derivation: `secret = SHA-256("hanzod/evm-account/v1\0" ‖ sign(EVM_ACCOUNT domain, []))`,
//! the Ed25519 signature of an empty message under the account domain. Ed25519 signatures
//! are deterministic, so the same key gives the same account on every start, and nobody
//! without the key can compute the secret; the domain keeps it apart from every other use
//! of the key. A secret that is not a valid secp256k1 scalar (probability ~2^-128) is
//! hashed again.

use alloy::primitives::Address;
use alloy::signers::local::PrivateKeySigner;
use sha2::{Digest, Sha256};

use hanzod_protocol::identity::Identity;

/// The domain of the derivation (see the module docs).
pub const ACCOUNT_DOMAIN: &[u8] = hanzod_actors::domain::EVM_ACCOUNT;

/// The EVM signer of `identity` (see the module docs for the derivation).
pub fn signer(identity: &Identity) -> PrivateKeySigner {
    let mut secret: [u8; 32] =
        Sha256::digest([ACCOUNT_DOMAIN, &identity.sign(ACCOUNT_DOMAIN, &[])].concat()).into();
    loop {
        if let Ok(s) = PrivateKeySigner::from_bytes(&secret.into()) {
            return s;
        }
        secret = Sha256::digest(secret).into();
    }
}

/// The EVM address of `identity`'s account: fund it with gas and stake 50,000 GYM from it
/// before the orchestrator can lead on a real chain.
pub fn address(identity: &Identity) -> Address {
    signer(identity).address()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_is_stable_and_distinct_per_key() {
        let a = Identity::from_seed([1; 32]);
        let b = Identity::from_seed([2; 32]);
        assert_eq!(address(&a), address(&Identity::from_seed([1; 32])));
        assert_ne!(address(&a), address(&b));
    }
}
