//! `comas submit`, `watch`, `list`, `cancel`: clients of a coordinator's job API, and the live
//! progress display that `comas local` uses too.
use anyhow::{bail, Context, Result};
use comas_proto::v1 as pb;
use comas_proto::v1::coordinator_client::CoordinatorClient;
use comas_service::auth::Bearer;
use comas_workflow::step_log::{AgentStep, EvalLog, Record as LogRecord, StepLog};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;
use std::io::IsTerminal;
use std::path::PathBuf;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

#[derive(clap::Args, Debug, Clone)]
pub struct Conn {
    /// Coordinator address.
    #[arg(long, env = "COMAS_COORDINATOR", default_value = "http://127.0.0.1:50051")]
    pub coordinator: String,
}

#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// Job file (TOML). Relative paths in it are resolved against its folder.
    job: PathBuf,
    /// Overrides of the job file's keys: `schedule.steps=10 agents.1.train.lr=2e-6` (dotted
    /// keys, an index for an [[agents]] entry, TOML values); the coordinator keeps the
    /// effective job.
    overrides: Vec<String>,
    #[command(flatten)]
    conn: Conn,
    /// Follow the job's progress until it ends.
    #[arg(long)]
    watch: bool,
    /// Accept a name an earlier job already has; only once its learners' checkpoints are gone
    /// (they are kept under the job's name).
    #[arg(long)]
    reuse_name: bool,
}

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    job_id: String,
    #[command(flatten)]
    conn: Conn,
    /// One JSON event per line instead of progress bars.
    #[arg(long)]
    json: bool,
    /// First print the job file the coordinator runs (the submitted file with its overrides
    /// applied), then follow the job.
    #[arg(long)]
    show_job: bool,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    conn: Conn,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    job_id: String,
    #[command(flatten)]
    conn: Conn,
}

/// A coordinator client that sends the token in `COMAS_TOKEN` (if set) with every call.
pub type Client = CoordinatorClient<InterceptedService<Channel, Bearer>>;

pub async fn connect(address: &str) -> Result<Client> {
    if let Some((scheme, _)) = address.split_once("://") {
        if !matches!(scheme, "http" | "https") {
            bail!(
                "the coordinator address `{address}` has the scheme `{scheme}://`; it must be http:// or https:// (or host:port alone, for http); set --coordinator or COMAS_COORDINATOR"
            );
        }
    }
    let ch = comas_service::tls::channel(address, comas_service::limits::api_endpoint)
        .await
        .with_context(|| format!("cannot reach the coordinator at {address} (set --coordinator or COMAS_COORDINATOR; for TLS, COMAS_TLS_CA and perhaps COMAS_TLS_CERT and COMAS_TLS_KEY)"))?;
    Ok(CoordinatorClient::with_interceptor(ch, Bearer::from_env()?)
        .max_decoding_message_size(comas_service::limits::API_MESSAGE_BYTES))
}

