//! comas as clients it did not write see it (issue 46 §5): a Python gRPC client generated from
//! `proto/` with PyPI `grpcio-tools`, over the mutual TLS `comas local` uses by default, and the
//! PyPI `openai` package against `comas serve`. Both live in `.venv-clients`
//! (`scripts/setup-clients.sh`, run by `scripts/test.sh`).
mod harness;

use harness::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `script` (under tests/fixtures) run by the clients' Python, its JSON output.
fn python(script: &str, args: &[&str]) -> Value {
    let py = root().join(".venv-clients/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run `bash scripts/setup-clients.sh` (scripts/test.sh does)",
        py.display()
    );
    let out = Command::new(py)
        .arg(root().join("tests/fixtures").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_python_grpc_client_runs_a_job_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let tls = comas_service::tls::Authority::new("clients CA")
        .unwrap()
        .write_local(&dir.path().join("tls"))
        .unwrap();
    let ports = vec![free_port(), free_port()];
    write_job_of(dir.path(), &ports, 4, false, 2);
    let job = dir.path().join("job.toml");
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("\"http://127.0.0.1:", "\"https://127.0.0.1:");
    std::fs::write(&job, &text).unwrap();
    // A job that must be refused, naming what to fix.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, text.replace("questions_per_step = 2", "questions_per_step = 0")).unwrap();
    let (ca, cert, key) = (
        tls.ca.display().to_string(),
        tls.cert.display().to_string(),
        tls.key.display().to_string(),
    );
    let env = [
        ("COMAS_TLS_CERT", cert.clone()),
        ("COMAS_TLS_KEY", key.clone()),
        ("COMAS_TLS_CA", ca.clone()),
    ];
    let c = Cluster::launch_env(dir.path(), ports, 1, &[], 2, &["--max-episodes", "3"], &env);
    c.coordinator_listening().await;
    let target = format!("127.0.0.1:{}", c.coord_port);
    let (job_s, base) = (job.display().to_string(), dir.path().display().to_string());
    let proto = root().join("proto/proto").display().to_string();
    let seen = tokio::task::spawn_blocking(move || {
        python(
            "grpc_client.py",
            &[&proto, &target, &ca, &cert, &key, &job_s, &base, &bad.display().to_string()],
        )
    })
    .await
    .unwrap();

    let serving = serde_json::json!({"(server)": "SERVING", "comas.v1.Coordinator": "SERVING"});
    assert_eq!(seen["health"], serving, "the standard health service: {seen}");
    assert_eq!(seen["bad_job"]["code"], "INVALID_ARGUMENT", "{seen}");
    let why = seen["bad_job"]["details"].as_str().unwrap();
    assert!(why.contains("questions_per_step"), "the refusal names the field: {why}");
    let id = seen["submitted"]["job_id"].as_str().unwrap();
    assert!(id.starts_with("job-"), "{seen}");
    assert!(seen["listed"].as_array().unwrap().iter().any(|j| j == id), "{seen}");
    // The watch stream: the job's steps, one event each, then its end.
    let events: Vec<&str> =
        seen["events"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert_eq!(events.iter().filter(|e| **e == "step").count(), 2, "{events:?}");
    assert_eq!(events.last(), Some(&"finished"), "{events:?}");
    assert_eq!(seen["step_records"], serde_json::json!([0, 1]));
    let done =
        serde_json::json!({"state": "JOB_STATE_SUCCEEDED", "steps_done": 2, "total_steps": 2});
    assert_eq!(seen["last"], done);
    assert_eq!(
        seen["final"],
        serde_json::json!({"state": "JOB_STATE_SUCCEEDED", "steps_done": 2, "name": "e2e"})
    );
    assert_eq!(seen["missing"], "NOT_FOUND");
    assert_eq!(seen["no_client_cert"], "UNAVAILABLE", "a client without a certificate is refused");
    assert_eq!(c.metrics_log().len(), 2);
}

#[test]
fn the_openai_package_gets_from_comas_serve_what_comas_generate_gives() {
    let model = root().join("tests/fixtures/models/qwen2-f32");
    let (mut server, url) = serve(&model, "judge");
    let url = format!("{}/v1", url.trim_end_matches("/v1"));
    let (prompt, seed, max_tokens) = ("What is 12 + 7?", "11", "12");
    let seen = python("openai_client.py", &[&url, "judge", prompt, seed, max_tokens]);
    let port: u16 = url.rsplit(':').next().unwrap().trim_end_matches("/v1").parse().unwrap();
    let served = metrics_text(&("127.0.0.1".to_string(), port));
    assert_eq!(promtool("comas serve", &served), "", "comas serve's /metrics");
    server.sigkill();
    // `comas generate` alone with the same seed, on the prompt as a chat message or as raw text.
    let generate = |how: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_comas"))
            .args(["generate", "--model", model.to_str().unwrap(), how, prompt])
            .args(["--max-new-tokens", max_tokens, "--seed", seed, "--json"])
            .env("COMAS_THREADS", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let alone = generate("--chat");

    assert_eq!(seen["models"], serde_json::json!(["judge"]));
    let r = &seen["reply"];
    assert_eq!(
        (r["object"].as_str(), r["model"].as_str(), r["role"].as_str()),
        (Some("chat.completion"), Some("judge"), Some("assistant"))
    );
    assert_eq!(
        r["content"], alone["text"],
        "the package's reply against `comas generate` with the same seed"
    );
    let generated = alone["generated_ids"].as_array().unwrap().len() as u64;
    assert_eq!(r["completion_tokens"].as_u64(), Some(generated));
    assert_eq!(r["total_tokens"].as_u64(), Some(r["prompt_tokens"].as_u64().unwrap() + generated));
    let finish = r["finish_reason"].as_str().unwrap();
    assert_eq!(finish, if generated == 12 { "length" } else { "stop" });
    // Asked again with the prompt as a text part and log-probabilities: the same answer, and
    // each token's log-probability and bytes as `comas generate` has them.
    let again = &seen["with_logprobs"];
    assert_eq!(again["content"], r["content"]);
    let got: Vec<f32> =
        again["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let want: Vec<f32> =
        alone["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert_eq!(got, want);
    assert!(again["top_logprobs"].as_array().unwrap().iter().all(|n| n == 0));
    let bytes: Vec<u8> =
        again["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
    assert!(String::from_utf8_lossy(&bytes).starts_with(r["content"].as_str().unwrap()));
    // Streamed: the same text and log-probabilities in several chunks, one finish reason, and
    // the usage in the last chunk.
    let streamed = &seen["streamed"];
    assert_eq!(streamed["role"], "assistant");
    assert_eq!(streamed["content"], r["content"]);
    assert_eq!(streamed["logprobs"], again["logprobs"]);
    assert_eq!(streamed["finish_reasons"], serde_json::json!([finish]));
    assert!(streamed["chunks"].as_u64().unwrap() > 3, "{streamed}");
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(streamed["usage"][k], r[k], "{k}");
    }
    // A text completion of the prompt as raw text, against `comas generate --prompt`.
    let raw = generate("--prompt");
    let done = &seen["completion"];
    assert_eq!(done["object"], "text_completion");
    assert_eq!((&done["text"], &done["streamed"]), (&raw["text"], &raw["text"]));
    let got: Vec<f32> =
        done["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let want: Vec<f32> =
        raw["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert_eq!(got, want);
    assert_eq!(done["completion_tokens"].as_u64(), Some(want.len() as u64));
    for (name, says) in [
        ("negative_temperature", "temperature"),
        ("stream_options", "stream_options is only for streamed answers"),
        ("presence_penalty", "presence_penalty = 0.5 is not supported here"),
    ] {
        let refused = &seen["refused"][name];
        assert_eq!(refused["status"], 400, "{name}: {refused}");
        assert!(refused["message"].as_str().unwrap().contains(says), "{name}: {refused}");
    }
}

/// `promtool check metrics` (Debian's, unpacked by `scripts/setup-promtool.sh`) on `text`:
/// its complaints, empty when it has none.
fn promtool(what: &str, text: &str) -> String {
    use std::io::Write;
    let bin = root().join(".cache/promtool/promtool");
    assert!(
        bin.exists(),
        "{} is missing: run `bash scripts/setup-promtool.sh` (scripts/test.sh does)",
        bin.display()
    );
    let mut child = Command::new(bin)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() || !said.is_empty(), "{what}: promtool failed silently");
    said.trim().to_string()
}

/// The body of `GET /metrics` at `at`.
fn metrics_text(at: &(String, u16)) -> String {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect((at.0.as_str(), at.1)).unwrap();
    write!(sock, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    sock.read_to_string(&mut body).unwrap();
    let (head, body) = body.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_services_metrics_pass_promtool_after_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let ports = vec![free_port(), free_port()];
    write_job_of(dir.path(), &ports, 4, true, 2);
    let mut c = Cluster::unstarted(dir.path(), ports, 2, &[], &["--max-episodes", "3"]);
    let learner_metrics: Vec<(String, u16)> =
        (0..2).map(|_| ("127.0.0.1".to_string(), free_port())).collect();
    c.learner_flags = learner_metrics
        .iter()
        .map(|(h, p)| vec!["--metrics-listen".to_string(), format!("{h}:{p}")])
        .collect();
    let mut c = c.start(0);
    let worker = c.add_worker_with_metrics(&[]);
    let id = c.submit().await;
    c.finished(&id).await;
    let mut services = vec![
        ("coordinator".to_string(), ("127.0.0.1".to_string(), c.metrics_port)),
        ("worker".into(), worker),
    ];
    for (k, at) in learner_metrics.into_iter().enumerate() {
        services.push((format!("learner {k}"), at));
    }
    for (name, at) in &services {
        let text = metrics_text(at);
        assert!(text.contains("# TYPE"), "{name}: {text}");
        assert_eq!(promtool(name, &text), "", "{name}'s /metrics");
    }
    // The test can fail: promtool does complain of a counter without `_total`.
    let bad = "# HELP x_seconds a counter\n# TYPE x_seconds counter\nx_seconds 1\n";
    assert!(
        promtool("a bad exposition", bad).contains("counter"),
        "promtool said nothing of {bad:?}"
    );
}
