//! `comas grade`: grades a file of responses without any model. HumanEval records are
//! `{id, response}` (id = `HumanEval/N`); math, choice and numeric records are
//! `{id, response, answer}`. Prints one summary JSON object; `--out` gets one verdict a line.
use crate::eval::grading::{Grader, Verdict};
use anyhow::{bail, Context, Result};
use comas_workflow::code::CodeGrading;
use comas_workflow::eval::{BenchItem, GraderKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// humaneval, math, choice or numeric.
    #[arg(long)]
    bench: String,
    /// JSONL of records to grade.
    #[arg(long)]
    responses: PathBuf,
    /// Writes one verdict per record (JSONL) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Which code blocks count; the other mode is reported too.
    #[arg(long, default_value = "any_block")]
    code_grading: CodeGrading,
}

#[derive(Deserialize)]
struct Record {
    id: serde_json::Value,
    response: String,
    #[serde(default)]
    answer: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct Line<'a> {
    id: String,
    #[serde(flatten)]
    verdict: &'a Verdict,
}

#[derive(Serialize)]
struct Summary {
    bench: String,
    code_grading: CodeGrading,
    graded: usize,
    passed: usize,
    accuracy: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    passed_other_mode: Option<usize>,
}

fn id_text(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

pub fn run(a: Args) -> Result<()> {
    if let Some(out) = &a.out {
        crate::out_path::not_an_input("--out", out, &[&a.responses])?;
    }
    let kind = match a.bench.as_str() {
        "humaneval" => None,
        "math" => Some(GraderKind::Math),
        "choice" => Some(GraderKind::Choice),
        "numeric" => Some(GraderKind::Numeric),
        other => bail!("--bench {other}: use humaneval, math, choice or numeric"),
    };
    let text = std::fs::read_to_string(&a.responses)
        .with_context(|| format!("reading {}", a.responses.display()))?;
    let problems: HashMap<String, comas_sandbox::HumanEvalProblem> = if kind.is_none() {
        let path = comas_sandbox::default_humaneval_path();
        comas_sandbox::load_humaneval(&path)
            .context("run `bash scripts/fetch-humaneval.sh` first")?
            .into_iter()
            .map(|p| (p.task_id.clone(), p))
            .collect()
    } else {
        HashMap::new()
    };
    let grader = Grader::new(kind.is_none(), a.code_grading)?;
    let mut lines = String::new();
    let (mut graded, mut passed, mut other) = (0usize, 0usize, 0usize);
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{} line {}", a.responses.display(), i + 1);
        let r: Record = serde_json::from_str(line)
            .with_context(|| format!("{}: expected {{id, response[, answer]}}", at()))?;
        let id = id_text(&r.id);
        let item = match &kind {
            None => {
                let p = problems.get(&id).with_context(|| {
                    format!(
                        "{}: no HumanEval task {id:?} (ids are HumanEval/0 … HumanEval/163)",
                        at()
                    )
                })?;
                BenchItem {
                    id: id.clone(),
                    query: String::new(),
                    answer: String::new(),
                    grader: GraderKind::Code { checker: p.checker() },
                    tag: "humaneval".into(),
                }
            }
            Some(k) => {
                let answer = r
                    .answer
                    .as_ref()
                    .with_context(|| format!("{}: a {} record needs an `answer`", at(), a.bench))?;
                BenchItem {
                    id: id.clone(),
                    query: String::new(),
                    answer: id_text(answer),
                    grader: k.clone(),
                    tag: a.bench.clone(),
                }
            }
        };
        let v = grader.grade(&item, &r.response)?;
        graded += 1;
        passed += usize::from(v.passed);
        other += usize::from(v.passed_other_mode == Some(true));
        lines.push_str(&serde_json::to_string(&Line { id, verdict: &v })?);
        lines.push('\n');
    }
    if graded == 0 {
        bail!("{} holds no records", a.responses.display());
    }
    if let Some(out) = &a.out {
        crate::plot::write_atomic(out, lines.as_bytes())?;
    }
    let summary = Summary {
        bench: a.bench.clone(),
        code_grading: a.code_grading,
        graded,
        passed,
        accuracy: passed as f64 / graded as f64,
        passed_other_mode: kind.is_none().then_some(other),
    };
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}
