//! Prometheus metrics of the learner, labelled by agent (one process may train several).
use comas_service::prom::registered;
use prometheus::{Gauge, Histogram, IntCounter, IntGauge};
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
};
use std::sync::Arc;

pub struct Metrics {
    pub registry: Registry,
    steps: IntCounterVec,
    step_errors: IntCounterVec,
    tokens: IntCounterVec,
    step_seconds: HistogramVec,
    loss: GaugeVec,
    grad_norm: GaugeVec,
    lr: GaugeVec,
    version: IntGaugeVec,
    weight_bytes_sent: IntCounterVec,
}

/// One agent's series.
pub struct AgentMetrics {
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

const AGENT: &[&str] = &["agent"];

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new_custom(Some("comas_learner".into()), None).expect("registry");
        let c = |n: &str, h: &str| {
            registered(&registry, IntCounterVec::new(Opts::new(n, h), AGENT).expect("metric"))
        };
        let g = |n: &str, h: &str| {
            registered(&registry, GaugeVec::new(Opts::new(n, h), AGENT).expect("metric"))
        };
        let steps = c("steps_total", "training steps completed");
        let step_errors = c("step_errors_total", "training steps rejected");
        let tokens = c("tokens_total", "tokens processed by training forward passes");
        let weight_bytes_sent = c("weight_bytes_sent_total", "weight bytes streamed to workers");
        let loss = g("loss", "loss of the last step");
        let grad_norm = g("grad_norm", "gradient norm of the last step, before clipping");
        let lr = g("learning_rate", "learning rate of the last update");
        let version = registered(
            &registry,
            IntGaugeVec::new(
                Opts::new("weights_version", "newest published weights version"),
                AGENT,
            )
            .expect("metric"),
        );
        let step_seconds = registered(
            &registry,
            HistogramVec::new(
                HistogramOpts::new("step_seconds", "wall time of a training step")
                    .buckets(prometheus::exponential_buckets(0.01, 2.0, 16).expect("buckets")),
                AGENT,
            )
            .expect("metric"),
        );
        Arc::new(Self {
            registry,
            steps,
            step_errors,
            tokens,
            step_seconds,
            loss,
            grad_norm,
            lr,
            version,
            weight_bytes_sent,
        })
    }

    /// Agent `agent`'s series (created at zero, so every served agent shows from the start).
    pub fn agent(&self, agent: u32) -> AgentMetrics {
        let k = agent.to_string();
        let l = [k.as_str()];
        AgentMetrics {
            steps: self.steps.with_label_values(&l),
            step_errors: self.step_errors.with_label_values(&l),
            tokens: self.tokens.with_label_values(&l),
            step_seconds: self.step_seconds.with_label_values(&l),
            loss: self.loss.with_label_values(&l),
            grad_norm: self.grad_norm.with_label_values(&l),
            lr: self.lr.with_label_values(&l),
            version: self.version.with_label_values(&l),
            weight_bytes_sent: self.weight_bytes_sent.with_label_values(&l),
        }
    }

    pub fn render(&self) -> String {
        comas_service::prom::render(&self.registry)
    }
}
