//! Job state in an embedded SQLite database: jobs, completed steps with their metrics, each
//! agent's weight version, and the episodes of the step in progress. A step commits in one
//! transaction, so after a restart a job continues from its last completed step and keeps the
//! episodes of the unfinished step that had already come back.
use crate::error::{CoordinatorError, Result};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            other => {
                return Err(CoordinatorError::Store(format!(
                    "unknown job state `{other}` in the database"
                )))
            }
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: String,
    pub name: String,
    /// The job file as submitted.
    pub spec: String,
    pub base_dir: String,
    pub state: JobState,
    pub error: String,
    pub created: f64,
    pub updated: f64,
    pub steps_done: u64,
    pub total_steps: u64,
}

pub struct Store {
    conn: Mutex<Connection>,
    /// Held for the store's life: one coordinator per database. Two would both drive the same
    /// running job and split its episodes between them.
    _lock: Option<std::fs::File>,
}

/// Takes the exclusive lock beside the database (`PATH.lock`).
fn lock(path: &Path) -> Result<std::fs::File> {
    let lock_path = path.with_extension(match path.extension() {
        Some(e) => format!("{}.lock", e.to_string_lossy()),
        None => "lock".into(),
    });
    comas_service::exclusive_lock(&lock_path).map_err(|e| {
        CoordinatorError::Store(match e {
            comas_service::LockError::Held { holder, .. } => format!(
                "{} is in use by another coordinator ({holder}, lock {}); stop it first, or give this one its own database (--db, or --dir for comas local)",
                path.display(),
                lock_path.display()
            ),
            other => other.to_string(),
        })
    })
}

pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn db(e: rusqlite::Error) -> CoordinatorError {
    CoordinatorError::Store(e.to_string())
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    base_dir TEXT NOT NULL,
    state TEXT NOT NULL,
    error TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    steps_done INTEGER NOT NULL DEFAULT 0,
    -- The questions of a step are a pure function of (seed, step), so no data cursor is kept.
    total_steps INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    job_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    finished REAL NOT NULL,
    PRIMARY KEY (job_id, step)
);
CREATE TABLE IF NOT EXISTS evals (
    job_id TEXT NOT NULL,
    -- Completed training steps when the evaluation ran (0 = the base models).
    after_steps INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    PRIMARY KEY (job_id, after_steps)
);
CREATE TABLE IF NOT EXISTS agent_versions (
    job_id TEXT NOT NULL,
    agent INTEGER NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (job_id, agent)
);
CREATE TABLE IF NOT EXISTS episodes (
    job_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    episode_id TEXT NOT NULL,
    trajectory TEXT NOT NULL,
    worker TEXT NOT NULL,
    PRIMARY KEY (job_id, episode_id)
);
";

