//! Every protection, tried with real `python3` programs: each misbehaving program must end as a
//! clean failed outcome naming the reason, leave no process behind and change nothing outside
//! its directory.
//!
//! A protection the machine lacks fails its test, unless COMAS_SANDBOX_ALLOW_GAPS=1 is set
//! (then the test says what it could not check).
use comas_sandbox::{
    grade_code, CodeGrading, Denied, Failure, Outcome, Reason, Sandbox, SandboxConfig,
    SandboxError, Status,
};
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let s = Sandbox::with_defaults().expect("sandbox starts");
        eprintln!("sandbox protections: {:?}\ngaps: {:?}", s.protections(), s.protections().gaps());
        s
    })
}

fn with(config: SandboxConfig) -> Sandbox {
    Sandbox::new(config).expect("sandbox starts")
}

/// Fails (or, with COMAS_SANDBOX_ALLOW_GAPS=1, reports) when a protection is missing.
fn require(present: bool, what: &str) -> bool {
    if present {
        return true;
    }
    let allowed = std::env::var("COMAS_SANDBOX_ALLOW_GAPS").is_ok_and(|v| v == "1");
    assert!(allowed, "this machine lacks {what}; set COMAS_SANDBOX_ALLOW_GAPS=1 to accept that");
    eprintln!("NOT CHECKED: this machine lacks {what}");
    false
}

fn failed(o: &Outcome) -> Reason {
    match o.status {
        Status::Failed(r) => r,
        Status::Passed => {
            panic!("expected a failure, got a pass: stdout {:?} stderr {:?}", o.stdout, o.stderr)
        }
    }
}

/// A name (at most 15 bytes, the kernel's `comm` size) that marks a test's processes.
fn token(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("cx{tag}{:06x}", (nanos ^ std::process::id()) & 0xff_ffff)
}

/// Python that renames the process (`prctl(PR_SET_NAME)`), inherited by whatever it forks.
fn set_name(token: &str) -> String {
    format!("import ctypes\nctypes.CDLL(None).prctl(15, {token:?}.encode(), 0, 0, 0)\n")
}

/// Host processes whose name or command line holds `token`.
fn processes_with(token: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if comm.contains(token) || String::from_utf8_lossy(&cmdline).contains(token) {
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            found.push(format!("pid {}: {}", name.to_string_lossy(), stat.trim()));
        }
    }
    found
}

/// No live process may be left once a run returns. A killed orphan outside a PID namespace is
/// a zombie until the machine's init reaps it, which may take a moment: that is allowed.
fn assert_no_process_left(token: &str) {
    let live: Vec<String> = processes_with(token).into_iter().filter(|p| !is_zombie(p)).collect();
    assert!(live.is_empty(), "processes left behind: {live:#?}");
    let start = Instant::now();
    while !processes_with(token).is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = processes_with(token);
    assert!(left.is_empty(), "zombies never reaped: {left:#?}");
}

/// The state field of a /proc/PID/stat line (after the parenthesised name).
fn is_zombie(stat_line: &str) -> bool {
    stat_line.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
}

#[test]
fn a_program_runs_and_its_output_is_captured() {
    let o = sandbox().run("import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n").unwrap();
    assert_eq!(o.status, Status::Passed, "{o:?}");
    assert_eq!(o.stdout, "hello\n");
    assert_eq!(o.stderr, "warn\n");
    assert!(!o.stdout_truncated && !o.stderr_truncated);
    assert!(o.wall_time < Duration::from_secs(3));
}

#[test]
fn an_exception_fails_with_its_exit_code() {
    let o = sandbox().run("assert 1 + 1 == 3\n").unwrap();
    assert_eq!(failed(&o), Reason::ExitCode(1));
    assert_eq!(o.exception(), Some("AssertionError"));
    let o = sandbox().run("import sys\nsys.exit(7)\n").unwrap();
    assert_eq!(failed(&o), Reason::ExitCode(7));
}

#[test]
fn an_infinite_loop_times_out() {
    let t = token("loop");
    let start = Instant::now();
    let o = sandbox()
        .run_with_timeout(
            &format!("{}while True:\n    pass\n", set_name(&t)),
            Duration::from_secs(1),
        )
        .unwrap();
    assert_eq!(failed(&o), Reason::Timeout, "{o:?}");
    assert!(start.elapsed() < Duration::from_secs(4), "took {:?}", start.elapsed());
    assert_no_process_left(&t);
}

