//! Stopping episodes before their end: a cancel from the coordinator (another copy of the
//! episode was accepted, or its job ended) and a broken stream. Their sequences leave the decode
//! batch at once (or their vLLM requests are dropped, which aborts them on the server), so no
//! token is spent on them after the stop; tokens that still arrive for a stopped episode are
//! counted (`Stats::tokens_after_stop`).
use super::{EngineError, EpisodeOutcome, Runtime};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering;
use tokio::sync::mpsc as tmpsc;

/// What a cancel did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CancelReport {
    /// Episodes that were running here and stopped.
    pub stopped: u32,
    /// Ids not running here: finished already, or not arrived yet (remembered).
    pub unknown: u32,
    /// Tokens the stopped episodes had generated.
    pub tokens_before: u64,
}

/// An episode taken out before its end.
pub(super) struct Stopped {
    pub id: String,
    /// Tokens it had generated.
    pub tokens: u64,
    /// Its stream's channel.
    pub results: tmpsc::UnboundedSender<EpisodeOutcome>,
}

/// Cancelled ids whose spec has not arrived (the cancel overtook it), the newest kept.
#[derive(Default)]
pub(super) struct Remembered {
    order: VecDeque<String>,
    ids: HashSet<String>,
}

/// Cancelled ids remembered at most; an older one whose spec never came is forgotten.
const REMEMBERED: usize = 4096;

impl Remembered {
    fn insert(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }

    /// Whether `id` was cancelled before it arrived (then it is forgotten: ids are unique).
    pub(super) fn take(&mut self, id: &str) -> bool {
        self.ids.remove(id)
    }
}

impl Runtime<'_> {
    /// Stops the episodes named; each one answers on its stream with `EngineError::Cancelled`.
    pub(super) fn cancel(&mut self, ids: Vec<String>) -> CancelReport {
        let mut report = CancelReport::default();
        for id in ids {
            let key = self.episodes.iter().find(|(_, e)| e.id == id).map(|(&k, _)| k);
            match key.and_then(|k| self.stop_episode(k)) {
                Some(s) => {
                    report.stopped += 1;
                    report.tokens_before += s.tokens;
                    self.stats.episodes_cancelled.fetch_add(1, Ordering::Relaxed);
                    // On the episode's own stream, which counts it as answered.
                    let outcome =
                        EpisodeOutcome { episode_id: s.id, result: Err(EngineError::Cancelled) };
                    let _ = s.results.send(outcome);
                }
                None => {
                    report.unknown += 1;
                    self.remembered.insert(id);
                }
            }
        }
        if report.stopped > 0 {
            tracing::info!(
                stopped = report.stopped,
                unknown = report.unknown,
                tokens = report.tokens_before,
                "episodes cancelled"
            );
        }
        report
    }

    /// Takes episode `key` out with everything it has in flight: turns waiting for a batch,
    /// sequences decoding (they leave their batch now) and requests on a vLLM server (dropped).
    /// Tool runs and endpoint turns finish on their own and are discarded.
    pub(super) fn stop_episode(&mut self, key: u64) -> Option<Stopped> {
        let episode = self.episodes.remove(&key)?;
        self.waiting.retain(|w| w.key != key);
        let mut tokens = episode.tokens;
        let seqs: Vec<u64> =
            self.seqs.iter().filter(|(_, s)| s.episode == key).map(|(&id, _)| id).collect();
        for id in seqs {
            let seq = self.seqs.remove(&id).expect("listed");
            self.release(&seq);
            match (&mut self.batchers[seq.base], &mut self.vllm) {
                (Some(batcher), _) => match batcher.abort(id) {
                    Ok(made) => tokens += made.unwrap_or(0) as u64,
                    // Only the cache's shrinking can fail; the row has left all the same.
                    Err(e) => tracing::warn!(error = %e, "resizing the cache after a stop"),
                },
                (None, Some(calls)) => {
                    calls.abort(id);
                    self.vllm_out[seq.base] -= 1;
                }
                (None, None) => {}
            }
        }
        Some(Stopped { id: episode.id, tokens, results: episode.results })
    }
}