impl Store {
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| CoordinatorError::Store(format!("creating {}: {e}", dir.display())))?;
        }
        let lock = lock(path)?;
        let conn = Connection::open(path)
            .map_err(|e| CoordinatorError::Store(format!("opening {}: {e}", path.display())))?;
        // WAL with full sync: a committed step survives a crash of the process or the machine.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;",
        )
        .map_err(db)?;
        conn.execute_batch(SCHEMA).map_err(db)?;
        Ok(Self { conn: Mutex::new(conn), _lock: Some(lock) })
    }

    pub fn in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(db)?;
        conn.execute_batch(SCHEMA).map_err(db)?;
        Ok(Self { conn: Mutex::new(conn), _lock: None })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut c = self
            .conn
            .lock()
            .map_err(|_| CoordinatorError::Store("database lock poisoned".into()))?;
        f(&mut c).map_err(db)
    }

    pub fn insert_job(
        &self,
        id: &str,
        name: &str,
        spec: &str,
        base_dir: &str,
        total_steps: u64,
    ) -> Result<()> {
        let t = now();
        self.with(|c| {
            c.execute(
                "INSERT INTO jobs (id, name, spec, base_dir, state, created, updated, total_steps) VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?5, ?6)",
                params![id, name, spec, base_dir, t, total_steps as i64],
            )
            .map(|_| ())
        })
    }

    pub fn set_state(&self, id: &str, state: JobState, error: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = ?2, error = ?3, updated = ?4 WHERE id = ?1",
                params![id, state.as_str(), error, now()],
            )
            .map(|_| ())
        })
    }

    /// A row with its state still as text (a bad state is reported after the query).
    fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(JobRow, String)> {
        let row = JobRow {
            id: r.get(0)?,
            name: r.get(1)?,
            spec: r.get(2)?,
            base_dir: r.get(3)?,
            state: JobState::Queued,
            error: r.get(5)?,
            created: r.get(6)?,
            updated: r.get(7)?,
            steps_done: r.get::<_, i64>(8)? as u64,
            total_steps: r.get::<_, i64>(9)? as u64,
        };
        Ok((row, r.get(4)?))
    }

    fn to_job((mut row, state): (JobRow, String)) -> Result<JobRow> {
        row.state = JobState::parse(&state)?;
        Ok(row)
    }

    const COLUMNS: &'static str =
        "id, name, spec, base_dir, state, error, created, updated, steps_done, total_steps";

    pub fn get_job(&self, id: &str) -> Result<Option<JobRow>> {
        let sql = format!("SELECT {} FROM jobs WHERE id = ?1", Self::COLUMNS);
        let t = self.with(|c| c.query_row(&sql, params![id], Self::row).optional())?;
        t.map(Self::to_job).transpose()
    }

    /// Every job, oldest first.
    pub fn list_jobs(&self) -> Result<Vec<JobRow>> {
        let sql = format!("SELECT {} FROM jobs ORDER BY seq", Self::COLUMNS);
        let rows = self.with(|c| {
            c.prepare(&sql)?.query_map([], Self::row)?.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter().map(Self::to_job).collect()
    }

    /// Stores an episode's trajectory once: false when this episode id was already stored.
    pub fn record_episode(
        &self,
        job: &str,
        step: u64,
        episode_id: &str,
        trajectory: &str,
        worker: &str,
    ) -> Result<bool> {
        self.with(|c| {
            c.execute(
                "INSERT OR IGNORE INTO episodes (job_id, step, episode_id, trajectory, worker) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![job, step as i64, episode_id, trajectory, worker],
            )
            .map(|n| n == 1)
        })
    }

    /// Episodes of `step` already back, as (episode id, trajectory JSON).
    pub fn step_episodes(&self, job: &str, step: u64) -> Result<Vec<(String, String)>> {
        self.with(|c| {
            c.prepare("SELECT episode_id, trajectory FROM episodes WHERE job_id = ?1 AND step = ?2 ORDER BY episode_id")?
                .query_map(params![job, step as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
    }

    /// Finishes a step atomically: its metrics and the new weight versions go in together, and
    /// its episodes are dropped (their experiences are trained) unless `keep_episodes` (an
    /// evaluation job's transcripts are its result, which the client fetches).
    pub fn commit_step(
        &self,
        job: &str,
        step: u64,
        metrics: &str,
        versions: &[(u32, u64)],
        keep_episodes: bool,
    ) -> Result<()> {
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("INSERT OR REPLACE INTO steps (job_id, step, metrics, finished) VALUES (?1, ?2, ?3, ?4)", params![job, step as i64, metrics, now()])?;
            for (agent, version) in versions {
                tx.execute(
                    "INSERT OR REPLACE INTO agent_versions (job_id, agent, version) VALUES (?1, ?2, ?3)",
                    params![job, i64::from(*agent), *version as i64],
                )?;
            }
            tx.execute("UPDATE jobs SET steps_done = ?2, updated = ?3 WHERE id = ?1", params![job, (step + 1) as i64, now()])?;
            if !keep_episodes {
                tx.execute("DELETE FROM episodes WHERE job_id = ?1 AND step <= ?2", params![job, step as i64])?;
            }
            tx.commit()
        })
    }

    /// Rolls a job back to `steps` completed steps, in one transaction: the records of the
    /// steps from `steps` on, the evaluations after more steps and those steps' stored episodes
    /// are dropped, and no agent's version is above `steps`.
    pub fn rewind(&self, job: &str, steps: u64) -> Result<()> {
        let k = steps as i64;
        self.with(|c| {
            let tx = c.transaction()?;
            tx.execute("DELETE FROM steps WHERE job_id = ?1 AND step >= ?2", params![job, k])?;
            tx.execute(
                "DELETE FROM evals WHERE job_id = ?1 AND after_steps > ?2",
                params![job, k],
            )?;
            tx.execute("DELETE FROM episodes WHERE job_id = ?1 AND step >= ?2", params![job, k])?;
            tx.execute(
                "UPDATE agent_versions SET version = ?2 WHERE job_id = ?1 AND version > ?2",
                params![job, k],
            )?;
            tx.execute(
                "UPDATE jobs SET steps_done = ?2, updated = ?3 WHERE id = ?1",
                params![job, k, now()],
            )?;
            tx.commit()
        })
    }

    pub fn step_metrics(&self, job: &str) -> Result<Vec<String>> {
        self.with(|c| {
            c.prepare("SELECT metrics FROM steps WHERE job_id = ?1 ORDER BY step")?
                .query_map(params![job], |r| r.get(0))?
                .collect()
        })
    }

    pub fn record_eval(&self, job: &str, after_steps: u64, metrics: &str) -> Result<()> {
        self.with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO evals (job_id, after_steps, metrics) VALUES (?1, ?2, ?3)",
                params![job, after_steps as i64, metrics],
            )
            .map(|_| ())
        })
    }

    pub fn has_eval(&self, job: &str, after_steps: u64) -> Result<bool> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM evals WHERE job_id = ?1 AND after_steps = ?2",
                params![job, after_steps as i64],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
        })
    }

    /// The metrics log: every committed step and every evaluation, in the order they happened
    /// (the evaluation after k steps follows step k - 1).
    pub fn metrics_log(&self, job: &str) -> Result<Vec<String>> {
        self.with(|c| {
            c.prepare(
                "SELECT metrics FROM (SELECT step + 1 AS k, 0 AS e, metrics FROM steps WHERE job_id = ?1 \
                 UNION ALL SELECT after_steps AS k, 1 AS e, metrics FROM evals WHERE job_id = ?1) ORDER BY k, e",
            )?
            .query_map(params![job], |r| r.get(0))?
            .collect()
        })
    }

    pub fn versions(&self, job: &str) -> Result<Vec<(u32, u64)>> {
        self.with(|c| {
            c.prepare("SELECT agent, version FROM agent_versions WHERE job_id = ?1 ORDER BY agent")?
                .query_map(params![job], |r| {
                    Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u64))
                })?
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_commits_atomically_and_episodes_are_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        let s = Store::open(&path).unwrap();
        s.insert_job("j1", "demo", "name = 'demo'", "/tmp", 3).unwrap();
        assert!(s.record_episode("j1", 0, "e0", "{}", "w1").unwrap());
        assert!(
            !s.record_episode("j1", 0, "e0", "{\"other\":1}", "w2").unwrap(),
            "a second copy is ignored"
        );
        assert!(s.record_episode("j1", 0, "e1", "{}", "w1").unwrap());
        assert_eq!(s.step_episodes("j1", 0).unwrap().len(), 2);
        s.set_state("j1", JobState::Running, "").unwrap();
        s.commit_step("j1", 0, "{\"step\":0}", &[(0, 1), (1, 1)], false).unwrap();
        drop(s);
        // Reopened as after a crash: the committed step is there, its episodes are gone.
        let s = Store::open(&path).unwrap();
        let j = s.get_job("j1").unwrap().unwrap();
        assert_eq!((j.state, j.steps_done, j.total_steps), (JobState::Running, 1, 3));
        assert!(s.step_episodes("j1", 0).unwrap().is_empty());
        assert_eq!(s.versions("j1").unwrap(), vec![(0, 1), (1, 1)]);
        assert_eq!(s.step_metrics("j1").unwrap(), vec!["{\"step\":0}".to_string()]);
        s.record_eval("j1", 1, "after-1").unwrap();
        s.record_eval("j1", 0, "base").unwrap();
        assert!(s.has_eval("j1", 0).unwrap() && !s.has_eval("j1", 2).unwrap());
        assert_eq!(
            s.metrics_log("j1").unwrap(),
            vec!["base".to_string(), "{\"step\":0}".into(), "after-1".into()]
        );
        assert!(s.get_job("nope").unwrap().is_none());
        assert_eq!(s.list_jobs().unwrap().len(), 1);
    }

    #[test]
    fn a_rewound_job_keeps_exactly_what_came_before_its_step() {
        let s = Store::in_memory().unwrap();
        for job in ["j1", "j2"] {
            s.insert_job(job, "demo", "name = 'demo'", "/tmp", 6).unwrap();
            s.record_eval(job, 0, "base").unwrap();
            for step in 0..5u64 {
                let line = format!("{{\"step\":{step}}}");
                s.commit_step(job, step, &line, &[(0, step + 1), (1, 0)], false).unwrap();
                if step % 2 == 1 {
                    s.record_eval(job, step + 1, &format!("after-{}", step + 1)).unwrap();
                }
            }
            // Step 5's rollout was under way: two episodes back.
            s.record_episode(job, 5, "e0", "{}", "w1").unwrap();
            s.record_episode(job, 5, "e1", "{}", "w1").unwrap();
        }
        s.rewind("j1", 2).unwrap();
        let j = s.get_job("j1").unwrap().unwrap();
        assert_eq!(j.steps_done, 2);
        // The evaluation after 2 steps was of the weights the job goes back to: it stays.
        assert_eq!(
            s.metrics_log("j1").unwrap(),
            ["base", "{\"step\":0}", "{\"step\":1}", "after-2"]
        );
        assert_eq!(s.versions("j1").unwrap(), vec![(0, 2), (1, 0)]);
        assert!(s.step_episodes("j1", 5).unwrap().is_empty());
        // Another job is untouched.
        assert_eq!(s.get_job("j2").unwrap().unwrap().steps_done, 5);
        assert_eq!(s.metrics_log("j2").unwrap().len(), 8);
        assert_eq!(s.step_episodes("j2", 5).unwrap().len(), 2);
    }

    #[test]
    fn a_second_store_on_the_same_database_is_refused_with_the_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.sqlite");
        let first = Store::open(&path).unwrap();
        let err = Store::open(&path).err().expect("the database is taken").to_string();
        assert!(
            err.contains(&format!("process {}", std::process::id()))
                && err.contains("jobs.sqlite.lock"),
            "{err}"
        );
        drop(first);
        // Released with its holder: the next coordinator opens it.
        Store::open(&path).unwrap();
    }
}
