//! The `comas` binary as a user runs it: greedy generation and scoring agree with the
//! `transformers` reference, and bad input exits non-zero with a message.
mod harness;

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn comas(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_comas"))
        .args(args)
        .env("COMAS_THREADS", "1")
        .output()
        .expect("comas runs")
}

fn reference(name: &str) -> (serde_json::Value, comas_model::safetensors::SafeTensorsFile) {
    let dir = fixtures().join("reference");
    let json =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    (
        json,
        comas_model::safetensors::SafeTensorsFile::open(&dir.join(format!("{name}.safetensors")))
            .unwrap(),
    )
}

fn ok_json(out: Output) -> serde_json::Value {
    assert!(out.status.success(), "comas failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

#[test]
fn generate_json_matches_transformers_greedy() {
    let (r, t) = reference("llama3-gqa");
    let model = fixtures().join("models/llama3-gqa");
    let prompt = r["prompts"][0]["text"].as_str().unwrap();
    let out = ok_json(comas(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        prompt,
        "--greedy",
        "--ignore-eos",
        "--max-new-tokens",
        "32",
        "--json",
    ]));
    assert_eq!(out["prompt_ids"], r["prompts"][0]["ids"]);
    let want = Vec::<i64>::try_from(&t.tensor("greedy_0").unwrap()).unwrap();
    let got: Vec<i64> =
        out["generated_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(got, want);
    assert_eq!(out["finish_reason"], "length");
    let want_lp = Vec::<f32>::try_from(&t.tensor("logprobs_greedy_0").unwrap()).unwrap();
    for (a, b) in out["logprobs"].as_array().unwrap().iter().zip(&want_lp) {
        assert!((a.as_f64().unwrap() - *b as f64).abs() < 1e-5);
    }
}

#[test]
fn chat_prompt_uses_the_template() {
    let (r, _) = reference("qwen2-f32");
    let model = fixtures().join("models/qwen2-f32");
    let out = ok_json(comas(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--chat",
        "What is 12 + 7?",
        "--max-new-tokens",
        "4",
        "--seed",
        "3",
        "--json",
    ]));
    assert_eq!(out["prompt_ids"], r["prompts"][2]["ids"]);
    assert!(out["generated_ids"].as_array().unwrap().len() <= 4);
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let model = fixtures().join("models/qwen3");
    let run = |seed: &str| {
        ok_json(comas(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "The river",
            "--temperature",
            "1.0",
            "--top-p",
            "0.95",
            "--max-new-tokens",
            "16",
            "--ignore-eos",
            "--seed",
            seed,
            "--json",
        ]))["generated_ids"]
            .clone()
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(run("7"), run("8"));
}

#[test]
fn score_matches_generation_logprobs() {
    let (r, t) = reference("qwen2-f32");
    let model = fixtures().join("models/qwen2-f32");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let mut lines = String::new();
    for i in 0..3 {
        let greedy = Vec::<i64>::try_from(&t.tensor(&format!("greedy_{i}")).unwrap()).unwrap();
        lines += &serde_json::json!({"id": i, "prompt_ids": r["prompts"][i]["ids"], "completion_ids": greedy}).to_string();
        lines.push('\n');
    }
    std::fs::write(&input, lines).unwrap();
    let output = dir.path().join("out.jsonl");
    let out = comas(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--batch-size",
        "2",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&output).unwrap();
    let recs: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 3);
    for (i, rec) in recs.iter().enumerate() {
        assert_eq!(rec["id"], i);
        let want =
            Vec::<f32>::try_from(&t.tensor(&format!("logprobs_greedy_{i}")).unwrap()).unwrap();
        let got = rec["logprobs"].as_array().unwrap();
        assert_eq!(got.len(), 32);
        for (a, b) in got.iter().zip(&want) {
            assert!((a.as_f64().unwrap() - *b as f64).abs() < 1e-5, "record {i}");
        }
    }
}

