//! How much prompt an episode's turns may take on this worker (spec 3.7): the job's limit, every
//! agent's context less its new tokens, and the worker's token budget; and the cutting of
//! messages to a token budget with the speaking agent's tokenizer.
use super::EngineSettings;
use crate::models::Models;
use comas_model::ChatMessage;
use comas_workflow::method::PromptFit;
use comas_workflow::{PromptMeter, Role, Unmetered};

/// Template tokens a tokenizer may add beyond one per byte of the message; a message this much
/// under its limit in bytes fits without being tokenized (a token covers at least one byte).
const TEMPLATE_SLACK: usize = 64;

/// The prompt room of one episode's turns: what the job allows (`prompt_max_len`), what every
/// agent's model holds (its context less the role's new tokens) and the worker's token budget.
struct Room<'a> {
    models: &'a Models,
    /// The bases of the episode's agents, each once.
    bases: Vec<usize>,
    /// The room of each fitted role's prompts.
    limit: Vec<(Role, usize)>,
}

/// How an episode's prompts are fitted here: a method that fits its prompts (CoMAS) to the
/// room of its agents; other methods' prompts are not cut (a prompt too long for the room fails
/// at admission), but their messages may be cut to a token budget (NeuroMAS) with the speaking
/// agent's tokenizer.
pub(super) fn meter_for<'a>(
    models: &'a Models,
    settings: &EngineSettings,
    fit: &PromptFit,
) -> Box<dyn PromptMeter + 'a> {
    if fit.fitted.is_empty() {
        Box::new(Tokens { models })
    } else {
        Box::new(room_for(models, settings, fit))
    }
}

/// Every prompt fits; messages are cut by the agent's own tokenizer.
struct Tokens<'a> {
    models: &'a Models,
}

impl PromptMeter for Tokens<'_> {
    fn fits(&self, role: Role, text: &str) -> bool {
        Unmetered.fits(role, text)
    }

    fn cut(&self, agent: u32, text: &str, max_tokens: u32) -> Option<String> {
        // A model behind an endpoint has no tokenizer here: its messages go on whole.
        let tokenizer = &self.models.bases[self.models.agents.get(&agent)?.base].tokenizer;
        let ids = tokenizer.encode_plain(text).ok()?;
        let keep = ids.get(..max_tokens as usize).filter(|k| k.len() < ids.len())?;
        tokenizer.decode(keep, true).ok()
    }
}

/// The room of an episode fitted as `fit` says on this worker.
fn room_for<'a>(models: &'a Models, settings: &EngineSettings, fit: &PromptFit) -> Room<'a> {
    let mut bases: Vec<usize> =
        fit.agents.iter().filter_map(|a| models.agents.get(a)).map(|p| p.base).collect();
    bases.sort_unstable();
    bases.dedup();
    let context = bases.iter().map(|&b| models.context(b)).min().unwrap_or(0);
    let job = fit.max_len.as_ref().map_or(usize::MAX, |(n, _)| *n as usize);
    let limit = fit
        .fitted
        .iter()
        .map(|&(role, new)| {
            let new = new as usize;
            (
                role,
                job.min(context.saturating_sub(new))
                    .min(settings.max_batch_tokens.saturating_sub(new)),
            )
        })
        .collect();
    Room { models, bases, limit }
}

impl PromptMeter for Room<'_> {
    fn fits(&self, role: Role, text: &str) -> bool {
        // A role the method does not fit is not cut here; admission checks its prompt.
        let Some(&(_, limit)) = self.limit.iter().find(|(r, _)| *r == role) else { return true };
        if text.len() + TEMPLATE_SLACK <= limit {
            return true;
        }
        let msgs = [ChatMessage::new("user", text)];
        // A prompt that cannot be tokenized is refused at admission with its own error.
        self.bases.iter().all(|&b| {
            self.models.bases[b]
                .tokenizer
                .encode_chat(&msgs, true)
                .is_ok_and(|ids| ids.len() <= limit)
        })
    }
}
