//! A job file checked into a [`Job`]: everything that needs no file system. The method reads
//! its own table; the checks here hold for every method and ask the method only what it says
//! of itself (where its tasks come from, whether it trains or calls frozen models).
use super::spec::SyncMode;
use super::{invalid, Job, JobError, JobSpec};
use crate::method::{JobView, TaskSource};
use crate::registry::MethodConfig;

impl JobSpec {
    /// Checks everything that needs no file system; `dataset_len` is the number of questions of
    /// the data set (ignored for a method whose tasks are generated or listed).
    pub fn check(&self, dataset_len: usize) -> Result<Job, JobError> {
        if self.name.trim().is_empty() {
            return Err(invalid("name", "must not be empty"));
        }
        for (k, a) in self.agents.iter().enumerate() {
            if let Some(id) = a.id {
                if id as usize != k {
                    return Err(invalid(
                        format!("agents[{k}].id"),
                        format!("is {id}; agent ids are their positions in the list (0, 1, ...), so this one must be {k}"),
                    ));
                }
            }
        }
        self.check_frozen_and_rollout()?;
        self.check_tracking()?;
        if self.agents.is_empty() && crate::registry::trains(&self.method) {
            return Err(invalid("agents", "list at least one [[agents]] table"));
        }
        let frozen: Vec<&str> = self.frozen.iter().map(|f| f.name.as_str()).collect();
        let view = JobView { agents: self.agents.len() as u32, frozen: &frozen };
        let method = MethodConfig::configure(&self.method, self.settings.clone(), &view)
            .unwrap_or_else(|| Err(invalid("method", crate::registry::unknown(&self.method))))?;
        if !method.calls_frozen() && !self.frozen.is_empty() {
            return Err(invalid(
                "frozen",
                format!("method {} calls no [[frozen]] models; remove them", self.method),
            ));
        }
        if !method.trains() {
            return self.check_evaluation_job(method);
        }
        let source = method.task_source();
        let dataset_len = self.check_data(source, dataset_len)?;
        let (total_steps, steps_per_epoch) = self.check_schedule(dataset_len)?;
        self.check_eval(source)?;
        let mut job = Job {
            spec: self.clone(),
            method,
            train: Vec::new(),
            total_steps,
            steps_per_epoch,
            dataset_len,
        };
        job.train = (0..self.agents.len()).map(|k| job.agent_train(k)).collect::<Result<_, _>>()?;
        job.method.check_training(&job.train)?;
        job.serve_init_adapters()?;
        Ok(job)
    }

    fn check_frozen_and_rollout(&self) -> Result<(), JobError> {
        for (k, f) in self.frozen.iter().enumerate() {
            if f.name.trim().is_empty() || self.frozen[..k].iter().any(|g| g.name == f.name) {
                return Err(invalid(
                    format!("frozen[{k}].name"),
                    format!("{:?} must be a non-empty name no other [[frozen]] model has", f.name),
                ));
            }
            f.check(k)?;
        }
        crate::train_config::check_dtype(&self.rollout.dtype)
            .map_err(|e| invalid("rollout.dtype", e.0))
    }