#[test]
fn a_sleeping_program_times_out_too() {
    let o = sandbox()
        .run_with_timeout("import time\ntime.sleep(60)\n", Duration::from_millis(500))
        .unwrap();
    assert_eq!(failed(&o), Reason::Timeout);
    assert!(o.wall_time < Duration::from_secs(3), "{:?}", o.wall_time);
}

#[test]
fn a_busy_program_hits_the_cpu_limit() {
    let s = with(SandboxConfig {
        timeout: Duration::from_secs(20),
        cpu_time: Some(Duration::from_secs(1)),
        ..SandboxConfig::default()
    });
    let o = s.run("while True:\n    pass\n").unwrap();
    assert_eq!(failed(&o), Reason::CpuLimit, "{o:?}");
    assert!(o.wall_time < Duration::from_secs(15), "{:?}", o.wall_time);
}

#[test]
fn a_10_gb_allocation_fails_with_the_memory_limit() {
    let o = sandbox().run("x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n").unwrap();
    assert_eq!(failed(&o), Reason::MemoryLimit, "{o:?}");
    assert_eq!(o.exception(), Some("MemoryError"));
}

#[test]
fn memory_filled_step_by_step_fails_with_the_memory_limit() {
    let s = with(SandboxConfig { memory_bytes: 512 << 20, ..SandboxConfig::default() });
    // Touched pages, not just reserved ones.
    let o = s.run("chunks = []\nwhile True:\n    chunks.append(b'x' * (32 << 20))\n").unwrap();
    assert_eq!(failed(&o), Reason::MemoryLimit, "{o:?}");
}

#[test]
fn a_fork_bomb_hits_the_process_limit_and_leaves_nothing() {
    let s = sandbox();
    let limited = s.protections().pids_cgroup || s.protections().rlimit_nproc;
    if !require(limited, "a process limit (pids cgroup or RLIMIT_NPROC in a user namespace)") {
        return;
    }
    let t = token("bomb");
    let o = s.run(&format!("{}import os\nwhile True:\n    os.fork()\n", set_name(&t))).unwrap();
    assert_eq!(failed(&o), Reason::ProcessLimit, "{o:?}");
    assert_no_process_left(&t);
    // The sandbox still works afterwards.
    assert!(s.run("print(1)").unwrap().passed());
}

#[test]
fn a_fork_bomb_that_ignores_errors_times_out_and_leaves_nothing() {
    let s = sandbox();
    if !require(s.protections().pids_cgroup || s.protections().rlimit_nproc, "a process limit") {
        return;
    }
    let t = token("bomb2");
    let program = format!("{}import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", set_name(&t));
    let o = s.run_with_timeout(&program, Duration::from_secs(1)).unwrap();
    assert_eq!(failed(&o), Reason::Timeout, "{o:?}");
    assert_no_process_left(&t);
}

#[test]
fn children_are_killed_when_the_program_exits() {
    let t = token("kids");
    // A forked child, a grandchild that starts its own session (leaves the process group) and a
    // double-forked daemon: all still asleep when the program exits.
    let program = format!(
        "{}import os, subprocess, sys, time\n\
         if os.fork() == 0:\n    time.sleep(600)\n    os._exit(0)\n\
         subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {t:?}], start_new_session=True)\n\
         if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(600)\n    os._exit(0)\n\
         time.sleep(0.3)\nprint('parent done')\n",
        set_name(&t)
    );
    let o = sandbox().run(&program).unwrap();
    assert_eq!(o.status, Status::Passed, "{o:?}");
    assert_eq!(o.stdout, "parent done\n");
    assert!(o.wall_time < Duration::from_secs(2), "waited for the children: {:?}", o.wall_time);
    assert_no_process_left(&t);
}

