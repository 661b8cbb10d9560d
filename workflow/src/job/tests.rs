//! The job file checked: each method's table read by its method, the checks that hold for all.
/// The shipped cluster job parses, checks, and trains every 7B agent with LoRA: full
/// fine-tuning of 7B does not fit one 80 GB GPU per learner.
#[test]
fn the_cluster_job_is_valid_and_uses_lora() {
    let text = include_str!("../../../deploy/k8s/overlays/cluster/job.toml");
    let job = super::JobSpec::from_toml(text).unwrap().check(2000).unwrap();
    assert_eq!(job.train.len(), 3);
    assert!(job
        .train
        .iter()
        .all(|t| t.lora.as_ref().is_some_and(|l| l.r == 64 && l.target_modules.len() == 7)));
}

use super::*;
use crate::comas::CoMas;
use crate::cosir::{Cosir, COSIR_KL_COEF};
use crate::eval::Evaluation;
use crate::mappa::{Mappa, MAPPA_KL_COEF};
use crate::neuromas::{Neuromas, NEUROMAS_KL_COEF};
use crate::turn::Role;
use std::path::{Path, PathBuf};

/// The error a job file gets, at parse or at check.
fn error_of(text: &str, dataset_len: usize) -> String {
    JobSpec::from_toml(text).and_then(|s| s.check(dataset_len)).unwrap_err().to_string()
}

const JOB: &str = r#"
name = "t"
[data]
train = "data.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[comas]
num_rounds = 2
instances_per_question = 2
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 4
micro_batch_size = 2
lr = 1e-5
[[agents]]
model = "m1"
learner = "http://127.0.0.1:1"
[agents.train]
train_batch_size = 24
"#;

const MAPPA_JOB: &str = r#"
name = "m"
method = "mappa"
[data]
train = "data.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[mappa]
agents = [0, 1, 0]
[mappa.role_sampling.code_executor]
max_new_tokens = 64
[[frozen]]
name = "coach"
model = "coach"
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 4
[[agents]]
model = "m1"
[agents.train]
train_batch_size = 4
"#;

