//! `comas local`: every service on one machine over loopback. The coordinator runs in this
//! process; each learner and rollout worker is a child process of this same binary, so a crash
//! of one is a crash of one, as on a cluster. Without a job file it runs a built-in example
//! (`examples.rs`): SmolLM2 by default, or tiny random models.
use crate::client_cmd::{connect, finish, state_name, status_json, submit_text, watch};
use crate::examples::{self, Example};
use anyhow::{bail, Context, Result};
use comas_proto::v1 as pb;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Job file (TOML). Without one, the built-in example runs.
    job: Option<PathBuf>,
    /// The built-in example to run when no job file is given.
    #[arg(long, env = "COMAS_LOCAL_EXAMPLE", value_enum, default_value = "smollm2")]
    example: Example,
    /// Rollout worker processes (default: 1 for the smollm2 example, else 2).
    #[arg(long, env = "COMAS_LOCAL_WORKERS")]
    workers: Option<usize>,
    /// libtorch threads per rollout worker (default: 2 for the smollm2 example, else
    /// --threads-per-process).
    #[arg(long, env = "COMAS_LOCAL_WORKER_THREADS")]
    worker_threads: Option<i32>,
    /// Folder for the job store, checkpoints, logs and the example's files. Running the same
    /// command again resumes an unfinished job from its last completed step.
    #[arg(long, env = "COMAS_LOCAL_DIR", default_value = "comas-local")]
    dir: PathBuf,
    /// libtorch threads per learner (and per worker unless --worker-threads).
    #[arg(long, env = "COMAS_LOCAL_THREADS", default_value_t = 1)]
    threads_per_process: i32,
    /// Device of the rollout workers (cpu, cuda, cuda:N).
    #[arg(long, env = "COMAS_LOCAL_DEVICE", default_value = "cpu")]
    device: String,
    /// Print the final job status as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Start the job afresh from the base models, discarding any unfinished job in --dir and its
    /// checkpoints (without it, an unfinished job of the same name is resumed, and one of
    /// another name is an error).
    #[arg(long)]
    fresh: bool,
}

/// Child processes, stopped with SIGTERM (then SIGKILL after a grace period) when dropped.
struct Children(Vec<(String, Child)>);

impl Children {
    fn spawn(&mut self, name: &str, args: &[String], log: &Path, threads: i32) -> Result<()> {
        let exe = std::env::current_exe()?;
        let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let parent = std::process::id() as libc::pid_t;
        let mut cmd = Command::new(exe);
        // Own process group: Ctrl-C reaches only this process, which then stops the children in order.
        cmd.process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls: prctl, getppid, _exit. The
        // child gets SIGTERM when this process dies however it dies (SIGKILL included), and
        // exits at once if it already has.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd
            .args(args)
            .env("COMAS_THREADS", threads.to_string())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        eprintln!("{name}: pid {}, log {}", child.id(), log.display());
        self.0.push((name.to_string(), child));
        Ok(())
    }

