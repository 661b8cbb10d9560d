//! TLS for every gRPC server and client (rustls with the ring provider).
//!
//! - A server given a certificate and key speaks TLS only; given a CA as well, it asks every
//!   client for a certificate signed by that CA (mutual TLS; `--tls-client-auth optional`
//!   verifies only those presented, for a coordinator that CLI users reach with tokens).
//! - A client given a CA verifies servers against it and presents its own certificate when it
//!   has one. Every client of a process shares one set-up ([`install_client`], or the
//!   `COMAS_TLS_*` variables read on first use), so no call site can forget it.
//! - The files are watched: each new connection, on either side, uses what is on disk now, so a
//!   renewed certificate (cert-manager rewrites the Secret's files) takes effect without a
//!   restart. Connections already open keep the certificate they started with.
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

pub use crate::local_ca::{Authority, LocalFiles, Validity};
use tonic::codegen::http::Uri;

/// The TLS flags of a service (and the variables the CLI reads).
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsArgs {
    /// PEM certificate chain this process presents: as a server, and as a client to servers
    /// that ask for one. With --tls-key and --tls-ca, the service speaks only TLS.
    #[arg(long = "tls-cert", env = "COMAS_TLS_CERT")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", env = "COMAS_TLS_KEY")]
    pub key: Option<PathBuf>,
    /// PEM CA certificates: peers this process dials must present a certificate they signed,
    /// and so must clients of its server (see --tls-client-auth).
    #[arg(long = "tls-ca", env = "COMAS_TLS_CA")]
    pub ca: Option<PathBuf>,
    /// Name checked against the servers' certificates instead of the host dialled: for a
    /// cluster whose services share one certificate for one DNS name.
    #[arg(long = "tls-server-name", env = "COMAS_TLS_SERVER_NAME")]
    pub server_name: Option<String>,
    /// Whether this server requires a client certificate signed by --tls-ca (`required`), or
    /// checks only those presented (`optional`: clients without one, such as CLI users with a
    /// token, get in).
    #[arg(long = "tls-client-auth", env = "COMAS_TLS_CLIENT_AUTH", value_enum, default_value_t = ClientAuth::Required)]
    pub client_auth: ClientAuth,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClientAuth {
    #[default]
    Required,
    Optional,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: {what}")]
    Pem { path: PathBuf, what: String },
    #[error("{0}")]
    Config(String),
    #[error("making certificates: {0}")]
    Generate(#[from] rcgen::Error),
}

impl TlsArgs {
    /// The files of a process with a local CA set-up (`comas local`, tests).
    pub fn from_files(files: &LocalFiles) -> Self {
        Self {
            cert: Some(files.cert.clone()),
            key: Some(files.key.clone()),
            ca: Some(files.ca.clone()),
            ..Self::default()
        }
    }

    /// The same settings as `COMAS_TLS_*` variables, for a child process.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let mut env: Vec<(&'static str, String)> = [
            ("COMAS_TLS_CERT", path(&self.cert)),
            ("COMAS_TLS_KEY", path(&self.key)),
            ("COMAS_TLS_CA", path(&self.ca)),
            ("COMAS_TLS_SERVER_NAME", self.server_name.clone()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        if self.client_auth == ClientAuth::Optional {
            env.push(("COMAS_TLS_CLIENT_AUTH", "optional".into()));
        }
        env
    }

    /// The settings in `COMAS_TLS_*` (what a CLI command uses).
    pub fn from_env() -> Result<Self, TlsError> {
        let path = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let client_auth = match std::env::var("COMAS_TLS_CLIENT_AUTH").as_deref() {
            Err(_) | Ok("") | Ok("required") => ClientAuth::Required,
            Ok("optional") => ClientAuth::Optional,
            Ok(other) => {
                return Err(TlsError::Config(format!(
                    "COMAS_TLS_CLIENT_AUTH={other:?}: use required or optional"
                )))
            }
        };
        Ok(Self {
            cert: path("COMAS_TLS_CERT"),
            key: path("COMAS_TLS_KEY"),
            ca: path("COMAS_TLS_CA"),
            server_name: std::env::var("COMAS_TLS_SERVER_NAME").ok().filter(|s| !s.is_empty()),
            client_auth,
        })
    }

    fn identity(&self) -> Result<Option<(&Path, &Path)>, TlsError> {
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Ok(Some((c, k))),
            (None, None) => Ok(None),
            (Some(_), None) => {
                Err(TlsError::Config("--tls-cert (COMAS_TLS_CERT) is set but --tls-key (COMAS_TLS_KEY) is not: give the certificate's private key too".into()))
            }
            (None, Some(_)) => {
                Err(TlsError::Config("--tls-key (COMAS_TLS_KEY) is set but --tls-cert (COMAS_TLS_CERT) is not: give the key's certificate too".into()))
            }
        }
    }

    /// Sets up a service, which both serves and dials other services: all three files or none.
    /// Installs the client side for the whole process and returns the server side.
    pub fn service(&self) -> Result<Option<Arc<ServerTls>>, TlsError> {
        let identity = self.identity()?;
        match (identity, &self.ca) {
            (None, None) => {
                install_client(None);
                Ok(None)
            }
            (Some((cert, key)), Some(ca)) => {
                let server = ServerTls::new(cert, key, Some(ca), self.client_auth)?;
                install_client(Some(ClientTls::new(ca, Some((cert, key)), self.server_name.clone())?));
                Ok(Some(Arc::new(server)))
            }
            (Some(_), None) => Err(TlsError::Config(
                "TLS needs --tls-ca (COMAS_TLS_CA) beside the certificate: a service also dials other services, and checks their certificates against it"
                    .into(),
            )),
            (None, Some(_)) => Err(TlsError::Config(
                "--tls-ca (COMAS_TLS_CA) is set without --tls-cert and --tls-key: a service needs its own certificate to serve TLS".into(),
            )),
        }
    }

    /// Sets up a client only (the CLI): a CA turns TLS on, a certificate is presented if given.
    pub fn client(&self) -> Result<Option<ClientTls>, TlsError> {
        let identity = self.identity()?;
        match &self.ca {
            Some(ca) => Ok(Some(ClientTls::new(ca, identity, self.server_name.clone())?)),
            None if identity.is_some() => {
                Err(TlsError::Config("COMAS_TLS_CERT is set without COMAS_TLS_CA: set the CA that signed the coordinator's certificate".into()))
            }
            None => Ok(None),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|err| TlsError::Io { path: path.to_path_buf(), err })
}

pub(crate) fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |what: String| TlsError::Pem { path: path.to_path_buf(), what };
    let certs = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(pem("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    Ok(certs)
}

pub(crate) fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        what: format!("no PEM private key in it: {e}"),
    })
}