#[test]
fn a_mappa_job_maps_roles_to_agents_and_names_its_coach() {
    let job = JobSpec::from_toml(MAPPA_JOB).unwrap().check(10).unwrap();
    let m = job.method.get::<Mappa>().unwrap();
    assert_eq!((m.agents.clone(), m.coach_agent, job.frozen_agent(0)), (vec![0, 1, 0], 2, 2));
    assert_eq!(m.sampling_for(Role::CodeExecutor).max_new_tokens, 64);
    assert_eq!(job.train[1].kl_coef, MAPPA_KL_COEF);
    // The LR horizon counts every action an agent may take: agent 0 plays two roles of one
    // action each, agent 1 the Executor with up to two; 4 episodes, batches of 4, 3 steps.
    assert_eq!((job.samples(0).most, job.samples(1).most), (8, 8));
    assert_eq!((job.train[0].total_steps, job.train[1].total_steps), (6, 6));
    // Two questions, two instances each; agent 0 acts at least twice per episode, agent 1 once.
    assert_eq!((job.episodes_per_step(), job.samples(0).least, job.samples(1).least), (4, 8, 4));
    let json = job.method.config_json();
    assert!(json.contains("\"code_executor\":{"), "{json}");
    let err = |text: String| error_of(&text, 10);
    assert!(err(MAPPA_JOB.replace("name = \"coach\"", "name = \"judge\""))
        .contains("no [[frozen]] model is named \"coach\""));
    assert!(err(MAPPA_JOB.replace("agents = [0, 1, 0]", "agents = [0, 0, 0]"))
        .contains("agent 1 plays no role"));
    assert!(
        err(MAPPA_JOB.replace("agents = [0, 1, 0]", "agents = [0, 1]")).contains("`mappa.agents`")
    );
    assert!(err(MAPPA_JOB.replace("method = \"mappa\"", ""))
        .contains("`mappa`: is set but method is comas; set method = \"mappa\""));
    let e =
        err(MAPPA_JOB
            .replace("train_batch_size = 4\n[[agents]]", "train_batch_size = 9\n[[agents]]"));
    assert!(e.contains("is 9 but agent 0 speaks only 8 turns per step (4 episodes x 2 roles, one action each at least)"), "{e}");
    // DSBench takes its own defaults: 4 actions per role, 60 s per run.
    let ds_job = MAPPA_JOB
        .replace("[mappa]\n", "[mappa]\npipeline = \"ds_bench\"\n")
        .replace("code_executor", "modeler");
    let ds = JobSpec::from_toml(&ds_job).unwrap().check(10).unwrap();
    let m = ds.method.get::<Mappa>().unwrap();
    assert_eq!(
        (m.max_turns.clone(), m.tool_timeout_secs, m.role_at(2)),
        (vec![4, 4, 4], 60.0, Role::Analyst)
    );
    assert!(err(MAPPA_JOB.replace("[mappa]\n", "[mappa]\npipeline = \"kaggle\"\n"))
        .contains("`mappa.pipeline`"));
    // A coach behind an endpoint: no folder to load; http or https.
    let served = |frozen: &str| MAPPA_JOB.replace("name = \"coach\"\nmodel = \"coach\"\n", frozen);
    let job =
        JobSpec::from_toml(&served("name = \"coach\"\nendpoint = \"http://judge:8000/v1\"\n"))
            .unwrap()
            .check(10)
            .unwrap();
    assert_eq!(
        (
            job.spec.frozen[0].model.as_ref(),
            job.spec.paths().iter().filter(|(k, _)| k.starts_with("frozen")).count()
        ),
        (None, 0)
    );
    assert!(JobSpec::from_toml(&served(
        "name = \"coach\"\nendpoint = \"https://api.example.com/v1\"\n"
    ))
    .unwrap()
    .check(10)
    .is_ok());
    assert!(err(served("name = \"coach\"\nendpoint = \"ftp://judge/v1\"\n"))
        .contains("not an http:// or https:// URL"));
    assert!(err(served("name = \"coach\"\n"))
        .contains("give the model folder the workers load, or an `endpoint`"));
    assert!(err(served("name = \"coach\"\nmodel = \"coach\"\nendpoint = \"http://j/v1\"\n"))
        .contains("not both"));
    assert!(err(served("name = \"coach\"\nmodel = \"coach\"\napi_key_env = \"KEY\"\n"))
        .contains("for a model behind an `endpoint`"));
    // The global scope pools whitening statistics, so every agent must whiten.
    let global = MAPPA_JOB.replace("[mappa]\n", "[mappa]\nnorm_scope = \"global\"\n");
    assert_eq!(
        JobSpec::from_toml(&global)
            .unwrap()
            .check(10)
            .unwrap()
            .method
            .get::<Mappa>()
            .unwrap()
            .norm_scope,
        crate::mappa::NormScope::Global
    );
    let grpo = global.replacen(
        "train_batch_size = 4\n",
        "train_batch_size = 4\nestimator = \"group_norm\"\n",
        2,
    );
    assert!(err(grpo).contains("agents[0].train.estimator = \"group_norm\" does not whiten"));
}

const NEUROMAS_JOB: &str = r#"
name = "n"
method = "neuromas"
[data]
train = "train.jsonl"
[schedule]
questions_per_step = 2
steps = 3
[output]
dir = "out"
[neuromas]
rollouts_per_task = 4
param_sharing = "per_layer"
[neuromas.topology]
layers = [3, 1]
[[agents]]
model = "m"
[agents.train]
train_batch_size = 8
[[agents]]
model = "m"
[agents.train]
train_batch_size = 8
"#;

