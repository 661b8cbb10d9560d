//! The MathChat chain of one instance as a state machine (spec 3). Each agent acts, its fenced
//! Python runs as tool requests, and the observation extends its context for its next action;
//! when the chain is done, the coach scores every action in one group, then retries the replies
//! that lack a score, once.
use super::coach::{legacy_score, parse_coach};
use super::config::{CoachFallback, MappaConfig, Pipeline};
use super::ds_prompts::{self, DsCoachView, DsView, MODEL_MARK, PREPROCESSING_MARK};
use super::outcome::{evaluate, DsOutcome};
use super::prompts::{agent_prompt, coach_prompt, coach_retry_prompt, wants_outcome, CoachView};
use super::tools::{clip, parse_calls, tool_response, wrap, Calls};
use super::trajectory::{Action, CoachVerdict, MappaTrajectory};
use crate::error::WorkflowError;
use crate::program::{take_replies, Reply, Request};
use crate::seed::{derive_seed, tag};
use crate::task::TaskRecord;
use crate::tool::{ToolRequest, ToolResult, WorkspaceFile};
use crate::turn::{ChatMessage, Role, Sampled, TurnOutput, TurnRequest};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Act,
    Tools,
    Coach,
    CoachRetry,
    Done,
}

#[derive(Debug, Clone)]
pub struct Episode {
    config: MappaConfig,
    question: TaskRecord,
    instance: u32,
    seed: u64,
    phase: Phase,
    pending: Vec<Request>,
    /// The chain position and action number of the acting agent.
    position: usize,
    step: u32,
    /// The acting agent's context.
    messages: Vec<ChatMessage>,
    actions: Vec<Action>,
    next_turn: u32,
    next_call: u32,
    /// Action index of each pending coach turn.
    coached: Vec<usize>,
    /// DSBench: the shared files (the task's data, then what each agent's runs saved).
    workspace: BTreeMap<String, Vec<u8>>,
    /// DSBench: the summaries the Data Engineer and the Modeler printed.
    preprocessing_summary: Option<String>,
    model_summary: Option<String>,
    ds_outcome: Option<DsOutcome>,
}

/// Renders a context for the coach: each message under its speaker.
fn transcript(messages: &[ChatMessage]) -> String {
    messages.iter().map(|m| format!("[{}]\n{}", m.role, m.content)).collect::<Vec<_>>().join("\n\n")
}

impl Episode {
    pub fn new(config: &MappaConfig, question: &TaskRecord, instance: u32, seed: u64) -> Result<Self, WorkflowError> {
        config.validate().map_err(|(k, m)| WorkflowError::MalformedTrajectory(format!("mappa.{k}: {m}")))?;
        let mut e = Episode {
            config: config.clone(),
            question: question.clone(),
            instance,
            seed,
            phase: Phase::Act,
            pending: Vec::new(),
            position: 0,
            step: 0,
            messages: Vec::new(),
            actions: Vec::new(),
            next_turn: 0,
            next_call: 0,
            coached: Vec::new(),
            workspace: question.files.iter().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect(),
            preprocessing_summary: None,
            model_summary: None,
            ds_outcome: None,
        };
        e.open_slot(String::new());
        Ok(e)
    }

    pub fn config(&self) -> &MappaConfig {
        &self.config
    }