fn roots(path: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for c in certs(path)? {
        store.add(c).map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            what: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(store))
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn rustls_err(what: &str) -> impl Fn(rustls::Error) -> TlsError + '_ {
    move |e| TlsError::Config(format!("{what}: {e}"))
}

/// Both ends speak HTTP/2 only (gRPC), agreed by ALPN.
const ALPN_H2: &[u8] = b"h2";

/// A value built from files, rebuilt when one of them changes (size, time or inode: a
/// Kubernetes Secret update swaps a symlink). A rebuild that fails (a half-written file) keeps
/// the last good value and is retried on the next use.
struct Watched<T> {
    files: Vec<PathBuf>,
    build: Box<dyn Fn() -> Result<T, TlsError> + Send + Sync>,
    state: Mutex<(Vec<Option<Stamp>>, Arc<T>)>,
}

type Stamp = (u64, u64, std::time::SystemTime);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()?))
}

impl<T> Watched<T> {
    fn new(
        files: Vec<PathBuf>,
        build: impl Fn() -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let stamps = files.iter().map(|f| stamp(f)).collect();
        let value = Arc::new(build()?);
        Ok(Self { files, build: Box::new(build), state: Mutex::new((stamps, value)) })
    }

    fn current(&self) -> Arc<T> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now: Vec<Option<Stamp>> = self.files.iter().map(|f| stamp(f)).collect();
        if now != state.0 {
            match (self.build)() {
                Ok(v) => {
                    tracing::info!(files = ?self.files, "TLS files changed: new connections use them");
                    *state = (now, Arc::new(v));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but cannot be used; keeping the previous ones")
                }
            }
        }
        Arc::clone(&state.1)
    }
}

