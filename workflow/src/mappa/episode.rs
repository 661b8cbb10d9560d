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
        t.validate(self.config.pipeline.roles(), &self.config.max_turns).map_err(WorkflowError::MalformedTrajectory)?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mappa::reward::{action_rewards, MappaMetrics};
    use crate::task::TaskKind;
    use crate::turn::FinishReason;

    fn question() -> TaskRecord {
        TaskRecord { prompt: "What is 2+2?".into(), answer: "4".into(), task: TaskKind::Math, id: "q1".into(), source: None, files: Default::default() }
    }

    fn reply(r: &Request, text: &str) -> Reply {
        let Request::Turn(t) = r else { panic!("expected a turn, got {r:?}") };
        Reply::Turn(TurnOutput {
            turn_index: t.turn_index,
            text: text.into(),
            raw_text: text.into(),
            prompt_ids: vec![1, 2, 3],
            completion_ids: vec![7; text.len().min(5)],
            logprobs: vec![-0.5; text.len().min(5)],
            finish_reason: FinishReason::Stop,
            policy_version: 0,
            constrained: Vec::new(),
        })
    }

    fn tool(r: &Request, stdout: &str, failure: Option<&str>) -> Reply {
        let Request::Tool(t) = r else { panic!("expected a tool call, got {r:?}") };
        Reply::Tool(ToolResult {
            call_index: t.call_index,
            failure: failure.map(str::to_string),
            detail: failure.unwrap_or("").into(),
            stdout: stdout.into(),
            stderr: String::new(),
            files: Vec::new(),
        })
    }

    fn turn(r: &Request) -> &TurnRequest {
        match r {
            Request::Turn(t) => t,
            Request::Tool(_) => panic!("expected a turn"),
        }
    }

    #[test]
    fn a_mathchat_chain_runs_tools_grows_contexts_and_is_coached() {
        let config = MappaConfig::default();
        let mut e = Episode::new(&config, &question(), 0, 9).unwrap();
        // Problem Solver: one action, no tools.
        let p = e.pending().to_vec();
        assert_eq!((p.len(), turn(&p[0]).role, turn(&p[0]).agent), (1, Role::ProblemSolver, 0));
        e.submit(vec![reply(&p[0], "2+2 is 4.")]).unwrap();
        // Code Executor, action 0: its prompt quotes the solution; its code becomes a tool call.
        let p = e.pending().to_vec();
        let first = turn(&p[0]).clone();
        assert_eq!((first.role, first.agent, first.messages.len()), (Role::CodeExecutor, 1, 1));
        assert!(first.messages[0].content.contains("2+2 is 4."));
        e.submit(vec![reply(&p[0], "Check:\n```python\nprint(2+2)\n```")]).unwrap();
        let p = e.pending().to_vec();
        assert_eq!(
            p,
            vec![Request::Tool(ToolRequest { call_index: 0, code: "print(2+2)\n".into(), timeout_secs: 30.0, files: Vec::new(), fetch: Vec::new() })]
        );
        e.submit(vec![tool(&p[0], "4\n", None)]).unwrap();
        // Action 1 continues the same context, grown by exactly the action and its observation.
        let p = e.pending().to_vec();
        let second = turn(&p[0]).clone();
        assert_eq!(second.round, 1);
        assert_eq!(second.messages[..1], first.messages[..]);
        assert_eq!(
            second.messages[1..],
            [
                ChatMessage { role: "assistant".into(), content: "Check:\n```python\nprint(2+2)\n```".into() },
                ChatMessage::user("<tool_response>\n4\n\n</tool_response>")
            ]
        );
        e.submit(vec![reply(&p[0], "The program prints 4.")]).unwrap();
        // Verifier: the hand-off is the final action and the last observation.
        let p = e.pending().to_vec();
        assert_eq!(turn(&p[0]).role, Role::Verifier);
        assert!(turn(&p[0]).messages[0].content.contains("The program prints 4.\n\n<tool_response>\n4\n"));
        e.submit(vec![reply(&p[0], "**\\boxed{4}**")]).unwrap();
        // The coach scores all four actions at once; only the Verifier's coach sees the answer.
        let p = e.pending().to_vec();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|r| turn(r).agent == config.coach_agent && turn(r).role == Role::Coach && turn(r).sampling.temperature == 0.0));
        assert!(turn(&p[3]).messages[0].content.contains("## Reference answer\n4") && turn(&p[3]).messages[0].content.contains("ANSWER_CORRECT"));
        assert!(turn(&p[0]).messages[0].content.contains("## Reference answer\nN/A"));
        assert!(turn(&p[1]).messages[0].content.contains("## Tool output\n<tool_response>\n4\n"));
        let replies = vec![
            reply(&p[0], "Fine. PROCESS_SCORE: 7"),
            reply(&p[1], "I like it."),
            reply(&p[2], "PROCESS_SCORE: 9"),
            reply(&p[3], "PROCESS_SCORE: 8\nANSWER_CORRECT: 1"),
        ];
        e.submit(replies).unwrap();
        // One retry, for the reply without a score, quoting it.
        let p = e.pending().to_vec();
        assert_eq!(p.len(), 1);
        let retry = turn(&p[0]);
        assert_eq!((retry.slot, retry.messages.len(), retry.messages[1].content.as_str()), (1, 3, "I like it."));
        e.submit(vec![reply(&p[0], "Still no number.")]).unwrap();
        assert!(e.is_done() && e.pending().is_empty());
        let t = e.into_trajectory().unwrap();
        assert_eq!(t.actions.len(), 4);
        assert_eq!(t.outcome_correct, Some(true));
        assert_eq!(t.actions[1].tool_runs, vec![None]);
        assert!(t.actions[1].coach.retry_attempted && !t.actions[1].coach.fallback_used);
        let rewards: Vec<Option<f64>> = action_rewards(&config, &t).into_iter().map(|r| r.reward.map(|v| (v * 1e9).round() / 1e9)).collect();
        // Worked example: R = 1 · 0.1 · score + 0 · outcome; the unscored action gets none.
        assert_eq!(rewards, vec![Some(0.7), None, Some(0.9), Some(0.8)]);
        let m = MappaMetrics::of(&config, &[&t]);
        assert_eq!((m.samples, m.samples_dropped, m.tool_calls, m.coach_retries, m.coach_fallbacks), (3, 1, 1, 1, 0));
        assert_eq!(m.coach_score["code_executor"].mean, Some(9.0));
        assert_eq!(m.actions["code_executor"].mean, Some(2.0));
        assert_eq!((m.outcome_accuracy.mean, m.coach_agreement.mean), (Some(1.0), Some(1.0)));
    }

    #[test]
    fn failed_runs_and_the_legacy_fallback_are_recorded() {
        let config = MappaConfig { coach_fallback: CoachFallback::Legacy, max_turns: vec![1, 1, 1], ..MappaConfig::default() };
        let mut e = Episode::new(&config, &question(), 0, 1).unwrap();
        let p = e.pending().to_vec();
        e.submit(vec![reply(&p[0], "maybe 5")]).unwrap();
        let p = e.pending().to_vec();
        e.submit(vec![reply(&p[0], "```python\nwhile True: pass\n```\n```python\nimport os\nos.fork()\n```")]).unwrap();
        let p = e.pending().to_vec();
        assert_eq!(p.len(), 2);
        // Replies may come in any order; a partial group is refused and changes nothing.
        assert!(matches!(e.submit(vec![tool(&p[1], "", Some("process_limit"))]), Err(WorkflowError::MissingTurns(m)) if m == vec![0]));
        e.submit(vec![tool(&p[1], "", Some("process_limit")), tool(&p[0], "", Some("timeout"))]).unwrap();
        // max_turns 1: the Executor's slot ends after the tools ran; the Verifier is next.
        let p = e.pending().to_vec();
        assert_eq!(turn(&p[0]).role, Role::Verifier);
        assert!(turn(&p[0]).messages[0].content.contains("[Execution failed: timeout]\n------\n[Execution failed: process_limit]"));
        e.submit(vec![reply(&p[0], "\\boxed{5}")]).unwrap();
        let p = e.pending().to_vec();
        e.submit(p.iter().map(|r| reply(r, "no verdict")).collect()).unwrap();
        let p = e.pending().to_vec();
        e.submit(p.iter().map(|r| reply(r, "hmm, 6 maybe")).collect()).unwrap();
        let t = e.into_trajectory().unwrap();
        assert_eq!(t.outcome_correct, Some(false));
        assert!(t.actions.iter().all(|a| a.coach.fallback_used && a.coach.process_score == Some(6.0)));
        let m = MappaMetrics::of(&config, &[&t]);
        assert_eq!(m.sandbox_failures, [("process_limit".to_string(), 1), ("timeout".to_string(), 1)].into_iter().collect());
        assert_eq!((m.tool_success_rate.mean, m.coach_fallbacks, m.samples), (Some(0.0), 3, 3));
    }
}