#[test]
fn a_neuromas_job_lists_one_agent_per_adapter_and_trains_with_group_norm() {
    let job = JobSpec::from_toml(NEUROMAS_JOB).unwrap().check(10).unwrap();
    let n = job.method.get::<Neuromas>().unwrap();
    assert_eq!(
        (n.rollouts_per_task, job.episodes_per_step(), job.method.name()),
        (4, 8, "neuromas")
    );
    // Agent 0 plays the 3 nodes of layer 1 in each of the 8 rollouts, agent 1 the readout.
    assert_eq!((job.samples(0).most, job.samples(1).most, job.samples(1).least), (24, 8, 8));
    let t = &job.train[0];
    assert_eq!(
        (t.estimator, t.kl_coef, t.kl_in_loss, t.kl_estimator),
        (
            crate::train_config::Estimator::GroupNorm,
            NEUROMAS_KL_COEF,
            true,
            crate::train_config::KlEstimator::K3
        )
    );
    let err = |text: String| error_of(&text, 10);
    assert!(err(NEUROMAS_JOB.replace("per_layer", "per_node"))
        .contains("trains one adapter per node: list 4 [[agents]], not 2"));
    assert!(err(NEUROMAS_JOB.replace("layers = [3, 1]", "layers = [3, 2]"))
        .contains("`neuromas.topology.layers`"));
    assert!(err(NEUROMAS_JOB.replace("rollouts_per_task = 4", "rollouts_per_task = 1"))
        .contains("at least 2 rollouts"));
    let guided = NEUROMAS_JOB.replace(
        "[neuromas.topology]",
        "[neuromas.sampling]\nmax_new_tokens = 12\nguided_suffix = 'x'\n[neuromas.topology]",
    );
    assert!(err(guided).contains("`neuromas.sampling`: guided_suffix needs max_new_tokens above"));
    // A guide that does not compile is found at the check, not by a worker's first episode.
    let unclosed = NEUROMAS_JOB.replace(
        "[neuromas.topology]",
        "[neuromas.sampling]\nguided_suffix = '([unclosed'\n[neuromas.topology]",
    );
    let e = err(unclosed);
    assert!(e.contains("guided_suffix `([unclosed` is not a regular expression"), "{e}");
    let big = NEUROMAS_JOB.replace("train_batch_size = 8", "train_batch_size = 24");
    assert!(
        err(big).contains("is 24 but agent 1 speaks only 8 turns per step (8 rollouts x 1 nodes)")
    );
    assert!(err(NEUROMAS_JOB.replace("method = \"neuromas\"\n", ""))
        .contains("`neuromas`: is set but method is comas"));
    // Evaluation plays the graph with the eval instance count and temperature.
    let e = JobSpec::from_toml(
        &NEUROMAS_JOB.replace("[output]", "[eval]\ndata = \"held.jsonl\"\n[output]"),
    )
    .unwrap()
    .check(10)
    .unwrap();
    let c = e.eval_method_at(0.0);
    let c = c.get::<Neuromas>().unwrap();
    assert_eq!((c.rollouts_per_task, c.sampling.temperature), (1, 0.0));
}

const COSIR_JOB: &str = r#"
name = "c"
method = "cosir"
[schedule]
questions_per_step = 4
steps = 3
[output]
dir = "out"
[cosir]
agents = 3
rounds = 2
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 12
"#;

#[test]
fn a_cosir_job_generates_its_tables_and_trains_one_shared_policy() {
    let job = JobSpec::from_toml(COSIR_JOB).unwrap().check(0).unwrap();
    let c = job.method.get::<Cosir>().unwrap();
    assert_eq!((c.agents, c.rounds, job.total_steps, job.episodes_per_step()), (3, 2, 3, 4));
    // One policy plays all three seats, (2 rounds + final) turns each: 9 per game.
    assert_eq!((job.samples(0).least, job.samples(0).most), (36, 36));
    assert_eq!(job.step_questions(2), vec![8, 9, 10, 11]);
    assert_eq!((job.train[0].kl_coef, job.train[0].kl_in_loss), (COSIR_KL_COEF, true));
    assert_eq!(job.method.name(), "cosir");
    let err = |text: String| error_of(&text, 0);
    assert!(err(COSIR_JOB.replace("rounds = 2", "rounds = 2\nseat_policy = \"per_seat\""))
        .contains("list 3 [[agents]] (cosir.agents), not 1"));
    assert!(err(COSIR_JOB.replace("agents = 3", "agents = 9")).contains("`cosir.agents`"));
    assert!(
        err(COSIR_JOB.replace("steps = 3", "epochs = 3")).contains("give `steps`, not `epochs`")
    );
    assert!(err(COSIR_JOB.replace("[output]", "[data]\ntrain = \"x.jsonl\"\n[output]"))
        .contains("is set but cosir generates its tasks; remove [data]"));
    assert!(err(COSIR_JOB.replace("train_batch_size = 12", "train_batch_size = 40"))
        .contains("speaks only 36 turns per step (4 games x 9 turns)"));
    assert!(err(COSIR_JOB.replace("[output]", "[eval]\nevery_steps = 1\n[output]"))
        .contains("`eval.max_questions`"));
    // Held-out tables name no file: resolving paths leaves eval.data empty, and no path is relative.
    let mut spec =
        JobSpec::from_toml(&COSIR_JOB.replace("[output]", "[eval]\nmax_questions = 4\n[output]"))
            .unwrap();
    spec.resolve_paths(Path::new("/base"));
    assert_eq!(
        (spec.relative_paths().len(), spec.eval.as_ref().unwrap().data.as_os_str().is_empty()),
        (0, true)
    );
    spec.check(0).unwrap();
    assert!(err(COSIR_JOB.replace("[cosir]", "[cosir]\nw_shares = 1.0")).contains("`cosir`"));
}

