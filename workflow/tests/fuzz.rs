//! Seeded fuzzing of the inputs that arrive from outside: job files, trajectories sent by
//! workers, and texts read for scores. Each case mutates a valid input at random; no mutation
//! may panic, and whatever the parsers accept must be safe for the code that reads it next
//! (a validated trajectory gets rewards without an index out of range).
mod common;

use comas_workflow::comas::{
    comas_rewards, extract_judgment, extract_score, CoMasConfig, Trajectory,
};
use comas_workflow::job::JobSpec;
use comas_workflow::TaskKind;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const JOB: &str = r#"
name = "fuzz"
seed = 3
[data]
train = "data.jsonl"
[schedule]
questions_per_step = 2
steps = 3
max_episode_attempts = 2
[output]
dir = "out"
[comas]
num_rounds = 2
instances_per_question = 2
prompt_max_len = 512
[comas.sampling.scorer]
max_new_tokens = 64
guided_suffix = "<score>[123]</score>"
[[agents]]
model = "m0"
[agents.train]
train_batch_size = 4
micro_batch_size = 2
lr = 1e-5
[agents.train.lora]
r = 8
alpha = 16.0
target_modules = ["q_proj"]
[[agents]]
model = "m1"
[agents.train]
train_batch_size = 6
"#;

/// Texts that parsers trip over: extreme numbers, odd tokens, unicode, structure.
const PIECES: &[&str] = &[
    "0",
    "-1",
    "4294967296",
    "18446744073709551615",
    "1e309",
    "nan",
    "-0.0",
    "\"\"",
    "[]",
    "{}",
    "[[agents]]",
    "[comas]",
    "=",
    "\"\u{1F600}\"",
    "\\u0000",
    "true",
    "null",
    ",",
    ":",
    "\"x\" = 1",
    "\n",
    "#",
    "'",
    "<score>",
    "</score>",
    "\u{FEFF}",
];

fn mutate(rng: &mut ChaCha8Rng, text: &str) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for _ in 0..rng.gen_range(1..=4) {
        if s.is_empty() {
            break;
        }
        let at = rng.gen_range(0..s.len());
        match rng.gen_range(0..5) {
            0 => {
                s.remove(at);
            }
            1 => s.insert(at, char::from_u32(rng.gen_range(0..0x2000)).unwrap_or('?')),
            2 => {
                let end = (at + rng.gen_range(1..40)).min(s.len());
                s.drain(at..end);
            }
            3 => {
                let piece = PIECES[rng.gen_range(0..PIECES.len())];
                for (i, c) in piece.chars().enumerate() {
                    s.insert(at + i, c);
                }
            }
            _ => {
                // Replace a number-like run with an extreme value.
                let end =
                    s[at..].iter().position(|c| !c.is_ascii_digit()).map_or(s.len(), |p| at + p);
                let piece = PIECES[rng.gen_range(0..4)];
                s.splice(at..end, piece.chars());
            }
        }
    }
    s.into_iter().collect()
}

#[test]
fn mutated_job_files_never_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut accepted = 0;
    for _ in 0..3000 {
        let text = mutate(&mut rng, JOB);
        if let Ok(spec) = JobSpec::from_toml(&text) {
            let n = rng.gen_range(0..50);
            if let Ok(job) = spec.check(n) {
                accepted += 1;
                // What a checked job promises its readers holds.
                assert!(job.total_steps >= 1 && job.train.len() == job.spec.agents.len());
                let _ = job.step_questions(job.total_steps - 1);
                let _ = job.eval_method_at(0.7);
            }
        }
    }
    // The mutations are small, so some jobs survive them; the rest were refused, not crashed on.
    assert!(accepted > 50, "only {accepted} mutated jobs parsed");
}

/// A real trajectory of the main protocol, scripted.
fn trajectory(seed: u64) -> Trajectory {
    let config =
        CoMasConfig { num_agents: 3, num_rounds: 2, evals_per_solution: 2, ..Default::default() };
    let mut ep = common::single(&config, TaskKind::Math, seed);
    common::run(&mut ep, |r| {
        if r.role == comas_workflow::Role::Scorer {
            "<score>2</score>".into()
        } else {
            common::tag(r)
        }
    });
    ep.into_trajectory().unwrap()
}

#[test]
fn mutated_trajectories_are_refused_or_safe_to_reward() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let base = serde_json::to_value(trajectory(4)).unwrap();
    let (mut parsed, mut valid) = (0, 0);
    for _ in 0..3000 {
        // Structured edits (a number, a link, a list made longer or shorter) and raw text edits.
        let mut v = base.clone();
        for _ in 0..rng.gen_range(1..=3) {
            edit_json(&mut rng, &mut v);
        }
        let text = serde_json::to_string(&v).unwrap();
        let text = if rng.gen_bool(0.3) { mutate(&mut rng, &text) } else { text };
        let Ok(t) = serde_json::from_str::<Trajectory>(&text) else { continue };
        parsed += 1;
        if t.validate().is_ok() {
            valid += 1;
            let _ = comas_rewards(&t);
        }
    }
    assert!(parsed > 500 && valid > 50, "{parsed} parsed, {valid} valid");
}

/// Changes one value somewhere in the tree: numbers to edge values, arrays shortened or grown.
fn edit_json(rng: &mut ChaCha8Rng, v: &mut serde_json::Value) {
    use serde_json::Value;
    // Pick a path by reading, then edit through a JSON pointer.
    let mut path = String::new();
    let mut at: &Value = v;
    for _ in 0..rng.gen_range(0..6) {
        match at {
            Value::Object(m) if !m.is_empty() => {
                let k = m.keys().nth(rng.gen_range(0..m.len())).unwrap();
                path.push('/');
                path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                at = &m[k];
            }
            Value::Array(a) if !a.is_empty() => {
                let i = rng.gen_range(0..a.len());
                path.push_str(&format!("/{i}"));
                at = &a[i];
            }
            _ => break,
        }
    }
    let node = v.pointer_mut(&path).unwrap();
    match node {
        Value::Number(_) => {
            *node = [0u64, 1, 2, 3, 7, u32::MAX as u64, u64::MAX][rng.gen_range(0..7)].into()
        }
        Value::Array(a) if !a.is_empty() && rng.gen_bool(0.5) => {
            a.remove(rng.gen_range(0..a.len()));
        }
        Value::Array(a) if !a.is_empty() => {
            let x = a[rng.gen_range(0..a.len())].clone();
            a.push(x);
        }
        Value::String(s) => *s = PIECES[rng.gen_range(0..PIECES.len())].to_string(),
        Value::Null => *node = 1.into(),
        _ => *node = Value::Null,
    }
}

#[test]
fn score_extraction_on_random_text_is_total_and_exact() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let parts = [
        "<score>", "</score>", "<SCORE>", "</Score>", "1", "2", "3", "4", " ", "\n", "2.0", "-1",
        "x", "\u{0130}", "ß", "<", ">", "/",
    ];
    for _ in 0..20000 {
        let text: String =
            (0..rng.gen_range(0..12)).map(|_| parts[rng.gen_range(0..parts.len())]).collect();
        let score = extract_score(&text);
        let _ = extract_judgment(&text);
        if let Some(s) = score {
            assert!((1..=3).contains(&s), "{text:?} gave {s}");
            // Spec 4: the first tag pair decides, and it holds exactly that digit.
            let lower = text.to_ascii_lowercase();
            let open = lower.find("<score>").expect("a score needs a tag");
            let close = lower[open..].find("</score>").expect("and its close") + open;
            assert_eq!(text[open + 7..close].trim(), s.to_string(), "{text:?}");
        }
    }
}
