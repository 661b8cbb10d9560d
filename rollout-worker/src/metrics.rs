//! Prometheus metrics of a worker, read from the engine's atomics at scrape time.
use crate::engine::Stats;
use comas_service::prom::{registered, render};
use prometheus::{Counter, IntCounter, IntGauge, Registry};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct Metrics {
    registry: Registry,
    stats: Arc<Stats>,
    generated_tokens: IntCounter,
    shared_prompt_tokens: IntCounter,
    episodes_done: IntCounter,
    episodes_cancelled: IntCounter,
    episodes_cancelled_before_start: IntCounter,
    tokens_after_stop: IntCounter,
    prompts_truncated: IntCounter,
    prompts_refused: IntCounter,
    tool_runs: IntCounter,
    tool_failures: IntCounter,
    endpoint_calls: IntCounter,
    endpoint_failures: IntCounter,
    vllm_swaps: IntCounter,
    vllm_swap_seconds: Counter,
    running_sequences: IntGauge,
    peak_running_sequences: IntGauge,
    waiting_turns: IntGauge,
    running_episodes: IntGauge,
    kv_cache_bytes: IntGauge,
    pub weight_bytes_received: IntCounter,
    pub weight_bytes_relayed: IntCounter,
}

impl Metrics {
    pub fn new(stats: Arc<Stats>) -> Arc<Self> {
        let registry = Registry::new_custom(Some("comas_worker".into()), None).expect("registry");
        let counter =
            |n: &str, h: &str| registered(&registry, IntCounter::new(n, h).expect("metric"));
        let gauge = |n: &str, h: &str| registered(&registry, IntGauge::new(n, h).expect("metric"));
        Arc::new(Self {
            generated_tokens: counter(
                "generated_tokens_total",
                "tokens generated (rate = tokens/s)",
            ),
            shared_prompt_tokens: counter(
                "prompt_tokens_shared_total",
                "prompt tokens whose prefill was copied from the same prompt asked before, not computed",
            ),
            episodes_done: counter("episodes_total", "episodes finished"),
            episodes_cancelled: counter(
                "episodes_cancelled_total",
                "episodes stopped by the coordinator's cancel before their end",
            ),
            episodes_cancelled_before_start: counter(
                "episodes_cancelled_before_start_total",
                "episodes refused on arrival because their cancel had come first",
            ),
            tokens_after_stop: counter(
                "tokens_after_stop_total",
                "tokens generated for episodes already stopped (cancelled or their stream gone)",
            ),
            prompts_truncated: counter(
                "prompt_truncated_total",
                "turns whose prompt lost quoted discussion blocks to fit",
            ),
            prompts_refused: counter(
                "prompt_refused_total",
                "episodes failed by a prompt that did not fit with every block cut",
            ),
            tool_runs: counter(
                "tool_runs_total",
                "programs run in the sandbox for episode tool calls",
            ),
            tool_failures: counter(
                "tool_failures_total",
                "tool runs that did not exit cleanly (timeout, error, limit)",
            ),
            endpoint_calls: counter(
                "endpoint_calls_total",
                "turns of frozen models sent to an OpenAI-compatible endpoint",
            ),
            endpoint_failures: counter(
                "endpoint_failures_total",
                "endpoint turns that failed after every try (answered empty)",
            ),
            vllm_swaps: counter("vllm_swaps_total", "weight versions swapped into vLLM servers"),
            // In seconds, Prometheus's base unit (kept in microseconds by the engine).
            vllm_swap_seconds: registered(
                &registry,
                Counter::new(
                    "vllm_swap_seconds_total",
                    "time spent swapping weights into vLLM servers (write, load, unload)",
                )
                .expect("metric"),
            ),
            weight_bytes_received: counter(
                "weight_bytes_received_total",
                "weight bytes pulled from sources",
            ),
            weight_bytes_relayed: counter(
                "weight_bytes_relayed_total",
                "weight bytes relayed to other workers",
            ),
            running_sequences: gauge("running_sequences", "sequences in the decode batches"),
            peak_running_sequences: gauge(
                "peak_running_sequences",
                "most sequences in the decode batches at once since start",
            ),
            waiting_turns: gauge("queue_depth", "turns waiting to join a batch"),
            running_episodes: gauge("running_episodes", "episodes in progress"),
            kv_cache_bytes: gauge("kv_cache_bytes", "bytes held by KV caches"),
            registry,
            stats,
        })
    }

    pub fn render(&self) -> String {
        let s = &self.stats;
        let catch_up = |c: &IntCounter, v: u64| c.inc_by(v.saturating_sub(c.get()));
        catch_up(&self.generated_tokens, s.generated_tokens.load(Ordering::Relaxed));
        catch_up(&self.shared_prompt_tokens, s.shared_prompt_tokens.load(Ordering::Relaxed));
        catch_up(&self.episodes_done, s.episodes_done.load(Ordering::Relaxed));
        catch_up(&self.episodes_cancelled, s.episodes_cancelled.load(Ordering::Relaxed));
        let early = s.episodes_cancelled_before_start.load(Ordering::Relaxed);
        catch_up(&self.episodes_cancelled_before_start, early);
        catch_up(&self.tokens_after_stop, s.tokens_after_stop.load(Ordering::Relaxed));
        catch_up(&self.prompts_truncated, s.prompts_truncated.load(Ordering::Relaxed));
        catch_up(&self.prompts_refused, s.prompts_refused.load(Ordering::Relaxed));
        catch_up(&self.tool_runs, s.tool_runs.load(Ordering::Relaxed));
        catch_up(&self.tool_failures, s.tool_failures.load(Ordering::Relaxed));
        catch_up(&self.endpoint_calls, s.endpoint_calls.load(Ordering::Relaxed));
        catch_up(&self.endpoint_failures, s.endpoint_failures.load(Ordering::Relaxed));
        catch_up(&self.vllm_swaps, s.vllm_swaps.load(Ordering::Relaxed));
        let swap = s.vllm_swap_micros.load(Ordering::Relaxed) as f64 / 1e6;
        self.vllm_swap_seconds.inc_by((swap - self.vllm_swap_seconds.get()).max(0.0));
        self.running_sequences.set(s.running_sequences.load(Ordering::Relaxed) as i64);
        self.peak_running_sequences.set(s.peak_running_sequences.load(Ordering::Relaxed) as i64);
        self.waiting_turns.set(s.waiting_turns.load(Ordering::Relaxed) as i64);
        self.running_episodes.set(s.running_episodes.load(Ordering::Relaxed) as i64);
        self.kv_cache_bytes.set(s.kv_cache_bytes.load(Ordering::Relaxed) as i64);
        render(&self.registry)
    }
}
