//! Prometheus metrics of the coordinator. `comas_coordinator_pending_episodes` is what an
//! autoscaler reads to size the worker pool.
use comas_service::prom::{registered, render};
use prometheus::{Counter, IntCounter, IntGauge, Registry};
use std::sync::Arc;

pub struct Metrics {
    registry: Registry,
    pub pending_episodes: IntGauge,
    pub leased_episodes: IntGauge,
    pub workers: IntGauge,
    pub ready_workers: IntGauge,
    pub running_jobs: IntGauge,
    pub episodes_completed: IntCounter,
    pub requeued_episodes: IntCounter,
    pub duplicate_results: IntCounter,
    pub malformed_trajectories: IntCounter,
    pub cancelled_leases: IntCounter,
    pub cancels_stopped: IntCounter,
    pub cancelled_tokens: IntCounter,
    pub steps_completed: IntCounter,
    pub rollbacks: IntCounter,
    pub tracking_dropped: IntCounter,
    pub scheduler_seconds: Counter,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry =
            Registry::new_custom(Some("comas_coordinator".into()), None).expect("registry");
        let counter =
            |n: &str, h: &str| registered(&registry, IntCounter::new(n, h).expect("metric"));
        let gauge = |n: &str, h: &str| registered(&registry, IntGauge::new(n, h).expect("metric"));
        let scheduler_seconds = registered(
            &registry,
            Counter::new(
                "scheduler_seconds_total",
                "time the scheduler task spent handling events",
            )
            .expect("metric"),
        );
        Arc::new(Self {
            pending_episodes: gauge(
                "pending_episodes",
                "episodes queued and not leased to any worker",
            ),
            leased_episodes: gauge("leased_episodes", "episodes running on workers"),
            workers: gauge("workers", "registered rollout workers"),
            ready_workers: gauge("ready_workers", "workers holding the current policies"),
            running_jobs: gauge("running_jobs", "jobs in progress"),
            episodes_completed: counter(
                "episodes_completed_total",
                "episodes accepted (once per episode id)",
            ),
            requeued_episodes: counter(
                "requeued_episodes_total",
                "leases returned to the queue (lost worker, timeout, failure)",
            ),
            duplicate_results: counter(
                "duplicate_results_total",
                "results ignored because the episode was already accepted or re-leased",
            ),
            malformed_trajectories: counter(
                "malformed_trajectories_total",
                "trajectories refused (bad JSON, protocol or policy version) and retried",
            ),
            cancelled_leases: counter(
                "cancelled_leases_total",
                "leases cancelled on their worker (another copy was accepted, or the job ended)",
            ),
            cancels_stopped: counter(
                "cancels_stopped_total",
                "cancelled leases that were still running on their worker and stopped there",
            ),
            cancelled_tokens: counter(
                "cancelled_tokens_total",
                "tokens the stopped episodes had generated: decoding spent on discarded work",
            ),
            steps_completed: counter("steps_completed_total", "training steps committed"),
            rollbacks: counter(
                "rollbacks_total",
                "jobs rolled back to an older step because a learner restarted from an older checkpoint",
            ),
            tracking_dropped: counter(
                "tracking_dropped_metrics_total",
                "metrics the MLflow server never got (refused, or away longer than the tracker holds)",
            ),
            scheduler_seconds,
            registry,
        })
    }

    pub fn render(&self) -> String {
        render(&self.registry)
    }
}