#[cfg(test)]
mod dsbench_tests {
    use super::*;
    use crate::task::TaskKind;
    use crate::turn::FinishReason;

    fn task() -> TaskRecord {
        let files = [("train.csv".to_string(), "id,x,y\n1,0.1,0\n2,0.9,1\n".to_string()), ("test.csv".to_string(), "id,x\n3,0.2\n4,0.8\n".to_string())];
        TaskRecord {
            prompt: "Predict y. Submissions are evaluated on accuracy.".into(),
            answer: "id,y\n3,0\n4,1\n".into(),
            task: TaskKind::DataScience,
            id: "toy".into(),
            source: None,
            files: files.into_iter().collect(),
        }
    }

    fn act(e: &mut Episode, text: &str) -> TurnRequest {
        let p = e.pending().to_vec();
        let Request::Turn(t) = &p[0] else { panic!("expected a turn, got {p:?}") };
        let out = TurnOutput {
            turn_index: t.turn_index,
            text: text.into(),
            raw_text: text.into(),
            prompt_ids: vec![1, 2],
            completion_ids: vec![7, 8],
            logprobs: vec![-0.5, -0.5],
            finish_reason: FinishReason::Stop,
            policy_version: 0,
            constrained: Vec::new(),
        };
        e.submit(vec![Reply::Turn(out)]).unwrap();
        t.clone()
    }

