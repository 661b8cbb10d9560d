//! The seam between methods and the machinery. A method's episode is a `Program`: it hands out
//! groups of `Request`s (generations for a policy or a frozen model, and tool runs), takes the
//! whole group's `Reply`s back, and ends with a `Record` that the coordinator turns into
//! rewards. The worker drives any program the same way; it never needs to know the method.
use crate::comas::{self, CoMasConfig, InstancePlan, Trajectory};
use crate::cosir::{self, CosirConfig, CosirTrajectory, Table};
use crate::error::WorkflowError;
use crate::eval::{EvalEpisode, EvalQuestion, EvalSettings, EvalTranscript};
use crate::job::Method;
use crate::mappa::{self, MappaConfig, MappaTrajectory};
use crate::neuromas::{self, Graph, NeuromasConfig, NeuromasTrajectory};
use crate::task::TaskRecord;
use crate::tool::{ToolRequest, ToolResult};
use crate::turn::{check_constrained, PromptMeter, Role, TurnOutput, TurnRequest};
use serde::{Deserialize, Serialize};

/// An effect a program needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// A generation by agent `agent` (a trained policy or a frozen model).
    Turn(TurnRequest),
    /// A program run in the sandbox.
    Tool(ToolRequest),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Turn(TurnOutput),
    Tool(ToolResult),
}

impl Request {
    /// The index a reply must carry: a turn index or a call index (each unique in its episode).
    fn key(&self) -> (bool, u32) {
        match self {
            Request::Turn(t) => (true, t.turn_index),
            Request::Tool(t) => (false, t.call_index),
        }
    }
}

impl Reply {
    fn key(&self) -> (bool, u32) {
        match self {
            Reply::Turn(t) => (true, t.turn_index),
            Reply::Tool(t) => (false, t.call_index),
        }
    }
}