/// A failed call to the coordinator at `address` (when known), after `what`: a coordinator that
/// accepted the connection but answers nothing is named as such.
fn call_error(address: Option<&str>, what: &str, s: &tonic::Status) -> anyhow::Error {
    use comas_service::limits::{
        past_deadline, unanswered, API_CALL_DEADLINE, API_PING_INTERVAL, API_PING_TIMEOUT,
    };
    let at = address.map_or(String::new(), |a| format!(" at {a}"));
    if unanswered(s) {
        return anyhow::anyhow!(
            "the coordinator{at} accepted the connection but did not answer within {} s: it is hung or stopped, or what listens there is not a comas coordinator (check --coordinator or COMAS_COORDINATOR)",
            (API_PING_INTERVAL + API_PING_TIMEOUT).as_secs()
        );
    }
    if past_deadline(s) {
        return anyhow::anyhow!(
            "the coordinator{at} did not finish the call within {} s; it answers the connection, so it is up but busy or stuck: try again, or look at its log",
            API_CALL_DEADLINE.as_secs()
        );
    }
    anyhow::anyhow!("{what}{}", comas_service::tls::status_text(s))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

pub fn state_name(s: i32) -> &'static str {
    match pb::JobState::try_from(s) {
        Ok(pb::JobState::Queued) => "queued",
        Ok(pb::JobState::Running) => "running",
        Ok(pb::JobState::Succeeded) => "succeeded",
        Ok(pb::JobState::Failed) => "failed",
        Ok(pb::JobState::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

pub fn status_json(s: &pb::JobStatus) -> Value {
    serde_json::json!({
        "job_id": s.job_id, "name": s.name, "state": state_name(s.state), "steps_done": s.steps_done,
        "total_steps": s.total_steps, "stage": s.stage, "episodes_done": s.episodes_done,
        "episodes_total": s.episodes_total, "stage_tokens": s.stage_tokens, "stage_seconds": s.stage_seconds,
        "train_samples_done": s.train_samples_done, "train_samples_total": s.train_samples_total,
        "queued_episodes": s.queued_episodes, "leased_episodes": s.leased_episodes,
        "broadcast_bytes_done": s.broadcast_bytes_done, "broadcast_bytes_total": s.broadcast_bytes_total,
        "broadcast_workers": s.broadcast_workers,
        "error": s.error, "metrics_path": s.metrics_path,
        "agents": s.agents.iter().map(|a| serde_json::json!({"agent": a.agent_id, "version": a.version, "learner": a.learner})).collect::<Vec<_>>(),
    })
}

/// A job file's text with command-line `key.path=value` overrides applied (unchanged without).
pub fn with_overrides(text: String, overrides: &[String]) -> Result<String> {
    if overrides.is_empty() {
        return Ok(text);
    }
    use comas_workflow::job::overrides::{apply, Override};
    let parsed = overrides.iter().map(|o| Override::parse(o)).collect::<Result<Vec<_>, _>>()?;
    Ok(apply(&text, &parsed)?)
}

pub async fn submit_text(
    client: &mut Client,
    text: String,
    base_dir: String,
    reuse_name: bool,
) -> Result<pb::JobStatus> {
    submit_to(client, None, text, base_dir, reuse_name).await
}

/// [`submit_text`] to the coordinator at `address` (named in errors when given).
async fn submit_to(
    client: &mut Client,
    address: Option<&str>,
    text: String,
    base_dir: String,
    reuse_name: bool,
) -> Result<pb::JobStatus> {
    match client.submit_job(pb::SubmitJobRequest { job_toml: text, base_dir, reuse_name }).await {
        Ok(r) => {
            let status = r.into_inner();
            // The memory estimate and its warnings; stdout stays the job id alone.
            for n in &status.notes {
                eprintln!("{n}");
            }
            Ok(status)
        }
        Err(s) => Err(call_error(address, "job rejected: ", &s)),
    }
}

pub fn submit(a: SubmitArgs) -> Result<()> {
    let meta = std::fs::metadata(&a.job).with_context(|| format!("reading {}", a.job.display()))?;
    if meta.len() > comas_service::limits::JOB_FILE_BYTES as u64 {
        bail!("{} is {} bytes; a job file must be under 1 MiB", a.job.display(), meta.len());
    }
    let text =
        std::fs::read_to_string(&a.job).with_context(|| format!("reading {}", a.job.display()))?;
    let text =
        with_overrides(text, &a.overrides).with_context(|| format!("{}", a.job.display()))?;
    let base = std::fs::canonicalize(&a.job)?
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    runtime()?.block_on(async {
        let address = a.conn.coordinator.as_str();
        let mut c = connect(address).await?;
        let s = submit_to(&mut c, Some(address), text, base, a.reuse_name).await?;
        println!("{}", s.job_id);
        if a.watch {
            let end = watch_at(&mut c, Some(address), &s.job_id, false).await?;
            return finish(&end);
        }
        Ok(())
    })
}

/// Exit status of a finished job: an error unless it succeeded.
pub fn finish(s: &pb::JobStatus) -> Result<()> {
    match pb::JobState::try_from(s.state) {
        Ok(pb::JobState::Succeeded) => Ok(()),
        _ if !s.error.is_empty() => bail!("job {} {}: {}", s.job_id, state_name(s.state), s.error),
        _ => bail!("job {} {}", s.job_id, state_name(s.state)),
    }
}

pub fn watch_cmd(a: WatchArgs) -> Result<()> {
    runtime()?.block_on(async {
        let address = a.conn.coordinator.as_str();
        let mut c = connect(address).await?;
        if a.show_job {
            let s = c
                .get_job(pb::GetJobRequest { job_id: a.job_id.clone() })
                .await
                .map_err(|s| call_error(Some(address), "", &s))?
                .into_inner();
            print!("{}", s.job_toml);
            if !s.job_toml.ends_with('\n') {
                println!();
            }
        }
        let end = watch_at(&mut c, Some(address), &a.job_id, a.json).await?;
        finish(&end)
    })
}

pub fn list(a: ListArgs) -> Result<()> {
    runtime()?.block_on(async {
        let address = a.conn.coordinator.as_str();
        let mut c = connect(address).await?;
        let jobs = c
            .list_jobs(pb::ListJobsRequest {})
            .await
            .map_err(|s| call_error(Some(address), "", &s))?
            .into_inner()
            .jobs;
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&jobs.iter().map(status_json).collect::<Vec<_>>())?
            );
            return Ok(());
        }
        println!("{:<38} {:<20} {:<10} {:>9}  error", "job", "name", "state", "steps");
        for j in jobs {
            println!(
                "{:<38} {:<20} {:<10} {:>4}/{:<4}  {}",
                j.job_id,
                j.name,
                state_name(j.state),
                j.steps_done,
                j.total_steps,
                j.error
            );
        }
        Ok(())
    })
}

