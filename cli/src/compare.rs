//! `comas compare`: one Markdown table comparing the metrics logs of several runs (the arms of
//! an experiment): held-out accuracy before and after and training accuracy, as each record's
//! method grades it (any method); for CoMAS runs also the judges' behaviour, rewards per role,
//! and how well the solver's reward tracks correctness.
use anyhow::{bail, Context, Result};
use comas_workflow::step_log::Record as LogRecord;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// A run as LABEL=PATH to its metrics.jsonl; repeat for each arm, in table order.
    #[arg(long = "run", required = true, value_parser = parse_run)]
    pub runs: Vec<(String, PathBuf)>,
    /// Training-step figures are means over this many steps at each end of a run.
    #[arg(long, default_value_t = 5)]
    pub window: usize,
}

fn parse_run(s: &str) -> std::result::Result<(String, PathBuf), String> {
    match s.split_once('=') {
        // A `|` would split the label's cell of the Markdown table.
        Some((label, _)) if label.contains('|') => {
            Err(format!("`{label}`: a label cannot hold `|` (it is a table cell)"))
        }
        Some((label, path)) if !label.is_empty() && !path.is_empty() => {
            Ok((label.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("`{s}`: expected LABEL=PATH, e.g. comas=runs/comas/out/metrics.jsonl")),
    }
}

/// The figures of a metrics record that the comparison reads (steps and evaluations share them).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct Record {
    /// A role that no turn played (the scorer under `no_scoring`) is logged as null.
    pub reward: BTreeMap<String, Option<Summary>>,
    pub parse_failure_rate: Option<f64>,
    pub approval_rate: Option<f64>,
    pub accuracy: Accuracy,
    pub solver_reward_by_correctness: ByCorrectness,
    /// The greedy game of an evaluation (`[eval] greedy = true`).
    pub greedy: Option<Box<Record>>,
    /// The share of right answers as the record's method reports it (its summary).
    #[serde(skip)]
    pub graded_accuracy: Option<f64>,
}

impl Record {
    /// A record's figures: the accuracy by its method's summary, and the CoMAS columns when
    /// they are CoMAS's (another method's records leave them empty).
    fn of(value: serde_json::Value) -> std::result::Result<Record, serde_json::Error> {
        let graded = comas_workflow::registry::summary(&value).and_then(|s| s.accuracy);
        let greedy = value.get("greedy").filter(|g| g.is_object()).cloned();
        let mut r = if comas_workflow::registry::method_of(&value) == "comas" {
            let mut r: Record = serde_json::from_value(value)?;
            r.greedy = None;
            r
        } else {
            Record::default()
        };
        r.graded_accuracy = graded.or(r.accuracy.last_round);
        r.greedy = greedy.map(Record::of).transpose()?.map(Box::new);
        Ok(r)
    }

    fn accuracy(&self) -> Option<f64> {
        self.graded_accuracy.or(self.accuracy.last_round)
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub mean: Option<f64>,
    pub count: u64,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct Accuracy {
    pub last_round: Option<f64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct ByCorrectness {
    pub correct: Summary,
    pub wrong: Summary,
}

/// A run's step and evaluation records, in log order.
#[derive(Debug, Default)]
pub struct Run {
    pub steps: Vec<Record>,
    pub evals: Vec<Record>,
}

pub fn parse(text: &str, source: &str) -> Result<Run> {
    let mut run = Run::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{source}, line {}", i + 1);
        // The shared fields typed (`step_log`), then the figures the comparison reads.
        let figures = |v: serde_json::Value| {
            Record::of(v).with_context(|| format!("{}: not a metrics record", at()))
        };
        match LogRecord::parse(line).with_context(at)? {
            Some(LogRecord::Step(s)) => run.steps.push(figures(s.to_value())?),
            Some(LogRecord::Eval(e)) => run.evals.push(figures(e.to_value())?),
            None => {}
        }
    }
    if run.steps.is_empty() && run.evals.is_empty() {
        bail!("{source} has no step or evaluation records: is it a job's metrics.jsonl?");
    }
    Ok(run)
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    comas_workflow::mean::Sum::of(values).value()
}

/// Count-weighted mean of several summaries.
fn pooled<'a>(parts: impl Iterator<Item = &'a Summary>) -> Summary {
    let (mut s, mut n) = (0.0, 0u64);
    for p in parts {
        if let Some(m) = p.mean {
            s += m * p.count as f64;
            n += p.count;
        }
    }
    Summary { mean: (n > 0).then(|| s / n as f64), count: n }
}

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{:.1}%", 100.0 * x))
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:+.3}"))
}

