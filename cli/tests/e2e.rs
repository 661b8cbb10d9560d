//! End to end, with real processes on loopback: a coordinator, one learner per agent and rollout
//! workers, each a `comas` child process, running a 2-agent CoMAS job on tiny models. Faults are
//! real too: SIGKILL of a worker, of the coordinator and of a learner in the middle of a job.
//! Also: an evaluation on the workers, tokens and allowed roots on the job API, and oversized or
//! malformed requests.
use comas_model::tiny::{write_model, TinySpec};
use comas_model::Architecture;
use comas_proto::v1 as pb;
use comas_proto::v1::coordinator_client::CoordinatorClient;
use comas_proto::v1::learner_client::LearnerClient;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const QUESTIONS_PER_STEP: u64 = 2;
const INSTANCES: u64 = 2;
const STEPS: u64 = 3;
const EPISODES: u64 = QUESTIONS_PER_STEP * INSTANCES;
// l = 2, R = 2, n = 1: per instance and round, 2 solutions, 2 evaluations, 2 scores.
const TURNS_PER_ROLE: u64 = EPISODES * 2 * 2;
const SAMPLES_PER_AGENT: u64 = EPISODES * 12 / 2;

struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    fn sigkill(&mut self) {
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(dir: &Path, name: &str, args: &[String]) -> Proc {
    spawn_with(dir, name, args, &[])
}

fn spawn_with(dir: &Path, name: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
    // Appended, so a restarted service's log follows the one before it.
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_comas"))
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

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

struct Cluster {
    dir: PathBuf,
    coord_port: u16,
    metrics_port: u16,
    learner_ports: Vec<u16>,
    /// Each learner's `--agent-id` (its index, unless one learner trains several agents).
    learner_agents: Vec<String>,
    coordinator: Option<Proc>,
    coordinator_flags: Vec<String>,
    learners: Vec<Option<Proc>>,
    workers: Vec<Proc>,
    steps: u64,
    worker_flags: Vec<String>,
    /// Environment of every service process (TLS files).
    env: Vec<(String, String)>,
}

/// Writes two tiny models, a data set and the job file; `tokens` fixes every turn's length.
fn write_job(dir: &Path, learner_ports: &[u16], tokens: u32, eval: bool) {
    write_job_of(dir, learner_ports, tokens, eval, STEPS)
}

fn write_job_of(dir: &Path, learner_ports: &[u16], tokens: u32, eval: bool, steps: u64) {
    for (k, seed) in [(0, 3), (1, 4)] {
        write_model(&dir.join(format!("model-{k}")), &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) }).unwrap();
    }
    let mut data = String::new();
    for i in 0..12 {
        data.push_str(&format!("{{\"prompt\":\"What is {i} + 2?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", i + 2));
    }
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let sampling = format!("temperature = 1.0\ntop_p = 1.0\ntop_k = 0\nmax_new_tokens = {tokens}\nmin_new_tokens = {tokens}\n");
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 12\nmicro_batch_size = 12\nmask_truncated = false\n", learner_ports[k])
    };
    let eval = if eval { "[eval]\ndata = \"train.jsonl\"\nevery_steps = 2\nmax_questions = 2\n" } else { "" };
    let job = format!(
        "name = \"e2e\"\nseed = 5\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = {QUESTIONS_PER_STEP}\nsteps = {steps}\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\n\
         [comas]\nnum_rounds = 2\ninstances_per_question = {INSTANCES}\n[comas.sampling.solver]\n{sampling}[comas.sampling.evaluator]\n{sampling}[comas.sampling.scorer]\n{sampling}{}{}{eval}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

impl Cluster {
    fn new(dir: &Path, workers: usize, tokens: u32) -> Self {
        Self::with_flags(dir, workers, tokens, &[], false)
    }

    fn with_flags(dir: &Path, workers: usize, tokens: u32, coordinator_flags: &[&str], eval: bool) -> Self {
        Self::build(dir, workers, tokens, coordinator_flags, eval, STEPS, &["--max-episodes", "3"])
    }

    fn build(dir: &Path, workers: usize, tokens: u32, coordinator_flags: &[&str], eval: bool, steps: u64, worker_flags: &[&str]) -> Self {
        let learner_ports = vec![free_port(), free_port()];
        write_job_of(dir, &learner_ports, tokens, eval, steps);
        Self::launch(dir, learner_ports, workers, coordinator_flags, steps, worker_flags)
    }

    /// Starts the coordinator, one learner per port and the workers for the job in `dir`.
    fn launch(dir: &Path, learner_ports: Vec<u16>, workers: usize, coordinator_flags: &[&str], steps: u64, worker_flags: &[&str]) -> Self {
        Self::launch_env(dir, learner_ports, workers, coordinator_flags, steps, worker_flags, &[])
    }

    /// As `launch`, every service with `env` set.
    fn launch_env(
        dir: &Path,
        learner_ports: Vec<u16>,
        workers: usize,
        coordinator_flags: &[&str],
        steps: u64,
        worker_flags: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        let n = learner_ports.len();
        let mut c = Cluster {
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
            env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        };
        c.start_coordinator();
        for k in 0..n {
            c.start_learner(k);
        }
        for _ in 0..workers {
            c.add_worker();
        }
        c
    }

    /// As `launch`, with one learner process on `port` training all `agents`.
    fn launch_one_learner(dir: &Path, port: u16, agents: usize, workers: usize, steps: u64, worker_flags: &[&str]) -> Self {
        let mut c = Cluster {
            dir: dir.to_path_buf(),
            coord_port: free_port(),
            metrics_port: free_port(),
            learner_agents: vec![(0..agents).map(|k| k.to_string()).collect::<Vec<_>>().join(",")],
            learner_ports: vec![port],
            coordinator: None,
            coordinator_flags: Vec::new(),
            learners: vec![None],
            workers: Vec::new(),
            steps,
            worker_flags: s(worker_flags),
            env: Vec::new(),
        };
        c.start_coordinator();
        c.start_learner(0);
        for _ in 0..workers {
            c.add_worker();
        }
        c
    }

    fn start_coordinator(&mut self) {
        let mut args = s(&[
            "coordinator",
            "--listen",
            &format!("127.0.0.1:{}", self.coord_port),
            "--metrics-listen",
            &format!("127.0.0.1:{}", self.metrics_port),
            "--db",
            &self.dir.join("jobs.sqlite").display().to_string(),
            "--heartbeat-ms",
            "300",
            "--heartbeat-timeout-secs",
            "5",
            "--worker-wait-secs",
            "120",
        ]);
        args.extend(self.coordinator_flags.iter().cloned());
        self.coordinator = Some(spawn_with(&self.dir, "coordinator", &args, &self.env_with(&[])));
    }

    fn start_learner(&mut self, k: usize) {
        self.start_learner_with(k, &[]);
    }

    fn start_learner_with(&mut self, k: usize, env: &[(&str, &str)]) {
        let args = s(&[
            "learner",
            "serve",
            "--job",
            &self.dir.join("job.toml").display().to_string(),
            "--agent-id",
            &self.learner_agents[k],
            "--listen",
            &format!("127.0.0.1:{}", self.learner_ports[k]),
            "--checkpoint-dir",
            &self.dir.join(format!("ckpt-{k}")).display().to_string(),
            "--resume",
            // One checkpoint kept: a resumed learner must not depend on the one it started from.
            "--keep-checkpoints",
            "1",
        ]);
        self.learners[k] = Some(spawn_with(&self.dir, &format!("learner-{k}"), &args, &self.env_with(env)));
    }

    fn add_worker(&mut self) {
        self.add_worker_with(&[]);
    }

    fn add_worker_with(&mut self, env: &[(&str, &str)]) {
        let i = self.workers.len();
        let w = self.worker(i, env);
        self.workers.push(w);
    }

    fn worker(&self, i: usize, env: &[(&str, &str)]) -> Proc {
        let mut args = s(&["worker", "--listen", &format!("127.0.0.1:{}", free_port()), "--coordinator", &format!("http://127.0.0.1:{}", self.coord_port)]);
        args.extend(self.worker_flags.iter().cloned());
        spawn_with(&self.dir, &format!("worker-{i}"), &args, &self.env_with(env))
    }

    /// The cluster's environment and `more`.
    fn env_with<'a>(&'a self, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain(more.iter().copied()).collect()
    }

    async fn client(&self) -> CoordinatorClient<tonic::transport::Channel> {
        let started = Instant::now();
        loop {
            match CoordinatorClient::connect(format!("http://127.0.0.1:{}", self.coord_port)).await {
                Ok(c) => return c,
                Err(e) if started.elapsed() > Duration::from_secs(30) => panic!("coordinator unreachable: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn submit(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("job.toml")).unwrap();
        let r = self.client().await.submit_job(pb::SubmitJobRequest { job_toml: text, base_dir: self.dir.display().to_string(), reuse_name: false }).await;
        r.unwrap_or_else(|e| panic!("submit: {}", e.message())).into_inner().job_id
    }

    async fn status(&self, id: &str) -> Option<pb::JobStatus> {
        let mut c = CoordinatorClient::connect(format!("http://127.0.0.1:{}", self.coord_port)).await.ok()?;
        c.get_job(pb::GetJobRequest { job_id: id.into() }).await.ok().map(|r| r.into_inner())
    }

    /// Polls until `pred` holds; panics with the logs' tails after `secs`.
    async fn wait_for(&self, id: &str, secs: u64, what: &str, pred: impl Fn(&pb::JobStatus) -> bool) -> pb::JobStatus {
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
                panic!("timed out waiting for {what}: {:?}\n{}", self.status(id).await, self.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Follows the job's event stream and returns at the first event whose status matches, so
    /// short windows (a step's rollout) are never missed between polls.
    async fn on_event(&self, id: &str, secs: u64, what: &str, pred: impl Fn(&pb::JobStatus) -> bool) -> pb::JobStatus {
        let mut c = self.client().await;
        let mut stream = c.watch_job(pb::WatchJobRequest { job_id: id.into() }).await.unwrap().into_inner();
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

    async fn finished(&self, id: &str) -> pb::JobStatus {
        let st = self.wait_for(id, 240, "the job to end", |s| s.state >= pb::JobState::Succeeded as i32).await;
        assert_eq!(st.state, pb::JobState::Succeeded as i32, "job ended {}: {}\n{}", st.state, st.error, self.logs());
        st
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(&self.dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log") {
                let t = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: String = t.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
                out.push_str(&format!("--- {} ---\n{tail}\n", p.display()));
            }
        }
        out
    }

    /// The metrics log's records of one kind (`step` or `eval`), in file order.
    fn log_of(&self, kind: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.dir.join("out/metrics.jsonl")).unwrap();
        text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|m| m["kind"] == kind).collect()
    }

    fn metrics_log(&self) -> Vec<Value> {
        self.log_of("step")
    }

    fn prometheus(&self, name: &str) -> f64 {
        use std::io::{Read, Write};
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).unwrap();
        write!(sock, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        sock.read_to_string(&mut body).unwrap();
        body.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).map(|v| v.trim().parse().unwrap())).unwrap_or_else(|| panic!("{name} not in /metrics"))
    }

    async fn learner_info(&self, k: usize) -> pb::LearnerInfo {
        let mut c = LearnerClient::connect(format!("http://127.0.0.1:{}", self.learner_ports[k])).await.unwrap();
        c.info(pb::InfoRequest {}).await.unwrap().into_inner()
    }

    /// What every run must show: each step once, every episode once, the right turn counts,
    /// each learner trained on exactly its agent's turns, versions advanced by the step count.
    async fn check_complete_run(&self) {
        let log = self.metrics_log();
        let steps: Vec<u64> = log.iter().map(|m| m["step"].as_u64().unwrap()).collect();
        assert_eq!(steps, (0..self.steps).collect::<Vec<_>>(), "each step logged exactly once");
        for m in &log {
            assert_eq!(m["episodes"], EPISODES, "step {}", m["step"]);
            for role in ["solver", "evaluator", "scorer"] {
                assert_eq!(m["turns"][role], TURNS_PER_ROLE, "step {} {role}", m["step"]);
                assert_eq!(m["reward"][role]["count"], TURNS_PER_ROLE, "step {} {role}", m["step"]);
            }
            let hist = &m["score_hist"];
            let scored: u64 = ["1", "2", "3", "invalid"].iter().map(|k| hist[*k].as_u64().unwrap()).sum();
            assert_eq!(scored, TURNS_PER_ROLE);
            for k in 0..2 {
                let a = &m["agents"][k];
                assert_eq!(a["train"]["samples"], SAMPLES_PER_AGENT, "step {} agent {k} trained on its own turns only", m["step"]);
                assert_eq!(a["version"], m["step"].as_u64().unwrap() + 1);
                // Every turn of step s was generated by version s of its agent's weights.
                assert_eq!(a["policy_versions"], serde_json::json!([m["step"]]), "step {} agent {k}", m["step"]);
            }
        }
        for k in 0..2 {
            let info = self.learner_info(k).await;
            assert_eq!((info.global_step, info.latest_version), (self.steps, self.steps), "agent {k}'s version advanced by exactly {}", self.steps);
            assert!(self.dir.join(format!("out/agent-{k}/model.safetensors")).is_file(), "agent {k} exported");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_two_workers_three_steps() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::with_flags(dir.path(), 2, 8, &[], true);
    let id = c.submit().await;
    let st = c.finished(&id).await;
    assert_eq!((st.steps_done, st.total_steps), (STEPS, STEPS));
    // Held-out evaluation before training, every 2 steps and at the end, on 2 questions each,
    // in the order it happened.
    let kinds: Vec<String> = std::fs::read_to_string(dir.path().join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let m: Value = serde_json::from_str(l).unwrap();
            format!("{}{}", m["kind"].as_str().unwrap(), m["step"])
        })
        .collect();
    assert_eq!(kinds, ["eval0", "step0", "step1", "eval2", "step2", "eval3"]);
    for e in c.log_of("eval") {
        assert_eq!((e["episodes"].as_u64(), e["turns"]["solver"].as_u64()), (Some(2), Some(8)), "{e}");
        assert!(e["accuracy"]["last_round"].is_number());
        // Evaluation used the weights of the steps completed so far.
        assert_eq!(e["agents"][1]["policy_versions"], serde_json::json!([e["after_steps"]]));
    }
    assert_eq!(st.agents.iter().map(|a| a.version).collect::<Vec<_>>(), vec![STEPS, STEPS]);
    c.check_complete_run().await;
    assert_eq!(c.prometheus("comas_coordinator_episodes_completed_total"), (STEPS * EPISODES + 3 * 2) as f64);
    assert_eq!(c.prometheus("comas_coordinator_steps_completed_total"), STEPS as f64);
    assert_eq!(c.prometheus("comas_coordinator_pending_episodes"), 0.0);
    assert_eq!(c.prometheus("comas_coordinator_workers"), 2.0);
    // After every step but the last, both workers pulled each agent's full f32 weights once,
    // the second from the first (a relay chain): the learner sent them once.
    for m in c.metrics_log() {
        let last = m["step"].as_u64().unwrap() + 1 == STEPS;
        for k in 0..2 {
            let params = c.learner_info(k).await.trainable_parameters;
            let sync = &m["agents"][k]["weight_sync"];
            let want = if last { (0, 0) } else { (2 * 4 * params, 4 * params) };
            assert_eq!((sync["bytes"].as_u64().unwrap(), sync["learner_bytes"].as_u64().unwrap()), want, "step {} agent {k}", m["step"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_step_loses_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Long turns, so the kill lands while the step's episodes are running.
    let mut c = Cluster::new(dir.path(), 2, 48);
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout" && s.episodes_total > 0).await;
    let victim = &mut c.workers[1];
    eprintln!("killing {}", victim.name);
    victim.sigkill();
    c.finished(&id).await;
    c.check_complete_run().await;
    assert!(c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0, "the dead worker's leases were re-queued");
    assert_eq!(c.prometheus("comas_coordinator_episodes_completed_total"), (STEPS * EPISODES) as f64);
    assert_eq!(c.prometheus("comas_coordinator_workers"), 1.0);
}

/// Async mode with a lag bound of 2: steps s + 1 and s + 2's episodes run while the learners
/// train step s, and the new weights swap in between turns. Every trained turn is at most two
/// versions behind its learner (the bound), each step accounts for every turn it produced
/// (trained + dropped, none dropped here), some turns were sampled two versions before the
/// weights of their step, and a worker killed while rollouts run beside training loses and
/// doubles nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_job_trains_turns_at_most_two_versions_behind_and_a_killed_worker_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = async_cluster(dir.path(), 48, "max_policy_lag = 2\n");
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's training", |s| s.steps_done == 1 && s.stage == "train").await;
    c.workers[1].sigkill();
    let st = c.finished(&id).await;
    assert_eq!(st.steps_done, ASYNC_STEPS);
    check_async_run(&c, ASYNC_STEPS, 2).await;
    assert_eq!(c.prometheus("comas_coordinator_episodes_completed_total"), (ASYNC_STEPS * EPISODES) as f64);
}

/// An async job whose coordinator is killed while step 2's rollout runs beside step 1's
/// training resumes with the episodes it stored: every step accounts for exactly its turns,
/// within the lag bound, and no finished episode runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_async_coordinator_resumes_its_rollout_ahead() {
    let dir = tempfile::tempdir().unwrap();
    // The default lag bound (1).
    let mut c = async_cluster(dir.path(), 24, "");
    let id = c.submit().await;
    // Step 2's rollout runs beside step 1's training and broadcast (the stage shown is theirs).
    c.on_event(&id, 120, "step 2's first episodes", |s| s.steps_done == 1 && s.stage != "rollout" && s.episodes_done >= 1).await;
    c.coordinator.as_mut().unwrap().sigkill();
    assert_eq!(c.metrics_log().len(), 1, "step 0 was committed before the kill");
    c.start_coordinator();
    c.finished(&id).await;
    check_async_run(&c, ASYNC_STEPS, 1).await;
    // The new coordinator ran only what was missing: steps 0 and 1 and some of step 2 were in.
    let ran = c.prometheus("comas_coordinator_episodes_completed_total");
    assert!(ran <= (2 * EPISODES - 1) as f64, "the restarted coordinator re-ran finished episodes: {ran}");
}

/// An async job whose learner is SIGKILLed during step 1's training (step 2's rollout beside
/// it) and restarted from its checkpoint trains every step once: the coordinator finds the
/// learner again, and every turn is accounted for within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_job_resumes_with_a_killed_learner() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = async_cluster(dir.path(), 24, "");
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's training", |s| s.steps_done == 1 && s.stage == "train").await;
    c.learners[1].as_mut().unwrap().sigkill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.start_learner(1);
    let st = c.finished(&id).await;
    assert_eq!(st.steps_done, ASYNC_STEPS);
    check_async_run(&c, ASYNC_STEPS, 1).await;
    assert_eq!(c.prometheus("comas_coordinator_episodes_completed_total"), (ASYNC_STEPS * EPISODES) as f64);
}

const ASYNC_STEPS: u64 = 4;

/// Two tiny agents and two workers on an async job of `ASYNC_STEPS` steps with `tokens`-token
/// turns and `more` added to its `[schedule]`.
fn async_cluster(dir: &Path, tokens: u32, more: &str) -> Cluster {
    let ports = vec![free_port(), free_port()];
    write_job_of(dir, &ports, tokens, false, ASYNC_STEPS);
    let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
    std::fs::write(dir.join("job.toml"), job.replace("[schedule]\n", &format!("[schedule]\nsync = \"async\"\n{more}"))).unwrap();
    Cluster::launch(dir, ports, 2, &[], ASYNC_STEPS, &["--max-episodes", "3"])
}

/// Checks an async run's metrics log: each step once, its turns all accounted for (produced =
/// trained, none dropped), each at most `bound` versions behind its learner (and no further
/// behind than version 0), some of them exactly `bound` behind (the rollouts ran that far
/// ahead of training), and every learner at the last version.
async fn check_async_run(c: &Cluster, steps: u64, bound: u64) {
    let log = c.metrics_log();
    let logged: Vec<u64> = log.iter().map(|m| m["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, (0..steps).collect::<Vec<_>>(), "each step logged exactly once");
    let mut at_bound = 0;
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        assert_eq!(m["episodes"], EPISODES, "step {step}");
        assert!(m["idle_seconds"]["workers"].is_number() && m["idle_seconds"]["learners"].is_number(), "{m}");
        assert_eq!(m["policy_lag"]["bound"], bound);
        for k in 0..2 {
            let lag = &m["policy_lag"]["agents"][k];
            assert_eq!(
                (lag["produced"].as_u64(), lag["trained"].as_u64(), lag["dropped"].as_u64()),
                (Some(SAMPLES_PER_AGENT), Some(SAMPLES_PER_AGENT), Some(0)),
                "step {step} agent {k}: {lag}"
            );
            let hist = lag["lag"].as_object().unwrap();
            let most = step.min(bound);
            assert!(hist.keys().all(|l| l.parse::<u64>().unwrap() <= most), "step {step} agent {k}: lags {hist:?} past {most}");
            assert_eq!(hist.values().map(|v| v.as_u64().unwrap()).sum::<u64>(), SAMPLES_PER_AGENT);
            at_bound += hist.get(&bound.to_string()).and_then(Value::as_u64).unwrap_or(0);
            let a = &m["agents"][k];
            assert_eq!(a["train"]["samples"], SAMPLES_PER_AGENT, "step {step} agent {k}");
            assert_eq!(a["version"], step + 1);
            let versions: Vec<u64> = a["policy_versions"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert!(versions.iter().all(|&v| v + bound >= step && v <= step), "step {step} agent {k}: versions {versions:?}");
        }
    }
    assert!(at_bound > 0, "no turn was sampled {bound} versions before its step's weights: the rollouts did not run that far ahead");
    for k in 0..2 {
        let info = c.learner_info(k).await;
        assert_eq!((info.global_step, info.latest_version), (steps, steps));
    }
}

/// Episodes that outlive the lease timeout get a second copy on the other worker; only the
/// first result of each episode counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_leases_are_copied_and_only_one_result_counts() {
    let dir = tempfile::tempdir().unwrap();
    // 400-token turns: an episode takes seconds here, well past the 1 s lease timeout even on a
    // fast, idle machine (150-token turns finished inside it when the test ran alone).
    let c = Cluster::with_flags(dir.path(), 2, 400, &["--episode-timeout-secs", "1"], false);
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    assert!(c.prometheus("comas_coordinator_requeued_episodes_total") >= 1.0, "late leases were copied");
    assert!(c.prometheus("comas_coordinator_duplicate_results_total") >= 1.0, "a second result of an episode was ignored");
    assert_eq!(c.prometheus("comas_coordinator_episodes_completed_total"), (STEPS * EPISODES) as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_resumes_from_its_last_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 2, 24);
    let id = c.submit().await;
    // Kill it inside step 1's rollout, after some of its episodes came back.
    c.on_event(&id, 120, "step 1's first episodes", |s| s.steps_done == 1 && s.stage == "rollout" && s.episodes_done >= 1).await;
    c.coordinator.as_mut().unwrap().sigkill();
    let committed = c.metrics_log().len();
    assert_eq!(committed, 1, "step 0 was committed before the kill");
    c.start_coordinator();
    c.finished(&id).await;
    c.check_complete_run().await;
    // The new coordinator ran only what was missing: not step 0, nor step 1's stored episodes.
    let ran = c.prometheus("comas_coordinator_episodes_completed_total");
    assert!(ran <= (2 * EPISODES - 1) as f64, "the restarted coordinator re-ran finished episodes: {ran}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_learner_restarts_from_its_checkpoint_and_the_job_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1, 24);
    let id = c.submit().await;
    // During step 1's rollout: step 2 then starts by checking the resumed learner.
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout").await;
    c.learners[1].as_mut().unwrap().sigkill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.start_learner(1);
    c.finished(&id).await;
    c.check_complete_run().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_jobs_are_rejected_at_submit_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ports = [free_port(), free_port()];
    write_job(d, &ports, 8, false);
    let coord_port = free_port();
    let _coord =
        spawn(d, "coordinator", &s(&["coordinator", "--listen", &format!("127.0.0.1:{coord_port}"), "--db", &d.join("jobs.sqlite").display().to_string()]));
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", coord_port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "coordinator did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let good = std::fs::read_to_string(d.join("job.toml")).unwrap();
    // A data set with a broken third line, and a model whose tokenizer outgrows its vocabulary.
    std::fs::write(d.join("broken.jsonl"), "{\"prompt\":\"a\",\"answer\":\"1\",\"task\":\"math\",\"id\":\"a\"}\n{\"prompt\":\"b\",\"answer\":\"2\",\"task\":\"math\",\"id\":\"b\"}\n{\"prompt\": \"c\",\n").unwrap();
    let train = std::fs::read_to_string(d.join("train.jsonl")).unwrap();
    let long = format!("{{\"prompt\":\"{}\",\"answer\":\"1\",\"task\":\"math\",\"id\":\"long\"}}", "seven ".repeat(6000));
    let mut lines: Vec<&str> = train.lines().collect();
    lines.insert(1, "");
    lines.insert(2, &long);
    std::fs::write(d.join("long.jsonl"), lines.join("\n")).unwrap();
    let small = d.join("model-small");
    std::fs::create_dir_all(&small).unwrap();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(d.join("model-0").join(f), small.join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(d.join("model-0/config.json"))
        .unwrap()
        .replace("\"vocab_size\": 512", "\"vocab_size\": 100")
        .replace("\"vocab_size\":512", "\"vocab_size\":100");
    std::fs::write(small.join("config.json"), cfg).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("syntax", good.replace("[schedule]", "[schedule"), "not valid TOML"),
        ("unknown key", good.replace("steps = 3", "steps = 3\nstep_count = 9"), "step_count"),
        ("missing model", good.replace("model-1", "no-such-model"), "does not exist"),
        ("broken data line", good.replace("train.jsonl", "broken.jsonl"), "line 3"),
        ("vocabulary mismatch", good.replace("model-1", "model-small"), "vocab_size is 100"),
        ("impossible batch", good.replace("train_batch_size = 12", "train_batch_size = 500"), "train_batch_size"),
        ("learner missing", good.replace(&format!("learner = \"http://127.0.0.1:{}\"\n", ports[0]), ""), "agents[0].learner"),
        (
            "max_new_tokens past the context",
            good.replacen("max_new_tokens = 8\n", "max_new_tokens = 1000000000\n", 1),
            "`comas.sampling.solver.max_new_tokens`: is 1000000000, but agent 0's model holds 4096 tokens",
        ),
        ("prompt_max_len past the context", good.replace("[comas]\n", "[comas]\nprompt_max_len = 4090\n"), "`comas.prompt_max_len`: 4090 prompt tokens plus"),
        ("a problem longer than the context", good.replace("train.jsonl", "long.jsonl"), "long.jsonl line 3 (id `long`): the problem alone is"),
        ("a model path that is a file", good.replace("model-1", "model-1/config.json"), "config.json is a file; give the model's folder"),
        ("no agents", good.split("[[agents]]").next().unwrap().to_string(), "list at least one [[agents]] table"),
        // procfs takes no new files, whoever writes.
        ("an output folder that cannot be written", good.replace("dir = \"out\"", "dir = \"/proc\""), "`output.dir`: cannot write in /proc"),
    ];
    for (name, text, want) in cases {
        std::fs::write(d.join("bad.toml"), &text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args(["submit", &d.join("bad.toml").display().to_string(), "--coordinator", &format!("http://127.0.0.1:{coord_port}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted");
        assert!(err.contains(want), "{name}: message should mention `{want}`: {err}");
    }
    let list = Command::new(env!("CARGO_BIN_EXE_comas")).args(["list", "--json", "--coordinator", &format!("http://127.0.0.1:{coord_port}")]).output().unwrap();
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let jobs: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 0, "no job was stored: {jobs}");
    assert!(!d.join("out/metrics.jsonl").exists());

    // A valid job whose learners never come up waits for them, and can be cancelled meanwhile.
    let mut c = CoordinatorClient::connect(format!("http://127.0.0.1:{coord_port}")).await.unwrap();
    let id =
        c.submit_job(pb::SubmitJobRequest { job_toml: good.clone(), base_dir: d.display().to_string(), reuse_name: false }).await.unwrap().into_inner().job_id;
    // The same name again would pick up that job's checkpoints; another name with the same
    // output folder would interleave its metrics: both are refused while it lives.
    let again = c.submit_job(pb::SubmitJobRequest { job_toml: good.clone(), base_dir: d.display().to_string(), reuse_name: false }).await.unwrap_err();
    assert!(again.message().contains(&format!("`name`: job {id} is already called `e2e`")) && again.message().contains("comas resume"), "{}", again.message());
    let renamed = good.replace("name = \"e2e\"", "name = \"e2e-2\"");
    let shared = c.submit_job(pb::SubmitJobRequest { job_toml: renamed, base_dir: d.display().to_string(), reuse_name: false }).await.unwrap_err();
    assert!(shared.message().contains(&format!("is the output folder of job {id} (`e2e`")), "{}", shared.message());
    let started = Instant::now();
    while c.get_job(pb::GetJobRequest { job_id: id.clone() }).await.unwrap().into_inner().state != pb::JobState::Running as i32 {
        assert!(started.elapsed() < Duration::from_secs(30), "job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_comas")).args(["cancel", &id, "--coordinator", &format!("http://127.0.0.1:{coord_port}")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut state = 0;
    while started.elapsed() < Duration::from_secs(30) {
        state = c.get_job(pb::GetJobRequest { job_id: id.clone() }).await.unwrap().into_inner().state;
        if state == pb::JobState::Cancelled as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, pb::JobState::Cancelled as i32);
    // A cancelled job can be queued again; a finished or running one cannot be resumed twice.
    let out = Command::new(env!("CARGO_BIN_EXE_comas")).args(["resume", &id, "--coordinator", &format!("http://127.0.0.1:{coord_port}")]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = c.resume_job(pb::ResumeJobRequest { job_id: id.clone() }).await.unwrap_err();
    assert!(again.message().contains("only failed or cancelled"), "{}", again.message());
    c.cancel_job(pb::CancelJobRequest { job_id: id.clone() }).await.unwrap();
}

/// Mutual TLS between every service: a cluster whose coordinator, learners and worker hold
/// certificates of one CA (learners named by https:// addresses) runs a job end to end. A client
/// with no TLS, without a certificate, with one of another CA, with an expired one, or speaking
/// plaintext is refused with the reason, and nothing it sent is stored.
#[test]
fn a_tls_cluster_takes_only_clients_with_a_certificate_of_its_ca() {
    use comas_service::tls::{Authority, Validity};
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let ca = Authority::new("e2e CA").unwrap();
    let files = ca.write_local(&tls).unwrap();
    let pem = |name: &str, (cert, key): (String, String)| {
        let (c, k) = (tls.join(format!("{name}.pem")), tls.join(format!("{name}-key.pem")));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (c.display().to_string(), k.display().to_string())
    };
    let loopback = ["localhost", "127.0.0.1"];
    let other = pem("other", Authority::new("another CA").unwrap().issue(&loopback, Validity::Current).unwrap());
    let expired = pem("expired", ca.issue(&loopback, Validity::Expired).unwrap());
    let (ca_pem, cert, key) = (files.ca.display().to_string(), files.cert.display().to_string(), files.key.display().to_string());
    let learner_ports = vec![free_port(), free_port()];
    write_job_of(dir.path(), &learner_ports, 4, false, 2);
    let job = dir.path().join("job.toml");
    std::fs::write(&job, std::fs::read_to_string(&job).unwrap().replace("\"http://127.0.0.1:", "\"https://127.0.0.1:")).unwrap();
    let service_env = [("COMAS_TLS_CERT", cert.clone()), ("COMAS_TLS_KEY", key.clone()), ("COMAS_TLS_CA", ca_pem.clone())];
    let health_port = free_port();
    let health_flag = ["--health-listen".to_string(), format!("127.0.0.1:{health_port}")];
    let cluster = Cluster::launch_env(dir.path(), learner_ports, 1, &[&health_flag[0], &health_flag[1]], 2, &["--max-episodes", "3"], &service_env);
    let url = format!("https://127.0.0.1:{}", cluster.coord_port);
    let comas = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_comas"));
        c.args(args).env("COMAS_THREADS", "1");
        for var in ["COMAS_TLS_CERT", "COMAS_TLS_KEY", "COMAS_TLS_CA", "COMAS_TLS_SERVER_NAME", "COMAS_TOKEN"] {
            c.env_remove(var);
        }
        c.envs(env.iter().copied()).output().unwrap()
    };
    let good = [("COMAS_TLS_CA", ca_pem.as_str()), ("COMAS_TLS_CERT", cert.as_str()), ("COMAS_TLS_KEY", key.as_str())];
    let list = |env: &[(&str, &str)], url: &str| comas(&["list", "--json", "--coordinator", url], env);
    let started = Instant::now();
    while !list(&good, &url).status.success() {
        assert!(started.elapsed() < Duration::from_secs(60), "coordinator did not start\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let job_arg = job.display().to_string();
    // The kubelet's probe port: plaintext, the health service alone, the same statuses.
    let serving = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{health_port}")).unwrap().connect().await.unwrap();
        let mut c = tonic_health::pb::health_client::HealthClient::new(ch);
        c.check(tonic_health::pb::HealthCheckRequest { service: "comas.v1.Coordinator".into() }).await.unwrap().into_inner().status
    });
    assert_eq!(serving, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    // The client is told why where it can be (no TLS of its own; TLS 1.3 puts the server's
    // verdict on a client certificate after the client's handshake, so the client may see only
    // a closed connection); the coordinator logs every refusal with its reason.
    let log = || std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    let no_tls = comas(&["submit", &job_arg, "--coordinator", &url], &[]);
    assert!(
        !no_tls.status.success() && String::from_utf8_lossy(&no_tls.stderr).contains("no TLS set up: set COMAS_TLS_CA"),
        "{}",
        String::from_utf8_lossy(&no_tls.stderr)
    );
    let plain = format!("http://127.0.0.1:{}", cluster.coord_port);
    let cases: [(&str, &str, Vec<(&str, &str)>, &str); 4] = [
        ("plaintext", &plain, vec![], "corrupt message"),
        ("no client certificate", &url, vec![("COMAS_TLS_CA", ca_pem.as_str())], "peer sent no certificates"),
        (
            "another CA's certificate",
            &url,
            vec![("COMAS_TLS_CA", ca_pem.as_str()), ("COMAS_TLS_CERT", other.0.as_str()), ("COMAS_TLS_KEY", other.1.as_str())],
            "UnknownIssuer",
        ),
        (
            "an expired certificate",
            &url,
            vec![("COMAS_TLS_CA", ca_pem.as_str()), ("COMAS_TLS_CERT", expired.0.as_str()), ("COMAS_TLS_KEY", expired.1.as_str())],
            "certificate expired",
        ),
    ];
    for (what, url, env, want) in &cases {
        let before = log().len();
        let o = comas(&["submit", &job_arg, "--coordinator", url], env);
        assert!(!o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stdout));
        let started = Instant::now();
        while !log()[before..].contains(want) {
            assert!(started.elapsed() < Duration::from_secs(10), "{what}: the coordinator logged no refusal saying {want:?}: {}", &log()[before..]);
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(log()[before..].contains("TLS handshake refused"), "{what}");
    }
    let jobs: Value = serde_json::from_slice(&list(&good, &url).stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 0, "nothing was stored");
    // The job runs over TLS end to end: worker registration, episodes, training calls, weights.
    let o = comas(&["submit", &job_arg, "--coordinator", &url, "--watch"], &good);
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    let jobs: Value = serde_json::from_slice(&list(&good, &url).stdout).unwrap();
    assert_eq!((jobs[0]["state"].as_str(), jobs[0]["steps_done"].as_u64()), (Some("succeeded"), Some(2)), "{jobs}");
    assert_eq!(jobs[0]["agents"][1]["learner"].as_str(), Some(format!("https://127.0.0.1:{}", cluster.learner_ports[1]).as_str()), "{jobs}");
}

/// `comas local` with its built-in tiny example, as a user runs it (the SmolLM2 example is the
/// same code with a real model; `scripts/demo.sh` runs it).
#[test]
fn comas_local_runs_the_builtin_example() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args(["local", "--example", "tiny", "--dir", &dir.path().display().to_string(), "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "comas local failed: {}", String::from_utf8_lossy(&out.stderr));
        // Over mutual TLS, with this run's own CA.
        assert!(String::from_utf8_lossy(&out.stderr).contains("coordinator https://127.0.0.1:"), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).expect("final status as JSON")
    };
    let first = run();
    assert!(first["agents"][0]["learner"].as_str().unwrap().starts_with("https://127.0.0.1:"), "{first}");
    assert!(std::fs::read_to_string(dir.path().join("tls/ca.pem")).unwrap().contains("BEGIN CERTIFICATE"));
    assert_eq!((first["state"].as_str(), first["steps_done"].as_u64(), first["total_steps"].as_u64()), (Some("succeeded"), Some(5), Some(5)));
    assert_eq!(first["agents"][0]["version"], 5);
    let all: Vec<Value> =
        std::fs::read_to_string(dir.path().join("example/out/metrics.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let log: Vec<&Value> = all.iter().filter(|m| m["kind"] == "step").collect();
    assert_eq!(log.len(), 5);
    // Held-out evaluation of 4 questions before training, after steps 2 and 4, and at the end.
    let evals: Vec<(u64, u64)> =
        all.iter().filter(|m| m["kind"] == "eval").map(|m| (m["after_steps"].as_u64().unwrap(), m["episodes"].as_u64().unwrap())).collect();
    assert_eq!(evals, vec![(0, 4), (2, 4), (4, 4), (5, 4)]);
    // The TensorBoard event file beside the log holds exactly the log's records.
    let lines: Vec<String> = std::fs::read_to_string(dir.path().join("example/out/metrics.jsonl")).unwrap().lines().map(str::to_string).collect();
    let events = comas_coordinator::tensorboard::path(&dir.path().join("example/out"), first["job_id"].as_str().unwrap());
    assert_eq!(std::fs::read(&events).unwrap(), comas_coordinator::tensorboard::encode(&lines).unwrap());
    // 4 questions x 2 instances; l = 2, R = 2: 2 x 2 = 4 turns per role per episode.
    for m in log {
        assert_eq!((m["episodes"].as_u64(), m["turns"]["scorer"].as_u64(), m["turns"]["solver"].as_u64()), (Some(8), Some(32), Some(32)), "step {}", m["step"]);
    }
    // Run again: a fresh job from the base models (not from the first job's checkpoints).
    let second = run();
    assert_ne!(second["job_id"], first["job_id"]);
    assert_eq!((second["state"].as_str(), second["agents"][1]["version"].as_u64()), (Some("succeeded"), Some(5)));
}

/// The job's own schedule times win over the coordinator's defaults: with no worker at all, a
/// job that waits 3 s for one fails after about that long, though the coordinator would wait 120.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waits_for_workers_as_long_as_its_schedule_says() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), 0, 8);
    let job = std::fs::read_to_string(dir.path().join("job.toml")).unwrap().replace("[schedule]\n", "[schedule]\nworker_wait_secs = 3\n");
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let id = c.submit().await;
    let st = c.wait_for(&id, 90, "the job to fail", |s| s.state >= pb::JobState::Succeeded as i32).await;
    assert_eq!(st.state, pb::JobState::Failed as i32, "{}", st.error);
    assert!(st.error.contains("episodes waited 3s with no ready rollout worker (registered: none)"), "{}", st.error);
}

/// A worker that reports an episode sampled with the wrong weights does not fail the job: the
/// coordinator refuses that trajectory, counts it, runs the episode again, and the run ends
/// with the exact counts and every turn at its step's version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_trajectory_is_refused_and_its_episode_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 24);
    c.add_worker_with(&[("COMAS_WORKER_FAULT", "stale-version:2")]);
    c.add_worker();
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    assert_eq!(c.prometheus("comas_coordinator_malformed_trajectories_total"), 1.0);
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    // Which step the faulty worker's second episode falls in depends on how the two workers
    // shared the work: version 1000 + s against s.
    assert!(
        log.contains("malformed trajectory") && log.contains("was sampled with policy version 100") && log.contains(", but this step uses version "),
        "{log}"
    );
}

/// A learner that hangs (SIGSTOP: its port still accepts connections, nothing answers) fails the
/// job after the job's learner timeout with a message naming it, instead of a silent wait; once
/// it runs again, `comas resume` finishes the job with exact counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_learner_fails_the_job_after_its_deadline_and_the_job_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), 1, 24);
    let job = std::fs::read_to_string(dir.path().join("job.toml")).unwrap().replace("learner_timeout_secs = 120", "learner_timeout_secs = 5");
    std::fs::write(dir.path().join("job.toml"), job).unwrap();
    let id = c.submit().await;
    c.on_event(&id, 120, "step 1's rollout", |s| s.steps_done == 1 && s.stage == "rollout").await;
    let pid = c.learners[1].as_ref().unwrap().child.id() as libc::pid_t;
    // SAFETY: kill(2) on a child this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    let st = c.wait_for(&id, 180, "the job to fail", |s| s.state >= pb::JobState::Succeeded as i32).await;
    assert_eq!(st.state, pb::JobState::Failed as i32, "{}", st.error);
    assert!(st.error.contains("learner of agent 1"), "{}", st.error);
    assert!(stopped.elapsed() < Duration::from_secs(150), "failed only after {:?}", stopped.elapsed());
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let out = Command::new(env!("CARGO_BIN_EXE_comas")).args(["resume", &id, "--coordinator", &format!("http://127.0.0.1:{}", c.coord_port)]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.finished(&id).await;
    c.check_complete_run().await;
}

/// A worker restarted in place (same id, same address, as a pod restarted by Kubernetes) while
/// idle is seen as new: it loads the policies again before it gets episodes, and the job ends
/// with exact counts. (Here the coordinator also sees the old connection break; the
/// registration's incarnation covers a restart it does not see.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_in_place_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 24);
    let port = free_port();
    let args = s(&[
        "worker",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--coordinator",
        &format!("http://127.0.0.1:{}", c.coord_port),
        "--max-episodes",
        "3",
        "--worker-id",
        "pod-0",
    ]);
    c.workers.push(spawn(dir.path(), "worker-first", &args));
    let id = c.submit().await;
    // Step 0's training: the worker holds no episode, so only its registration can tell.
    c.on_event(&id, 120, "step 0's training", |s| s.steps_done == 0 && s.stage == "train").await;
    c.workers.pop().unwrap().sigkill();
    c.workers.push(spawn(dir.path(), "worker-second", &args));
    c.finished(&id).await;
    c.check_complete_run().await;
}

/// A broadcast shows its progress while it runs: with a worker that holds each received
/// version 3 s before swapping it in, a watcher sees the bytes it received, and at the end
/// they equal what the step's record says the broadcast moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_reports_the_bytes_received_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 24);
    c.add_worker_with(&[("COMAS_WORKER_FAULT", "slow-swap:3")]);
    let id = c.submit().await;
    let full = |s: &pb::JobStatus| s.stage == "broadcast" && s.broadcast_workers == 1 && s.broadcast_bytes_total > 0;
    let st = c.on_event(&id, 180, "step 0's broadcast with every byte in", move |s| full(s) && s.broadcast_bytes_done == s.broadcast_bytes_total).await;
    assert_eq!(st.steps_done, 0);
    c.finished(&id).await;
    c.check_complete_run().await;
    let step0 = &c.metrics_log()[0];
    let moved: u64 = (0..2).map(|k| step0["agents"][k]["weight_sync"]["bytes"].as_u64().unwrap()).sum();
    assert_eq!(st.broadcast_bytes_total, moved, "the live total is what the broadcast moved");
}

/// A worker that joins mid-job and takes long to load does not hold up the broadcast: the
/// ready worker goes on, and the job ends long before the late one is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_late_joiner_does_not_stall_the_broadcast() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1, 24);
    let id = c.submit().await;
    c.on_event(&id, 120, "step 0's rollout", |s| s.steps_done == 0 && s.stage == "rollout").await;
    c.add_worker_with(&[("COMAS_WORKER_FAULT", "slow-load:300")]);
    let joined = Instant::now();
    c.finished(&id).await;
    assert!(joined.elapsed() < Duration::from_secs(120), "the job waited {:?} for the late joiner", joined.elapsed());
    c.check_complete_run().await;
}

/// Chaos: an 8-step job with a dozen seeded SIGKILLs at random moments, spread over the
/// coordinator, both learners and both workers, each killed service started again. The job
/// completes; every step is logged once with the exact episode and turn counts; every turn was
/// sampled with its step's version; and the final weights equal those of an undisturbed run of
/// the same job. (One episode per worker at a time, so that no batch differs between the runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_of_every_service_change_nothing_in_the_result() {
    use rand::{Rng, SeedableRng};
    const CHAOS_STEPS: u64 = 8;
    const KILLS: usize = 12;
    let flags = ["--max-episodes", "1"];
    let calm_dir = tempfile::tempdir().unwrap();
    let calm = Cluster::build(calm_dir.path(), 2, 40, &[], false, CHAOS_STEPS, &flags);
    let id = calm.submit().await;
    calm.finished(&id).await;
    calm.check_complete_run().await;
    drop(calm);

    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::build(dir.path(), 2, 40, &[], false, CHAOS_STEPS, &flags);
    let id = c.submit().await;
    // COMAS_CHAOS_SEED replays another schedule of kills (to hunt for failures by hand).
    let seed = std::env::var("COMAS_CHAOS_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(21);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Every kind of service is hit at least twice; the rest of the order is random.
    let mut victims: Vec<usize> = (0..KILLS).map(|i| i % 5).collect();
    for i in (1..victims.len()).rev() {
        victims.swap(i, rng.gen_range(0..=i));
    }
    let started = Instant::now();
    let mut killed = Vec::new();
    for &v in &victims {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..1000))).await;
        match c.status(&id).await {
            Some(st) if st.state >= pb::JobState::Succeeded as i32 => break,
            _ => {}
        }
        let name = match v {
            0 => {
                c.coordinator.as_mut().unwrap().sigkill();
                "coordinator".to_string()
            }
            1 | 2 => {
                c.learners[v - 1].as_mut().unwrap().sigkill();
                format!("learner-{}", v - 1)
            }
            _ => {
                c.workers[v - 3].sigkill();
                format!("worker-{}", v - 3)
            }
        };
        killed.push(format!("{name} at {:.1}s", started.elapsed().as_secs_f64()));
        tokio::time::sleep(Duration::from_millis(rng.gen_range(100..700))).await;
        match v {
            0 => c.start_coordinator(),
            1 | 2 => c.start_learner(v - 1),
            _ => c.workers[v - 3] = c.worker(v - 3, &[]),
        }
    }
    eprintln!("killed: {killed:?}");
    c.finished(&id).await;
    assert!(killed.len() >= 10, "the job ended after only {} kills: {killed:?}", killed.len());
    c.check_complete_run().await;
    for k in 0..2 {
        let file = |d: &Path| std::fs::read(d.join(format!("out/agent-{k}/model.safetensors"))).unwrap();
        assert!(file(dir.path()) == file(calm_dir.path()), "agent {k}'s final weights differ from the undisturbed run's (kills: {killed:?})");
    }
}

/// At submit the coordinator shows what each learner and each worker will hold, and warns of a
/// learner whose estimate exceeds the memory it says it may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_shows_the_memory_estimate_and_warns_of_a_learner_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 0, 8);
    c.learners[1].as_mut().unwrap().sigkill();
    c.start_learner_with(1, &[("COMAS_LEARNER_MEMORY_BYTES", "1000000")]);
    for k in 0..2 {
        let started = Instant::now();
        while LearnerClient::connect(format!("http://127.0.0.1:{}", c.learner_ports[k])).await.is_err() {
            assert!(started.elapsed() < Duration::from_secs(60), "learner {k} never came up\n{}", c.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = c.learner_info(k).await;
    }
    let text = std::fs::read_to_string(dir.path().join("job.toml")).unwrap();
    let st = c
        .client()
        .await
        .submit_job(pb::SubmitJobRequest { job_toml: text, base_dir: dir.path().display().to_string(), reuse_name: false })
        .await
        .unwrap()
        .into_inner();
    let notes = st.notes.join("\n");
    assert!(
        st.notes[0].starts_with("agent 0's learner needs about ") && st.notes[0].contains("optimizer state) plus activations; its device (Cpu) has "),
        "{notes}"
    );
    assert!(st.notes[1].starts_with("agent 1's learner needs about ") && st.notes[1].ends_with("its device (Cpu) has 976.6 KiB"), "{notes}");
    assert!(
        st.notes[2].starts_with("warning: agent 1's learner needs about ")
            && st.notes[2].contains("has 976.6 KiB; train a LoRA adapter (agents[1].train.lora)"),
        "{notes}"
    );
    assert!(st.notes[3].starts_with("each rollout worker holds about ") && st.notes[3].contains("(2 base models, float32)"), "{notes}");
    assert_eq!(st.notes.len(), 4, "{notes}");
}

/// The MAPPA e2e job: agent 0 plays Problem Solver and Verifier, agent 1 the Code Executor, and a
/// third tiny model coaches. The Executor's replies end with a fixed code block that forks and
/// spins (a guided tail), so every action calls the tool and every run must be cut off.
const MAPPA_STEPS: u64 = 2;
const FORK_AND_SPIN: &str = r"```python\nimport os\nos\.fork\(\)\nwhile 1:0\n```";

fn write_mappa_job(dir: &Path, learner_ports: &[u16]) {
    for (name, seed) in [("model-0", 3), ("model-1", 4), ("coach", 9)] {
        write_model(&dir.join(name), &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) }).unwrap();
    }
    let mut data = String::new();
    for i in 0..12 {
        data.push_str(&format!("{{\"prompt\":\"What is {i} + 2?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", i + 2));
    }
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 4\nmicro_batch_size = 4\nmask_truncated = false\n", learner_ports[k])
    };
    let job = format!(
        "name = \"mappa-e2e\"\nseed = 5\nmethod = \"mappa\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = {QUESTIONS_PER_STEP}\nsteps = {MAPPA_STEPS}\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n\
         [mappa]\nagents = [0, 1, 0]\ninstances_per_question = {INSTANCES}\ntool_timeout_secs = 1.0\n\
         [mappa.sampling]\nmax_new_tokens = 10\nmin_new_tokens = 10\n\
         [mappa.role_sampling.code_executor]\nmax_new_tokens = 60\nmin_new_tokens = 0\nguided_suffix = '{FORK_AND_SPIN}'\n\
         [mappa.coach_sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = 'PROCESS_SCORE:[0-9]|none'\n\
         [[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n{}{}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

/// Sandbox programs (`python3 main.py`) still running anywhere on this machine.
fn running_sandbox_programs() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.split(|&b| b == 0).any(|a| a == b"main.py"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mappa_chain_is_coached_and_each_scored_action_trains_its_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_mappa_job(tmp.path(), &ports);
    let c = Cluster::launch(tmp.path(), ports, 1, &[], MAPPA_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    assert_eq!(log.len() as u64, MAPPA_STEPS, "each step logged exactly once");
    // Coach replies with and without a score, in step 0 (whose weights are the base models',
    // so its games are the same in every run) and in all steps.
    let (mut scored, mut unscored, mut first_step) = (0, 0, (0, 0));
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        assert_eq!((m["method"].as_str(), m["episodes"].as_u64()), (Some("mappa"), Some(EPISODES)));
        // Every episode: one Solver action, two Executor actions (each calls the tool), one Verifier action.
        for (role, n) in [("problem_solver", 1.0), ("code_executor", 2.0), ("verifier", 1.0)] {
            assert_eq!(m["actions"][role]["mean"], n, "step {step} {role}");
        }
        assert_eq!(m["tool_calls"], EPISODES * 2);
        assert_eq!(m["sandbox_failures"], serde_json::json!({"timeout": EPISODES * 2}), "every forking, spinning run is cut off at its timeout");
        assert_eq!(m["tool_success_rate"]["mean"], 0.0);
        assert_eq!(m["samples"].as_u64().unwrap() + m["samples_dropped"].as_u64().unwrap(), EPISODES * 4);
        for k in 0..2 {
            let a = &m["agents"][k];
            // A learner trains on exactly its agent's scored actions.
            assert_eq!(a["train"]["samples"], a["samples"], "step {step} agent {k}");
            assert_eq!(a["samples"].as_u64().unwrap() + a["samples_dropped"].as_u64().unwrap(), EPISODES * 2, "step {step} agent {k}");
            assert_eq!(a["version"], step + 1);
        }
        // The saved records: contexts grow by exactly the action and its observation, and a coach
        // reply without a score (even after the retry) leaves the action without a reward.
        let text = std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl"))).unwrap();
        let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(records.len() as u64, EPISODES);
        for r in &records {
            let actions = r["record"]["actions"].as_array().unwrap();
            assert_eq!(actions.len(), 4);
            let (first, second) = (&actions[1], &actions[2]);
            let (m0, m1) = (first["messages"].as_array().unwrap(), second["messages"].as_array().unwrap());
            assert_eq!(m1.len(), m0.len() + 2);
            assert_eq!(m1[..m0.len()], m0[..]);
            assert_eq!(m1[m0.len()], serde_json::json!({"role": "assistant", "content": first["text"]}));
            assert_eq!(m1[m0.len() + 1], serde_json::json!({"role": "user", "content": first["observation"]}));
            assert!(first["observation"].as_str().unwrap().starts_with("<tool_response>\n[Execution failed: wall-clock timeout]"), "{}", first["observation"]);
            assert!(first["text"].as_str().unwrap().ends_with("```python\nimport os\nos.fork()\nwhile 1:0\n```"));
            for a in actions {
                let coach = &a["coach"];
                let replies: Vec<&str> = coach["replies"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
                let read = replies.iter().find_map(|t| t.split_once("PROCESS_SCORE:").map(|(_, d)| d[..1].parse::<f64>().unwrap()));
                assert_eq!(coach["process_score"].as_f64(), read, "{coach}");
                if step == 0 {
                    if read.is_some() {
                        first_step.0 += 1;
                    } else {
                        first_step.1 += 1;
                    }
                }
                match read {
                    Some(_) => scored += 1,
                    None => {
                        // The failure value: retried once, no score, no fallback, no sample.
                        assert_eq!((replies.len(), coach["retry_attempted"].as_bool(), coach["fallback_used"].as_bool()), (2, Some(true), Some(false)));
                        unscored += 1;
                    }
                }
            }
        }
    }
    eprintln!("coach replies scored / unscored: step 0 {first_step:?}, all steps ({scored}, {unscored})");
    assert!(first_step.0 > 0 && first_step.1 > 0, "the coach both scored and failed to score in step 0 ({first_step:?})");
    assert_eq!(running_sandbox_programs(), 0, "no forked program outlived its run");
}

/// Every coach reply of step 0, by episode (in spec order) and action.
fn coach_replies(dir: &Path) -> Vec<Vec<Vec<String>>> {
    let text = std::fs::read_to_string(dir.join("out/episodes/step-00000.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            let actions = r["record"]["actions"].as_array().unwrap().clone();
            actions.iter().map(|a| a["coach"]["replies"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()).collect()
        })
        .collect()
}

/// A coach behind an OpenAI-compatible endpoint (`comas serve` on the coach's folder) gives the
/// chain exactly the replies that the workers' own copy of it gives: step 0 of the MathChat job
/// (base weights everywhere, so the same games), run both ways, every coach reply compared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coach_behind_an_openai_endpoint_replies_as_the_workers_copy_does() {
    let one_step = |dir: &Path, frozen: &str| {
        let job = std::fs::read_to_string(dir.join("job.toml")).unwrap();
        let job = job.replace(&format!("steps = {MAPPA_STEPS}\n"), "steps = 1\n").replace("[[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n", frozen);
        std::fs::write(dir.join("job.toml"), job).unwrap();
    };
    let run = |dir: &Path, ports: Vec<u16>| {
        let dir = dir.to_path_buf();
        async move {
            let c = Cluster::launch(&dir, ports, 1, &[], 1, &["--max-episodes", "4"]);
            let id = c.submit().await;
            c.finished(&id).await;
            coach_replies(&dir)
        }
    };
    let local = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_mappa_job(local.path(), &ports);
    one_step(local.path(), "[[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n");
    let want = run(local.path(), ports).await;

    let remote = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_mappa_job(remote.path(), &ports);
    let port = free_port();
    let _server = spawn(
        remote.path(),
        "serve",
        &s(&["serve", "--model", remote.path().join("coach").to_str().unwrap(), "--listen", &format!("127.0.0.1:{port}"), "--served-name", "judge"]),
    );
    one_step(
        remote.path(),
        &format!("[[frozen]]\nname = \"coach\"\nendpoint = \"http://127.0.0.1:{port}/v1\"\nendpoint_model = \"judge\"\nmax_attempts = 1\n"),
    );
    let got = run(remote.path(), ports).await;
    let calls: usize = want.iter().flatten().map(Vec::len).sum();
    assert_eq!((want.len() as u64, calls > EPISODES as usize * 4), (EPISODES, true), "every action coached, some retried");
    assert_eq!(got, want);
}

/// `comas eval` as a user runs it, `--coordinator` added when `url` is given: every setup on 3
/// arithmetic questions of the f32 fixture model, at most 6 new tokens per call.
fn eval_cmd(out: &Path, url: Option<&str>, extra: &[&str]) -> std::process::Output {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let mut args = s(&["eval", "--model", model.to_str().unwrap(), "--setup", "all", "--bench", "arithmetic", "--arithmetic-questions", "3"]);
    args.extend(s(&["--max-new-tokens", "6", "--out", out.to_str().unwrap()]));
    if let Some(url) = url {
        args.extend(s(&["--coordinator", url, "--dtype", "float32"]));
    }
    args.extend(s(extra));
    Command::new(env!("CARGO_BIN_EXE_comas")).args(&args).env("COMAS_THREADS", "1").output().unwrap()
}

/// Every call of a results file: (setup, question id, call) -> (label, model, response).
fn eval_calls(out: &Path) -> std::collections::BTreeMap<(String, String, u64), (String, String, String)> {
    let text = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let mut calls = std::collections::BTreeMap::new();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        for c in r["calls"].as_array().unwrap() {
            let key = (r["setup"].as_str().unwrap().to_string(), r["id"].as_str().unwrap().to_string(), c["call"].as_u64().unwrap());
            let text = |k: &str| c[k].as_str().unwrap().to_string();
            calls.insert(key, (text("label"), text("model"), text("response")));
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_on_the_cluster_workers_makes_the_calls_of_one_machine() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::launch(dir.path(), Vec::new(), 2, &[], 1, &[]);
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    cluster.client().await;
    let here = dir.path().join("here");
    let o = tokio::task::block_in_place(|| eval_cmd(&here, None, &[]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // First one question per setup on the cluster, then the rest: a resumed run's subset keeps
    // each question's seeds.
    let there = dir.path().join("there");
    let o = tokio::task::block_in_place(|| eval_cmd(&there, Some(&url), &["--limit", "1"]));
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    let o = tokio::task::block_in_place(|| eval_cmd(&there, Some(&url), &[]));
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["graded"], 12, "3 questions x 4 setups");
    // 3 x (1 + 6 + 7 + 5) calls, each the same prompt, model and reply as on one machine.
    let (local, remote) = (eval_calls(&here), eval_calls(&there));
    assert_eq!(remote.len(), 57);
    assert_eq!(remote, local);
    // One job per setup and run, each an evaluation of one step, nothing trained.
    let jobs = cluster.client().await.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 8);
    let (mut episodes, mut calls) = (0, 0);
    for j in &jobs {
        assert_eq!((j.state, j.steps_done, j.total_steps), (pb::JobState::Succeeded as i32, 1, 1), "{j:?}");
        assert!(j.name.starts_with("eval-arithmetic-"), "{}", j.name);
        let metrics: Value = serde_json::from_str(std::fs::read_to_string(&j.metrics_path).unwrap().lines().next().unwrap()).unwrap();
        episodes += metrics["episodes"].as_u64().unwrap();
        calls += metrics["calls"].as_u64().unwrap();
    }
    assert_eq!((episodes, calls), (12, 57), "each question ran once on the cluster");
    // A rerun has nothing left to ask the cluster.
    let o = tokio::task::block_in_place(|| eval_cmd(&there, Some(&url), &[]));
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("0 calls, 0 tokens"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(cluster.client().await.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs.len(), 8);
}

/// A coordinator with `--allowed-roots` refuses at submit a job whose paths lead elsewhere:
/// straight out, up through `..`, out through a symlink; nothing is stored, and a job inside
/// the root is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_allowed_roots_are_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("root");
    std::fs::create_dir_all(&d).unwrap();
    let ports = [free_port(), free_port()];
    write_job(&d, &ports, 8, false);
    std::os::unix::fs::symlink("/etc", d.join("etc")).unwrap();
    std::fs::write(dir.path().join("outside.jsonl"), std::fs::read_to_string(d.join("train.jsonl")).unwrap()).unwrap();
    let coord_port = free_port();
    let root = d.display().to_string();
    let args = s(&[
        "coordinator",
        "--listen",
        &format!("127.0.0.1:{coord_port}"),
        "--db",
        &dir.path().join("jobs.sqlite").display().to_string(),
        "--allowed-roots",
        &root,
    ]);
    let _coord = spawn(dir.path(), "coordinator", &args);
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", coord_port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "coordinator did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let good = std::fs::read_to_string(d.join("job.toml")).unwrap();
    let mut c = CoordinatorClient::connect(format!("http://127.0.0.1:{coord_port}")).await.unwrap();
    let cases = [
        ("shadow", good.replace("\"train.jsonl\"", "\"/etc/shadow\""), "`data.train`: /etc/shadow resolves to /etc/shadow, outside the allowed roots"),
        ("dot-dot", good.replace("\"train.jsonl\"", "\"../outside.jsonl\""), "outside.jsonl goes up through `..`, which is refused"),
        ("symlink", good.replace("model = \"model-1\"", "model = \"etc/ssl\""), "resolves to /etc/ssl, outside the allowed roots"),
        ("output through a symlink", good.replace("dir = \"out\"", "dir = \"etc/comas-out\""), "resolves to /etc/comas-out, outside the allowed roots"),
    ];
    for (name, text, want) in cases {
        let err = c.submit_job(pb::SubmitJobRequest { job_toml: text, base_dir: root.clone(), reuse_name: false }).await.unwrap_err();
        assert!(err.message().contains(want), "{name}: {}", err.message());
    }
    assert!(c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs.is_empty(), "nothing was stored");
    assert!(!Path::new("/etc/comas-out").exists());
    let id = c.submit_job(pb::SubmitJobRequest { job_toml: good, base_dir: root.clone(), reuse_name: false }).await.unwrap().into_inner().job_id;
    c.cancel_job(pb::CancelJobRequest { job_id: id }).await.unwrap();
}

/// A coordinator with a token file: no token, a wrong one, or one without the scope is refused
/// with a status that says what to set, and nothing is stored; a worker registers only with a
/// `worker` token; a `submit` token runs an evaluation end to end; a token added to the file
/// works without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_api_takes_only_known_tokens_with_the_right_scope() {
    let dir = tempfile::tempdir().unwrap();
    let token = |scopes: &str, name: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_comas")).args(["token", "new", "--scopes", scopes, "--name", name]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8(o.stdout).unwrap();
        let mut lines = text.lines();
        (lines.next().unwrap().to_string(), lines.next().unwrap().to_string())
    };
    let (reader, reader_line) = token("read", "auditor");
    let (submitter, submitter_line) = token("submit", "ci");
    let (worker, worker_line) = token("worker", "pool");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{reader_line}\n{submitter_line}\n{worker_line}\n")).unwrap();
    let mut cluster = Cluster::launch(dir.path(), Vec::new(), 0, &["--tokens", tokens.to_str().unwrap()], 1, &[]);
    cluster.add_worker_with(&[("COMAS_WORKER_TOKEN", worker.as_str())]);
    cluster.add_worker();
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    let comas = |args: &[&str], token: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_comas"));
        c.args(args).env("COMAS_THREADS", "1").env_remove("COMAS_TOKEN");
        if let Some(t) = token {
            c.env("COMAS_TOKEN", t);
        }
        c.output().unwrap()
    };
    let list = |token: Option<&str>| comas(&["list", "--json", "--coordinator", &url], token);
    // Wait for the coordinator.
    let started = Instant::now();
    while !list(Some(&reader)).status.success() {
        assert!(started.elapsed() < Duration::from_secs(60), "coordinator did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let o = list(None);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("ListJobs needs a token: set COMAS_TOKEN"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = list(Some("not-a-token"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not one this service knows"), "{}", String::from_utf8_lossy(&o.stderr));
    // Read-only: may list, may not submit.
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let out = dir.path().join("eval");
    let eval_args: Vec<String> = s(&["eval", "--model", model.to_str().unwrap(), "--setup", "vanilla", "--bench", "arithmetic", "--arithmetic-questions", "2"])
        .into_iter()
        .chain(s(&["--max-new-tokens", "4", "--dtype", "float32", "--coordinator", &url, "--out", out.to_str().unwrap()]))
        .collect();
    let eval_args: Vec<&str> = eval_args.iter().map(String::as_str).collect();
    let o = comas(&eval_args, Some(&reader));
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("SubmitJob needs scope `submit`; token `auditor` has read"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let jobs: Value = serde_json::from_slice(&list(Some(&reader)).stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 0, "nothing was stored");
    // The worker without a token is refused and says why; the one with it serves the job.
    let o = comas(&eval_args, Some(&submitter));
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    assert_eq!(serde_json::from_slice::<Value>(&o.stdout).unwrap()["graded"], 2);
    let refused = std::fs::read_to_string(dir.path().join("worker-1.log")).unwrap();
    assert!(refused.contains("set COMAS_WORKER_TOKEN"), "{refused}");
    let ch = tonic::transport::Endpoint::from_shared(url.clone()).unwrap().connect().await.unwrap();
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {reader}").parse().unwrap();
    let mut c = CoordinatorClient::with_interceptor(ch, move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", bearer.clone());
        Ok(r)
    });
    assert_eq!(c.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers.len(), 1);
    // A token added to the file counts at once, without a restart.
    let (admin, admin_line) = token("admin", "ops");
    assert!(!list(Some(&admin)).status.success());
    std::fs::write(&tokens, format!("{reader_line}\n{submitter_line}\n{worker_line}\n{admin_line}\n")).unwrap();
    let o = list(Some(&admin));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let jobs: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 1);
}

/// An oversized message, a job file over its limit and 1,000 malformed job files in a row each
/// get a clear status; the coordinator still answers its health check and runs a job after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_malformed_requests_leave_the_coordinator_serving() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::launch(dir.path(), Vec::new(), 1, &["--submit-per-minute", "0"], 1, &[]);
    let mut c = cluster.client().await;
    let submit = |text: String| pb::SubmitJobRequest { job_toml: text, base_dir: String::new(), reuse_name: false };
    let e = c.submit_job(submit("#".repeat(5 << 20))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{}", e.message());
    assert!(e.message().contains("message length too large"), "{}", e.message());
    let e = c.submit_job(submit("#".repeat(2 << 20))).await.unwrap_err();
    assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("the limit is 1048576"), "{}", e.message());
    for i in 0..1000 {
        let e = c.submit_job(submit(format!("name = \"bad-{i}\"\n[[[ {i}"))).await.unwrap_err();
        assert!(e.message().contains("not valid TOML"), "{}", e.message());
    }
    assert!(c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs.is_empty());
    let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", cluster.coord_port)).unwrap().connect().await.unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: "comas.v1.Coordinator".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let out = dir.path().join("after");
    let args = ["eval", "--model", model.to_str().unwrap(), "--bench", "arithmetic", "--arithmetic-questions", "2", "--max-new-tokens", "4"];
    let o = tokio::task::block_in_place(|| {
        Command::new(env!("CARGO_BIN_EXE_comas"))
            .args(args)
            .args(["--coordinator", &url, "--out", out.to_str().unwrap()])
            .env("COMAS_THREADS", "1")
            .output()
            .unwrap()
    });
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stderr), cluster.logs());
    assert_eq!(serde_json::from_slice::<Value>(&o.stdout).unwrap()["graded"], 2);
}

