//! Reading a job's metrics log (`metrics.jsonl`): its step and eval records, placed on the step axis.
use anyhow::{bail, Context, Result};
use comas_workflow::error::json_kind as kind_of;
use serde_json::Value;
use std::path::Path;

/// One record of the log and where it sits on the x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// `step` for a step record, `after_steps` (else `step`) for an eval record.
    pub x: f64,
    pub value: Value,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Metrics {
    /// The first job id seen in a step record, if any.
    pub job_id: Option<String>,
    /// `"kind":"step"` records in ascending order; a step logged twice keeps its last record.
    pub steps: Vec<Record>,
    /// `"kind":"eval"` records, the same way.
    pub evals: Vec<Record>,
}

pub fn read_log(path: &Path) -> Result<Metrics> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "metrics log {} does not exist: pass the metrics.jsonl file that a job wrote",
                path.display()
            )
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read metrics log {}", path.display()))
        }
    };
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let upto = e.utf8_error().valid_up_to();
            let line = e.as_bytes()[..upto].iter().filter(|&&b| b == b'\n').count() + 1;
            bail!("{}, line {line}: not UTF-8 text; is this a metrics log?", path.display());
        }
    };
    parse_log(&text, &path.display().to_string())
}

/// Parses the text of a metrics log; `source` names it in error messages.
pub fn parse_log(text: &str, source: &str) -> Result<Metrics> {
    let mut m = Metrics::default();
    let mut lines = text.split('\n').enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // A last line without its newline may still be being written by a running job.
        let unfinished = lines.peek().is_none() && !text.ends_with('\n');
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) if unfinished => {
                tracing::warn!("{source}, line {n}: ignoring an unfinished last line");
                continue;
            }
            Err(e) => {
                bail!("{source}, line {n}: not valid JSON ({e}); each line must be one JSON object")
            }
        };
        let Some(obj) = value.as_object() else {
            bail!("{source}, line {n}: expected a JSON object, found {}", kind_of(&value));
        };
        match obj.get("kind").and_then(Value::as_str) {
            Some("step") => {
                let Some(x) = number(obj.get("step")) else {
                    bail!("{source}, line {n}: step record without a numeric \"step\" field");
                };
                if m.job_id.is_none() {
                    m.job_id = obj.get("job_id").and_then(Value::as_str).map(str::to_owned);
                }
                m.steps.push(Record { x, value });
            }
            Some("eval") => {
                // Evals are placed after the training steps they saw.
                let Some(x) = number(obj.get("after_steps")).or_else(|| number(obj.get("step")))
                else {
                    bail!(
                        "{source}, line {n}: eval record without a numeric \"after_steps\" field"
                    );
                };
                m.evals.push(Record { x, value });
            }
            _ => {}
        }
    }
    if m.steps.is_empty() {
        bail!(
            "{source} has no step records (lines with \"kind\":\"step\"): the job has not finished a \
             step yet, or this is not a metrics log"
        );
    }
    m.steps = last_per_x(m.steps);
    m.evals = last_per_x(m.evals);
    Ok(m)
}

/// Sorts by x; when an x repeats (a resumed job), the later line wins.
fn last_per_x(mut records: Vec<Record>) -> Vec<Record> {
    records.sort_by(|a, b| a.x.total_cmp(&b.x)); // stable: later lines stay later
    let mut out: Vec<Record> = Vec::with_capacity(records.len());
    for r in records {
        match out.last_mut() {
            Some(last) if last.x == r.x => *last = r,
            _ => out.push(r),
        }
    }
    out
}

/// A finite number, or `None` for anything else (missing, null, a string, ...).
pub fn number(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64).filter(|x| x.is_finite())
}

/// The value at a dotted path such as `seconds.rollout`, if each part is a key of an object.
pub fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, key| v.get(key))
}

/// The finite number at a dotted path.
pub fn num_at(v: &Value, path: &str) -> Option<f64> {
    number(field(v, path))
}

/// The `summary.json` of a `comas eval --out` folder; it must carry its checkpoint step.
pub fn read_eval_summary(dir: &Path) -> Result<comas_workflow::eval::EvalSummary> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} is not a `comas eval` output folder: cannot read its summary.json",
            dir.display()
        )
    })?;
    let s: comas_workflow::eval::EvalSummary = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a summary written by comas eval", path.display()))?;
    if s.checkpoint_step.is_none() {
        bail!("{} has no checkpoint step: evaluate with --job-dir DIR --checkpoint N, or give comas eval --step N", path.display());
    }
    Ok(s)
}
