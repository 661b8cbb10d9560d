//! The engine thread: it owns the models and KV caches, drives every running episode, and
//! decodes all pending turns that share a base model in one continuous batch, or hands them to
//! the base's vLLM server (`on_vllm`). The async side talks to it over a channel; no tensor
//! leaves this thread.
use crate::models::Models;
use crate::remote::RemoteCalls;
use crate::tools::{SideDone, ToolPool};
use crate::vllm::{self, VllmCalls};
use comas_model::{Batcher, ChatMessage, Completion, FinishReason as ModelFinish, SamplingParams};
use comas_workflow::method::PromptFit;
use comas_workflow::program::{Program, Reply, Request};
use comas_workflow::{ConstrainedToken, FinishReason, TurnOutput, TurnRequest};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;
use tokio::sync::{mpsc as tmpsc, oneshot};

mod admit;
mod cancel;
mod commands;
mod error;
mod fault;
mod on_vllm;
mod replies;
mod room;

pub use cancel::CancelReport;
pub use commands::{
    Command, EngineKind, EngineSettings, EpisodeJob, EpisodeOutcome, Snapshot, Stats,
};
pub use error::EngineError;
pub(crate) use fault::{fault_from_env, Fault};
use room::meter_for;

/// Starts the engine thread; the handle tells the server when the thread has died.
pub fn spawn(
    settings: EngineSettings,
    stats: Arc<Stats>,
) -> (mpsc::Sender<Command>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("worker-engine".into())
        .spawn(move || {
            let mut models = Models::empty();
            let mut pending: Option<Command> = None;
            loop {
                let next = match pending.take() {
                    Some(c) => c,
                    None => match rx.recv() {
                        Ok(c) => c,
                        Err(_) => return,
                    },
                };
                match next {
                    Command::Load { specs, dtype, engine, reply } => {
                        if let Some(Fault::SlowLoad(secs)) = fault_from_env() {
                            std::thread::sleep(Duration::from_secs(secs));
                        }
                        let on_vllm = engine.unwrap_or(settings.default_engine) == EngineKind::Vllm;
                        // The servers of the policies loaded before stop first: their memory is
                        // what the new ones start in.
                        if on_vllm || models.bases.iter().any(|b| b.vllm().is_some()) {
                            models = Models::empty();
                        }
                        match load_models(&specs, &dtype, on_vllm, &settings) {
                            Ok(m) => {
                                let _ = reply
                                    .send(Ok((m.agents.len() + m.remote.len(), m.bases.len())));
                                models = m;
                            }
                            // The policies loaded before stay (on comas's own engine).
                            Err(e) => {
                                let _ = reply.send(Err(e));
                            }
                        }
                    }
                    other => {
                        // Runs until a Load arrives (returned here) or the channel closes.
                        let mut rt = Runtime::new(&models, &settings, Arc::clone(&stats));
                        pending = rt.run(other, &rx);
                        if pending.is_none() {
                            return;
                        }
                    }
                }
            }
        })
        .expect("spawn engine thread");
    (tx, handle)
}

/// The policies of a job, on vLLM or on comas's own engine on the worker's device.
fn load_models(
    specs: &[crate::models::PolicySpec],
    dtype: &str,
    on_vllm: bool,
    settings: &EngineSettings,
) -> Result<Models, EngineError> {
    if on_vllm {
        let Some(v) = &settings.vllm else {
            return Err(vllm::VllmError::Setup(
                "the job asks for engine = \"vllm\" but this worker cannot start vLLM".into(),
            )
            .into());
        };
        return Models::load(specs, dtype, tch::Device::Cpu, Some(v));
    }
    let device = if settings.default_engine == EngineKind::Comas {
        settings.device
    } else {
        comas_model::dtype::parse_device(&settings.device_name)?
    };
    Models::load(specs, dtype, device, None)
}

struct RunningEpisode {
    id: String,
    stream: u64,
    program: Program,
    /// How the method fits its prompts, and the job's prompt limit.
    fit: PromptFit,
    replies: Vec<Reply>,
    in_flight: usize,
    tokens: u64,
    results: tmpsc::UnboundedSender<EpisodeOutcome>,
}

struct Seq {
    base: usize,
    episode: u64,
    turn: TurnRequest,
    prompt_ids: Vec<i64>,
    version: u64,
}

/// A turn waiting for room in its batch. Its prompt is rendered and tokenized the first time it
/// is considered and kept, so a turn that waits many decode steps is tokenized once.
struct WaitingTurn {
    key: u64,
    turn: TurnRequest,
    prompt: Option<Vec<i64>>,
}

