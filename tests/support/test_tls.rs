//! A test CA and a TLS acceptor for `localhost` signed by it, for the adapters' https
//! tests (tests/ipfs.rs and tests/hub.rs use it).

use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A TLS acceptor (rustls with ring) serving a `localhost` certificate signed by a fresh
/// CA named `ca_name`, offering `alpn` (none when empty); the CA's certificate is written
/// as PEM to `ca_file`.
pub fn localhost_acceptor(
    ca_name: &str,
    ca_file: &Path,
    alpn: &[&[u8]],
) -> tokio_rustls::TlsAcceptor {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA cert");
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).expect("leaf params");
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("leaf cert");
    std::fs::write(ca_file, ca_cert.pem()).expect("write the CA");

    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf_cert.der().clone()],
        rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der()).into(),
    )
    .expect("server config");
    server.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsAcceptor::from(Arc::new(server))
}
