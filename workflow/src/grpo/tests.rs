//! GRPO through the seam, as the machinery drives it: episode specs planned, read back on a
//! worker, played, the record checked, the experiences and figures made; and its job file.
use super::*;
use crate::job::JobSpec;
use crate::method::StepContext;
use crate::program::{MethodConfig, Program, ProgramStart, Reply, Request};
use crate::seed::PlanSeed;
use crate::task::{TaskKind, TaskRecord};
use crate::tool::ToolResult;
use crate::turn::{FinishReason, TurnOutput, TurnRequest, Unmetered};
use serde_json::json;

fn task(id: &str, prompt: &str, answer: &str, task: TaskKind) -> TaskRecord {
    TaskRecord { prompt: prompt.into(), answer: answer.into(), task, id: id.into(), source: None, files: Default::default() }
}

fn reply(t: &TurnRequest, text: &str, tokens: usize, finish: FinishReason) -> Reply {
    Reply::Turn(TurnOutput {
        turn_index: t.turn_index,
        text: text.into(),
        raw_text: text.into(),
        prompt_ids: vec![1, 2, 3],
        completion_ids: vec![7; tokens],
        logprobs: vec![-0.25; tokens],
        finish_reason: finish,
        policy_version: 4,
        constrained: Vec::new(),
    })
}

/// Plans the episodes of `data` and plays each on a "worker" whose agents answer by `text`.
fn play(method: &MethodConfig, data: &[TaskRecord], text: impl Fn(u32, u32) -> (String, usize)) -> Vec<(String, crate::program::Record)> {
    let chosen: Vec<usize> = (0..data.len()).collect();
    let planned = method.episodes(&chosen, data, PlanSeed { global: 3, step: 1, shard: 0 }).unwrap();
    planned
        .into_iter()
        .map(|p| {
            let start = ProgramStart::parse("grpo", &method.config_json(), &p.task_json, &p.plan_json, p.instance, p.seed).unwrap();
            let mut program = Program::start(&start, &Unmetered).unwrap();
            while !program.is_done() {
                let replies = program
                    .pending()
                    .iter()
                    .map(|r| match r {
                        Request::Turn(t) => {
                            let (s, n) = text(p.instance, t.agent);
                            reply(t, &s, n, if n >= 8 { FinishReason::Length } else { FinishReason::Stop })
                        }
                        Request::Tool(_) => panic!("no tool runs for math"),
                    })
                    .collect();
                program.submit(replies, &Unmetered).unwrap();
            }
            let json = program.finish().unwrap().to_json().unwrap();
            (format!("e{}", p.instance), method.parse_record(&json).unwrap())
        })
        .collect()
}

#[test]
fn every_agent_answers_g_times_and_each_answer_earns_the_graders_reward() {
    let cfg = GrpoConfig {
        agents: 2,
        group_size: 2,
        prompt_suffix: Some(" Box it.".into()),
        reward: RewardSpec { format: 0.5, ..RewardSpec::default() },
        ..GrpoConfig::default()
    };
    let method = MethodConfig::Grpo(cfg);
    let data = [task("q1", "1 + 1?", "2", TaskKind::Math), task("q2", "2 + 3?", "5", TaskKind::Math)];
    // Agent 0 always answers 2 in a box; agent 1 answers "2" unboxed in the first copy of each
    // question and runs out of tokens in the second.
    let records = play(&method, &data, |instance, agent| match (agent, instance % 2) {
        (0, _) => ("so \\boxed{2}".into(), 4),
        (_, 0) => ("it is 2".into(), 4),
        _ => ("hmm".into(), 8),
    });
    assert_eq!(records.len(), 4, "2 questions x G = 2");
    let step = StepContext { agents: 2, data: &[], with_temperatures: true, step: Some(0) };
    let out = method.experience(records, &step, Some(&[4, 4])).unwrap();
    let rewards: Vec<Vec<f64>> = out.per_agent.iter().map(|e| e.iter().map(|x| x.reward).collect()).collect();
    // q1 (answer 2): agent 0 right and boxed 1.5; agent 1 right unboxed 1.0, then nothing 0.0.
    // q2 (answer 5): agent 0 wrong but boxed 0.5; agent 1 wrong 0.0 twice.
    assert_eq!(rewards, vec![vec![1.5, 1.5, 0.5, 0.5], vec![1.0, 0.0, 0.0, 0.0]]);
    let groups: Vec<&str> = out.per_agent[1].iter().map(|e| e.group.as_str()).collect();
    assert_eq!(groups, ["q1/a1", "q1/a1", "q2/a1", "q2/a1"]);
    let e = &out.per_agent[0][0];
    assert_eq!((e.prompt_ids.clone(), e.completion_ids.len(), e.policy_version, e.temperature), (vec![1, 2, 3], 4, 4, Some(1.0)));
    let m = &out.metrics;
    assert_eq!(m["method"], "grpo");
    assert_eq!((m["episodes"].clone(), m["answers"].clone(), m["groups"].clone(), m["equal_groups"].clone()), (json!(4), json!(8), json!(4), json!(3)));
    assert_eq!(m["accuracy"], json!({"mean": 0.375, "count": 8}));
    assert_eq!(m["readable_rate"], json!({"mean": 0.5, "count": 8}));
    assert_eq!(m["pass_at_group"], json!({"mean": 0.5, "count": 4}));
    assert_eq!(m["truncation_rate"], json!({"mean": 0.25, "count": 8}));
    assert_eq!(m["accuracy_by_agent"]["1"], json!({"mean": 0.25, "count": 4}));
    assert_eq!(m["agents"][0], json!({"agent": 0, "samples": 4, "reward_mean": 1.0}));
    // A stale turn is refused by turn.
    let again = play(&method, &data[..1], |_, _| ("\\boxed{2}".into(), 2));
    let err = method.experience(again, &step, Some(&[4, 5])).unwrap_err().to_string();
    assert!(err.contains("turn 1 (solver of agent 1) was sampled with policy version 4, but this step uses version 5"), "{err}");
    // The figures read back the way `comas watch` and the final table show them.
    let summary = crate::registry::summary(m).unwrap();
    assert_eq!((summary.accuracy, summary.rows[0].name.as_str()), (Some(0.375), "held-out accuracy"));
    assert_eq!(crate::registry::watch(m), ["right 38%", "readable 50%", "pass@group 50%", "equal groups 3/4", "length 5"]);
}

