//! The shared cluster harness of the end-to-end tests: real `comas` processes on loopback (a
//! coordinator, learners, rollout workers), started, watched, killed and read back.
#![allow(dead_code)]
use comas_proto::v1 as pb;
use comas_proto::v1::coordinator_client::CoordinatorClient;
use comas_proto::v1::learner_client::LearnerClient;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod comas_job;
pub mod delay_line;
mod fleet;
mod method_jobs;
mod net_cluster;
pub mod netns;
#[allow(unused_imports)] // not every test file builds the CoMAS job
pub use comas_job::*;
#[allow(unused_imports)]
pub use fleet::*;
#[allow(unused_imports)]
pub use method_jobs::*;

pub struct Proc {
    pub name: String,
    pub child: Child,
}

impl Proc {
    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A port for a service the test starts (below the kernel's ephemeral range: see
/// `comas_service::port`).
pub fn free_port() -> u16 {
    comas_service::port::spare_port().unwrap()
}

pub fn spawn(dir: &Path, name: &str, args: &[String]) -> Proc {
    spawn_with(dir, name, args, &[])
}

pub fn spawn_with(dir: &Path, name: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
    spawn_in(None, dir, name, args, env)
}

/// As `spawn_with`, in network namespace `ns` when one is given. The process is killed when
/// the test process dies, however it dies.
pub fn spawn_in(
    ns: Option<&str>,
    dir: &Path,
    name: &str,
    args: &[String],
    env: &[(&str, &str)],
) -> Proc {
    use std::os::unix::process::CommandExt;
    // Appended, so a restarted service's log follows the one before it.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .unwrap();
    let mut cmd = netns::command_in(ns, env!("CARGO_BIN_EXE_comas"));
    // SAFETY: prctl(2) in the child before exec; async-signal-safe, touches no memory.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd
        .args(args)
        .envs(env.iter().copied())
        .env("COMAS_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Proc { name: name.into(), child }
}

/// The machine's busiest processes and its memory, for a timeout's message: a job that stalls
/// on CI alone is otherwise hard to tell from one starved by another process.
pub fn machine_state() -> String {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("{cmd}: {e}\n"))
    };
    let ps = run("ps", &["-eo", "pid,ppid,stat,pcpu,rss,etime,args", "--sort=-pcpu"]);
    let busiest: Vec<String> = ps.lines().take(25).map(|l| l.chars().take(200).collect()).collect();
    format!(
        "--- processes, busiest first ---\n{}\n--- memory ---\n{}",
        busiest.join("\n"),
        run("free", &["-m"])
    )
}

/// `comas serve` on `model` as `name`, on a free port: the process (killed when dropped, so a
/// failing test leaves no server behind) and the URL its first line says it serves at.
pub fn serve(model: &Path, name: &str) -> (Proc, String) {
    serve_with(model, name, &[])
}

/// [`serve`] with more environment variables.
pub fn serve_with(model: &Path, name: &str, env: &[(&str, &str)]) -> (Proc, String) {
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(["serve", "--model", model.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--served-name", name])
        .env("COMAS_THREADS", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The first line says where it listens (port 0: whatever was free).
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line
        .trim()
        .strip_prefix(&format!("comas serve: {name} at "))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (Proc { name: "serve".into(), child: server }, url)
}

/// Metric `name` from the Prometheus endpoint at `at` (address, port).
pub fn scrape(at: &(String, u16), name: &str) -> f64 {
    try_scrape(at, name).unwrap_or_else(|| panic!("{name} not in the metrics at {}:{}", at.0, at.1))
}

/// As `scrape`; `None` while the endpoint is not up or lacks the metric.
pub fn try_scrape(at: &(String, u16), name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect((at.0.as_str(), at.1)).ok()?;
    write!(sock, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut body = String::new();
    sock.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).and_then(|v| v.trim().parse().ok()))
}

pub fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

pub struct Cluster {
    pub dir: PathBuf,
    pub coord_port: u16,
    pub metrics_port: u16,
    pub learner_ports: Vec<u16>,
    /// Each learner's `--agent-id` (its index, unless one learner trains several agents).
    pub learner_agents: Vec<String>,
    pub coordinator: Option<Proc>,
    pub coordinator_flags: Vec<String>,
    pub learners: Vec<Option<Proc>>,
    pub workers: Vec<Proc>,
    pub steps: u64,
    pub worker_flags: Vec<String>,
    /// Learner k's flags besides the harness's own (none where the list is shorter).
    pub learner_flags: Vec<Vec<String>>,
    /// Environment of every service process (TLS files).
    pub env: Vec<(String, String)>,
    /// Each service in its own network namespace (`netns::Net`), else all on loopback.
    pub net: Option<netns::Net>,
}

impl Cluster {
    /// Starts the coordinator, one learner per port and the workers for the job in `dir`.
    pub fn launch(
        dir: &Path,
        learner_ports: Vec<u16>,
        workers: usize,
        coordinator_flags: &[&str],
        steps: u64,
        worker_flags: &[&str],
    ) -> Self {
        Self::launch_env(dir, learner_ports, workers, coordinator_flags, steps, worker_flags, &[])
    }

    /// As `launch`, every service with `env` set.
    pub fn launch_env(
        dir: &Path,
        learner_ports: Vec<u16>,
        workers: usize,
        coordinator_flags: &[&str],
        steps: u64,
        worker_flags: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        Self::launch_full(
            dir,
            learner_ports,
            workers,
            coordinator_flags,
            steps,
            worker_flags,
            env,
            None,
        )
    }

    /// As `launch_env`, each service in its namespace of `net` when one is given.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_full(
        dir: &Path,
        learner_ports: Vec<u16>,
        workers: usize,
        coordinator_flags: &[&str],
        steps: u64,
        worker_flags: &[&str],
        env: &[(&str, String)],
        net: Option<netns::Net>,
    ) -> Self {
        let mut c = Self::unstarted(dir, learner_ports, steps, coordinator_flags, worker_flags);
        c.env = env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        c.net = net;
        c.start(workers)
    }

    /// As `launch`, with one learner process on `port` training all `agents`.
    pub fn launch_one_learner(
        dir: &Path,
        port: u16,
        agents: usize,
        workers: usize,
        coordinator_flags: &[&str],
        steps: u64,
        worker_flags: &[&str],
    ) -> Self {
        let mut c = Self::unstarted(dir, vec![port], steps, coordinator_flags, worker_flags);
        c.learner_agents = vec![(0..agents).map(|k| k.to_string()).collect::<Vec<_>>().join(",")];
        c.start(workers)
    }

    /// A cluster of one learner per port (agent k on port k), nothing started yet.
    pub fn unstarted(
        dir: &Path,
        learner_ports: Vec<u16>,
        steps: u64,
        coordinator_flags: &[&str],
        worker_flags: &[&str],
    ) -> Self {
        let n = learner_ports.len();
        Cluster {
            dir: dir.to_path_buf(),
            coord_port: free_port(),
            metrics_port: free_port(),
            learner_agents: (0..n).map(|k| k.to_string()).collect(),
            learner_ports,
            coordinator: None,
            coordinator_flags: s(coordinator_flags),
            learners: (0..n).map(|_| None).collect(),
            workers: Vec::new(),
            steps,
            worker_flags: s(worker_flags),
            learner_flags: Vec::new(),
            env: Vec::new(),
            net: None,
        }
    }

    /// Starts the coordinator, every learner and `workers` workers.
    pub fn start(mut self, workers: usize) -> Self {
        self.start_coordinator();
        for k in 0..self.learner_ports.len() {
            self.start_learner(k);
        }
        for _ in 0..workers {
            self.add_worker();
        }
        self
    }

    pub fn start_coordinator(&mut self) {
        let mut args = s(&[
            "coordinator",
            "--listen",
            &format!("{}:{}", self.ip_of("coordinator"), self.coord_port),
            "--metrics-listen",
            &format!("{}:{}", self.ip_of("coordinator"), self.metrics_port),
            "--db",
            &self.dir.join("jobs.sqlite").display().to_string(),
        ]);
        // The harness's defaults, unless the test's own flags set them.
        for (flag, value) in [
            ("--heartbeat-ms", "300"),
            ("--heartbeat-timeout-secs", "5"),
            ("--worker-wait-secs", "120"),
        ] {
            if !self.coordinator_flags.iter().any(|f| f == flag) {
                args.extend(s(&[flag, value]));
            }
        }
        args.extend(self.coordinator_flags.iter().cloned());
        // On an emulated network the tests read workers' comings and goings from its log.
        let info = [("COMAS_LOG", "info,h2=warn,hyper=warn,tower=warn")];
        let more: &[(&str, &str)] = if self.net.is_some() { &info } else { &[] };
        self.coordinator = Some(self.spawn("coordinator", &args, &self.env_with(more)));
    }

    pub fn start_learner(&mut self, k: usize) {
        self.start_learner_with(k, &[]);
    }

    pub fn start_learner_with(&mut self, k: usize, env: &[(&str, &str)]) {
        let mut args = s(&[
            "learner",
            "serve",
            "--job",
            &self.dir.join("job.toml").display().to_string(),
            "--agent-id",
            &self.learner_agents[k],
            "--listen",
            &format!("{}:{}", self.ip_of(&format!("learner-{k}")), self.learner_ports[k]),
            "--checkpoint-dir",
            &self.dir.join(format!("ckpt-{k}")).display().to_string(),
            "--resume",
            // One checkpoint kept: a resumed learner must not depend on the one it started from.
            "--keep-checkpoints",
            "1",
        ]);
        args.extend(self.learner_flags.get(k).into_iter().flatten().cloned());
        self.learners[k] = Some(self.spawn(&format!("learner-{k}"), &args, &self.env_with(env)));
    }

    pub fn add_worker(&mut self) {
        self.add_worker_with(&[]);
    }

    pub fn add_worker_with(&mut self, env: &[(&str, &str)]) {
        let i = self.workers.len();
        let w = self.worker(i, env);
        self.workers.push(w);
    }

    pub fn worker(&self, i: usize, env: &[(&str, &str)]) -> Proc {
        self.worker_with_flags(i, env, &[])
    }

    fn worker_with_flags(&self, i: usize, env: &[(&str, &str)], flags: &[String]) -> Proc {
        let mut args = s(&[
            "worker",
            "--listen",
            &format!("{}:{}", self.ip_of(&format!("worker-{i}")), free_port()),
            "--coordinator",
            &self.coordinator_url(),
        ]);
        args.extend(self.worker_flags.iter().cloned());
        args.extend(flags.iter().cloned());
        // The worker's temporary folder (its vLLM servers' logs) lies in the test's, whose
        // failures then show those logs, and its vLLM servers' starts are in its own log.
        let tmp = self.dir.to_str().unwrap();
        let mut more = vec![("TMPDIR", tmp), ("COMAS_LOG", "warn,comas_rollout_worker::vllm=info")];
        more.extend(env.iter().copied());
        self.spawn(&format!("worker-{i}"), &args, &self.env_with(&more))
    }

    /// Adds a worker that serves Prometheus metrics; returns where to scrape them
    /// (`scrape(&address, name)`).
    pub fn add_worker_with_metrics(&mut self, env: &[(&str, &str)]) -> (String, u16) {
        let i = self.workers.len();
        let at = (self.ip_of(&format!("worker-{i}")), free_port());
        let w = self.worker_with_flags(
            i,
            env,
            &s(&["--metrics-listen", &format!("{}:{}", at.0, at.1)]),
        );
        self.workers.push(w);
        at
    }

    /// Starts service `name` in its namespace, if the cluster has a net.
    fn spawn(&self, name: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        let ns = self.net.as_ref().and_then(|n| n.ns_of(name));
        spawn_in(ns, &self.dir, name, args, env)
    }

    /// The address `service` listens on: its namespace's, or loopback.
    pub fn ip_of(&self, service: &str) -> String {
        self.net.as_ref().map_or_else(|| "127.0.0.1".to_string(), |n| n.ip(service).to_string())
    }

    /// `https` when the services hold certificates.
    pub fn scheme(&self) -> &'static str {
        if self.env.iter().any(|(k, _)| k == "COMAS_TLS_CERT") {
            "https"
        } else {
            "http"
        }
    }

    pub fn coordinator_url(&self) -> String {
        format!("{}://{}:{}", self.scheme(), self.ip_of("coordinator"), self.coord_port)
    }

    pub fn learner_url(&self, k: usize) -> String {
        format!(
            "{}://{}:{}",
            self.scheme(),
            self.ip_of(&format!("learner-{k}")),
            self.learner_ports[k]
        )
    }

    /// A channel to `url` with this process's TLS (none unless a test installed one).
    async fn channel(url: &str) -> Result<tonic::transport::Channel, String> {
        comas_service::tls::channel(url, |e| e).await.map_err(|e| e.to_string())
    }

    /// The cluster's environment and `more`.
    pub fn env_with<'a>(&'a self, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain(more.iter().copied()).collect()
    }