pub fn resume(a: CancelArgs) -> Result<()> {
    runtime()?.block_on(async {
        let address = a.conn.coordinator.as_str();
        let mut c = connect(address).await?;
        let s = c
            .resume_job(pb::ResumeJobRequest { job_id: a.job_id.clone() })
            .await
            .map_err(|s| call_error(Some(address), "", &s))?
            .into_inner();
        println!(
            "{} {} from step {}/{}",
            s.job_id,
            state_name(s.state),
            s.steps_done,
            s.total_steps
        );
        Ok(())
    })
}

pub fn cancel(a: CancelArgs) -> Result<()> {
    runtime()?.block_on(async {
        let address = a.conn.coordinator.as_str();
        let mut c = connect(address).await?;
        let ended = |s: &pb::JobStatus| {
            matches!(
                pb::JobState::try_from(s.state),
                Ok(pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Cancelled)
            )
        };
        // Follow the job's events from before the cancel: the event of the state it reaches
        // arrives even when the coordinator stops right after (as `comas local` does).
        let mut events = c
            .clone()
            .watch_job(pb::WatchJobRequest { job_id: a.job_id.clone() })
            .await
            .map_err(|s| call_error(Some(address), "", &s))?
            .into_inner();
        let mut last = c
            .cancel_job(pb::CancelJobRequest { job_id: a.job_id.clone() })
            .await
            .map_err(|s| call_error(Some(address), "", &s))?
            .into_inner();
        // A running job stops at its next check; report the state it reaches, not the one it had.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while !ended(&last) {
                match events.message().await {
                    Ok(Some(pb::JobEvent { status: Some(st), .. })) => last = st,
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
        })
        .await;
        println!("{} {}", last.job_id, state_name(last.state));
        Ok(())
    })
}

fn fmt(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:+.3}"))
}

const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Progress within the current stage: episodes, tokens and tokens/s while generating;
/// experiences trained while the learners train.
pub fn stage_progress(s: &pb::JobStatus) -> String {
    // An amount per second of the stage so far (0 before any time has passed).
    let per_second =
        |amount: f64| if s.stage_seconds > 0.0 { amount / s.stage_seconds } else { 0.0 };
    match s.stage.as_str() {
        "rollout" | "eval" if s.episodes_total > 0 => {
            let rate = per_second(s.stage_tokens as f64);
            format!(
                "{}/{} episodes ({} queued, {} on workers), {} tokens, {rate:.1} tok/s",
                s.episodes_done,
                s.episodes_total,
                s.queued_episodes,
                s.leased_episodes,
                s.stage_tokens
            )
        }
        "train" if s.train_samples_total > 0 => {
            let rate = per_second(s.stage_tokens as f64);
            format!(
                "{}/{} experiences, {} tokens, {rate:.1} tok/s ({:.0} s)",
                s.train_samples_done, s.train_samples_total, s.stage_tokens, s.stage_seconds
            )
        }
        "broadcast" if s.broadcast_bytes_total > 0 => {
            let mb = |b: u64| b as f64 / 1e6;
            let rate = per_second(mb(s.broadcast_bytes_done));
            format!(
                "{:.1}/{:.1} MB of weights received by {} worker(s), {rate:.1} MB/s ({:.0} s)",
                mb(s.broadcast_bytes_done),
                mb(s.broadcast_bytes_total),
                s.broadcast_workers,
                s.stage_seconds
            )
        }
        _ => String::new(),
    }
}

