//! `comas eval --coordinator URL`: the evaluation on a cluster's rollout workers. A setup's
//! remaining questions go to the coordinator as evaluation jobs (`method = "eval"`) whose team
//! is frozen models; the transcripts come back over gRPC and are graded here, into the same
//! files a run on one machine writes. A job in flight is remembered in the output folder, so a
//! rerun picks it up instead of submitting the questions again.
use super::grading::Grader;
use super::report::{self, QuestionResult, ResultsFile};
use crate::client_cmd::{connect, finish, state_name, submit_text, Client};
use anyhow::{bail, Context, Result};
use comas_proto::v1 as pb;
use comas_workflow::eval::Evaluation;
use comas_workflow::eval::{BenchItem, EvalQuestion, EvalTranscript, Setup};
use comas_workflow::job::{DataSpec, FrozenSpec, JobSpec, OutputSpec, RolloutSpec, ScheduleSpec};
use comas_workflow::method::Method;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A job file stays under the coordinator's limit with room to spare; more questions make more
/// jobs.
const MAX_JOB_TOML_BYTES: usize = comas_service::limits::JOB_FILE_BYTES / 8 * 7;

/// One member of the team as the workers load it.
#[derive(Debug, Clone)]
pub struct TeamModel {
    pub model: PathBuf,
    pub adapter: Option<PathBuf>,
    /// As `run.json` and the calls log name it.
    pub name: String,
}

/// What the run needs beyond the team.
pub struct RemoteRun<'a> {
    pub coordinator: &'a str,
    pub team: &'a [TeamModel],
    pub dtype: &'a str,
    pub temperature: f64,
    pub max_new_tokens: u32,
    pub seed: u64,
    /// Where the coordinator writes the jobs' logs (a folder it can write).
    pub jobs_dir: &'a Path,
    pub out: &'a Path,
}

/// The `[evaluate]` table of the job file.
#[derive(Serialize)]
struct EvaluateTable<'a> {
    setup: Setup,
    temperature: f64,
    max_new_tokens: u32,
    seed: u64,
    questions: &'a [EvalQuestion],
}

/// A job submitted and not yet graded: `remote-<setup>.json` in the output folder.
#[derive(Debug, Serialize, Deserialize)]
struct PendingJob {
    job_id: String,
}

