//! Assembles the gRPC server: the `hanzod.v1` services, `grpc.health.v1`, server reflection
//! (v1 and v1alpha, so `grpcurl` works without the .proto files), message size limits,
//! HTTP/2 keep-alive, the optional admin token, and TLS 1.3 (rustls, ring provider) with
//! optional mutual TLS.

use std::sync::Arc;
use std::time::Duration;

use hanzod_actors::OrchestratorHandle;
use hanzod_proto::v1::admin_service_server::AdminServiceServer;
use hanzod_proto::v1::job_service_server::JobServiceServer;
use hanzod_proto::v1::node_service_server::NodeServiceServer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic::{Request, Status};

use super::jobs::{AdminServiceImpl, JobServiceImpl};
use super::node::{NodeServiceImpl, NodeServiceSettings};
use super::sessions::Sessions;
use super::upload::{DeltaUploads, UploadSettings};
use hanzod_store::blobs::BlobStore;
use hanzod_train::catalog::ModelCatalog;

/// The names `grpc.health.v1` reports: the whole server ("") and each hanzod service.
const HEALTH_NAMES: [&str; 4] = [
    "",
    "hanzod.v1.NodeService",
    "hanzod.v1.JobService",
    "hanzod.v1.AdminService",
];

/// Transport settings of the daemon's gRPC server.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Largest accepted message, bytes (larger: `RESOURCE_EXHAUSTED`).
    pub max_message_bytes: usize,
    /// HTTP/2 PING interval, ms; a peer that does not answer within `keepalive_timeout_ms`
    /// is dropped (its session closes, so its node is failed at once).
    pub keepalive_interval_ms: u64,
    /// See `keepalive_interval_ms`.
    pub keepalive_timeout_ms: u64,
    /// Most concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// When set, JobService and AdminService calls need `authorization: Bearer <token>`.
    pub admin_token: Option<String>,
    /// The node service's limits.
    pub node: NodeServiceSettings,
    /// Delta upload limits.
    pub uploads: UploadSettings,
    /// SubmitJob's validation budget.
    pub admission: super::admission::AdmissionSettings,
}