/// One line per finished step: rewards per agent, score validity, accuracy, stage times.
pub fn step_line(log: &StepLog) -> String {
    let mut parts = vec![format!("step {}", log.step)];
    let agent = |a: &AgentStep| a.agent().unwrap_or(0);
    if log.agents.is_some() {
        let r: Vec<String> = log
            .agents()
            .iter()
            .map(|a| format!("a{}={}", agent(a), fmt(a.figure("reward_mean"))))
            .collect();
        parts.push(format!("reward {}", r.join(" ")));
    }
    // The method's own figures (CoMAS's accuracy and score failures, MAPPA's coaching, ...).
    parts.extend(comas_workflow::registry::watch(&log.to_value()));
    // Agents whose step moved nothing: every sample masked or with a zero advantage.
    let idle: Vec<String> = log
        .agents()
        .iter()
        .filter_map(|a| Some((agent(a), a.train.as_ref().filter(|t| t.no_gradient)?)))
        .map(|(k, t)| {
            format!(
                "a{k} ({} masked, {} zero advantage)",
                t.masked_samples, t.zero_advantage_samples
            )
        })
        .collect();
    if !idle.is_empty() {
        parts.push(format!("no gradient: {}", idle.join(" ")));
    }
    if let Some(s) = &log.seconds {
        parts.push(format!(
            "rollout {:.1}s train {:.1}s sync {:.1}s",
            s.rollout, s.train, s.broadcast
        ));
    }
    parts.join(" | ")
}

/// One line per evaluation: the method's own figures.
pub fn eval_line(log: &EvalLog) -> String {
    let episodes = log.figures.get("episodes").map_or("-".to_string(), Value::to_string);
    let mut parts =
        vec![format!("eval after {} steps", log.after_steps), format!("{episodes} episodes")];
    parts.extend(comas_workflow::registry::watch(&log.to_value()));
    parts.join(" | ")
}

/// Follows a job until it ends; progress bars on a terminal, plain lines otherwise.
pub async fn watch(client: &mut Client, job_id: &str, json: bool) -> Result<pb::JobStatus> {
    watch_at(client, None, job_id, json).await
}