/// "first → last" of a quantity over a list of records.
fn trend(
    records: &[Record],
    f: impl Fn(&Record) -> Option<f64>,
    fmt: fn(Option<f64>) -> String,
) -> String {
    match (records.first(), records.last()) {
        (Some(a), Some(b)) if records.len() > 1 => format!("{} → {}", fmt(f(a)), fmt(f(b))),
        (Some(a), _) => fmt(f(a)),
        _ => "–".into(),
    }
}

/// The mean of `f` over the first and the last `window` steps, as "first → last".
fn window_trend(
    steps: &[Record],
    window: usize,
    f: impl Fn(&Record) -> Option<f64>,
    fmt: fn(Option<f64>) -> String,
) -> String {
    if steps.is_empty() {
        return "–".into();
    }
    let k = window.clamp(1, steps.len());
    let head = mean(steps[..k].iter().filter_map(&f));
    let tail = mean(steps[steps.len() - k..].iter().filter_map(&f));
    format!("{} → {}", fmt(head), fmt(tail))
}

pub fn table(runs: &[(String, Run)], window: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| arm | steps | held-out acc. (sampled) | held-out acc. (greedy) | train acc. | score parse rate | approval rate | reward solver / evaluator / scorer | solver reward: correct vs wrong |"
    );
    let _ = writeln!(out, "|---|---:|---|---|---|---|---|---|---|");
    for (label, run) in runs {
        let greedy: Vec<Record> =
            run.evals.iter().filter_map(|e| e.greedy.as_deref().cloned()).collect();
        let role = |name: &'static str| {
            move |r: &Record| r.reward.get(name).and_then(|s| s.as_ref()?.mean)
        };
        let k = window.clamp(1, run.steps.len().max(1));
        let last = &run.steps[run.steps.len().saturating_sub(k)..];
        let roles = ["solver", "evaluator", "scorer"]
            .map(|n| num(mean(last.iter().filter_map(role(n)))))
            .join(" / ");
        let right = pooled(run.steps.iter().map(|r| &r.solver_reward_by_correctness.correct));
        let wrong = pooled(run.steps.iter().map(|r| &r.solver_reward_by_correctness.wrong));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {} | {} | {} | {roles} | {} (n={}) vs {} (n={}) |",
            run.steps.len(),
            trend(&run.evals, Record::accuracy, pct),
            trend(&greedy, Record::accuracy, pct),
            window_trend(&run.steps, window, Record::accuracy, pct),
            window_trend(&run.steps, window, |r| r.parse_failure_rate.map(|f| 1.0 - f), pct),
            window_trend(&run.steps, window, |r| r.approval_rate, pct),
            num(right.mean),
            right.count,
            num(wrong.mean),
            wrong.count,
        );
    }
    out
}

