//! Prometheus metrics of the learner.
use comas_service::prom::registered;
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Registry};
use std::sync::Arc;

pub struct Metrics {
    pub registry: Registry,
    pub steps: IntCounter,
    pub step_errors: IntCounter,
    pub tokens: IntCounter,
    pub step_seconds: Histogram,
    pub loss: Gauge,
    pub grad_norm: Gauge,
    pub lr: Gauge,
    pub version: IntGauge,
    pub weight_bytes_sent: IntCounter,
}

impl Metrics {
    pub fn new(agent: u32) -> Arc<Self> {
        let registry = Registry::new_custom(Some("comas_learner".into()), Some([("agent".to_string(), agent.to_string())].into())).expect("registry");
        let c = |n: &str, h: &str| registered(&registry, IntCounter::new(n, h).expect("metric"));
        let g = |n: &str, h: &str| registered(&registry, Gauge::new(n, h).expect("metric"));
        let steps = c("steps_total", "training steps completed");
        let step_errors = c("step_errors_total", "training steps rejected");
        let tokens = c("tokens_total", "tokens processed by training forward passes");
        let weight_bytes_sent = c("weight_bytes_sent_total", "weight bytes streamed to workers");
        let loss = g("loss", "loss of the last step");
        let grad_norm = g("grad_norm", "gradient norm of the last step, before clipping");
        let lr = g("learning_rate", "learning rate of the last update");
        let version = registered(&registry, IntGauge::new("weights_version", "newest published weights version").expect("metric"));
        let step_seconds = registered(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new("step_seconds", "wall time of a training step").buckets(prometheus::exponential_buckets(0.01, 2.0, 16).expect("buckets")),
            )
            .expect("metric"),
        );
        Arc::new(Self { registry, steps, step_errors, tokens, step_seconds, loss, grad_norm, lr, version, weight_bytes_sent })
    }

    pub fn render(&self) -> String {
        comas_service::prom::render(&self.registry)
    }
}