/// SubmitJob calls are rate-limited per peer: a burst of `--submit-per-minute`, then a clear
/// RESOURCE_EXHAUSTED with the wait; reading is not limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_past_the_rate_limit_are_told_when_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::launch(dir.path(), Vec::new(), 0, &["--submit-per-minute", "3"], 1, &[]);
    let mut c = cluster.client().await;
    for i in 0..3 {
        let e = c.submit_job(pb::SubmitJobRequest { job_toml: format!("[[[ {i}"), base_dir: String::new(), reuse_name: false }).await.unwrap_err();
        assert!(e.message().contains("not valid TOML"), "{}", e.message());
    }
    let e = c.submit_job(pb::SubmitJobRequest { job_toml: "[[[".into(), base_dir: String::new(), reuse_name: false }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("too many SubmitJob calls from 127.0.0.1; retry in 20 s"), "{}", e.message());
    assert!(c.list_jobs(pb::ListJobsRequest {}).await.is_ok());
}

/// A job an interrupted `comas eval --coordinator` left behind (`remote-<setup>.json`) is
/// picked up by the rerun: the client is killed while its job waits for a worker, the job is
/// cancelled, and the rerun resumes that job instead of submitting its questions again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_picks_up_the_evaluation_job_of_an_interrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::launch(dir.path(), Vec::new(), 0, &[], 1, &[]);
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let eval = |out: &Path| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_comas"));
        c.args(["eval", "--model", model.to_str().unwrap(), "--setup", "vanilla", "--bench", "arithmetic", "--arithmetic-questions", "3"])
            .args(["--max-new-tokens", "6", "--coordinator", &url, "--out", out.to_str().unwrap()])
            .env("COMAS_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    // The client does not wait for a coordinator that is still starting: wait here.
    let mut c = cluster.client().await;
    let part = dir.path().join("part");
    let mut first = eval(&part).spawn().unwrap();
    let pending = part.join("remote-vanilla.json");
    let started = Instant::now();
    while !pending.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the job was never submitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let text = std::fs::read_to_string(&pending).unwrap();
    let id = serde_json::from_str::<Value>(&text).unwrap()["job_id"].as_str().unwrap().to_string();
    c.cancel_job(pb::CancelJobRequest { job_id: id.clone() }).await.unwrap();
    cluster.wait_for(&id, 30, "the cancel", |s| s.state == pb::JobState::Cancelled as i32).await;
    cluster.add_worker();
    let o = tokio::task::block_in_place(|| eval(&part).output().unwrap());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}\n{}", cluster.logs());
    assert!(err.contains(&format!("vanilla: picking up job {id} (cancelled)")), "{err}");
    assert!(!pending.exists());
    let jobs = c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 1, "no question was submitted twice");
    assert_eq!(jobs[0].state, pb::JobState::Succeeded as i32);
    // The same replies as a run that was never interrupted.
    let whole = dir.path().join("whole");
    let o = tokio::task::block_in_place(|| eval(&whole).output().unwrap());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(eval_calls(&part).len(), 3);
    assert_eq!(eval_calls(&part), eval_calls(&whole));
}

