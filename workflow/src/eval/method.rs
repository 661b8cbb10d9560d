//! Evaluation jobs on the method seam (`method = "eval"`, `comas eval --coordinator`): a team of
//! frozen models plays one setup on the questions listed in `[evaluate]`, one episode per
//! question, in one step; nothing trains and the client grades the transcripts.
use crate::method::RecordFault;
use super::program::{EvalEpisode, EvalJobConfig, EvalQuestion, EvalRunMetrics, EvalTranscript};
use crate::error::WorkflowError;
use crate::error::{invalid, JobError};
use crate::method::{JobView, Made, Method, RoomNeeds, Row, Samples, StepContext, Summary, TaskRoom, TaskSource, Unit};
use crate::program::{PolicyTurn, Reply, Request};
use crate::seed::PlanSeed;
use crate::task::TaskRecord;
use crate::train_config::TrainDefaults;
use crate::turn::PromptMeter;

/// An evaluation of frozen models (spec §8.2).
pub struct Evaluation;

impl crate::method::Episode for EvalEpisode {
    type Record = EvalTranscript;

    fn pending(&self) -> Vec<Request> {
        EvalEpisode::pending(self)
    }

    fn submit(&mut self, replies: Vec<Reply>, _: &dyn PromptMeter) -> Result<(), WorkflowError> {
        EvalEpisode::submit(self, replies)
    }

    fn is_done(&self) -> bool {
        EvalEpisode::is_done(self)
    }

    fn finish(self) -> Result<EvalTranscript, WorkflowError> {
        self.into_transcript()
    }
}

impl crate::method::Record for EvalTranscript {
    fn turns(&self) -> u32 {
        self.calls.len() as u32
    }

    fn completion_tokens(&self) -> u64 {
        EvalTranscript::completion_tokens(self)
    }

    /// Frozen models only: nothing to check against a policy version.
    fn policy_turns(&self) -> Vec<PolicyTurn> {
        Vec::new()
    }

    fn shift_versions(&mut self, _: u64) {}
}

impl Method for Evaluation {
    const NAME: &'static str = "eval";
    const TABLE: &'static str = "evaluate";
    const TRAINS: bool = false;
    const CALLS_FROZEN: bool = true;

    type Config = EvalJobConfig;
    type Task = EvalQuestion;
    type Plan = ();
    type Episode = EvalEpisode;
    type Record = EvalTranscript;
    type Metrics = EvalRunMetrics;

    /// The setup, sampling and questions; the team is the `[[frozen]]` list.
    fn configure(mut table: toml::Table, job: &JobView<'_>) -> Result<EvalJobConfig, JobError> {
        if job.frozen.is_empty() {
            return Err(invalid("frozen", "list the team's models as [[frozen]] tables (team member m is played by model m mod their count)"));
        }
        if table.contains_key("members") {
            return Err(invalid("evaluate.members", "is set by the job: it is the number of [[frozen]] models"));
        }
        let questions: Vec<EvalQuestion> = match table.remove("questions") {
            None => Vec::new(),
            Some(v) => crate::method::read_settings(v, "evaluate.questions")?,
        };
        table.insert("members".into(), toml::Value::Integer(job.frozen.len() as i64));
        let settings = crate::method::read_settings(toml::Value::Table(table), "evaluate")?;
        let cfg = EvalJobConfig { settings, questions };
        cfg.validate().map_err(|(k, m)| invalid(format!("evaluate.{k}"), m))?;
        Ok(cfg)
    }

    fn task_source(c: &EvalJobConfig) -> TaskSource {
        TaskSource::Listed(c.questions.len())
    }

    fn train_defaults(_: &EvalJobConfig) -> TrainDefaults {
        TrainDefaults::default()
    }

    fn samples(_: &EvalJobConfig, _: u32, _: u64) -> Samples {
        Samples { least: 0, most: 0, why: "an evaluation trains nothing".into() }
    }

    /// Each call is shortened to fit its model's context rather than refused.
    fn room(_: &EvalJobConfig) -> RoomNeeds {
        RoomNeeds { replies: Vec::new(), task: TaskRoom { tokens: 0, why: String::new() }, prompt_max_len: None }
    }

    fn for_evaluation(c: &EvalJobConfig, _: u32, _: f64) -> EvalJobConfig {
        c.clone()
    }

    fn copies(_: &EvalJobConfig) -> u32 {
        1
    }

    fn task(c: &EvalJobConfig, index: usize, _: &[TaskRecord], _: PlanSeed) -> Result<EvalQuestion, WorkflowError> {
        c.questions.get(index).cloned().ok_or_else(|| WorkflowError::PlanMismatch(format!("question {index} is past the job's {}", c.questions.len())))
    }

    fn plans(_: &EvalJobConfig, episodes: usize, _: PlanSeed) -> Result<Vec<()>, WorkflowError> {
        Ok(vec![(); episodes])
    }

    /// The question's benchmark index and the run seed give each call its seed, as on one
    /// machine, so both ways sample the same replies.
    fn episode_seed(c: &EvalJobConfig, _: PlanSeed, _: u32) -> u64 {
        c.settings.seed
    }

    fn speakers(c: &EvalJobConfig, _: &()) -> Vec<u32> {
        (0..c.settings.members).collect()
    }

    fn start(c: &EvalJobConfig, question: &EvalQuestion, _: (), _: u32, _: u64, _: &dyn PromptMeter) -> Result<EvalEpisode, WorkflowError> {
        EvalEpisode::new(&c.settings, question)
    }

    fn check(c: &EvalJobConfig, t: &EvalTranscript) -> Result<(), RecordFault> {
        t.validate(&c.settings)
    }

    /// Nothing trains: the transcripts go back to the client, which grades them.
    fn experience(_: &EvalJobConfig, records: Vec<(String, EvalTranscript)>, _: &StepContext<'_>) -> Result<Made<EvalRunMetrics>, WorkflowError> {
        Ok(Made { per_agent: Vec::new(), metrics: EvalRunMetrics::of(records.iter().map(|(_, t)| t)), pooled_whitening: false })
    }

    fn watch(m: &EvalRunMetrics) -> Vec<String> {
        vec![format!("{} calls, {} cut at max_new_tokens, {} without room", m.calls, m.calls_at_length, m.calls_refused)]
    }

    fn summary(m: &EvalRunMetrics) -> Summary {
        Summary { accuracy: None, graded: None, rows: vec![Row::new("calls", Some(f64::from(m.calls)), Unit::Number)] }
    }
}