    /// Waits until the coordinator's gRPC port takes connections: a client the test does not
    /// drive through `client()` (a third-party one) gets no retry of its own.
    pub async fn coordinator_listening(&self) {
        let at = (self.ip_of("coordinator"), self.coord_port);
        let started = Instant::now();
        while std::net::TcpStream::connect((at.0.as_str(), at.1)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the coordinator did not listen within 60 s\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn client(&self) -> CoordinatorClient<tonic::transport::Channel> {
        let started = Instant::now();
        loop {
            match Self::channel(&self.coordinator_url()).await {
                Ok(c) => return CoordinatorClient::new(c),
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    panic!("coordinator unreachable: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Waits until `n` workers are registered and ready (policies loaded).
    pub async fn ready_workers(&self, n: usize) {
        let started = Instant::now();
        loop {
            let list = self.client().await.list_workers(pb::ListWorkersRequest {}).await;
            let ready =
                list.map_or(0, |r| r.into_inner().workers.iter().filter(|w| w.ready).count());
            if ready >= n {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{ready} of {n} workers ready after 120 s\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn submit(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("job.toml")).unwrap();
        let r = self
            .client()
            .await
            .submit_job(pb::SubmitJobRequest {
                job_toml: text,
                base_dir: self.dir.display().to_string(),
                reuse_name: false,
            })
            .await;
        r.unwrap_or_else(|e| panic!("submit: {}", e.message())).into_inner().job_id
    }

    pub async fn status(&self, id: &str) -> Option<pb::JobStatus> {
        let mut c = CoordinatorClient::new(Self::channel(&self.coordinator_url()).await.ok()?);
        c.get_job(pb::GetJobRequest { job_id: id.into() }).await.ok().map(|r| r.into_inner())
    }

    /// Polls until `pred` holds; panics with the logs' tails after `secs`.
    pub async fn wait_for(
        &self,
        id: &str,
        secs: u64,
        what: &str,
        pred: impl Fn(&pb::JobStatus) -> bool,
    ) -> pb::JobStatus {
        let started = Instant::now();
        loop {
            if let Some(st) = self.status(id).await {
                if pred(&st) {
                    return st;
                }
                if st.state == pb::JobState::Failed as i32 {
                    panic!("job failed while waiting for {what}: {}\n{}", st.error, self.logs());
                }
            }
            if started.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "timed out waiting for {what}: {:?}\n{}\n{}",
                    self.status(id).await,
                    self.logs(),
                    machine_state()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Follows the job's event stream and returns at the first event whose status matches, so
    /// short windows (a step's rollout) are never missed between polls.
    pub async fn on_event(
        &self,
        id: &str,
        secs: u64,
        what: &str,
        pred: impl Fn(&pb::JobStatus) -> bool,
    ) -> pb::JobStatus {
        let mut c = self.client().await;
        let mut stream =
            c.watch_job(pb::WatchJobRequest { job_id: id.into() }).await.unwrap().into_inner();
        let found = tokio::time::timeout(Duration::from_secs(secs), async {
            while let Some(ev) = stream.message().await.unwrap() {
                let st = ev.status.unwrap();
                if pred(&st) {
                    return Some(st);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(st)) => st,
            other => panic!("no event for {what} ({other:?})\n{}", self.logs()),
        }
    }

    pub async fn finished(&self, id: &str) -> pb::JobStatus {
        self.finished_within(id, 240).await
    }

    /// As `finished`, waiting up to `secs` (jobs whose workers start inference servers).
    pub async fn finished_within(&self, id: &str, secs: u64) -> pb::JobStatus {
        let st = self
            .wait_for(id, secs, "the job to end", |s| s.state >= pb::JobState::Succeeded as i32)
            .await;
        assert_eq!(
            st.state,
            pb::JobState::Succeeded as i32,
            "job ended {}: {}\n{}",
            st.state,
            st.error,
            self.logs()
        );
        st
    }

    /// The tails of the services' logs, and of the vLLM servers' their workers started.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let files = |d: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(d).into_iter().flatten().flatten().map(|e| e.path()).collect()
        };
        let top = files(&self.dir);
        let servers = top.iter().filter(|p| {
            p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("comas-worker-vllm-"))
        });
        let inner: Vec<PathBuf> = servers.flat_map(|d| files(d)).collect();
        for p in top.iter().chain(&inner) {
            if p.extension().is_some_and(|x| x == "log") {
                let t = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: String = t
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                out.push_str(&format!("--- {} ---\n{tail}\n", p.display()));
            }
        }
        out
    }

    /// `comas resume` on a failed job, which must then end with the exact counts.
    pub async fn resume_to_exact_end(&self, id: &str) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_comas"))
            .args(["resume", id, "--coordinator", &self.coordinator_url()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        self.finished(id).await;
        self.check_complete_run().await;
    }

    /// Asserts that each agent's final weights equal those of the undisturbed run in `calm`.
    pub fn assert_final_weights_equal(&self, calm: &Path, disturbances: &[String]) {
        for k in 0..2 {
            let file = |d: &Path| {
                std::fs::read(d.join(format!("out/agent-{k}/model.safetensors"))).unwrap()
            };
            assert!(
                file(&self.dir) == file(calm),
                "agent {k}'s final weights differ from the undisturbed run's ({disturbances:?})"
            );
        }
    }

    /// The metrics log's records of one kind (`step` or `eval`), in file order.
    pub fn log_of(&self, kind: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.join("out/metrics.jsonl")).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|m| m["kind"] == kind)
            .collect()
    }

    pub fn metrics_log(&self) -> Vec<Value> {
        self.log_of("step")
    }

    /// The coordinator's metric `name`.
    pub fn prometheus(&self, name: &str) -> f64 {
        scrape(&(self.ip_of("coordinator"), self.metrics_port), name)
    }

    /// Learner `k`'s progress in its step: served beside its training thread, so it answers
    /// while that thread is busy or stuck.
    pub async fn learner_progress(&self, k: usize) -> pb::TrainProgressReport {
        let mut c = LearnerClient::new(Self::channel(&self.learner_url(k)).await.unwrap());
        c.train_progress(pb::TrainProgressRequest {}).await.unwrap().into_inner()
    }

    pub async fn learner_info(&self, k: usize) -> pb::LearnerInfo {
        let mut c = LearnerClient::new(Self::channel(&self.learner_url(k)).await.unwrap());
        c.info(pb::InfoRequest {}).await.unwrap().into_inner()
    }
}
