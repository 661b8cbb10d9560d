//! The job API end to end: bad jobs refused at submit with what to fix, TLS, allowed roots,
//! tokens and scopes, oversized and malformed requests, rate limits, and `comas local`'s
//! built-in example.
mod harness;

use comas_proto::v1 as pb;
use comas_proto::v1::coordinator_client::CoordinatorClient;
use harness::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_jobs_are_rejected_at_submit_and_nothing_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ports = [free_port(), free_port()];
    write_job(d, &ports, 8, false);
    let coord_port = free_port();
    let _coord = spawn(
        d,
        "coordinator",
        &s(&[
            "coordinator",
            "--listen",
            &format!("127.0.0.1:{coord_port}"),
            "--db",
            &d.join("jobs.sqlite").display().to_string(),
        ]),
    );
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", coord_port)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(60), "coordinator did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let good = std::fs::read_to_string(d.join("job.toml")).unwrap();
    // A data set with a broken third line, and a model whose tokenizer outgrows its vocabulary.
    std::fs::write(d.join("broken.jsonl"), "{\"prompt\":\"a\",\"answer\":\"1\",\"task\":\"math\",\"id\":\"a\"}\n{\"prompt\":\"b\",\"answer\":\"2\",\"task\":\"math\",\"id\":\"b\"}\n{\"prompt\": \"c\",\n").unwrap();
    let train = std::fs::read_to_string(d.join("train.jsonl")).unwrap();
    let long = format!(
        "{{\"prompt\":\"{}\",\"answer\":\"1\",\"task\":\"math\",\"id\":\"long\"}}",
        "seven ".repeat(6000)
    );
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
            .args([
                "submit",
                &d.join("bad.toml").display().to_string(),
                "--coordinator",
                &format!("http://127.0.0.1:{coord_port}"),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: accepted");
        assert!(err.contains(want), "{name}: message should mention `{want}`: {err}");
    }
    let list = Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(["list", "--json", "--coordinator", &format!("http://127.0.0.1:{coord_port}")])
        .output()
        .unwrap();
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let jobs: Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 0, "no job was stored: {jobs}");
    assert!(!d.join("out/metrics.jsonl").exists());

    // A valid job whose learners never come up waits for them, and can be cancelled meanwhile.
    let mut c = CoordinatorClient::connect(format!("http://127.0.0.1:{coord_port}")).await.unwrap();
    let id = c
        .submit_job(pb::SubmitJobRequest {
            job_toml: good.clone(),
            base_dir: d.display().to_string(),
            reuse_name: false,
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    // The same name again would pick up that job's checkpoints; another name with the same
    // output folder would interleave its metrics: both are refused while it lives.
    let again = c
        .submit_job(pb::SubmitJobRequest {
            job_toml: good.clone(),
            base_dir: d.display().to_string(),
            reuse_name: false,
        })
        .await
        .unwrap_err();
    assert!(
        again.message().contains(&format!("`name`: job {id} is already called `e2e`"))
            && again.message().contains("comas resume"),
        "{}",
        again.message()
    );
    let renamed = good.replace("name = \"e2e\"", "name = \"e2e-2\"");
    let shared = c
        .submit_job(pb::SubmitJobRequest {
            job_toml: renamed,
            base_dir: d.display().to_string(),
            reuse_name: false,
        })
        .await
        .unwrap_err();
    assert!(
        shared.message().contains(&format!("is the output folder of job {id} (`e2e`")),
        "{}",
        shared.message()
    );
    let started = Instant::now();
    while c.get_job(pb::GetJobRequest { job_id: id.clone() }).await.unwrap().into_inner().state
        != pb::JobState::Running as i32
    {
        assert!(started.elapsed() < Duration::from_secs(30), "job never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(["cancel", &id, "--coordinator", &format!("http://127.0.0.1:{coord_port}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut state = 0;
    while started.elapsed() < Duration::from_secs(30) {
        state =
            c.get_job(pb::GetJobRequest { job_id: id.clone() }).await.unwrap().into_inner().state;
        if state == pb::JobState::Cancelled as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, pb::JobState::Cancelled as i32);
    // A cancelled job can be queued again; a finished or running one cannot be resumed twice.
    let out = Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(["resume", &id, "--coordinator", &format!("http://127.0.0.1:{coord_port}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let again = c.resume_job(pb::ResumeJobRequest { job_id: id.clone() }).await.unwrap_err();
    assert!(again.message().contains("only failed or cancelled"), "{}", again.message());
    c.cancel_job(pb::CancelJobRequest { job_id: id.clone() }).await.unwrap();

    // Overrides on the command line: the coordinator keeps and runs the effective job, GetJob
    // answers it, and `comas watch --show-job` prints it before following the job.
    let coordinator = format!("http://127.0.0.1:{coord_port}");
    let comas =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_comas")).args(args).output().unwrap();
    let job_file = d.join("job.toml").display().to_string();
    let overrides = ["schedule.steps=5", "name=e2e-over", "output.dir=out-over"];
    let out = comas(
        &[&["submit", job_file.as_str()][..], &overrides, &["--coordinator", &coordinator]]
            .concat(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let over = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let status = c.get_job(pb::GetJobRequest { job_id: over.clone() }).await.unwrap().into_inner();
    assert_eq!((status.name.as_str(), status.total_steps), ("e2e-over", 5));
    let kept = status.job_toml;
    assert!(kept.contains("steps = 5") && !kept.contains("steps = 3"), "{kept}");
    assert!(kept.contains("dir = \"out-over\""), "{kept}");
    c.cancel_job(pb::CancelJobRequest { job_id: over.clone() }).await.unwrap();
    let out = comas(&["watch", &over, "--show-job", "--json", "--coordinator", &coordinator]);
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(shown.starts_with(&kept), "the effective job first: {shown}");
    assert!(!out.status.success(), "a cancelled job's watch ends in an error");
    // Plain watch and list answers carry no job file.
    let listed = c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs;
    assert!(listed.iter().all(|j| j.job_toml.is_empty()));
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
    let other = pem(
        "other",
        Authority::new("another CA").unwrap().issue(&loopback, Validity::Current).unwrap(),
    );
    let expired = pem("expired", ca.issue(&loopback, Validity::Expired).unwrap());
    let (ca_pem, cert, key) = (
        files.ca.display().to_string(),
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let learner_ports = vec![free_port(), free_port()];
    write_job_of(dir.path(), &learner_ports, 4, false, 2);
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        std::fs::read_to_string(&job)
            .unwrap()
            .replace("\"http://127.0.0.1:", "\"https://127.0.0.1:"),
    )
    .unwrap();
    let service_env = [
        ("COMAS_TLS_CERT", cert.clone()),
        ("COMAS_TLS_KEY", key.clone()),
        ("COMAS_TLS_CA", ca_pem.clone()),
    ];
    let health_port = free_port();
    let health_flag = ["--health-listen".to_string(), format!("127.0.0.1:{health_port}")];
    let cluster = Cluster::launch_env(
        dir.path(),
        learner_ports,
        1,
        &[&health_flag[0], &health_flag[1]],
        2,
        &["--max-episodes", "3"],
        &service_env,
    );
    let url = format!("https://127.0.0.1:{}", cluster.coord_port);
    let comas = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_comas"));
        c.args(args).env("COMAS_THREADS", "1");
        for var in [
            "COMAS_TLS_CERT",
            "COMAS_TLS_KEY",
            "COMAS_TLS_CA",
            "COMAS_TLS_SERVER_NAME",
            "COMAS_TOKEN",
        ] {
            c.env_remove(var);
        }
        c.envs(env.iter().copied()).output().unwrap()
    };
    let good = [
        ("COMAS_TLS_CA", ca_pem.as_str()),
        ("COMAS_TLS_CERT", cert.as_str()),
        ("COMAS_TLS_KEY", key.as_str()),
    ];
    let list =
        |env: &[(&str, &str)], url: &str| comas(&["list", "--json", "--coordinator", url], env);
    let started = Instant::now();
    while !list(&good, &url).status.success() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "coordinator did not start\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let job_arg = job.display().to_string();
    // The kubelet's probe port: plaintext, the health service alone, the same statuses.
    let serving = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{health_port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut c = tonic_health::pb::health_client::HealthClient::new(ch);
        c.check(tonic_health::pb::HealthCheckRequest { service: "comas.v1.Coordinator".into() })
            .await
            .unwrap()
            .into_inner()
            .status
    });
    assert_eq!(serving, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    // The client is told why where it can be (no TLS of its own; TLS 1.3 puts the server's
    // verdict on a client certificate after the client's handshake, so the client may see only
    // a closed connection); the coordinator logs every refusal with its reason.
    let log = || std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    let no_tls = comas(&["submit", &job_arg, "--coordinator", &url], &[]);
    assert!(
        !no_tls.status.success()
            && String::from_utf8_lossy(&no_tls.stderr).contains("no TLS set up: set COMAS_TLS_CA"),
        "{}",
        String::from_utf8_lossy(&no_tls.stderr)
    );
    let plain = format!("http://127.0.0.1:{}", cluster.coord_port);
    let cases: [(&str, &str, Vec<(&str, &str)>, &str); 4] = [
        ("plaintext", &plain, vec![], "corrupt message"),
        (
            "no client certificate",
            &url,
            vec![("COMAS_TLS_CA", ca_pem.as_str())],
            "peer sent no certificates",
        ),
        (
            "another CA's certificate",
            &url,
            vec![
                ("COMAS_TLS_CA", ca_pem.as_str()),
                ("COMAS_TLS_CERT", other.0.as_str()),
                ("COMAS_TLS_KEY", other.1.as_str()),
            ],
            "UnknownIssuer",
        ),
        (
            "an expired certificate",
            &url,
            vec![
                ("COMAS_TLS_CA", ca_pem.as_str()),
                ("COMAS_TLS_CERT", expired.0.as_str()),
                ("COMAS_TLS_KEY", expired.1.as_str()),
            ],
            "certificate expired",
        ),
    ];
    for (what, url, env, want) in &cases {
        let before = log().len();
        let o = comas(&["submit", &job_arg, "--coordinator", url], env);
        assert!(!o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stdout));
        let started = Instant::now();
        while !log()[before..].contains(want) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what}: the coordinator logged no refusal saying {want:?}: {}",
                &log()[before..]
            );
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
    assert_eq!(
        (jobs[0]["state"].as_str(), jobs[0]["steps_done"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{jobs}"
    );
    assert_eq!(
        jobs[0]["agents"][1]["learner"].as_str(),
        Some(format!("https://127.0.0.1:{}", cluster.learner_ports[1]).as_str()),
        "{jobs}"
    );
}

/// `comas local` with its built-in tiny example, as a user runs it (the SmolLM2 example is the
/// same code with a real model; `scripts/demo.sh` runs it).
#[test]
fn comas_local_runs_the_builtin_example() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args([
                "local",
                "--example",
                "tiny",
                "--dir",
                &dir.path().display().to_string(),
                "--json",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "comas local failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Over mutual TLS, with this run's own CA.
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("coordinator https://127.0.0.1:"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("final status as JSON")
    };
    let first = run();
    assert!(
        first["agents"][0]["learner"].as_str().unwrap().starts_with("https://127.0.0.1:"),
        "{first}"
    );
    assert!(std::fs::read_to_string(dir.path().join("tls/ca.pem"))
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    assert_eq!(
        (first["state"].as_str(), first["steps_done"].as_u64(), first["total_steps"].as_u64()),
        (Some("succeeded"), Some(5), Some(5))
    );
    assert_eq!(first["agents"][0]["version"], 5);
    let all: Vec<Value> = std::fs::read_to_string(dir.path().join("example/out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let log: Vec<&Value> = all.iter().filter(|m| m["kind"] == "step").collect();
    assert_eq!(log.len(), 5);
    // Held-out evaluation of 4 questions before training, after steps 2 and 4, and at the end.
    let evals: Vec<(u64, u64)> = all
        .iter()
        .filter(|m| m["kind"] == "eval")
        .map(|m| (m["after_steps"].as_u64().unwrap(), m["episodes"].as_u64().unwrap()))
        .collect();
    assert_eq!(evals, vec![(0, 4), (2, 4), (4, 4), (5, 4)]);
    // The TensorBoard event file beside the log holds exactly the log's records.
    let lines: Vec<String> = std::fs::read_to_string(dir.path().join("example/out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let events = comas_coordinator::tensorboard::path(
        &dir.path().join("example/out"),
        first["job_id"].as_str().unwrap(),
    );
    assert_eq!(
        std::fs::read(&events).unwrap(),
        comas_coordinator::tensorboard::encode(&lines).unwrap()
    );
    // 4 questions x 2 instances; l = 2, R = 2: 2 x 2 = 4 turns per role per episode.
    for m in log {
        assert_eq!(
            (m["episodes"].as_u64(), m["turns"]["scorer"].as_u64(), m["turns"]["solver"].as_u64()),
            (Some(8), Some(32), Some(32)),
            "step {}",
            m["step"]
        );
    }
    // Run again: a fresh job from the base models (not from the first job's checkpoints).
    let second = run();
    assert_ne!(second["job_id"], first["job_id"]);
    assert_eq!(
        (second["state"].as_str(), second["agents"][1]["version"].as_u64()),
        (Some("succeeded"), Some(5))
    );
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
    std::fs::write(
        dir.path().join("outside.jsonl"),
        std::fs::read_to_string(d.join("train.jsonl")).unwrap(),
    )
    .unwrap();
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
        (
            "shadow",
            good.replace("\"train.jsonl\"", "\"/etc/shadow\""),
            "`data.train`: /etc/shadow resolves to /etc/shadow, outside the allowed roots",
        ),
        (
            "dot-dot",
            good.replace("\"train.jsonl\"", "\"../outside.jsonl\""),
            "outside.jsonl goes up through `..`, which is refused",
        ),
        (
            "symlink",
            good.replace("model = \"model-1\"", "model = \"etc/ssl\""),
            "resolves to /etc/ssl, outside the allowed roots",
        ),
        (
            "output through a symlink",
            good.replace("dir = \"out\"", "dir = \"etc/comas-out\""),
            "resolves to /etc/comas-out, outside the allowed roots",
        ),
    ];
    for (name, text, want) in cases {
        let err = c
            .submit_job(pb::SubmitJobRequest {
                job_toml: text,
                base_dir: root.clone(),
                reuse_name: false,
            })
            .await
            .unwrap_err();
        assert!(err.message().contains(want), "{name}: {}", err.message());
    }
    assert!(
        c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs.is_empty(),
        "nothing was stored"
    );
    assert!(!Path::new("/etc/comas-out").exists());
    let id = c
        .submit_job(pb::SubmitJobRequest {
            job_toml: good,
            base_dir: root.clone(),
            reuse_name: false,
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
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
        let o = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args(["token", "new", "--scopes", scopes, "--name", name])
            .output()
            .unwrap();
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
    let mut cluster =
        Cluster::launch(dir.path(), Vec::new(), 0, &["--tokens", tokens.to_str().unwrap()], 1, &[]);
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
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr)
                .contains("ListJobs needs a token: set COMAS_TOKEN"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = list(Some("not-a-token"));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is not one this service knows"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Read-only: may list, may not submit.
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let out = dir.path().join("eval");
    let eval_args: Vec<String> = s(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--setup",
        "vanilla",
        "--bench",
        "arithmetic",
        "--arithmetic-questions",
        "2",
    ])
    .into_iter()
    .chain(s(&[
        "--max-new-tokens",
        "4",
        "--dtype",
        "float32",
        "--coordinator",
        &url,
        "--out",
        out.to_str().unwrap(),
    ]))
    .collect();
    let eval_args: Vec<&str> = eval_args.iter().map(String::as_str).collect();
    let o = comas(&eval_args, Some(&reader));
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr)
                .contains("SubmitJob needs scope `submit`; token `auditor` has read"),
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
    assert_eq!(
        c.list_workers(pb::ListWorkersRequest {}).await.unwrap().into_inner().workers.len(),
        1
    );
    // A token added to the file counts at once, without a restart.
    let (admin, admin_line) = token("admin", "ops");
    assert!(!list(Some(&admin)).status.success());
    std::fs::write(
        &tokens,
        format!("{reader_line}\n{submitter_line}\n{worker_line}\n{admin_line}\n"),
    )
    .unwrap();
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
    let submit = |text: String| pb::SubmitJobRequest {
        job_toml: text,
        base_dir: String::new(),
        reuse_name: false,
    };
    let e = c.submit_job(submit("#".repeat(5 << 20))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{}", e.message());
    assert!(e.message().contains("message length too large"), "{}", e.message());
    let e = c.submit_job(submit("#".repeat(2 << 20))).await.unwrap_err();
    assert!(
        e.code() == tonic::Code::InvalidArgument && e.message().contains("the limit is 1048576"),
        "{}",
        e.message()
    );
    for i in 0..1000 {
        let e = c.submit_job(submit(format!("name = \"bad-{i}\"\n[[[ {i}"))).await.unwrap_err();
        assert!(e.message().contains("not valid TOML"), "{}", e.message());
    }
    assert!(c.list_jobs(pb::ListJobsRequest {}).await.unwrap().into_inner().jobs.is_empty());
    let ch =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", cluster.coord_port))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: "comas.v1.Coordinator".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        health.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let url = format!("http://127.0.0.1:{}", cluster.coord_port);
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/qwen2-f32");
    let out = dir.path().join("after");
    let args = [
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--bench",
        "arithmetic",
        "--arithmetic-questions",
        "2",
        "--max-new-tokens",
        "4",
    ];
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
        let e = c
            .submit_job(pb::SubmitJobRequest {
                job_toml: format!("[[[ {i}"),
                base_dir: String::new(),
                reuse_name: false,
            })
            .await
            .unwrap_err();
        assert!(e.message().contains("not valid TOML"), "{}", e.message());
    }
    let e = c
        .submit_job(pb::SubmitJobRequest {
            job_toml: "[[[".into(),
            base_dir: String::new(),
            reuse_name: false,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{}", e.message());
    assert!(
        e.message().contains("too many SubmitJob calls from 127.0.0.1; retry in 20 s"),
        "{}",
        e.message()
    );
    assert!(c.list_jobs(pb::ListJobsRequest {}).await.is_ok());
}
