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

mod cancel;
mod commands;
mod error;
mod fault;
mod on_vllm;
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
            self.stats.episodes_cancelled.fetch_add(1, Ordering::Relaxed);
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

    fn blocked(&self, agent: u32) -> bool {
        self.updates.iter().any(|(a, ..)| *a == agent)
    }

    /// Moves waiting turns into their base model's batch, unless their agent awaits a weight
    /// swap or the batch is full.
    fn admit(&mut self) {
        let mut keep = VecDeque::new();
        while let Some(mut w) = self.waiting.pop_front() {
            if !self.episodes.contains_key(&w.key) {
                continue;
            }
            let policy = &self.models.agents[&w.turn.agent];
            let in_base = match &self.batchers[policy.base] {
                Some(b) => b.len(),
                None => self.vllm_out[policy.base],
            };
            if self.blocked(w.turn.agent) || in_base >= self.settings.max_running {
                keep.push_back(w);
                continue;
            }
            let base = &self.models.bases[policy.base];
            let prompt = match w.prompt.take() {
                Some(p) => p,
                None => {
                    let msgs: Vec<ChatMessage> = w
                        .turn
                        .messages
                        .iter()
                        .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                        .collect();
                    match base.tokenizer.encode_chat(&msgs, true) {
                        Ok(p) => p,
                        Err(e) => {
                            let turn = w.turn.turn_index;
                            self.fail_episode(w.key, EngineError::TurnNotStarted { turn, err: e });
                            continue;
                        }
                    }
                }
            };
            if w.turn.sampling.fit_context {
                let room = self
                    .models
                    .context(policy.base)
                    .min(self.settings.max_batch_tokens)
                    .saturating_sub(prompt.len());
                if room == 0 {
                    self.answer_empty(w.key, &w.turn, prompt);
                    continue;
                }
                w.turn.sampling.max_new_tokens = w.turn.sampling.max_new_tokens.min(room as u32);
                w.turn.sampling.min_new_tokens =
                    w.turn.sampling.min_new_tokens.min(w.turn.sampling.max_new_tokens);
            }
            let need = prompt.len() + w.turn.sampling.max_new_tokens as usize;
            if let Some(why) = self.no_room(w.key, &w.turn, prompt.len(), policy.base) {
                self.stats.prompts_refused.fetch_add(1, Ordering::Relaxed);
                let t = &w.turn;
                let (turn, role, round, agent) = (t.turn_index, t.role, t.round, t.agent);
                self.fail_episode(w.key, EngineError::NoRoom { turn, role, round, agent, why });
                continue;
            }
            // The cache gives every row the widest row's columns, so that is what must fit.
            if let Some(batcher) = &self.batchers[policy.base] {
                if batcher.slots_if_added(need) > self.settings.max_batch_tokens {
                    w.prompt = Some(prompt);
                    keep.push_back(w);
                    continue;
                }
            }
            let WaitingTurn { key, turn, .. } = w;
            let s = &turn.sampling;
            let params = SamplingParams {
                temperature: s.temperature,
                top_k: s.top_k as usize,
                top_p: s.top_p,
                seed: turn.seed,
                max_new_tokens: s.max_new_tokens as usize,
                min_new_tokens: (s.min_new_tokens as usize).min(s.max_new_tokens as usize),
                stop_token_ids: base.tokenizer.eos_token_ids().to_vec(),
                stop_strings: Vec::new(),
                guided_suffix: s.guided_suffix.clone(),
            };
            let id = self.next_seq;
            self.next_seq += 1;
            let added = match (&mut self.batchers[policy.base], &mut self.vllm) {
                (Some(batcher), _) => {
                    batcher.add(id, prompt.clone(), params, policy.adapter.as_ref())
                }
                (None, Some(calls)) => {
                    let server = base.vllm().expect("a base without a batcher is on vLLM");
                    let model = if policy.adapter.is_some() {
                        vllm::adapter_name(turn.agent, self.versions[&turn.agent])
                    } else {
                        server.served_name.clone()
                    };
                    self.vllm_out[policy.base] += 1;
                    calls.submit(vllm::Generation {
                        seq: id,
                        endpoint: server.endpoint.clone(),
                        model,
                        prompt: prompt.clone(),
                        params,
                        seeded: server.seeded,
                    });
                    Ok(())
                }
                (None, None) => unreachable!("a runtime with vLLM bases has its calls"),
            };
            match added {
                Ok(()) => {
                    let prompt_ids = prompt;
                    *self.in_flight.entry(turn.agent).or_default() += 1;
                    let version = self.versions[&turn.agent];
                    self.seqs.insert(
                        id,
                        Seq { base: policy.base, episode: key, turn, prompt_ids, version },
                    );
                }
                Err(e) => self.fail_episode(
                    key,
                    EngineError::TurnNotStarted { turn: turn.turn_index, err: e },
                ),
            }
        }
        self.waiting = keep;
        let running = self.running();
        self.stats.peak_running_sequences.fetch_max(running as u64, Ordering::Relaxed);
    }

    /// Why a tokenized prompt of `prompt` tokens cannot run here, if it cannot: it would pass
    /// the job's prompt limit, the model's context or this worker's whole token budget.
    fn no_room(&self, key: u64, turn: &TurnRequest, prompt: usize, base: usize) -> Option<String> {
        let new = turn.sampling.max_new_tokens as usize;
        let cut = if turn.blocks_cut > 0 {
            format!(" even with {} quoted discussion blocks cut", turn.blocks_cut)
        } else {
            String::new()
        };
        let context = self.models.context(base);
        let budget = self.settings.max_batch_tokens;
        if let Some(e) = self.episodes.get(&key) {
            if let Some((max, key)) = e.fit.max_len.as_ref().filter(|(m, _)| prompt > *m as usize) {
                return Some(format!("its prompt is {prompt} tokens{cut}, over {key} {max}; the problem text is too long for this job"));
            }
        }
        if prompt + new > context {
            return Some(format!(
                "its prompt of {prompt} tokens{cut} and max_new_tokens {new} exceed the model's context of {context} tokens (max_position_embeddings); shorten the problem or lower sampling.{}.max_new_tokens",
                turn.role
            ));
        }
        if prompt + new > budget {
            return Some(format!(
                "its prompt of {prompt} tokens{cut} and max_new_tokens {new} exceed this worker's token budget of {budget} (--max-batch-tokens)"
            ));
        }
        None
    }

    /// A `fit_context` turn whose prompt leaves no room: it is answered with nothing, cut at
    /// length, as one machine's `comas eval` answers it.
    fn answer_empty(&mut self, key: u64, turn: &TurnRequest, prompt: Vec<i64>) {
        let Some(ep) = self.episodes.get_mut(&key) else { return };
        ep.replies.push(Reply::Turn(TurnOutput {
            turn_index: turn.turn_index,
            text: String::new(),
            raw_text: String::new(),
            prompt_ids: prompt.iter().map(|&t| t as u32).collect(),
            completion_ids: Vec::new(),
            logprobs: Vec::new(),
            finish_reason: FinishReason::Length,
            policy_version: self.versions[&turn.agent],
            constrained: Vec::new(),
        }));
        self.replied(key);
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

    fn finished(&mut self, base: usize, id: u64, c: Completion) {
        let Some(seq) = self.seqs.remove(&id) else {
            // Its episode was stopped but the sequence was not: decoding spent for nothing.
            self.stats.tokens_after_stop.fetch_add(c.token_ids.len() as u64, Ordering::Relaxed);
            return;
        };
        self.release(&seq);
        self.stats.generated_tokens.fetch_add(c.token_ids.len() as u64, Ordering::Relaxed);
        let Some(ep) = self.episodes.get_mut(&seq.episode) else {
            self.stats.tokens_after_stop.fetch_add(c.token_ids.len() as u64, Ordering::Relaxed);
            return;
        };
        let tok = &self.models.bases[base].tokenizer;
        // Only a stop token is hidden from the text; a guided tail also ends with Stop.
        let stop = c.finish_reason == ModelFinish::Stop
            && c.stop_string.is_none()
            && c.token_ids.last().is_some_and(|t| tok.eos_token_ids().contains(t));
        let visible = if stop { &c.token_ids[..c.token_ids.len() - 1] } else { &c.token_ids[..] };
        let text = tok.decode(visible, true).unwrap_or_default();
        let raw_text = tok.decode(&c.token_ids, false).unwrap_or_default();
        ep.tokens += c.token_ids.len() as u64;
        ep.replies.push(Reply::Turn(TurnOutput {
            turn_index: seq.turn.turn_index,
            text,
            raw_text,
            prompt_ids: seq.prompt_ids.iter().map(|&t| t as u32).collect(),
            completion_ids: c.token_ids.iter().map(|&t| t as u32).collect(),
            logprobs: c.logprobs.clone(),
            finish_reason: finish_of(&c),
            policy_version: seq.version,
            constrained: c
                .constrained
                .iter()
                .map(|k| ConstrainedToken {
                    position: k.position as u32,
                    allowed: k.allowed.iter().map(|&t| t as u32).collect(),
                })
                .collect(),
        }));
        let key = seq.episode;
        self.replied(key);
    }

    /// A tool run or an endpoint's turn came back: the episode's group may be complete.
    fn side_done(&mut self, done: SideDone) {
        // A cancelled or failed episode's reply is dropped.
        let Some(ep) = self.episodes.get_mut(&done.episode) else { return };
        ep.replies.push(done.reply);
        self.replied(done.episode);
    }

    /// One reply of episode `key`'s group arrived; once all have, the program takes them and
    /// hands out its next group, or the episode ends.
    fn replied(&mut self, key: u64) {
        let Some(ep) = self.episodes.get_mut(&key) else { return };
        ep.in_flight -= 1;
        if ep.in_flight > 0 {
            return;
        }
        let replies = std::mem::take(&mut ep.replies);
        let meter = meter_for(self.models, self.settings, &ep.fit);
        if let Err(e) = ep.program.submit(replies, meter.as_ref()) {
            return self.fail_episode(key, EngineError::ProtocolRejected(e));
        }
        if !ep.program.is_done() {
            let requests = ep.program.pending();
            return self.enqueue(key, requests);
        }
        let e = self.episodes.remove(&key).expect("episode present");
        let done = self.stats.episodes_done.load(Ordering::Relaxed) + 1;
        let stale = self.fault == Some(Fault::StaleVersion(done));
        let tokens = e.tokens;
        let result = e
            .program
            .finish()
            .map(|mut record| {
                if stale {
                    record.shift_versions(1000);
                }
                record
            })
            .map_err(EngineError::Finish)
            .and_then(|record| {
                record
                    .to_json()
                    .map(|json| (json, record.turns(), tokens))
                    .map_err(EngineError::RecordJson)
            });
        self.stats.episodes_done.fetch_add(1, Ordering::Relaxed);
        let _ = e.results.send(EpisodeOutcome { episode_id: e.id, result });
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
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
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
                    })
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
