//! The math grader against the reference grader, `math_verify` 0.8.0, on two labelled corpora
//! in tests/fixtures/grade/: math_verify.jsonl (hand-written cases, gen_math_verify.py) and
//! math_pairs.jsonl (a few thousand generated MATH-style answer pairs, gen_math_pairs.py). Both
//! are labelled `verify(parse(reference_text(gt)), parse(response))`: a reference answer without
//! math delimiters is read inside `$...$` (reference_answer.py, as `math::reference_text` does).
//! check-math-pairs.sh re-derives both files' labels from the pinned reference.
//!
//! `cargo test -p comas-workflow --test grade_parity -- --nocapture` prints the agreement.
use comas_workflow::grade::{is_correct, math};
use comas_workflow::TaskKind;
use std::collections::BTreeMap;

#[derive(serde::Deserialize)]
struct Case {
    category: String,
    response: String,
    answer: String,
    math_verify: bool,
}

fn load(name: &str) -> Vec<Case> {
    let path = format!("{}/../tests/fixtures/grade/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (the corpus is committed)"));
    text.lines().map(|l| serde_json::from_str(l).expect("a corpus line")).collect()
}

fn corpus() -> Vec<Case> {
    load("math_verify.jsonl")
}

fn describe(c: &Case) -> String {
    format!(
        "[{}] {:?} vs {:?}: math_verify says {}",
        c.category, c.response, c.answer, c.math_verify
    )
}

/// What one corpus measured: the agreement in percent, and the categories holding one verdict.
struct Measured {
    agreement: f64,
    one_sided: Vec<String>,
}

/// Grades every case, prints the agreement overall and per category and the disagreements.
fn measure(name: &str, cases: &[Case]) -> Measured {
    // category -> [agree, cases, labelled true, labelled false]
    let mut by_category: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    let mut disagree = Vec::new();
    for c in cases {
        let counts = by_category.entry(c.category.as_str()).or_default();
        let agrees = math::is_equivalent(&c.response, &c.answer) == c.math_verify;
        counts[0] += usize::from(agrees);
        counts[1] += 1;
        counts[if c.math_verify { 2 } else { 3 }] += 1;
        if !agrees {
            disagree.push(describe(c));
        }
    }
    let agreement = 100.0 * (cases.len() - disagree.len()) as f64 / cases.len() as f64;
    eprintln!("math grader vs math_verify 0.8.0 on {name}: {agreement:.2} % agreement on {} cases ({} disagree)", cases.len(), disagree.len());
    for (category, [agree, n, yes, no]) in &by_category {
        eprintln!("  {category:<16} {agree:>4}/{n:<4} agree ({yes} equivalent, {no} not)");
    }
    for d in &disagree {
        eprintln!("  disagrees: {d}");
    }
    let one_sided = by_category
        .iter()
        .filter(|(_, c)| c[2] == 0 || c[3] == 0)
        .map(|(k, _)| k.to_string())
        .collect();
    Measured { agreement, one_sided }
}

/// Replies shaped like SmolLM2-135M's, which training logs: every one must agree.
#[test]
fn small_model_replies_agree_exactly() {
    let cases: Vec<Case> = corpus().into_iter().filter(|c| c.category == "smollm2").collect();
    assert_eq!(cases.len(), 25);
    let disagree: Vec<String> = cases
        .iter()
        .filter(|c| is_correct(TaskKind::Math, &c.response, &c.answer) != Some(c.math_verify))
        .map(describe)
        .collect();
    assert!(disagree.is_empty(), "{disagree:#?}");
}

/// Agreement on the hand-written corpus, measured when the grader last changed and rounded
/// down (1429 of 1434: the rest, all in "rare_forms", are an integral, a limit and a derivative
/// the port leaves unevaluated, an absolute-value inequality and a decimal under a root).
const CORPUS_MIN_AGREEMENT: f64 = 99.6;

/// The whole corpus: it is big and holds both verdicts, so a grader that always says one of
/// them fails, and the grader agrees on at least [`CORPUS_MIN_AGREEMENT`] % of it.
#[test]
fn math_grading_agrees_with_math_verify_on_the_corpus() {
    let cases = corpus();
    assert!(cases.len() >= 300, "the corpus has {} cases", cases.len());
    assert!(cases.iter().any(|c| c.math_verify) && cases.iter().any(|c| !c.math_verify));
    let m = measure("math_verify.jsonl", &cases);
    assert!(
        m.agreement >= CORPUS_MIN_AGREEMENT,
        "agreement {:.2} % is below {CORPUS_MIN_AGREEMENT} %",
        m.agreement
    );
}

/// Agreement on the generated pairs, measured when the grader last changed and rounded down:
/// a change that loses agreement fails here.
const PAIRS_MIN_AGREEMENT: f64 = 100.0;

/// The generated MATH-style pairs: every category holds both verdicts, and the grader agrees
/// with the reference on at least [`PAIRS_MIN_AGREEMENT`] % of them.
#[test]
fn math_grading_agrees_with_math_verify_on_generated_pairs() {
    let cases = load("math_pairs.jsonl");
    assert!(cases.len() >= 3000, "the generated corpus has {} cases", cases.len());
    let m = measure("math_pairs.jsonl", &cases);
    assert!(m.one_sided.is_empty(), "categories with one verdict only: {:?}", m.one_sided);
    assert!(
        m.agreement >= PAIRS_MIN_AGREEMENT,
        "agreement {:.2} % is below {PAIRS_MIN_AGREEMENT} %",
        m.agreement
    );
}

/// The reported misreadings, graded through every entry point: the benchmark grade, the
/// training-time check and the equivalence the GRPO reward calls. Each reference is raw LaTeX,
/// as MATH-500 stores it, and has a right and a wrong reply in the generated corpus.
#[test]
fn raw_references_from_the_issue_are_read_as_latex() {
    let cases: Vec<Case> =
        load("math_pairs.jsonl").into_iter().filter(|c| c.category == "issue").collect();
    let references: std::collections::BTreeSet<&str> =
        cases.iter().map(|c| c.answer.as_str()).collect();
    assert_eq!(references.len(), 11, "{references:?}");
    for gt in &references {
        let mine = || cases.iter().filter(|c| c.answer == *gt);
        assert!(
            mine().any(|c| c.math_verify) && mine().any(|c| !c.math_verify),
            "{gt:?} needs a right and a wrong reply"
        );
    }
    for c in &cases {
        let bench = comas_workflow::grade::grade(
            comas_workflow::grade::AnswerKind::Math,
            &c.response,
            &c.answer,
        )
        .passed();
        let training = is_correct(TaskKind::Math, &c.response, &c.answer);
        assert_eq!(
            (bench, training, math::is_equivalent(&c.response, &c.answer)),
            (c.math_verify, Some(c.math_verify), c.math_verify),
            "{}",
            describe(c)
        );
    }
}
