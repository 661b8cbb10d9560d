//! What `comas eval` writes: `results.jsonl` (one graded question per line, its calls inline)
//! appended as questions end, so a rerun skips them; `summary.json` and `summary.md` from all
//! of them.
use super::grading::Verdict;
use anyhow::{Context, Result};
use comas_workflow::code::CodeGrading;
use comas_workflow::eval::{BenchItem, CallRecord, EvalCell, EvalSummary, Setup};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

/// One graded question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuestionResult {
    pub setup: Setup,
    pub id: String,
    pub tag: String,
    pub grader: String,
    pub answer: String,
    pub output: String,
    pub verdict: Verdict,
    pub new_tokens: u64,
    #[serde(default)]
    pub calls: Vec<serde_json::Value>,
}

impl QuestionResult {
    pub fn new(
        setup: Setup,
        item: &BenchItem,
        output: String,
        verdict: Verdict,
        calls: Vec<CallRecord>,
    ) -> Self {
        let mut calls = calls;
        calls.sort_by_key(|c| c.call);
        Self {
            setup,
            id: item.id.clone(),
            tag: item.tag.clone(),
            grader: item.grader.name().to_string(),
            answer: item.answer.clone(),
            output,
            verdict,
            new_tokens: calls.iter().map(|c| c.new_tokens as u64).sum(),
            calls: calls
                .iter()
                .map(|c| serde_json::to_value(c).expect("a call record serializes"))
                .collect(),
        }
    }
}

/// `results.jsonl` in the output folder: read once at start (what is done), appended after.
pub struct ResultsFile {
    path: PathBuf,
    done: HashSet<(Setup, String)>,
}

impl ResultsFile {
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("results.jsonl");
        let mut file = Self { path, done: HashSet::new() };
        for r in file.load_all()? {
            file.done.insert((r.setup, r.id));
        }
        Ok(file)
    }

    pub fn has(&self, setup: Setup, id: &str) -> bool {
        self.done.contains(&(setup, id.to_string()))
    }

    /// Appends one line and flushes it to disk: a question is either wholly there or not (a
    /// torn last line from a crash is dropped when read back).
    pub fn append(&mut self, r: &QuestionResult) -> Result<()> {
        let mut line = serde_json::to_string(r)?;
        line.push('\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        f.write_all(line.as_bytes())?;
        f.sync_data()?;
        self.done.insert((r.setup, r.id.clone()));
        Ok(())
    }

    pub fn load_all(&self) -> Result<Vec<QuestionResult>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut out = Vec::new();
        for (i, l) in lines.iter().enumerate() {
            match serde_json::from_str::<QuestionResult>(l) {
                Ok(r) => out.push(r),
                // Only the last line can be torn by a crash; anything else is a foreign file.
                Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "{} line {}: not a result written by comas eval",
                            self.path.display(),
                            i + 1
                        )
                    })
                }
            }
        }
        Ok(out)
    }
}

pub fn summarize(
    bench: &str,
    models: &[String],
    checkpoint_step: Option<u64>,
    results: &[QuestionResult],
    mode: CodeGrading,
) -> EvalSummary {
    let mut cells: BTreeMap<(String, Setup), Vec<&QuestionResult>> = BTreeMap::new();
    for r in results {
        cells.entry((r.tag.clone(), r.setup)).or_default().push(r);
    }
    let cells: Vec<EvalCell> = cells
        .into_iter()
        .map(|((tag, setup), rs)| {
            let passed = rs.iter().filter(|r| r.verdict.passed).count();
            let other = rs
                .iter()
                .any(|r| r.verdict.passed_other_mode.is_some())
                .then(|| rs.iter().filter(|r| r.verdict.passed_other_mode == Some(true)).count());
            EvalCell {
                tag,
                setup,
                graded: rs.len(),
                passed,
                accuracy: passed as f64 / rs.len().max(1) as f64,
                passed_other_mode: other,
                mean_new_tokens: rs.iter().map(|r| r.new_tokens as f64).sum::<f64>()
                    / rs.len().max(1) as f64,
            }
        })
        .collect();
    let passed = results.iter().filter(|r| r.verdict.passed).count();
    EvalSummary {
        bench: bench.to_string(),
        models: models.to_vec(),
        code_grading: mode,
        checkpoint_step,
        graded: results.len(),
        passed,
        accuracy: passed as f64 / results.len().max(1) as f64,
        cells,
    }
}

/// The summary as a Markdown table: one row per benchmark tag, one column per setup.
pub fn markdown(s: &EvalSummary) -> String {
    let mut setups: Vec<Setup> = s.cells.iter().map(|c| c.setup).collect();
    setups.sort();
    setups.dedup();
    let mut tags: Vec<&str> = s.cells.iter().map(|c| c.tag.as_str()).collect();
    tags.dedup();
    let mut out = format!("Models: {}\n\n| benchmark |", s.models.join(", "));
    for st in &setups {
        out.push_str(&format!(" {st} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(setups.len()));
    out.push('\n');
    for tag in tags {
        out.push_str(&format!("| {tag} |"));
        for st in &setups {
            match s.cells.iter().find(|c| c.tag == tag && c.setup == *st) {
                Some(c) => {
                    let other = c.passed_other_mode.map_or(String::new(), |p| {
                        format!(
                            "; other block mode {:.1} %",
                            100.0 * p as f64 / c.graded.max(1) as f64
                        )
                    });
                    out.push_str(&format!(
                        " {:.1} % ({}/{}{other}) |",
                        100.0 * c.accuracy,
                        c.passed,
                        c.graded
                    ));
                }
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    if s.cells.iter().any(|c| c.passed_other_mode.is_some()) {
        out.push_str(&format!(
            "\nCode graded with `{}` (the other mode in brackets).\n",
            s.code_grading
        ));
    }
    out
}

pub fn write_summary(dir: &Path, s: &EvalSummary) -> Result<()> {
    crate::plot::write_atomic(
        &dir.join("summary.json"),
        serde_json::to_string_pretty(s)?.as_bytes(),
    )?;
    crate::plot::write_atomic(&dir.join("summary.md"), markdown(s).as_bytes())
}

pub fn progress_bar(setup: Setup, total: usize, done: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>11} [{bar:30.cyan/blue}] {pos}/{len} questions {msg} ({elapsed})",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    bar.set_prefix(setup.to_string());
    bar.set_position(done as u64);
    bar
}
