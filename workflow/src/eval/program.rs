//! An evaluation on a cluster (`comas eval --coordinator`): each question under one setup is an
//! episode program the rollout workers run, and the team's members are frozen models they serve
//! (no learner, never updated). Each call gets the seed `comas eval` gives it on one machine, so
//! both ways sample the same replies.
use crate::method::RecordFault;
use super::setup::{Call, Dialogue, Setup};
use crate::error::WorkflowError;
use crate::program::{take_replies, Reply, Request};
use crate::turn::{ChatMessage, FinishReason, Role, SamplingSpec, TurnRequest};
use serde::{Deserialize, Serialize};

/// Sampling temperature of every call (spec §8.1).
pub const EVAL_TEMPERATURE: f64 = 0.7;
/// Most new tokens per call (spec §8.1).
pub const EVAL_MAX_NEW_TOKENS: u32 = 2048;

fn default_temperature() -> f64 {
    EVAL_TEMPERATURE
}
fn default_max_new_tokens() -> u32 {
    EVAL_MAX_NEW_TOKENS
}

/// What every episode of an evaluation job shares (an episode spec's `config_json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalSettings {
    /// The inference setup every question is played under.
    pub setup: Setup,
    /// Team size: member m of a setup is played by model m mod `members` (the job's frozen
    /// models, in order). Set by the job from its `[[frozen]]` list.
    #[schemars(skip)]
    pub members: u32,
    /// Sampling temperature of every call.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// At most this many new tokens per call.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: u32,
    /// Seeds every question's calls (with the question's index).
    #[serde(default)]
    pub seed: u64,
}

impl EvalSettings {
    /// What is wrong, as (key, message), if anything.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.members == 0 {
            return Err(("members", "the team needs at least one model".into()));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(("temperature", format!("must be finite and >= 0, got {}", self.temperature)));
        }
        if self.max_new_tokens == 0 {
            return Err(("max_new_tokens", "must be at least 1".into()));
        }
        Ok(())
    }

    /// The sampling of every call: shortened to fit the context rather than refused, as on one
    /// machine.
    pub fn sampling(&self) -> SamplingSpec {
        SamplingSpec { temperature: self.temperature, max_new_tokens: self.max_new_tokens, min_new_tokens: 0, fit_context: true, ..SamplingSpec::default() }
    }
}

/// One question as an evaluation episode carries it (an episode spec's `question_json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalQuestion {
    /// Position in the benchmark. It seeds the question's calls, so a run over a subset (a
    /// resumed one) samples what the full run would.
    pub index: u32,
    pub id: String,
    pub query: String,
}

/// The `[evaluate]` table of an evaluation job, with `members` taken from its `[[frozen]]` list.
/// An episode spec carries the settings only (each episode its own question).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "EvalSettings", into = "EvalSettings")]
pub struct EvalJobConfig {
    pub settings: EvalSettings,
    pub questions: Vec<EvalQuestion>,
}

/// The `[evaluate]` table: the settings and the questions (read apart, see the method).
impl schemars::JsonSchema for EvalJobConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "EvalJobConfig".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = EvalSettings::json_schema(g);
        let mut questions = g.subschema_for::<Vec<EvalQuestion>>();
        questions.insert("description".into(), "The questions, one episode each.".into());
        if let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
            props.insert("questions".into(), questions.to_value());
        }
        schema
    }
}

impl From<EvalSettings> for EvalJobConfig {
    fn from(settings: EvalSettings) -> Self {
        EvalJobConfig { settings, questions: Vec::new() }
    }
}

impl From<EvalJobConfig> for EvalSettings {
    fn from(c: EvalJobConfig) -> Self {
        c.settings
    }
}

impl EvalJobConfig {
    /// What is wrong, as (key, message), if anything.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        self.settings.validate()?;
        if self.questions.is_empty() {
            return Err(("questions", "list at least one question".into()));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(q) = self.questions.iter().find(|q| !seen.insert(q.index)) {
            return Err(("questions", format!("index {} is given twice", q.index)));
        }
        Ok(())
    }
}

