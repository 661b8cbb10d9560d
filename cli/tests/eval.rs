//! `comas eval` and `comas grade` as a user runs them, on the tiny fixture models: the number of
//! calls each setup makes, resumption, that batching changes nothing, heterogeneous teams, and
//! grading with the sandbox and the pure graders.
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

fn model(name: &str) -> String {
    fixtures().join("models").join(name).to_str().unwrap().to_string()
}

fn canonical(path: impl AsRef<Path>) -> String {
    std::fs::canonicalize(path).unwrap().display().to_string()
}

fn results(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn eval(out: &Path, extra: &[&str]) -> Output {
    eval_model(&model("qwen2-f32"), out, extra)
}

/// Every setup on 3 arithmetic questions, at most 6 new tokens per call.
fn eval_model(model: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "eval",
        "--model",
        model,
        "--setup",
        "all",
        "--bench",
        "arithmetic",
        "--arithmetic-questions",
        "3",
        "--max-new-tokens",
        "6",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    comas(&args)
}

/// (setup, id) -> (output, call count)
fn outputs(rs: &[Value]) -> BTreeMap<(String, String), (String, usize)> {
    rs.iter()
        .map(|r| {
            (
                (r["setup"].as_str().unwrap().to_string(), r["id"].as_str().unwrap().to_string()),
                (r["output"].as_str().unwrap().to_string(), r["calls"].as_array().unwrap().len()),
            )
        })
        .collect()
}

#[test]
fn every_setup_makes_its_calls_and_a_rerun_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = eval(&out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: Value = serde_json::from_slice(&o.stdout).expect("a summary JSON on stdout");
    assert_eq!(summary["graded"], 12, "3 questions x 4 setups");
    let rs = results(&out);
    assert_eq!(rs.len(), 12);
    for r in &rs {
        let calls = r["calls"].as_array().unwrap();
        let n = calls.len();
        match r["setup"].as_str().unwrap() {
            "vanilla" => assert_eq!(n, 1),
            "consistency" => assert_eq!(n, 6),
            "debate" => assert_eq!(n, 7),
            // Nobody writes TERMINATE in 6 random tokens: assistant, proxy, assistant, proxy, assistant.
            "autogen" => assert_eq!(n, 5),
            s => panic!("setup {s}"),
        }
        // The graded output is the last call's reply (the aggregation, the last assistant turn).
        assert_eq!(r["output"], calls[n - 1]["response"]);
        assert!(calls.iter().all(|c| c["new_tokens"].as_u64().unwrap() <= 6));
        assert_eq!(r["verdict"]["passed"], false, "a random tiny model does not add");
    }
    for f in ["summary.json", "summary.md"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.contains("| arithmetic | 0.0 % (0/3) | 0.0 % (0/3) | 0.0 % (0/3) | 0.0 % (0/3) |"),
        "{md}"
    );

    // A rerun finds every question graded and makes no call.
    let again = eval(&out, &[]);
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("0 calls, 0 tokens"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(results(&out).len(), 12);
    // So does one that names the model folder another way (`run.json` keeps absolute paths).
    let o = eval_model(fixtures().join("models/../models/qwen2-f32").to_str().unwrap(), &out, &[]);
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stderr).contains("0 calls, 0 tokens"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // One call at a time gives the same outputs as all calls in one batch.
    let one = dir.path().join("one");
    let o = eval(&one, &["--max-running", "1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(outputs(&results(&one)), outputs(&rs));
    // Two questions open at a time, the third opening as one ends (slots reused): the same.
    let window = dir.path().join("window");
    let o = eval(&window, &["--max-open", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(outputs(&results(&window)), outputs(&rs));

    // Other settings into the same folder are refused: its results would mix.
    let o = eval(&out, &["--temperature", "0.5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("holds results of another run")
            && err.contains("give another --out"),
        "{err}"
    );

    // A run cut short (here: a limit) is completed by a later run, which adds only the rest.
    let part = dir.path().join("part");
    assert!(eval(&part, &["--limit", "1"]).status.success());
    assert_eq!(results(&part).len(), 4);
    assert!(eval(&part, &[]).status.success());
    assert_eq!(outputs(&results(&part)), outputs(&rs));
}

#[test]
fn a_team_of_two_models_alternates_members() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (model("qwen2-f32"), model("qwen2-tied-bf16"));
    let out = dir.path().join("team");
    let o = comas(&[
        "eval",
        "--model",
        &a,
        "--model",
        &b,
        "--setup",
        "debate",
        "--bench",
        "arithmetic",
        "--arithmetic-questions",
        "1",
        "--max-new-tokens",
        "4",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rs = results(&out);
    let models: Vec<&str> =
        rs[0]["calls"].as_array().unwrap().iter().map(|c| c["model"].as_str().unwrap()).collect();
    // Results name models by absolute path.
    let (a, b) = (canonical(&a), canonical(&b));
    // Agents 1, 2, 3 in round 0 and round 1 are members 0, 1, 2 -> models a, b, a; the aggregation is member 0.
    assert_eq!(
        models,
        vec![a.as_str(), b.as_str(), a.as_str(), a.as_str(), b.as_str(), a.as_str(), a.as_str()]
    );
}

#[test]
fn bad_eval_input_is_refused_with_what_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let m = model("qwen2-f32");
    let o = comas(&[
        "eval",
        "--model",
        &m,
        "--setup",
        "chain",
        "--bench",
        "arithmetic",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unknown setup `chain`")
    );
    let bench = dir.path().join("b.jsonl");
    std::fs::write(
        &bench,
        "{\"query\": \"1+1?\", \"gt\": \"2\", \"tag\": \"gsm8k\"}\n{\"query\": 3}\n",
    )
    .unwrap();
    let o = comas(&[
        "eval",
        "--model",
        &m,
        "--bench",
        bench.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("line 2"), "{err}");
}

#[test]
fn grade_scores_responses_without_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let math = dir.path().join("math.jsonl");
    std::fs::write(
        &math,
        "{\"id\": 1, \"response\": \"so the answer is \\\\boxed{\\\\frac{1}{2}}\", \"answer\": \"0.5\"}\n{\"id\": 2, \"response\": \"It is 7.\", \"answer\": \"8\"}\n",
    )
    .unwrap();
    let verdicts = dir.path().join("v.jsonl");
    let o = comas(&[
        "grade",
        "--bench",
        "math",
        "--responses",
        math.to_str().unwrap(),
        "--out",
        verdicts.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((s["graded"].as_u64(), s["passed"].as_u64()), (Some(2), Some(1)));
    let lines: Vec<Value> = std::fs::read_to_string(&verdicts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        (lines[0]["passed"].as_bool(), lines[1]["passed"].as_bool()),
        (Some(true), Some(false))
    );

    let choice = dir.path().join("c.jsonl");
    std::fs::write(
        &choice,
        "{\"id\": \"a\", \"response\": \"\\\\boxed{A} no, \\\\boxed{c}\", \"answer\": \"C\"}\n",
    )
    .unwrap();
    let s: Value = serde_json::from_slice(
        &comas(&["grade", "--bench", "choice", "--responses", choice.to_str().unwrap()]).stdout,
    )
    .unwrap();
    assert_eq!(s["passed"], 1);
}

#[test]
fn grade_runs_humaneval_answers_in_the_sandbox() {
    let path = comas_sandbox::default_humaneval_path();
    let problems = comas_sandbox::load_humaneval(&path)
        .unwrap_or_else(|e| panic!("{e}: run `bash scripts/fetch-humaneval.sh`"));
    let p = &problems[0];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("he.jsonl");
    let good = serde_json::json!({"id": p.task_id, "response": p.canonical_response()});
    let bad = serde_json::json!({"id": p.task_id, "response": format!("```python\n{}    return None\n```", p.prompt)});
    // Two blocks, the good one first: any_block passes, last_block does not.
    let two = serde_json::json!({"id": p.task_id, "response": format!("{}\n{}", p.canonical_response(), bad["response"].as_str().unwrap())});
    std::fs::write(&file, format!("{good}\n{bad}\n{two}\n")).unwrap();
    let o = comas(&["grade", "--bench", "humaneval", "--responses", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (s["graded"].as_u64(), s["passed"].as_u64(), s["passed_other_mode"].as_u64()),
        (Some(3), Some(2), Some(1))
    );
    let unknown = dir.path().join("u.jsonl");
    std::fs::write(&unknown, "{\"id\": \"HumanEval/999\", \"response\": \"x\"}\n").unwrap();
    let o = comas(&["grade", "--bench", "humaneval", "--responses", unknown.to_str().unwrap()]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no HumanEval task")
    );
}

/// `--job-dir` finds an agent's checkpoint in a `comas local --dir` folder: a LoRA checkpoint
/// runs on the base model its adapter config names; a missing step lists the steps there.
#[test]
fn a_job_checkpoint_is_evaluated_on_its_base_model() {
    let dir = tempfile::tempdir().unwrap();
    // A learner keeps one folder per job under its checkpoint folder.
    let step = dir.path().join("job/checkpoints/agent-1/my_job/step-3");
    let adapter = step.join("adapter");
    std::fs::create_dir_all(&adapter).unwrap();
    let lora = fixtures().join("models/qwen2-f32-lora");
    std::fs::copy(
        lora.join("adapter_model.safetensors"),
        adapter.join("adapter_model.safetensors"),
    )
    .unwrap();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(lora.join("adapter_config.json")).unwrap())
            .unwrap();
    config["base_model_name_or_path"] = Value::String(model("qwen2-f32"));
    std::fs::write(adapter.join("adapter_config.json"), config.to_string()).unwrap();
    std::fs::write(step.join("COMPLETE"), "ok\n").unwrap();
    let job = dir.path().join("job");
    let out = dir.path().join("out");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "eval",
            "--job-dir",
            job.to_str().unwrap(),
            "--agent",
            "1",
            "--bench",
            "arithmetic",
            "--arithmetic-questions",
            "1",
            "--max-new-tokens",
            "3",
        ];
        args.extend_from_slice(extra);
        comas(&args)
    };
    let o = run(&["--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rs = results(&out);
    assert_eq!(
        rs[0]["calls"][0]["model"],
        format!("{}+{}", canonical(&model("qwen2-f32")), canonical(&adapter))
    );
    let o = run(&["--checkpoint", "5", "--out", dir.path().join("o2").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("no checkpoint of step 5")
            && err.contains("steps there: 3"),
        "{err}"
    );
}

/// `comas plot` over eval folders draws accuracy against checkpoint step, a line per benchmark
/// and setup; a folder without a step is refused with what to pass.
#[test]
fn plot_draws_accuracy_by_checkpoint_step() {
    let dir = tempfile::tempdir().unwrap();
    let m = model("qwen2-f32");
    let run = |out: &Path, step: Option<&str>| {
        let mut args = vec![
            "eval",
            "--model",
            &m,
            "--setup",
            "vanilla,debate",
            "--bench",
            "arithmetic",
            "--arithmetic-questions",
            "2",
            "--max-new-tokens",
            "3",
            "--out",
            out.to_str().unwrap(),
        ];
        if let Some(s) = step {
            args.extend(["--step", s]);
        }
        let o = comas(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (a, b, c) = (dir.path().join("s4"), dir.path().join("s0"), dir.path().join("none"));
    run(&a, Some("4"));
    run(&b, Some("0"));
    run(&c, None);
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["checkpoint_step"], 4);
    let svg = dir.path().join("acc.svg");
    let o = comas(&["plot", a.to_str().unwrap(), b.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    for name in ["arithmetic vanilla", "arithmetic debate", "Accuracy by checkpoint step"] {
        assert!(text.contains(name), "{name} not drawn");
    }
    let o = comas(&["plot", a.to_str().unwrap(), c.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("has no checkpoint step") && err.contains("--step"),
        "{err}"
    );
}