/// Guided tails that make the tiny DSBench agents write working programs (regex-escaped).
const DS_ENGINEER: &str = r"```python\nimport os\nopen\('X_test\.pkl','w'\)\.write\('x'\)\nprint\(sorted\(os\.listdir\('\.'\)\)\)\n```";
const DS_MODELER: &str = r"```python\nimport os\nopen\('model\.pkl','w'\)\.write\('m'\)\nprint\(sorted\(os\.listdir\('\.'\)\)\)\n```";
const DS_ANALYST: &str = r"```python\nimport csv\nr=list\(csv\.reader\(open\('test\.csv'\)\)\)\[1:\]\nopen\('submission\.csv','w'\)\.write\('id,y\\n'\+''\.join\(x\[0\]\+',1\\n' for x in r\)\)\nprint\(len\(r\)\)\n```";

/// MAPPA's DSBench chain on tiny models and two tasks of the shipped set: each run starts from
/// the shared workspace (the data, then what earlier agents saved), the Analyst's submission is
/// scored against the hidden answers, and the scores reach the metrics log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dsbench_chain_shares_its_workspace_and_its_submission_is_scored() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let ports = vec![free_port(), free_port()];
    for (name, seed) in [("model-0", 3), ("model-1", 4), ("coach", 9)] {
        write_model(&d.join(name), &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) }).unwrap();
    }
    let tasks = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/dsbench-mini/tasks.jsonl")).unwrap();
    let two: Vec<&str> = tasks.lines().take(2).collect();
    std::fs::write(d.join("tasks.jsonl"), two.join("\n")).unwrap();
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 4\nmicro_batch_size = 4\nmask_truncated = false\n", ports[k])
    };
    // A multi-line literal string: the programs quote with '.
    let tail = |role: &str, re: &str| format!("[mappa.role_sampling.{role}]\nmax_new_tokens = 200\nmin_new_tokens = 0\nguided_suffix = '''{re}'''\n");
    let job = format!(
        "name = \"dsbench-e2e\"\nseed = 5\nmethod = \"mappa\"\n[data]\ntrain = \"tasks.jsonl\"\nshuffle = false\n[schedule]\nquestions_per_step = 2\nsteps = 1\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n\
         [mappa]\npipeline = \"ds_bench\"\nagents = [0, 1, 0]\nmax_turns = [1, 1, 1]\ninstances_per_question = 2\ntool_timeout_secs = 20.0\nnorm_scope = \"global\"\n\
         [mappa.coach_sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = 'PROCESS_SCORE:[0-9]'\n{}{}{}\
         [[frozen]]\nname = \"coach\"\nmodel = \"coach\"\n{}{}",
        tail("data_engineer", DS_ENGINEER),
        tail("modeler", DS_MODELER),
        tail("analyst", DS_ANALYST),
        agent(0),
        agent(1)
    );
    std::fs::write(d.join("job.toml"), job).unwrap();
    let c = Cluster::launch(d, ports, 1, &[], 1, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    let m = &log[0];
    for role in ["data_engineer", "modeler", "analyst"] {
        assert_eq!(m["actions"][role]["mean"], 1.0, "{role}: {m}");
    }
    assert_eq!((m["tool_calls"].as_u64(), m["tool_success_rate"]["mean"].as_f64()), (Some(12), Some(1.0)), "{m}");
    assert_eq!((m["ds_success_rate"]["mean"].as_f64(), m["ds_success_rate"]["count"].as_u64()), (Some(1.0), Some(4)));
    // Every prediction is 1: accuracy is the share of positives in each task's hidden answers.
    let positives = |line: &str| {
        let t: Value = serde_json::from_str(line).unwrap();
        let answers: Vec<&str> = t["answer"].as_str().unwrap().lines().skip(1).collect();
        answers.iter().filter(|l| l.ends_with(",1")).count() as f64 / answers.len() as f64
    };
    let want = (positives(two[0]) + positives(two[1])) / 2.0;
    assert!((m["ds_metrics"]["accuracy"]["mean"].as_f64().unwrap() - want).abs() < 1e-12, "{m}");
    // `norm_scope = "global"`: both learners whitened with the moments of all their returns,
    // pooled by the coordinator; recomputed here from each learner's own moments.
    let own: Vec<(f64, f64, f64)> = (0..2)
        .map(|k| {
            let t = &m["agents"][k]["train"];
            let g = &t["return_moments"][""];
            (g["count"].as_f64().unwrap(), g["mean"].as_f64().unwrap(), t["advantage_mean"].as_f64().unwrap())
        })
        .collect();
    let tokens: f64 = own.iter().map(|o| o.0).sum();
    let mean = own.iter().map(|o| o.0 * o.1).sum::<f64>() / tokens;
    let p = &m["pooled_whitening"]["all"];
    assert_eq!(p["tokens"].as_f64(), Some(tokens), "{p}");
    assert!((p["mean"].as_f64().unwrap() - mean).abs() < 1e-9, "{p}");
    let std = p["std"].as_f64().unwrap();
    for (k, (_, own_mean, advantage_mean)) in own.iter().enumerate() {
        let want = (own_mean - mean) / std;
        assert!((advantage_mean - want).abs() < 1e-6, "agent {k}: advantage mean {advantage_mean}, pooled offset {want}");
    }
    assert!(own.iter().any(|o| o.2.abs() > 1e-3), "the pooled whitening moved some agent's mean advantage: {own:?}");
    let text = std::fs::read_to_string(d.join("out/episodes/step-00000.jsonl")).unwrap();
    for line in text.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let actions = r["record"]["actions"].as_array().unwrap();
        let obs = |i: usize| actions[i]["observation"].as_str().unwrap().to_string();
        // The Modeler's fresh folder holds what the Data Engineer saved.
        assert!(obs(1).contains("['X_test.pkl', 'main.py', 'model.pkl', 'test.csv', 'train.csv']"), "{}", obs(1));
        assert!(obs(2).contains("40"), "{}", obs(2));
        let ws: Vec<&str> = actions[2]["workspace"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(ws, vec!["X_test.pkl", "model.pkl", "test.csv", "train.csv"]);
        let o = &r["record"]["ds_outcome"];
        assert_eq!((o["success"].as_bool(), o["predictions"].as_u64(), o["expected"].as_u64()), (Some(true), Some(40), Some(40)), "{o}");
    }
}