/// The server side: what a new connection is accepted with.
pub struct ServerTls {
    config: Watched<rustls::ServerConfig>,
}

impl ServerTls {
    pub fn new(
        cert: &Path,
        key_path: &Path,
        ca: Option<&Path>,
        client_auth: ClientAuth,
    ) -> Result<Self, TlsError> {
        let (cert, key_path, ca) =
            (cert.to_path_buf(), key_path.to_path_buf(), ca.map(Path::to_path_buf));
        let files = [Some(cert.clone()), Some(key_path.clone()), ca.clone()]
            .into_iter()
            .flatten()
            .collect();
        let build = move || {
            let verifier = match &ca {
                Some(ca) => {
                    let b = rustls::server::WebPkiClientVerifier::builder_with_provider(
                        roots(ca)?,
                        provider(),
                    );
                    let b = if client_auth == ClientAuth::Optional {
                        b.allow_unauthenticated()
                    } else {
                        b
                    };
                    b.build().map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?
                }
                None => rustls::server::WebPkiClientVerifier::no_client_auth(),
            };
            let mut config = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(rustls_err("TLS versions"))?
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs(&cert)?, key(&key_path)?)
                .map_err(|e| {
                    TlsError::Config(format!(
                        "{} and {}: {e} (is the key the certificate's?)",
                        cert.display(),
                        key_path.display()
                    ))
                })?;
            config.alpn_protocols = vec![ALPN_H2.to_vec()];
            Ok(config)
        };
        Ok(Self { config: Watched::new(files, build)? })
    }

    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.current())
    }
}

/// The client side: what a new connection is made with.
pub struct ClientTls {
    config: Watched<rustls::ClientConfig>,
    server_name: Option<String>,
}

impl ClientTls {
    pub fn new(
        ca: &Path,
        identity: Option<(&Path, &Path)>,
        server_name: Option<String>,
    ) -> Result<Self, TlsError> {
        let ca = ca.to_path_buf();
        let identity = identity.map(|(c, k)| (c.to_path_buf(), k.to_path_buf()));
        let mut files = vec![ca.clone()];
        files.extend(identity.iter().flat_map(|(c, k)| [c.clone(), k.clone()]));
        if let Some(name) = &server_name {
            ServerName::try_from(name.as_str())
                .map_err(|e| TlsError::Config(format!("--tls-server-name {name:?}: {e}")))?;
        }
        let build = move || {
            let b = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(rustls_err("TLS versions"))?
                .with_root_certificates(roots(&ca)?);
            let mut config = match &identity {
                Some((c, k)) => b.with_client_auth_cert(certs(c)?, key(k)?).map_err(|e| {
                    TlsError::Config(format!(
                        "{} and {}: {e} (is the key the certificate's?)",
                        c.display(),
                        k.display()
                    ))
                })?,
                None => b.with_no_client_auth(),
            };
            config.alpn_protocols = vec![ALPN_H2.to_vec()];
            Ok(config)
        };
        Ok(Self { config: Watched::new(files, build)?, server_name })
    }

    async fn connect(
        &self,
        uri: &Uri,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        let host = uri.host().ok_or_else(|| invalid(format!("{uri}: no host")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().ok_or_else(|| invalid(format!("{uri}: no port")))?;
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| invalid(format!("{name:?} is not a name a certificate can hold: {e}")))?;
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        let connector = tokio_rustls::TlsConnector::from(self.config.current());
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("TLS with {host}:{port}: {e}")))
    }
}

fn client_slot() -> &'static RwLock<Option<Option<Arc<ClientTls>>>> {
    static SLOT: RwLock<Option<Option<Arc<ClientTls>>>> = RwLock::new(None);
    &SLOT
}

/// Sets the TLS of every client this process opens from now on (`None`: plaintext).
pub fn install_client(tls: Option<ClientTls>) {
    *client_slot().write().unwrap_or_else(|p| p.into_inner()) = Some(tls.map(Arc::new));
}

