//! Every message-size limit of the gRPC servers and clients, in one place: both ends of a call
//! use the same number, so a message one side may send the other may take.

/// A job file (`SubmitJob`, `comas submit`): a few KiB; inline evaluation questions make more.
pub const JOB_FILE_BYTES: usize = 1 << 20;
/// Any message of the coordinator's client API (a `SubmitJob` carries one job file; a
/// `JobEpisodes` record one evaluation transcript).
pub const API_MESSAGE_BYTES: usize = 4 << 20;
/// Any message between services: episode specs and results on a worker's `RunEpisodes`
/// stream, experiences on a learner's `Train` stream, reports.
pub const PEER_MESSAGE_BYTES: usize = 64 << 20;
/// A message of a weight stream (`StreamWeights`, `RelayWeights`): a chunk of at most 2 MiB of
/// tensor bytes and its header.
pub const WEIGHT_MESSAGE_BYTES: usize = 8 << 20;

/// A token bucket per peer: `per_minute` calls, refilled evenly, at most `per_minute` at once.
/// Zero turns it off.
#[derive(Debug)]
pub struct RateLimit {
    per_minute: u32,
    buckets: std::sync::Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>,
}

impl RateLimit {
    pub fn per_minute(per_minute: u32) -> Self {
        Self { per_minute, buckets: Default::default() }
    }

    /// Takes one call for `peer`; when none is left, how long until one is.
    pub fn take(&self, peer: &str) -> Result<(), std::time::Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let cap = f64::from(self.per_minute);
        let per_sec = cap / 60.0;
        let now = std::time::Instant::now();
        let mut b = self.buckets.lock().expect("rate lock");
        // Peers that went quiet are forgotten, so the map stays as small as the active set.
        if b.len() > 10_000 {
            b.retain(|_, (_, at)| now.duration_since(*at).as_secs_f64() * per_sec < cap);
        }
        let (left, at) = b.entry(peer.to_string()).or_insert((cap, now));
        *left = (*left + now.duration_since(*at).as_secs_f64() * per_sec).min(cap);
        *at = now;
        if *left >= 1.0 {
            *left -= 1.0;
            return Ok(());
        }
        Err(std::time::Duration::from_secs_f64((1.0 - *left) / per_sec))
    }
}

/// Calls one connection may have in flight at once, on every server.
pub const CALLS_PER_CONNECTION: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_burst_then_waits_and_others_are_not_held_up() {
        let r = RateLimit::per_minute(3);
        for _ in 0..3 {
            r.take("10.0.0.1").unwrap();
        }
        let wait = r.take("10.0.0.1").unwrap_err();
        assert!(wait.as_secs_f64() > 19.0 && wait.as_secs_f64() <= 20.0, "{wait:?}");
        r.take("10.0.0.2").unwrap();
        let off = RateLimit::per_minute(0);
        assert!((0..1000).all(|_| off.take("x").is_ok()));
    }
}

/// Deadline of a client's call to the coordinator's API: for a unary call its whole answer, for
/// a stream (WatchJob) its start; the stream itself runs as long as the job. A call may take
/// long (a submit checks the job's data files); a server that does not answer at all is found
/// much sooner, by [`API_PING_INTERVAL`] and [`API_PING_TIMEOUT`].
pub const API_CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);
/// Time a client of the coordinator's API gives the TCP (and TLS) connection to open.
pub const API_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// While a call of a client of the coordinator's API is open, the client pings the connection
/// (an HTTP/2 PING) once the server has sent nothing for this long...
pub const API_PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
/// ...and closes it, failing the call, when the ping is not answered within this. A live server
/// answers pings at once, also while a call of its takes long, so only one that accepted the
/// connection but does not answer (hung, stopped, or not a gRPC server) is cut off.
pub const API_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The settings of a client of the coordinator's API (the `tune` of `tls::channel`).
pub fn api_endpoint(e: tonic::transport::Endpoint) -> tonic::transport::Endpoint {
    e.connect_timeout(API_CONNECT_TIMEOUT)
        .timeout(API_CALL_DEADLINE)
        .http2_keep_alive_interval(API_PING_INTERVAL)
        .keep_alive_timeout(API_PING_TIMEOUT)
}

/// Whether a call failed because its server did not answer a ping of the connection (see
/// [`API_PING_TIMEOUT`]): it accepted the connection but answers nothing.
pub fn unanswered(status: &tonic::Status) -> bool {
    caused_by(status, |e| e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout))
}

/// Whether a call failed because it ran past its deadline ([`API_CALL_DEADLINE`]) on a server
/// that does answer pings: up, but busy or stuck.
pub fn past_deadline(status: &tonic::Status) -> bool {
    caused_by(status, |e| e.is::<tonic::TimeoutExpired>())
}

/// Whether any error in `status`'s chain of causes is `what` says.
fn caused_by(
    status: &tonic::Status,
    what: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if what(e) {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod api_tests {
    use super::*;
    use std::time::{Duration, Instant};
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    async fn client(address: String) -> HealthClient<tonic::transport::Channel> {
        let e = tonic::transport::Endpoint::from_shared(address).unwrap();
        HealthClient::new(api_endpoint(e).connect().await.unwrap())
    }

    #[tokio::test]
    async fn a_server_that_accepts_but_never_answers_fails_the_call_within_seconds() {
        // Accepts connections and holds them, silent (a hung or stopped coordinator).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let start = Instant::now();
        let mut c = client(address).await;
        let s = c.check(HealthCheckRequest { service: String::new() }).await.unwrap_err();
        let took = start.elapsed();
        assert!(unanswered(&s), "{s:?}");
        let limit = API_PING_INTERVAL + API_PING_TIMEOUT;
        assert!(took >= limit && took < limit + Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test]
    async fn pings_keep_a_live_call_that_waits_long_open() {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = tonic::transport::Server::builder().add_service(health);
        tokio::spawn(server.serve_with_incoming(incoming));
        let mut c = client(address).await;
        c.check(HealthCheckRequest { service: String::new() }).await.unwrap();
        // A Watch stream sends its first status, then nothing until the status changes: it stays
        // open well past the ping's limit.
        let mut watch =
            c.watch(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
        watch.message().await.unwrap().unwrap();
        let quiet = API_PING_INTERVAL + API_PING_TIMEOUT + Duration::from_secs(2);
        let next = tokio::time::timeout(quiet, watch.message()).await;
        assert!(next.is_err(), "the quiet stream ended: {next:?}");
    }
}
