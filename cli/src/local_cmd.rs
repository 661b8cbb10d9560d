//! `comas local`: every service on one machine over loopback. The coordinator runs in this
//! process; each learner and rollout worker is a child process of this same binary, so a crash
//! of one is a crash of one, as on a cluster. Without a job file it runs a built-in example
//! (`examples.rs`): SmolLM2 by default, or tiny random models.
use crate::client_cmd::{connect, finish, state_name, status_json, submit_text, watch};
use crate::examples::{self, Example};
use anyhow::{bail, Context, Result};
use comas_proto::v1 as pb;
use comas_rollout_worker::engine::EngineKind;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Job file (TOML). Without one, the built-in example runs.
    job: Option<PathBuf>,
    /// Overrides of the job file's keys: `schedule.steps=10 agents.1.train.lr=2e-6` (dotted
    /// keys, an index for an [[agents]] entry, TOML values). The effective job is
    /// DIR/job.toml.
    overrides: Vec<String>,
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
    /// Checkpoints each learner keeps (the newest); more keep the adapters of earlier steps
    /// for evaluating them later (`comas eval --job-dir DIR --checkpoint N`).
    #[arg(long, env = "COMAS_LOCAL_KEEP_CHECKPOINTS", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    keep_checkpoints: u32,
    /// Print the final job status as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Start the job afresh from the base models, discarding any unfinished job in --dir and its
    /// checkpoints (without it, an unfinished job of the same name is resumed, and one of
    /// another name is an error).
    #[arg(long)]
    fresh: bool,
    /// Learner processes a NeuroMAS job's LoRA adapters are sharded over (agent k to learner
    /// k mod N): each holds the base once and trains its adapters one after another, with
    /// --threads-per-process threads per adapter up to the machine's cores. Other jobs run one
    /// learner per agent.
    #[arg(long, env = "COMAS_LOCAL_NEUROMAS_LEARNERS", default_value_t = 1)]
    neuromas_learners: usize,
    /// Plain gRPC between the services instead of mutual TLS (by default a throwaway CA and a
    /// certificate for the loopback names are made in --dir/tls on every run).
    #[arg(long, env = "COMAS_LOCAL_PLAINTEXT")]
    plaintext: bool,
    /// What generates the workers' turns: comas's own engine, or a vLLM server per worker and
    /// base model (install it with `bash scripts/setup-vllm.sh`; --worker-threads are its
    /// threads).
    #[arg(long, env = "COMAS_LOCAL_ENGINE", value_enum, default_value = "comas")]
    engine: comas_rollout_worker::engine::EngineKind,
}

/// Makes this run's CA and certificate (mutual TLS between every service), or, with
/// `plaintext`, none; the settings every service of the run gets.
fn run_tls(dir: &Path, plaintext: bool) -> Result<comas_service::tls::TlsArgs> {
    if plaintext {
        return Ok(comas_service::tls::TlsArgs::default());
    }
    let ca = comas_service::tls::Authority::new("comas local CA")?;
    let files = ca.write_local(&dir.join("tls"))?;
    Ok(comas_service::tls::TlsArgs::from_files(&files))
}

/// The scheme of this run's addresses.
fn scheme(tls: &comas_service::tls::TlsArgs) -> &'static str {
    if tls.ca.is_some() {
        "https"
    } else {
        "http"
    }
}

/// Child processes, stopped with SIGTERM (then SIGKILL after a grace period) when dropped.
/// The services started, each with its log.
struct Children(Vec<(String, Child, PathBuf)>);