/// The replies in the order of `pending`, if they answer every request exactly once and each
/// generation is well formed.
pub fn take_replies(pending: &[Request], replies: Vec<Reply>) -> Result<Vec<Reply>, WorkflowError> {
    let mut slots: Vec<Option<Reply>> = pending.iter().map(|_| None).collect();
    for reply in replies {
        let key = reply.key();
        let Some(i) = pending.iter().position(|r| r.key() == key) else {
            return Err(WorkflowError::MalformedTurn {
                turn_index: key.1,
                message: format!("no pending {} has this index", if key.0 { "turn" } else { "tool call" }),
            });
        };
        if slots[i].is_some() {
            return Err(WorkflowError::DuplicateTurn(key.1));
        }
        if let Reply::Turn(out) = &reply {
            if out.logprobs.len() != out.completion_ids.len() {
                return Err(WorkflowError::LogprobCount { turn_index: out.turn_index, logprobs: out.logprobs.len(), tokens: out.completion_ids.len() });
            }
            check_constrained(&out.constrained, &out.completion_ids).map_err(|message| WorkflowError::MalformedTurn { turn_index: out.turn_index, message })?;
        }
        slots[i] = Some(reply);
    }
    let missing: Vec<u32> = pending.iter().zip(&slots).filter(|(_, s)| s.is_none()).map(|(r, _)| r.key().1).collect();
    if !missing.is_empty() {
        return Err(WorkflowError::MissingTurns(missing));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// Everything needed to start one episode, parsed from the wire.
#[derive(Debug, Clone)]
pub enum ProgramStart {
    Comas {
        config: CoMasConfig,
        question: TaskRecord,
        plan: InstancePlan,
        instance: u32,
        seed: u64,
    },
    Mappa {
        config: MappaConfig,
        question: TaskRecord,
        instance: u32,
        seed: u64,
    },
    Eval {
        settings: EvalSettings,
        question: EvalQuestion,
    },
    /// A CoSIR game on `table` (the coordinator draws the tables; the spec's plan carries one).
    Cosir {
        config: CosirConfig,
        table: Table,
        instance: u32,
        seed: u64,
    },
    /// One rollout of a NeuroMAS graph on a task (the plan carries the graph as it stands).
    Neuromas {
        config: NeuromasConfig,
        graph: Graph,
        question: TaskRecord,
        instance: u32,
        seed: u64,
    },
}

impl ProgramStart {
    /// Parses an episode spec's fields; an error names the field that is wrong.
    pub fn parse(method: &str, config_json: &str, question_json: &str, plan_json: &str, instance: u32, seed: u64) -> Result<Self, String> {
        let method = Method::from_wire(method)?;
        let field = |name: &str, e: serde_json::Error| format!("`{name}` is not valid: {e}");
        let task = || -> Result<TaskRecord, String> { serde_json::from_str(question_json).map_err(|e| field("question_json", e)) };
        Ok(match method {
            Method::Comas => ProgramStart::Comas {
                config: serde_json::from_str(config_json).map_err(|e| field("config_json", e))?,
                question: task()?,
                plan: serde_json::from_str(plan_json).map_err(|e| field("plan_json", e))?,
                instance,
                seed,
            },
            Method::Mappa => {
                ProgramStart::Mappa { config: serde_json::from_str(config_json).map_err(|e| field("config_json", e))?, question: task()?, instance, seed }
            }
            Method::Eval => ProgramStart::Eval {
                settings: serde_json::from_str(config_json).map_err(|e| field("config_json", e))?,
                question: serde_json::from_str(question_json).map_err(|e| field("question_json", e))?,
            },
            Method::Cosir => ProgramStart::Cosir {
                config: serde_json::from_str(config_json).map_err(|e| field("config_json", e))?,
                table: serde_json::from_str(plan_json).map_err(|e| field("plan_json", e))?,
                instance,
                seed,
            },
            Method::Neuromas => ProgramStart::Neuromas {
                config: serde_json::from_str(config_json).map_err(|e| field("config_json", e))?,
                graph: serde_json::from_str(plan_json).map_err(|e| field("plan_json", e))?,
                question: task()?,
                instance,
                seed,
            },
        })
    }

    /// Every agent the episode may ask to speak, trained or frozen.
    pub fn agents(&self) -> Vec<u32> {
        match self {
            ProgramStart::Comas { config, .. } => (0..config.num_agents).collect(),
            ProgramStart::Mappa { config, .. } => {
                let mut a = config.agents.clone();
                a.push(config.coach_agent);
                a.sort_unstable();
                a.dedup();
                a
            }
            ProgramStart::Eval { settings, .. } => (0..settings.members).collect(),
            ProgramStart::Cosir { config, .. } => (0..config.num_agents()).collect(),
            ProgramStart::Neuromas { config, graph, .. } => (0..config.agents(graph)).collect(),
        }
    }

    pub fn prompt_max_len(&self) -> Option<u32> {
        match self {
            ProgramStart::Comas { config, .. } => config.prompt_max_len,
            ProgramStart::Mappa { config, .. } => config.prompt_max_len,
            ProgramStart::Cosir { config, .. } => config.prompt_max_len,
            ProgramStart::Eval { .. } | ProgramStart::Neuromas { .. } => None,
        }
    }

    pub fn method(&self) -> Method {
        match self {
            ProgramStart::Comas { .. } => Method::Comas,
            ProgramStart::Mappa { .. } => Method::Mappa,
            ProgramStart::Eval { .. } => Method::Eval,
            ProgramStart::Cosir { .. } => Method::Cosir,
            ProgramStart::Neuromas { .. } => Method::Neuromas,
        }
    }

    /// The CoMAS settings, whose prompts a worker fits to its room (spec 3.7).
    pub fn comas(&self) -> Option<&CoMasConfig> {
        match self {
            ProgramStart::Comas { config, .. } => Some(config),
            ProgramStart::Mappa { .. } | ProgramStart::Eval { .. } | ProgramStart::Cosir { .. } | ProgramStart::Neuromas { .. } => None,
        }
    }
}

/// One running episode of any method.
#[derive(Debug, Clone)]
pub enum Program {
    Comas(Box<comas::Episode>),
    Mappa(Box<mappa::Episode>),
    Eval(Box<EvalEpisode>),
    Cosir(Box<cosir::Episode>),
    Neuromas(Box<neuromas::Episode>),
}

impl Program {
    /// Starts an episode; its first group is pending at once. `meter` fits CoMAS prompts.
    pub fn start(spec: &ProgramStart, meter: &dyn PromptMeter) -> Result<Program, WorkflowError> {
        Ok(match spec {
            ProgramStart::Comas { config, question, plan, instance, seed } => {
                Program::Comas(Box::new(comas::Episode::new_metered(config, question, *instance, plan.clone(), *seed, meter)?))
            }
            ProgramStart::Mappa { config, question, instance, seed } => Program::Mappa(Box::new(mappa::Episode::new(config, question, *instance, *seed)?)),
            ProgramStart::Eval { settings, question } => Program::Eval(Box::new(EvalEpisode::new(settings, question)?)),
            ProgramStart::Cosir { config, table, instance, seed } => Program::Cosir(Box::new(cosir::Episode::new(config, table, *instance, *seed)?)),
            ProgramStart::Neuromas { config, graph, question, instance, seed } => {
                Program::Neuromas(Box::new(neuromas::Episode::new(config, graph, question, *instance, *seed)?))
            }
        })
    }

    /// The pending group; empty once the episode is done.
    pub fn pending(&self) -> Vec<Request> {
        match self {
            Program::Comas(e) => e.next_turns().into_iter().map(Request::Turn).collect(),
            Program::Mappa(e) => e.pending().to_vec(),
            Program::Eval(e) => e.pending(),
            Program::Cosir(e) => e.pending().to_vec(),
            Program::Neuromas(e) => e.pending().to_vec(),
        }
    }

    /// Takes the replies of the whole pending group.
    pub fn submit(&mut self, replies: Vec<Reply>, meter: &dyn PromptMeter) -> Result<(), WorkflowError> {
        match self {
            Program::Comas(e) => {
                let mut outputs = Vec::with_capacity(replies.len());
                for r in replies {
                    match r {
                        Reply::Turn(t) => outputs.push(t),
                        Reply::Tool(t) => return Err(WorkflowError::MalformedTurn { turn_index: t.call_index, message: "a CoMAS game runs no tools".into() }),
                    }
                }
                e.submit_metered(outputs, meter)
            }
            Program::Mappa(e) => e.submit(replies),
            Program::Eval(e) => e.submit(replies),
            Program::Cosir(e) => e.submit(replies),
            Program::Neuromas(e) => e.submit(replies, meter),
        }
    }

    pub fn is_done(&self) -> bool {
        match self {
            Program::Comas(e) => e.is_done(),
            Program::Mappa(e) => e.is_done(),
            Program::Eval(e) => e.is_done(),
            Program::Cosir(e) => e.is_done(),
            Program::Neuromas(e) => e.is_done(),
        }
    }

    pub fn finish(self) -> Result<Record, WorkflowError> {
        match self {
            Program::Comas(e) => e.into_trajectory().map(Record::Comas),
            Program::Mappa(e) => e.into_trajectory().map(Record::Mappa),
            Program::Eval(e) => e.into_transcript().map(Record::Eval),
            Program::Cosir(e) => e.into_trajectory().map(Record::Cosir),
            Program::Neuromas(e) => e.into_trajectory().map(Record::Neuromas),
        }
    }
}

/// A turn of a trained agent, as the version check sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyTurn {
    pub turn_index: u32,
    pub agent: u32,
    pub role: Role,
    pub policy_version: u64,
}

/// A method's settings, owned (an evaluation's variant of the job's).
#[derive(Debug, Clone, PartialEq)]
pub enum MethodConfig {
    Comas(CoMasConfig),
    Mappa(MappaConfig),
    Cosir(CosirConfig),
    Neuromas(NeuromasConfig),
}

impl MethodConfig {
    pub fn settings(&self) -> Settings<'_> {
        match self {
            MethodConfig::Comas(c) => Settings::Comas(c),
            MethodConfig::Mappa(m) => Settings::Mappa(m),
            MethodConfig::Cosir(c) => Settings::Cosir(c),
            MethodConfig::Neuromas(c) => Settings::Neuromas(c),
        }
    }
}

