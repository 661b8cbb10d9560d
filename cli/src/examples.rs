//! The built-in examples of `comas local`: `smollm2` (the default: two LoRA agents on the real
//! SmolLM2-135M-Instruct) and `tiny` (two tiny random models, for smoke runs), each with a
//! generated arithmetic data set, plus the before/after table printed when a run ends.
use anyhow::{bail, Context, Result};
use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use comas_workflow::method::{Row, Unit};
use comas_workflow::step_log::{EvalLog, Record as LogRecord};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Example {
    /// Two LoRA agents on SmolLM2-135M-Instruct (from `scripts/fetch-smollm2.sh`).
    Smollm2,
    /// Two tiny random models: the plumbing only, in about a minute.
    Tiny,
}

impl Example {
    /// Rollout workers and libtorch threads per worker that suit the example on 2 cores.
    pub fn workers(self) -> (usize, i32) {
        match self {
            // One worker batching every episode beats two half-size ones.
            Example::Smollm2 => (1, 2),
            Example::Tiny => (2, 1),
        }
    }

    fn folder(self) -> &'static str {
        match self {
            Example::Smollm2 => "example-smollm2",
            Example::Tiny => "example",
        }
    }
}

pub const TINY_JOB: &str = r#"# Built-in example of `comas local`: two agents with tiny random models discuss generated
# arithmetic questions for five CoMAS steps.
name = "local-example"
seed = 42

[data]
train = "train.jsonl"

[schedule]
questions_per_step = 4
steps = 5

[output]
dir = "out"

[comas]
num_rounds = 2
evals_per_solution = 1
num_references = 2
instances_per_question = 2

[comas.sampling.solver]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 32
min_new_tokens = 1

[comas.sampling.evaluator]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 32
min_new_tokens = 1

[comas.sampling.scorer]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 16
min_new_tokens = 1

# Held-out evaluation: the same game on 4 other questions, before training, every 2 steps and
# after the last one, sampled at temperature 0.7; nothing is trained on it.
[eval]
data = "test.jsonl"
every_steps = 2
max_questions = 4

[[agents]]
model = "model-a"
[agents.train]
lr = 1e-4
train_batch_size = 24
micro_batch_size = 12

[[agents]]
model = "model-b"
[agents.train]
lr = 1e-4
train_batch_size = 24
micro_batch_size = 12
"#;

/// One agent of the SmolLM2 example: a LoRA adapter on the shared base.
const SMOLLM2_AGENT: &str = r#"
[[agents]]
model = "{model}"
[agents.train]
lr = 2e-4
dtype = "{dtype}"
train_batch_size = 12
micro_batch_size = 6
[agents.train.lora]
r = 8
alpha = 16.0
target_modules = ["q_proj", "v_proj"]
"#;

const SMOLLM2_JOB: &str = r#"# Built-in example of `comas local`: two agents, each a LoRA adapter on the shared
# SmolLM2-135M-Instruct, play CoMAS on generated arithmetic word problems for two steps, with a
# held-out evaluation before and after. Scorers use the guided score tag (a small model does
# not write it on its own); everything else follows the spec.
name = "local-smollm2"
seed = 42

[data]
train = "train.jsonl"

[schedule]
questions_per_step = 2
steps = 2

[output]
dir = "out"

# bf16 where the CPU multiplies bf16 in hardware (AMX / AVX-512 BF16), else f32; workers and
# learners use the same, so the sampler's log-probs serve as the old log-probs.
[rollout]
dtype = "{dtype}"

[comas]
num_rounds = 1
evals_per_solution = 1
num_references = 2
instances_per_question = 2

[comas.sampling.solver]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 96
min_new_tokens = 1

[comas.sampling.evaluator]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 64
min_new_tokens = 1

[comas.sampling.scorer]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = 48
min_new_tokens = 1
guided_suffix = "<score>[123]</score>"