/// The seed of call `call` of question `question`: a 64-bit mix with the run seed, so each call
/// samples the same tokens whatever it is batched with.
pub fn call_seed(seed: u64, question: u64, call: u32) -> u64 {
    let mut z = seed ^ (question << 20) ^ u64::from(call) ^ 0xD1B5_4A32_D192_ED03;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A finished call, as the calls log keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub call: u32,
    pub label: String,
    pub member: usize,
    /// The model that answered (filled in by whoever knows the team's folders).
    #[serde(default)]
    pub model: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// `stop`, `length`, or `error` when the call was not decoded.
    pub finish: String,
    pub messages: Vec<ChatMessage>,
    pub response: String,
    /// Why the call was not decoded (its prompt does not fit the model), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a call got no reply: spec §8.1 answers it empty, which grades wrong.
pub fn no_room_error(prompt_tokens: usize, context: usize) -> String {
    format!("prompt of {prompt_tokens} tokens leaves no room in the context of {context}")
}

/// A finished evaluation episode: the graded output and every call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalTranscript {
    pub index: u32,
    pub id: String,
    pub setup: Setup,
    pub output: String,
    /// In call order.
    pub calls: Vec<CallRecord>,
}

impl EvalTranscript {
    /// Checks what a coordinator can without the models: calls numbered 0.. in order, each of
    /// a team member.
    pub fn validate(&self, settings: &EvalSettings) -> Result<(), RecordFault> {
        if self.setup != settings.setup {
            return Err(format!("the record is of setup {} but the job runs {}", self.setup, settings.setup).into());
        }
        if self.calls.is_empty() {
            return Err(RecordFault::Shape("the record has no calls".into()));
        }
        for (i, c) in self.calls.iter().enumerate() {
            if c.call as usize != i {
                return Err(format!("call {} is at position {i}; calls must be numbered 0.. in order", c.call).into());
            }
        }
        Ok(())
    }

    pub fn completion_tokens(&self) -> u64 {
        self.calls.iter().map(|c| c.new_tokens as u64).sum()
    }
}

/// What an evaluation job's step record holds: counts over its episodes (the verdicts are the
/// client's: it grades the transcripts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvalRunMetrics {
    pub episodes: u32,
    pub calls: u32,
    pub generated_tokens: u64,
    /// Calls cut at `max_new_tokens`.
    pub calls_at_length: u32,
    /// Calls whose prompt left no room in the context (answered empty).
    pub calls_refused: u32,
}

impl EvalRunMetrics {
    pub fn of<'a>(transcripts: impl IntoIterator<Item = &'a EvalTranscript>) -> Self {
        let mut m = Self::default();
        for t in transcripts {
            m.episodes += 1;
            m.generated_tokens += t.completion_tokens();
            for c in &t.calls {
                m.calls += 1;
                match c.finish.as_str() {
                    "length" => m.calls_at_length += 1,
                    "error" => m.calls_refused += 1,
                    _ => {}
                }
            }
        }
        m
    }
}

/// One question under one setup, as a program: its dialogue's pending calls become turns of
/// the members' frozen models.
#[derive(Debug, Clone)]
pub struct EvalEpisode {
    settings: EvalSettings,
    question: EvalQuestion,
    dialogue: Dialogue,
    pending: Vec<Call>,
    calls: Vec<CallRecord>,
}

impl EvalEpisode {
    pub fn new(settings: &EvalSettings, question: &EvalQuestion) -> Result<Self, WorkflowError> {
        settings.validate().map_err(|(k, m)| WorkflowError::MalformedTrajectory(format!("evaluation settings `{k}`: {m}")))?;
        let mut dialogue = Dialogue::new(settings.setup, question.query.clone());
        let pending = dialogue.start();
        Ok(Self { settings: settings.clone(), question: question.clone(), dialogue, pending, calls: Vec::new() })
    }