const EVAL_JOB: &str = r#"
name = "e"
method = "eval"
[evaluate]
setup = "debate"
max_new_tokens = 32
[[evaluate.questions]]
index = 3
id = "a"
query = "1 + 1?"
[[evaluate.questions]]
index = 5
id = "b"
query = "2 + 2?"
[[frozen]]
name = "m0"
model = "m"
[[frozen]]
name = "m1"
model = "n"
adapter = "lora"
[output]
dir = "out"
"#;

#[test]
fn an_evaluation_job_is_one_step_of_frozen_models_and_inline_questions() {
    let job = JobSpec::from_toml(EVAL_JOB).unwrap().check(0).unwrap();
    let e = job.method.get::<Evaluation>().unwrap();
    assert_eq!(
        (e.settings.members, e.settings.max_new_tokens, e.settings.temperature),
        (2, 32, crate::eval::EVAL_TEMPERATURE)
    );
    assert_eq!(e.questions.iter().map(|q| q.index).collect::<Vec<_>>(), vec![3, 5]);
    assert_eq!(
        (job.total_steps, job.episodes_per_step(), job.step_questions(0)),
        (1, 2, vec![0, 1])
    );
    assert_eq!((job.method.name(), job.frozen_agent(1)), ("eval", 1));
    assert!(job.train.is_empty());
    // The episode spec carries the settings, not the questions.
    assert!(!job.method.config_json().contains("questions"), "{}", job.method.config_json());
    let err = |text: String| error_of(&text, 0);
    assert!(err(EVAL_JOB.replace("[output]", "[[agents]]\nmodel = \"m\"\n[output]"))
        .contains("trains nothing"));
    assert!(err(EVAL_JOB.replace("[output]", "[schedule]\nsteps = 2\n[output]"))
        .contains("in one step"));
    assert!(err(EVAL_JOB.replace("index = 5", "index = 3")).contains("index 3 is given twice"));
    assert!(err(EVAL_JOB.replace("setup = \"debate\"", "setup = \"chat\""))
        .starts_with("`evaluate.setup`: unknown variant `chat`"));
    assert!(err(EVAL_JOB.replace("[evaluate]", "[evaluate]\nmembers = 1"))
        .contains("number of [[frozen]] models"));
    let no_team: String =
        EVAL_JOB.split("[[frozen]]").next().unwrap().to_string() + "[output]\ndir = \"out\"\n";
    assert!(err(no_team).contains("[[frozen]] tables"));
    // A training job needs its data; the [evaluate] table belongs to evaluation jobs only.
    assert!(err(JOB.replace("[data]\ntrain = \"data.jsonl\"", "")).contains("`data.train`"));
    assert!(err(JOB.replace("[output]", "[evaluate]\nsetup = \"vanilla\"\n[output]"))
        .contains("`evaluate`: is set but method is comas; set method = \"eval\""));
    assert!(err(EVAL_JOB.replace("[output]", "[eval]\ndata = \"x\"\n[output]"))
        .contains("trains nothing to evaluate"));
}

#[test]
fn resolves_counts_and_per_agent_settings() {
    let job = JobSpec::from_toml(JOB).unwrap().check(10).unwrap();
    assert_eq!(job.method.get::<CoMas>().unwrap().num_agents, 2);
    assert_eq!(job.total_steps, 3);
    assert_eq!(job.episodes_per_step(), 4);
    // l = 2, R = 2, n = 1: 12 turns per instance, 48 per step, 24 per agent.
    assert_eq!((job.samples(0).least, job.samples(1).most), (24, 24));
    // LR horizon: ceil(24 / 4) = 6 optimizer steps per step for agent 0, 1 for agent 1.
    assert_eq!(job.train[0].total_steps, 18);
    assert_eq!(job.train[1].total_steps, 3);
    assert_eq!(job.train[0].lr, 1e-5);
    assert_eq!(job.train[0].temperature, 1.0);
    assert_ne!(job.train[0].seed, job.train[1].seed);
}

