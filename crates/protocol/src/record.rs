//! Signing and checking publication records (DESIGN §7, paper §7.1 step 4):
//! [`PublicationRecord`]s signed with the orchestrator's Ed25519 key over their
//! [`PublicationRecord::canonical_bytes`] (which carry their own domain separator).

use hanzod_actors::types::NodeId;

pub use hanzod_actors::publication::{
    PublicationReceipt, PublicationRecord, SignedPublication, RECORD_DOMAIN,
};

use crate::identity::{self, Identity, SignatureError};

/// Signs `record` with `key`: the record, the signer's public key and an Ed25519 signature
/// over [`PublicationRecord::canonical_bytes`].
pub fn sign(record: PublicationRecord, key: &Identity) -> SignedPublication {
    let signature = key.sign(&[], &[&record.canonical_bytes()]);
    SignedPublication {
        record,
        signer: key.node_id().0,
        signature,
    }
}

/// Checks `publication`'s signature against its own `signer` key (strict Ed25519).
///
/// Whether that signer is an orchestrator the reader trusts is the reader's question:
/// compare `publication.signer` with the key it expects. Errors: [`SignatureError::BadKey`]
/// for a signer that is not a valid public key, [`SignatureError::Mismatch`] when the
/// signature does not cover these exact record bytes.
pub fn check_signature(publication: &SignedPublication) -> Result<(), SignatureError> {
    let key = identity::verifying_key(&NodeId(publication.signer))?;
    identity::verify(
        &key,
        &[],
        &[&publication.record.canonical_bytes()],
        &publication.signature,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::types::{JobId, Timestamp};

    fn record() -> PublicationRecord {
        PublicationRecord {
            job: JobId(1),
            epoch: 2,
            cid: "bafyweights".into(),
            config_cid: "bafkconfig".into(),
            card_cid: "bafkcard".into(),
            hf_repo: "org/m-job-1-epoch-2".into(),
            quality: 0.125,
            timestamp: Timestamp(1_700_000_000_000),
        }
    }

    #[test]
    fn a_signed_record_checks_and_any_change_fails() {
        let key = Identity::from_seed([9; 32]);
        let signed = sign(record(), &key);
        assert_eq!(signed.signer, key.node_id().0);
        assert_eq!(check_signature(&signed), Ok(()));

        let mut changed = signed.clone();
        changed.record.quality = 0.1251;
        assert_eq!(check_signature(&changed), Err(SignatureError::Mismatch));

        let mut other_signer = signed.clone();
        other_signer.signer = Identity::from_seed([8; 32]).node_id().0;
        assert_eq!(
            check_signature(&other_signer),
            Err(SignatureError::Mismatch)
        );

        let mut flipped = signed;
        flipped.signature[10] ^= 1;
        assert_eq!(check_signature(&flipped), Err(SignatureError::Mismatch));
    }

    #[test]
    fn json_round_trips() {
        let signed = sign(record(), &Identity::from_seed([3; 32]));
        let json = serde_json::to_string(&signed).expect("json");
        let back: SignedPublication = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, signed);
        assert_eq!(check_signature(&back), Ok(()));
    }
}