    /// The turns of the pending calls; a call's turn index is its id.
    pub fn pending(&self) -> Vec<Request> {
        self.pending.iter().map(|c| Request::Turn(self.turn(c))).collect()
    }

    fn turn(&self, call: &Call) -> TurnRequest {
        TurnRequest {
            turn_index: call.id,
            agent: call.member as u32 % self.settings.members,
            role: Role::Member,
            round: 0,
            slot: 0,
            judge_index: 0,
            about_solution: None,
            about_evaluation: None,
            messages: call.messages.clone(),
            sampling: self.settings.sampling(),
            seed: call_seed(self.settings.seed, u64::from(self.question.index), call.id),
            blocks_cut: 0,
        }
    }

    /// Takes the replies of every pending call; the dialogue asks for its next calls.
    pub fn submit(&mut self, replies: Vec<Reply>) -> Result<(), WorkflowError> {
        let replies = take_replies(&self.pending(), replies)?;
        for (call, reply) in std::mem::take(&mut self.pending).into_iter().zip(replies) {
            let Reply::Turn(out) = reply else {
                return Err(WorkflowError::MalformedTurn { turn_index: call.id, message: "an evaluation runs no tools".into() });
            };
            // An empty reply cut at length is a call the context had no room for (`fit_context`).
            let refused = out.completion_ids.is_empty() && out.finish_reason == FinishReason::Length;
            let finish = if refused {
                "error"
            } else {
                match out.finish_reason {
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                }
            };
            let more =
                self.dialogue.deliver(call.id, out.text.clone()).map_err(|e| WorkflowError::MalformedTurn { turn_index: call.id, message: e.to_string() })?;
            self.calls.push(CallRecord {
                call: call.id,
                label: call.label.clone(),
                member: call.member,
                model: String::new(),
                prompt_tokens: out.prompt_ids.len(),
                new_tokens: out.completion_ids.len(),
                finish: finish.into(),
                messages: call.messages,
                response: out.text,
                error: refused.then(|| "the prompt leaves no room in the model's context".to_string()),
            });
            self.pending.extend(more);
        }
        Ok(())
    }

    pub fn is_done(&self) -> bool {
        self.pending.is_empty() && self.dialogue.output().is_some()
    }