#[test]
fn errors_name_the_field() {
    let err = |text: &str, n: usize| {
        JobSpec::from_toml(text).and_then(|s| s.check(n)).unwrap_err().to_string()
    };
    let e = err(&JOB.replace("steps = 3", "steps = 3\nwarp = 9"), 10);
    assert!(e.contains("warp"), "{e}");
    let e = err(&JOB.replace("lr = 1e-5", "lr = 1e-5\nuse_ttrl = true"), 10);
    assert!(e.contains("agents[0].train") && e.contains("use_ttrl"), "{e}");
    let e = err(JOB, 1);
    assert!(e.contains("questions_per_step") && e.contains("only 1"), "{e}");
    let e = err(&JOB.replace("train_batch_size = 24", "train_batch_size = 25"), 10);
    assert!(e.contains("agents[1].train.train_batch_size") && e.contains("24 turns"), "{e}");
    let e = err(&JOB.replace("num_rounds = 2", "num_rounds = 2\nnum_agents = 3"), 10);
    assert!(e.contains("comas.num_agents"), "{e}");
    let e = err(&JOB.replace("steps = 3", "steps = 3\nepochs = 1"), 10);
    assert!(e.contains("not both"), "{e}");
    let e = err(&JOB.replace("steps = 3", "steps = 3\nsync = \"async\"\nmax_policy_lag = 0"), 10);
    assert!(e.contains("schedule.max_policy_lag") && e.contains("at least 1"), "{e}");
    let e = err(&JOB.replace("steps = 3", "steps = 3\nmax_policy_lag = 2"), 10);
    assert!(e.contains("schedule.max_policy_lag") && e.contains("synchronous"), "{e}");
    let e = err(&JOB.replace("steps = 3", "steps = 3\nsync = \"later\""), 10);
    assert!(e.contains("sync"), "{e}");
    let e = err(&JOB.replace("model = \"m1\"", "model = \"m1\"\nid = 0"), 10);
    assert!(e.contains("agents[1].id"), "{e}");
}

/// A wrong value in a method's table or an agent's `[agents.train]` names its whole dotted
/// key, not only the table.
#[test]
fn a_wrong_value_in_a_settings_table_names_its_key() {
    let grpo = |table: &str| {
        format!(
            "name = \"g\"\nmethod = \"grpo\"\n[data]\ntrain = \"d.jsonl\"\n[schedule]\nquestions_per_step = 2\nsteps = 1\n[output]\ndir = \"out\"\n{table}\n[[agents]]\nmodel = \"m\"\n[agents.train]\ntrain_batch_size = 4\n"
        )
    };
    let e = error_of(&grpo("[grpo]\ngroup_size = -3"), 10);
    assert_eq!(e, "`grpo.group_size`: invalid value: integer `-3`, expected u32");
    let e = error_of(&grpo("[grpo.sampling]\ntop_k = -1"), 10);
    assert_eq!(e, "`grpo.sampling.top_k`: invalid value: integer `-1`, expected u32");
    let e = error_of(&grpo("[grpo.sampling]\ntop_kk = 1"), 10);
    assert!(e.starts_with("`grpo.sampling`: unknown field `top_kk`"), "{e}");
    let e = error_of(&JOB.replace("num_rounds = 2", "num_rounds = \"two\""), 10);
    assert!(e.starts_with("`comas.num_rounds`: invalid type: string \"two\""), "{e}");
    let e = error_of(&JOB.replace("lr = 1e-5", "lr = \"fast\""), 10);
    assert_eq!(e, "`agents[0].train.lr`: invalid type: string \"fast\", expected f64");
    let e = error_of(&JOB.replace("lr = 1e-5", "adam_betas = [0.9]"), 10);
    assert_eq!(e, "`agents[0].train.adam_betas`: invalid length 1, expected an array of length 2");
    let e = error_of(
        &JOB.replace(
            "lr = 1e-5",
            "[agents.train.lora]\nr = 8\nalpha = \"x\"\ntarget_modules = [\"q_proj\"]",
        ),
        10,
    );
    assert!(e.starts_with("`agents[0].train.lora.alpha`: invalid type"), "{e}");
}