    /// A child that exited on its own, with its status.
    fn exited(&mut self) -> Option<String> {
        self.0.iter_mut().find_map(|(n, c)| c.try_wait().ok().flatten().map(|s| format!("{n} exited ({s})")))
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &self.0 {
            // SAFETY: plain kill(2) on a pid we spawned and have not reaped yet.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (name, c) in &mut self.0 {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(c.try_wait(), Ok(None)) {
                eprintln!("{name} did not stop in time; killing it");
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Ctrl-C, SIGTERM (timeout, systemd, docker stop) or SIGHUP (a closed terminal): each stops
/// the run the same clean way.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup())) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn absolutize(v: &mut toml::Value, base: &Path) {
    if let Some(s) = v.as_str() {
        let p = Path::new(s);
        if p.is_relative() {
            *v = toml::Value::String(base.join(p).display().to_string());
        }
    }
}

/// The job file with absolute paths and the given learner addresses filled in.
fn patch_job(text: &str, base: &Path, learners: &[String]) -> Result<String> {
    let mut t: toml::Table = toml::from_str(text).context("job file is not valid TOML")?;
    if let Some(v) = t.get_mut("data").and_then(|d| d.get_mut("train")) {
        absolutize(v, base);
    }
    if let Some(v) = t.get_mut("output").and_then(|d| d.get_mut("dir")) {
        absolutize(v, base);
    }
    if let Some(v) = t.get_mut("eval").and_then(|d| d.get_mut("data")) {
        absolutize(v, base);
    }
    if let Some(agents) = t.get_mut("agents").and_then(toml::Value::as_array_mut) {
        for (k, a) in agents.iter_mut().enumerate() {
            let Some(a) = a.as_table_mut() else { continue };
            for key in ["model", "adapter"] {
                if let Some(v) = a.get_mut(key) {
                    absolutize(v, base);
                }
            }
            if let Some(addr) = learners.get(k) {
                a.insert("learner".into(), toml::Value::String(addr.clone()));
            }
        }
    }
    Ok(toml::to_string(&t)?)
}

fn agent_count(text: &str) -> Result<usize> {
    let t: toml::Table = toml::from_str(text).context("job file is not valid TOML")?;
    Ok(t.get("agents").and_then(toml::Value::as_array).map_or(0, Vec::len))
}

pub fn run(a: Args) -> Result<()> {
    let (default_workers, default_threads) = match a.job {
        None => a.example.workers(),
        Some(_) => (2, a.threads_per_process),
    };
    let workers = a.workers.unwrap_or(default_workers);
    let worker_threads = a.worker_threads.unwrap_or(default_threads);
    if workers == 0 {
        bail!("--workers must be at least 1: a job needs a rollout worker");
    }
    if worker_threads < 1 || a.threads_per_process < 1 {
        bail!("--worker-threads and --threads-per-process must be at least 1");
    }
    let logs = a.dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("--dir {}: cannot create {}", a.dir.display(), logs.display()))?;
    let dir = std::fs::canonicalize(&a.dir).with_context(|| format!("--dir {}", a.dir.display()))?;
    let job_path = match &a.job {
        Some(p) => std::fs::canonicalize(p).with_context(|| format!("job file {}", p.display()))?,
        None => examples::write(a.example, &dir)?,
    };
    let text = std::fs::read_to_string(&job_path).with_context(|| format!("reading {}", job_path.display()))?;
    let base = job_path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        // The coordinator, in this process.
        let coord_port = free_port()?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let args = comas_coordinator::cli::Args {
            listen: format!("127.0.0.1:{coord_port}").parse()?,
            metrics_listen: None,
            db: dir.join("jobs.sqlite"),
            heartbeat_ms: 1000,
            heartbeat_timeout_secs: 10,
            episode_timeout_secs: 1800,
            worker_wait_secs: 300,
        };
        let mut stop = stop_rx.clone();
        let coordinator = tokio::spawn(comas_coordinator::cli::run_async(args, async move {
            let _ = stop.wait_for(|v| *v).await;
        }));
        let address = format!("http://127.0.0.1:{coord_port}");
        let mut client = {
            let started = Instant::now();
            loop {
                match connect(&address).await {
                    Ok(c) => break c,
                    Err(e) if started.elapsed() > Duration::from_secs(10) => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        };
        // Resume an unfinished job of the same name in this folder, or submit this one.
        let name = comas_workflow::job::JobSpec::from_toml(&text).map(|s| s.name).map_err(|e| anyhow::anyhow!("{}: {e}", job_path.display()))?;
        let jobs = client.list_jobs(pb::ListJobsRequest {}).await.map_err(|s| anyhow::anyhow!(s.message().to_string()))?.into_inner().jobs;
        // A job that has not succeeded still owns this folder's checkpoints: it is resumed (a
        // failed or cancelled one queued again), never silently replaced.
        let open = |j: &pb::JobStatus| matches!(pb::JobState::try_from(j.state), Ok(pb::JobState::Queued | pb::JobState::Running | pb::JobState::Failed | pb::JobState::Cancelled));
        let mut unfinished = jobs.iter().find(|j| j.name == name && open(j)).cloned();
        let others: Vec<&pb::JobStatus> = jobs.iter().filter(|j| j.name != name && open(j)).collect();
        if a.fresh {
            for j in jobs.iter().filter(|j| open(j) && matches!(pb::JobState::try_from(j.state), Ok(pb::JobState::Queued | pb::JobState::Running))) {
                client.cancel_job(pb::CancelJobRequest { job_id: j.job_id.clone() }).await.map_err(|s| anyhow::anyhow!(s.message().to_string()))?;
            }
            if let Some(j) = unfinished.take() {
                eprintln!("--fresh: discarding job {} ({}) at step {}/{}", j.job_id, j.name, j.steps_done, j.total_steps);
            }
        } else if let (None, Some(o)) = (&unfinished, others.first()) {
            bail!(
                "{} holds the unfinished job {} (`{}`, step {}/{}, {}) and its checkpoints; run that job file again to resume it, use another --dir, or pass --fresh to discard it",
                dir.display(),
                o.job_id,
                o.name,
                o.steps_done,
                o.total_steps,
                state_name(o.state)
            );
        }
        if let Some(j) = &unfinished {
            if matches!(pb::JobState::try_from(j.state), Ok(pb::JobState::Failed | pb::JobState::Cancelled)) {
                eprintln!("job {} ({}) was {}: {}", j.job_id, j.name, state_name(j.state), if j.error.is_empty() { "-" } else { &j.error });
                client.resume_job(pb::ResumeJobRequest { job_id: j.job_id.clone() }).await.map_err(|s| anyhow::anyhow!(s.message().to_string()))?;
            }
        }
        let (learners, patched) = match &unfinished {
            Some(j) => {
                eprintln!("resuming job {} ({}) at step {}/{}", j.job_id, j.name, j.steps_done, j.total_steps);
                (j.agents.iter().map(|a| a.learner.clone()).collect::<Vec<_>>(), dir.join("job.toml"))
            }
            None => {
                // A new job starts from the base models, not from an older job's checkpoints.
                let ckpt = dir.join("checkpoints");
                if ckpt.exists() {
                    std::fs::remove_dir_all(&ckpt).with_context(|| format!("clearing {}", ckpt.display()))?;
                }
                let n = agent_count(&text)?;
                let learners = (0..n).map(|_| free_port().map(|p| format!("http://127.0.0.1:{p}"))).collect::<Result<Vec<_>>>()?;
                let patched = patch_job(&text, &base, &learners)?;
                comas_model::safetensors::write_atomic(&dir.join("job.toml"), |w| std::io::Write::write_all(w, patched.as_bytes()))?;
                (learners, dir.join("job.toml"))
            }
        };
        let mut children = Children(Vec::new());
        for (k, addr) in learners.iter().enumerate() {
            let listen = addr.trim_start_matches("http://").to_string();
            let args: Vec<String> = [
                "learner", "serve", "--job", &patched.display().to_string(), "--agent-id", &k.to_string(), "--listen", &listen,
                "--checkpoint-dir", &dir.join("checkpoints").join(format!("agent-{k}")).display().to_string(), "--resume", "--keep-checkpoints", "2",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            children.spawn(&format!("learner {k}"), &args, &dir.join("logs").join(format!("learner-{k}.log")), a.threads_per_process)?;
        }
        for i in 0..workers {
            let port = free_port()?;
            let args: Vec<String> = ["worker", "--listen", &format!("127.0.0.1:{port}"), "--coordinator", &address, "--device", &a.device, "--drain-secs", "30"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            children.spawn(&format!("worker {i}"), &args, &dir.join("logs").join(format!("worker-{i}.log")), worker_threads)?;
        }
        eprintln!("coordinator {address}, {} learners, {workers} workers; logs in {}", learners.len(), dir.join("logs").display());
        let job_id = match unfinished {
            Some(j) => j.job_id,
            None => {
                let patched_text = std::fs::read_to_string(&patched)?;
                let s = submit_text(&mut client, patched_text, String::new()).await?;
                eprintln!("submitted job {} ({}), {} steps; metrics in {}", s.job_id, s.name, s.total_steps, s.metrics_path);
                s.job_id
            }
        };
        let outcome = tokio::select! {
            r = watch(&mut client, &job_id, false) => Some(r),
            _ = stop_signal() => None,
            dead = async {
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if let Some(m) = children.exited() { break m; }
                }
            } => Some(Err(anyhow::anyhow!("{dead}; see the logs in {}", dir.join("logs").display()))),
        };
        // The coordinator first, so no step is cut off mid-call by a learner going away.
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(30), coordinator).await;
        drop(children);
        let Some(outcome) = outcome else {
            eprintln!("stopped; run the same command again to resume job {job_id} from its last completed step");
            bail!("interrupted");
        };
        let status = outcome?;
        if let Some(table) = examples::before_after(Path::new(&status.metrics_path)) {
            eprint!("{table}");
        }
        if a.json {
            println!("{}", serde_json::to_string_pretty(&status_json(&status))?);
        } else {
            eprintln!("job {} {}: {}/{} steps; metrics {}", status.job_id, state_name(status.state), status.steps_done, status.total_steps, status.metrics_path);
        }
        finish(&status)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patching_makes_paths_absolute_and_sets_learners() {
        let out = patch_job(examples::TINY_JOB, Path::new("/x"), &["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()]).unwrap();
        let spec = comas_workflow::job::JobSpec::from_toml(&out).unwrap();
        assert!(spec.relative_paths().is_empty());
        assert_eq!(spec.agents[1].model, PathBuf::from("/x/model-b"));
        assert_eq!(spec.agents[1].learner.as_deref(), Some("http://127.0.0.1:2"));
        assert_eq!(spec.data.train, PathBuf::from("/x/train.jsonl"));
        assert_eq!(spec.eval.unwrap().data, PathBuf::from("/x/test.jsonl"));
    }
}
