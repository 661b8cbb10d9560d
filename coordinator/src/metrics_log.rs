//! A job's metrics log (`metrics.jsonl`) and its TensorBoard event file. The store is the truth:
//! when a run starts, both files are rewritten from it once, so a run that died between the
//! store and the files (or left a torn line) still ends with exactly one record per step; then
//! every committed step and evaluation is appended, its own bytes only. Writing stays O(1) per
//! step however long the job (rewriting the whole log each step was O(steps²)). A failed write
//! is logged, never fatal.
use crate::error::Result;
use crate::store::Store;
use crate::tensorboard;
use std::io::Write;
use std::path::{Path, PathBuf};

pub(crate) struct MetricsLog {
    path: PathBuf,
    events: PathBuf,
}

impl MetricsLog {
    /// The files of job `id` under `path`'s folder, rewritten from the store.
    pub(crate) fn open(store: &Store, id: &str, path: &Path) -> Result<MetricsLog> {
        let log = MetricsLog {
            path: path.to_path_buf(),
            events: tensorboard::path(path.parent().unwrap_or(Path::new(".")), id),
        };
        let lines = store.metrics_log(id)?;
        if let Err(e) = keep_another_jobs_log(&log.path, id) {
            tracing::warn!(path = %log.path.display(), error = %e, "cannot move another job's metrics log aside");
        }
        if let Err(e) = crate::files::write_lines(&log.path, &lines) {
            tracing::warn!(path = %log.path.display(), error = %e, "cannot write the metrics log");
        }
        // Without records there is no event file yet: its header carries the first record's time.
        let written = if lines.is_empty() {
            std::fs::remove_file(&log.events).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
        } else {
            tensorboard::encode(&lines)
                .map_err(std::io::Error::other)
                .and_then(|bytes| tensorboard::sync(&log.events, &bytes))
        };
        if let Err(e) = written {
            tracing::warn!(path = %log.events.display(), error = %e, "cannot write the TensorBoard event file");
        }
        Ok(log)
    }

    /// Appends one record (already committed to the store) to both files.
    pub(crate) fn append(&self, line: &str) {
        if let Err(e) = append_line(&self.path, line) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot append to the metrics log");
        }
        let written = tensorboard::encode_next(line, &self.events)
            .map_err(std::io::Error::other)
            .and_then(|bytes| append_bytes(&self.events, &bytes));
        if let Err(e) = written {
            tracing::warn!(path = %self.events.display(), error = %e, "cannot append to the TensorBoard event file");
        }
    }
}

/// A log that another job left at `path` (a job run again, or a new one, in the same output
/// folder) is moved aside to `metrics-<its job id>.jsonl` beside it rather than overwritten.
/// A log of job `id` itself (a resumed run) stays where it is, to be rewritten from the store.
fn keep_another_jobs_log(path: &Path, id: &str) -> std::io::Result<()> {
    use std::io::BufRead;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut first = String::new();
    std::io::BufReader::new(file).read_line(&mut first)?;
    if first.trim().is_empty() {
        return Ok(());
    }
    let owner = serde_json::from_str::<serde_json::Value>(&first)
        .ok()
        .and_then(|v| v.get("job_id").and_then(|j| j.as_str()).map(str::to_string));
    if owner.as_deref() == Some(id) {
        return Ok(());
    }
    let stem = owner
        .map(|o| {
            o.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
        })
        .unwrap_or_else(|| "unknown".to_string());
    let dir = path.parent().unwrap_or(Path::new("."));
    let aside = (0..)
        .map(|n| {
            dir.join(if n == 0 {
                format!("metrics-{stem}.jsonl")
            } else {
                format!("metrics-{stem}-{n}.jsonl")
            })
        })
        .find(|p| !p.exists())
        .expect("some name is free");
    std::fs::rename(path, &aside)?;
    tracing::warn!(
        job = id,
        kept = %aside.display(),
        "the output folder held another job's metrics log; it is kept under a new name"
    );
    Ok(())
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    append_bytes(path, text.as_bytes())
}

/// Appends `bytes` and syncs them (nothing when there are none).
fn append_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(bytes)?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(kind: &str, step: u64) -> String {
        json!({"kind": kind, "job_id": "j", "step": step, "after_steps": step, "unix_time": 100.0 + step as f64, "reward_mean": 0.5}).to_string()
    }

    /// Appending record by record writes each record's bytes once and ends with the same files
    /// the rewrite makes; a reopened log heals a torn or extra tail from the store.
    #[test]
    fn records_are_appended_once_and_a_reopened_log_heals_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::in_memory().unwrap();
        store.insert_job("j", "x", "name = \"x\"", "", 3).unwrap();
        let path = dir.path().join("out/metrics.jsonl");
        let log = MetricsLog::open(&store, "j", &path).unwrap();
        let events = tensorboard::path(&dir.path().join("out"), "j");
        assert!(!events.exists(), "no event file before the first record");
        let mut lines = Vec::new();
        let mut sizes = Vec::new();
        for step in 0..3 {
            let l = line("step", step);
            store.commit_step("j", step, &l, &[(0, step + 1)], false).unwrap();
            log.append(&l);
            lines.push(l);
            sizes.push((
                std::fs::metadata(&path).unwrap().len(),
                std::fs::metadata(&events).unwrap().len(),
            ));
        }
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            lines.iter().map(|l| format!("{l}\n")).collect::<String>()
        );
        assert_eq!(std::fs::read(&events).unwrap(), tensorboard::encode(&lines).unwrap());
        // Each step adds its own line and event: the same bytes each time (records of one size).
        let grew: Vec<(u64, u64)> =
            sizes.windows(2).map(|w| (w[1].0 - w[0].0, w[1].1 - w[0].1)).collect();
        assert_eq!(grew[0], grew[1]);
        assert_eq!(grew[0].0, lines[1].len() as u64 + 1);
        // A crash after the store committed step 2's line but mid-append: torn tails.
        std::fs::write(&path, format!("{}\n{}\n{}", lines[0], lines[1], &lines[2][..10])).unwrap();
        let torn = std::fs::read(&events).unwrap();
        std::fs::write(&events, &torn[..torn.len() - 5]).unwrap();
        let _log = MetricsLog::open(&store, "j", &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
        assert_eq!(std::fs::read(&events).unwrap(), tensorboard::encode(&lines).unwrap());
    }

    /// A new job in a finished job's output folder keeps that job's log under its id; a resumed
    /// job rewrites its own.
    #[test]
    fn another_jobs_log_is_moved_aside_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::in_memory().unwrap();
        store.insert_job("k", "y", "name = \"y\"", "", 3).unwrap();
        let path = dir.path().join("metrics.jsonl");
        let old = format!("{}\n{}\n", line("step", 0), line("step", 1));
        std::fs::write(&path, &old).unwrap();
        let log = MetricsLog::open(&store, "k", &path).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("metrics-j.jsonl")).unwrap(), old);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        let mine = line("step", 0).replace("\"j\"", "\"k\"");
        store.commit_step("k", 0, &mine, &[(0, 1)], false).unwrap();
        log.append(&mine);
        // Reopened (the job resumed): its own log stays, nothing more is set aside.
        let _again = MetricsLog::open(&store, "k", &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{mine}\n"));
        // A second foreign log of the same job id does not replace the first one kept.
        std::fs::write(&path, &old).unwrap();
        let _third = MetricsLog::open(&store, "k", &path).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("metrics-j-1.jsonl")).unwrap(), old);
        assert_eq!(std::fs::read_to_string(dir.path().join("metrics-j.jsonl")).unwrap(), old);
    }
}