    /// Answers the pending run with `stdout` and the files it "saved"; returns the request.
    fn run(e: &mut Episode, stdout: &str, saved: &[(&str, &str)]) -> ToolRequest {
        let p = e.pending().to_vec();
        let Request::Tool(t) = &p[0] else { panic!("expected a tool call, got {p:?}") };
        let files = saved.iter().map(|(n, b)| WorkspaceFile { name: n.to_string(), bytes: b.as_bytes().to_vec() }).collect();
        let r = ToolResult { call_index: t.call_index, failure: None, detail: String::new(), stdout: stdout.into(), stderr: String::new(), files };
        e.submit(vec![Reply::Tool(r)]).unwrap();
        t.clone()
    }

    fn names(r: &ToolRequest) -> Vec<&str> {
        r.files.iter().map(|f| f.name.as_str()).collect()
    }

    #[test]
    fn the_workspace_travels_down_the_chain_and_the_analysts_coach_sees_the_metrics() {
        let config = MappaConfig { pipeline: Pipeline::DsBench, max_turns: vec![2, 1, 1], tool_timeout_secs: 60.0, ..MappaConfig::default() };
        let mut e = Episode::new(&config, &task(), 0, 5).unwrap();
        // Data Engineer: the task's files are there; its run saves the features.
        let t = act(&mut e, "<think>plan</think>```python\nprint('prep')\n```");
        assert_eq!(t.role, Role::DataEngineer);
        assert!(t.messages[0].content.contains("  - test.csv\n  - train.csv"));
        let r = run(
            &mut e,
            "---PREPROCESSING_SUMMARY---\n2 rows, 1 feature\n---END_SUMMARY---\n",
            &[("X_train.pkl", "a"), ("y_train.pkl", "b"), ("X_test.pkl", "c")],
        );
        assert_eq!(
            (names(&r), r.fetch.clone(), r.timeout_secs),
            (vec!["test.csv", "train.csv"], vec!["*.pkl".to_string(), "*.joblib".into(), "*.npy".into(), "*.npz".into()], 60.0)
        );
        act(&mut e, "<think>ok</think>Saved the features.");
        // Modeler: the features and the summary reach it, and the hand-off without its thinking.
        let t = act(&mut e, "```python\nprint('fit')\n```");
        assert_eq!(t.role, Role::Modeler);
        let prompt = &t.messages[0].content;
        assert!(prompt.contains("  - X_test.pkl") && prompt.contains("2 rows, 1 feature") && prompt.contains("last message\nSaved the features."), "{prompt}");
        let r = run(&mut e, "---MODEL_SUMMARY---\nlogistic, cv 0.9\n---END_SUMMARY---", &[("model.pkl", "m")]);
        assert_eq!(names(&r), vec!["X_test.pkl", "X_train.pkl", "test.csv", "train.csv", "y_train.pkl"]);
        // Analyst: both files there (no warning); it writes the submission.
        let t = act(&mut e, "```python\nprint('predict')\n```");
        assert!(!t.messages[0].content.contains("WARNING") && t.messages[0].content.contains("logistic, cv 0.9"));
        let r = run(&mut e, "2 predictions", &[("submission.csv", "id,y\n3,0\n4,0\n")]);
        assert_eq!(r.fetch, vec!["submission.csv".to_string(), "predictions.csv".into()]);
        // The coach scores all four actions; only the Analyst's coach reads the metrics.
        let p = e.pending().to_vec();
        assert_eq!(p.len(), 4);
        let coach_prompt = |i: usize| match &p[i] {
            Request::Turn(t) => t.messages[0].content.clone(),
            Request::Tool(_) => panic!("coach turns only"),
        };
        let analyst = coach_prompt(3);
        assert!(analyst.contains("Score one action of the analyst") && analyst.contains("  - Accuracy: 0.5000"), "{analyst}");
        assert!(analyst.contains("## Files saved by earlier agents\n  - X_test.pkl"), "{analyst}");
        assert!(coach_prompt(0).contains("## Computed metrics\nN/A"));
        let replies = p.iter().map(|r| match r {
            Request::Turn(t) => Reply::Turn(TurnOutput {
                turn_index: t.turn_index,
                text: "PROCESS_SCORE: 7".into(),
                raw_text: String::new(),
                prompt_ids: vec![1],
                completion_ids: vec![2],
                logprobs: vec![-0.1],
                finish_reason: FinishReason::Stop,
                policy_version: 0,
                constrained: Vec::new(),
            }),
            Request::Tool(_) => unreachable!(),
        });
        e.submit(replies.collect()).unwrap();
        let t = e.into_trajectory().unwrap();
        let o = t.ds_outcome.as_ref().unwrap();
        assert!(o.success && o.metrics["accuracy"] == 0.5 && o.task_metric.as_deref() == Some("accuracy"));
        assert_eq!(t.actions.iter().map(|a| a.role).collect::<Vec<_>>(), vec![Role::DataEngineer, Role::DataEngineer, Role::Modeler, Role::Analyst]);
        assert_eq!(t.actions[3].workspace.len(), 6);
        assert!(t.actions.iter().all(|a| a.coach.process_score == Some(7.0)));
        let m = crate::mappa::MappaMetrics::of(&config, &[&t]);
        assert_eq!((m.ds_success_rate.mean, m.ds_metrics["accuracy"].mean), (Some(1.0), Some(0.5)));
        assert_eq!(m.coach_score_by_task_type["classification/data_engineer"].count, 2);
        assert_eq!(m.coach_score_by_task_type["classification/analyst"].mean, Some(7.0));
    }
}
