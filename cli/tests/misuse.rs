//! `comas local` and the CLI under misuse, with real processes: however `comas local` is
//! stopped, no learner or worker outlives it, and SIGTERM stops it as cleanly as Ctrl-C (the
//! same command resumes the job). Flags that cannot work are refused with a message.
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One `comas local` at a time: several at once on 2 cores would test the machine's load, not
/// the signal handling (and their loopback ports could collide).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn comas() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_comas"));
    c.env("COMAS_THREADS", "1");
    c
}

/// Starts the tiny example and returns it with the pids of its children and the lines it
/// printed, once the job is submitted or resumed; later stderr lines arrive on the channel.
fn start_local(dir: &Path) -> (Child, Vec<u32>, Vec<String>, mpsc::Receiver<String>) {
    let mut child = comas()
        .args(["local", "--example", "tiny", "--dir", &dir.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut pids = Vec::new();
    let mut lines = Vec::new();
    let mut job = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(job && pids.len() == 4) {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("comas local printed its children and submitted the job");
        if let Some(pid) = line
            .split(": pid ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .and_then(|p| p.parse().ok())
        {
            pids.push(pid);
        }
        job |= line.starts_with("submitted job") || line.starts_with("resuming job");
        assert!(pids.len() <= 4, "2 learners and 2 workers: {pids:?}");
        lines.push(line);
    }
    (child, pids, lines, rx)
}

/// The lines still to come from a process that has exited: the reader thread may lag behind
/// the exit, so wait for the pipe to close (or for 10 s of silence), not just for what is there.
fn rest_of(rx: &mpsc::Receiver<String>) -> Vec<String> {
    std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(10)).ok()).collect()
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()) != Some("Z")
        }
    }
}

fn wait_gone(pids: &[u32], within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "comas local did not exit");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sigterm_stops_cleanly_and_the_same_command_resumes() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    // Right after the job is submitted: the handler is in place from the start, so even this
    // early a SIGTERM stops the run cleanly.
    let (mut child, pids, _, rx) = start_local(dir.path());
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, Duration::from_secs(90));
    assert!(!status.success());
    let said = rest_of(&rx);
    assert!(said.iter().any(|l| l.contains("run the same command again to resume")), "{said:?}");
    assert_eq!(
        wait_gone(&pids, Duration::from_secs(5)),
        Vec::<u32>::new(),
        "children stopped by comas local itself"
    );
    // The job's learners get the same ports back; one that is taken is named, not a riddle.
    let job = std::fs::read_to_string(dir.path().join("job.toml")).unwrap();
    let port0 = job
        .split("learner = \"https://")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("learner 0 address in job.toml")
        .to_string();
    let squatter = std::net::TcpListener::bind(&port0).unwrap();
    let out = comas()
        .args(["local", "--example", "tiny", "--dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("listens on {port0}, which is in use")),
        "{err}"
    );
    drop(squatter);
    // Nothing was lost: the same command picks the job up again and finishes it.
    let (mut again, pids, _, rx) = start_local(dir.path());
    let status = wait_exit(&mut again, Duration::from_secs(300));
    let said = rest_of(&rx);
    assert!(status.success(), "{said:?}");
    assert_eq!(wait_gone(&pids, Duration::from_secs(5)), Vec::<u32>::new());
    // The logs of both runs are kept, one header per start.
    let log = std::fs::read_to_string(dir.path().join("logs/learner-0.log")).unwrap();
    assert_eq!(log.matches("==== comas local (pid ").count(), 2, "{log}");
}

#[test]
fn sighup_and_sigkill_leave_no_learner_or_worker_behind() {
    let _one = serial();
    for sig in [libc::SIGHUP, libc::SIGKILL] {
        let dir = tempfile::tempdir().unwrap();
        let (mut child, pids, _, _rx) = start_local(dir.path());
        assert!(pids.iter().all(|&p| alive(p)));
        signal(&child, sig);
        wait_exit(&mut child, Duration::from_secs(90));
        // SIGKILL gives comas local no chance: its children go by the parent-death signal.
        assert_eq!(
            wait_gone(&pids, Duration::from_secs(60)),
            Vec::<u32>::new(),
            "orphans after signal {sig}"
        );
    }
}