/// The process's client TLS; read from `COMAS_TLS_*` on first use when nothing was installed.
fn client() -> Result<Option<Arc<ClientTls>>, TlsError> {
    if let Some(c) = client_slot().read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Ok(c.clone());
    }
    let tls = TlsArgs::from_env()?.client()?;
    install_client(tls);
    Ok(client_slot().read().unwrap_or_else(|p| p.into_inner()).clone().flatten())
}

/// Whether this process's clients speak TLS (for the scheme of the addresses it shows).
pub fn client_is_tls() -> bool {
    matches!(client(), Ok(Some(_)))
}

/// A failed connection, with every cause (tonic's own message is only "transport error").
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Tls(#[from] TlsError),
    #[error("{address}: {message}")]
    Address { address: String, message: String },
    #[error("{message}")]
    Connect { message: String },
}

/// An error and its causes on one line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A status's message and, for a transport failure (whose message is only "transport error"),
/// its causes: a refused TLS handshake shows up this way on the first call.
pub fn status_text(s: &tonic::Status) -> String {
    match std::error::Error::source(s) {
        Some(source) => {
            let causes = error_chain(source);
            if s.message().contains(&causes) {
                s.message().to_string()
            } else {
                format!("{}: {causes}", s.message())
            }
        }
        None => s.message().to_string(),
    }
}

/// A gRPC channel to `address` (`host:port`, `http://…` or `https://…`), with this process's
/// TLS when it has one; `tune` sets the endpoint's timeouts and windows.
pub async fn channel(
    address: &str,
    tune: impl FnOnce(tonic::transport::Endpoint) -> tonic::transport::Endpoint,
) -> Result<tonic::transport::Channel, ConnectError> {
    let tls = client()?;
    let uri = match address.strip_prefix("https://") {
        // The TLS is this crate's connector's, so tonic sees a plain URI.
        Some(rest) if tls.is_some() => format!("http://{rest}"),
        Some(_) => {
            return Err(ConnectError::Address { address: address.into(), message: "an https:// address, but this process has no TLS set up: set COMAS_TLS_CA (and COMAS_TLS_CERT, COMAS_TLS_KEY if the server asks for a client certificate)".into() })
        }
        None => crate::grpc_uri(address),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| ConnectError::Address { address: address.into(), message: error_chain(&e) })?;
    let endpoint = tune(endpoint);
    let connected = match tls {
        None => endpoint.connect().await,
        Some(tls) => {
            let connector = tower_fn(move |uri: Uri| {
                let tls = Arc::clone(&tls);
                async move { tls.connect(&uri).await.map(hyper_util::rt::TokioIo::new) }
            });
            endpoint.connect_with_connector(connector).await
        }
    };
    connected.map_err(|e| ConnectError::Connect { message: format!("{uri}: {}", error_chain(&e)) })
}

/// `tower::service_fn`, without the tower crate.
#[derive(Clone)]
struct ServiceFn<F>(F);

fn tower_fn<F>(f: F) -> ServiceFn<F> {
    ServiceFn(f)
}

impl<F, Fut, R> tonic::codegen::Service<Uri> for ServiceFn<F>
where
    F: FnMut(Uri) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<R>>,
{
    type Response = R;
    type Error = std::io::Error;
    type Future = Fut;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Fut {
        (self.0)(uri)
    }
}

/// Handshakes in progress at once on one server; more connections wait in the accept queue.
const MAX_HANDSHAKES: usize = 256;
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown`, over TLS when `tls` is given. Handshakes run
/// beside the accept loop, so a slow or hostile client holds up no one; a failed one is logged
/// with the peer and the reason and the server goes on.
pub async fn serve(
    router: tonic::transport::server::Router,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<ServerTls>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let Some(tls) = tls else {
        return router
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                shutdown,
            )
            .await;
    };
    let (tx, rx) =
        tokio::sync::mpsc::channel::<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>(64);
    let accept = tokio::spawn(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        loop {
            let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
            let (tcp, peer) = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: wait rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _slot = slot;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(stream).await;
                    }
                    Ok(Err(e)) => tracing::warn!(%peer, error = %e, "TLS handshake refused"),
                    Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<_, std::io::Error>,
    );
    let served = router.serve_with_incoming_shutdown(incoming, shutdown).await;
    accept.abort();
    served
}

#[cfg(test)]
mod tests;