/// [`watch`] on the coordinator at `address` (named in errors when given).
async fn watch_at(
    client: &mut Client,
    address: Option<&str>,
    job_id: &str,
    json: bool,
) -> Result<pb::JobStatus> {
    let mut stream = client
        .watch_job(pb::WatchJobRequest { job_id: job_id.to_string() })
        .await
        .map_err(|s| call_error(address, &format!("watching {job_id}: "), &s))?
        .into_inner();
    let tty = std::io::stderr().is_terminal() && !json;
    let multi = MultiProgress::with_draw_target(if tty {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let steps = multi.add(ProgressBar::new(0));
    steps.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:30.cyan/blue}] {pos}/{len} {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    steps.set_prefix("steps");
    let episodes = multi.add(ProgressBar::new(0));
    episodes.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:30.green/white}] {pos}/{len} {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    // A permanent line: above the bars on a terminal, plain on stderr otherwise.
    let say = |line: &str| {
        if tty {
            multi.println(line).ok();
        } else {
            eprintln!("{line}");
        }
    };
    let mut last: Option<pb::JobStatus> = None;
    let mut stage = String::new();
    let mut last_progress = std::time::Instant::now();
    while let Some(ev) =
        stream.message().await.map_err(|s| call_error(address, "watch stream: ", &s))?
    {
        let Some(s) = ev.status.clone() else { continue };
        if json {
            println!(
                "{}",
                serde_json::json!({"kind": ev.kind, "message": ev.message, "status": status_json(&s), "metrics": serde_json::from_str::<Value>(&ev.metrics_json).ok()})
            );
        } else {
            steps.set_length(s.total_steps);
            steps.set_position(s.steps_done);
            episodes.set_prefix(if s.stage.is_empty() {
                "idle".to_string()
            } else {
                s.stage.clone()
            });
            let (done, total) = match s.stage.as_str() {
                "train" => (u64::from(s.train_samples_done), u64::from(s.train_samples_total)),
                "broadcast" => (s.broadcast_bytes_done, s.broadcast_bytes_total),
                _ => (u64::from(s.episodes_done), u64::from(s.episodes_total)),
            };
            episodes.set_length(total);
            episodes.set_position(done);
            let progress = stage_progress(&s);
            episodes.set_message(progress.clone());
            // Without a terminal: a progress line as episodes and learners finish, at most every 5 s
            // (and always for the last one of a stage).
            let last_of_stage = total > 0 && done == total;
            if !tty
                && matches!(ev.kind.as_str(), "episodes" | "trained" | "broadcast")
                && !progress.is_empty()
                && (last_of_stage || last_progress.elapsed() >= PROGRESS_EVERY)
            {
                eprintln!(
                    "{}: {} (step {}/{}) {progress}",
                    s.job_id, s.stage, s.steps_done, s.total_steps
                );
                last_progress = std::time::Instant::now();
            }
            if ev.kind == "warning" {
                say(&format!("warning: {}", ev.message));
            }
            if ev.kind == "eval" {
                if let Ok(Some(LogRecord::Eval(m))) = LogRecord::parse(&ev.metrics_json) {
                    say(&eval_line(&m));
                }
            } else if ev.kind == "step" {
                if let Ok(Some(LogRecord::Step(m))) = LogRecord::parse(&ev.metrics_json) {
                    let line = step_line(&m);
                    steps.set_message(line.split(" | ").nth(1).unwrap_or("").to_string());
                    say(&line);
                }
            } else if !tty && s.stage != stage && !s.stage.is_empty() {
                eprintln!("{}: {} (step {}/{})", s.job_id, s.stage, s.steps_done, s.total_steps);
            }
            stage = s.stage.clone();
        }
        let end = ev.kind == "finished"
            || matches!(
                pb::JobState::try_from(s.state),
                Ok(pb::JobState::Succeeded | pb::JobState::Failed | pb::JobState::Cancelled)
            );
        last = Some(s);
        if end {
            break;
        }
    }
    steps.finish_and_clear();
    episodes.finish_and_clear();
    // The stream may end on a final event; read the settled status.
    let s = client
        .get_job(pb::GetJobRequest { job_id: job_id.to_string() })
        .await
        .map(|r| r.into_inner())
        .ok()
        .or(last);
    s.ok_or_else(|| anyhow::anyhow!("the watch stream of {job_id} ended without a status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coordinator_that_accepts_but_never_answers_fails_within_seconds() {
        // Accepts connections and holds them, silent (a hung or stopped coordinator).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let held: Vec<_> = listener.incoming().collect();
            drop(held);
        });
        let conn = Conn { coordinator: address.clone() };
        let start = std::time::Instant::now();
        let calls: Vec<std::thread::JoinHandle<Result<()>>> = vec![
            std::thread::spawn({
                let conn = conn.clone();
                move || list(ListArgs { conn, json: false })
            }),
            std::thread::spawn({
                let conn = conn.clone();
                move || {
                    watch_cmd(WatchArgs {
                        job_id: "job-x".into(),
                        conn,
                        json: false,
                        show_job: false,
                    })
                }
            }),
            std::thread::spawn(move || cancel(CancelArgs { job_id: "job-x".into(), conn })),
        ];
        for call in calls {
            let err = format!("{:#}", call.join().unwrap().unwrap_err());
            assert!(
                err.contains(&format!("the coordinator at {address} accepted the connection but did not answer within 5 s")),
                "{err}"
            );
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(15), "{:?}", start.elapsed());
    }

    #[test]
    fn a_call_past_its_deadline_says_so() {
        let s = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        let err = call_error(Some("http://c:1"), "job rejected: ", &s).to_string();
        assert!(
            err.starts_with("the coordinator at http://c:1 did not finish the call within 120 s"),
            "{err}"
        );
    }

    #[test]
    fn a_coordinator_address_of_another_scheme_is_refused() {
        let err = runtime().unwrap().block_on(connect("ftp://127.0.0.1:47123")).err().unwrap();
        let err = format!("{err:#}");
        assert!(err.contains("`ftp://`") && err.contains("must be http:// or https://"), "{err}");
    }

    fn step(v: Value) -> StepLog {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_mappa_step_line_shows_its_coaching() {
        let m = serde_json::json!({
            "step": 3, "method": "mappa", "samples": 11, "samples_dropped": 1, "tool_calls": 4,
            "coach_score": {"problem_solver": {"mean": 2.5, "count": 4}, "verifier": {"mean": null, "count": 0}},
            "tool_success_rate": {"mean": 0.75, "count": 4}, "outcome_accuracy": {"mean": 0.25, "count": 4},
            "agents": [{"agent": 0, "reward_mean": 0.25}],
            "seconds": {"rollout": 20.0, "train": 10.0, "broadcast": 0.5}
        });
        assert_eq!(
            step_line(&step(m.clone())),
            "step 3 | reward a0=+0.250 | coach problem_solver 2.5 verifier - | scored 11/12 | tool runs ok 75% of 4 | answers right 25% | rollout 20.0s train 10.0s sync 0.5s"
        );
        let watch = comas_workflow::registry::watch;
        let ds = serde_json::json!({
            "method": "mappa", "coach_score": {"analyst": {"mean": 6.0, "count": 2}}, "samples": 2, "tool_calls": 2, "tool_success_rate": {"mean": 1.0, "count": 2},
            "ds_success_rate": {"mean": 0.5, "count": 2}, "ds_metrics": {"accuracy": {"mean": 0.75, "count": 1}}
        });
        assert_eq!(watch(&ds).last().unwrap(), "submissions scored 50% accuracy 0.75");
        let cosir = serde_json::json!({
            "step": 1, "method": "cosir", "team_accuracy": {"mean": 0.5, "count": 4}, "valid_shares_per_episode": {"mean": 1.25, "count": 4},
            "disclosure_rate": {"mean": 0.1, "count": 4}, "request_fulfilment_rate": {"mean": null, "count": 0}, "format_violation_rate": {"mean": 0.0, "count": 4}
        });
        assert_eq!(step_line(&step(cosir)), "step 1 | team right 50% | valid shares/game 1.2 | disclosed 10% answered - | format broken 0%");

        let neuromas = serde_json::json!({
            "step": 2, "method": "neuromas", "graph_accuracy": {"mean": 0.25, "count": 16}, "no_box_rate": {"mean": 0.0, "count": 16},
            "equal_groups": 3, "groups": 4, "truncation_rate": {"1": {"mean": 0.5, "count": 32}, "2": {"mean": 0.0, "count": 16}}
        });
        assert_eq!(
            step_line(&step(neuromas)),
            "step 2 | graph right 25% | no box 0% | equal groups 3/4 | messages cut L1 50% L2 0%"
        );
        // A CoMAS record (with or without its method's name, as before the field): accuracy and
        // score failures, on the step and the evaluation lines alike.
        let comas = serde_json::json!({"step": 4, "parse_failure_rate": 0.25, "accuracy": {"last_round": 0.5}, "agents": [{"agent": 1, "reward_mean": -0.5}]});
        assert_eq!(
            step_line(&step(comas)),
            "step 4 | reward a1=-0.500 | invalid scores 25% | accuracy 50%"
        );
        // A step that moved nothing says so.
        let idle = serde_json::json!({"step": 5, "method": "grpo", "agents": [{"agent": 0, "reward_mean": 0.0,
            "train": {"no_gradient": true, "masked_samples": 3, "zero_advantage_samples": 13}}]});
        let idle = step_line(&step(idle));
        assert!(idle.ends_with("| no gradient: a0 (3 masked, 13 zero advantage)"), "{idle}");
        let eval = serde_json::json!({"method": "comas", "kind": "eval", "after_steps": 2, "episodes": 8, "parse_failure_rate": 0.0, "accuracy": {"last_round": 0.125}});
        assert_eq!(
            eval_line(&serde_json::from_value(eval).unwrap()),
            "eval after 2 steps | 8 episodes | invalid scores 0% | accuracy 12%"
        );
    }

    #[test]
    fn stage_progress_shows_tokens_per_second_and_trained_experiences() {
        let rollout = pb::JobStatus {
            stage: "rollout".into(),
            episodes_done: 3,
            episodes_total: 8,
            queued_episodes: 4,
            leased_episodes: 1,
            stage_tokens: 500,
            stage_seconds: 10.0,
            ..Default::default()
        };
        assert_eq!(
            stage_progress(&rollout),
            "3/8 episodes (4 queued, 1 on workers), 500 tokens, 50.0 tok/s"
        );
        let train = pb::JobStatus {
            stage: "train".into(),
            train_samples_done: 12,
            train_samples_total: 24,
            stage_tokens: 3140,
            stage_seconds: 31.4,
            ..Default::default()
        };
        assert_eq!(stage_progress(&train), "12/24 experiences, 3140 tokens, 100.0 tok/s (31 s)");
        assert_eq!(
            stage_progress(&pb::JobStatus { stage: "broadcast".into(), ..Default::default() }),
            ""
        );
        let broadcast = pb::JobStatus {
            stage: "broadcast".into(),
            broadcast_bytes_done: 150_000_000,
            broadcast_bytes_total: 540_000_000,
            broadcast_workers: 2,
            stage_seconds: 3.0,
            ..Default::default()
        };
        assert_eq!(
            stage_progress(&broadcast),
            "150.0/540.0 MB of weights received by 2 worker(s), 50.0 MB/s (3 s)"
        );
    }
}