#[test]
fn flags_that_cannot_work_are_refused() {
    let out =
        comas().args(["--threads", "0", "plot", "nothing.jsonl", "-o", "x.svg"]).output().unwrap();
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr)
                .contains("--threads (COMAS_THREADS) must be at least 1")
    );
    let out = comas()
        .env("COMAS_THREADS", "0")
        .args(["plot", "nothing.jsonl", "-o", "x.svg"])
        .output()
        .unwrap();
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("must be at least 1, got 0")
    );
    let dir = tempfile::tempdir().unwrap();
    let out = comas()
        .args([
            "local",
            "--example",
            "tiny",
            "--workers",
            "0",
            "--dir",
            &dir.path().display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("--workers must be at least 1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let out = comas()
        .args(["local", "--example", "tiny", "--dir", &file.join("sub").display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--dir") && err.contains(&file.display().to_string()),
        "{err}"
    );
}

/// Arguments that would do nothing, or something else than asked, are refused before any
/// model loads, each naming what to change.
#[test]
fn arguments_that_would_run_nothing_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let log = dir.path().join("metrics.jsonl");
    std::fs::write(&log, "").unwrap();
    let run = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = comas()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let eval = ["eval", "--model", "m", "--bench", "arithmetic", "--out", &d];
    for (flag, value) in [
        ("--limit", "0"),
        ("--max-new-tokens", "0"),
        ("--max-running", "0"),
        ("--max-open", "0"),
        ("--arithmetic-questions", "0"),
    ] {
        let e = run(&[&eval[..], &[flag, value]].concat(), "");
        assert!(e.contains(&format!("{flag} must be at least 1")), "{e}");
    }
    for flag in ["--max-running", "--max-batch-tokens"] {
        let e = run(&["serve", "--model", "m", flag, "0"], "");
        assert!(e.contains(&format!("{flag} must be at least 1")), "{e}");
    }
    let e = run(&["serve", "--model", "m", "--served-name", " "], "");
    assert!(e.contains("--served-name is empty"), "{e}");
    let e = run(&["generate", "--model", "m", "--prompt", "hi", "--max-new-tokens", "0"], "");
    assert!(e.contains("--max-new-tokens must be at least 1"), "{e}");
    let a = format!("a={}", log.display());
    let e = run(&["compare", "--run", &a, "--window", "0"], "");
    assert!(e.contains("--window must be at least 1"), "{e}");
    let e = run(&["compare", "--run", &a, "--run", &a], "");
    assert!(e.contains("the label `a` is given twice"), "{e}");
    let e = run(&["compare", "--run", &format!("a|b={}", log.display())], "");
    assert!(e.contains("cannot hold `|`"), "{e}");
    let e = run(&["token", "hash", "--scopes", "read", "--name", "n"], "tok1\ntok2\n");
    assert!(e.contains("more than one word"), "{e}");
    let e = run(&["import-gguf", &d, "--out", &format!("{d}/m")], "");
    assert!(e.contains("a folder, not a GGUF file"), "{e}");
}

/// jemalloc takes every option the binary is built with (model/src/process.rs): it would say
/// `<jemalloc>: Invalid conf pair` on stderr for one it does not know, and go on without it.
#[test]
fn the_allocator_takes_the_built_in_options() {
    let out = comas().arg("--version").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("<jemalloc>"), "{err}");
    let out = comas().arg("--version").env("MALLOC_CONF", "no_such_option:1").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("<jemalloc>: Invalid conf pair"));
}

/// A service that cannot start says why in `comas local`'s own error, not only in its log.
#[test]
fn a_service_that_exits_at_start_is_named_with_the_end_of_its_log() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = comas()
        .args(["local", "--example", "tiny", "--device", "tpu"])
        .args(["--dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().rev().take(6).collect::<Vec<_>>().join("\n");
    assert!(!out.status.success() && last.contains("exited") && last.contains("`tpu`"), "{err}");
}

/// A command whose output is its input would replace what it reads: refused, the input kept.
#[test]
fn an_output_that_is_the_input_is_refused_and_the_input_stays() {
    let dir = tempfile::tempdir().unwrap();
    let rows = dir.path().join("rows.jsonl");
    let text = "{\"id\": \"a\", \"response\": \"\\\\boxed{2}\", \"answer\": \"2\"}\n";
    std::fs::write(&rows, text).unwrap();
    // The same file under another spelling.
    let again = dir.path().join(".").join("rows.jsonl").display().to_string();
    let rows_arg = rows.display().to_string();
    for args in [
        vec!["grade", "--bench", "math", "--responses", &rows_arg, "--out", &again],
        vec!["convert-bench", "--format", "gsm8k", "--input", &rows_arg, "--out", &again],
        vec!["score", "--model", "unused", "--input", &rows_arg, "--output", &again],
    ] {
        let out = comas().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("the output would replace it"),
            "{args:?}: {err}"
        );
        assert_eq!(std::fs::read_to_string(&rows).unwrap(), text, "{args:?}");
    }
    // Another file is written as before.
    let other = dir.path().join("graded.jsonl");
    let out = comas()
        .args(["grade", "--bench", "math", "--responses", &rows_arg])
        .args(["--out", &other.display().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_to_string(&other).unwrap().contains("\"passed\":true"));
}

/// The start of `start_local`'s output that names the in-process coordinator and the job.
fn coordinator_and_job(lines: &[String]) -> (String, String) {
    let addr = lines
        .iter()
        .find_map(|l| l.strip_prefix("coordinator ").and_then(|r| r.split(',').next()))
        .expect("coordinator address")
        .to_string();
    let job = lines
        .iter()
        .find_map(|l| l.strip_prefix("submitted job ").and_then(|r| r.split(' ').next()))
        .expect("job id")
        .to_string();
    (addr, job)
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn another_job_in_the_same_dir_is_refused_until_fresh_and_checkpoints_stay() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _, _, rx) = start_local(dir.path());
    // Let one step finish (and checkpoint), then interrupt.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut said = Vec::new();
    while !said.last().is_some_and(|l: &String| l.starts_with("step 0 ")) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => said.push(line),
            Err(e) => panic!("no finished step ({e}); comas local said: {said:?}"),
        }
    }
    signal(&child, libc::SIGTERM);
    wait_exit(&mut child, Duration::from_secs(90));
    let ckpt = files_under(&dir.path().join("checkpoints"));
    assert!(ckpt.iter().any(|f| f.contains("agent-0")), "{ckpt:?}");

    let example = dir.path().join("example");
    let other = example.join("other.toml");
    std::fs::write(
        &other,
        std::fs::read_to_string(example.join("job.toml"))
            .unwrap()
            .replace("name = \"local-example\"", "name = \"other\""),
    )
    .unwrap();
    let run_other = |fresh: bool| {
        let mut args = vec![
            "local".to_string(),
            other.display().to_string(),
            "--dir".into(),
            dir.path().display().to_string(),
            "--json".into(),
        ];
        if fresh {
            args.push("--fresh".into());
        }
        comas().args(&args).output().unwrap()
    };
    let out = run_other(false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("holds the unfinished job")
            && err.contains("local-example")
            && err.contains("--fresh"),
        "{err}"
    );
    assert_eq!(
        files_under(&dir.path().join("checkpoints")),
        ckpt,
        "a refused run touches no checkpoint"
    );
    let out = run_other(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (status["name"].as_str(), status["state"].as_str()),
        (Some("other"), Some("succeeded"))
    );
}

