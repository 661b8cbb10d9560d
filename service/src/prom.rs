//! The two Prometheus chores every service repeats: registering a metric where it is created,
//! and rendering a registry in the text format at scrape time.
use prometheus::core::Collector;
use prometheus::{Encoder, Registry, TextEncoder};

/// Registers `metric` and hands it back. Names are fixed in code, so a clash is a bug.
pub fn registered<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry.register(Box::new(metric.clone())).expect("metric names are unique per registry");
    metric
}

pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
