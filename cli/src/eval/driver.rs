//! The decode loop of `comas eval`: every question's dialogue asks for calls, and the pending
//! calls of all questions decode together in one continuous batch per model.
use anyhow::{anyhow, Context, Result};
use comas_model::{Batcher, CausalLm, ChatMessage, LoraAdapter, SamplingParams, Tokenizer};
use comas_workflow::eval::{call_seed, no_room_error, Call, CallRecord, Dialogue};
use std::collections::VecDeque;

/// One team member's model: its weights, tokenizer and optional adapter.
pub struct Member {
    pub name: String,
    pub model: CausalLm,
    pub tokenizer: Tokenizer,
    pub adapter: Option<LoraAdapter>,
}

/// Sampling of every call (spec §8.1: temperature 0.7).
#[derive(Debug, Clone)]
pub struct CallSampling {
    pub temperature: f64,
    pub max_new_tokens: usize,
    pub seed: u64,
}

/// A question under way: its dialogue and the calls it has finished.
pub struct Open {
    pub index: usize,
    pub dialogue: Dialogue,
    pub calls: Vec<CallRecord>,
}

/// What the loop reports as it goes.
#[derive(Debug, Default, Clone, Copy)]
pub struct Progress {
    pub calls_done: u64,
    pub tokens: u64,
}

/// Runs the dialogues `questions` yields (already started, each with its first calls) to their
/// ends, keeping up to `max_open` of them open: a new one opens as soon as one ends, so the
/// batch never drains between groups of questions. `max_running` bounds the sequences decoding
/// at once per model; with 1, calls run one at a time. `finished` is called with each question
/// as it ends (in order of ending).
pub fn run(
    members: &[Member],
    sampling: &CallSampling,
    max_running: usize,
    max_open: usize,
    mut questions: impl Iterator<Item = (Open, Vec<Call>)>,
    mut finished: impl FnMut(Open, Progress) -> Result<()>,
) -> Result<Progress> {
    let n = members.len();
    let mut open: Vec<Option<Open>> = Vec::new();
    let mut queues: Vec<VecDeque<(usize, Call)>> = vec![VecDeque::new(); n];
    let mut remaining = 0usize;
    // Opens questions into free slots until `max_open` are open or none are left.
    let mut admit = |open: &mut Vec<Option<Open>>,
                     queues: &mut Vec<VecDeque<(usize, Call)>>,
                     remaining: &mut usize| {
        while *remaining < max_open.max(1) {
            let Some((o, calls)) = questions.next() else { break };
            let slot = match open.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    open.push(None);
                    open.len() - 1
                }
            };
            for c in calls {
                queues[c.member % n].push_back((slot, c));
            }
            open[slot] = Some(o);
            *remaining += 1;
        }
    };
    admit(&mut open, &mut queues, &mut remaining);
    let mut batchers: Vec<Batcher> =
        members.iter().map(|m| Batcher::new(&m.model, Some(&m.tokenizer))).collect();
    // Sequence id -> (open slot, call, prompt tokens).
    let mut flying: std::collections::HashMap<u64, (usize, Call, usize)> = Default::default();
    let mut next_id = 0u64;
    let mut progress = Progress::default();
    while remaining > 0 {
        let mut replies: Vec<(usize, Call, CallRecord)> = Vec::new();
        for (m, member) in members.iter().enumerate() {
            while batchers[m].len() < max_running.max(1) {
                let Some((slot, call)) = queues[m].pop_front() else { break };
                let q = open[slot].as_ref().map_or(0, |o| o.index);
                let msgs: Vec<ChatMessage> = call
                    .messages
                    .iter()
                    .map(|x| ChatMessage::new(x.role.clone(), x.content.clone()))
                    .collect();
                let ids = member
                    .tokenizer
                    .encode_chat(&msgs, true)
                    .with_context(|| format!("rendering call {} of question {q}", call.id))?;
                let context = member.model.config().max_position_embeddings.max(0) as usize;
                let room = context.saturating_sub(ids.len()).min(sampling.max_new_tokens);
                if room < 1 {
                    // Spec §8.1: a call that cannot be served answers empty, which grades wrong.
                    let error = Some(no_room_error(ids.len(), context));
                    replies.push((
                        slot,
                        call.clone(),
                        record(&call, member, ids.len(), 0, "error", String::new(), error),
                    ));
                    continue;
                }
                let params = SamplingParams {
                    temperature: sampling.temperature,
                    seed: call_seed(sampling.seed, q as u64, call.id),
                    max_new_tokens: room,
                    stop_token_ids: member.tokenizer.eos_token_ids().to_vec(),
                    ..SamplingParams::default()
                };
                let id = next_id;
                next_id += 1;
                flying.insert(id, (slot, call, ids.len()));
                let prompt_len = ids.len();
                batchers[m]
                    .add(id, ids, params, member.adapter.as_ref())
                    .map_err(|e| anyhow!("queueing a call of {prompt_len} tokens: {e}"))?;
            }
            if batchers[m].is_empty() {
                continue;
            }
            let step = std::panic::AssertUnwindSafe(|| batchers[m].step());
            let done = std::panic::catch_unwind(step).map_err(|p| {
                let cause = comas_service::panic_message(p.as_ref());
                anyhow!(
                    "libtorch failed in a decode step: {cause}; \
                     lower --max-running or --max-new-tokens"
                )
            })??;
            for (id, c) in done {
                let (slot, call, prompt_tokens) =
                    flying.remove(&id).expect("a finished sequence was queued by this loop");
                let text = member.tokenizer.decode(&c.token_ids, true)?;
                let finish = format!("{:?}", c.finish_reason).to_lowercase();
                progress.tokens += c.token_ids.len() as u64;
                replies.push((
                    slot,
                    call.clone(),
                    record(&call, member, prompt_tokens, c.token_ids.len(), &finish, text, None),
                ));
            }
        }
        if replies.is_empty()
            && batchers.iter().all(Batcher::is_empty)
            && queues.iter().all(VecDeque::is_empty)
        {
            return Err(anyhow!(
                "{remaining} questions neither ended nor asked for a call (a setup bug)"
            ));
        }
        for (slot, call, rec) in replies {
            progress.calls_done += 1;
            let o = open[slot].as_mut().expect("replies go to open questions");
            let more = o.dialogue.deliver(call.id, rec.response.clone())?;
            o.calls.push(rec);
            for c in more {
                queues[c.member % n].push_back((slot, c));
            }
            if o.dialogue.output().is_some() {
                // Its slot is reused next: no call of it may still be out.
                if o.dialogue.transcript().any(|(_, reply)| reply.is_none()) {
                    return Err(anyhow!(
                        "question {} ended with calls still unanswered (a setup bug)",
                        o.index
                    ));
                }
                let o = open[slot].take().expect("just checked");
                remaining -= 1;
                finished(o, progress)?;
            }
        }
        admit(&mut open, &mut queues, &mut remaining);
    }
    Ok(progress)
}

fn record(
    call: &Call,
    member: &Member,
    prompt_tokens: usize,
    new_tokens: usize,
    finish: &str,
    response: String,
    error: Option<String>,
) -> CallRecord {
    CallRecord {
        call: call.id,
        label: call.label.clone(),
        member: call.member,
        model: member.name.clone(),
        prompt_tokens,
        new_tokens,
        finish: finish.to_string(),
        messages: call.messages.clone(),
        response,
        error,
    }
}