/// Why the server could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// TLS material is unreadable or invalid.
    #[error("TLS: {0}")]
    Tls(#[from] TlsSetupError),
    /// Reflection could not be built from the descriptors.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A socket could not be bound or accepted.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What is wrong with the TLS material ([`ServeError::Tls`]).
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// The certificate file is not PEM.
    #[error("certificate: {0}")]
    Certificate(#[source] rustls::pki_types::pem::Error),
    /// The certificate file holds no certificate.
    #[error("certificate file holds no certificate")]
    NoCertificate,
    /// The key file is not a PEM private key.
    #[error("key: {0}")]
    Key(#[source] rustls::pki_types::pem::Error),
    /// The client CA bundle is unreadable, or no verifier can be built from it.
    #[error("client CA: {0}")]
    ClientCa(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// rustls refused the configuration (the key does not match the certificate, …).
    #[error("{0}")]
    Rustls(#[source] rustls::Error),
}

#[derive(Clone)]
struct AdminToken(Option<Arc<str>>);

impl Interceptor for AdminToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = &self.0 else {
            return Ok(request);
        };
        let got = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match got {
            Some(t) if constant_time_eq(t.as_bytes(), want.as_bytes()) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong admin token")),
            None => Err(Status::unauthenticated(
                "this daemon needs `authorization: Bearer <admin token>`",
            )),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Rewrites tonic's status for a message over the size limit (`OUT_OF_RANGE`, "decoded
/// message length too large") to `RESOURCE_EXHAUSTED`, the code the gRPC specification
/// gives for exceeding a configured message size, on responses whose status is in the
/// headers (every refused unary call).
#[derive(Clone)]
struct TooLargeIsResourceExhausted<S>(S);

/// Layer of [`TooLargeIsResourceExhausted`].
#[derive(Clone, Copy, Debug)]
struct TooLargeLayer;

impl<S> tower::Layer<S> for TooLargeLayer {
    type Service = TooLargeIsResourceExhausted<S>;
    fn layer(&self, inner: S) -> Self::Service {
        TooLargeIsResourceExhausted(inner)
    }
}

impl<S, B, R> tower::Service<tonic::codegen::http::Request<B>> for TooLargeIsResourceExhausted<S>
where
    S: tower::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<R>,
    >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util::future::MapOk<S::Future, fn(S::Response) -> S::Response>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        use futures_util::TryFutureExt;
        fn fix<R>(mut res: tonic::codegen::http::Response<R>) -> tonic::codegen::http::Response<R> {
            let too_large = res.headers().get("grpc-status").is_some_and(|v| v == "11")
                && res.headers().get("grpc-message").is_some_and(|m| {
                    let m = m.as_bytes();
                    m.windows(22).any(|w| w == b"message%20length%20too")
                        || m.windows(22).any(|w| w == b"message length too lar")
                });
            if too_large {
                res.headers_mut().insert(
                    "grpc-status",
                    tonic::codegen::http::HeaderValue::from_static("8"),
                );
            }
            res
        }
        self.0.call(req).map_ok(fix::<R> as fn(_) -> _)
    }
}

/// The assembled services, ready to serve on any incoming connection stream.
pub struct GrpcServer {
    router: Router<tower::layer::util::Stack<TooLargeLayer, tower::layer::util::Identity>>,
    health: tonic_health::server::HealthReporter,
}

/// The ports the gRPC services read and write besides the core.
#[derive(Debug, Clone)]
pub struct ServerPorts {
    /// Where uploaded deltas are stored.
    pub blobs: Arc<dyn BlobStore>,
    /// Where checkpoints are served from.
    pub objects: Arc<dyn hanzod_store::ObjectStore>,
    /// Where `ListPublications` reads the publication records (none: UNIMPLEMENTED).
    pub ledger: Option<Arc<dyn hanzod_actors::ports::Ledger>>,
}

impl GrpcServer {
    /// Builds the server for `core`, delivering through `sessions`: uploaded deltas are
    /// stored in `ports.blobs`, checkpoints served from `ports.objects` and publication
    /// records from `ports.ledger`; jobs and deltas are checked against `catalog`, and each
    /// running epoch's spot-check commitment is shown from `commitments`. Long-lived streams
    /// end `UNAVAILABLE` when `shutdown` turns true.
    pub async fn new(
        core: OrchestratorHandle,
        sessions: Arc<Sessions>,
        settings: &ServerSettings,
        ports: ServerPorts,
        catalog: Arc<ModelCatalog>,
        commitments: super::jobs::Commitments,
        shutdown: watch::Receiver<bool>,
    ) -> Result<GrpcServer, ServeError> {
        let max = settings.max_message_bytes;
        let ServerPorts {
            blobs,
            objects,
            ledger,
        } = ports;
        let uploads = Arc::new(DeltaUploads::new(
            core.clone(),
            sessions.clone(),
            blobs,
            objects.clone(),
            catalog.clone(),
            settings.uploads.clone(),
        ));
        let node = NodeServiceServer::new(NodeServiceImpl::new(
            core.clone(),
            sessions.clone(),
            settings.node.clone(),
            uploads,
            shutdown.clone(),
        ))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
        let token = AdminToken(settings.admin_token.as_deref().map(Arc::from));
        let jobs = InterceptedService::new(
            JobServiceServer::new(JobServiceImpl::new(
                core.clone(),
                sessions.clone(),
                super::jobs::JobChecks {
                    catalog,
                    objects,
                    admission: settings.admission,
                },
                commitments,
                shutdown.clone(),
            ))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            token.clone(),
        );
        let admin = InterceptedService::new(
            AdminServiceServer::new(AdminServiceImpl::new(
                core,
                sessions,
                ledger,
                settings.node.orchestrator_key,
            ))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
            token,
        );
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in HEALTH_NAMES {
            health
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
        }
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(hanzod_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(hanzod_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        let router = Server::builder()
            .layer(TooLargeLayer)
            .http2_keepalive_interval(Some(Duration::from_millis(settings.keepalive_interval_ms)))
            .http2_keepalive_timeout(Some(Duration::from_millis(settings.keepalive_timeout_ms)))
            .tcp_nodelay(true)
            .max_concurrent_streams(Some(settings.max_concurrent_streams))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .add_service(node)
            .add_service(jobs)
            .add_service(admin);
        Ok(GrpcServer { router, health })
    }

    /// Serves plaintext HTTP/2 on `listener` until `signal` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        signal: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        // Small messages (stream chunks, acks) must not wait for Nagle's algorithm: a
        // checkpoint download otherwise stalls ~40 ms on the delayed ACK.
        let incoming = futures_util::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |r| {
                r.inspect(|s| {
                    let _ = s.set_nodelay(true);
                })
            },
        );
        self.serve_with_incoming(incoming, signal).await
    }

    /// Serves TLS 1.3 on `listener` until `signal` resolves. Handshakes run off the accept
    /// loop, each with a 10 s deadline, so a slow client cannot stall others.
    pub async fn serve_tls(
        self,
        listener: TcpListener,
        acceptor: TlsAcceptor,
        signal: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let (tx, rx) =
            mpsc::channel::<std::io::Result<tokio_rustls::server::TlsStream<TcpStream>>>(64);
        let accept = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => {
                        let _ = c.0.set_nodelay(true);
                        c
                    }
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    {
                        Ok(Ok(tls)) => {
                            let _ = tx.send(Ok(tls)).await;
                        }
                        Ok(Err(e)) => tracing::info!(%peer, "TLS handshake refused: {e}"),
                        Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        let r = self
            .serve_with_incoming(ReceiverStream::new(rx), signal)
            .await;
        accept.abort();
        r
    }

    /// Serves on any stream of connections (tests use simulated networks) until `signal`.
    pub async fn serve_with_incoming<I, IO, IE>(
        self,
        incoming: I,
        signal: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ServeError>
    where
        I: tokio_stream::Stream<Item = Result<IO, IE>> + Send,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let health = self.health.clone();
        let signal = async move {
            signal.await;
            for name in HEALTH_NAMES {
                health
                    .set_service_status(name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
        };
        self.router
            .serve_with_incoming_shutdown(incoming, signal)
            .await?;
        Ok(())
    }
}

/// A TLS 1.3-only acceptor (rustls with the ring provider, ALPN `h2`) from PEM files: the
/// server's certificate chain and private key, and, for mutual TLS, the CA whose client
/// certificates are accepted (clients without one are then refused in the handshake).
pub fn tls_acceptor(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<TlsAcceptor, ServeError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(TlsSetupError::Certificate)?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate.into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(TlsSetupError::Key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsSetupError::Rustls)?;
    let builder = match client_ca_pem {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                let c = c.map_err(|e| TlsSetupError::ClientCa(Box::new(e)))?;
                roots
                    .add(c)
                    .map_err(|e| TlsSetupError::ClientCa(Box::new(e)))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| TlsSetupError::ClientCa(Box::new(e)))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(TlsSetupError::Rustls)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