#[test]
fn a_cancelled_job_is_resumed_by_the_same_command() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _, mut said, rx) = start_local(dir.path());
    let deadline = Instant::now() + Duration::from_secs(180);
    while !said.last().is_some_and(|l| l.starts_with("step 0 ")) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => said.push(line),
            Err(e) => panic!("no finished step ({e}); comas local said: {said:?}"),
        }
    }
    let (addr, job) = coordinator_and_job(&said);
    // Another shell reaches the run's coordinator with the run's certificate, as it prints.
    let tls = dir.path().join("tls");
    let out = comas()
        .args(["cancel", &job, "--coordinator", &addr])
        .env("COMAS_TLS_CA", tls.join("ca.pem"))
        .env("COMAS_TLS_CERT", tls.join("service.pem"))
        .env("COMAS_TLS_KEY", tls.join("service-key.pem"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // It reports the state the job reached, not the one it had when asked.
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("{job} cancelled"));
    assert!(
        !wait_exit(&mut child, Duration::from_secs(90)).success(),
        "a cancelled job is not a success"
    );
    // The same command queues it again from its last completed step and finishes it.
    let (mut again, _, mut said, rx) = start_local(dir.path());
    let status = wait_exit(&mut again, Duration::from_secs(300));
    said.extend(rest_of(&rx));
    assert!(status.success(), "{said:?}");
    assert!(said.iter().any(|l| l.contains(&job) && l.contains("was cancelled")), "{said:?}");
}

#[test]
fn a_second_run_or_coordinator_on_the_same_store_is_refused_naming_the_first() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, pids, _, _rx) = start_local(dir.path());
    let out = comas()
        .args(["local", "--example", "tiny", "--dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(&format!("in use by another comas local (process {})", child.id())),
        "{err}"
    );
    // Standalone coordinators lock their database the same way.
    let db = dir.path().join("jobs.sqlite").display().to_string();
    let out =
        comas().args(["coordinator", "--listen", "127.0.0.1:0", "--db", &db]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(&format!("in use by another coordinator (process {},", child.id())),
        "{err}"
    );
    // The first run is untouched by either and finishes its job.
    let status = wait_exit(&mut child, Duration::from_secs(300));
    assert!(status.success());
    assert_eq!(wait_gone(&pids, Duration::from_secs(5)), Vec::<u32>::new());
}

#[test]
fn a_model_that_cannot_load_fails_the_job_at_once_with_the_cause() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    // The example keeps a model file it finds: give it a truncated one.
    let model = dir.path().join("example").join("model-a");
    let out = comas()
        .args(["tiny-model", "--out", &model.display().to_string(), "--seed", "7"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let weights = model.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&weights).unwrap().set_len(len / 2).unwrap();
    let started = Instant::now();
    let out = comas()
        .args(["local", "--example", "tiny", "--dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("learner of agent 0")
            && err.contains("could not load its model")
            && err.contains(&weights.display().to_string()),
        "{err}"
    );
    // Not a retry loop that waits for the learner's patience to run out.
    assert!(started.elapsed() < Duration::from_secs(120), "took {:?}", started.elapsed());
}