/// A job's method with its settings.
#[derive(Debug, Clone, Copy)]
pub enum Settings<'a> {
    Comas(&'a CoMasConfig),
    Mappa(&'a MappaConfig),
    Eval(&'a EvalSettings),
    Cosir(&'a CosirConfig),
    Neuromas(&'a NeuromasConfig),
}

impl Settings<'_> {
    pub fn method(&self) -> Method {
        match self {
            Settings::Comas(_) => Method::Comas,
            Settings::Mappa(_) => Method::Mappa,
            Settings::Eval(_) => Method::Eval,
            Settings::Cosir(_) => Method::Cosir,
            Settings::Neuromas(_) => Method::Neuromas,
        }
    }

    pub fn instances_per_question(&self) -> u32 {
        match self {
            Settings::Comas(c) => c.instances_per_question,
            Settings::Mappa(m) => m.instances_per_question,
            Settings::Eval(_) => 1,
            Settings::Cosir(c) => c.instances_per_question,
            Settings::Neuromas(c) => c.rollouts_per_task,
        }
    }

    /// The settings as an episode spec carries them.
    pub fn config_json(&self) -> String {
        match self {
            Settings::Comas(c) => serde_json::to_string(c),
            Settings::Mappa(m) => serde_json::to_string(m),
            Settings::Eval(e) => serde_json::to_string(e),
            Settings::Cosir(c) => serde_json::to_string(c),
            Settings::Neuromas(c) => serde_json::to_string(c),
        }
        .expect("settings serialise")
    }

    /// How to read this method's records back.
    pub fn record_kind(&self) -> RecordKind {
        match self {
            Settings::Comas(_) => RecordKind::Comas,
            Settings::Mappa(m) => RecordKind::Mappa { roles: m.pipeline.roles().to_vec(), max_turns: m.max_turns.clone() },
            Settings::Eval(e) => RecordKind::Eval((*e).clone()),
            Settings::Cosir(c) => RecordKind::Cosir((*c).clone()),
            Settings::Neuromas(c) => RecordKind::Neuromas((*c).clone()),
        }
    }
}

/// What a coordinator needs to parse and check a worker's record.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordKind {
    Comas,
    Mappa { roles: Vec<Role>, max_turns: Vec<u32> },
    Eval(EvalSettings),
    Cosir(CosirConfig),
    Neuromas(NeuromasConfig),
}

impl RecordKind {
    /// The record in `json`, parsed and checked; the error says what is wrong.
    pub fn parse(&self, json: &str) -> Result<Record, String> {
        match self {
            RecordKind::Comas => {
                let t: Trajectory = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
                t.validate().map_err(|e| e.to_string())?;
                Ok(Record::Comas(t))
            }
            RecordKind::Mappa { roles, max_turns } => {
                let t: MappaTrajectory = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
                t.validate(roles, max_turns)?;
                Ok(Record::Mappa(t))
            }
            RecordKind::Eval(settings) => {
                let t: EvalTranscript = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
                t.validate(settings)?;
                Ok(Record::Eval(t))
            }
            RecordKind::Cosir(config) => {
                let t: CosirTrajectory = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
                t.validate(config)?;
                Ok(Record::Cosir(t))
            }
            RecordKind::Neuromas(config) => {
                let t: NeuromasTrajectory = serde_json::from_str(json).map_err(|e| format!("not valid JSON: {e}"))?;
                t.validate(config)?;
                Ok(Record::Neuromas(t))
            }
        }
    }
}

/// A finished episode, as the worker sends it: the method's own record, serialised as is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Record {
    Comas(Trajectory),
    Mappa(MappaTrajectory),
    Eval(EvalTranscript),
    Cosir(CosirTrajectory),
    Neuromas(NeuromasTrajectory),
}

impl Record {
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// Turns of the trained agents (an evaluation's calls).
    pub fn turns(&self) -> u32 {
        match self {
            Record::Comas(t) => t.turns.len() as u32,
            Record::Mappa(t) => t.actions.len() as u32,
            Record::Eval(t) => t.calls.len() as u32,
            Record::Cosir(t) => t.turns.len() as u32,
            Record::Neuromas(t) => t.turns.len() as u32,
        }
    }

    /// Tokens the trained agents generated (an evaluation's members).
    pub fn completion_tokens(&self) -> u64 {
        match self {
            Record::Comas(t) => t.turns.iter().map(|x| x.completion_ids.len() as u64).sum(),
            Record::Mappa(t) => t.completion_tokens(),
            Record::Eval(t) => t.completion_tokens(),
            Record::Cosir(t) => t.completion_tokens(),
            Record::Neuromas(t) => t.completion_tokens(),
        }
    }

    /// Every trained turn, for the version check.
    pub fn policy_turns(&self) -> Vec<PolicyTurn> {
        match self {
            Record::Comas(t) => t.policy_turns(),
            Record::Mappa(t) => t.policy_turns(),
            Record::Eval(_) => Vec::new(),
            Record::Cosir(t) => t.policy_turns(),
            Record::Neuromas(t) => t.policy_turns(),
        }
    }

    /// Shifts every policy version (a test fault that makes a worker report stale turns).
    pub fn shift_versions(&mut self, by: u64) {
        match self {
            Record::Comas(t) => t.turns.iter_mut().for_each(|x| x.policy_version += by),
            Record::Mappa(t) => t.actions.iter_mut().for_each(|x| x.sampled.policy_version += by),
            Record::Cosir(t) => t.turns.iter_mut().for_each(|x| x.sampled.policy_version += by),
            Record::Neuromas(t) => t.turns.iter_mut().for_each(|x| x.sampled.policy_version += by),
            Record::Eval(_) => {}
        }
    }
}
