//! Ed25519 identities of nodes and of the orchestrator (DESIGN §3), and the signed byte
//! strings of the protocol.
//!
//! A key file holds the 32-byte secret seed as 64 hex digits and a newline (written with
//! mode 0600 on Unix). The node's id is the public key.

use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use hanzod_actors::types::NodeId;

/// Why a key could not be loaded, parsed or used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The text is not 64 hex digits.
    #[error("{what}: a key is 64 hex digits (a 32-byte Ed25519 seed)")]
    Format {
        /// Where the text came from.
        what: String,
    },
    /// Refused to overwrite an existing key file.
    #[error("{} exists; pass --force to overwrite it", path.display())]
    Exists {
        /// The key file.
        path: std::path::PathBuf,
    },
    /// The key's folder does not exist (it is not created: a mistyped path should fail).
    #[error(
        "{} does not exist (or is not a folder); create the folder first",
        folder.display()
    )]
    NoFolder {
        /// The folder.
        folder: std::path::PathBuf,
    },
}

/// A signing identity.
#[derive(Clone)]
pub struct Identity {
    key: SigningKey,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({})", self.node_id().short())
    }
}

impl Identity {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Identity {
        Identity {
            key: SigningKey::generate(&mut rand::rngs::OsRng),
        }
    }

    /// A key from a 32-byte seed (tests, load generators).
    pub fn from_seed(seed: [u8; 32]) -> Identity {
        Identity {
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// Parses 64 hex digits (surrounding whitespace ignored); `what` names the source in errors.
    pub fn from_hex(text: &str, what: &str) -> Result<Identity, KeyError> {
        let mut seed = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut seed).map_err(|_| KeyError::Format {
            what: what.to_string(),
        })?;
        Ok(Identity::from_seed(seed))
    }

    /// Reads a key file.
    pub fn load(path: &Path) -> Result<Identity, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Identity::from_hex(&text, &path.display().to_string())
    }

    /// Writes the key to `path` (mode 0600); refuses to overwrite unless `force`, and refuses
    /// a path whose folder does not exist ([`KeyError::NoFolder`]).
    pub fn save(&self, path: &Path, force: bool) -> Result<(), KeyError> {
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        if path.exists() && !force {
            return Err(KeyError::Exists {
                path: path.to_path_buf(),
            });
        }
        // A missing folder is more likely a mistyped path than a wish to create one.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.is_dir() {
                return Err(KeyError::NoFolder {
                    folder: dir.to_path_buf(),
                });
            }
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(path).map_err(io)?;
        std::io::Write::write_all(
            &mut f,
            format!("{}\n", hex::encode(self.key.to_bytes())).as_bytes(),
        )
        .map_err(io)
    }

    /// Loads `path` if it exists, else generates a key and saves it there.
    pub fn load_or_generate(path: &Path) -> Result<(Identity, bool), KeyError> {
        if path.exists() {
            Ok((Identity::load(path)?, false))
        } else {
            let id = Identity::generate();
            id.save(path, false)?;
            Ok((id, true))
        }
    }

    /// The node id: the public key.
    pub fn node_id(&self) -> NodeId {
        NodeId(self.key.verifying_key().to_bytes())
    }

    /// Signs `domain || parts…`.
    pub fn sign(&self, domain: &[u8], parts: &[&[u8]]) -> [u8; 64] {
        self.key.sign(&signed_bytes(domain, parts)).to_bytes()
    }
}

fn signed_bytes(domain: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(domain.len() + parts.iter().map(|p| p.len()).sum::<usize>());
    msg.extend_from_slice(domain);
    for p in parts {
        msg.extend_from_slice(p);
    }
    msg
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The key bytes are not a valid Ed25519 public key.
    #[error("not an Ed25519 public key")]
    BadKey,
    /// Not 64 bytes.
    #[error("signature is {0} bytes, want 64")]
    Length(usize),
    /// Does not verify.
    #[error("signature does not verify")]
    Mismatch,
}

/// A node's public key, parsed once per session and reused for every message.
pub fn verifying_key(node: &NodeId) -> Result<VerifyingKey, SignatureError> {
    VerifyingKey::from_bytes(node.as_bytes()).map_err(|_| SignatureError::BadKey)
}

/// Verifies `signature` over `domain || parts…` (strict verification: no malleable or
/// small-order forms).
pub fn verify(
    key: &VerifyingKey,
    domain: &[u8],
    parts: &[&[u8]],
    signature: &[u8],
) -> Result<(), SignatureError> {
    let sig: [u8; 64] = signature
        .try_into()
        .map_err(|_| SignatureError::Length(signature.len()))?;
    if key.is_weak() {
        return Err(SignatureError::BadKey);
    }
    key.verify_strict(&signed_bytes(domain, parts), &Signature::from_bytes(&sig))
        .map_err(|_| SignatureError::Mismatch)
}

/// The bytes a GPU attester signs (DESIGN §3): `node id || model || vram (u64 BE) || major
/// || minor`, under the domain [`hanzod_actors::domain::GPU`].
pub fn gpu_attestation_bytes(node: &NodeId, model: &str, vram: u64, cap: (u8, u8)) -> Vec<u8> {
    let mut b = Vec::with_capacity(32 + model.len() + 10);
    b.extend_from_slice(node.as_bytes());
    b.extend_from_slice(model.as_bytes());
    b.extend_from_slice(&vram.to_be_bytes());
    b.push(cap.0);
    b.push(cap.1);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_domain_separation() {
        let id = Identity::from_seed([1; 32]);
        let key = verifying_key(&id.node_id()).unwrap();
        let sig = id.sign(b"a", &[b"bc"]);
        assert_eq!(verify(&key, b"a", &[b"bc"], &sig), Ok(()));
        assert_eq!(
            verify(&key, b"ab", &[b"c"], &sig),
            Ok(()),
            "domain is a prefix"
        );
        assert_eq!(
            verify(&key, b"x", &[b"bc"], &sig),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(&key, b"a", &[b"bc"], &sig[..63]),
            Err(SignatureError::Length(63))
        );
        let other = Identity::from_seed([2; 32]);
        let okey = verifying_key(&other.node_id()).unwrap();
        assert_eq!(
            verify(&okey, b"a", &[b"bc"], &sig),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn key_file_round_trip_refuses_overwrite() {
        let dir = std::env::temp_dir().join(format!("hanzod-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node.key");
        let _ = std::fs::remove_file(&path);
        let (a, created) = Identity::load_or_generate(&path).unwrap();
        assert!(created);
        let (b, created) = Identity::load_or_generate(&path).unwrap();
        assert!(!created);
        assert_eq!(a.node_id(), b.node_id());
        assert!(matches!(a.save(&path, false), Err(KeyError::Exists { .. })));
        std::fs::write(&path, "zz\n").unwrap();
        assert!(matches!(
            Identity::load(&path),
            Err(KeyError::Format { .. })
        ));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            Identity::generate().save(&path, true).unwrap();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    /// Regression: `node --key` created missing parent folders, so a mistyped path made a
    /// new folder and a new identity instead of failing.
    #[test]
    fn a_key_is_not_written_into_a_missing_folder() {
        let dir = std::env::temp_dir().join(format!("hanzod-nokey-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join("node.key");
        assert!(matches!(
            Identity::load_or_generate(&path),
            Err(KeyError::NoFolder { .. })
        ));
        assert!(!dir.exists(), "no folder was created");
    }
}