#[test]
fn the_worker_sees_the_question_as_the_user_message() {
    let cfg = GrpoConfig { agents: 2, system_prompt: Some("Be brief.".into()), prompt_suffix: Some(" Box it.".into()), ..GrpoConfig::default() };
    let e = Episode::new(&cfg, &task("q", "1 + 1?", "2", TaskKind::Math), 0, 9).unwrap();
    let turns: Vec<&TurnRequest> = e.pending().iter().map(|r| if let Request::Turn(t) = r { t } else { panic!() }).collect();
    assert_eq!(turns.iter().map(|t| (t.turn_index, t.agent)).collect::<Vec<_>>(), [(0, 0), (1, 1)]);
    assert_eq!(turns[0].messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect::<Vec<_>>(), [("system", "Be brief."), ("user", "1 + 1? Box it.")]);
    assert_ne!(turns[0].seed, turns[1].seed, "each agent samples on its own");
    assert_eq!(turns[0].sampling.max_new_tokens, 256);
    let data_science = Episode::new(&cfg, &task("d", "fit", "x", TaskKind::DataScience), 0, 9).unwrap_err().to_string();
    assert!(data_science.contains("no grader for data_science tasks"), "{data_science}");
}

#[test]
fn code_answers_are_tested_in_the_sandbox_with_the_tasks_tests() {
    let cfg = GrpoConfig { agents: 2, ..GrpoConfig::default() };
    let t = task("c1", "Write f returning 1.", "assert f() == 1", TaskKind::Coding);
    let mut e = Episode::new(&cfg, &t, 0, 1).unwrap();
    let turns: Vec<TurnRequest> = e.pending().iter().map(|r| if let Request::Turn(t) = r { t.clone() } else { panic!() }).collect();
    e.submit(vec![reply(&turns[1], "no code", 2, FinishReason::Stop), reply(&turns[0], "```python\ndef f():\n    return 1\n```", 5, FinishReason::Stop)]).unwrap();
    // One run, of the answer with a block: the prelude, the block, then the tests.
    let [Request::Tool(run)] = e.pending() else { panic!("{:?}", e.pending()) };
    assert_eq!(run.code, "from typing import *\n\ndef f():\n    return 1\n\nassert f() == 1");
    assert_eq!((run.call_index, run.timeout_secs), (0, crate::code::TRAINING_TIMEOUT_SECS));
    let ran = ToolResult { call_index: 0, failure: None, detail: String::new(), stdout: String::new(), stderr: String::new(), files: Vec::new() };
    e.submit(vec![Reply::Tool(ran)]).unwrap();
    let r = e.into_record().unwrap();
    assert_eq!((r.grader, r.answers[0].passed, r.answers[1].passed), (Grader::Code, Some(true), None));
    let rewards: Vec<f64> = r.answers.iter().map(|a| reward::grade(r.grader, &cfg.reward, 256, a, &r.task.answer).reward).collect();
    assert_eq!(rewards, [1.0, 0.0]);
    // A benchmark's ground truth in JSON is turned into its tests.
    let mbpp = task("c2", "Write g.", "[\"assert g(1) == 2\", \"assert g(2) == 3\"]", TaskKind::Coding);
    let mut e = Episode::new(&cfg, &mbpp, 0, 1).unwrap();
    let turns: Vec<TurnRequest> = e.pending().iter().map(|r| if let Request::Turn(t) = r { t.clone() } else { panic!() }).collect();
    e.submit(turns.iter().map(|t| reply(t, "```python\ng = lambda x: x + 1\n```", 3, FinishReason::Stop)).collect()).unwrap();
    assert!(matches!(e.pending(), [Request::Tool(a), Request::Tool(_)] if a.code.ends_with("assert g(1) == 2\nassert g(2) == 3")));
}