    pub fn pending(&self) -> &[Request] {
        &self.pending
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    fn turn(&mut self, agent: u32, role: Role, round: u32, slot: u32, judge_index: u32, messages: Vec<ChatMessage>) -> Request {
        let turn_index = self.next_turn;
        self.next_turn += 1;
        let sampling = if role == Role::Coach { self.config.coach_sampling.clone() } else { self.config.sampling_for(role).clone() };
        Request::Turn(TurnRequest {
            turn_index,
            agent,
            role,
            round,
            slot,
            judge_index,
            about_solution: None,
            about_evaluation: None,
            messages,
            sampling,
            seed: derive_seed(&[self.seed, tag::TURN_SAMPLING, u64::from(turn_index)]),
            blocks_cut: 0,
        })
    }

    fn file_names(&self) -> Vec<String> {
        self.workspace.keys().cloned().collect()
    }

    fn open_slot(&mut self, upstream: String) {
        let role = self.config.role_at(self.position);
        let prompt = match self.config.pipeline {
            Pipeline::MathChat => agent_prompt(role, &self.question.prompt, &upstream),
            Pipeline::DsBench => {
                let files = self.file_names();
                let view = DsView {
                    role,
                    task: &self.question.prompt,
                    files: &files,
                    handoff: &upstream,
                    preprocessing_summary: self.preprocessing_summary.as_deref(),
                    model_summary: self.model_summary.as_deref(),
                };
                ds_prompts::agent_prompt(&view)
            }
        };
        self.messages = vec![ChatMessage::user(prompt)];
        self.step = 0;
        self.open_action();
    }

    fn open_action(&mut self) {
        let role = self.config.role_at(self.position);
        let agent = self.config.agents[self.position];
        let r = self.turn(agent, role, self.step, self.position as u32, 0, self.messages.clone());
        self.pending = vec![r];
        self.phase = Phase::Act;
    }

    /// Accepts the replies to the whole pending group, in any order; nothing changes when they
    /// are refused.
    pub fn submit(&mut self, replies: Vec<Reply>) -> Result<(), WorkflowError> {
        if self.phase == Phase::Done {
            return Err(WorkflowError::EpisodeFinished);
        }
        let replies = take_replies(&self.pending, replies)?;
        let requests = std::mem::take(&mut self.pending);
        match self.phase {
            Phase::Act => {
                let (Some(Request::Turn(request)), Some(Reply::Turn(out))) = (requests.into_iter().next(), replies.into_iter().next()) else {
                    unreachable!("take_replies matched the turn")
                };
                self.acted(request, out);
            }
            Phase::Tools => {
                let mut results: Vec<ToolResult> = replies.into_iter().filter_map(|r| if let Reply::Tool(t) = r { Some(t) } else { None }).collect();
                self.take_files(&mut results);
                let a = self.actions.last_mut().expect("tools follow an action");
                a.tool_runs = results.iter().map(|r| r.failure.clone()).collect();
                let obs = tool_response(&results, self.config.observation_chars);
                a.observation = Some(obs.clone());
                self.after_observation(obs);
            }
            Phase::Coach | Phase::CoachRetry => self.coached(replies),
            Phase::Done => unreachable!("checked above"),
        }
        Ok(())
    }

    fn acted(&mut self, request: TurnRequest, out: TurnOutput) {
        let role = self.config.role_at(self.position);
        let TurnRequest { turn_index, agent, messages, .. } = request;
        let calls = if self.config.pipeline.has_tools(role) { parse_calls(&out.text) } else { Calls::None };
        let (sampled, text) = Sampled::split(out);
        self.actions.push(Action {
            turn_index,
            agent,
            role,
            position: self.position as u32,
            step: self.step,
            messages,
            sampled,
            text,
            tool_runs: Vec::new(),
            malformed_call: matches!(calls, Calls::Malformed(_)),
            observation: None,
            coach: CoachVerdict { process_score: None, outcome: None, retry_attempted: false, fallback_used: false, replies: Vec::new() },
            workspace: if self.config.pipeline == Pipeline::DsBench { self.file_names() } else { Vec::new() },
        });
        match calls {
            Calls::None => self.end_slot(),
            Calls::Malformed(error) => {
                let obs = wrap(&error);
                self.actions.last_mut().expect("just pushed").observation = Some(obs.clone());
                self.after_observation(obs);
            }
            Calls::Code(programs) => {
                self.pending = programs
                    .into_iter()
                    .map(|code| {
                        let call_index = self.next_call;
                        self.next_call += 1;
                        Request::Tool(ToolRequest {
                            call_index,
                            code,
                            timeout_secs: self.config.tool_timeout_secs,
                            // Every run starts from the whole workspace and hands back what its role saves.
                            files: self.workspace.iter().map(|(name, bytes)| WorkspaceFile { name: name.clone(), bytes: bytes.clone() }).collect(),
                            fetch: self.config.pipeline.fetch_patterns(role).iter().map(|p| p.to_string()).collect(),
                        })
                    })
                    .collect();
                self.phase = Phase::Tools;
            }
        }
    }

    /// DSBench: the files the runs handed back join the workspace (a later run's copy wins), and
    /// a printed summary is kept for the agents after.
    fn take_files(&mut self, results: &mut [ToolResult]) {
        let role = self.config.role_at(self.position);
        for r in results.iter_mut() {
            for f in std::mem::take(&mut r.files) {
                self.workspace.insert(f.name, f.bytes);
            }
            match role {
                Role::DataEngineer => self.preprocessing_summary = ds_prompts::summary(&r.stdout, PREPROCESSING_MARK).or(self.preprocessing_summary.take()),
                Role::Modeler => self.model_summary = ds_prompts::summary(&r.stdout, MODEL_MARK).or(self.model_summary.take()),
                _ => {}
            }
        }
    }

    fn after_observation(&mut self, obs: String) {
        let a = self.actions.last().expect("an action was taken");
        if self.step + 1 < self.config.max_turns[self.position] {
            self.messages.push(ChatMessage { role: "assistant".into(), content: a.text.clone() });
            self.messages.push(ChatMessage::user(obs));
            self.step += 1;
            self.open_action();
        } else {
            self.end_slot();
        }
    }

    /// Hands off to the next agent (spec 2), or starts coaching after the last.
    fn end_slot(&mut self) {
        let a = self.actions.last().expect("an action was taken");
        let role = self.config.role_at(self.position);
        let handoff = match role {
            Role::DataEngineer | Role::Modeler | Role::Analyst => crate::turn::without_thinking(&a.text),
            Role::CodeExecutor => match self.actions.iter().rev().take_while(|x| x.position == a.position).find_map(|x| x.observation.clone()) {
                Some(obs) => format!("{}\n\n{obs}", a.text),
                None => a.text.clone(),
            },
            _ => a.text.clone(),
        };
        self.position += 1;
        if self.position < self.config.pipeline.roles().len() {
            self.open_slot(handoff);
        } else {
            if self.config.pipeline == Pipeline::DsBench {
                let ws = &self.workspace;
                // The file, else predictions written out in the Analyst's last reply (spec 7.1).
                let submission = ["submission.csv", "predictions.csv"]
                    .iter()
                    .find_map(|n| ws.get(*n))
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .or_else(|| self.actions.last().and_then(|a| super::outcome::predictions_in_text(&a.text)));
                self.ds_outcome = Some(evaluate(submission.as_deref(), &self.question.answer, &self.question.prompt));
            }
            self.open_coach((0..self.actions.len()).collect(), false);
        }
    }

    /// The reference answer, shown to the coach of the chain's last role only (spec 4).
    fn ground_truth_for(&self, role: Role) -> Option<String> {
        (self.config.pipeline.roles().last() == Some(&role)).then(|| self.question.answer.clone()).filter(|a| !a.trim().is_empty())
    }

    fn open_coach(&mut self, which: Vec<usize>, retry: bool) {
        let coach = self.config.coach_agent;
        self.coached = which.clone();
        let mut pending = Vec::with_capacity(which.len());
        for i in which {
            let a = &self.actions[i];
            let truth = self.ground_truth_for(a.role);
            let observation = a.observation.as_deref().map(|o| clip(o, self.config.coach_observation_chars));
            let view = CoachView {
                problem: &self.question.prompt,
                role: a.role,
                agent_input: &transcript(&a.messages),
                agent_output: &a.text,
                tool_observation: observation.as_deref(),
                ground_truth: truth.as_deref(),
            };
            let first = match self.config.pipeline {
                Pipeline::MathChat => coach_prompt(&view),
                Pipeline::DsBench => {
                    let task_files: Vec<String> = self.question.files.keys().cloned().collect();
                    let earlier: Vec<String> = a.workspace.iter().filter(|f| !task_files.contains(f)).cloned().collect();
                    // The outcome block goes to the Analyst's coach only (spec 4).
                    let metrics = (a.role == Role::Analyst).then(|| self.ds_outcome.as_ref().map(DsOutcome::render)).flatten();
                    ds_prompts::coach_prompt(&DsCoachView {
                        action: &view,
                        files_available: &a.workspace,
                        files_from_previous_agents: &earlier,
                        metrics: metrics.as_deref(),
                    })
                }
            };
            let messages = if retry {
                let reply = a.coach.replies.first().cloned().unwrap_or_default();
                vec![
                    ChatMessage::user(first),
                    ChatMessage { role: "assistant".into(), content: reply },
                    ChatMessage::user(coach_retry_prompt(wants_outcome(a.role, truth.as_deref()))),
                ]
            } else {
                vec![ChatMessage::user(first)]
            };
            pending.push(self.turn(coach, Role::Coach, u32::from(retry), i as u32, u32::from(retry), messages));
        }
        self.pending = pending;
        self.phase = if retry { Phase::CoachRetry } else { Phase::Coach };
    }

    fn coached(&mut self, replies: Vec<Reply>) {
        let retry = self.phase == Phase::CoachRetry;
        let mut again = Vec::new();
        for (i, reply) in self.coached.clone().into_iter().zip(replies) {
            let Reply::Turn(out) = reply else { unreachable!("coach groups hold turns only") };
            let truth = self.ground_truth_for(self.actions[i].role);
            let wants = wants_outcome(self.actions[i].role, truth.as_deref());
            let reading = parse_coach(&out.text);
            let fallback = self.config.coach_fallback;
            let c = &mut self.actions[i].coach;
            c.replies.push(out.text.clone());
            c.process_score = c.process_score.or(reading.process);
            c.outcome = c.outcome.or(reading.outcome);
            if c.process_score.is_some() && (!wants || c.outcome.is_some()) {
                continue;
            }
            if !retry {
                c.retry_attempted = true;
                again.push(i);
            } else if c.process_score.is_none() && fallback == CoachFallback::Legacy {
                c.process_score = Some(legacy_score(&c.replies.join("\n")));
                c.fallback_used = true;
            }
        }
        if again.is_empty() {
            self.pending.clear();
            self.phase = Phase::Done;
        } else {
            self.open_coach(again, true);
        }
    }

    /// The finished record. Fails while requests are pending.
    pub fn into_trajectory(self) -> Result<MappaTrajectory, WorkflowError> {
        if self.phase != Phase::Done {
            return Err(WorkflowError::MalformedTrajectory(format!("the MAPPA episode is not finished: {} requests pending", self.pending.len())));
        }
        let last = self.actions.last().filter(|a| a.role == Role::Verifier);
        let outcome_correct = last.and_then(|a| crate::grade::is_correct(self.question.task, &a.text, &self.question.answer));
        let t = MappaTrajectory {
            question_id: self.question.id,
            task: self.question.task,
            instance: self.instance,
            actions: self.actions,
            outcome_correct,
            ds_outcome: self.ds_outcome,
        };
        t.validate(self.config.pipeline.roles(), &self.config.max_turns).map_err(|f| WorkflowError::MalformedTrajectory(f.to_string()))?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod dsbench_tests;