#[test]
fn without_namespaces_the_process_group_and_cgroup_still_clean_up() {
    let s = with(SandboxConfig { namespaces: false, ..SandboxConfig::default() });
    assert!(!s.protections().pid_namespace);
    let t = token("pgrp");
    let program = format!(
        "{}import os, time\n\
         if os.fork() == 0:\n    time.sleep(600)\n    os._exit(0)\n\
         print('done')\n",
        set_name(&t)
    );
    let o = s.run(&program).unwrap();
    assert_eq!(o.status, Status::Passed, "{o:?}");
    assert_no_process_left(&t);
    // On a timeout the whole group goes.
    let t = token("pgto");
    let program = format!(
        "{}import os, time
os.fork()
while True:
    pass
",
        set_name(&t)
    );
    let o = s.run_with_timeout(&program, Duration::from_millis(500)).unwrap();
    assert_eq!(failed(&o), Reason::Timeout, "{o:?}");
    assert_no_process_left(&t);
    // A child that leaves the process group is caught only by the pids cgroup.
    if require(
        s.protections().pids_cgroup,
        "a pids cgroup (to catch setsid escapees without a PID namespace)",
    ) {
        let t = token("sess");
        let program = format!("{}import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n    os._exit(0)\ntime.sleep(0.2)\n", set_name(&t));
        assert!(s.run(&program).unwrap().passed());
        assert_no_process_left(&t);
    }
}

#[test]
fn writing_outside_the_run_directory_is_denied() {
    let s = sandbox();
    if !require(s.protections().landlock_abi.is_some(), "Landlock") {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let keep = host.path().join("keep.txt");
    std::fs::write(&keep, "host data").unwrap();
    let target = host.path().join("new.txt");

    let o =
        s.run(&format!("open({:?}, 'w').write('escaped')\n", target.to_str().unwrap())).unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Filesystem), "{o:?}");
    assert!(!target.exists());

    let o = s.run(&format!("import os\nos.remove({:?})\n", keep.to_str().unwrap())).unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Filesystem), "{o:?}");
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "host data");

    for outside in ["/tmp/comas-sandbox-escape.txt", "/etc/comas-sandbox-escape.txt"] {
        let o = s.run(&format!("open({outside:?}, 'w').write('x')\n")).unwrap();
        assert_eq!(failed(&o), Reason::Denied(Denied::Filesystem), "{outside}: {o:?}");
        assert!(!Path::new(outside).exists(), "{outside} was written");
    }
    // Reading stays allowed.
    let o = s.run(&format!("print(open({:?}).read())\n", keep.to_str().unwrap())).unwrap();
    assert_eq!(o.stdout, "host data\n", "{o:?}");
}

#[test]
fn the_run_directory_is_private_writable_and_removed() {
    let program = "import os, tempfile\n\
                   print(os.getcwd())\n\
                   assert sorted(os.listdir('.')) == ['main.py'], os.listdir('.')\n\
                   open('out.txt', 'w').write('data')\n\
                   os.mkdir('sub')\n\
                   with tempfile.NamedTemporaryFile() as f:\n    f.write(b'x')\n\
                   assert open('out.txt').read() == 'data'\n\
                   open('/dev/null', 'w').write('discarded')\n";
    let o = sandbox().run(program).unwrap();
    assert_eq!(o.status, Status::Passed, "{o:?}");
    let cwd = o.stdout.trim();
    assert!(cwd.contains("comas-sandbox-"), "{cwd}");
    assert!(!Path::new(cwd).exists(), "run directory {cwd} was not removed");
}

#[test]
fn sockets_are_denied() {
    let s = sandbox();
    assert!(
        s.protections().seccomp || s.protections().network_namespace,
        "no network isolation at all"
    );
    let o = s.run("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))\n").unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
    let o = s.run("import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n").unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
    let o = s
        .run("import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)\n")
        .unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
    // Local UNIX sockets are not the network and keep working.
    let o = s
        .run("import socket\na, b = socket.socketpair()\na.send(b'x')\nassert b.recv(1) == b'x'\n")
        .unwrap();
    assert_eq!(o.status, Status::Passed, "{o:?}");
}

#[test]
fn seccomp_alone_blocks_sockets() {
    let s = with(SandboxConfig { namespaces: false, ..SandboxConfig::default() });
    if !require(s.protections().seccomp, "seccomp") {
        return;
    }
    let o = s.run("import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM)\n").unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
    assert!(o.stderr.contains("[Errno 97]"), "{}", o.stderr);
}