#[test]
fn bad_input_exits_with_a_clear_message() {
    let model = fixtures().join("models/qwen2-f32");
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "generate".into(),
                "--model".into(),
                "/nonexistent".into(),
                "--prompt".into(),
                "hi".into(),
            ],
            "/nonexistent/config.json",
        ),
        (
            vec![
                "generate".into(),
                "--model".into(),
                m.into(),
                "--prompt".into(),
                "hi".into(),
                "--top-p".into(),
                "0".into(),
            ],
            "top_p",
        ),
        (
            vec![
                "generate".into(),
                "--model".into(),
                m.into(),
                "--prompt".into(),
                "hi".into(),
                "--device".into(),
                "cuda:3".into(),
            ],
            "cuda:3",
        ),
        (
            vec![
                "tiny-model".into(),
                "--out".into(),
                dir.path().join("x").to_str().unwrap().into(),
                "--arch".into(),
                "gpt2".into(),
            ],
            "gpt2",
        ),
        (
            vec![
                "generate".into(),
                "--model".into(),
                m.into(),
                "--prompt".into(),
                "hi".into(),
                "--max-new-tokens".into(),
                "1000000000".into(),
            ],
            "max_new_tokens 1000000000 exceed the model's context",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = comas(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let input = dir.path().join("bad.jsonl");
    std::fs::write(&input, "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"\n")
        .unwrap();
    let out = comas(&["score", "--model", m, "--input", input.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
    assert!(out.stdout.is_empty(), "no partial output on bad input");
    std::fs::write(&input, "{\"prompt_ids\": [1], \"completion_ids\": [9999]}\n").unwrap();
    let out = comas(&["score", "--model", m, "--input", input.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("9999"));
    // A record longer than the context is refused by line, before any allocation for it.
    let ctx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let ctx = ctx["max_position_embeddings"].as_u64().unwrap() as usize;
    let ids: Vec<String> = (0..ctx).map(|i| (1 + i % 50).to_string()).collect();
    std::fs::write(&input, format!("{{\"prompt\": \"a\", \"completion\": \"b\"}}\n{{\"prompt_ids\": [1], \"completion_ids\": [{}]}}\n", ids.join(",")))
        .unwrap();
    let out = comas(&["score", "--model", m, "--input", input.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(&format!(
                "line 2: prompt and completion are {} tokens, over the model's context of {ctx}",
                ctx + 1
            )),
        "{err}"
    );
    // Bytes that are not UTF-8 are named by line.
    std::fs::write(&input, b"{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"\xff\"}\n")
        .unwrap();
    let out = comas(&["score", "--model", m, "--input", input.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2: is it UTF-8 text?"), "{err}");
}

#[test]
fn tiny_model_builds_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("tiny");
    let o = comas(&[
        "tiny-model",
        "--out",
        out_dir.to_str().unwrap(),
        "--arch",
        "llama",
        "--seed",
        "4",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = ok_json(comas(&[
        "generate",
        "--model",
        out_dir.to_str().unwrap(),
        "--chat",
        "hi",
        "--max-new-tokens",
        "5",
        "--ignore-eos",
        "--json",
    ]));
    assert_eq!(out["generated_ids"].as_array().unwrap().len(), 5);
}

/// Copies a fixture model folder so a test can break one of its files.
fn copy_model(name: &str, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(fixtures().join("models").join(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A `tokenizer.json` that is JSON but not a tokenizer, or not JSON at all, is named as such;
/// a chat template that does not compile names its file and breaks only chat prompts: raw
/// prompts still generate and score.
#[test]
fn broken_tokenizer_files_are_named_and_a_broken_template_breaks_only_chat() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    copy_model("qwen2-f32", &model);
    let m = model.to_str().unwrap();
    let tok = model.join("tokenizer.json");
    let good = std::fs::read_to_string(&tok).unwrap();
    for (text, needle) in [
        ("{\"vocab\": [1, 2]}", "is JSON but not a tokenizer"),
        ("{\"model\": {\"type\": \"BPE\"", "is not valid JSON"),
    ] {
        std::fs::write(&tok, text).unwrap();
        let out = comas(&["generate", "--model", m, "--prompt", "hi", "--max-new-tokens", "2"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(needle) && err.contains(tok.to_str().unwrap()),
            "{err}"
        );
    }
    std::fs::write(&tok, good).unwrap();
    let jinja = model.join("chat_template.jinja");
    std::fs::write(&jinja, "{% for m in messages %}{{ m.content }").unwrap();
    let out = comas(&["generate", "--model", m, "--chat", "hi", "--max-new-tokens", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("{} does not compile", jinja.display())),
        "{err}"
    );
    let out = ok_json(comas(&[
        "generate",
        "--model",
        m,
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
        "--ignore-eos",
        "--json",
    ]));
    assert_eq!(out["generated_ids"].as_array().unwrap().len(), 2);
    let input = dir.path().join("score.jsonl");
    std::fs::write(&input, "{\"prompt\": \"a\", \"completion\": \"b\"}\n").unwrap();
    let out = comas(&["score", "--model", m, "--input", input.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

/// `comas serve` as a client sees it: concurrent requests, batched together, get exactly what
/// `comas generate` gives each alone; bad requests get a 4xx that says why; SIGTERM ends it.
#[test]
fn serve_answers_chat_completions_as_generate_does() {
    use comas_service::openai::{CallError, ChatRequest, Endpoint, Message, Sampling};
    let model = fixtures().join("models/qwen2-f32");
    let (mut server, url) = harness::serve(&model, "judge");
    let url = url.as_str();
    let endpoint = Endpoint::parse(url, None).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ask = |content: &str, seed: u64, max_tokens: u32| ChatRequest {
        model: "judge".into(),
        messages: vec![Message { role: "user".into(), content: content.into() }],
        sampling: Sampling {
            temperature: Some(1.0),
            max_tokens: Some(max_tokens),
            seed: Some(seed),
            ..Default::default()
        },
        ..Default::default()
    };
    let call = |r: ChatRequest| {
        let e = endpoint.clone();
        async move { e.chat(&r, std::time::Duration::from_secs(60)).await }
    };
    let questions = ["What is 12 + 7?", "Name a prime.", "Say hi.", "Count to three."];
    // All four in flight at once: the server batches them.
    let replies = rt.block_on(async {
        let calls: Vec<_> = questions
            .iter()
            .enumerate()
            .map(|(i, q)| tokio::spawn(call(ask(q, 10 + i as u64, 12))))
            .collect();
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.unwrap());
        }
        out
    });
    for (i, (q, r)) in questions.iter().zip(replies).enumerate() {
        let r = r.unwrap();
        let alone = generate_alone(&model, q, 12, 10 + i as u64);
        assert_eq!(r.choices[0].message.content, alone["text"].as_str().unwrap(), "question {i}");
        let usage = r.usage.unwrap();
        assert_eq!(
            (usage.prompt_tokens, usage.completion_tokens),
            (
                alone["prompt_ids"].as_array().unwrap().len() as u64,
                alone["generated_ids"].as_array().unwrap().len() as u64
            )
        );
        assert_eq!(
            r.choices[0].finish_reason.as_deref(),
            Some(if alone["finish_reason"] == "length" { "length" } else { "stop" })
        );
        assert_eq!(r.model, "judge");
    }
    let refused = |r: ChatRequest| match rt.block_on(call(r)) {
        Err(CallError::Status { code, message }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let mut none = ask("a", 1, 4);
    none.sampling.n = Some(0);
    let (code, message) = refused(none);
    assert_eq!((code, message.as_str()), (400, "n = 0: a request asks for 1 to 128 choices"));
    let (code, message) = refused(ask("a", 1, 100_000));
    assert!(
        code == 400 && message.contains("shorten the messages or lower max_tokens"),
        "{code} {message}"
    );
    let (code, message) = refused(ChatRequest { model: "other".into(), ..ask("a", 1, 4) });
    assert!(code == 404 && message.contains("this server serves \"judge\""), "{code} {message}");
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    assert!(server.child.wait().unwrap().success(), "SIGTERM ends the server cleanly");
}

/// What `comas generate` answers `question` alone (chat template, seeded), as JSON: what a
/// server's reply with the same seed is held to.
fn generate_alone(
    model: &std::path::Path,
    question: &str,
    max_new: u32,
    seed: u64,
) -> serde_json::Value {
    generate_json(model, "--chat", question, max_new, seed)
}

/// `comas generate --json` on `text` given as `how` (`--chat` or `--prompt`), seeded.
fn generate_json(
    model: &std::path::Path,
    how: &str,
    text: &str,
    max_new: u32,
    seed: u64,
) -> serde_json::Value {
    ok_json(comas(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        how,
        text,
        "--max-new-tokens",
        &max_new.to_string(),
        "--seed",
        &seed.to_string(),
        "--json",
    ]))
}

/// `host:port` of a `comas serve` URL (`http://host:port/v1`).
fn authority(url: &str) -> &str {
    url.trim_start_matches("http://").trim_end_matches("/v1")
}

/// A raw HTTP/1.0 exchange with `comas serve` at `url`: the status code and the body of the
/// answer to `method path` with `body`.
fn http(url: &str, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
    http_with(url, method, path, "", body)
}

/// [`http`] with more header lines (`headers`: each ending in `\r\n`).
fn http_with(
    url: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut sock = std::net::TcpStream::connect(authority(url)).unwrap();
    write!(
        sock,
        "{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    )
    .unwrap();
    // A body over the server's limit is refused before it is read whole: the write may fail.
    let _ = sock.write_all(body);
    let mut answer = Vec::new();
    sock.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer);
    let (head, json) = text.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, serde_json::from_str(json).unwrap_or(serde_json::Value::Null))
}

/// `comas serve` beyond plain answers: each token's log-probability when asked (the same as
/// `comas generate` gives), text content parts, an OpenAI-shaped refusal of every field it would
/// otherwise ignore and of every route it lacks, and a request whose client hung up taken out
/// of the batch (counted as cancelled) rather than generated to its end.
#[test]
fn serve_gives_logprobs_refuses_what_it_would_ignore_and_drops_abandoned_requests() {
    use serde_json::json;
    let model = fixtures().join("models/qwen2-f32");
    let (mut server, url) = harness::serve(&model, "judge");
    let ask = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 6, "seed": 3, "temperature": 1.0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        http(&url, "POST", "/v1/chat/completions", body.to_string().as_bytes())
    };

    let (code, r) = ask(json!({"logprobs": true}));
    assert_eq!(code, 200, "{r}");
    let alone = generate_alone(&model, "Say hi.", 6, 3);
    let tokens = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    let want = alone["logprobs"].as_array().unwrap();
    assert_eq!(tokens.len(), want.len());
    for (t, w) in tokens.iter().zip(want) {
        assert_eq!(t["logprob"].as_f64().unwrap() as f32, w.as_f64().unwrap() as f32);
        assert_eq!(t["top_logprobs"], json!([]));
    }
    let bytes: Vec<u8> = tokens
        .iter()
        .flat_map(|t| t["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
        .collect();
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(String::from_utf8_lossy(&bytes).starts_with(text), "{bytes:?} against {text:?}");
    assert_eq!(ask(json!({})).1["choices"][0]["logprobs"], serde_json::Value::Null);

    // Text parts are one message's text, joined by newlines.
    let parts = json!({"messages": [{"role": "user",
        "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi."}]}]});
    let joined = json!({"messages": [{"role": "user", "content": "Say\nhi."}]});
    assert_eq!(ask(parts).1["choices"], ask(joined).1["choices"]);

    let refusals = [
        (json!({"presence_penalty": 0.5}), 400, "presence_penalty = 0.5 is not supported here"),
        (json!({"logit_bias": {"5": 10}}), 400, "logit_bias = {\"5\":10} is not supported"),
        (json!({"response_format": {"type": "json_object"}}), 400, "response_format = "),
        (json!({"logprobs": true, "top_logprobs": 2}), 400, "top_logprobs = 2 is not supported"),
        (json!({"max_tokens": 0}), 400, "max_tokens must be at least 1"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            "content parts of type `image_url` are not supported: only text",
        ),
    ];
    for (extra, status, says) in refusals {
        let (code, r) = ask(extra.clone());
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(code == status && message.contains(says), "{extra}: {code} {r}");
    }
    // Fields at values that leave the answer as it is are accepted.
    let (code, _) = ask(json!({"presence_penalty": 0, "tools": [], "tool_choice": "none",
        "response_format": {"type": "text"}, "user": "someone"}));
    assert_eq!(code, 200);
    for (method, path, status) in
        [("GET", "/v1/chat/completions", 405), ("POST", "/v1/embeddings", 404)]
    {
        let (code, r) = http(&url, method, path, b"{}");
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            code == status && message.contains("this server answers POST /v1/chat/completions")
        );
    }
    let (code, r) = http(&url, "POST", "/v1/chat/completions", &vec![b' '; 5 << 20]);
    assert!(code == 413 && r["error"]["message"].as_str().unwrap().contains("the limit is 4 MiB"));

    // A client that hangs up while its request runs: hyper drops the handler when the
    // connection closes, and the model thread takes the request out of the batch. The server is
    // stopped (SIGSTOP) between seeing the request run and the hang-up, so that the request
    // cannot finish in between however fast the machine; should it still have finished before
    // it was seen running, the test tries again.
    let port: u16 = authority(&url).rsplit(':').next().unwrap().parse().unwrap();
    let at = ("127.0.0.1".to_string(), port);
    let count = |outcome: &str| {
        harness::try_scrape(&at, &format!("comas_serve_requests_total{{outcome=\"{outcome}\"}}"))
            .unwrap_or(0.0)
    };
    let pid = server.child.id() as i32;
    let mut hung_up = false;
    for _ in 0..5 {
        use std::io::Write;
        let answered = count("answered");
        let body = json!({"messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": 180, "min_tokens": 180})
        .to_string();
        let mut sock = std::net::TcpStream::connect(authority(&url)).unwrap();
        write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let running = || harness::try_scrape(&at, "comas_serve_running_sequences");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let refused = count("refused");
        while running() != Some(1.0) && count("answered") == answered {
            assert!(count("refused") == refused, "the long request was refused");
            assert!(std::time::Instant::now() < deadline, "the request never ran");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        drop(sock);
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while count("cancelled") == 0.0 && count("answered") == answered {
            assert!(std::time::Instant::now() < deadline, "the request neither ended nor left");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if count("cancelled") == 1.0 {
            assert_eq!(count("answered"), answered, "the abandoned request was not answered");
            hung_up = true;
            break;
        }
    }
    assert!(hung_up, "every try finished before its client could hang up");
    assert_eq!(harness::scrape(&at, "comas_serve_running_sequences"), 0.0);
    assert_eq!(ask(json!({})).0, 200, "the server goes on");
    server.sigkill();
}

/// A streamed chat request to `comas serve` at `url` over raw HTTP/1.0: the status, and the
/// events' data (JSON chunks, `"[DONE]"` as a string) or, when refused, the error body alone.
fn stream(url: &str, body: &serde_json::Value) -> (u16, Vec<serde_json::Value>) {
    stream_to(url, "/v1/chat/completions", body)
}

/// [`stream`] to any path.
fn stream_to(url: &str, path: &str, body: &serde_json::Value) -> (u16, Vec<serde_json::Value>) {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut sock = std::net::TcpStream::connect(authority(url)).unwrap();
    write!(sock, "POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    sock.read_to_string(&mut answer).unwrap();
    let (head, rest) = answer.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    if code != 200 {
        return (code, vec![serde_json::from_str(rest).unwrap()]);
    }
    assert!(head.to_lowercase().contains("content-type: text/event-stream"), "{head}");
    let events = rest
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data =
                e.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data event: {e:?}"));
            serde_json::from_str(data).unwrap_or_else(|_| serde_json::Value::from(data))
        })
        .collect();
    (code, events)
}

/// The text, token log-probabilities and finish reasons of a stream's chunks, in order.
fn joined(events: &[serde_json::Value]) -> (String, Vec<f64>, Vec<String>) {
    let (mut text, mut logprobs, mut finish) = (String::new(), Vec::new(), Vec::new());
    for c in events.iter().filter_map(|e| e["choices"].get(0)) {
        text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        for t in c["logprobs"]["content"].as_array().into_iter().flatten() {
            logprobs.push(t["logprob"].as_f64().unwrap());
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish.push(f.to_string());
        }
    }
    (text, logprobs, finish)
}

/// `stream = true` gives the answer `stream = false` gives, in pieces: the same text (with a
/// stop string cut where the whole answer cuts it, though the stream had to send text before
/// knowing), the same log-probabilities and usage, one role chunk first and `[DONE]` last.
/// Refusals come as plain errors before any event; a stream whose client leaves is dropped.
#[test]
fn serve_streams_the_answer_it_gives_whole_and_drops_a_stream_whose_client_left() {
    use serde_json::json;
    let model = fixtures().join("models/qwen2-f32");
    let (mut server, url) = harness::serve(&model, "judge");
    let ask = |seed: u64, extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 60, "seed": seed, "temperature": 1.0, "logprobs": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let mut stops_tried = 0;
    for seed in 1..=8 {
        let (code, whole) =
            http(&url, "POST", "/v1/chat/completions", ask(seed, json!({})).to_string().as_bytes());
        assert_eq!(code, 200, "{whole}");
        let (code, events) = stream(
            &url,
            &ask(seed, json!({"stream": true, "stream_options": {"include_usage": true}})),
        );
        assert_eq!(code, 200, "{events:?}");
        let w = &whole["choices"][0];
        let (text, logprobs, finish) = joined(&events);
        assert_eq!(text, w["message"]["content"].as_str().unwrap(), "seed {seed}");
        let want: Vec<f64> = w["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap())
            .collect();
        assert_eq!(logprobs, want, "seed {seed}");
        assert_eq!(finish, vec![w["finish_reason"].as_str().unwrap().to_string()]);
        assert_eq!(events[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert!(events.len() > 4, "seed {seed}: the answer came in {} events", events.len());
        let n = events.len();
        assert_eq!(events[n - 1], json!("[DONE]"));
        assert_eq!(
            (&events[n - 2]["choices"], &events[n - 2]["usage"]),
            (&json!([]), &whole["usage"])
        );
        let ids: std::collections::BTreeSet<&str> =
            events[..n - 1].iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), 1, "one id for every chunk");
        assert!(events[..n - 1].iter().all(|e| e["object"] == "chat.completion.chunk"));

        // A stop string across two tokens from the middle of this answer: the last character
        // of one and the first of the next (ASCII letters or digits, so that no split character
        // decodes differently where the batcher looks for it). The stream has sent the first
        // token's text by the time the second comes, unless it held the letter back.
        let content = w["message"]["content"].as_str().unwrap();
        let bytes: Vec<Vec<u8>> = w["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                t["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect()
            })
            .collect();
        let across = (bytes.len() / 3..bytes.len().saturating_sub(1)).find_map(|i| {
            let (a, b) = (bytes[i].last()?, bytes[i + 1].first()?);
            if !(a.is_ascii_alphanumeric() && b.is_ascii_alphanumeric()) {
                return None;
            }
            // An ASCII byte ends any broken character, so the text up to it is a prefix.
            let before = String::from_utf8_lossy(&bytes[..=i].concat()).into_owned();
            let stop = format!("{}{}", *a as char, *b as char);
            (content.starts_with(&before) && content.find(&stop) == Some(before.len() - 1))
                .then_some(stop)
        });
        let Some(stop) = across else { continue };
        let stop = stop.as_str();
        let cut = &content[..content.find(stop).unwrap()];
        let with_stop = ask(seed, json!({"stop": [stop]}));
        let (code, whole) =
            http(&url, "POST", "/v1/chat/completions", with_stop.to_string().as_bytes());
        assert_eq!(code, 200, "{whole}");
        assert_eq!(
            whole["choices"][0]["message"]["content"],
            json!(cut),
            "seed {seed}, stop {stop:?}"
        );
        let (code, events) = stream(&url, &ask(seed, json!({"stop": [stop], "stream": true})));
        assert_eq!(code, 200);
        let (text, _, finish) = joined(&events);
        assert_eq!(
            (text.as_str(), finish),
            (cut, vec!["stop".to_string()]),
            "seed {seed}, stop {stop:?}"
        );
        stops_tried += 1;
    }
    assert!(stops_tried >= 3, "only {stops_tried} answers had a stop string to try");

    for (extra, says) in [
        (json!({"stream": true, "presence_penalty": 1}), "presence_penalty = 1 is not supported"),
        (json!({"stream_options": {"include_usage": true}}), "stream_options is only for streamed"),
        (json!({"stream": true, "stop": ["a", ""]}), "a stop string is empty"),
        (json!({"stream": true, "max_tokens": 1000}), "this model's context is 256 tokens"),
    ] {
        let (code, events) = stream(&url, &ask(1, extra.clone()));
        let message = events[0]["error"]["message"].as_str().unwrap_or_default();
        assert!(code == 400 && message.contains(says), "{extra}: {code} {events:?}");
    }

    leave_a_stream_part_way(
        &server,
        &url,
        json!({"messages": [{"role": "user", "content": "Go on."}], "stream": true,
            "max_tokens": 180, "min_tokens": 180}),
    );
    assert_eq!(stream(&url, &ask(1, json!({"stream": true}))).0, 200, "the server goes on");
    server.sigkill();
}

/// `/v1/completions` answers a raw prompt (text or token ids, no chat template) with what
/// `comas generate --prompt` gives it alone with the same seed: the text, each token's
/// log-probability (`logprobs = 0`), the usage; 16 tokens when `max_tokens` is not given, as
/// OpenAI's API; streamed, the same text in pieces. What it does not do is refused by name.
#[test]
fn serve_completes_a_raw_prompt_as_comas_generate_does() {
    use serde_json::json;
    let model = fixtures().join("models/qwen2-f32");
    let (mut server, url) = harness::serve(&model, "judge");
    let complete = |body: serde_json::Value| {
        http(&url, "POST", "/v1/completions", body.to_string().as_bytes())
    };
    let prompt = "Once upon a time";
    let alone = generate_json(&model, "--prompt", prompt, 20, 5);
    let ids: Vec<i64> =
        alone["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let ask =
        json!({"model": "judge", "max_tokens": 20, "seed": 5, "temperature": 1.0, "logprobs": 0});
    let with = |prompt: serde_json::Value| {
        let mut body = ask.clone();
        body["prompt"] = prompt;
        body
    };
    for asked in [json!(prompt), json!([prompt]), json!(ids), json!([ids])] {
        let (code, r) = complete(with(asked.clone()));
        assert_eq!(code, 200, "{asked}: {r}");
        assert_eq!(r["object"], "text_completion");
        assert!(r["id"].as_str().unwrap().starts_with("cmpl-"), "{r}");
        let c = &r["choices"][0];
        assert_eq!(c["text"], alone["text"], "{asked}");
        let want = alone["logprobs"].as_array().unwrap();
        let got = c["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.as_f64().unwrap() as f32, w.as_f64().unwrap() as f32);
        }
        let offsets: Vec<u64> = c["logprobs"]["text_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(offsets[0], 0);
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
        let n = alone["generated_ids"].as_array().unwrap().len() as u64;
        assert_eq!(
            (r["usage"]["prompt_tokens"].as_u64(), r["usage"]["completion_tokens"].as_u64()),
            (Some(ids.len() as u64), Some(n))
        );
        assert_eq!(c["finish_reason"], if n == 20 { "length" } else { "stop" });
    }
    // Streamed: the same text and log-probabilities, one finish reason, no role chunk.
    let mut body = with(json!(prompt));
    body["stream"] = json!(true);
    let (code, events) = stream_to(&url, "/v1/completions", &body);
    assert_eq!(code, 200, "{events:?}");
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut finish = Vec::new();
    for e in &events[..events.len() - 1] {
        assert_eq!(e["object"], "text_completion", "{e}");
        let c = &e["choices"][0];
        text.push_str(c["text"].as_str().unwrap());
        logprobs.extend(c["logprobs"]["token_logprobs"].as_array().unwrap().iter().cloned());
        finish.extend(c["finish_reason"].as_str().map(String::from));
    }
    assert_eq!(events.last().unwrap(), &json!("[DONE]"));
    assert!(events.len() > 3, "{events:?}");
    assert_eq!(text, alone["text"].as_str().unwrap());
    let (_, whole) = complete(with(json!(prompt)));
    assert_eq!(json!(logprobs), whole["choices"][0]["logprobs"]["token_logprobs"]);
    assert_eq!(json!(finish), json!([whole["choices"][0]["finish_reason"]]));

    // Without max_tokens, 16 tokens at most (ignore the stop token: min_tokens = 16).
    let (code, r) = complete(json!({"prompt": prompt, "min_tokens": 16, "seed": 1}));
    assert_eq!((code, r["usage"]["completion_tokens"].as_u64()), (200, Some(16)), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "length");

    let vocab = 512;
    for (extra, says) in [
        (json!({"echo": true}), "echo = true is not supported"),
        (json!({"logprobs": 2}), "logprobs = 2 asks for 2 alternatives"),
        (json!({"suffix": "end"}), "suffix is not supported"),
        (json!({"prompt": ["a", "b"]}), "prompt is a list of 2: send one prompt per request"),
        (json!({"prompt": [1, vocab]}), "prompt token id 512 is outside the vocabulary (0 to 511)"),
        (json!({"prompt": [1, -1]}), "prompt token id -1 is outside the vocabulary"),
        (json!({"prompt": ""}), "prompt is empty"),
        (json!({"prompt": []}), "prompt is empty"),
        (json!({"frequency_penalty": 0.5}), "frequency_penalty = 0.5 is not supported"),
        (json!({"max_tokens": 1000}), "shorten the prompt or lower max_tokens"),
        (json!({"prompt": {"text": "a"}}), "the body is not a completion request"),
    ] {
        let mut body = with(json!(prompt));
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (code, r) = complete(body);
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(code == 400 && message.contains(says), "{extra}: {code} {r}");
    }
    server.sigkill();
}

/// A client that leaves a stream part-way (as in the test above, the server is stopped between
/// the first text and the hang-up): its request is counted cancelled once, unanswered, and
/// every sequence of it leaves the batch.
fn leave_a_stream_part_way(server: &harness::Proc, url: &str, body: serde_json::Value) {
    let port: u16 = authority(url).rsplit(':').next().unwrap().parse().unwrap();
    let at = ("127.0.0.1".to_string(), port);
    let count = |outcome: &str| {
        harness::try_scrape(&at, &format!("comas_serve_requests_total{{outcome=\"{outcome}\"}}"))
            .unwrap_or(0.0)
    };
    let pid = server.child.id() as i32;
    let chat = body.get("messages").is_some();
    let path = if chat { "/v1/chat/completions" } else { "/v1/completions" };
    let choices = body["n"].as_u64().unwrap_or(1) as usize;
    let cancelled = count("cancelled");
    for _ in 0..5 {
        use std::io::{BufRead, Write};
        let answered = count("answered");
        let body = body.to_string();
        let mut sock = std::net::TcpStream::connect(authority(url)).unwrap();
        write!(sock, "POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut lines = std::io::BufReader::new(sock.try_clone().unwrap()).lines();
        // Each choice's role chunk, then one with text: a sequence is decoding.
        let (mut data, want) = (0, if chat { choices + 1 } else { 1 });
        while data < want {
            let line = lines.next().expect("the stream ended early").unwrap();
            data += usize::from(line.starts_with("data: "));
        }
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        drop(lines);
        drop(sock);
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while count("cancelled") == cancelled && count("answered") == answered {
            assert!(std::time::Instant::now() < deadline, "the stream neither ended nor left");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if count("cancelled") == cancelled + 1.0 {
            assert_eq!(count("answered"), answered, "the abandoned stream was not answered");
            assert_eq!(harness::scrape(&at, "comas_serve_running_sequences"), 0.0);
            assert_eq!(harness::scrape(&at, "comas_serve_waiting_requests"), 0.0);
            return;
        }
    }
    panic!("every try finished before its client could leave");
}

/// `n` choices: choice i is what the request gives alone with seed + i, whole or streamed
/// (each choice's chunks join to its text), in both APIs, with the usage counting the prompt
/// once; a client that leaves takes every choice out of the batch.
#[test]
fn serve_gives_n_choices_each_the_answer_of_its_own_seed() {
    use serde_json::json;
    let model = fixtures().join("models/qwen2-f32");
    let (mut server, url) = harness::serve(&model, "judge");
    let post = |path: &str, body: &serde_json::Value| {
        let (code, r) = http(&url, "POST", path, body.to_string().as_bytes());
        assert_eq!(code, 200, "{body}: {r}");
        r
    };
    let chat = |seed: u64, n: u64| {
        json!({"messages": [{"role": "user", "content": "Name three colours."}],
            "max_tokens": 30, "seed": seed, "temperature": 1.0, "n": n, "logprobs": true})
    };
    let text = |seed: u64, n: u64| json!({"prompt": "Red, green and", "max_tokens": 12, "seed": seed, "n": n, "logprobs": 0});
    for (path, ask, field) in [
        ("/v1/chat/completions", &chat as &dyn Fn(u64, u64) -> serde_json::Value, "message"),
        ("/v1/completions", &text, "text"),
    ] {
        let three = post(path, &ask(40, 3));
        let choices = three["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3);
        let (mut prompt, mut generated) = (0, 0);
        for (i, c) in choices.iter().enumerate() {
            let one = post(path, &ask(40 + i as u64, 1));
            assert_eq!(c["index"], i, "{path}");
            assert_eq!(
                (&c[field], &c["logprobs"], &c["finish_reason"]),
                (
                    &one["choices"][0][field],
                    &one["choices"][0]["logprobs"],
                    &one["choices"][0]["finish_reason"]
                ),
                "{path}: choice {i}"
            );
            prompt = one["usage"]["prompt_tokens"].as_u64().unwrap();
            generated += one["usage"]["completion_tokens"].as_u64().unwrap();
        }
        assert_ne!(choices[0][field], choices[1][field], "{path}: the choices are alike");
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": generated,
            "total_tokens": prompt + generated});
        assert_eq!(three["usage"], usage, "{path}");

        // Streamed: each choice's chunks join to its text, with one finish reason each.
        let mut body = ask(40, 3);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (code, events) = stream_to(&url, path, &body);
        assert_eq!(code, 200);
        let mut joined = vec![String::new(); 3];
        let mut finished = vec![Vec::new(); 3];
        let mut roles = 0;
        for e in &events[..events.len() - 2] {
            let c = &e["choices"][0];
            let i = c["index"].as_u64().unwrap() as usize;
            let piece = if field == "text" { &c["text"] } else { &c["delta"]["content"] };
            joined[i].push_str(piece.as_str().unwrap_or(""));
            roles += usize::from(c["delta"]["role"] == "assistant");
            finished[i].extend(c["finish_reason"].as_str().map(String::from));
        }
        for (i, c) in choices.iter().enumerate() {
            let whole = if field == "text" { &c["text"] } else { &c["message"]["content"] };
            assert_eq!(joined[i], whole.as_str().unwrap(), "{path}: choice {i}");
            assert_eq!(json!(finished[i]), json!([c["finish_reason"]]), "{path}: choice {i}");
        }
        assert_eq!(roles, if field == "text" { 0 } else { 3 });
        assert_eq!(events[events.len() - 2]["usage"], usage, "{path}");
        assert_eq!(events[events.len() - 1], json!("[DONE]"));
    }
    for n in [0, 129] {
        let (code, r) = http(&url, "POST", "/v1/completions", text(1, n).to_string().as_bytes());
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(code == 400 && message.contains("a request asks for 1 to 128 choices"), "{r}");
    }
    leave_a_stream_part_way(
        &server,
        &url,
        json!({"messages": [{"role": "user", "content": "Go on."}], "stream": true, "n": 3,
            "max_tokens": 180, "min_tokens": 180}),
    );
    server.sigkill();
}

/// With an API key, the completion and model routes answer only requests that carry it
/// (`Authorization: Bearer KEY`, as OpenAI clients and comas's own endpoint client send it);
/// the probes and the scrape stay open.
#[test]
fn serve_with_an_api_key_answers_only_requests_that_carry_it() {
    use comas_service::openai::{CallError, ChatRequest, Endpoint, Message, Sampling};
    let model = fixtures().join("models/qwen2-f32");
    let (mut server, url) =
        harness::serve_with(&model, "judge", &[("COMAS_SERVE_API_KEY", "s3cret")]);
    let body = serde_json::json!({"messages": [{"role": "user", "content": "Hi."}],
        "max_tokens": 3, "seed": 1})
    .to_string();
    let chat = |headers: &str| {
        let (code, r) = http_with(&url, "POST", "/v1/chat/completions", headers, body.as_bytes());
        (code, r["error"]["message"].as_str().unwrap_or_default().to_string())
    };
    let (code, message) = chat("");
    assert!(code == 401 && message.contains("this server needs an API key"), "{code} {message}");
    let (code, message) = chat("Authorization: Bearer s3cre\r\n");
    assert!(code == 401 && message.contains("not this server's"), "{code} {message}");
    assert_eq!(chat("Authorization: Bearer s3cret\r\n").0, 200);
    assert_eq!(http(&url, "GET", "/v1/models", b"").0, 401);
    assert_eq!(
        http_with(&url, "GET", "/v1/models", "Authorization: Bearer s3cret\r\n", b"").0,
        200
    );
    assert_eq!(http(&url, "POST", "/v1/completions", b"{}").0, 401);
    let port: u16 = authority(&url).rsplit(':').next().unwrap().parse().unwrap();
    let at = ("127.0.0.1".to_string(), port);
    assert_eq!(harness::scrape(&at, "comas_serve_requests_total{outcome=\"unauthorized\"}"), 4.0);

    // comas's own client (a MAPPA coach's endpoint, with `api_key_env`).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let request = ChatRequest {
        messages: vec![Message { role: "user".into(), content: "Hi.".into() }],
        sampling: Sampling { max_tokens: Some(3), ..Default::default() },
        ..Default::default()
    };
    let ask = |key: Option<&str>| {
        let e = Endpoint::parse(&url, key.map(String::from)).unwrap();
        rt.block_on(e.chat(&request, std::time::Duration::from_secs(60)))
    };
    assert!(ask(Some("s3cret")).is_ok());
    match ask(None) {
        Err(e @ CallError::Status { code: 401, .. }) => assert!(!e.retryable()),
        other => panic!("expected a 401, got {other:?}"),
    }
    server.sigkill();
    let out = comas(&["serve", "--model", model.to_str().unwrap(), "--api-key", " "]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--api-key is empty"));
}
