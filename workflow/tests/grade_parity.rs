//! The math grader against the reference grader, `math_verify` 0.8.0, on a labelled corpus
//! (tests/fixtures/grade/math_verify.jsonl, written by gen_math_verify.py next to it).
//!
//! `cargo test -p comas-workflow --test grade_parity -- --nocapture` prints the agreement.
use comas_workflow::grade::{is_correct, math};
use comas_workflow::TaskKind;

#[derive(serde::Deserialize)]
struct Case {
    category: String,
    response: String,
    answer: String,
    math_verify: bool,
}

fn corpus() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/grade/math_verify.jsonl");
    let text = std::fs::read_to_string(path).expect("the corpus is committed");
    text.lines().map(|l| serde_json::from_str(l).expect("a corpus line")).collect()
}

fn describe(c: &Case) -> String {
    format!("[{}] {:?} vs {:?}: math_verify says {}", c.category, c.response, c.answer, c.math_verify)
}

/// Replies shaped like SmolLM2-135M's, which training logs: every one must agree.
#[test]
fn small_model_replies_agree_exactly() {
    let cases: Vec<Case> = corpus().into_iter().filter(|c| c.category == "smollm2").collect();
    assert_eq!(cases.len(), 25);
    let disagree: Vec<String> = cases.iter().filter(|c| is_correct(TaskKind::Math, &c.response, &c.answer) != Some(c.math_verify)).map(describe).collect();
    assert!(disagree.is_empty(), "{disagree:#?}");
}

/// The whole corpus: at least 98 % agreement, and the corpus is big and holds both verdicts,
/// so a grader that always says one of them fails.
#[test]
fn math_grading_agrees_with_math_verify_on_the_corpus() {
    let cases = corpus();
    assert!(cases.len() >= 300, "the corpus has {} cases", cases.len());
    assert!(cases.iter().any(|c| c.math_verify) && cases.iter().any(|c| !c.math_verify));
    let disagree: Vec<&Case> = cases.iter().filter(|c| math::is_equivalent(&c.response, &c.answer) != c.math_verify).collect();
    let agreement = 100.0 * (cases.len() - disagree.len()) as f64 / cases.len() as f64;
    eprintln!("math grader vs math_verify 0.8.0: {agreement:.2} % agreement on {} cases ({} disagree)", cases.len(), disagree.len());
    for c in &disagree {
        eprintln!("  disagrees: {}", describe(c));
    }
    assert!(agreement >= 98.0, "agreement {agreement:.2} % is below 98 %");
}