# The same game on 64 held-out questions before training and after the last step.
[eval]
data = "test.jsonl"
every_steps = 2
max_questions = 64

"#;

/// The SmolLM2 example's job file, both agents on the model folder `model`, in `dtype`.
fn smollm2_job(model: &Path, dtype: &str) -> String {
    format!("{SMOLLM2_JOB}{}", SMOLLM2_AGENT.repeat(2))
        .replace("{model}", &model.display().to_string())
        .replace("{dtype}", dtype)
}

/// The example's dtype on this machine: bf16 only where the CPU does bf16 matrix products in
/// hardware (measured on SmolLM2 with AMX: rollout 1.6x, training 2.5x faster than f32).
fn example_dtype() -> &'static str {
    if comas_model::dtype::cpu_has_fast_bf16() {
        "bfloat16"
    } else {
        "float32"
    }
}

/// Arithmetic records: bare sums for the tiny models, word problems for SmolLM2.
fn write_data(path: &Path, range: std::ops::Range<u32>, words: bool) -> Result<()> {
    if path.is_file() {
        return Ok(());
    }
    let mut text = String::new();
    for i in range {
        let (a, b) = (3 + (i * 7) % 41, 5 + (i * 13) % 37);
        let prompt = if words {
            let (who, what) =
                [("Mia", "marbles"), ("Omar", "stickers"), ("Lena", "books"), ("Raj", "coins")]
                    [i as usize % 4];
            format!("{who} has {a} {what} and gets {b} more. How many {what} does {who} have now? Put the final number in \\boxed{{}}.")
        } else {
            format!("What is {a} + {b}? Put the final number in \\boxed{{}}.")
        };
        let rec = serde_json::json!({"prompt": prompt, "answer": (a + b).to_string(), "task": "math", "id": format!("math-arith-{i:05}")});
        text.push_str(&rec.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes the example (models, data, job file) under `dir` once; later runs reuse it.
pub fn write(example: Example, dir: &Path) -> Result<PathBuf> {
    let dir = dir.join(example.folder());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let job = dir.join("job.toml");
    match example {
        Example::Tiny => {
            for (name, seed) in [("model-a", 7), ("model-b", 8)] {
                let m = dir.join(name);
                if !m.join("model.safetensors").is_file() {
                    write_model(&m, &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) })?;
                }
            }
            write_data(&dir.join("train.jsonl"), 0..32, false)?;
            write_data(&dir.join("test.jsonl"), 32..40, false)?;
            if !job.is_file() {
                std::fs::write(&job, TINY_JOB)?;
            }
        }
        Example::Smollm2 => {
            let model = comas_gguf::cache::smollm2_model();
            if !model.join("model.safetensors").is_file() {
                bail!(
                    "SmolLM2-135M-Instruct is not in the cache ({}): run `bash scripts/fetch-smollm2.sh` first (scripts/demo.sh does), or pass --example tiny",
                    model.display()
                );
            }
            write_data(&dir.join("train.jsonl"), 0..32, true)?;
            write_data(&dir.join("test.jsonl"), 100..164, true)?;
            std::fs::write(&job, smollm2_job(&model, example_dtype()))?;
        }
    }
    Ok(job)
}

/// The first and the last held-out evaluation of a run, side by side: the rows of the job's
/// method (accuracy first). None when the run logged fewer than two evaluations.
pub fn before_after(metrics_path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(metrics_path).ok()?;
    let evals: Vec<EvalLog> = text
        .lines()
        .filter_map(|l| match LogRecord::parse(l) {
            Ok(Some(LogRecord::Eval(e))) => Some(e),
            _ => None,
        })
        .collect();
    if evals.len() < 2 {
        return None;
    }
    let (first, last) = (evals.first()?, evals.last()?);
    let (a, b) = (
        comas_workflow::registry::summary(&first.to_value())?,
        comas_workflow::registry::summary(&last.to_value())?,
    );
    let mut out = format!(
        "{:<24} {:>14} {:>14}\n",
        "held-out evaluation",
        format!("after {} steps", first.after_steps),
        format!("after {} steps", last.after_steps)
    );
    for (x, y) in a.rows.iter().zip(&b.rows) {
        out.push_str(&format!("{:<24} {:>14} {:>14}\n", x.name, shown(x), shown(y)));
    }
    if let (Some(p1), Some(n1), Some(p2), Some(n2)) = (a.accuracy, a.graded, b.accuracy, b.graded) {
        if let Some((lo, hi)) = difference_interval(p1, n1, p2, n2) {
            out.push_str(&format!(
                "accuracy changed by {:+.1} points (95 % interval {:+.1} to {:+.1}; {n1} and {n2} answers graded)\n",
                100.0 * (p2 - p1),
                100.0 * lo,
                100.0 * hi
            ));
        }
    }
    Some(out)
}

/// Wilson's 95 % score interval of a share `p` of `n`.
fn wilson(p: f64, n: u64) -> (f64, f64) {
    let (n, z) = (n as f64, 1.959_963_984_540_054_f64);
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / (1.0 + z * z / n);
    (centre - half, centre + half)
}

/// Newcombe's 95 % interval of `p2 - p1` from the two shares' Wilson intervals (it treats the
/// two evaluations as independent, which for the same questions is conservative).
fn difference_interval(p1: f64, n1: u64, p2: f64, n2: u64) -> Option<(f64, f64)> {
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let ((l1, u1), (l2, u2)) = (wilson(p1, n1), wilson(p2, n2));
    let d = p2 - p1;
    Some((
        d - ((p2 - l2).powi(2) + (u1 - p1).powi(2)).sqrt(),
        d + ((u2 - p2).powi(2) + (p1 - l1).powi(2)).sqrt(),
    ))
}

/// A row's value as the table shows it.
fn shown(row: &Row) -> String {
    match (row.value, row.unit) {
        (None, _) => "-".to_string(),
        (Some(x), Unit::Share) => format!("{:.0} %", x * 100.0),
        (Some(x), Unit::Signed) => format!("{x:+.3}"),
        (Some(x), Unit::Number) => format!("{x:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smollm2_job_is_two_lora_agents_with_guided_scorers() {
        let spec = comas_workflow::job::JobSpec::from_toml(&smollm2_job(
            Path::new("/m/smollm2"),
            "bfloat16",
        ))
        .unwrap();
        assert_eq!(spec.rollout.dtype, "bfloat16");
        assert!(spec
            .agents
            .iter()
            .all(|a| a.train.get("dtype").and_then(|v| v.as_str()) == Some("bfloat16")));
        assert_eq!(spec.agents.len(), 2);
        assert!(spec
            .agents
            .iter()
            .all(|a| a.model == Path::new("/m/smollm2") && a.train.contains_key("lora")));
        assert_eq!(
            spec.settings
                .get("sampling")
                .and_then(|s| s.get("scorer"))
                .and_then(|s| s.get("guided_suffix"))
                .and_then(|v| v.as_str()),
            Some(comas_workflow::GUIDED_SCORE_SUFFIX)
        );
    }

    #[test]
    fn the_table_compares_the_first_and_last_evaluation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let rec = |steps: u64, acc: f64, fail: f64, solver: f64| {
            serde_json::json!({"kind": "eval", "after_steps": steps, "accuracy": {"last_round": acc}, "parse_failure_rate": fail,
                "reward": {"solver": {"mean": solver}, "evaluator": {"mean": -solver}, "scorer": {"mean": 0.0}}})
            .to_string()
        };
        let step = serde_json::json!({"kind": "step", "step": 1}).to_string();
        std::fs::write(&p, [rec(0, 0.25, 0.5, 0.1), step, rec(2, 0.5, 0.0, 0.3)].join("\n"))
            .unwrap();
        let t = before_after(&p).unwrap();
        assert!(t.contains("after 0 steps") && t.contains("after 2 steps"), "{t}");
        assert!(
            t.lines().any(|l| l.starts_with("held-out accuracy")
                && l.contains("25 %")
                && l.contains("50 %")),
            "{t}"
        );
        assert!(
            t.lines().any(|l| l.starts_with("score parse rate")
                && l.contains("50 %")
                && l.contains("100 %")),
            "{t}"
        );
        assert!(
            t.lines().any(|l| l.starts_with("mean reward, evaluator")
                && l.contains("-0.100")
                && l.contains("-0.300")),
            "{t}"
        );
        std::fs::write(&p, rec(0, 0.25, 0.5, 0.1)).unwrap();
        assert!(before_after(&p).is_none(), "one evaluation is not a comparison");
    }

    #[test]
    fn a_mappa_table_shows_answers_tools_and_coach_scores() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let rec = |steps: u64, right: f64, verifier: f64| {
            serde_json::json!({"kind": "eval", "method": "mappa", "after_steps": steps, "outcome_accuracy": {"mean": right, "count": 16},
                "tool_success_rate": {"mean": 0.5, "count": 8}, "coach_score": {"verifier": {"mean": verifier, "count": 16}}})
            .to_string()
        };
        std::fs::write(&p, [rec(0, 0.125, 5.9375), rec(10, 0.25, 6.5)].join("\n")).unwrap();
        let t = before_after(&p).unwrap();
        assert!(
            t.lines().any(|l| l.starts_with("answers right")
                && l.contains("12 %")
                && l.contains("25 %")),
            "{t}"
        );
        assert!(
            t.lines().any(|l| l.starts_with("coach score, verifier")
                && l.contains("5.94")
                && l.contains("6.50")),
            "{t}"
        );
        assert!(!t.contains("score parse rate"), "{t}");
    }

    /// Newcombe's interval (his method 10), against the same formulas worked in Python: 10/64
    /// then 20/64 right.
    #[test]
    fn the_change_in_accuracy_has_its_interval() {
        let (lo, hi) = difference_interval(10.0 / 64.0, 64, 20.0 / 64.0, 64).unwrap();
        assert!((lo - 0.008_911_9).abs() < 1e-6 && (hi - 0.295_959_2).abs() < 1e-6, "{lo} {hi}");
        assert!(difference_interval(0.5, 0, 0.5, 10).is_none());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let rec = |steps: u64, acc: f64| {
            serde_json::json!({"kind": "eval", "method": "grpo", "after_steps": steps, "accuracy": {"mean": acc, "count": 64}}).to_string()
        };
        std::fs::write(&p, [rec(0, 10.0 / 64.0), rec(8, 20.0 / 64.0)].join("\n")).unwrap();
        let t = before_after(&p).unwrap();
        assert!(t.contains("accuracy changed by +15.6 points (95 % interval +0.9 to +29.6; 64 and 64 answers graded)"), "{t}");
    }

    /// The issue this table once had: a NeuroMAS run read CoMAS's keys and showed "-".
    #[test]
    fn a_neuromas_table_shows_its_held_out_accuracy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let rec = |steps: u64, right: f64| {
            serde_json::json!({"kind": "eval", "method": "neuromas", "after_steps": steps, "episodes": 64,
                "graph_accuracy": {"mean": right, "count": 64}, "no_box_rate": {"mean": 0.5, "count": 64}, "reward": {"mean": right, "count": 64}})
            .to_string()
        };
        std::fs::write(&p, [rec(0, 0.078125), rec(16, 0.390625)].join("\n")).unwrap();
        let t = before_after(&p).unwrap();
        assert!(
            t.lines().any(|l| l.starts_with("held-out accuracy")
                && l.contains("8 %")
                && l.contains("39 %")),
            "{t}"
        );
    }
}