struct Runtime<'m> {
    models: &'m Models,
    settings: &'m EngineSettings,
    stats: Arc<Stats>,
    tools: ToolPool,
    /// Turns of frozen models behind an endpoint.
    remote: RemoteCalls,
    /// Where tool runs and endpoint turns come back.
    side_results: mpsc::Receiver<SideDone>,
    /// Tool runs and endpoint turns handed out whose results have not been taken yet.
    side_out: usize,
    /// One batch per base on comas's own engine; `None` for a base on a vLLM server.
    batchers: Vec<Option<Batcher<'m>>>,
    /// Turns on vLLM servers: their calls, where they come back, and how many are out per base.
    vllm: Option<VllmCalls>,
    vllm_results: mpsc::Receiver<vllm::Done>,
    vllm_out: Vec<usize>,
    episodes: HashMap<u64, RunningEpisode>,
    seqs: HashMap<u64, Seq>,
    waiting: VecDeque<WaitingTurn>,
    versions: BTreeMap<u32, u64>,
    in_flight: BTreeMap<u32, usize>,
    updates: Vec<(
        u32,
        u64,
        Vec<comas_proto::weights::ReceivedTensor>,
        oneshot::Sender<Result<(), EngineError>>,
    )>,
    drain: Option<oneshot::Sender<()>>,
    draining: bool,
    next_episode: u64,
    next_seq: u64,
    steps: u64,
    fault: Option<Fault>,
    /// Cancels that came before their episode.
    remembered: cancel::Remembered,
}

fn finish_of(c: &Completion) -> FinishReason {
    match c.finish_reason {
        ModelFinish::Stop => FinishReason::Stop,
        ModelFinish::Length => FinishReason::Length,
    }
}

/// The batch of base model `b`, its KV cache capped at the token budget; none for a base on a
/// vLLM server.
fn new_batcher<'m>(models: &'m Models, settings: &EngineSettings, b: usize) -> Option<Batcher<'m>> {
    let base = &models.bases[b];
    let mut batcher = Batcher::new(base.own()?, Some(&base.tokenizer));
    batcher.set_cache_limit(Some(settings.max_batch_tokens));
    batcher.set_prefill_chunk(Some(settings.prefill_chunk));
    batcher.set_prompt_sharing(settings.share_prompts);
    Some(batcher)
}

impl<'m> Runtime<'m> {
    fn new(models: &'m Models, settings: &'m EngineSettings, stats: Arc<Stats>) -> Self {
        let batchers = (0..models.bases.len()).map(|b| new_batcher(models, settings, b)).collect();
        let (done, side_results) = mpsc::channel();
        let tools = ToolPool::new(done.clone(), Arc::clone(&stats));
        let remote = RemoteCalls::new(done, Arc::clone(&stats));
        let (vllm_done, vllm_results) = mpsc::channel();
        let vllm = if models.bases.iter().any(|b| b.vllm().is_some()) {
            match VllmCalls::new(vllm_done) {
                Ok(c) => Some(c),
                Err(e) => {
                    // Without its runtime a vLLM worker cannot generate: a worker failure.
                    tracing::error!(error = %e, "cannot start the vLLM call runtime");
                    std::process::exit(70);
                }
            }
        } else {
            None
        };
        Self {
            models,
            settings,
            stats,
            tools,
            remote,
            side_results,
            side_out: 0,
            batchers,
            vllm,
            vllm_results,
            vllm_out: vec![0; models.bases.len()],
            episodes: HashMap::new(),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            versions: models.agents.keys().chain(models.remote.keys()).map(|&a| (a, 0)).collect(),
            in_flight: BTreeMap::new(),
            updates: Vec::new(),
            drain: None,
            draining: false,
            next_episode: 0,
            next_seq: 0,
            steps: 0,
            fault: fault_from_env(),
            remembered: cancel::Remembered::default(),
        }
    }

    fn idle(&self) -> bool {
        self.episodes.is_empty()
    }

