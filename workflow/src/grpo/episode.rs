//! One GRPO episode: every agent answers the question once, all at once; a code answer's last
//! ```python block then runs with the task's tests in the sandbox. The record keeps each answer
//! (what trains) and its test verdict; the reward is computed from it by `reward::grade`.
use crate::method::RecordFault;
use super::config::{GrpoConfig, Grader};
use crate::code::{candidate_blocks, checker_from_gt, program, CodeGrading};
use crate::error::WorkflowError;
use crate::program::{take_replies, PolicyTurn, Reply, Request};
use crate::seed::{derive_seed, tag};
use crate::task::TaskRecord;
use crate::tool::ToolRequest;
use crate::turn::{ChatMessage, Role, Sampled, TurnRequest};
use serde::{Deserialize, Serialize};

/// One agent's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The agent's index in the episode (its agent id).
    pub turn_index: u32,
    pub agent: u32,
    #[serde(flatten)]
    pub sampled: Sampled,
    pub text: String,
    /// A code answer's test run: passed or not; `None` when nothing ran (no code block, or
    /// not a code task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// Why the run failed (`timeout`, `exit_code`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_failure: Option<String>,
}

/// A finished GRPO episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrpoRecord {
    pub task: TaskRecord,
    /// Which of the question's G episodes this is.
    pub instance: u32,
    /// The grader that scores the answers (resolved from the task's kind).
    pub grader: Grader,
    /// One per agent, in agent order.
    pub answers: Vec<Answer>,
}

impl GrpoRecord {
    pub fn policy_turns(&self) -> Vec<PolicyTurn> {
        self.answers
            .iter()
            .map(|a| PolicyTurn { turn_index: a.turn_index, agent: a.agent, role: Role::Solver, policy_version: a.sampled.policy_version })
            .collect()
    }

    pub fn completion_tokens(&self) -> u64 {
        self.answers.iter().map(|a| a.sampled.completion_ids.len() as u64).sum()
    }

