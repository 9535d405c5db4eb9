//! Connecting to a daemon: channels with TLS, HTTP/2 keep-alive and per-call deadlines,
//! shared by the CLI and the node agent.
//!
//! Connections go through a [`Dial`] function, so tests can run the same client over a
//! simulated network.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity as TlsIdentity};
use tonic::Request;

/// A byte stream to a peer.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Opens a byte stream to `host:port`.
pub type Dial =
    Arc<dyn Fn(String) -> BoxFuture<'static, std::io::Result<Box<dyn Io>>> + Send + Sync>;

/// Dials over the operating system's TCP (no Nagle delay).
pub fn tcp_dial() -> Dial {
    Arc::new(|addr: String| {
        async move {
            let s = tokio::net::TcpStream::connect(&addr).await?;
            s.set_nodelay(true)?;
            Ok(Box::new(s) as Box<dyn Io>)
        }
        .boxed()
    })
}

/// How to reach a daemon.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `http://host:port` or `https://host:port` (default `http://127.0.0.1:9550`); a
    /// comma-separated list names the replicas of one orchestrator (DESIGN §9): clients
    /// try them in order, and node agents move to the next when one fails or is a
    /// standby.
    pub endpoint: String,
    /// PEM CA that signed the daemon's certificate (https).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS.
    pub cert: Option<PathBuf>,
    /// See `cert`.
    pub key: Option<PathBuf>,
    /// The name to check the daemon's certificate against (default: the endpoint's host).
    pub domain: Option<String>,
    /// Sent as `authorization: Bearer <token>` on job and admin calls.
    pub admin_token: Option<String>,
    /// Deadline of each unary call, ms.
    pub call_timeout_ms: u64,
    /// Deadline of connecting, ms.
    pub connect_timeout_ms: u64,
    /// HTTP/2 PING interval, ms (keep-alive, also while idle).
    pub keepalive_ms: u64,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            endpoint: format!("http://127.0.0.1:{}", hanzod_proto::DEFAULT_GRPC_PORT),
            ca: None,
            cert: None,
            key: None,
            domain: None,
            admin_token: None,
            call_timeout_ms: 10_000,
            connect_timeout_ms: 5_000,
            keepalive_ms: 5_000,
        }
    }
}

/// Why a channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint is not a valid `http(s)://host:port` URI.
    #[error("endpoint {0:?}: {1}")]
    Endpoint(String, String),
    /// TLS material could not be read.
    #[error("{0}: {1}")]
    Material(String, std::io::Error),
    /// The transport refused the settings or could not connect.
    #[error("{0}")]
    Transport(#[from] tonic::transport::Error),
}

impl ClientOptions {
    /// The endpoints of `endpoint`, split at commas (at least one).
    pub fn endpoints(&self) -> Vec<String> {
        let list: Vec<String> = self
            .endpoint
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect();
        if list.is_empty() {
            vec![self.endpoint.clone()]
        } else {
            list
        }
    }

    /// These options aimed at the `i`-th of [`ClientOptions::endpoints`] (modulo their
    /// number).
    pub fn pick(&self, i: usize) -> ClientOptions {
        let list = self.endpoints();
        ClientOptions {
            endpoint: list[i % list.len()].clone(),
            ..self.clone()
        }
    }

    /// The configured endpoint (TLS when `https://` or a CA is given, keep-alive, connect
    /// deadline), not yet connected.
    pub fn endpoint(&self) -> Result<Endpoint, ClientError> {
        // `host:port` alone means plaintext HTTP/2 (or TLS when a CA is given).
        let uri = if self.endpoint.contains("://") {
            self.endpoint.clone()
        } else if self.ca.is_some() {
            format!("https://{}", self.endpoint)
        } else {
            format!("http://{}", self.endpoint)
        };
        let ep = Endpoint::from_shared(uri)
            .map_err(|e| ClientError::Endpoint(self.endpoint.clone(), e.to_string()))?;
        let mut ep = ep
            .connect_timeout(Duration::from_millis(self.connect_timeout_ms))
            .http2_keep_alive_interval(Duration::from_millis(self.keepalive_ms))
            .keep_alive_timeout(Duration::from_millis(self.keepalive_ms * 2))
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        if ep.uri().scheme_str() == Some("https") || self.ca.is_some() {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| ClientError::Material(p.display().to_string(), e))
            };
            let mut tls = ClientTlsConfig::new();
            if let Some(ca) = &self.ca {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(c), Some(k)) = (&self.cert, &self.key) {
                tls = tls.identity(TlsIdentity::from_pem(read(c)?, read(k)?));
            }
            if let Some(d) = &self.domain {
                tls = tls.domain_name(d.clone());
            }
            ep = ep.tls_config(tls)?;
        }
        Ok(ep)
    }

    /// Connects over TCP: to the first of [`ClientOptions::endpoints`] that accepts (a
    /// standby replica does not listen), or the last error.
    pub async fn connect(&self) -> Result<Channel, ClientError> {
        let list = self.endpoints();
        let mut last = None;
        for i in 0..list.len() {
            match self.pick(i).endpoint()?.connect().await {
                Ok(c) => return Ok(c),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .map(ClientError::from)
            .unwrap_or_else(|| ClientError::Endpoint(self.endpoint.clone(), "empty".into())))
    }

    /// Connects through `dial` (e.g. a simulated network).
    pub async fn connect_with(&self, dial: Dial) -> Result<Channel, ClientError> {
        let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
            let dial = dial.clone();
            async move {
                let host = uri.host().unwrap_or("127.0.0.1");
                let port = uri.port_u16().unwrap_or(hanzod_proto::DEFAULT_GRPC_PORT);
                let io = dial(format!("{host}:{port}")).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(io))
            }
        });
        Ok(self.endpoint()?.connect_with_connector(connector).await?)
    }

    /// A unary request with this client's deadline and admin token.
    pub fn request<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(Duration::from_millis(self.call_timeout_ms));
        if let Some(t) = &self.admin_token {
            if let Ok(v) = MetadataValue::try_from(format!("Bearer {t}")) {
                r.metadata_mut().insert("authorization", v);
            }
        }
        r
    }

    /// A streaming request (no deadline: it lives as long as the stream) with the admin token.
    pub fn stream_request<T>(&self, msg: T) -> Request<T> {
        let mut r = self.request(msg);
        r.metadata_mut().remove("grpc-timeout");
        r
    }
}