    pub fn into_transcript(mut self) -> Result<EvalTranscript, WorkflowError> {
        let Some(output) = self.dialogue.output().map(str::to_string) else {
            return Err(WorkflowError::MalformedTrajectory("the evaluation dialogue has not ended".into()));
        };
        self.calls.sort_by_key(|c| c.call);
        Ok(EvalTranscript { index: self.question.index, id: self.question.id, setup: self.settings.setup, output, calls: self.calls })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::TurnOutput;

    fn settings(setup: Setup, members: u32) -> EvalSettings {
        EvalSettings { setup, members, temperature: 0.7, max_new_tokens: 64, seed: 9 }
    }

    fn reply(t: &TurnRequest, text: &str) -> Reply {
        Reply::Turn(TurnOutput {
            turn_index: t.turn_index,
            text: text.into(),
            raw_text: text.into(),
            prompt_ids: vec![1; 5],
            completion_ids: vec![7; 3],
            logprobs: vec![-0.5; 3],
            finish_reason: FinishReason::Stop,
            policy_version: 0,
            constrained: Vec::new(),
        })
    }

    fn turns(e: &EvalEpisode) -> Vec<TurnRequest> {
        e.pending()
            .into_iter()
            .map(|r| match r {
                Request::Turn(t) => t,
                Request::Tool(_) => panic!("an evaluation asks for no tools"),
            })
            .collect()
    }

    #[test]
    fn a_debate_asks_three_openings_three_rebuttals_and_one_aggregate_of_two_models() {
        let q = EvalQuestion { index: 4, id: "q4".into(), query: "What is 2 + 3?".into() };
        let mut e = EvalEpisode::new(&settings(Setup::Debate, 2), &q).unwrap();
        let mut groups = Vec::new();
        while !e.is_done() {
            let ts = turns(&e);
            groups.push(ts.iter().map(|t| (t.turn_index, t.agent)).collect::<Vec<_>>());
            for t in &ts {
                assert_eq!(t.seed, call_seed(9, 4, t.turn_index));
                assert!(t.sampling.fit_context && t.sampling.min_new_tokens == 0 && t.sampling.max_new_tokens == 64);
                assert_eq!(t.role, Role::Member);
            }
            let replies = ts.iter().map(|t| reply(t, &format!("answer {}", t.turn_index))).collect();
            e.submit(replies).unwrap();
        }
        // Members 0, 1, 2 on two models: agents 0, 1, 0.
        assert_eq!(groups, vec![vec![(0, 0), (1, 1), (2, 0)], vec![(3, 0), (4, 1), (5, 0)], vec![(6, 0)]]);
        let t = e.into_transcript().unwrap();
        assert_eq!(t.output, "answer 6");
        assert_eq!(t.calls.len(), 7);
        assert_eq!(t.completion_tokens(), 21);
        assert_eq!(t.calls.iter().map(|c| c.call).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        assert_eq!(t.calls[3].label, "agent 1 round 1");
        t.validate(&settings(Setup::Debate, 2)).unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<EvalTranscript>(&json).unwrap(), t);
    }

    #[test]
    fn an_empty_reply_cut_at_length_is_recorded_as_a_call_with_no_room() {
        let q = EvalQuestion { index: 0, id: "q".into(), query: "long".into() };
        let mut e = EvalEpisode::new(&settings(Setup::Vanilla, 1), &q).unwrap();
        let t = &turns(&e)[0];
        let Reply::Turn(mut out) = reply(t, "") else { unreachable!() };
        out.completion_ids.clear();
        out.logprobs.clear();
        out.finish_reason = FinishReason::Length;
        e.submit(vec![Reply::Turn(out)]).unwrap();
        let t = e.into_transcript().unwrap();
        assert_eq!((t.output.as_str(), t.calls[0].finish.as_str(), t.calls[0].new_tokens), ("", "error", 0));
        assert!(t.calls[0].error.is_some());
    }

    #[test]
    fn replies_must_answer_the_pending_calls_exactly_once() {
        let q = EvalQuestion { index: 0, id: "q".into(), query: "x".into() };
        let mut e = EvalEpisode::new(&settings(Setup::Consistency, 1), &q).unwrap();
        let ts = turns(&e);
        assert_eq!(ts.len(), 5);
        let short: Vec<Reply> = ts[..4].iter().map(|t| reply(t, "a")).collect();
        assert!(matches!(e.submit(short), Err(WorkflowError::MissingTurns(m)) if m == vec![4]));
        let bad = EvalSettings { members: 0, ..settings(Setup::Vanilla, 1) };
        assert!(EvalEpisode::new(&bad, &q).is_err());
    }

    #[test]
    fn a_record_of_another_setup_or_with_calls_out_of_order_is_refused() {
        let call = |i: u32| CallRecord {
            call: i,
            label: "answer".into(),
            member: 0,
            model: String::new(),
            prompt_tokens: 1,
            new_tokens: 1,
            finish: "stop".into(),
            messages: Vec::new(),
            response: "r".into(),
            error: None,
        };
        let mut t = EvalTranscript { index: 0, id: "q".into(), setup: Setup::Vanilla, output: "r".into(), calls: vec![call(0)] };
        t.validate(&settings(Setup::Vanilla, 1)).unwrap();
        assert!(t.validate(&settings(Setup::Debate, 1)).unwrap_err().to_string().contains("setup"));
        t.calls = vec![call(1)];
        assert!(t.validate(&settings(Setup::Vanilla, 1)).unwrap_err().to_string().contains("numbered"));
    }
}
