//! Turns joining a decode batch: tokenized once, fitted to the context when the method asks,
//! refused with the reason when their prompt passes a limit, and held back while their agent
//! awaits a weight swap or the batch (or its token budget) is full.
use super::*;

impl Runtime<'_> {
    pub(super) fn blocked(&self, agent: u32) -> bool {
        self.updates.iter().any(|(a, ..)| *a == agent)
    }

    /// Moves waiting turns into their base model's batch, unless their agent awaits a weight
    /// swap or the batch is full.
    pub(super) fn admit(&mut self) {
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
    pub(super) fn no_room(
        &self,
        key: u64,
        turn: &TurnRequest,
        prompt: usize,
        base: usize,
    ) -> Option<String> {
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
    pub(super) fn answer_empty(&mut self, key: u64, turn: &TurnRequest, prompt: Vec<i64>) {
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
}