/// `lora.alpha` NaN would reach the workers as JSON null and stall the job; it is refused at
/// the job check, with the agent and the key.
#[test]
fn a_lora_alpha_that_is_not_a_positive_number_is_refused_at_the_check() {
    for alpha in ["nan", "inf", "-16.0", "0.0"] {
        let lora =
            format!("[agents.train.lora]\nr = 8\nalpha = {alpha}\ntarget_modules = [\"q_proj\"]");
        let e = error_of(&JOB.replace("lr = 1e-5", &lora), 10);
        assert!(
            e.starts_with("`agents[0].train`: `lora.alpha` must be finite and > 0"),
            "{alpha}: {e}"
        );
    }
}

#[test]
fn epochs_drop_the_last_partial_batch_and_reshuffle() {
    let job =
        JobSpec::from_toml(&JOB.replace("steps = 3", "epochs = 2")).unwrap().check(5).unwrap();
    assert_eq!((job.steps_per_epoch, job.total_steps), (2, 4));
    let e0: Vec<usize> = (0..2).flat_map(|s| job.step_questions(s)).collect();
    let e1: Vec<usize> = (2..4).flat_map(|s| job.step_questions(s)).collect();
    for e in [&e0, &e1] {
        let mut sorted = e.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 4, "no question twice within an epoch: {e:?}");
    }
    assert_ne!(e0, e1, "each epoch has its own order");
    assert_eq!(step_questions(5, 2, 7, false, 3), vec![2, 3]);
    assert_eq!(job.step_questions(1), job.step_questions(1));
}

#[test]
fn evaluation_is_due_at_start_every_k_steps_and_at_the_end() {
    let text = JOB.replace(
        "[[agents]]\nmodel = \"m0\"",
        "[eval]\ndata = \"test.jsonl\"\nevery_steps = 2\n[[agents]]\nmodel = \"m0\"",
    );
    let job =
        JobSpec::from_toml(&text.replace("steps = 3", "steps = 5")).unwrap().check(10).unwrap();
    let due: Vec<u64> = (0..=5).filter(|&k| job.eval_due(k)).collect();
    assert_eq!(due, vec![0, 2, 4, 5]);
    let c = job.eval_method_at(0.7);
    let c = c.get::<CoMas>().unwrap();
    assert_eq!((c.instances_per_question, c.sampling.scorer.temperature), (1, 0.7));
    assert_eq!(
        c.sampling.solver.max_new_tokens,
        job.method.get::<CoMas>().unwrap().sampling.solver.max_new_tokens
    );
    let e = JobSpec::from_toml(&text.replace("every_steps = 2", "every_steps = 0"))
        .unwrap()
        .check(10)
        .unwrap_err()
        .to_string();
    assert!(e.contains("eval"), "{e}");
    let mut spec = JobSpec::from_toml(&text).unwrap();
    assert_eq!(spec.relative_paths().len(), 5);
    spec.resolve_paths(Path::new("/j"));
    assert_eq!(spec.eval.unwrap().data, PathBuf::from("/j/test.jsonl"));
    assert!(!JobSpec::from_toml(JOB).unwrap().check(10).unwrap().eval_due(0));
    let greedy =
        JobSpec::from_toml(&text.replace("every_steps = 2", "every_steps = 2\ngreedy = true"))
            .unwrap()
            .check(10)
            .unwrap();
    assert!(greedy.spec.eval.as_ref().unwrap().greedy);
    assert_eq!(greedy.eval_method_at(0.0).get::<CoMas>().unwrap().sampling.solver.temperature, 0.0);
}

#[test]
fn the_reward_source_is_a_comas_option() {
    let job = JobSpec::from_toml(JOB).unwrap().check(10).unwrap();
    assert_eq!(job.method.get::<CoMas>().unwrap().reward, crate::comas::RewardSource::Comas);
    let job =
        JobSpec::from_toml(&JOB.replace("num_rounds = 2", "num_rounds = 2\nreward = \"verifier\""))
            .unwrap()
            .check(10)
            .unwrap();
    assert_eq!(job.method.get::<CoMas>().unwrap().reward, crate::comas::RewardSource::Verifier);
    let e =
        JobSpec::from_toml(&JOB.replace("num_rounds = 2", "num_rounds = 2\nreward = \"oracle\""))
            .and_then(|s| s.check(10))
            .unwrap_err()
            .to_string();
    assert!(e.contains("oracle") && e.contains("verifier"), "{e}");
}