impl RemoteRun<'_> {
    fn job_toml(&self, setup: Setup, name: &str, questions: &[EvalQuestion]) -> Result<String> {
        let evaluate = toml::Table::try_from(EvaluateTable {
            setup,
            temperature: self.temperature,
            max_new_tokens: self.max_new_tokens,
            seed: self.seed,
            questions,
        })?;
        let frozen = self
            .team
            .iter()
            .enumerate()
            .map(|(i, m)| {
                FrozenSpec::local(format!("member-{i}"), m.model.clone(), m.adapter.clone())
            })
            .collect();
        let spec = JobSpec {
            name: name.to_string(),
            seed: self.seed,
            method: Evaluation::NAME.to_string(),
            settings: evaluate,
            frozen,
            data: DataSpec::default(),
            schedule: ScheduleSpec::default(),
            rollout: RolloutSpec { dtype: self.dtype.to_string(), engine: None },
            output: OutputSpec {
                dir: self.jobs_dir.join(name),
                export: false,
                save_episodes: false,
            },
            eval: None,
            tracking: Default::default(),
            agents: Vec::new(),
        };
        Ok(spec.to_toml()?)
    }

    fn pending_path(&self, setup: Setup) -> PathBuf {
        self.out.join(format!("remote-{setup}.json"))
    }

    /// Grades every remaining question of `setup` on the cluster; returns (calls, tokens).
    pub async fn run_setup(
        &self,
        setup: Setup,
        items: &[BenchItem],
        bench: &str,
        results: &mut ResultsFile,
        grader: &Grader,
    ) -> Result<(u64, u64)> {
        let mut client = connect(self.coordinator).await?;
        let mut totals = (0u64, 0u64);
        // A job of an earlier, interrupted run first.
        if let Ok(text) = std::fs::read_to_string(self.pending_path(setup)) {
            let p: PendingJob = serde_json::from_str(&text).with_context(|| {
                format!("{} is not a pending-job file", self.pending_path(setup).display())
            })?;
            let s = client.get_job(pb::GetJobRequest { job_id: p.job_id.clone() }).await;
            match s.map(|r| r.into_inner()) {
                Ok(s) => {
                    eprintln!(
                        "{setup}: picking up job {} ({}) of an earlier run",
                        s.job_id,
                        state_name(s.state)
                    );
                    if matches!(
                        pb::JobState::try_from(s.state),
                        Ok(pb::JobState::Failed | pb::JobState::Cancelled)
                    ) {
                        client
                            .resume_job(pb::ResumeJobRequest { job_id: s.job_id.clone() })
                            .await
                            .map_err(|e| {
                                anyhow::anyhow!(
                                    "resuming job {}: {}",
                                    s.job_id,
                                    comas_service::tls::status_text(&e)
                                )
                            })?;
                    }
                    let t =
                        self.follow(&mut client, setup, &s.job_id, items, results, grader).await?;
                    totals = (totals.0 + t.0, totals.1 + t.1);
                }
                Err(e) if e.code() == tonic::Code::NotFound => {
                    eprintln!(
                        "{setup}: the coordinator does not know job {} of an earlier run ({}); running its questions again",
                        p.job_id,
                        comas_service::tls::status_text(&e)
                    )
                }
                // Unreachable, or refused: keep the note, so a later run can still pick the job up.
                Err(e) => bail!(
                    "asking the coordinator about job {} of an earlier run: {}",
                    p.job_id,
                    comas_service::tls::status_text(&e)
                ),
            }
            std::fs::remove_file(self.pending_path(setup)).ok();
        }
        let todo: Vec<EvalQuestion> = items
            .iter()
            .enumerate()
            .filter(|(_, it)| !results.has(setup, &it.id))
            .map(|(i, it)| EvalQuestion {
                index: i as u32,
                id: it.id.clone(),
                query: it.query.clone(),
            })
            .collect();
        let mut rest: &[EvalQuestion] = &todo;
        while !rest.is_empty() {
            // Job names are unique in a coordinator's store: the time and this process tell runs apart.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let name = format!("eval-{bench}-{setup}-{:x}-{}", nanos, std::process::id());
            let take = self.fitting(setup, &name, rest)?;
            let text = self.job_toml(setup, &name, &rest[..take])?;
            let status = submit_text(&mut client, text, String::new(), false).await?;
            crate::plot::write_atomic(
                &self.pending_path(setup),
                serde_json::to_string(&PendingJob { job_id: status.job_id.clone() })?.as_bytes(),
            )?;
            let t = self.follow(&mut client, setup, &status.job_id, items, results, grader).await?;
            totals = (totals.0 + t.0, totals.1 + t.1);
            std::fs::remove_file(self.pending_path(setup)).ok();
            rest = &rest[take..];
        }
        Ok(totals)
    }

    /// How many of `questions` one job file takes.
    fn fitting(&self, setup: Setup, name: &str, questions: &[EvalQuestion]) -> Result<usize> {
        let (mut lo, mut hi) = (1usize, questions.len());
        if self.job_toml(setup, name, &questions[..1])?.len() > MAX_JOB_TOML_BYTES {
            bail!(
                "question {} alone makes a job file over {MAX_JOB_TOML_BYTES} bytes",
                questions[0].id
            );
        }
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.job_toml(setup, name, &questions[..mid])?.len() <= MAX_JOB_TOML_BYTES {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Ok(lo)
    }

    /// Watches the job to its end with a progress bar, then grades its transcripts.
    async fn follow(
        &self,
        client: &mut Client,
        setup: Setup,
        job_id: &str,
        items: &[BenchItem],
        results: &mut ResultsFile,
        grader: &Grader,
    ) -> Result<(u64, u64)> {
        let graded_before = items.iter().filter(|it| results.has(setup, &it.id)).count();
        let bar = report::progress_bar(setup, items.len(), graded_before);
        let started = Instant::now();
        let mut stream = client
            .watch_job(pb::WatchJobRequest { job_id: job_id.to_string() })
            .await
            .map_err(|s| {
                anyhow::anyhow!("watching {job_id}: {}", comas_service::tls::status_text(&s))
            })?
            .into_inner();
        let mut last = None;
        while let Some(ev) = stream.message().await.map_err(|s| {
            anyhow::anyhow!("watch stream of {job_id}: {}", comas_service::tls::status_text(&s))
        })? {
            let Some(s) = ev.status else { continue };
            if s.stage == "rollout" {
                bar.set_position((graded_before + s.episodes_done as usize) as u64);
                let secs = s.stage_seconds.max(1e-9);
                bar.set_message(format!(
                    "{} tokens, {:.1} tok/s on the cluster",
                    s.stage_tokens,
                    s.stage_tokens as f64 / secs
                ));
            }
            last = Some(s);
        }
        let end =
            last.with_context(|| format!("the coordinator sent no status of job {job_id}"))?;
        finish(&end)?;
        let mut records = client
            .job_episodes(pb::JobEpisodesRequest { job_id: job_id.to_string(), step: 0 })
            .await
            .map_err(|s| {
                anyhow::anyhow!(
                    "fetching the transcripts of {job_id}: {}",
                    comas_service::tls::status_text(&s)
                )
            })?
            .into_inner();
        bar.set_position(graded_before as u64);
        let mut transcripts = Vec::new();
        while let Some(r) = records.message().await.map_err(|s| {
            anyhow::anyhow!("transcripts of {job_id}: {}", comas_service::tls::status_text(&s))
        })? {
            let t: EvalTranscript = serde_json::from_str(&r.record_json).with_context(|| {
                format!("episode {} of job {job_id} is not an evaluation transcript", r.episode_id)
            })?;
            transcripts.push(t);
        }
        transcripts.sort_by_key(|t| t.index);
        let (mut calls, mut tokens) = (0u64, 0u64);
        for t in transcripts {
            let item = items.get(t.index as usize).filter(|it| it.id == t.id).with_context(|| {
                format!("job {job_id} answered question {} ({}), which this benchmark does not have at that position; was --bench changed?", t.index, t.id)
            })?;
            if results.has(setup, &item.id) {
                continue;
            }
            calls += t.calls.len() as u64;
            tokens += t.completion_tokens();
            let verdict = grader.grade(item, &t.output)?;
            let mut call_records = t.calls;
            for c in &mut call_records {
                c.model = self.team[c.member % self.team.len()].name.clone();
            }
            results.append(&QuestionResult::new(setup, item, t.output, verdict, call_records))?;
            bar.inc(1);
        }
        bar.finish_with_message(format!(
            "{calls} calls, {tokens} tokens in {:.1} s",
            started.elapsed().as_secs_f64()
        ));
        Ok((calls, tokens))
    }
}
