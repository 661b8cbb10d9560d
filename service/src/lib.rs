//! Plumbing every comas service shares: a small HTTP server for Prometheus `/metrics` and a
//! `/healthz` liveness check next to the gRPC port, the SIGTERM / Ctrl-C future that starts a
//! graceful shutdown, and the logging set-up.
pub mod agent;
pub mod auth;
pub mod backoff;
pub mod limits;
pub mod local_ca;
pub mod openai;
pub mod port;
pub mod prom;
pub mod roots;
pub mod tls;

pub use roots::{AllowedRoots, RootsError};

/// HTTP/2 flow-control windows of the gRPC servers and of the clients that pull weights. With
/// the 64 KiB default, a weight stream waits for a window update every 64 KiB, which on
/// loopback caps a transfer far below memory speed.
pub const HTTP2_STREAM_WINDOW: u32 = 8 << 20;
pub const HTTP2_CONNECTION_WINDOW: u32 = 32 << 20;
/// Largest HTTP/2 frame accepted: weight chunks travel in a few frames, not in 16 KiB pieces.
pub const HTTP2_MAX_FRAME: u32 = 1 << 20;

/// A channel for weight transfers from `address`: wide flow-control windows.
pub async fn weights_channel(
    address: &str,
) -> Result<tonic::transport::Channel, tls::ConnectError> {
    tls::channel(address, |e| {
        e.initial_stream_window_size(HTTP2_STREAM_WINDOW)
            .initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
            .max_frame_size(HTTP2_MAX_FRAME)
    })
    .await
}

pub use comas_files::{write_atomic, write_private};

/// A gRPC address as a URI: `host:port` gets `http://`, anything with a scheme stays as it is.
pub fn grpc_uri(address: &str) -> String {
    if address.starts_with("http") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

/// Where a service listens: an address to bind, or (`fd:N`) a listening socket that the process
/// that started it bound and passed down. `comas local` binds every port itself and hands the
/// sockets on, so that no two services can pick the same free port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Addr(SocketAddr),
    Fd(i32),
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("fd:") {
            Some(n) => n
                .parse::<i32>()
                .ok()
                .filter(|&n| n > 2)
                .map(Listen::Fd)
                .ok_or_else(|| format!("`{s}`: an inherited socket is fd:N with N at least 3")),
            None => s.parse().map(Listen::Addr).map_err(|e| {
                format!("`{s}`: {e} (give host:port, or fd:N for an inherited socket)")
            }),
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Addr(a) => write!(f, "{a}"),
            Listen::Fd(n) => write!(f, "fd:{n}"),
        }
    }
}

impl Listen {
    /// The listening socket, inside a tokio runtime.
    pub async fn bind(self) -> std::io::Result<tokio::net::TcpListener> {
        match self {
            Listen::Addr(a) => tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("binding {a}: {e}"))),
            Listen::Fd(n) => {
                use std::os::fd::FromRawFd;
                // SAFETY: `fd:N` is a contract with the parent process: N is an open listening
                // TCP socket it passed to this process alone. A wrong N fails the checks below.
                let l = unsafe { std::net::TcpListener::from_raw_fd(n) };
                let checked = l
                    .local_addr()
                    .and_then(|_| l.set_nonblocking(true))
                    .and_then(|_| tokio::net::TcpListener::from_std(l));
                checked.map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("fd:{n} is not a listening socket passed to this process: {e}"),
                    )
                })
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path} is locked by {holder}")]
    Held { path: std::path::PathBuf, holder: String },
    #[error("{path}: {err}")]
    Io { path: std::path::PathBuf, err: std::io::Error },
}

/// Takes an exclusive lock on `path` (created if missing) and writes this process's pid into
/// it; the lock lasts as long as the returned file. The kernel drops it when the process dies,
/// however it dies, so a file left behind never blocks the next run.
pub fn exclusive_lock(path: &std::path::Path) -> Result<std::fs::File, LockError> {
    use std::io::{Read, Seek, Write};
    let io = |err: std::io::Error| LockError::Io { path: path.to_path_buf(), err };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io)?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            let holder = match pid.trim() {
                "" => "another process".to_string(),
                pid => format!("process {pid}"),
            };
            return Err(LockError::Held { path: path.to_path_buf(), holder });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    f.set_len(0).map_err(io)?;
    f.rewind().map_err(io)?;
    write!(f, "{}", std::process::id()).map_err(io)?;
    Ok(f)
}

/// Serves `/metrics` (the text `render` returns at scrape time) and `/healthz` until `shutdown`
/// resolves.
pub async fn serve_metrics(
    listen: Listen,
    render: Arc<dyn Fn() -> String + Send + Sync>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::{routing::get, Router};
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let r = Arc::clone(&render);
                async move { r() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    let listener = listen.bind().await?;
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Serves `router` (the gRPC health service alone) in plaintext on `listen` until `shutdown`:
/// the kubelet's gRPC probe speaks no TLS, so a TLS service answers its probes here, with the
/// same statuses as on its own port.
pub async fn spawn_health_port(
    listen: Listen,
    router: tonic::transport::server::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = listen.bind().await?;
    tokio::spawn(async move {
        if let Err(e) = tls::serve(router, listener, None, shutdown).await {
            tracing::error!(listen = %listen, error = %e, "health port failed");
        }
    });
    Ok(())
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// Logs to stderr, filtered by `COMAS_LOG` (default `warn`), as JSON lines or human-readable.
/// The text of a caught panic's payload (a thread boundary turns it into an error).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}

pub fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("COMAS_LOG").unwrap_or_else(|_| "warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::Listen;

    #[test]
    fn listen_takes_an_address_or_an_inherited_fd() {
        assert_eq!(
            "127.0.0.1:7".parse::<Listen>().unwrap(),
            Listen::Addr("127.0.0.1:7".parse().unwrap())
        );
        assert_eq!("fd:5".parse::<Listen>().unwrap(), Listen::Fd(5));
        assert!("fd:1".parse::<Listen>().unwrap_err().contains("at least 3"));
        assert!("localhost".parse::<Listen>().unwrap_err().contains("fd:N"));
    }

    #[tokio::test]
    async fn an_inherited_socket_is_used_and_a_wrong_fd_is_refused() {
        use std::os::fd::IntoRawFd;
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let fd = std_listener.into_raw_fd();
        let l = Listen::Fd(fd).bind().await.unwrap();
        assert_eq!(l.local_addr().unwrap(), addr);
        let file = std::fs::File::open("/proc/self/exe").unwrap().into_raw_fd();
        let err = Listen::Fd(file).bind().await.unwrap_err().to_string();
        assert!(err.contains(&format!("fd:{file} is not a listening socket")), "{err}");
    }
}