#[test]
fn relative_paths_resolve_against_the_job_folder() {
    let mut spec = JobSpec::from_toml(JOB).unwrap();
    assert_eq!(spec.relative_paths().len(), 4);
    spec.resolve_paths(Path::new("/jobs/x"));
    assert!(spec.relative_paths().is_empty());
    assert_eq!(spec.agents[1].model, PathBuf::from("/jobs/x/m1"));
}

#[test]
fn a_job_file_names_one_method_and_writes_back_the_same() {
    // Unknown methods and keys name themselves; the method's table is read by its method only.
    assert!(error_of(&JOB.replace("name = \"t\"", "name = \"t\"\nmethod = \"ppo\""), 10)
        .contains("unknown method \"ppo\": expected one of \"comas\""));
    let e = error_of(&JOB.replace("[output]", "[grpo_settings]\nx = 1\n[output]"), 10);
    assert!(e.contains("unknown field `grpo_settings`") && e.contains("`mappa`"), "{e}");
    let e = error_of(&JOB.replace("name = \"t\"", "name = \"t\"\nx = 1"), 10);
    assert!(e.contains("line 3") && e.contains("unknown field `x`"), "{e}");
    let not_a_table = JOB
        .replace("[comas]\nnum_rounds = 2\ninstances_per_question = 2\n", "")
        .replace("name = \"t\"", "name = \"t\"\ncomas = 3");
    assert!(error_of(&not_a_table, 10).contains("`comas`: must be a table"));
    // A frozen model in a job whose method calls none would be loaded for nothing.
    let frozen = JOB.replace("[output]", "[[frozen]]\nname = \"judge\"\nmodel = \"j\"\n[output]");
    assert!(error_of(&frozen, 10).contains("`frozen`: method comas calls no [[frozen]] models"));
    // The spec writes back as a job file that reads as the same spec.
    for text in [JOB, MAPPA_JOB, NEUROMAS_JOB, COSIR_JOB, EVAL_JOB] {
        let spec = JobSpec::from_toml(text).unwrap();
        let again = JobSpec::from_toml(&spec.to_toml().unwrap()).unwrap();
        assert_eq!(again, spec, "{}", spec.to_toml().unwrap());
    }
    let spec = JobSpec::from_toml(&JOB.replace("name = \"t\"", "name = \"t\"\nmethod = \"comas\""))
        .unwrap();
    assert_eq!((spec.method.as_str(), spec.table()), ("comas", "comas"));
    assert_eq!(JobSpec::from_toml(EVAL_JOB).unwrap().table(), "evaluate");
    let _ = (Role::Solver, DEFAULT_METHOD);
}

#[test]
fn a_tracking_table_is_read_written_back_and_checked() {
    let base = include_str!("../../../deploy/k8s/overlays/cluster/job.toml");
    let with = |table: &str| format!("{base}\n[tracking]\n{table}");
    let spec =
        JobSpec::from_toml(&with("mlflow = \"http://mlflow:5000\"\nexperiment = \"e\"\n")).unwrap();
    assert_eq!(spec.tracking.mlflow.as_deref(), Some("http://mlflow:5000"));
    assert_eq!(spec.tracking.experiment.as_deref(), Some("e"));
    spec.check(2000).unwrap();
    // Written back, it reads the same; without it the file has no [tracking] table.
    assert_eq!(JobSpec::from_toml(&spec.to_toml().unwrap()).unwrap(), spec);
    let plain = JobSpec::from_toml(base).unwrap();
    assert!(!plain.to_toml().unwrap().contains("[tracking]"));
    for (table, key, says) in [
        ("mlflow = \"mlflow:5000\"\n", "tracking.mlflow", "http://HOST:PORT"),
        ("mlflow = \"http://\"\n", "tracking.mlflow", "http://HOST:PORT"),
        (
            "mlflow = \"http://m:5000\"\nrun_name = \" \"\n",
            "tracking.run_name",
            "must not be empty",
        ),
        ("experiment = \"e\"\n", "tracking", "no server"),
    ] {
        let err = JobSpec::from_toml(&with(table)).unwrap().check(2000).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(says), "{table}: {err}");
    }
    let err = JobSpec::from_toml(&with("mlflow_uri = \"x\"\n")).unwrap_err().to_string();
    assert!(err.contains("mlflow_uri"), "{err}");
}
