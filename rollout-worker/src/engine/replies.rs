//! An episode's replies coming back: a decoded turn (its text, ids, log-probs and version), a
//! tool run or an endpoint's turn; once a group is complete the program takes it and hands out
//! its next group, or the episode ends and its record goes back on its stream.
use super::*;

impl Runtime<'_> {
    pub(super) fn finished(&mut self, base: usize, id: u64, c: Completion) {
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
    pub(super) fn side_done(&mut self, done: SideDone) {
        // A cancelled or failed episode's reply is dropped.
        let Some(ep) = self.episodes.get_mut(&done.episode) else { return };
        ep.replies.push(done.reply);
        self.replied(done.episode);
    }

    /// One reply of episode `key`'s group arrived; once all have, the program takes them and
    /// hands out its next group, or the episode ends.
    pub(super) fn replied(&mut self, key: u64) {
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
}
