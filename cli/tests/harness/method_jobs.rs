//! The MAPPA and NeuroMAS jobs of their end-to-end tests (run on comas's own engine and on
//! vLLM), with the tiny models they run on.
use super::*;
use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use std::path::Path;

pub const MAPPA_STEPS: u64 = 2;
/// The Executor's guided tail: a code block that forks and spins.
pub const FORK_AND_SPIN: &str = r"```python\nimport os\nos\.fork\(\)\nwhile 1:0\n```";

/// The MAPPA e2e job: agent 0 plays Problem Solver and Verifier, agent 1 the Code Executor, and a
/// third tiny model coaches. The Executor's replies end with a fixed code block that forks and
/// spins (a guided tail), so every action calls the tool and every run must be cut off.
pub fn write_mappa_job(dir: &Path, learner_ports: &[u16]) {
    write_mappa_job_on(dir, learner_ports, |seed| TinySpec {
        seed,
        ..TinySpec::tiny(Architecture::Qwen2)
    })
}

/// The MAPPA job with its three models made by `spec` from their seeds.
pub fn write_mappa_job_on(dir: &Path, learner_ports: &[u16], spec: impl Fn(i64) -> TinySpec) {
    for (name, seed) in [("model-0", 3), ("model-1", 4), ("coach", 9)] {
        write_model(&dir.join(name), &spec(seed)).unwrap();
    }
    let mut data = String::new();
    for i in 0..12 {
        data.push_str(&format!("{{\"prompt\":\"What is {i} + 2?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", i + 2));
    }
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 4\nmicro_batch_size = 4\nmask_truncated = false\n", learner_ports[k])
    };
    let job = format!(
        "name = \"mappa-e2e\"\nseed = 5\nmethod = \"mappa\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = {QUESTIONS_PER_STEP}\nsteps = {MAPPA_STEPS}\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n\
         [mappa]\nagents = [0, 1, 0]\ninstances_per_question = {INSTANCES}\ntool_timeout_secs = 1.0\n\
         [mappa.sampling]\nmax_new_tokens = 10\nmin_new_tokens = 10\n\
         [mappa.role_sampling.code_executor]\nmax_new_tokens = 60\nmin_new_tokens = 0\nguided_suffix = '{FORK_AND_SPIN}'\n\
         [mappa.coach_sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = 'PROCESS_SCORE:[0-9]|none'\n\
         [[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n{}{}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

/// What every step of the MAPPA job must show, on any engine: its episodes; one Solver, two
/// Executor actions (each calling the tool, each run cut off at its timeout) and one Verifier
/// action each; every action either a sample or dropped; each learner trained on exactly its
/// agent's scored actions; versions advanced by the step.
pub fn assert_mappa_step_counts(m: &serde_json::Value) {
    let step = m["step"].as_u64().unwrap();
    assert_eq!((m["method"].as_str(), m["episodes"].as_u64()), (Some("mappa"), Some(EPISODES)));
    // Every episode: one Solver action, two Executor actions (each calls the tool), one Verifier action.
    for (role, n) in [("problem_solver", 1.0), ("code_executor", 2.0), ("verifier", 1.0)] {
        assert_eq!(m["actions"][role]["mean"], n, "step {step} {role}");
    }
    assert_eq!(m["tool_calls"], EPISODES * 2);
    assert_eq!(
        m["sandbox_failures"],
        serde_json::json!({"timeout": EPISODES * 2}),
        "every forking, spinning run is cut off at its timeout"
    );
    assert_eq!(m["tool_success_rate"]["mean"], 0.0);
    assert_eq!(
        m["samples"].as_u64().unwrap() + m["samples_dropped"].as_u64().unwrap(),
        EPISODES * 4
    );
    for k in 0..2 {
        let a = &m["agents"][k];
        // A learner trains on exactly its agent's scored actions.
        assert_eq!(a["train"]["samples"], a["samples"], "step {step} agent {k}");
        assert_eq!(
            a["samples"].as_u64().unwrap() + a["samples_dropped"].as_u64().unwrap(),
            EPISODES * 2,
            "step {step} agent {k}"
        );
        assert_eq!(a["version"], step + 1);
    }
}

/// Sandbox programs (`python3 main.py`) still running anywhere on this machine.
pub fn running_sandbox_programs() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.split(|&b| b == 0).any(|a| a == b"main.py"))
        .count()
}

pub const NEUROMAS_STEPS: u64 = 2;

/// A [2, 1] NeuroMAS graph, one LoRA adapter per node on one tiny base (three agents, three
/// learners): 2 tasks x 2 rollouts per step, each node's reply ending in a guided `\boxed{D}`.
pub fn write_neuromas_job(dir: &Path, learner_ports: &[u16]) {
    write_neuromas_job_on(
        dir,
        learner_ports,
        TinySpec { seed: 3, ..TinySpec::tiny(Architecture::Qwen2) },
    )
}

/// `train.jsonl` of four sums whose answers are 2 and 3 (a guided box of those digits is right
/// about half the time).
pub fn write_four_sums(dir: &Path) {
    let data: String = [(0, 2), (1, 2), (2, 0), (2, 1)]
        .iter()
        .enumerate()
        .map(|(i, (a, b))| format!("{{\"prompt\":\"What is {a} + {b}?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", a + b))
        .collect();
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
}

/// The NeuroMAS job on a base model of `spec`.
pub fn write_neuromas_job_on(dir: &Path, learner_ports: &[u16], spec: TinySpec) {
    write_model(&dir.join("model"), &spec).unwrap();
    // Answers 2 and 3, and the guided box allows only those digits: about half the readouts
    // are right, so rewards and advantages vary.
    write_four_sums(dir);
    let agent = |k: usize| {
        format!(
            "[[agents]]\nmodel = \"model\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-3\ntrain_batch_size = 4\nmicro_batch_size = 4\nmask_truncated = false\n\
             [agents.train.lora]\nr = 2\nalpha = 4.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
            learner_ports[k]
        )
    };
    let job = format!(
        "name = \"neuromas-e2e\"\nseed = 5\nmethod = \"neuromas\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = 2\nsteps = {NEUROMAS_STEPS}\nlearner_timeout_secs = 120\n\
         [output]\ndir = \"out\"\nsave_episodes = true\n[neuromas]\nrollouts_per_task = 2\nmax_msg_tokens = 4\n[neuromas.topology]\nlayers = [2, 1]\n\
         [neuromas.sampling]\ntemperature = 1.0\ntop_p = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = '''\\\\boxed\\{{[23]\\}}'''\n{}{}{}",
        agent(0),
        agent(1),
        agent(2)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}
