//! The DSBench outcome block (spec 7): the Analyst's `submission.csv` against the task's hidden
//! answers. It is shown to the Analyst's coach and logged; it never enters the reward directly.
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    Classification,
    Regression,
}

/// What the submission scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DsOutcome {
    /// A submission file was found and evaluated.
    pub success: bool,
    pub kind: Option<DataKind>,
    /// The metric the task description names (roc_auc, rmse, mae, log_loss, f1, accuracy, mse).
    pub task_metric: Option<String>,
    /// Rows of the submission that matched a test id, and rows expected.
    pub predictions: usize,
    pub expected: usize,
    /// Metric name → value (accuracy, f1, roc_auc; rmse, mse, mae and the target's statistics).
    pub metrics: BTreeMap<String, f64>,
    /// Why nothing could be evaluated.
    pub error: Option<String>,
}

/// The metric a task description asks for, by the first name found (spec 7.4).
pub fn task_metric(description: &str) -> Option<&'static str> {
    let d = description.to_ascii_lowercase();
    let names: [(&str, &[&str]); 7] = [
        ("roc_auc", &["roc auc", "roc-auc", "roc_auc", "auc"]),
        ("log_loss", &["log loss", "logloss", "log_loss"]),
        ("rmse", &["rmse", "root mean squared error"]),
        ("mae", &["mae", "mean absolute error"]),
        ("mse", &["mse", "mean squared error"]),
        ("f1", &["f1"]),
        ("accuracy", &["accuracy"]),
    ];
    names.iter().filter_map(|(name, words)| words.iter().filter_map(|w| d.find(w)).min().map(|at| (at, *name))).min().map(|(_, n)| n)
}

/// Rows of a CSV text: the header and the records (short rows padded, none dropped).
fn read_csv(text: &str) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
    let mut r = csv::ReaderBuilder::new().flexible(true).from_reader(text.as_bytes());
    let header: Vec<String> = r.headers().map_err(|e| e.to_string())?.iter().map(|h| h.trim().to_string()).collect();
    let mut rows = Vec::new();
    for rec in r.records() {
        let rec = rec.map_err(|e| e.to_string())?;
        rows.push(rec.iter().map(|v| v.trim().to_string()).collect());
    }
    Ok((header, rows))
}

/// A class label in a canonical spelling: booleans and whole numbers as integers.
fn label(v: &str) -> Option<String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" => return Some("1".into()),
        "false" | "no" => return Some("0".into()),
        _ => {}
    }
    let f: f64 = v.parse().ok()?;
    (f.fract() == 0.0 && f.is_finite()).then(|| format!("{}", f as i64))
}

