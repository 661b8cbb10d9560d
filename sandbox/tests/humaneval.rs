//! The real HumanEval data through the real grader: every canonical solution passes in the
//! sandbox, and every one with its body replaced by `return None` fails.
//!
//! The data comes from `$COMAS_HUMANEVAL` or the cache `scripts/fetch-humaneval.sh` fills; when
//! it is missing the test fails and says to run that script.
use comas_sandbox::{
    default_humaneval_path, grade_code, load_humaneval, CodeGrading, HumanEvalProblem, Sandbox,
    Verdict, HUMANEVAL_PROBLEMS,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

fn problems() -> Vec<HumanEvalProblem> {
    let path = default_humaneval_path();
    match load_humaneval(&path) {
        Ok(p) => p,
        Err(e) => panic!("{e}\n(HumanEval is needed by this test: run `bash scripts/fetch-humaneval.sh`, or set COMAS_HUMANEVAL)"),
    }
}

/// Grades every response, as many at once as the sandbox allows.
fn grade_all(sandbox: &Sandbox, jobs: &[(String, String)]) -> Vec<Verdict> {
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Verdict>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..sandbox.config().max_concurrent.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((response, checker)) = jobs.get(i) else { break };
                let verdict = grade_code(sandbox, response, checker, CodeGrading::AnyBlock)
                    .expect("the sandbox works");
                *results[i].lock().unwrap() = Some(verdict);
            });
        }
    });
    results.into_iter().map(|m| m.into_inner().unwrap().expect("graded")).collect()
}

fn describe(p: &HumanEvalProblem, v: &Verdict) -> String {
    let stderr = v
        .runs
        .last()
        .map(|o| o.stderr.lines().rev().take(3).collect::<Vec<_>>().join(" | "))
        .unwrap_or_default();
    format!("{}: {v} [{stderr}]", p.task_id)
}

#[test]
fn humaneval_canonical_solutions_pass_and_broken_ones_fail() {
    let problems = problems();
    assert_eq!(problems.len(), HUMANEVAL_PROBLEMS);
    for (i, p) in problems.iter().enumerate() {
        assert_eq!(p.task_id, format!("HumanEval/{i}"));
        assert!(p.prompt.contains(&format!("def {}(", p.entry_point)), "{}", p.task_id);
    }
    let start = Instant::now();
    let sandbox = Sandbox::with_defaults().expect("sandbox starts");
    eprintln!(
        "sandbox ready in {:?}: {:?}, python {:?}; gaps: {:?}",
        start.elapsed(),
        sandbox.protections(),
        sandbox.python(),
        sandbox.protections().gaps()
    );

    let start = Instant::now();
    let canonical: Vec<(String, String)> =
        problems.iter().map(|p| (p.canonical_response(), p.checker())).collect();
    let verdicts = grade_all(&sandbox, &canonical);
    let failed: Vec<String> = problems
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| !v.correct)
        .map(|(p, v)| describe(p, v))
        .collect();
    let slowest =
        verdicts.iter().flat_map(|v| &v.runs).map(|o| o.wall_time).max().unwrap_or_default();
    eprintln!(
        "canonical: {} of {} pass in {:?} (slowest run {slowest:?})",
        verdicts.len() - failed.len(),
        verdicts.len(),
        start.elapsed()
    );
    assert!(failed.is_empty(), "canonical solutions that failed:\n{}", failed.join("\n"));

    // The entry point's body replaced: the prompt ends with its signature and docstring.
    let start = Instant::now();
    let broken: Vec<(String, String)> = problems
        .iter()
        .map(|p| (format!("```python\n{}    return None\n```", p.prompt), p.checker()))
        .collect();
    let verdicts = grade_all(&sandbox, &broken);
    let passed: Vec<String> = problems
        .iter()
        .zip(&verdicts)
        .filter(|(_, v)| v.correct)
        .map(|(p, v)| describe(p, v))
        .collect();
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    for v in &verdicts {
        let why = v
            .runs
            .last()
            .and_then(|o| o.exception())
            .map(|e| e.split(':').next().unwrap_or(e).to_string())
            .unwrap_or_else(|| format!("{:?}", v.failure));
        *reasons.entry(why).or_default() += 1;
    }
    eprintln!(
        "broken: {} of {} fail in {:?}; by exception: {reasons:?}",
        verdicts.len() - passed.len(),
        verdicts.len(),
        start.elapsed()
    );
    assert!(passed.is_empty(), "broken solutions that passed:\n{}", passed.join("\n"));
}