impl Children {
    /// Starts `name`, handing it the listening sockets in `sockets` (its flags name them as
    /// `fd:N`); this process's copies close when they are dropped after the call.
    fn spawn(
        &mut self,
        name: &str,
        args: &[String],
        env: &[(&str, String)],
        log: &Path,
        threads: i32,
        sockets: &[&std::net::TcpListener],
    ) -> Result<()> {
        let exe = std::env::current_exe()?;
        // Appended to, so an earlier run's log (perhaps the one that says why it failed) stays.
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        std::io::Write::write_all(
            &mut out,
            format!(
                "==== comas local (pid {}) starts {name} at unix time {since}\n",
                std::process::id()
            )
            .as_bytes(),
        )
        .with_context(|| format!("writing {}", log.display()))?;
        let parent = std::process::id() as libc::pid_t;
        let fds: Vec<i32> = sockets.iter().map(|l| l.as_raw_fd()).collect();
        let mut cmd = Command::new(exe);
        // Own process group: Ctrl-C reaches only this process, which then stops the children in order.
        cmd.process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls: prctl, getppid, fcntl,
        // _exit. The child gets SIGTERM when this process dies however it dies (SIGKILL
        // included), and exits at once if it already has. Its sockets lose close-on-exec in the
        // child alone, so no other child inherits them.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                for &fd in &fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        // The run's TLS settings and nothing inherited: a child never mixes them with others.
        for var in [
            "COMAS_TLS_CERT",
            "COMAS_TLS_KEY",
            "COMAS_TLS_CA",
            "COMAS_TLS_SERVER_NAME",
            "COMAS_TLS_CLIENT_AUTH",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .env("COMAS_THREADS", threads.to_string())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let metrics = sockets
            .get(1)
            .and_then(|l| l.local_addr().ok())
            .map(|a| format!(", metrics http://{a}/metrics"))
            .unwrap_or_default();
        eprintln!("{name}: pid {}{metrics}, log {}", child.id(), log.display());
        self.0.push((name.to_string(), child, log.to_path_buf()));
        Ok(())
    }

    /// A child that exited on its own, with its status and the end of its log (which says why,
    /// as an unknown `--device` does).
    fn exited(&mut self) -> Option<String> {
        self.0.iter_mut().find_map(|(n, c, log)| {
            let status = c.try_wait().ok().flatten()?;
            let tail = log_tail(log, 3);
            Some(if tail.is_empty() {
                format!("{n} exited ({status})")
            } else {
                format!("{n} exited ({status}); the end of its log:\n{tail}")
            })
        })
    }
}

/// The last `lines` non-empty lines of a log, each cut to 300 characters.
fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[text.len().saturating_sub(16 * 1024)..]).into_owned();
    let mut tail: Vec<String> = text
        .lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(lines)
        .map(|l| l.chars().take(300).collect::<String>())
        .collect();
    tail.reverse();
    tail.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c, _) in &self.0 {
            // SAFETY: plain kill(2) on a pid we spawned and have not reaped yet.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (name, c, _) in &mut self.0 {
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
/// SIGINT, SIGTERM and SIGHUP, caught from the moment this is created rather than when first
/// awaited: a signal that arrives while the run starts (children spawning, the job being
/// submitted) waits here and then stops the run as cleanly as a later one.
struct StopSignal {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopSignal {
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let on = |k: SignalKind| signal(k).context("installing the stop-signal handlers");
        Ok(Self {
            int: on(SignalKind::interrupt())?,
            term: on(SignalKind::terminate())?,
            hup: on(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

/// A loopback listening socket on a port the kernel picks: bound here and passed on, never
/// picked by binding and dropping, so two services can never be given the same port.
fn loopback() -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind("127.0.0.1:0").context("binding a loopback port")
}

/// The `fd:N` flag value that hands `l` to a child.
fn fd_flag(l: &std::net::TcpListener) -> String {
    comas_service::Listen::Fd(l.as_raw_fd()).to_string()
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
    absolute_paths(&mut t, base);
    if let Some(agents) = t.get_mut("agents").and_then(toml::Value::as_array_mut) {
        for (k, a) in agents.iter_mut().enumerate() {
            let Some(a) = a.as_table_mut() else { continue };
            if let Some(addr) = learners.get(k) {
                a.insert("learner".into(), toml::Value::String(addr.clone()));
            }
        }
    }
    Ok(toml::to_string(&t)?)
}

/// Makes the paths a job table names relative to `base` absolute, so it runs from anywhere.
pub(crate) fn absolute_paths(t: &mut toml::Table, base: &Path) {
    for (table, key) in [("data", "train"), ("output", "dir"), ("eval", "data")] {
        if let Some(v) = t.get_mut(table).and_then(|d| d.get_mut(key)) {
            absolutize(v, base);
        }
    }
    for list in ["agents", "frozen"] {
        for a in t.get_mut(list).and_then(toml::Value::as_array_mut).into_iter().flatten() {
            let Some(a) = a.as_table_mut() else { continue };
            for key in ["model", "adapter", "init_from"] {
                if let Some(v) = a.get_mut(key) {
                    absolutize(v, base);
                }
            }
        }
    }
}

/// Agents that share an address share a learner process, in order of their first agent.
fn groups_by_address(addresses: &[String]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (k, a) in addresses.iter().enumerate() {
        match groups.iter_mut().find(|(addr, _)| addr == a) {
            Some((_, g)) => g.push(k),
            None => groups.push((a.clone(), vec![k])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// The learner processes of a new job: a NeuroMAS job whose agents are all LoRA adapters over
/// one base has them sharded over `shards` learners (agent k to learner k mod shards); any
/// other job has one learner per agent.
fn learner_groups(text: &str, shards: usize) -> Result<Vec<Vec<usize>>> {
    let t: toml::Table = toml::from_str(text).context("job file is not valid TOML")?;
    let agents: Vec<&toml::Table> = t
        .get("agents")
        .and_then(toml::Value::as_array)
        .map(|a| a.iter().filter_map(toml::Value::as_table).collect())
        .unwrap_or_default();
    let lora = |a: &toml::Table| {
        a.get("train").and_then(|t| t.get("lora")).is_some()
            || a.get("adapter").is_some()
            || a.get("init_from").is_some()
    };
    let one_base = agents.windows(2).all(|w| w[0].get("model") == w[1].get("model"));
    let neuromas = t.get("method").and_then(toml::Value::as_str) == Some("neuromas");
    if !(neuromas && one_base && agents.iter().all(|a| lora(a))) || agents.len() < 2 {
        return Ok((0..agents.len()).map(|k| vec![k]).collect());
    }
    if shards == 0 {
        bail!("--neuromas-learners must be at least 1");
    }
    let n = shards.min(agents.len());
    Ok((0..n).map(|i| (i..agents.len()).step_by(n).collect()).collect())
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
    if a.engine == EngineKind::Vllm {
        let python = std::env::var_os("COMAS_WORKER_VLLM_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(comas_rollout_worker::cli::default_vllm_python);
        comas_rollout_worker::vllm::check_python(&python).context("--engine vllm")?;
    }
    let logs = a.dir.join("logs");
    std::fs::create_dir_all(&logs)
        .with_context(|| format!("--dir {}: cannot create {}", a.dir.display(), logs.display()))?;
    let dir =
        std::fs::canonicalize(&a.dir).with_context(|| format!("--dir {}", a.dir.display()))?;
    // One run per folder, taken before anything in it is written: two runs would share the job
    // store, the example's files and the learners' checkpoints.
    let _one_run = comas_service::exclusive_lock(&dir.join("local.lock")).map_err(|e| match e {
        comas_service::LockError::Held { holder, .. } => {
            anyhow::anyhow!("{} is in use by another comas local ({holder}); wait for it or stop it, or use another --dir", dir.display())
        }
        other => anyhow::anyhow!("--dir {}: {other}", dir.display()),
    })?;
    // `comas local key=value ...` overrides the built-in example's job.
    let (job, overrides) = match &a.job {
        Some(p) if p.to_string_lossy().contains('=') && !p.exists() => {
            (None, [vec![p.to_string_lossy().into_owned()], a.overrides.clone()].concat())
        }
        _ => (a.job.clone(), a.overrides.clone()),
    };
    let job_path = match &job {
        Some(p) => std::fs::canonicalize(p).with_context(|| format!("job file {}", p.display()))?,
        None => examples::write(a.example, &dir)?,
    };
    let text = std::fs::read_to_string(&job_path)
        .with_context(|| format!("reading {}", job_path.display()))?;
    let text = crate::client_cmd::with_overrides(text, &overrides)
        .with_context(|| format!("{}", job_path.display()))?;
    let base = job_path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let mut stop_signal = StopSignal::install()?;
        // The coordinator, in this process, on sockets bound before anything else starts.
        let coord_listener = loopback()?;
        let coord_metrics = loopback()?;
        let tls = run_tls(&dir, a.plaintext)?;
        let address = format!("{}://{}", scheme(&tls), coord_listener.local_addr()?);
        let metrics_address = format!("http://{}/metrics", coord_metrics.local_addr()?);
        coord_listener.set_nonblocking(true)?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let settings = comas_coordinator::server::ServerSettings {
            listener: tokio::net::TcpListener::from_std(coord_listener)?,
            metrics_listen: Some(comas_service::Listen::Fd(coord_metrics.into_raw_fd())),
            db: dir.join("jobs.sqlite"),
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(10),
            episode_timeout: Duration::from_secs(1800),
            worker_wait: Duration::from_secs(300),
            relay_fanout: comas_coordinator::scheduler::DEFAULT_RELAY_FANOUT,
            allowed_roots: comas_service::AllowedRoots::default(),
            tokens: None,
            submit_per_minute: 0,
            // Also this process's client set-up, used by the job API calls below.
            tls: tls.service()?,
            health_listen: None,
        };
        let mut stop = stop_rx.clone();
        let mut coordinator = tokio::spawn(comas_coordinator::server::serve(settings, async move {
            let _ = stop.wait_for(|v| *v).await;
        }));
        let mut client = {
            let started = Instant::now();
            loop {
                // A coordinator that cannot start (its store taken by another run) says why.
                if coordinator.is_finished() {
                    let why = match (&mut coordinator).await {
                        Ok(Err(e)) => e.to_string(),
                        Ok(Ok(())) => "it stopped".to_string(),
                        Err(e) => e.to_string(),
                    };
                    bail!("the coordinator did not start: {why}");
                }
                match connect(&address).await {
                    Ok(c) => break c,
                    Err(e) if started.elapsed() > Duration::from_secs(10) => return Err(e),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        };
        // Resume an unfinished job of the same name in this folder, or submit this one.
        let name = comas_workflow::job::JobSpec::from_toml(&text).map(|s| s.name).map_err(|e| anyhow::anyhow!("{}: {e}", job_path.display()))?;
        let jobs = client.list_jobs(pb::ListJobsRequest {}).await.map_err(|s| anyhow::anyhow!(comas_service::tls::status_text(&s)))?.into_inner().jobs;
        // A job that has not succeeded still owns this folder's checkpoints: it is resumed (a
        // failed or cancelled one queued again), never silently replaced.
        let open = |j: &pb::JobStatus| matches!(pb::JobState::try_from(j.state), Ok(pb::JobState::Queued | pb::JobState::Running | pb::JobState::Failed | pb::JobState::Cancelled));
        let mut unfinished = jobs.iter().find(|j| j.name == name && open(j)).cloned();
        let others: Vec<&pb::JobStatus> = jobs.iter().filter(|j| j.name != name && open(j)).collect();
        if a.fresh {
            for j in jobs.iter().filter(|j| open(j) && matches!(pb::JobState::try_from(j.state), Ok(pb::JobState::Queued | pb::JobState::Running))) {
                client.cancel_job(pb::CancelJobRequest { job_id: j.job_id.clone() }).await.map_err(|s| anyhow::anyhow!(comas_service::tls::status_text(&s)))?;
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
                client.resume_job(pb::ResumeJobRequest { job_id: j.job_id.clone() }).await.map_err(|s| anyhow::anyhow!(comas_service::tls::status_text(&s)))?;
            }
        }
        // Each learner process: the agents it trains and its socket.
        let (groups, sockets, patched): (Vec<Vec<usize>>, Vec<std::net::TcpListener>, PathBuf) = match &unfinished {
            Some(j) => {
                eprintln!("resuming job {} ({}) at step {}/{}", j.job_id, j.name, j.steps_done, j.total_steps);
                // The job names its learners' addresses: the same ports are bound again, one
                // learner per address.
                let addresses: Vec<String> = j.agents.iter().map(|a| a.learner.clone()).collect();
                let groups = groups_by_address(&addresses);
                let sockets = groups
                    .iter()
                    .map(|g| {
                        let at = addresses[g[0]].trim_start_matches("http://").trim_start_matches("https://");
                        std::net::TcpListener::bind(at).with_context(|| format!("learner {} of job {} listens on {at}, which is in use: is another comas local, or an old learner, still running?", g[0], j.job_id))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (groups, sockets, dir.join("job.toml"))
            }
            None => {
                // A new job starts from the base models, not from an older job's checkpoints.
                let ckpt = dir.join("checkpoints");
                if ckpt.exists() {
                    std::fs::remove_dir_all(&ckpt).with_context(|| format!("clearing {}", ckpt.display()))?;
                }
                let groups = learner_groups(&text, a.neuromas_learners)?;
                let sockets = groups.iter().map(|_| loopback()).collect::<Result<Vec<_>>>()?;
                let mut learners = vec![String::new(); agent_count(&text)?];
                for (g, l) in groups.iter().zip(&sockets) {
                    let addr = format!("{}://{}", scheme(&tls), l.local_addr()?);
                    for &k in g {
                        learners[k] = addr.clone();
                    }
                }
                let patched = patch_job(&text, &base, &learners)?;
                comas_model::safetensors::write_atomic(&dir.join("job.toml"), |w| std::io::Write::write_all(w, patched.as_bytes()))?;
                (groups, sockets, dir.join("job.toml"))
            }
        };
        let mut children = Children(Vec::new());
        let env = tls.to_env();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as i32;
        for (g, listener) in groups.iter().zip(sockets) {
            let metrics = loopback()?;
            let ids: Vec<String> = g.iter().map(usize::to_string).collect();
            // One agent: its own checkpoint folder, as always; several: the learner makes
            // agent-k folders under the one it is given, the same layout.
            let ckpt = if g.len() == 1 { dir.join("checkpoints").join(format!("agent-{}", g[0])) } else { dir.join("checkpoints") };
            let args: Vec<String> = [
                "learner", "serve", "--job", &patched.display().to_string(), "--agent-id", &ids.join(","), "--listen", &fd_flag(&listener),
                "--metrics-listen", &fd_flag(&metrics),
                "--checkpoint-dir", &ckpt.display().to_string(), "--resume", "--keep-checkpoints", &a.keep_checkpoints.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let threads = if g.len() == 1 { a.threads_per_process } else { (a.threads_per_process * g.len() as i32).min(cores).max(a.threads_per_process) };
            let name = if g.len() == 1 { format!("learner {}", g[0]) } else { format!("learner of agents {}", ids.join(",")) };
            children.spawn(&name, &args, &env, &dir.join("logs").join(format!("learner-{}.log", ids.join("-"))), threads, &[&listener, &metrics])?;
        }
        let learners = groups.len();
        for i in 0..workers {
            let (listener, metrics) = (loopback()?, loopback()?);
            let engine = if a.engine == EngineKind::Vllm { "vllm" } else { "comas" };
            let args: Vec<String> =
                ["worker", "--listen", &fd_flag(&listener), "--metrics-listen", &fd_flag(&metrics), "--coordinator", &address, "--device", &a.device, "--drain-secs", "30", "--engine", engine]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            children.spawn(&format!("worker {i}"), &args, &env, &dir.join("logs").join(format!("worker-{i}.log")), worker_threads, &[&listener, &metrics])?;
        }
        eprintln!("coordinator {address}, metrics {metrics_address}, {learners} learners, {workers} workers; logs in {}", dir.join("logs").display());
        if !tls.to_env().is_empty() {
            let vars: Vec<String> = tls.to_env().iter().map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!("mutual TLS; from another shell: {} comas list --coordinator {address}", vars.join(" "));
        }
        let job_id = match unfinished {
            Some(j) => j.job_id,
            None => {
                let patched_text = std::fs::read_to_string(&patched)?;
                // The checkpoints of any earlier job of this name were cleared above.
                let s = submit_text(&mut client, patched_text, String::new(), true).await?;
                eprintln!("submitted job {} ({}), {} steps; metrics in {}", s.job_id, s.name, s.total_steps, s.metrics_path);
                s.job_id
            }
        };
        let outcome = tokio::select! {
            r = watch(&mut client, &job_id, false) => Some(r),
            _ = stop_signal.recv() => None,
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
mod tests;
