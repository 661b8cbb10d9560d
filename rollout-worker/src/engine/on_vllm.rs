//! The engine's side of turns generated on vLLM servers (`crate::vllm`): a returned turn goes
//! on as one of comas's own would, a failed one fails its episode (a dead or hung server stops
//! the worker), and new weights are handed to the agent's server.
use super::{EngineError, Runtime};
use crate::vllm;
use std::sync::atomic::Ordering;

impl Runtime<'_> {
    /// A turn came back from a vLLM server: its completion goes on as one of comas's own
    /// engine would; a failure fails its episode, and a server that is gone fails the worker.
    pub(super) fn vllm_done(&mut self, done: vllm::Done) {
        if let Some(calls) = &mut self.vllm {
            calls.forget(done.seq);
        }
        let Some(seq) = self.seqs.get(&done.seq) else { return };
        let base = seq.base;
        self.vllm_out[base] -= 1;
        let guided = seq.turn.sampling.guided_suffix.clone();
        let tokenizer = &self.models.bases[base].tokenizer;
        match done.result.and_then(|g| vllm::completion_of(g, tokenizer, guided.as_deref())) {
            Ok(c) => self.finished(base, done.seq, c),
            Err(e) => {
                let s = self.seqs.remove(&done.seq).expect("present");
                self.release(&s);
                tracing::error!(error = %e, turn = s.turn.turn_index, "a vLLM turn failed");
                let hung = matches!(
                    e,
                    vllm::VllmError::Call { err: comas_service::openai::CallError::Timeout(_), .. }
                );
                self.fail_episode(s.episode, EngineError::Vllm(e));
                if hung {
                    // Alive but not answering within the floor rate: as good as dead.
                    tracing::error!("the vLLM server hangs; this worker stops");
                    std::process::exit(70);
                }
                self.check_servers();
            }
        }
    }

    /// A vLLM server that has exited takes this worker with it: the coordinator sends its
    /// episodes elsewhere, as for any worker that dies.
    fn check_servers(&self) {
        for b in &self.models.bases {
            let Some(server) = b.vllm() else { continue };
            if let Some(status) = server.exited() {
                tracing::error!(%status, log = %server.log_tail(), "the vLLM server exited; this worker stops");
                std::process::exit(70);
            }
        }
    }

    /// Hands an agent's new weights to its vLLM server: an adapter is written and loaded under
    /// its version's name and the previous version unloaded (no turn runs on it: updates wait
    /// for the agent's turns in flight); full weights are written and reloaded in place.
    pub(super) fn swap_on_vllm(
        &self,
        agent: u32,
        version: u64,
        tensors: &[comas_proto::weights::ReceivedTensor],
    ) -> Result<(), EngineError> {
        let Some(settings) = &self.settings.vllm else { return Ok(()) };
        let policy = &self.models.agents[&agent];
        let Some(server) = self.models.bases[policy.base].vllm() else { return Ok(()) };
        let started = std::time::Instant::now();
        let dir = settings.work_dir.join(vllm::adapter_name(agent, version));
        let write = |e: String| vllm::VllmError::Write { path: dir.clone(), err: e };
        match &policy.adapter {
            Some(adapter) => {
                self.models.apply_update(agent, tensors)?;
                adapter.save(&dir).map_err(|e| write(e.to_string()))?;
                vllm::load_adapter(server, &vllm::adapter_name(agent, version), &dir)?;
                let old = self.versions[&agent];
                if old != version {
                    vllm::unload_adapter(server, &vllm::adapter_name(agent, old))?;
                    let _ = std::fs::remove_dir_all(
                        settings.work_dir.join(vllm::adapter_name(agent, old)),
                    );
                }
            }
            None => {
                let named = tensors
                    .iter()
                    .map(|t| {
                        let kind = comas_model::dtype::parse_kind(&t.dtype)
                            .map_err(|err| EngineError::BadDtype { name: t.name.clone(), err })?;
                        let v = tch::Tensor::f_from_data_size(&t.bytes, &t.shape, kind)
                            .map_err(|err| EngineError::BadTensor { name: t.name.clone(), err })?;
                        Ok((t.name.clone(), v))
                    })
                    .collect::<Result<Vec<_>, EngineError>>()?;
                std::fs::create_dir_all(&dir).map_err(|e| write(e.to_string()))?;
                comas_model::safetensors::write(
                    &dir.join("model.safetensors"),
                    &named,
                    &Default::default(),
                )
                .map_err(|e| write(e.to_string()))?;
                vllm::reload_weights(server, &dir)?;
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        self.stats.vllm_swaps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .vllm_swap_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        tracing::info!(
            agent,
            version,
            secs = started.elapsed().as_secs_f64(),
            "weights swapped in on vLLM"
        );
        Ok(())
    }
}