#[test]
fn the_network_namespace_alone_blocks_connections() {
    // Landlock (ABI 4+) would refuse TCP connects too: leave only the namespace.
    let s = with(SandboxConfig { seccomp: false, landlock: false, ..SandboxConfig::default() });
    if !require(s.protections().network_namespace, "a network namespace") {
        return;
    }
    // The socket opens, but there is no interface to reach anything with, not even loopback.
    let o = s
        .run("import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))\n")
        .unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
    assert!(o.stderr.contains("Network is unreachable"), "{}", o.stderr);
    let o = s.run("import socket\nsocket.getaddrinfo('example.com', 80)\n").unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
    let o = s
        .run("import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', 22))\n")
        .unwrap();
    assert_eq!(failed(&o), Reason::Denied(Denied::Network), "{o:?}");
}

#[test]
fn stdin_is_closed() {
    let o = sandbox().run("input()\n").unwrap();
    assert_eq!(failed(&o), Reason::ExitCode(1));
    assert_eq!(o.exception(), Some("EOFError: EOF when reading a line"));
}

#[test]
fn output_is_capped() {
    let s = with(SandboxConfig { output_cap: 1000, ..SandboxConfig::default() });
    let o = s.run("import sys\nsys.stdout.write('a' * 1_000_000)\nsys.stdout.write('END')\nraise ValueError('last line')\n").unwrap();
    assert_eq!(failed(&o), Reason::ExitCode(1));
    assert!(o.stdout_truncated && !o.stderr_truncated);
    assert!(o.stdout.starts_with(&"a".repeat(1000)));
    assert!(o.stdout.ends_with("END"), "the tail is kept");
    assert!(o.stdout.len() < 1000 + 4096 + 100, "{}", o.stdout.len());
    assert_eq!(o.exception(), Some("ValueError: last line"));
}

#[test]
fn large_files_hit_the_file_size_limit() {
    let s = with(SandboxConfig { max_file_bytes: 1 << 20, ..SandboxConfig::default() });
    let o = s.run("with open('big.bin', 'wb') as f:\n    f.write(b'x' * (4 << 20))\n").unwrap();
    assert_eq!(failed(&o), Reason::FileSizeLimit, "{o:?}");
}

#[test]
fn many_programs_run_at_once() {
    let s = with(SandboxConfig { max_concurrent: 8, ..SandboxConfig::default() });
    let programs: Vec<String> =
        (0..8).map(|i| format!("import time\ntime.sleep(1)\nprint({i})\n")).collect();
    let start = Instant::now();
    let outcomes = s.run_many(&programs);
    let elapsed = start.elapsed();
    for (i, o) in outcomes.into_iter().enumerate() {
        let o = o.unwrap();
        assert_eq!(o.stdout, format!("{i}\n"), "{o:?}");
    }
    assert!(
        elapsed < Duration::from_secs(6),
        "8 one-second programs took {elapsed:?}: not concurrent"
    );
}

#[test]
fn a_parent_with_a_large_address_space_can_run_programs() {
    // Like a rollout worker holding libtorch: far more address space than a program may have.
    let size = 16usize << 30;
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        eprintln!("NOT CHECKED: this machine refuses a 16 GiB reservation (strict overcommit)");
        return;
    }
    let o = sandbox().run("print(sum(range(10)))\n").unwrap();
    unsafe { libc::munmap(addr, size) };
    assert_eq!(o.status, Status::Passed, "{o:?}");
    assert_eq!(o.stdout, "45\n");
}

