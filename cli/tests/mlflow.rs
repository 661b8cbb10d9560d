//! `[tracking] mlflow`: a job logs to a real MLflow tracking server (PyPI `mlflow`, started by
//! the test from `.venv-clients`, which `scripts/setup-clients.sh` installs) and is read back
//! with MLflow's own Python client; a server that is away neither fails nor holds the job.
mod harness;

use harness::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn venv_bin(name: &str) -> PathBuf {
    let p = root().join(".venv-clients/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/setup-clients.sh` (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A real `mlflow server` with its own store and artifact folder under `dir`.
struct MlflowServer {
    url: String,
    proc: Proc,
}

impl MlflowServer {
    fn start(dir: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let log = std::fs::File::create(dir.join("mlflow.log")).unwrap();
        let mut cmd = Command::new(venv_bin("mlflow"));
        cmd.args(["server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(dir.join("mlartifacts"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // Its own process group: the server forks uvicorn and job consumers, which a kill of
        // the server alone would leave running (hundreds of MB each); Drop kills the group.
        cmd.process_group(0);
        // SAFETY: prctl(2) in the child before exec: the server dies with the test.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let proc = Proc { name: "mlflow".into(), child: cmd.spawn().unwrap() };
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while !Self::healthy(port) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "mlflow server did not come up: {}",
                std::fs::read_to_string(dir.join("mlflow.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        MlflowServer { url, proc }
    }

    fn healthy(port: u16) -> bool {
        use std::io::{Read, Write};
        let Ok(mut sock) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = write!(sock, "GET /health HTTP/1.0\r\nHost: x\r\n\r\n");
        let mut body = String::new();
        let _ = sock.read_to_string(&mut body);
        body.starts_with("HTTP/1.1 200") || body.starts_with("HTTP/1.0 200")
    }

    /// The experiment as MLflow's Python client reads it.
    fn read(&self, experiment: &str) -> Value {
        let out = Command::new(venv_bin("python"))
            .arg(root().join("tests/fixtures/read_mlflow.py"))
            .args([&self.url, experiment])
            .output()
            .unwrap();
        assert!(out.status.success(), "read_mlflow.py: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group the server leads (its pid is the group's id).
        unsafe {
            libc::kill(-(self.proc.child.id() as i32), libc::SIGKILL);
        }
    }
}

fn add_tracking(dir: &Path, table: &str) {
    let path = dir.join("job.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("\n[tracking]\n{table}"));
    std::fs::write(path, text).unwrap();
}

/// (step, value) of every finite number at the top of a record, or in one of its objects.
fn numbers(record: &Value, prefix: &str) -> BTreeMap<String, f64> {
    let skip = ["step", "after_steps", "unix_time"];
    let mut out = BTreeMap::new();
    for (k, v) in record.as_object().unwrap() {
        if skip.contains(&k.as_str()) {
            continue;
        }
        match v {
            Value::Number(n) => {
                out.insert(format!("{prefix}{k}"), n.as_f64().unwrap());
            }
            Value::Object(o) if k == "seconds" => {
                for (k2, v2) in o {
                    if let Some(x) = v2.as_f64() {
                        out.insert(format!("{prefix}{k}/{k2}"), x);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_logs_its_run_to_a_real_mlflow_server_and_a_restarted_coordinator_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = MlflowServer::start(dir.path());
    let mut c = Cluster::with_flags(dir.path(), 1, 24, &[], true);
    add_tracking(dir.path(), &format!("mlflow = \"{}\"\nexperiment = \"e2e runs\"\n", server.url));
    let id = c.submit().await;
    // Killed inside step 1's rollout: step 0 and the evaluation before it were sent already.
    c.on_event(&id, 120, "step 1's first episodes", |s| {
        s.steps_done == 1 && s.stage == "rollout" && s.episodes_done >= 1
    })
    .await;
    c.coordinator.as_mut().unwrap().sigkill();
    c.start_coordinator();
    c.finished(&id).await;
    c.check_complete_run().await;

    let read = server.read("e2e runs");
    let runs = read["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "one run for the job, continued after the restart: {read}");
    let run = &runs[0];
    assert_eq!(run["status"], "FINISHED");
    assert!(run["end_time"].as_i64().unwrap() > 0);
    assert_eq!(run["tags"]["comas.job_id"], id.as_str());
    assert_eq!(run["name"], format!("e2e ({id})"));
    // The job file as parameters (dotted paths) and as an artifact.
    let params = &run["params"];
    assert_eq!(
        (params["name"].as_str(), params["schedule.steps"].as_str()),
        (Some("e2e"), Some("3"))
    );
    assert_eq!(params["comas.num_rounds"], "2");
    assert_eq!(params["agents.1.train.lr"], "0.0001");
    assert_eq!(params["tracking.experiment"], "e2e runs");
    assert!(run["artifacts"]["job.toml"].as_str().unwrap().contains("[tracking]"));
    let log_text = std::fs::read_to_string(dir.path().join("out/metrics.jsonl")).unwrap();
    assert_eq!(run["artifacts"]["metrics.jsonl"].as_str(), Some(log_text.as_str()));
    // The figure: byte for byte what `comas plot` draws of the same log.
    let figure = dir.path().join("figure.png");
    let plotted = Command::new(env!("CARGO_BIN_EXE_comas"))
        .arg("plot")
        .arg(dir.path().join("out/metrics.jsonl"))
        .arg("-o")
        .arg(&figure)
        .output()
        .unwrap();
    assert!(plotted.status.success(), "{}", String::from_utf8_lossy(&plotted.stderr));
    let artifacts = run["artifacts"].as_object().unwrap();
    let hex = artifacts["plot.png"]["hex"].as_str().unwrap_or_else(|| {
        panic!("no plot.png artifact among {:?}", artifacts.keys().collect::<Vec<_>>())
    });
    let png: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "plot.png is not a PNG");
    assert!(png == std::fs::read(&figure).unwrap(), "plot.png differs from `comas plot`'s figure");

    // Every number of every record, at the record's step and time, exactly once.
    let metrics = run["metrics"].as_object().unwrap();
    let mut expected: BTreeMap<String, Vec<(i64, f64, i64)>> = BTreeMap::new();
    let (steps, evals) = (c.log_of("step"), c.log_of("eval"));
    assert_eq!((steps.len(), evals.len()), (3, 3), "evaluations after 0, 2 and 3 steps");
    for (records, prefix, at) in [(&steps, "", "step"), (&evals, "eval/", "after_steps")] {
        for r in records {
            let ms = (r["unix_time"].as_f64().unwrap() * 1000.0).round() as i64;
            for (k, v) in numbers(r, prefix) {
                expected.entry(k).or_default().push((r[at].as_i64().unwrap(), v, ms));
            }
        }
    }
    assert!(expected.len() > 10, "{expected:?}");
    for (key, want) in &expected {
        let got: Vec<(i64, f64, i64)> = metrics
            .get(key)
            .unwrap_or_else(|| panic!("MLflow has no metric {key}; it has {:?}", metrics.keys()))
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m[0].as_i64().unwrap(), m[1].as_f64().unwrap(), m[2].as_i64().unwrap()))
            .collect();
        assert_eq!(&got, want, "{key}: MLflow's history against metrics.jsonl");
    }
    // And every TensorBoard scalar of the log, under its MLflow name: the two trackers agree.
    let mut scalars = 0;
    for line in log_text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let Some(s) = comas_coordinator::tensorboard::scalars_of(&v) else { continue };
        for (tag, value) in s.values {
            let name = comas_coordinator::mlflow::metric_name(&tag);
            let history = metrics.get(&name).unwrap_or_else(|| panic!("no metric {name}"));
            let at: Vec<f64> = history
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m[0].as_i64() == Some(s.step))
                .map(|m| m[1].as_f64().unwrap())
                .collect();
            assert_eq!(at, [value], "{name} at step {}", s.step);
            scalars += 1;
        }
    }
    assert!(scalars > 100, "{scalars}");
    // Nothing logged twice across the restart, under any key.
    for (key, history) in metrics {
        let steps: Vec<i64> =
            history.as_array().unwrap().iter().map(|m| m[0].as_i64().unwrap()).collect();
        let unique: BTreeSet<i64> = steps.iter().copied().collect();
        assert_eq!(steps.len(), unique.len(), "{key} logged twice at a step: {steps:?}");
    }
    assert_eq!(c.prometheus("comas_coordinator_tracking_dropped_metrics_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracking_server_that_is_away_neither_fails_nor_holds_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::with_flags(dir.path(), 1, 24, &[], false);
    // A port nothing listens on.
    add_tracking(dir.path(), &format!("mlflow = \"http://127.0.0.1:{}\"\n", free_port()));
    let id = c.submit().await;
    c.finished(&id).await;
    c.check_complete_run().await;
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    assert!(log.contains("the MLflow server did not answer; retrying"), "{log}");
    // What it held is given up, counted and said, once the job's end has waited its bound.
    let started = Instant::now();
    while c.prometheus("comas_coordinator_tracking_dropped_metrics_total") == 0.0 {
        assert!(started.elapsed() < Duration::from_secs(60), "no dropped metrics counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap();
    assert!(log.contains("MLflow metrics dropped"), "{log}");
}