    /// What a worker could get wrong: one answer per agent in order, a log-prob per token.
    pub fn validate(&self, cfg: &GrpoConfig) -> Result<(), RecordFault> {
        if self.answers.len() != cfg.agents as usize {
            return Err(format!("{} answers for {} agents", self.answers.len(), cfg.agents).into());
        }
        if cfg.grader.resolve(self.task.task) != Some(self.grader) {
            return Err(format!("the record is graded by {:?}, the job grades {} tasks by {:?}", self.grader, self.task.task.as_str(), cfg.grader).into());
        }
        for (i, a) in self.answers.iter().enumerate() {
            if (a.turn_index, a.agent) != (i as u32, i as u32) {
                return Err(RecordFault::at(format!("answer {i}"), format!("turn {} of agent {}; answers are one per agent, in agent order", a.turn_index, a.agent)));
            }
            a.sampled.check().map_err(|f| RecordFault::turn(format!("answer {i}"), f))?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Answer,
    Test,
    Done,
}

#[derive(Debug, Clone)]
pub struct Episode {
    config: GrpoConfig,
    task: TaskRecord,
    instance: u32,
    grader: Grader,
    answers: Vec<Answer>,
    /// The answer each pending test run is of.
    tested: Vec<usize>,
    pending: Vec<Request>,
    phase: Phase,
}

/// The conversation every agent answers: the system prompt if any, then the question.
pub fn messages(config: &GrpoConfig, task: &TaskRecord) -> Vec<ChatMessage> {
    let mut out = Vec::new();
    if let Some(s) = &config.system_prompt {
        out.push(ChatMessage { role: "system".into(), content: s.clone() });
    }
    let user = match &config.prompt_suffix {
        Some(suffix) => format!("{}{suffix}", task.prompt),
        None => task.prompt.clone(),
    };
    out.push(ChatMessage::user(user));
    out
}

impl Episode {
    pub fn new(config: &GrpoConfig, task: &TaskRecord, instance: u32, seed: u64) -> Result<Self, WorkflowError> {
        config.validate().map_err(|(k, m)| WorkflowError::MalformedTrajectory(format!("grpo.{k}: {m}")))?;
        let Some(grader) = config.grader.resolve(task.task) else {
            return Err(WorkflowError::MalformedTrajectory(format!("grpo has no grader for {} tasks (task {})", task.task.as_str(), task.id)));
        };
        let messages = messages(config, task);
        let pending = (0..config.agents)
            .map(|agent| {
                Request::Turn(TurnRequest {
                    turn_index: agent,
                    agent,
                    role: Role::Solver,
                    round: 0,
                    slot: agent,
                    judge_index: 0,
                    about_solution: None,
                    about_evaluation: None,
                    messages: messages.clone(),
                    sampling: config.sampling.clone(),
                    seed: derive_seed(&[seed, tag::TURN_SAMPLING, u64::from(agent)]),
                    blocks_cut: 0,
                })
            })
            .collect();
        Ok(Episode { config: config.clone(), task: task.clone(), instance, grader, answers: Vec::new(), tested: Vec::new(), pending, phase: Phase::Answer })
    }

    pub fn pending(&self) -> &[Request] {
        &self.pending
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Takes the replies of the whole pending group; nothing changes when they are refused.
    pub fn submit(&mut self, replies: Vec<Reply>) -> Result<(), WorkflowError> {
        if self.phase == Phase::Done {
            return Err(WorkflowError::EpisodeFinished);
        }
        let replies = take_replies(&self.pending, replies)?;
        match self.phase {
            Phase::Answer => {
                let mut answers = Vec::with_capacity(replies.len());
                for reply in replies {
                    let Reply::Turn(out) = reply else {
                        return Err(WorkflowError::MalformedTurn { turn_index: 0, message: "an answer must be a generation, not a tool run".into() });
                    };
                    let agent = out.turn_index;
                    let (sampled, text) = Sampled::split(out);
                    answers.push(Answer { turn_index: agent, agent, sampled, text, passed: None, test_failure: None });
                }
                self.answers = answers;
                self.open_tests()
            }
            Phase::Test => {
                for (reply, &a) in replies.into_iter().zip(&self.tested) {
                    let Reply::Tool(result) = reply else {
                        return Err(WorkflowError::MalformedTurn { turn_index: a as u32, message: "a test run came back as a generation".into() });
                    };
                    self.answers[a].passed = Some(result.ran());
                    self.answers[a].test_failure = result.failure;
                }
                self.pending.clear();
                self.phase = Phase::Done;
                Ok(())
            }
            Phase::Done => unreachable!("checked above"),
        }
    }

    /// A code task: one test run per answer with a code block; other tasks are done.
    fn open_tests(&mut self) -> Result<(), WorkflowError> {
        self.pending.clear();
        self.tested.clear();
        if self.grader == Grader::Code {
            let checker = checker_of(&self.task.answer).map_err(|e| WorkflowError::MalformedTrajectory(format!("task {}: {e}", self.task.id)))?;
            for (i, a) in self.answers.iter().enumerate() {
                let Some(block) = candidate_blocks(&a.text, CodeGrading::LastBlock).pop() else { continue };
                let call_index = self.tested.len() as u32;
                self.tested.push(i);
                let code = program(block, &checker);
                self.pending.push(Request::Tool(ToolRequest { call_index, code, timeout_secs: self.config.test_timeout_secs, files: Vec::new(), fetch: Vec::new() }));
            }
        }
        self.phase = if self.pending.is_empty() { Phase::Done } else { Phase::Test };
        Ok(())
    }

    pub fn into_record(self) -> Result<GrpoRecord, WorkflowError> {
        if self.phase != Phase::Done {
            return Err(WorkflowError::MalformedTrajectory("the GRPO episode has not ended".into()));
        }
        Ok(GrpoRecord { task: self.task, instance: self.instance, grader: self.grader, answers: self.answers })
    }
}

/// A coding task's tests: its answer as test code, or a benchmark's ground truth in JSON (a
/// list of asserts, or HumanEval's test and entry point).
fn checker_of(answer: &str) -> Result<String, crate::code::CheckerError> {
    match serde_json::from_str::<serde_json::Value>(answer) {
        Ok(v @ (serde_json::Value::Array(_) | serde_json::Value::Object(_))) => checker_from_gt(&v),
        _ => Ok(answer.to_string()),
    }
}