/// Classification when every answer is a boolean or a whole number, with at most 10 distinct
/// values that repeat (two classes always count; whole numbers that are all different are a
/// quantity, not classes).
fn kind_of(values: &[String]) -> DataKind {
    let labels: Option<Vec<String>> = values.iter().map(|v| label(v)).collect();
    let Some(l) = labels else { return DataKind::Regression };
    let distinct = l.iter().collect::<std::collections::BTreeSet<_>>().len();
    if distinct <= 2 || (distinct <= 10 && 2 * distinct <= l.len()) {
        DataKind::Classification
    } else {
        DataKind::Regression
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// ROC AUC of scores against 0/1 truths: the Mann–Whitney statistic, ties counted half.
pub fn roc_auc(truth: &[bool], scores: &[f64]) -> Option<f64> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut ranks = vec![0.0; scores.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && scores[idx[j + 1]] == scores[idx[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for k in i..=j {
            ranks[idx[k]] = avg;
        }
        i = j + 1;
    }
    let pos = truth.iter().filter(|&&t| t).count() as f64;
    let neg = truth.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return None;
    }
    let rank_sum: f64 = truth.iter().zip(&ranks).filter(|(t, _)| **t).map(|(_, r)| r).sum();
    Some((rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg))
}

/// The last fenced ```` ```csv ```` block of a reply: the predictions an Analyst wrote out in
/// its text when it saved no file (spec 7.1's last fallback).
pub fn predictions_in_text(text: &str) -> Option<String> {
    let start = text.rfind("```csv")? + "```csv".len();
    let rest = &text[start..];
    let end = rest.find("```")?;
    Some(rest[..end].trim().to_string()).filter(|s| s.contains(','))
}

/// Scores `submission` (the Analyst's CSV: an id column and a prediction column) against
/// `answers` (the test ids and their true targets); `description` names the task's metric.
pub fn evaluate(submission: Option<&str>, answers: &str, description: &str) -> DsOutcome {
    let mut out = DsOutcome {
        success: false,
        kind: None,
        task_metric: task_metric(description).map(str::to_string),
        predictions: 0,
        expected: 0,
        metrics: BTreeMap::new(),
        error: None,
    };
    let (ah, arows) = match read_csv(answers) {
        Ok(t) if t.0.len() >= 2 => t,
        _ => {
            out.error = Some("the task's answers are not a CSV of id and target".into());
            return out;
        }
    };
    out.expected = arows.len();
    let Some(text) = submission else {
        out.error = Some("No predictions found (check submission.csv)".into());
        return out;
    };
    let (sh, srows) = match read_csv(text) {
        Ok(t) if t.0.len() >= 2 => t,
        Ok(_) => {
            out.error = Some("submission.csv needs an id column and a prediction column".into());
            return out;
        }
        Err(e) => {
            out.error = Some(format!("submission.csv is not a CSV: {e}"));
            return out;
        }
    };
    // The id and target columns by the answers' names, else the first two.
    let col = |name: &str, fallback: usize| sh.iter().position(|h| h.eq_ignore_ascii_case(name)).unwrap_or(fallback);
    let (sid, starget) = (col(&ah[0], 0), col(&ah[1], 1));
    let predicted: HashMap<&str, &str> = srows.iter().filter_map(|r| Some((r.get(sid)?.as_str(), r.get(starget)?.as_str()))).collect();
    let pairs: Vec<(&str, &str)> = arows.iter().filter_map(|r| Some((r.get(1)?.as_str(), *predicted.get(r.first()?.as_str())?))).collect();
    out.predictions = pairs.len();
    if pairs.is_empty() {
        out.error = Some(format!("submission.csv has no prediction for any test id (it has {} rows)", srows.len()));
        return out;
    }
    let truths: Vec<String> = arows.iter().filter_map(|r| r.get(1).cloned()).collect();
    let kind = kind_of(&truths);
    out.kind = Some(kind);
    out.success = true;
    let m = &mut out.metrics;
    match kind {
        DataKind::Classification => {
            let truth: Vec<String> = pairs.iter().map(|(t, _)| label(t).unwrap_or_default()).collect();
            // A probability in [0, 1] is read as the score of class 1, and thresholded at 0.5.
            let scores: Vec<Option<f64>> = pairs.iter().map(|(_, p)| p.parse::<f64>().ok().filter(|v| (0.0..=1.0).contains(v))).collect();
            let pred: Vec<String> = pairs
                .iter()
                .zip(&scores)
                .map(|((_, p), s)| label(p).or_else(|| s.map(|v| if v >= 0.5 { "1".into() } else { "0".into() })).unwrap_or_else(|| p.to_string()))
                .collect();
            let n = truth.len() as f64;
            m.insert("accuracy".into(), truth.iter().zip(&pred).filter(|(t, p)| t == p).count() as f64 / n);
            let classes: std::collections::BTreeSet<&String> = truth.iter().collect();
            let f1_of = |c: &String| {
                let tp = truth.iter().zip(&pred).filter(|(t, p)| *t == c && *p == c).count() as f64;
                let fp = truth.iter().zip(&pred).filter(|(t, p)| *t != c && *p == c).count() as f64;
                let fneg = truth.iter().zip(&pred).filter(|(t, p)| *t == c && *p != c).count() as f64;
                if tp == 0.0 {
                    0.0
                } else {
                    2.0 * tp / (2.0 * tp + fp + fneg)
                }
            };
            let binary = classes.len() <= 2 && classes.iter().all(|c| c.as_str() == "0" || c.as_str() == "1");
            let f1 = if binary { f1_of(&"1".to_string()) } else { classes.iter().map(|c| f1_of(c)).sum::<f64>() / classes.len().max(1) as f64 };
            m.insert("f1".into(), f1);
            if binary {
                let t: Vec<bool> = truth.iter().map(|x| x == "1").collect();
                let s: Vec<f64> = scores.iter().zip(&pred).map(|(s, p)| s.unwrap_or(if p == "1" { 1.0 } else { 0.0 })).collect();
                if let Some(auc) = roc_auc(&t, &s) {
                    m.insert("roc_auc".into(), auc);
                }
            }
        }
        DataKind::Regression => {
            let xy: Vec<(f64, f64)> = pairs.iter().filter_map(|(t, p)| Some((t.parse().ok()?, p.parse().ok()?))).collect();
            if xy.is_empty() {
                out.success = false;
                out.error = Some("no prediction in submission.csv is a number".into());
                return out;
            }
            let n = xy.len() as f64;
            let mse = xy.iter().map(|(t, p)| (t - p).powi(2)).sum::<f64>() / n;
            m.insert("mse".into(), mse);
            m.insert("rmse".into(), mse.sqrt());
            m.insert("mae".into(), xy.iter().map(|(t, p)| (t - p).abs()).sum::<f64>() / n);
            let mut all: Vec<f64> = truths.iter().filter_map(|t| t.parse().ok()).collect();
            all.sort_by(f64::total_cmp);
            let (min, max) = (all[0], all[all.len() - 1]);
            let mean = all.iter().sum::<f64>() / all.len() as f64;
            let std = (all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / all.len() as f64).sqrt();
            let (q25, q50, q75) = (quantile(&all, 0.25), quantile(&all, 0.5), quantile(&all, 0.75));
            for (k, v) in [
                ("target_min", min),
                ("target_max", max),
                ("target_range", max - min),
                ("target_q25", q25),
                ("target_median", q50),
                ("target_q75", q75),
                ("target_mean", mean),
                ("target_std", std),
            ] {
                m.insert(k.into(), v);
            }
            if max > min {
                m.insert("rmse_pct_range".into(), 100.0 * mse.sqrt() / (max - min));
            }
            if q75 > q25 {
                m.insert("rmse_pct_iqr".into(), 100.0 * mse.sqrt() / (q75 - q25));
            }
        }
    }
    out
}

impl DsOutcome {
    /// The block the Analyst's coach reads (spec 7.5).
    pub fn render(&self) -> String {
        if let Some(e) = &self.error {
            return format!("ERROR: {e}");
        }
        let kind = match self.kind {
            Some(DataKind::Classification) => "classification",
            Some(DataKind::Regression) => "regression",
            None => "unknown",
        };
        let mut s = format!(
            "Data type: {kind}\nTask-specified metric: {}\nNumber of predictions: {} (of {} test rows)\nComputed metrics:\n",
            self.task_metric.as_deref().unwrap_or("not stated"),
            self.predictions,
            self.expected
        );
        let lines: [(&str, &str, &str); 8] = [
            ("accuracy", "Accuracy", "higher is better, max 1.0"),
            ("f1", "F1", "higher is better, max 1.0"),
            ("roc_auc", "ROC AUC", "higher is better, max 1.0"),
            ("rmse", "RMSE", "lower is better"),
            ("mse", "MSE", "lower is better"),
            ("mae", "MAE", "lower is better"),
            ("rmse_pct_range", "RMSE as % of range", "lower is better"),
            ("rmse_pct_iqr", "RMSE as % of IQR", "lower is better"),
        ];
        for (key, name, better) in lines {
            if let Some(v) = self.metrics.get(key) {
                s.push_str(&format!("  - {name}: {v:.4} ({better})\n"));
            }
        }
        if self.kind == Some(DataKind::Regression) {
            let g = |k: &str| self.metrics.get(k).copied().unwrap_or(f64::NAN);
            s.push_str(&format!(
                "Target statistics: min {:.4}, max {:.4}, range {:.4}, Q25 {:.4}, median {:.4}, Q75 {:.4}, mean {:.4}, std {:.4}\n",
                g("target_min"),
                g("target_max"),
                g("target_range"),
                g("target_q25"),
                g("target_median"),
                g("target_q75"),
                g("target_mean"),
                g("target_std")
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_by_hand() {
        // Positives scored 0.9 and 0.4, negatives 0.5 and 0.1: 3 of 4 pairs ordered right.
        assert_eq!(roc_auc(&[true, true, false, false], &[0.9, 0.4, 0.5, 0.1]), Some(0.75));
        // A tie between a positive and a negative counts half.
        assert_eq!(roc_auc(&[true, false], &[0.5, 0.5]), Some(0.5));
        assert_eq!(roc_auc(&[true, true], &[0.5, 0.1]), None);
    }

    #[test]
    fn a_classification_submission_by_hand() {
        let answers = "id,churned\n1,1\n2,0\n3,1\n4,0\n5,1\n";
        // Rows out of order, one id missing (5), probabilities as predictions.
        let sub = "id,churned\n3,0.2\n1,0.9\n2,0.6\n4,0.1\n";
        let o = evaluate(Some(sub), answers, "Submissions are evaluated on ROC AUC.");
        assert!(o.success && o.kind == Some(DataKind::Classification));
        assert_eq!((o.predictions, o.expected, o.task_metric.as_deref()), (4, 5, Some("roc_auc")));
        // Labels at 0.5: 1 1 0 0 against truths 1 0 1 0 -> accuracy 0.5; F1 of class 1: tp 1, fp 1, fn 1 -> 0.5.
        assert_eq!((o.metrics["accuracy"], o.metrics["f1"]), (0.5, 0.5));
        // Scores of positives 0.9, 0.2; negatives 0.6, 0.1: pairs right 0.9>0.6, 0.9>0.1, 0.2>0.1 = 3 of 4.
        assert_eq!(o.metrics["roc_auc"], 0.75);
        let block = o.render();
        assert!(block.contains("Data type: classification") && block.contains("  - ROC AUC: 0.7500 (higher is better, max 1.0)"), "{block}");
    }

    #[test]
    fn a_regression_submission_by_hand() {
        let answers = "id,price\n1,10\n2,20\n3,30\n4,40\n5,50\n";
        let sub = "id,price\n1,12\n2,18\n3,30\n4,44\n5,50\n";
        let o = evaluate(Some(sub), answers, "evaluated on RMSE");
        assert_eq!(o.kind, Some(DataKind::Regression));
        // Errors 2, -2, 0, 4, 0: MSE 24/5 = 4.8, MAE 8/5 = 1.6.
        assert!((o.metrics["mse"] - 4.8).abs() < 1e-12 && (o.metrics["mae"] - 1.6).abs() < 1e-12);
        assert!((o.metrics["rmse_pct_range"] - 100.0 * 4.8f64.sqrt() / 40.0).abs() < 1e-9);
        assert_eq!((o.metrics["target_q25"], o.metrics["target_median"], o.metrics["target_q75"]), (20.0, 30.0, 40.0));
        assert!(o.render().contains("Target statistics: min 10.0000, max 50.0000"));
    }

    #[test]
    fn predictions_written_in_the_text_are_the_last_csv_block() {
        let text = "Here they are:\n```csv\nid,y\n1,0\n```\nand corrected:\n```csv\nid,y\n1,1\n2,0\n```\n";
        assert_eq!(predictions_in_text(text).as_deref(), Some("id,y\n1,1\n2,0"));
        assert_eq!(predictions_in_text("no block"), None);
        assert_eq!(predictions_in_text("```csv\nunfinished"), None);
        let o = evaluate(predictions_in_text(text).as_deref(), "id,y\n1,1\n2,1\n", "");
        assert_eq!(o.metrics["accuracy"], 0.5);
    }

    #[test]
    fn no_submission_and_bad_ones_say_what_is_wrong() {
        let answers = "id,y\n1,1\n2,0\n";
        assert_eq!(evaluate(None, answers, "").render(), "ERROR: No predictions found (check submission.csv)");
        assert!(evaluate(Some("id\n1\n"), answers, "").render().contains("an id column and a prediction column"));
        assert!(evaluate(Some("id,y\n7,1\n"), answers, "").render().contains("no prediction for any test id"));
        assert_eq!(task_metric("We use mean absolute error (MAE)."), Some("mae"));
        assert_eq!(task_metric("Scored by accuracy"), Some("accuracy"));
        assert_eq!(task_metric("no metric here"), None);
    }
}