    /// Handles one command; returns it back if it must leave this runtime (Load).
    fn handle(&mut self, cmd: Command) -> Option<Command> {
        match cmd {
            Command::Load { specs, dtype, engine, reply } => {
                if self.idle() {
                    return Some(Command::Load { specs, dtype, engine, reply });
                }
                let _ =
                    reply.send(Err(EngineError::EpisodesRunning { running: self.episodes.len() }));
            }
            Command::Episode { stream, job, results } => self.start_episode(stream, job, results),
            Command::CancelStream { stream } => {
                let dropped: Vec<u64> = self
                    .episodes
                    .iter()
                    .filter(|(_, e)| e.stream == stream)
                    .map(|(&k, _)| k)
                    .collect();
                for &k in &dropped {
                    self.stop_episode(k);
                }
                if !dropped.is_empty() {
                    tracing::info!(
                        stream,
                        dropped = dropped.len(),
                        "stream closed; its unfinished episodes are dropped"
                    );
                }
            }
            Command::Cancel { episode_ids, reply } => {
                let _ = reply.send(self.cancel(episode_ids));
            }
            Command::Update { agent, version, tensors, reply } => {
                if self.models.remote.contains_key(&agent) {
                    let _ = reply.send(Err(EngineError::RemoteAgent { agent }));
                } else if !self.models.agents.contains_key(&agent) {
                    let _ = reply.send(Err(EngineError::AgentNotLoaded { agent }));
                } else {
                    self.updates.push((agent, version, tensors, reply));
                }
            }
            Command::Info { reply } => {
                let _ = reply.send(Snapshot {
                    versions: self.versions.clone(),
                    running_episodes: self.episodes.len(),
                    running_sequences: self.running(),
                    waiting_turns: self.waiting.len(),
                    draining: self.draining,
                });
            }
            Command::Drain { reply } => {
                self.draining = true;
                self.drain = Some(reply);
            }
        }
        None
    }

    fn start_episode(
        &mut self,
        stream: u64,
        job: EpisodeJob,
        results: tmpsc::UnboundedSender<EpisodeOutcome>,
    ) {
        let fail = |results: &tmpsc::UnboundedSender<EpisodeOutcome>, id: String, e| {
            let _ = results.send(EpisodeOutcome { episode_id: id, result: Err(e) });
        };
        if self.draining {
            return fail(&results, job.episode_id, EngineError::Draining);
        }
        if self.remembered.take(&job.episode_id) {
            self.stats.episodes_cancelled_before_start.fetch_add(1, Ordering::Relaxed);
            return fail(&results, job.episode_id, EngineError::Cancelled);
        }
        if let Some(a) =
            job.start.agents().into_iter().find(|a| {
                !self.models.agents.contains_key(a) && !self.models.remote.contains_key(a)
            })
        {
            return fail(&results, job.episode_id, EngineError::EpisodeAgentNotLoaded { agent: a });
        }
        let fit = job.start.prompt_fit();
        let meter = meter_for(self.models, self.settings, &fit);
        match Program::start(&job.start, meter.as_ref()) {
            Err(e) => fail(&results, job.episode_id, EngineError::InvalidEpisode(e)),
            Ok(program) => {
                let key = self.next_episode;
                self.next_episode += 1;
                let requests = program.pending();
                self.episodes.insert(
                    key,
                    RunningEpisode {
                        id: job.episode_id,
                        stream,
                        program,
                        fit,
                        replies: Vec::new(),
                        in_flight: 0,
                        tokens: 0,
                        results,
                    },
                );
                self.enqueue(key, requests);
            }
        }
    }

