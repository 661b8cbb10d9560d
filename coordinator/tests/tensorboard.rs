//! The event files comas writes, read back with the PyPI `tensorboard` package's own reader
//! (`scripts/setup-tensorboard.sh` installs it into `.venv-tb`; `scripts/test.sh` runs that).
use comas_coordinator::tensorboard;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// {tag: [(step, value, wall_time)]} as TensorBoard reads the folder.
type Read = BTreeMap<String, Vec<(i64, f64, f64)>>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read_back(dir: &Path) -> Read {
    let python = root().join(".venv-tb/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `bash scripts/setup-tensorboard.sh` (scripts/test.sh does)",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root().join("tests/fixtures/read_tfevents.py"))
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "TensorBoard's reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw: BTreeMap<String, Vec<(i64, f64, f64)>> = serde_json::from_slice(&out.stdout).unwrap();
    raw
}

fn fixture() -> Vec<String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/metrics.jsonl"),
    )
    .unwrap();
    text.lines().map(str::to_string).collect()
}

#[test]
fn every_scalar_of_a_real_metrics_log_reads_back_at_its_step() {
    let lines = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = tensorboard::path(dir.path(), "job-x");
    tensorboard::sync(&path, &tensorboard::encode(&lines).unwrap()).unwrap();
    let read = read_back(path.parent().unwrap());

    // What should be there, from the records.
    let records: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut want: Read = BTreeMap::new();
    for r in &records {
        let s = tensorboard::scalars_of(r).expect("a step or evaluation record");
        for (tag, v) in s.values {
            want.entry(tag).or_default().push((s.step, v, s.wall_time));
        }
    }
    assert_eq!(read.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "the same tags");
    for (tag, points) in &want {
        let got = &read[tag];
        assert_eq!(got.len(), points.len(), "{tag}: one point per record");
        for ((s0, v0, t0), (s1, v1, t1)) in points.iter().zip(got) {
            assert_eq!(s0, s1, "{tag}: step");
            assert_eq!(*v0 as f32, *v1 as f32, "{tag} at step {s0}: value");
            assert!((t0 - t1).abs() < 1e-3, "{tag} at step {s0}: wall time {t0} vs {t1}");
        }
    }

    // Named metrics, checked against the records by hand: per role, per agent, evaluations.
    let (eval, step0, step1) = (&records[0], &records[1], &records[2]);
    let at = |tag: &str, step: i64| {
        read[tag].iter().find(|p| p.0 == step).unwrap_or_else(|| panic!("{tag} at {step}")).1 as f32
    };
    let num = |r: &Value, ptr: &str| r.pointer(ptr).unwrap().as_f64().unwrap() as f32;
    assert_eq!(at("reward/solver/mean", 0), num(step0, "/reward/solver/mean"));
    assert_eq!(at("reward/evaluator/mean", 1), num(step1, "/reward/evaluator/mean"));
    assert_eq!(at("agent1/train/loss", 0), num(step0, "/agents/1/train/loss"));
    assert_eq!(at("agent0/train/grad_norm", 1), num(step1, "/agents/0/train/grad_norm"));
    assert_eq!(at("completion_len/solver", 1), num(step1, "/completion_len/solver"));
    assert_eq!(at("seconds/rollout", 0), num(step0, "/seconds/rollout"));
    assert_eq!(at("eval/accuracy/last_round", 0), num(eval, "/accuracy/last_round"));
    assert_eq!(at("eval/greedy/accuracy/last_round", 0), num(eval, "/greedy/accuracy/last_round"));
    // A zero is written too (summary.proto keeps the value in a oneof).
    assert_eq!(at("reward/scorer/mean", 0), 0.0);
    // 3 records: the step scalars at steps 0 and 1, the evaluation's at 0.
    assert_eq!(read["reward/solver/mean"].iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(read["eval/reward/solver/mean"].iter().map(|p| p.0).collect::<Vec<_>>(), vec![0]);
}

#[test]
fn a_file_grown_record_by_record_reads_the_same_as_one_written_at_once() {
    let lines = fixture();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pa, pb) = (tensorboard::path(a.path(), "j"), tensorboard::path(b.path(), "j"));
    for n in 1..=lines.len() {
        tensorboard::sync(&pa, &tensorboard::encode(&lines[..n]).unwrap()).unwrap();
    }
    tensorboard::sync(&pb, &tensorboard::encode(&lines).unwrap()).unwrap();
    assert_eq!(std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
    let read = read_back(pa.parent().unwrap());
    assert_eq!(read["reward/solver/mean"].len(), 2);
}