/// CoSIR's e2e job: two seats, each its own tiny agent; guided tails end every message with a
/// tag line (shares true and false, requests, a malformed line, names that do not exist) and
/// every final turn with a FINAL (sometimes two, sometimes none).
fn write_cosir_job(dir: &Path, learner_ports: &[u16]) {
    for (name, seed) in [("model-0", 3), ("model-1", 4)] {
        write_model(&dir.join(name), &TinySpec { seed, ..TinySpec::tiny(Architecture::Qwen2) }).unwrap();
    }
    let agent = |k: usize| {
        format!("[[agents]]\nmodel = \"model-{k}\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-4\ntrain_batch_size = 6\nmicro_batch_size = 6\nmask_truncated = false\n", learner_ports[k])
    };
    let job = format!(
        "name = \"cosir-e2e\"\nseed = 5\nmethod = \"cosir\"\n[schedule]\nquestions_per_step = 2\nsteps = {COSIR_STEPS}\nlearner_timeout_secs = 120\n[output]\ndir = \"out\"\nsave_episodes = true\n\
         [cosir]\noptions = 3\ncriteria = 3\ncriteria_names = [\"cost\", \"speed\", \"safety\"]\nagents = 2\nmax_score = 2\nrounds = 2\nseat_policy = \"per_seat\"\ninstances_per_question = 2\n\
         [cosir.sampling]\ntemperature = 1.0\nmax_new_tokens = 96\nmin_new_tokens = 0\n\
         guided_suffix = '''\\n(SHARE\\((A|B|C), (cost|speed|safety), [0-2]\\)|SHARE\\(A, cost, 7\\)|REQUEST\\((A|B|C), (cost|speed|safety)\\)|REQUEST\\(agent_9, A, cost\\)|FINAL: A)'''\n\
         [cosir.final_sampling]\ntemperature = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = '''\\n(FINAL\\((A|B|C)\\)|FINAL\\(A\\)\\nFINAL\\(B\\)|I choose A)'''\n{}{}",
        agent(0),
        agent(1)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

const COSIR_STEPS: u64 = 2;

const NEUROMAS_STEPS: u64 = 2;

/// A [2, 1] NeuroMAS graph, one LoRA adapter per node on one tiny base (three agents, three
/// learners): 2 tasks x 2 rollouts per step, each node's reply ending in a guided `\boxed{D}`.
fn write_neuromas_job(dir: &Path, learner_ports: &[u16]) {
    write_model(&dir.join("model"), &TinySpec { seed: 3, ..TinySpec::tiny(Architecture::Qwen2) }).unwrap();
    // Answers 2 and 3, and the guided box allows only those digits: about half the readouts
    // are right, so rewards and advantages vary.
    let data: String = [(0, 2), (1, 2), (2, 0), (2, 1)]
        .iter()
        .enumerate()
        .map(|(i, (a, b))| format!("{{\"prompt\":\"What is {a} + {b}?\",\"answer\":\"{}\",\"task\":\"math\",\"id\":\"q{i}\"}}\n", a + b))
        .collect();
    std::fs::write(dir.join("train.jsonl"), data).unwrap();
    let agent = |k: usize| {
        format!(
            "[[agents]]\nmodel = \"model\"\nlearner = \"http://127.0.0.1:{}\"\n[agents.train]\nlr = 1e-3\ntrain_batch_size = 4\nmicro_batch_size = 4\nmask_truncated = false\n\
             [agents.train.lora]\nr = 2\nalpha = 4.0\ntarget_modules = [\"q_proj\", \"v_proj\"]\n",
            learner_ports[k]
        )
    };
    let job = format!(
        "name = \"neuromas-e2e\"\nseed = 5\nmethod = \"neuromas\"\n[data]\ntrain = \"train.jsonl\"\n[schedule]\nquestions_per_step = 2\nsteps = {NEUROMAS_STEPS}\nlearner_timeout_secs = 120\n\
         [output]\ndir = \"out\"\nsave_episodes = true\n[neuromas]\nrollouts_per_task = 2\nmax_msg_tokens = 4\n[neuromas.topology]\nlayers = [2, 1]\n\
         [neuromas.sampling]\ntemperature = 1.0\ntop_p = 1.0\nmax_new_tokens = 24\nmin_new_tokens = 0\nguided_suffix = '''\\\\boxed\\{{[23]\\}}'''\n{}{}{}",
        agent(0),
        agent(1),
        agent(2)
    );
    std::fs::write(dir.join("job.toml"), job).unwrap();
}

/// A NeuroMAS graph as a job: the layers speak in order (2 calls then 1 per rollout), every
/// node's sample of a rollout carries the rollout's reward (the readout's grade, computed here
/// again from the record), the messages passed on are cuts of the replies without thinking, and
/// each agent (a node's adapter) trains on its own node's samples only. One learner process
/// trains all three adapters over the one base it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_neuromas_graph_runs_layer_by_layer_and_every_node_shares_the_rollout_reward() {
    let tmp = tempfile::tempdir().unwrap();
    // One learner process trains the three adapters over one base.
    let port = free_port();
    write_neuromas_job(tmp.path(), &[port; 3]);
    let c = Cluster::launch_one_learner(tmp.path(), port, 3, 1, NEUROMAS_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    let st = c.finished(&id).await;
    assert!(st.agents.iter().all(|a| a.version == NEUROMAS_STEPS), "{:?}", st.agents);
    let log = c.metrics_log();
    assert_eq!(log.len() as u64, NEUROMAS_STEPS);
    let mut rewards_seen = Vec::new();
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        assert_eq!((m["method"].as_str(), m["episodes"].as_u64()), (Some("neuromas"), Some(4)), "{m}");
        // Calls per layer: 2 nodes then the readout, in each of the 4 rollouts.
        assert_eq!((m["completion_tokens"]["1"]["count"].as_u64(), m["completion_tokens"]["2"]["count"].as_u64()), (Some(8), Some(4)), "{m}");
        let text = std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl"))).unwrap();
        let records: Vec<Value> = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone()).collect();
        assert_eq!(records.len(), 4);
        let mut rewards = Vec::new();
        for r in &records {
            let turns = r["turns"].as_array().unwrap();
            let layers: Vec<u64> = turns.iter().map(|t| t["node"]["layer"].as_u64().unwrap()).collect();
            assert_eq!(layers, vec![1, 1, 2], "{r}");
            let agents: Vec<u64> = turns.iter().map(|t| t["agent"].as_u64().unwrap()).collect();
            assert_eq!(agents, vec![0, 1, 2]);
            for t in turns {
                // The message is the reply without thinking, cut (or not) at a token boundary.
                let reply = t["text"].as_str().unwrap().trim();
                let message = t["message"]["text"].as_str().unwrap();
                assert!(
                    reply.starts_with(message) && (message.len() < reply.len()) == t["message"]["truncated"].as_bool().unwrap() || message.is_empty(),
                    "{t}"
                );
            }
            // The readout's grade, by this test: the digit in its last box against the answer.
            let answer = r["task"]["answer"].as_str().unwrap();
            let readout = turns[2]["text"].as_str().unwrap();
            let reward = match readout.rfind("\\boxed{") {
                None => -0.5,
                Some(i) => {
                    let inner = &readout[i + 7..];
                    f64::from(u8::from(inner.split('}').next() == Some(answer)))
                }
            };
            rewards.push(reward);
        }
        let mean = rewards.iter().sum::<f64>() / 4.0;
        let right = rewards.iter().filter(|&&r| r == 1.0).count() as f64 / 4.0;
        assert_eq!(m["graph_accuracy"]["mean"].as_f64(), Some(right), "{m}");
        for k in 0..3 {
            let a = &m["agents"][k];
            // Each node's adapter trains on its one sample of each of the 4 rollouts, each with
            // its rollout's reward: every agent's mean is the rollouts' mean.
            assert_eq!((a["samples"].as_u64(), a["train"]["samples"].as_u64()), (Some(4), Some(4)), "step {step} agent {k}");
            let got = a["reward_mean"].as_f64().unwrap();
            assert!((got - mean).abs() < 1e-12, "step {step} agent {k}: reward mean {got}, the rollouts' {mean}");
        }
        // Only adapter bytes travel: r = 2 on q (64 -> 64) and v (64 -> 32) in 2 layers, f32,
        // is 2 x (2x64 + 64x2 + 2x64 + 32x2) x 4 = 3,584 bytes per agent to the one worker
        // (after the last step nothing is sent).
        let sent = if step + 1 < NEUROMAS_STEPS { 3584 } else { 0 };
        for k in 0..3 {
            assert_eq!(m["agents"][k]["weight_sync"]["bytes"].as_u64(), Some(sent), "{m}");
        }
        rewards_seen.extend(rewards);
    }
    // Right and wrong readouts both occurred, so the equal rewards above were not all alike.
    assert!(rewards_seen.contains(&1.0) && rewards_seen.contains(&0.0), "{rewards_seen:?}");
    drop(c);
    grow_the_trained_graph(tmp.path()).await;
}

