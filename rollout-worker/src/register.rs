//! Registration with the coordinator: announce the address to dial back, then heartbeat. A
//! coordinator that restarted answers `known = false`, and the worker registers again; an
//! unreachable one is retried with backoff, so the two can start in any order.
use comas_proto::v1 as pb;
use comas_proto::v1::coordinator_client::CoordinatorClient;
use comas_service::auth::Bearer;
use std::time::Duration;
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;

pub struct Registration {
    pub coordinator: String,
    pub worker_id: String,
    pub advertise: String,
    pub max_episodes: u32,
    /// The token sent with every call (scope `worker`), if the coordinator checks tokens.
    pub bearer: Bearer,
}

const REFUSED: &str = "refused: ";

/// A call's failure in words; a refusal (no token, a wrong one, the wrong scope) is marked, so
/// it is logged every time rather than taken for a coordinator that is not up yet.
fn refusal(e: tonic::Status) -> String {
    match e.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
            format!("{REFUSED}{}", e.message())
        }
        _ => e.message().to_string(),
    }
}

/// Runs until `stop` fires. When `draining` turns true, one heartbeat says so at once, so the
/// coordinator stops leasing to this worker before it goes away.
pub async fn run(
    r: Registration,
    mut draining: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let target = comas_service::grpc_uri(&r.coordinator);
    // One per process: re-registrations of this process carry it, a restart draws another.
    let incarnation: u64 = rand::random();
    let mut backoff = comas_service::backoff::Backoff::reconnect();
    let mut interval = Duration::from_secs(2);
    let mut registered = false;
    let mut client: Option<
        CoordinatorClient<InterceptedService<tonic::transport::Channel, Bearer>>,
    > = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let is_draining = *draining.borrow();
        let outcome = async {
            let mut c = match client.take() {
                Some(c) => c,
                None => {
                    // The API's client settings: a coordinator that stops answering is found
                    // by its missed pings within seconds, not at the call deadline.
                    let ch = comas_service::tls::channel(&target, comas_service::limits::api_endpoint)
                        .await
                        .map_err(|e| e.to_string())?;
                    CoordinatorClient::with_interceptor(ch, r.bearer.clone())
                }
            };
            if !registered {
                let resp = c
                    .register_worker(pb::RegisterWorkerRequest {
                        worker_id: r.worker_id.clone(),
                        address: comas_service::grpc_uri(&r.advertise),
                        max_episodes: r.max_episodes,
                        incarnation,
                    })
                    .await
                    .map_err(refusal)?
                    .into_inner();
                interval = Duration::from_millis(resp.heartbeat_interval_ms.clamp(100, 60_000));
                tracing::info!(coordinator = %target, worker = %r.worker_id, "registered with the coordinator");
            }
            let known = c.heartbeat(pb::HeartbeatRequest { worker_id: r.worker_id.clone(), draining: is_draining }).await.map_err(refusal)?.into_inner().known;
            client = Some(c);
            Ok::<bool, String>(known)
        }
        .await;
        let pause = match outcome {
            Ok(known) => {
                registered = known;
                backoff.reset();
                if known {
                    interval
                } else {
                    Duration::ZERO
                }
            }
            Err(e) => {
                if e.starts_with(REFUSED) {
                    tracing::error!(coordinator = %target, error = %e, "the coordinator refuses this worker; set COMAS_WORKER_TOKEN to a token with scope `worker`");
                } else if registered {
                    tracing::warn!(coordinator = %target, error = %e, "coordinator unreachable; retrying");
                }
                registered = false;
                backoff.next_wait()
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = draining.changed() => {}
            _ = stop.changed() => {}
        }
    }
}
