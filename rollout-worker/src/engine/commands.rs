//! What the async side sends the engine thread, and what it reads back: commands, episode
//! outcomes, snapshots, the counters of the metrics endpoint and the engine's settings.
use super::EngineError;
use crate::models::PolicySpec;
use comas_workflow::program::ProgramStart;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use tch::Device;
use tokio::sync::{mpsc as tmpsc, oneshot};

/// One finished (or failed) episode, sent back on the stream that asked for it.
#[derive(Debug)]
pub struct EpisodeOutcome {
    pub episode_id: String,
    /// The record's JSON, its turns and generated tokens; `EngineError::Draining` is this worker
    /// going away, not the episode's fault.
    pub result: Result<(String, u32, u64), EngineError>,
}

pub struct EpisodeJob {
    pub episode_id: String,
    pub start: ProgramStart,
}

pub struct Snapshot {
    pub versions: BTreeMap<u32, u64>,
    pub running_episodes: usize,
    pub running_sequences: usize,
    pub waiting_turns: usize,
    pub draining: bool,
}

pub enum Command {
    Load {
        specs: Vec<PolicySpec>,
        dtype: String,
        /// The job's engine (`None`: the worker's default).
        engine: Option<EngineKind>,
        reply: oneshot::Sender<Result<(usize, usize), EngineError>>,
    },
    Episode {
        stream: u64,
        job: EpisodeJob,
        results: tmpsc::UnboundedSender<EpisodeOutcome>,
    },
    /// The stream broke: its unfinished episodes are dropped (the coordinator re-queues them).
    CancelStream {
        stream: u64,
    },
    /// Stop these episodes (CancelEpisodes).
    Cancel {
        episode_ids: Vec<String>,
        reply: oneshot::Sender<super::CancelReport>,
    },
    Update {
        agent: u32,
        version: u64,
        tensors: Vec<comas_proto::weights::ReceivedTensor>,
        reply: oneshot::Sender<Result<(), EngineError>>,
    },
    Info {
        reply: oneshot::Sender<Snapshot>,
    },
    /// Stop taking episodes; `reply` fires once the running ones have finished.
    Drain {
        reply: oneshot::Sender<()>,
    },
}

/// Counters the metrics endpoint reads (plain atomics: no locks on the hot path).
#[derive(Default)]
pub struct Stats {
    pub generated_tokens: AtomicU64,
    pub episodes_done: AtomicU64,
    /// Running episodes stopped by a cancel (each one in the stopped count of its cancel's answer).
    pub episodes_cancelled: AtomicU64,
    /// Episodes refused on arrival because their cancel came first (its answer called them
    /// unknown: a lease and its cancel travel on different calls).
    pub episodes_cancelled_before_start: AtomicU64,
    /// Tokens generated for episodes already stopped (sequences that went on decoding).
    pub tokens_after_stop: AtomicU64,
    pub running_sequences: AtomicU64,
    pub waiting_turns: AtomicU64,
    pub running_episodes: AtomicU64,
    pub kv_cache_bytes: AtomicU64,
    /// Prompt tokens whose prefill was copied from an identical prompt's (the batches'
    /// `shared_prompt_tokens`) instead of computed.
    pub shared_prompt_tokens: AtomicU64,
    /// Most sequences decoding at once so far, summed over the base models' batches.
    pub peak_running_sequences: AtomicU64,
    /// Turns whose prompt lost quoted discussion blocks to fit (spec 3.7).
    pub prompts_truncated: AtomicU64,
    /// Episodes failed because a prompt did not fit even with every block cut.
    pub prompts_refused: AtomicU64,
    /// Programs run in the sandbox for episode programs, and those that did not exit cleanly.
    pub tool_runs: AtomicU64,
    pub tool_failures: AtomicU64,
    /// Turns sent to frozen models behind an endpoint, and those that failed after every try.
    pub endpoint_calls: AtomicU64,
    pub endpoint_failures: AtomicU64,
    /// Weight swaps into vLLM servers, and the time they took (writing, loading, unloading).
    pub vllm_swaps: AtomicU64,
    pub vllm_swap_micros: AtomicU64,
}

pub struct EngineSettings {
    pub device: Device,
    /// Most sequences decoding at once per base model; more turns wait in the queue.
    pub max_running: usize,
    /// KV-cache slots per base model: sequences × the widest sequence's prompt + max new tokens.
    /// Admission keeps within it and the cache never allocates more, so it bounds KV memory. A
    /// turn larger than the whole budget fails its episode.
    pub max_batch_tokens: usize,
    /// Prompts longer than this are prefilled this many tokens per step, between decode steps
    /// of the others (0: whole).
    pub prefill_chunk: usize,
    /// A prompt asked again on the same weights, beside the first or while the first runs,
    /// copies the first one's prefill instead of computing it.
    pub share_prompts: bool,
    /// How this worker runs vLLM servers when a job asks for them (`None`: it cannot).
    pub vllm: Option<crate::vllm::VllmSettings>,
    /// What generates the turns of a job that does not say (`--engine`).
    pub default_engine: EngineKind,
    /// `--device` as given: comas's own engine parses it when a job runs on it (a worker whose
    /// turns go to vLLM may name a device its own libtorch build lacks).
    pub device_name: String,
}

/// What generates the turns.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// comas's own engine (libtorch, in this process).
    Comas,
    /// A vLLM OpenAI server per base model (see the `--vllm-*` flags).
    Vllm,
}

impl EngineKind {
    /// A job's choice as LoadPolicies carries it ("" for none).
    pub fn parse(name: &str) -> Result<Option<Self>, String> {
        match name {
            "" => Ok(None),
            "comas" => Ok(Some(EngineKind::Comas)),
            "vllm" => Ok(Some(EngineKind::Vllm)),
            other => Err(format!("unknown engine `{other}`; use comas or vllm")),
        }
    }
}
