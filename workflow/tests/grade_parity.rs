//! The math grader against the reference grader `math_verify` on a corpus of SmolLM2-shaped
//! replies (tests/fixtures/grade/math_verify.jsonl, made by gen_math_verify.py).
use comas_workflow::grade::is_correct;
use comas_workflow::TaskKind;

#[derive(serde::Deserialize)]
struct Case {
    response: String,
    answer: String,
    math_verify: bool,
}

#[test]
fn math_grading_agrees_with_math_verify_on_the_corpus() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/grade/math_verify.jsonl");
    let text = std::fs::read_to_string(path).expect("the corpus is committed");
    let cases: Vec<Case> = text.lines().map(|l| serde_json::from_str(l).expect("a corpus line")).collect();
    assert_eq!(cases.len(), 25);
    let disagree: Vec<String> = cases
        .iter()
        .filter(|c| is_correct(TaskKind::Math, &c.response, &c.answer) != Some(c.math_verify))
        .map(|c| format!("{:?} vs {}: math_verify says {}", c.response, c.answer, c.math_verify))
        .collect();
    assert!(disagree.is_empty(), "{disagree:#?}");
    // The corpus holds both verdicts, so a grader that always says one of them fails.
    assert!(cases.iter().any(|c| c.math_verify) && cases.iter().any(|c| !c.math_verify));
}
