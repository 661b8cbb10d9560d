//! How often a real small model writes a score the CoMAS reward can read, with and without the
//! guided tail, and how much its guided score tells correct from wrong answers.
//!
//!     bash scripts/fetch-smollm2.sh && cargo bench -p comas --bench score_parse
//!
//! The model is SmolLM2-135M-Instruct from the cache (or `COMAS_BENCH_MODEL=DIR`). Each scorer
//! prompt is the CoMAS scorer prompt for an arithmetic question with a correct or a wrong
//! solution; replies are sampled as the job's scorer samples them (temperature 1, top-p 1).
use comas_model::{generate, CausalLm, ChatMessage, GenerationRequest, SamplingParams, Tokenizer};
use comas_workflow::comas::extract_score;
use comas_workflow::comas::prompts::scorer_prompt;
use comas_workflow::{TaskKind, GUIDED_SCORE_SUFFIX};
use std::path::PathBuf;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

const QUESTIONS: u64 = 16;
const SAMPLES: u64 = 2;
const MAX_NEW: usize = 64;

struct Case {
    prompt_ids: Vec<i64>,
    correct: bool,
}

fn cases(tok: &Tokenizer) -> Vec<Case> {
    (0..QUESTIONS)
        .map(|i| {
            let (a, b) = (13 + 7 * i, 29 + 11 * i);
            let correct = i % 2 == 0;
            let shown = if correct { a + b } else { a + b + 1 + i % 9 };
            let problem =
                format!("Tom has {a} apples and buys {b} more. How many apples does he have now?");
            let solution = format!("{a} + {b} = {shown}. The answer is \\boxed{{{shown}}}.");
            let evaluation = "The solution adds the two amounts.";
            let user = scorer_prompt(TaskKind::Math, &problem, &solution, evaluation);
            Case {
                prompt_ids: tok.encode_chat(&[ChatMessage::new("user", user)], true).unwrap(),
                correct,
            }
        })
        .collect()
}

/// E[score] under the model's distribution over the digits 1, 2, 3 at the guided digit.
fn expected_score(
    model: &CausalLm,
    tok: &Tokenizer,
    prompt: &[i64],
    completion: &[i64],
    digit_at: usize,
) -> f64 {
    let ids = [prompt, &completion[..digit_at]].concat();
    let logits = tch::no_grad(|| {
        model.forward(&Tensor::from_slice(&ids).view([1, -1]), None, None).unwrap()
    });
    let row = logits.get(0).get(ids.len() as i64 - 1).to_kind(Kind::Double);
    let digits: Vec<i64> =
        ["1", "2", "3"].iter().map(|d| tok.token_to_id(d).expect("digit tokens")).collect();
    let l: Vec<f64> = digits.iter().map(|&d| row.double_value(&[d])).collect();
    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
    w.iter().zip([1.0, 2.0, 3.0]).map(|(p, s)| p * s).sum::<f64>() / w.iter().sum::<f64>()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    tch::set_num_threads(2);
    let dir = std::env::var_os("COMAS_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(comas_gguf::cache::smollm2_model);
    let tok = Tokenizer::from_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-smollm2.sh)", dir.display()));
    let model = CausalLm::load(&dir, Kind::Float, Device::Cpu).unwrap();
    let cases = cases(&tok);
    println!(
        "model {}; {} scorer prompts x {SAMPLES} samples, temperature 1, <= {MAX_NEW} new tokens",
        dir.display(),
        cases.len()
    );
    for guided in [false, true] {
        let reqs: Vec<GenerationRequest> = cases
            .iter()
            .flat_map(|c| (0..SAMPLES).map(move |s| (c, s)))
            .enumerate()
            .map(|(i, (c, _))| GenerationRequest {
                prompt_ids: c.prompt_ids.clone(),
                params: SamplingParams {
                    seed: 1000 + i as u64,
                    max_new_tokens: MAX_NEW,
                    stop_token_ids: tok.eos_token_ids().to_vec(),
                    guided_suffix: guided.then(|| GUIDED_SCORE_SUFFIX.to_string()),
                    ..Default::default()
                },
                adapter: None,
            })
            .collect();
        let started = Instant::now();
        let outs = generate(&model, &reqs, Some(&tok)).unwrap();
        let secs = started.elapsed().as_secs_f64();
        let mut parsed = 0;
        let (mut exp_right, mut exp_wrong, mut n_right, mut n_wrong) = (0.0, 0.0, 0, 0);
        for (i, out) in outs.iter().enumerate() {
            let text = tok.decode(&out.token_ids, true).unwrap();
            parsed += usize::from(extract_score(&text).is_some());
            if let Some(digit) = out.constrained.iter().find(|c| c.allowed.len() > 1) {
                let case = &cases[i / SAMPLES as usize];
                let e =
                    expected_score(&model, &tok, &case.prompt_ids, &out.token_ids, digit.position);
                if case.correct {
                    (exp_right, n_right) = (exp_right + e, n_right + 1);
                } else {
                    (exp_wrong, n_wrong) = (exp_wrong + e, n_wrong + 1);
                }
            }
        }
        let tokens: usize = outs.iter().map(|o| o.token_ids.len()).sum();
        println!(
            "{:<9} parse rate {parsed}/{} = {:.0} %   ({tokens} tokens in {secs:.1} s)",
            if guided { "guided" } else { "free" },
            outs.len(),
            100.0 * parsed as f64 / outs.len() as f64
        );
        if guided {
            println!(
                "          E[score] at the guided digit: correct answers {:.3} (n={n_right}), wrong answers {:.3} (n={n_wrong})",
                exp_right / n_right.max(1) as f64,
                exp_wrong / n_wrong.max(1) as f64
            );
        }
    }
}