    fn check_tracking(&self) -> Result<(), JobError> {
        let t = &self.tracking;
        if let Some(url) = &t.mlflow {
            let host = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))
                .map(|rest| rest.split(['/', ':']).next().unwrap_or_default());
            if host.is_none_or(str::is_empty) {
                return Err(invalid(
                    "tracking.mlflow",
                    format!("{url:?} is not a tracking server's URL; write http://HOST:PORT, e.g. http://mlflow:5000"),
                ));
            }
        }
        for (key, v) in [("experiment", &t.experiment), ("run_name", &t.run_name)] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(invalid(
                    format!("tracking.{key}"),
                    "must not be empty; leave it out for the default",
                ));
            }
        }
        if t.mlflow.is_none() && (t.experiment.is_some() || t.run_name.is_some()) {
            return Err(invalid("tracking", "names an experiment or run but no server; set tracking.mlflow = \"http://HOST:PORT\""));
        }
        Ok(())
    }

    /// A job of a method that trains nothing: a team of frozen models, one step of one episode
    /// per listed task.
    fn check_evaluation_job(&self, method: MethodConfig) -> Result<Job, JobError> {
        if !self.agents.is_empty() {
            return Err(invalid("agents", "an evaluation job trains nothing; list the team's models as [[frozen]] tables instead"));
        }
        if self.eval.is_some() {
            return Err(invalid(
                "eval",
                format!(
                    "is set but method {} trains nothing to evaluate; remove [eval]",
                    self.method
                ),
            ));
        }
        if !self.data.train.as_os_str().is_empty() {
            return Err(invalid(
                "data.train",
                format!(
                    "a {} job takes its questions from its [{}] table; remove [data]",
                    self.method,
                    self.table()
                ),
            ));
        }
        let s = &self.schedule;
        if s.steps.unwrap_or(1) != 1 || s.epochs.is_some() || s.questions_per_step != 0 {
            return Err(invalid("schedule", "an evaluation job runs all its questions once, in one step; leave out steps, epochs and questions_per_step"));
        }
        let n = match method.task_source() {
            TaskSource::Listed(n) => n,
            TaskSource::Dataset | TaskSource::Generated => {
                return Err(invalid(
                    "method",
                    format!("{} trains nothing and lists no tasks", self.method),
                ))
            }
        };
        Ok(Job {
            spec: self.clone(),
            method,
            train: Vec::new(),
            total_steps: 1,
            steps_per_epoch: 1,
            dataset_len: n,
        })
    }

    /// The number of tasks the steps draw from.
    fn check_data(&self, source: TaskSource, dataset_len: usize) -> Result<usize, JobError> {
        let has_file = !self.data.train.as_os_str().is_empty();
        let s = &self.schedule;
        let q = u64::from(s.questions_per_step);
        let n = match source {
            TaskSource::Dataset if !has_file => {
                return Err(invalid("data.train", "give the file of training questions"))
            }
            TaskSource::Dataset => dataset_len,
            TaskSource::Generated | TaskSource::Listed(_) if has_file => {
                return Err(invalid(
                    "data.train",
                    format!("is set but {} generates its tasks; remove [data]", self.method),
                ))
            }
            // Fresh tasks every step: a virtual data set of one epoch.
            TaskSource::Generated => match (s.steps, s.epochs) {
                (Some(n), None) => usize::try_from(n.saturating_mul(q))
                    .map_err(|_| invalid("schedule.steps", "is too large"))?,
                _ => {
                    return Err(invalid(
                        "schedule",
                        format!(
                            "{} draws new tasks every step: give `steps`, not `epochs`",
                            self.method
                        ),
                    ))
                }
            },
            TaskSource::Listed(n) => n,
        };
        if q == 0 {
            return Err(invalid("schedule.questions_per_step", "must be at least 1"));
        }
        if n == 0 {
            return Err(invalid("data.train", "the data set has no questions"));
        }
        if q > n as u64 {
            return Err(invalid(
                "schedule.questions_per_step",
                format!("is {q} but the data set has only {n} questions"),
            ));
        }
        Ok(n)
    }

    /// (total steps, steps per epoch), and the schedule's other limits.
    fn check_schedule(&self, dataset_len: usize) -> Result<(u64, u64), JobError> {
        let s = &self.schedule;
        let steps_per_epoch = dataset_len as u64 / u64::from(s.questions_per_step);
        let total_steps = match (s.steps, s.epochs) {
            (Some(_), Some(_)) => {
                return Err(invalid("schedule", "give `steps` or `epochs`, not both"))
            }
            (None, None) => {
                return Err(invalid(
                    "schedule",
                    "give `steps` (training steps) or `epochs` (passes over the data)",
                ))
            }
            (Some(n), None) => n,
            (None, Some(e)) => e
                .checked_mul(steps_per_epoch)
                .ok_or_else(|| invalid("schedule.epochs", "is too large"))?,
        };
        if total_steps == 0 {
            return Err(invalid(
                if s.steps.is_some() { "schedule.steps" } else { "schedule.epochs" },
                "must be at least 1",
            ));
        }
        if s.checkpoint_every == 0 {
            return Err(invalid("schedule.checkpoint_every", "must be at least 1"));
        }
        if s.max_episode_attempts == 0 {
            return Err(invalid("schedule.max_episode_attempts", "must be at least 1"));
        }
        match (s.sync, s.max_policy_lag) {
            (SyncMode::Synchronous, Some(_)) => {
                return Err(invalid(
                    "schedule.max_policy_lag",
                    "bounds the policy lag of sync = \"async\"; a synchronous job trains every turn on its own weights",
                ))
            }
            (SyncMode::Async, Some(0)) => {
                return Err(invalid("schedule.max_policy_lag", "must be at least 1: rollout overlaps training, so a turn may be one version behind"))
            }
            _ => {}
        }
        for (name, v) in [
            ("episode_timeout_secs", s.episode_timeout_secs.unwrap_or(1)),
            ("learner_timeout_secs", s.learner_timeout_secs),
            ("worker_wait_secs", s.worker_wait_secs.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(invalid(format!("schedule.{name}"), "must be at least 1"));
            }
        }
        Ok((total_steps, steps_per_epoch))
    }

    /// Held-out evaluation: from a data file, or generated tasks counted by `max_questions`.
    fn check_eval(&self, source: TaskSource) -> Result<(), JobError> {
        let Some(e) = &self.eval else { return Ok(()) };
        if e.every_steps == 0 || e.instances_per_question == 0 {
            return Err(invalid(
                "eval",
                "`every_steps` and `instances_per_question` must be at least 1",
            ));
        }
        if !(e.temperature >= 0.0 && e.temperature.is_finite()) {
            return Err(invalid(
                "eval.temperature",
                format!("must be finite and >= 0, got {}", e.temperature),
            ));
        }
        let generated = source == TaskSource::Generated;
        match (generated, e.data.as_os_str().is_empty()) {
            (true, false) => {
                Err(invalid("eval.data", format!("is set but {} evaluates on generated tasks; give their number as eval.max_questions", self.method)))
            }
            (true, true) if e.max_questions == 0 => Err(invalid("eval.max_questions", "give the number of held-out tasks to evaluate on")),
            (false, true) => Err(invalid("eval.data", "give the file of held-out questions")),
            _ => Ok(()),
        }
    }
}

impl Job {
    /// An agent started from a checkpoint is served its adapter, so workers decode with the
    /// weights the learner starts from.
    fn serve_init_adapters(&mut self) -> Result<(), JobError> {
        for (k, a) in self.spec.agents.iter_mut().enumerate() {
            let Some(from) = &a.init_from else { continue };
            if self.train[k].lora.is_none() {
                return Err(invalid(
                    format!("agents[{k}].init_from"),
                    "starts a LoRA adapter from a learner checkpoint: add the [agents.train.lora] table it was trained with",
                ));
            }
            if a.adapter.is_some() {
                return Err(invalid(
                    format!("agents[{k}].init_from"),
                    "already names the adapter (its adapter/ folder): drop agents.adapter",
                ));
            }
            a.adapter = Some(from.join("adapter"));
        }
        Ok(())
    }
}