/// Growth (§6) of the [2, 1] graph the test above trained: `comas grow --to 2,2,1` keeps the
/// three trained nodes' adapters and Adam moments bit for bit, the new layer's nodes start as
/// copies of the nodes below them, and the grown job trains all five: 2, 2 and 1 calls per
/// rollout, the new layer reading through identity wiring for its one bridge step.
async fn grow_the_trained_graph(dir: &Path) {
    let grown = dir.join("grown");
    // Misuse first: a shrinking target, and checkpoints where there are none.
    let grow = |checkpoints: &str, to: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args([
                "grow",
                &dir.join("job.toml").display().to_string(),
                "--checkpoints",
                checkpoints,
                "--to",
                to,
                "--out",
                &dir.join("bad").display().to_string(),
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = grow(&format!("{}/ckpt-0/agent-{{agent}}", dir.display()), "1,1");
    assert!(e.contains("layer 1 has 2 nodes and growth only adds"), "{e}");
    let e = grow(&format!("{}/nowhere-{{agent}}", dir.display()), "2,2,1");
    assert!(e.contains("no complete checkpoint under") && e.contains("nowhere-0"), "{e}");
    assert!(!dir.join("bad/job.toml").exists());
    let out = Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(["grow", &dir.join("job.toml").display().to_string(), "--checkpoints", &format!("{}/ckpt-0/agent-{{agent}}", dir.display())])
        .args(["--to", "2,2,1", "--bridge-steps", "1", "--out", &grown.display().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("new node 3 at L2N1: a copy of node 0's adapter") && stderr.contains("new node 4 at L2N2: a copy of node 1's adapter"), "{stderr}");
    let source = |k: u64| dir.join(format!("ckpt-0/agent-{k}/neuromas-e2e/step-{NEUROMAS_STEPS}"));
    let bytes = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    // Old nodes keep their uids; the new ones copy nodes 0 and 1.
    for (uid, from) in [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1)] {
        for f in ["adapter/adapter_model.safetensors", "optimizer.safetensors"] {
            assert!(bytes(grown.join(format!("nodes/uid-{uid}/{f}"))) == bytes(source(from).join(f)), "node {uid}'s {f} is not node {from}'s");
        }
    }
    let adam_steps =
        |p: PathBuf| serde_json::from_str::<Value>(&std::fs::read_to_string(p.join("state.json")).unwrap()).unwrap()["adam_steps"].as_u64().unwrap();
    let trained = adam_steps(source(0));
    assert_eq!(trained, NEUROMAS_STEPS);
    let history: Value = serde_json::from_str(&std::fs::read_to_string(grown.join("growth.json")).unwrap()).unwrap();
    assert_eq!(history[0]["after"]["uids"], serde_json::json!([[0, 1], [3, 4], [2]]));

    // The grown job, with this run's learner addresses.
    let ports: Vec<u16> = (0..5).map(|_| free_port()).collect();
    let mut job: toml::Table = toml::from_str(&std::fs::read_to_string(grown.join("job.toml")).unwrap()).unwrap();
    for (a, port) in job["agents"].as_array_mut().unwrap().iter_mut().zip(&ports) {
        a.as_table_mut().unwrap().insert("learner".into(), format!("http://127.0.0.1:{port}").into());
    }
    std::fs::write(grown.join("job.toml"), toml::to_string(&job).unwrap()).unwrap();
    let c = Cluster::launch(&grown, ports, 1, &[], NEUROMAS_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    for m in c.metrics_log() {
        let step = m["step"].as_u64().unwrap();
        let calls: Vec<Option<u64>> = ["1", "2", "3"].iter().map(|l| m["completion_tokens"][l]["count"].as_u64()).collect();
        assert_eq!(calls, vec![Some(8), Some(8), Some(4)], "{m}");
        let text = std::fs::read_to_string(grown.join(format!("out/episodes/step-{step:05}.jsonl"))).unwrap();
        for l in text.lines() {
            let r = &serde_json::from_str::<Value>(l).unwrap()["record"];
            let agents: Vec<u64> = r["turns"].as_array().unwrap().iter().map(|t| t["agent"].as_u64().unwrap()).collect();
            assert_eq!(agents, vec![0, 1, 3, 4, 2], "{r}");
            // Identity wiring in the bridge step only.
            let bridged: Vec<u64> = if step == 0 { vec![2] } else { vec![] };
            assert_eq!(r["graph"]["identity_layers"], serde_json::json!(bridged), "step {step}");
        }
    }
    // Every learner went on from the moments it was given: one Adam step per job step.
    for uid in 0..5 {
        let ckpt = grown.join(format!("ckpt-{uid}/neuromas-e2e-grown/step-{NEUROMAS_STEPS}"));
        assert_eq!(adam_steps(ckpt), trained + NEUROMAS_STEPS, "node {uid}");
    }
}

/// The spec's rewards, written again from spec cosir.md §3.5 and §4 for this test: posteriors by
/// enumerating every completion of the unknown cells (not by convolution), default weights.
mod cosir_reference {
    use serde_json::Value;
    use std::collections::{BTreeMap, BTreeSet};

    type Cell = (usize, usize);

    pub struct Table {
        weights: Vec<u32>,
        prior: Vec<f64>,
        scores: Vec<Vec<u32>>,
        pub answer: usize,
        pub views: Vec<BTreeSet<Cell>>,
    }

    fn cell(v: &Value) -> Cell {
        (v[0].as_u64().unwrap() as usize, v[1].as_u64().unwrap() as usize)
    }

    impl Table {
        pub fn from_json(t: &Value) -> Self {
            let nums = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
            Table {
                weights: nums(&t["weights"]),
                prior: t["prior"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
                scores: t["scores"].as_array().unwrap().iter().map(nums).collect(),
                answer: t["answer"].as_u64().unwrap() as usize,
                views: t["views"].as_array().unwrap().iter().map(|v| v.as_array().unwrap().iter().map(cell).collect()).collect(),
            }
        }

        fn posterior(&self, known: &BTreeSet<Cell>) -> Vec<f64> {
            let (m, c) = (self.scores.len(), self.weights.len());
            let unknown: Vec<Cell> = (0..m).flat_map(|o| (0..c).map(move |x| (o, x))).filter(|x| !known.contains(x)).collect();
            let k = self.prior.len();
            let mut p = vec![0.0; m];
            let mut values = vec![0usize; unknown.len()];
            loop {
                let mut s = self.scores.clone();
                let mut w = 1.0;
                for (x, &v) in unknown.iter().zip(&values) {
                    s[x.0][x.1] = v as u32;
                    w *= self.prior[v];
                }
                let u: Vec<u32> = s.iter().map(|row| row.iter().zip(&self.weights).map(|(a, b)| a * b).sum()).collect();
                let best = *u.iter().max().unwrap();
                let n = u.iter().filter(|&&x| x == best).count() as f64;
                for o in 0..m {
                    if u[o] == best {
                        p[o] += w / n;
                    }
                }
                // Next completion, like an odometer.
                let mut i = 0;
                while i < values.len() && values[i] + 1 == k {
                    values[i] = 0;
                    i += 1;
                }
                if i == values.len() {
                    return p;
                }
                values[i] += 1;
            }
        }

        fn sigma(&self, known: &BTreeSet<Cell>) -> f64 {
            -self.posterior(known)[self.answer].max(1e-6).ln()
        }

        fn entropy(&self, known: &BTreeSet<Cell>) -> f64 {
            -self.posterior(known).iter().filter(|&&x| x > 0.0).map(|x| x * x.ln()).sum::<f64>()
        }

        /// H(E) − Σ_v p(v) H(E ∪ {x = v}): with the cell's true value fixed in `scores`, so it is
        /// tried at every value by a copy.
        fn gain(&self, known: &BTreeSet<Cell>, x: Cell) -> f64 {
            let mut with = known.clone();
            with.insert(x);
            let after: f64 = (0..self.prior.len())
                .map(|v| {
                    let mut t =
                        Table { weights: self.weights.clone(), prior: self.prior.clone(), scores: self.scores.clone(), answer: self.answer, views: Vec::new() };
                    t.scores[x.0][x.1] = v as u32;
                    self.prior[v] * t.entropy(&with)
                })
                .sum();
            self.entropy(known) - after
        }
    }

    /// One game as the reference sees it.
    pub struct Game {
        /// (turn index, reward) of every turn.
        pub rewards: Vec<(u64, f64)>,
        pub valid_shares: u32,
        pub false_claims: u32,
        pub share_tags: u32,
        pub requests: u32,
        pub team_right: bool,
    }

    /// Each turn's reward from the record's turns (their tags as recorded).
    pub fn game(record: &Value) -> Game {
        let t = Table::from_json(&record["table"]);
        let turns = record["turns"].as_array().unwrap();
        let n = t.views.len();
        let mut e: Vec<BTreeSet<Cell>> = t.views.clone();
        let team = |e: &Vec<BTreeSet<Cell>>| e.iter().map(|x| t.sigma(x)).sum::<f64>();
        let mut out = Vec::new();
        let (mut valid_shares, mut false_claims, mut share_tags, mut requests) = (0, 0, 0, 0);
        for turn in turns.iter().filter(|x| x["role"] == "discussant") {
            let seat = turn["seat"].as_u64().unwrap() as usize;
            let before = team(&e);
            let (mut valid, mut lies) = (Vec::new(), 0.0);
            for s in turn["tags"]["shares"].as_array().unwrap() {
                let x = cell(&s["cell"]);
                if s["value"].as_u64().unwrap() as u32 != t.scores[x.0][x.1] {
                    lies += 1.0;
                } else if e[seat].contains(&x) {
                    valid.push(x);
                }
            }
            let mut req = 0.0;
            for r in turn["tags"]["requests"].as_array().unwrap() {
                let x = cell(&r["cell"]);
                if !e[seat].contains(&x) && (0..n).any(|j| j != seat && e[j].contains(&x)) {
                    req += t.gain(&e[seat], x);
                }
            }
            for (j, ej) in e.iter_mut().enumerate() {
                if j != seat {
                    ej.extend(valid.iter().copied());
                }
            }
            valid_shares += valid.len() as u32;
            false_claims += lies as u32;
            share_tags += turn["tags"]["shares"].as_array().unwrap().len() as u32;
            requests += turn["tags"]["requests"].as_array().unwrap().len() as u32;
            let share = (before - team(&e)).max(0.0);
            let fmt = if turn["tags"]["violations"].as_array().unwrap().is_empty() { 0.0 } else { 1.0 };
            out.push((turn["turn_index"].as_u64().unwrap(), share + 0.5 * req - 0.5 * fmt - 0.5 * lies));
        }
        let finals: Vec<&Value> = turns.iter().filter(|x| x["role"] == "voter").collect();
        let mut votes: BTreeMap<u64, u32> = BTreeMap::new();
        for f in &finals {
            if let Some(o) = f["tags"]["final_choice"].as_u64() {
                *votes.entry(o).or_default() += 1;
            }
        }
        let top = votes.values().copied().max().unwrap_or(0);
        let leaders: Vec<u64> = votes.iter().filter(|(_, &v)| v == top).map(|(&o, _)| o).collect();
        let team_right = top > 0 && leaders == [t.answer as u64];
        for f in finals {
            let seat = f["seat"].as_u64().unwrap() as usize;
            let p = t.posterior(&e[seat]);
            let best = p.iter().cloned().fold(0.0, f64::max);
            let used = f["tags"]["final_choice"].as_u64().is_some_and(|o| p[o as usize] >= best - 1e-12);
            let fmt = if f["tags"]["violations"].as_array().unwrap().is_empty() { 0.0 } else { 1.0 };
            out.push((f["turn_index"].as_u64().unwrap(), f64::from(u8::from(used)) + f64::from(u8::from(team_right)) - 0.5 * fmt));
        }
        Game { rewards: out, valid_shares, false_claims, share_tags, requests, team_right }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cosir_game_is_rewarded_as_the_spec_says_turn_by_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_cosir_job(tmp.path(), &ports);
    let c = Cluster::launch(tmp.path(), ports, 1, &[], COSIR_STEPS, &["--max-episodes", "4"]);
    let id = c.submit().await;
    c.finished(&id).await;
    let log = c.metrics_log();
    assert_eq!(log.len() as u64, COSIR_STEPS);
    let (mut valid, mut lies, mut violations, mut tag_count) = (0u32, 0u32, 0u64, 0u64);
    for m in &log {
        let step = m["step"].as_u64().unwrap();
        // 2 tables x 2 games, each 2 rounds x 2 seats + 2 finals.
        assert_eq!((m["method"].as_str(), m["episodes"].as_u64()), (Some("cosir"), Some(4)), "{m}");
        let text = std::fs::read_to_string(tmp.path().join(format!("out/episodes/step-{step:05}.jsonl"))).unwrap();
        let records: Vec<Value> = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["record"].clone()).collect();
        assert_eq!(records.len(), 4);
        let mut by_seat: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let (mut step_valid, mut team_right, mut requests) = (0u32, 0u32, 0u32);
        let mut lie_rates = Vec::new();
        for r in &records {
            let turns = r["turns"].as_array().unwrap();
            assert_eq!(turns.len(), 6);
            let seat_of: std::collections::BTreeMap<u64, usize> =
                turns.iter().map(|t| (t["turn_index"].as_u64().unwrap(), t["seat"].as_u64().unwrap() as usize)).collect();
            let g = cosir_reference::game(r);
            for (turn, reward) in g.rewards {
                by_seat[seat_of[&turn]].push(reward);
            }
            step_valid += g.valid_shares;
            lies += g.false_claims;
            requests += g.requests;
            if g.share_tags > 0 {
                lie_rates.push(f64::from(g.false_claims) / f64::from(g.share_tags));
            }
            team_right += u32::from(g.team_right);
            for t in turns {
                // Every message ends with its guided tag line; the tags are what the text says.
                let tags = &t["tags"];
                let lines = |p: &str| t["message"].as_str().unwrap().lines().filter(|l| l.starts_with(p)).count();
                let counted =
                    tags["shares"].as_array().unwrap().len() + tags["requests"].as_array().unwrap().len() + usize::from(tags["final_choice"].is_u64());
                assert!(counted <= lines("SHARE(") + lines("REQUEST(") + lines("FINAL("), "{t}");
                violations += tags["violations"].as_array().unwrap().len() as u64;
                tag_count += tags_of(t);
            }
        }
        valid += step_valid;
        assert_eq!(m["valid_shares_per_episode"]["mean"].as_f64(), Some(f64::from(step_valid) / 4.0), "{m}");
        assert_eq!(m["team_accuracy"]["mean"].as_f64(), Some(f64::from(team_right) / 4.0), "{m}");
        assert_eq!(m["requests_per_episode"]["mean"].as_f64(), Some(f64::from(requests) / 4.0), "{m}");
        let lie_rate = (!lie_rates.is_empty()).then(|| lie_rates.iter().sum::<f64>() / lie_rates.len() as f64);
        assert_eq!((m["false_claim_rate"]["mean"].as_f64(), m["false_claim_rate"]["count"].as_u64()), (lie_rate, Some(lie_rates.len() as u64)), "{m}");
        for k in 0..2 {
            let a = &m["agents"][k];
            // Each seat's agent trains on exactly its 3 turns of each of the 4 games.
            assert_eq!((a["samples"].as_u64(), a["train"]["samples"].as_u64()), (Some(12), Some(12)), "step {step} agent {k}");
            let want = by_seat[k].iter().sum::<f64>() / by_seat[k].len() as f64;
            let got = a["reward_mean"].as_f64().unwrap();
            assert!((got - want).abs() < 1e-9, "step {step} agent {k}: reward mean {got}, the reference says {want}");
        }
    }
    eprintln!("tags {tag_count}, valid shares {valid}, false claims {lies}, violations {violations}");
    assert!(tag_count > 0 && violations > 0 && lies > 0 && valid > 0, "the guided tails produced true and false shares, and violations");
}

/// Tags a turn's record holds.
fn tags_of(t: &Value) -> u64 {
    let tags = &t["tags"];
    (tags["shares"].as_array().unwrap().len() + tags["requests"].as_array().unwrap().len() + usize::from(tags["final_choice"].is_u64())) as u64
}