const JOB: &str = r#"
name = "g"
method = "grpo"
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 2
steps = 5
[output]
dir = "out"
[grpo]
group_size = 4
[grpo.sampling]
temperature = 0.7
max_new_tokens = 64
[[agents]]
model = "m"
[agents.train]
train_batch_size = 8
"#;

#[test]
fn a_grpo_job_trains_each_agent_on_its_groups() {
    let job = JobSpec::from_toml(JOB).unwrap().check(10).unwrap();
    let c = job.method.get::<Grpo>().unwrap();
    assert_eq!((c.agents, c.group_size, job.episodes_per_step(), job.samples(0).least), (1, 4, 8, 8));
    let t = &job.train[0];
    assert_eq!((t.estimator, t.kl_coef, t.temperature, t.total_steps), (crate::train_config::Estimator::GroupNorm, 0.0, 0.7, 5));
    // The agent's own settings win over the method's.
    let own = JobSpec::from_toml(&JOB.replace("train_batch_size = 8", "train_batch_size = 8\nestimator = \"reinforce\"\nkl_coef = 0.01")).unwrap().check(10).unwrap();
    assert_eq!((own.train[0].estimator, own.train[0].kl_coef), (crate::train_config::Estimator::Reinforce, 0.01));
    // Held out: one answer per question at the evaluation's temperature.
    let eval = job.eval_method_at(0.0);
    let e = eval.get::<Grpo>().unwrap();
    assert_eq!((e.group_size, e.sampling.temperature, e.sampling.max_new_tokens), (1, 0.0, 64));
    let err = |text: String| JobSpec::from_toml(&text).and_then(|s| s.check(10)).unwrap_err().to_string();
    assert!(err(JOB.replace("train_batch_size = 8", "train_batch_size = 9")).contains("agent 0 speaks only 8 turns per step (8 episodes x 1 answer)"));
    assert!(err(JOB.replace("group_size = 4", "group_size = 4\nagents = 2")).contains("`grpo.agents`: is set by the job"));
    assert!(err(JOB.replace("group_size = 4", "group_size = 0")).contains("`grpo.group_size`"));
    assert!(err(JOB.replace("group_size = 4", "grader = \"regex\"")).contains("`grpo.grader`: unknown variant `regex`"));
    assert!(err(JOB.replace("group_size = 4", "[grpo.reward]\noverlong_buffer = 100")).contains("`grpo.reward.overlong_buffer`: is 100 but sampling.max_new_tokens is 64"));
    assert!(err(JOB.replace("method = \"grpo\"\n", "")).contains("`grpo`: is set but method is comas; set method = \"grpo\""));
}

/// The example job shipped in `examples/grpo/` is valid and trains what its comments say.
#[test]
fn the_example_job_is_valid() {
    let job = JobSpec::from_toml(include_str!("../../../examples/grpo/job.toml")).unwrap().check(256).unwrap();
    let c = job.method.get::<Grpo>().unwrap();
    assert_eq!((c.group_size, job.episodes_per_step(), job.total_steps, c.sampling.temperature), (8, 32, 16, 0.7));
    let t = &job.train[0];
    assert_eq!((t.estimator, t.lr, t.lora.as_ref().map(|l| l.r)), (crate::train_config::Estimator::GroupNorm, 1e-3, Some(16)));
}

/// A record whose answer's log-probs do not match its tokens is refused, the answer named and
/// the fault typed; a record of another job's grader is a shape fault.
#[test]
fn a_record_with_a_broken_answer_is_refused_naming_it() {
    use crate::method::RecordFault;
    use crate::turn::TurnFault;
    let cfg = GrpoConfig { agents: 2, group_size: 1, ..GrpoConfig::default() };
    let method = MethodConfig::Grpo(cfg.clone());
    let data = [task("q1", "1 + 1?", "2", TaskKind::Math)];
    let records = play(&method, &data, |_, _| ("\\boxed{2}".into(), 3));
    let crate::program::Record::Grpo(record) = &records[0].1 else { panic!("a grpo record") };
    let mut broken = record.clone();
    broken.answers[1].sampled.logprobs.pop();
    let json = serde_json::to_string(&broken).unwrap();
    let fault = method.parse_record(&json).unwrap_err();
    assert_eq!(fault, RecordFault::Turn { at: "answer 1".into(), fault: TurnFault::LogprobCount { logprobs: 2, tokens: 3 } });
    assert_eq!(fault.to_string(), "answer 1: 2 logprobs for 3 completion tokens");
    let mut other = record.clone();
    other.grader = Grader::Numeric;
    let fault = method.parse_record(&serde_json::to_string(&other).unwrap()).unwrap_err();
    assert!(matches!(&fault, RecordFault::Shape(m) if m.contains("graded by Numeric")), "{fault}");
    assert!(matches!(method.parse_record("{").unwrap_err(), RecordFault::Json(_)));
}