#[test]
fn a_missing_python_is_a_clear_error() {
    let err = Sandbox::new(SandboxConfig {
        python: Some("/nonexistent/python3".into()),
        ..SandboxConfig::default()
    })
    .unwrap_err();
    assert!(matches!(err, SandboxError::PythonMissing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("install Python 3") && msg.contains("COMAS_PYTHON"), "{msg}");
}

#[test]
fn code_grading_runs_blocks_against_the_checker() {
    let s = sandbox();
    let checker = "assert add(1, 2) == 3\nassert add(-1, 1) == 0";
    let good = "```python\ndef add(a, b):\n    return a + b\n```";
    let bad = "```python\ndef add(a, b):\n    return a - b\n```";
    let v = grade_code(s, good, checker, CodeGrading::AnyBlock).unwrap();
    assert!(v.correct && v.failure.is_none() && v.blocks == 1, "{v}");
    let v = grade_code(s, bad, checker, CodeGrading::AnyBlock).unwrap();
    assert_eq!(v.failure, Some(Failure::Run(Reason::ExitCode(1))), "{v}");
    assert!(!v.correct);
    let v = grade_code(s, "def add(a, b): return a + b", checker, CodeGrading::AnyBlock).unwrap();
    assert_eq!(v.failure, Some(Failure::NoCodeBlock));
    assert!(v.runs.is_empty());

    // Good then bad: any_block passes, last_block fails. Bad then good: both pass.
    let both = format!("{good}\nthen\n{bad}");
    let v = grade_code(s, &both, checker, CodeGrading::AnyBlock).unwrap();
    assert!(v.correct && v.runs.len() == 1 && v.blocks == 2, "{v}");
    let v = grade_code(s, &both, checker, CodeGrading::LastBlock).unwrap();
    assert!(!v.correct && v.runs.len() == 1, "{v}");
    let v = grade_code(s, &format!("{bad}\n{good}"), checker, CodeGrading::LastBlock).unwrap();
    assert!(v.correct, "{v}");

    // `from typing import *` is there; a hanging answer is a timeout, not a hang.
    let typed = "```python\ndef add(a: int, b: int) -> Optional[int]:\n    return a + b\n```";
    assert!(grade_code(s, typed, checker, CodeGrading::AnyBlock).unwrap().correct);
    let hang = "```python\ndef add(a, b):\n    while True:\n        pass\n```";
    let start = Instant::now();
    let v = grade_code(s, hang, checker, CodeGrading::AnyBlock).unwrap();
    assert_eq!(v.failure, Some(Failure::Run(Reason::Timeout)), "{v}");
    assert!(start.elapsed() < Duration::from_secs(6), "{:?}", start.elapsed());
}

/// A run starts with its input files and hands back the files it saves that match a pattern:
/// regular files only, never a link to something outside, and a bad input name is an error.
#[test]
fn a_run_starts_with_its_files_and_hands_back_what_it_saves() {
    use comas_sandbox::{RunFile, RunFiles};
    let files = RunFiles {
        inputs: vec![
            RunFile { name: "train.csv".into(), bytes: b"x,y\n1,2\n".to_vec() },
            RunFile { name: "X_train.pkl".into(), bytes: vec![0, 1, 2] },
        ],
        fetch: vec!["*.pkl".into(), "submission.csv".into()],
    };
    let program = "import os\nprint(sorted(os.listdir('.')))\nprint(open('train.csv').read().splitlines()[1])\n\
                   open('model.pkl', 'wb').write(b'M' * 10)\nopen('submission.csv', 'w').write('id,y\\n1,3\\n')\nopen('notes.txt', 'w').write('kept here')\n\
                   os.symlink('/etc/hostname', 'stolen.pkl')\n";
    let (o, out, note) =
        sandbox().run_with_files(program, Duration::from_secs(30), &files).unwrap();
    assert_eq!(o.status, Status::Passed, "{o:?}");
    assert_eq!(o.stdout, "['X_train.pkl', 'main.py', 'train.csv']\n1,2\n");
    let names: Vec<&str> = out.iter().map(|f| f.name.as_str()).collect();
    // The input that matches a pattern comes back too (the workspace keeps it); the link does not.
    assert_eq!(names, vec!["X_train.pkl", "model.pkl", "submission.csv"]);
    assert_eq!(out[1].bytes, vec![b'M'; 10]);
    assert_eq!(out[2].bytes, b"id,y\n1,3\n");
    assert!(note.is_none());
    let bad = RunFiles {
        inputs: vec![RunFile { name: "../escape".into(), bytes: Vec::new() }],
        fetch: Vec::new(),
    };
    assert!(matches!(
        sandbox().run_with_files("pass", Duration::from_secs(5), &bad),
        Err(SandboxError::BadFileName(_))
    ));
}