pub fn run(args: Args) -> Result<()> {
    if args.window == 0 {
        bail!("--window must be at least 1");
    }
    for (i, (label, _)) in args.runs.iter().enumerate() {
        if args.runs[..i].iter().any(|(l, _)| l == label) {
            bail!("--run: the label `{label}` is given twice; give each run its own");
        }
    }
    let mut runs = Vec::with_capacity(args.runs.len());
    for (label, path) in &args.runs {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read the metrics log of `{label}`: {}", path.display())
        })?;
        runs.push((label.clone(), parse(&text, &path.display().to_string())?));
    }
    print!("{}", table(&runs, args.window));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = concat!(
        r#"{"kind":"eval","after_steps":0,"accuracy":{"last_round":0.25},"greedy":{"accuracy":{"last_round":0.5}},"seconds":{"total":60}}"#,
        "\n",
        r#"{"kind":"step","step":0,"reward":{"solver":{"mean":0.5,"count":4},"evaluator":{"mean":0.5,"count":4},"scorer":{"mean":-0.5,"count":4}},"parse_failure_rate":0.5,"approval_rate":0.2,"accuracy":{"last_round":0.0},"solver_reward_by_correctness":{"correct":{"mean":1.0,"count":1},"wrong":{"mean":0.5,"count":3}},"seconds":{"total":120}}"#,
        "\n",
        r#"{"kind":"step","step":1,"reward":{"solver":{"mean":0.7,"count":4},"evaluator":{"mean":0.3,"count":4},"scorer":{"mean":0.0,"count":4}},"parse_failure_rate":0.0,"approval_rate":0.6,"accuracy":{"last_round":0.5},"solver_reward_by_correctness":{"correct":{"mean":0.5,"count":1},"wrong":{"mean":0.0,"count":1}},"seconds":{"total":120}}"#,
        "\n",
        r#"{"kind":"eval","after_steps":2,"accuracy":{"last_round":0.75},"greedy":{"accuracy":{"last_round":1.0}},"seconds":{"total":60}}"#,
        "\n"
    );

    #[test]
    fn a_row_reads_trends_means_and_pooled_rewards() {
        let run = parse(LOG, "log").unwrap();
        assert_eq!((run.steps.len(), run.evals.len()), (2, 2));
        let t = table(&[("comas".into(), run)], 1);
        let row = t.lines().nth(2).unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(
            cells[1..10],
            [
                "comas",
                "2",
                "25.0% → 75.0%",
                "50.0% → 100.0%",
                "0.0% → 50.0%",
                "50.0% → 100.0%",
                "20.0% → 60.0%",
                "+0.700 / +0.300 / +0.000",
                "+0.750 (n=2) vs +0.375 (n=4)"
            ]
        );
    }

    #[test]
    fn a_role_nobody_played_is_a_gap_not_an_error() {
        // no_scoring has no scorer turns: its reward is logged as null.
        let log = r#"{"kind":"step","step":0,"reward":{"solver":{"mean":0.25,"count":4},"evaluator":{"mean":1.0,"count":8},"scorer":null}}"#;
        let t = table(&[("no_scoring".into(), parse(log, "log").unwrap())], 1);
        let cells: Vec<&str> = t.lines().nth(2).unwrap().split('|').map(str::trim).collect();
        assert_eq!(cells[8], format!("+0.250 / +1.000 / {}", num(None)));
    }

    /// Another method's records: the accuracies its summary gives, no CoMAS columns.
    #[test]
    fn a_grpo_run_reads_its_own_accuracy() {
        let log = concat!(
            r#"{"kind":"eval","after_steps":0,"method":"grpo","accuracy":{"mean":0.25,"count":8},"reward":{"mean":0.3,"count":8},"greedy":{"method":"grpo","accuracy":{"mean":0.5,"count":8}}}"#,
            "\n",
            r#"{"kind":"step","step":0,"method":"grpo","accuracy":{"mean":0.125,"count":8},"reward":{"mean":0.0125,"count":8}}"#,
            "\n",
            r#"{"kind":"eval","after_steps":1,"method":"grpo","accuracy":{"mean":0.75,"count":8},"greedy":{"method":"grpo","accuracy":{"mean":1.0,"count":8}}}"#,
            "\n"
        );
        let t = table(&[("grpo".into(), parse(log, "log").unwrap())], 1);
        let cells: Vec<&str> = t.lines().nth(2).unwrap().split('|').map(str::trim).collect();
        assert_eq!(cells[1..6], ["grpo", "1", "25.0% → 75.0%", "50.0% → 100.0%", "12.5% → 12.5%"]);
        assert_eq!(cells[6..8], ["– → –", "– → –"]);
    }

    #[test]
    fn bad_input_says_what_it_is() {
        let e = parse("{\"kind\":\"step\"\n", "x.jsonl").unwrap_err();
        assert!(format!("{e:#}").contains("x.jsonl, line 1"), "{e:#}");
        let e = parse("{\"kind\":\"other\"}\n", "y.jsonl").unwrap_err().to_string();
        assert!(e.contains("no step or evaluation records"), "{e}");
        assert!(parse_run("nolabel").unwrap_err().contains("LABEL=PATH"));
        assert_eq!(
            parse_run("a=b/c.jsonl").unwrap(),
            ("a".to_string(), PathBuf::from("b/c.jsonl"))
        );
    }
}