    fn count_truncated(&self, turn: &TurnRequest) {
        if turn.blocks_cut > 0 {
            self.stats.prompts_truncated.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands out a program's group: generations wait for a batch, tool runs go to the pool.
    fn enqueue(&mut self, key: u64, requests: Vec<Request>) {
        if let Some(e) = self.episodes.get_mut(&key) {
            e.in_flight += requests.len();
        }
        for r in requests {
            match r {
                Request::Turn(turn) => {
                    self.count_truncated(&turn);
                    if let Some(policy) = self.models.remote.get(&turn.agent) {
                        self.side_out += 1;
                        self.remote.submit(key, turn, policy);
                    } else {
                        self.waiting.push_back(WaitingTurn { key, turn, prompt: None });
                    }
                }
                Request::Tool(t) => {
                    self.side_out += 1;
                    self.tools.submit(key, t);
                }
            }
        }
    }

    fn release(&mut self, seq: &Seq) {
        if let Some(n) = self.in_flight.get_mut(&seq.turn.agent) {
            *n -= 1;
        }
    }

    fn fail_episode(&mut self, key: u64, error: EngineError) {
        if let Some(e) = self.episodes.remove(&key) {
            let _ = e.results.send(EpisodeOutcome { episode_id: e.id, result: Err(error) });
        }
    }

    /// Swaps in weights for agents whose turns in flight have all finished.
    fn apply_updates(&mut self) {
        let mut i = 0;
        while i < self.updates.len() {
            let agent = self.updates[i].0;
            if self.in_flight.get(&agent).copied().unwrap_or(0) > 0 {
                i += 1;
                continue;
            }
            let (agent, version, tensors, reply) = self.updates.remove(i);
            let on_vllm = self.models.bases[self.models.agents[&agent].base].vllm().is_some();
            let r = if self.fault == Some(Fault::StaleWeights) {
                Ok(())
            } else if on_vllm {
                self.swap_on_vllm(agent, version, &tensors)
            } else {
                self.models.apply_update(agent, &tensors)
            };
            if r.is_ok() {
                self.versions.insert(agent, version);
                tracing::info!(agent, version, "weights swapped in");
            }
            let _ = reply.send(r);
        }
    }

    /// Sequences decoding here or generating on a vLLM server.
    fn running(&self) -> usize {
        self.batchers.iter().flatten().map(Batcher::len).sum::<usize>()
            + self.vllm_out.iter().sum::<usize>()
    }

    fn publish_stats(&self) {
        self.stats.running_sequences.store(self.running() as u64, Ordering::Relaxed);
        self.stats.waiting_turns.store(self.waiting.len() as u64, Ordering::Relaxed);
        self.stats.running_episodes.store(self.episodes.len() as u64, Ordering::Relaxed);
        let kv: i64 = self.batchers.iter().flatten().map(Batcher::cache_bytes).sum();
        self.stats.kv_cache_bytes.store(kv.max(0) as u64, Ordering::Relaxed);
    }

    fn run(&mut self, first: Command, rx: &mpsc::Receiver<Command>) -> Option<Command> {
        if let Some(c) = self.handle(first) {
            return Some(c);
        }
        loop {
            // Take every command that is waiting; block only when there is nothing to decode.
            loop {
                let busy = self.batchers.iter().flatten().any(|b| !b.is_empty())
                    || !self.waiting.is_empty()
                    || !self.updates.is_empty();
                let cmd = if busy {
                    match rx.try_recv() {
                        Ok(c) => c,
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => return None,
                    }
                } else {
                    // Tool results and endpoint turns come on their own channel: look at it
                    // often while some are out.
                    let wait = if self.side_out > 0 || self.vllm_out.iter().any(|&n| n > 0) {
                        Duration::from_millis(5)
                    } else {
                        Duration::from_millis(200)
                    };
                    match rx.recv_timeout(wait) {
                        Ok(c) => c,
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return None,
                    }
                };
                if let Some(c) = self.handle(cmd) {
                    return Some(c);
                }
            }
            while let Ok(done) = self.side_results.try_recv() {
                self.side_out -= 1;
                self.side_done(done);
            }
            while let Ok(done) = self.vllm_results.try_recv() {
                self.vllm_done(done);
            }
            self.apply_updates();
            self.admit();
            for b in 0..self.batchers.len() {
                if self.batchers[b].as_ref().is_none_or(Batcher::is_empty) {
                    continue;
                }
                if let Some(Fault::SlowDecode(ms)) = self.fault {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let step = {
                    let _span = tracing::trace_span!("decode_step", base = b).entered();
                    // libtorch reports some failures (an allocation too large) by panicking in
                    // tch; the step's sequences fail and the batch starts afresh. The weights
                    // are only read by a step, so they are intact.
                    let batcher = self.batchers[b].as_mut().expect("checked above");
                    self.steps += 1;
                    let inject = self.fault == Some(Fault::StepPanic(self.steps));
                    let shared_before = batcher.shared_prompt_tokens();
                    let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if inject {
                            panic!("injected by COMAS_WORKER_FAULT");
                        }
                        batcher.step()
                    }))
                    .unwrap_or_else(|p| {
                        Err(comas_model::ModelError::Input(format!(
                            "the decode step panicked: {}",
                            comas_service::panic_message(p.as_ref())
                        )))
                    });
                    let shared = batcher.shared_prompt_tokens().saturating_sub(shared_before);
                    self.stats.shared_prompt_tokens.fetch_add(shared, Ordering::Relaxed);
                    step
                };
                match step {
                    Ok(done) => {
                        for (id, c) in done {
                            self.finished(b, id, c);
                        }
                    }
                    Err(e) => {
                        // A failing step poisons every sequence of this batch: fail their episodes.
                        tracing::error!(error = %e, "decode step failed");
                        let e = Arc::new(e);
                        let lost: Vec<u64> = self
                            .seqs
                            .iter()
                            .filter(|(_, s)| s.base == b)
                            .map(|(&id, _)| id)
                            .collect();
                        for id in lost {
                            let s = self.seqs.remove(&id).expect("listed");
                            self.release(&s);
                            self.fail_episode(s.episode, EngineError::DecodeFailed(Arc::clone(&e)));
                        }
                        self.batchers[b] = new_batcher(self.models, self.settings, b);
                    }
                }
            }
            if self.fault == Some(Fault::EnginePanic(self.steps)) {
                panic!("injected by COMAS_WORKER_FAULT after step {}", self.steps);
            }
            self.apply_updates();
            self.publish_stats();
            if self.draining && self.idle() {
                if let Some(r) = self.drain.take() {
                    let _ = r.send(());
                }
            }
        }
    }
}
