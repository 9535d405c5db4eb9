//! The TLS configuration of the publication adapters' HTTP clients ([`super::kubo`] and
//! [`super::hub`]): rustls with the `ring` provider chosen here (no process-wide default
//! provider is needed or installed), the safe default protocol versions, and the roots of
//! one PEM bundle.
//!
//! The bundle is, in order: the adapter's `ca_file` option; `SSL_CERT_FILE` (when set and
//! not empty); the first of [`SYSTEM_BUNDLES`] that exists. It is read when the URL is
//! `https://`, or whenever a `ca_file` is given (a file named but unreadable is a
//! configuration error even for `http://`); a plain `http://` client without one gets an
//! empty root store (reqwest needs a TLS backend either way).
//!
//! Each adapter maps a [`TlsError`] to its own error type at its call site.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The system CA bundles looked for, in order, when neither a `ca_file` nor
/// `SSL_CERT_FILE` names one (Debian/Ubuntu/Alpine, Fedora/RHEL, openSUSE, macOS/BSD).
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The environment variable naming a PEM bundle to trust instead of the system's.
pub const CERT_FILE_ENV: &str = "SSL_CERT_FILE";

/// Why no TLS configuration could be built; the message names the bundle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

/// The protocols a client offers through ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `http/1.1` only.
    Http1,
    /// `h2`, then `http/1.1`.
    H2OrHttp1,
}

impl Alpn {
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::H2OrHttp1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// The PEM bundle to trust: `ca_file`, else `SSL_CERT_FILE` (when not empty), else the first
/// of [`SYSTEM_BUNDLES`] that exists; `None` when there is none.
pub fn ca_bundle(ca_file: Option<&Path>) -> Option<PathBuf> {
    ca_file.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(CERT_FILE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                SYSTEM_BUNDLES
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            })
    })
}

/// The root certificates of [`ca_bundle`]`(ca_file)`. Certificates rustls cannot use are
/// skipped (a system bundle may hold some).
///
/// Errors: no bundle at all, a bundle that cannot be read or is not PEM, or one without a
/// usable certificate (each message names the file).
pub fn root_store(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, TlsError> {
    let path = ca_bundle(ca_file).ok_or_else(|| {
        TlsError(format!(
            "no CA certificates for https: none of {} exists; install ca-certificates, set \
             {CERT_FILE_ENV}, or name a CA file",
            SYSTEM_BUNDLES.join(", ")
        ))
    })?;
    let bad = |e: &dyn std::fmt::Display| TlsError(format!("CA bundle {}: {e}", path.display()));
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _unusable) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(bad(&"no usable certificate"));
    }
    Ok(roots)
}

/// A reqwest client builder on a rustls client configuration: the `ring` provider, the
/// safe default protocol versions, no client certificate, `alpn`, and the roots of
/// [`root_store`] when `https` or a `ca_file` is given (else none). The caller adds its
/// timeouts, redirect and proxy policy.
///
/// Errors: as [`root_store`], or the provider refusing the protocol versions.
pub fn client_builder(
    https: bool,
    ca_file: Option<&Path>,
    alpn: Alpn,
) -> Result<reqwest::ClientBuilder, TlsError> {
    let roots = if https || ca_file.is_some() {
        root_store(ca_file)?
    } else {
        rustls::RootCertStore::empty()
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS configuration: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.protocols();
    Ok(reqwest::Client::builder().tls_backend_preconfigured(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_needs_no_roots() {
        assert_eq!(Alpn::Http1.protocols(), vec![b"http/1.1".to_vec()]);
        assert_eq!(
            Alpn::H2OrHttp1.protocols(),
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        for alpn in [Alpn::Http1, Alpn::H2OrHttp1] {
            assert!(client_builder(false, None, alpn).unwrap().build().is_ok());
        }
    }

    #[test]
    fn a_named_ca_file_wins_and_must_be_usable() {
        let missing = Path::new("/nonexistent/ca.pem");
        assert_eq!(ca_bundle(Some(missing)).as_deref(), Some(missing));
        for https in [true, false] {
            let e = client_builder(https, Some(missing), Alpn::Http1).unwrap_err();
            assert!(e.0.contains("/nonexistent/ca.pem"), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("hanzod-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = root_store(Some(&empty)).unwrap_err();
        assert!(e.0.contains("no usable certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_system_bundle_serves_https() {
        if std::env::var_os(CERT_FILE_ENV).is_none() && Path::new(SYSTEM_BUNDLES[0]).is_file() {
            assert_eq!(
                ca_bundle(None).as_deref(),
                Some(Path::new(SYSTEM_BUNDLES[0]))
            );
            assert!(!root_store(None).unwrap().is_empty());
            assert!(client_builder(true, None, Alpn::H2OrHttp1).is_ok());
        }
    }
}
