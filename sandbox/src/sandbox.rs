//! The sandbox: configuration, the start-up probe, and one run from spawn to cleanup.
use crate::cgroup::{Parent, RunCgroups};
use crate::child::{self, ChildPlan, Namespaces, STATUS_RECORD};
use crate::error::SandboxError;
use crate::files::{RunFile, RunFiles};
use crate::outcome::{classify, Observed, Outcome, RawExit};
use crate::protect::{self, Protections};
use seccompiler::BpfProgram;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Limits and switches of a sandbox. The defaults suit grading: a 3 s wall clock (spec 8.3).
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// The interpreter; None: `$COMAS_PYTHON`, else `python3` on PATH.
    pub python: Option<PathBuf>,
    /// Wall-clock limit of a run (per call overridable).
    pub timeout: Duration,
    /// CPU-time limit; None: the timeout plus one second, rounded up to whole seconds.
    pub cpu_time: Option<Duration>,
    /// Address space per process (`RLIMIT_AS`) and, with a memory cgroup, memory of the whole run.
    pub memory_bytes: u64,
    /// Processes (threads included) a run may have at once.
    pub max_processes: u64,
    /// Largest file a run may write (`RLIMIT_FSIZE`).
    pub max_file_bytes: u64,
    /// Bytes kept of stdout and of stderr each; the rest is read and dropped.
    pub output_cap: usize,
    /// Runs at once; further calls wait for a slot.
    pub max_concurrent: usize,
    /// Where run directories are made; None: the system temporary directory.
    pub work_dir: Option<PathBuf>,
    /// Switches, for tests and for machines where a mechanism misbehaves. Each one is used only
    /// where the machine allows it (see [`Sandbox::protections`]).
    pub namespaces: bool,
    pub seccomp: bool,
    pub landlock: bool,
    pub cgroups: bool,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            python: None,
            timeout: Duration::from_secs(3),
            cpu_time: None,
            memory_bytes: 4 << 30,
            max_processes: 64,
            max_file_bytes: 16 << 20,
            output_cap: 64 << 10,
            max_concurrent: std::thread::available_parallelism().map_or(2, |n| n.get()),
            work_dir: None,
            namespaces: true,
            seccomp: true,
            landlock: true,
            cgroups: true,
        }
    }
}

/// The parts of a run's setup, so the probe can try each alone.
#[derive(Debug, Clone, Copy)]
struct Plan {
    namespaces: Namespaces,
    landlock: bool,
    seccomp: bool,
    pids_cgroup: bool,
    memory_cgroup: bool,
}

const NOTHING: Plan = Plan {
    namespaces: Namespaces::None,
    landlock: false,
    seccomp: false,
    pids_cgroup: false,
    memory_cgroup: false,
};

/// Runs Python programs one process tree each, confined (see the crate docs). Shareable between
/// threads; at most `max_concurrent` runs go at once.
pub struct Sandbox {
    config: SandboxConfig,
    python: PathBuf,
    python_version: String,
    work_dir: PathBuf,
    plan: Plan,
    protections: Protections,
    landlock_abi: Option<i32>,
    seccomp: Option<Arc<BpfProgram>>,
    pids_parent: Option<Parent>,
    memory_parent: Option<Parent>,
    slots: Slots,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("python", &self.python)
            .field("protections", &self.protections)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Finds Python and probes which protections this machine allows. Fails when there is no
    /// working interpreter; a missing protection is logged and listed in [`Sandbox::protections`].
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        let requested = config
            .python
            .clone()
            .or_else(|| {
                std::env::var_os("COMAS_PYTHON").filter(|s| !s.is_empty()).map(PathBuf::from)
            })
            .unwrap_or_else(|| "python3".into());
        let (python, python_version) = resolve_python(&requested)?;
        let work_dir = config.work_dir.clone().unwrap_or_else(std::env::temp_dir);
        let seccomp = if config.seccomp {
            match protect::seccomp_program() {
                Ok(p) => Some(Arc::new(p)),
                Err(e) => {
                    tracing::warn!(error = %e, "seccomp filter unavailable");
                    None
                }
            }
        } else {
            None
        };
        let find = |c| if config.cgroups { Parent::find(c) } else { None };
        let (pids_parent, memory_parent) = (find("pids"), find("memory"));
        for p in pids_parent.iter().chain(&memory_parent) {
            p.remove_stale();
        }
        let slots = Slots::new(config.max_concurrent.max(1));
        let mut sandbox = Sandbox {
            landlock_abi: if config.landlock { protect::landlock_abi() } else { None },
            config,
            python,
            python_version,
            work_dir,
            plan: NOTHING,
            protections: Protections {
                network_namespace: false,
                pid_namespace: false,
                user_namespace: false,
                seccomp: false,
                landlock_abi: None,
                pids_cgroup: false,
                memory_cgroup: false,
                rlimit_nproc: false,
            },
            seccomp,
            pids_parent,
            memory_parent,
            slots,
        };
        sandbox.probe()?;
        Ok(sandbox)
    }

    /// With the default configuration.
    pub fn with_defaults() -> Result<Sandbox, SandboxError> {
        Sandbox::new(SandboxConfig::default())
    }

    /// Tries each protection alone (the child exits right before exec), keeps those that work,
    /// then checks that Python runs under all of them together.
    fn probe(&mut self) -> Result<(), SandboxError> {
        let works = |s: &Sandbox, plan: Plan| {
            s.execute("", s.config.timeout, plan, true, None)
                .map(|(o, _)| o.passed())
                .unwrap_or(false)
        };
        let mut plan = NOTHING;
        if self.config.namespaces {
            let candidates: &[Namespaces] = if unsafe { libc::geteuid() } == 0 {
                &[Namespaces::Privileged, Namespaces::User]
            } else {
                &[Namespaces::User]
            };
            plan.namespaces = candidates
                .iter()
                .copied()
                .find(|&ns| works(self, Plan { namespaces: ns, ..NOTHING }))
                .unwrap_or(Namespaces::None);
        }
        plan.landlock =
            self.landlock_abi.is_some() && works(self, Plan { landlock: true, ..NOTHING });
        plan.seccomp = self.seccomp.is_some() && works(self, Plan { seccomp: true, ..NOTHING });
        plan.pids_cgroup =
            self.pids_parent.is_some() && works(self, Plan { pids_cgroup: true, ..NOTHING });
        plan.memory_cgroup =
            self.memory_parent.is_some() && works(self, Plan { memory_cgroup: true, ..NOTHING });
        let outcome = self
            .execute("import sys\nsys.exit(0)\n", Duration::from_secs(30), plan, false, None)?
            .0;
        if !outcome.passed() {
            return Err(SandboxError::PythonBroken {
                python: self.python.clone(),
                detail: format!(
                    "a trivial program failed in the sandbox ({:?}): {}",
                    outcome.status,
                    outcome.stderr.trim()
                ),
            });
        }
        self.plan = plan;
        self.protections = Protections {
            network_namespace: plan.namespaces.isolated(),
            pid_namespace: plan.namespaces.isolated(),
            user_namespace: plan.namespaces == Namespaces::User,
            seccomp: plan.seccomp,
            landlock_abi: if plan.landlock { self.landlock_abi } else { None },
            pids_cgroup: plan.pids_cgroup,
            memory_cgroup: plan.memory_cgroup,
            rlimit_nproc: plan.namespaces == Namespaces::User,
        };
        let gaps = self.protections.gaps();
        if gaps.is_empty() {
            tracing::info!(python = %self.python.display(), version = %self.python_version, protections = ?self.protections, "sandbox ready");
        } else {
            tracing::warn!(python = %self.python.display(), version = %self.python_version, gaps = ?gaps, "sandbox ready with protections missing");
        }
        Ok(())
    }

    /// What this machine allows; [`Protections::gaps`] says what is missing.
    pub fn protections(&self) -> &Protections {
        &self.protections
    }

    /// The interpreter runs use (the shim or link resolved) and its version.
    pub fn python(&self) -> (&Path, &str) {
        (&self.python, &self.python_version)
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Runs `program` (Python source) with the configured timeout.
    pub fn run(&self, program: &str) -> Result<Outcome, SandboxError> {
        self.run_with_timeout(program, self.config.timeout)
    }

    /// Runs `program` with a wall-clock limit of `timeout`.
    pub fn run_with_timeout(
        &self,
        program: &str,
        timeout: Duration,
    ) -> Result<Outcome, SandboxError> {
        self.execute(program, timeout, self.plan, false, None).map(|(o, _)| o)
    }

    /// Runs `program` in a folder that starts with `files.inputs`, and hands back the files it
    /// leaves there that match `files.fetch` (with a note when some were too large to return).
    pub fn run_with_files(
        &self,
        program: &str,
        timeout: Duration,
        files: &RunFiles,
    ) -> Result<(Outcome, Vec<RunFile>, Option<String>), SandboxError> {
        let (outcome, fetched) = self.execute(program, timeout, self.plan, false, Some(files))?;
        let (out, note) = fetched.unwrap_or_default();
        Ok((outcome, out, note))
    }

    /// Runs every program, up to `max_concurrent` at once; results in input order.
    pub fn run_many<S: AsRef<str> + Sync>(
        &self,
        programs: &[S],
    ) -> Vec<Result<Outcome, SandboxError>> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Mutex<Option<Result<Outcome, SandboxError>>>> =
            programs.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..self.config.max_concurrent.max(1).min(programs.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(program) = programs.get(i) else { break };
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(self.run(program.as_ref()));
                });
            }
        });
        results
            .into_iter()
            .map(|m| {
                m.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every program was run")
            })
            .collect()
    }

    fn cpu_limit(&self, timeout: Duration) -> Duration {
        let t = self.config.cpu_time.unwrap_or(timeout + Duration::from_secs(1));
        Duration::from_secs(t.as_secs() + u64::from(t.subsec_nanos() > 0))
            .max(Duration::from_secs(1))
    }

    #[allow(clippy::type_complexity)]
    fn execute(
        &self,
        program: &str,
        timeout: Duration,
        plan: Plan,
        probe_exit: bool,
        files: Option<&RunFiles>,
    ) -> Result<(Outcome, Option<(Vec<RunFile>, Option<String>)>), SandboxError> {
        let _slot = self.slots.acquire();
        let setup = |what| move |source| SandboxError::Setup { what, source };
        let dir = tempfile::Builder::new()
            .prefix("comas-sandbox-")
            .tempdir_in(&self.work_dir)
            .map_err(setup("creating the run directory"))?;
        std::fs::write(dir.path().join("main.py"), program)
            .map_err(setup("writing the program"))?;
        if let Some(f) = files {
            crate::files::write_inputs(dir.path(), f)?;
        }

        let parents: Vec<&Parent> =
            [(plan.pids_cgroup, &self.pids_parent), (plan.memory_cgroup, &self.memory_parent)]
                .into_iter()
                .filter_map(|(on, p)| if on { p.as_ref() } else { None })
                .collect();
        // Two processes of the namespace setup (C and P) count too.
        let cgroups = if parents.is_empty() {
            None
        } else {
            Some(
                RunCgroups::create(
                    &parents,
                    self.config.max_processes + 2,
                    self.config.memory_bytes,
                )
                .map_err(setup("creating the run cgroups"))?,
            )
        };
        let landlock = match (plan.landlock, self.landlock_abi) {
            (true, Some(abi)) => {
                Some(protect::landlock_ruleset(abi, dir.path()).map_err(SandboxError::Protection)?)
            }
            _ => None,
        };
        let status_pipe = if plan.namespaces.isolated() {
            Some(pipe().map_err(setup("creating the status pipe"))?)
        } else {
            None
        };

        let cpu_limit = self.cpu_limit(timeout);
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let mut child_plan = ChildPlan {
            cgroup_procs: cgroups.as_ref().map(RunCgroups::procs_fds).unwrap_or_default(),
            rlimits: vec![
                (libc::RLIMIT_CORE, 0),
                (libc::RLIMIT_CPU, cpu_limit.as_secs()),
                (libc::RLIMIT_AS, self.config.memory_bytes),
                (libc::RLIMIT_FSIZE, self.config.max_file_bytes),
            ],
            nproc: (plan.namespaces == Namespaces::User).then_some(self.config.max_processes + 2),
            namespaces: plan.namespaces,
            uid_map: format!("{uid} {uid} 1").into_bytes(),
            gid_map: format!("{gid} {gid} 1").into_bytes(),
            landlock,
            seccomp: if plan.seccomp { self.seccomp.clone() } else { None },
            status_fd: status_pipe.as_ref().map_or(-1, |(_, w)| w.as_raw_fd()),
            probe_exit,
        };

        let mut cmd = Command::new(&self.python);
        cmd.arg("-B")
            .arg("main.py")
            .current_dir(dir.path())
            .env_clear()
            .envs(self.child_env(dir.path()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: one killpg reaches everything it forks (that stays in the group).
            .process_group(0);
        // SAFETY: `child::setup` only makes async-signal-safe calls on data prepared above.
        unsafe { cmd.pre_exec(move || child::setup(&mut child_plan)) };
        let start = Instant::now();
        let spawned = cmd.spawn();
        // The plan (Landlock ruleset fd) and our copy of the status pipe's write end go now, so
        // that only the child side holds them.
        drop(cmd);
        let mut status_read = status_pipe.map(|(r, _w)| StatusPipe::new(r));
        let mut child = spawned.map_err(SandboxError::Spawn)?;
        let pid = child.id() as libc::pid_t;
        let mut out = Capture::new(child.stdout.take().map(OwnedFd::from), self.config.output_cap);
        let mut err = Capture::new(child.stderr.take().map(OwnedFd::from), self.config.output_cap);
        drop(child);

        let watched = watch(pid, start + timeout, &mut out, &mut err, status_read.as_mut());
        let wall_time = watched.exited_at.duration_since(start);
        // Everything still in the run's cgroups has left the process group: kill it too, then
        // give the pipes a moment to reach end-of-file (their last writers are dying).
        if let Some(c) = &cgroups {
            c.kill_all();
        }
        drain(&mut out, &mut err, Instant::now() + Duration::from_secs(1));

        let (exit, cpu_time) = match status_read.as_mut() {
            Some(pipe) => {
                pipe.read();
                pipe.program.map_or((None, watched.cpu_time), |(e, cpu)| (Some(e), cpu))
            }
            None => (watched.exit, watched.cpu_time),
        };
        let oom_killed = cgroups.as_ref().is_some_and(RunCgroups::oom_killed);
        let process_limit_hit = cgroups.as_ref().is_some_and(RunCgroups::process_limit_hit);
        drop(cgroups);
        let (stdout, stdout_truncated) = out.finish();
        let (stderr, stderr_truncated) = err.finish();
        let status = classify(&Observed {
            exit,
            timed_out: watched.timed_out,
            cpu_time,
            cpu_limit,
            oom_killed,
            process_limit_hit,
            stderr: &stderr,
        });
        let fetched = files.map(|f| crate::files::fetch(dir.path(), &f.fetch));
        remove_dir(dir);
        if !probe_exit {
            tracing::debug!(
                ?status,
                wall_ms = wall_time.as_millis() as u64,
                cpu_ms = cpu_time.as_millis() as u64,
                "sandbox run"
            );
        }
        Ok((
            Outcome {
                status,
                stdout,
                stderr,
                stdout_truncated,
                stderr_truncated,
                wall_time,
                cpu_time,
            },
            fetched,
        ))
    }

    fn child_env(&self, dir: &Path) -> Vec<(&'static str, OsString)> {
        let mut path = OsString::new();
        if let Some(bin) = self.python.parent() {
            path.push(bin);
            path.push(":");
        }
        path.push("/usr/local/bin:/usr/bin:/bin");
        vec![
            ("PATH", path),
            ("HOME", dir.into()),
            ("TMPDIR", dir.into()),
            ("LANG", "C.UTF-8".into()),
            ("PYTHONIOENCODING", "utf-8".into()),
            // Same set and dict orders on every run of the same program: grading is reproducible.
            ("PYTHONHASHSEED", "0".into()),
            ("PYTHONDONTWRITEBYTECODE", "1".into()),
            // Numeric libraries would start a thread per core, each reserving address space.
            ("OMP_NUM_THREADS", "1".into()),
            ("OPENBLAS_NUM_THREADS", "1".into()),
            ("MKL_NUM_THREADS", "1".into()),
        ]
    }
}

/// Runs `python -c` to learn the real interpreter behind a shim or link, and its version.
fn resolve_python(requested: &Path) -> Result<(PathBuf, String), SandboxError> {
    let out = Command::new(requested)
        .args(["-c", "import sys; print(sys.executable); print(sys.version.split()[0]); sys.exit(0 if sys.version_info >= (3, 8) else 3)"])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| SandboxError::PythonMissing { python: requested.to_path_buf(), source })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let (exe, version) =
        (lines.next().unwrap_or("").trim(), lines.next().unwrap_or("").trim().to_string());
    if !out.status.success() {
        let detail = if out.status.code() == Some(3) {
            format!("Python {version} is too old, 3.8 or newer is needed")
        } else {
            String::from_utf8_lossy(&out.stderr).trim().to_string()
        };
        return Err(SandboxError::PythonBroken { python: requested.to_path_buf(), detail });
    }
    let exe = if exe.is_empty() { requested.to_path_buf() } else { PathBuf::from(exe) };
    Ok((exe, version))
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The read end of the status pipe (PID namespace runs): what C and P report.
struct StatusPipe {
    fd: OwnedFd,
    buf: Vec<u8>,
    /// Host pid of the namespace's init (P).
    init: Option<libc::pid_t>,
    /// The program's wait status and CPU time.
    program: Option<(RawExit, Duration)>,
}

impl StatusPipe {
    fn new(fd: OwnedFd) -> StatusPipe {
        StatusPipe { fd, buf: Vec::new(), init: None, program: None }
    }

    /// Reads the records that have arrived (the pipe is non-blocking).
    fn read(&mut self) {
        let mut chunk = [0u8; 4 * STATUS_RECORD];
        loop {
            let n =
                unsafe { libc::read(self.fd.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
            if n <= 0 {
                break;
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
        }
        while self.buf.len() >= STATUS_RECORD {
            match child::parse_record(&self.buf[..STATUS_RECORD]) {
                (b'C', pid, _) => self.init = Some(pid),
                (b'P', status, cpu) => {
                    self.program = Some((raw_exit(status), Duration::from_micros(cpu)))
                }
                _ => {}
            }
            self.buf.drain(..STATUS_RECORD);
        }
    }
}

/// Kills the namespace's init P (the kernel then kills everything in the namespace, and C reaps
/// P once it is empty). A pidfd pins the process, and P's parent must be C, so a recycled pid
/// is never signalled.
fn kill_init(init: libc::pid_t, supervisor: libc::pid_t) -> bool {
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, init, 0) };
    if fd < 0 {
        return false;
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let stat = std::fs::read_to_string(format!("/proc/{init}/stat")).unwrap_or_default();
    let parent = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<libc::pid_t>().ok());
    if parent != Some(supervisor) {
        return false;
    }
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

fn raw_exit(status: i32) -> RawExit {
    if libc::WIFSIGNALED(status) {
        RawExit::Signal(libc::WTERMSIG(status))
    } else {
        RawExit::Code(libc::WEXITSTATUS(status))
    }
}

struct Watched {
    exit: Option<RawExit>,
    timed_out: bool,
    cpu_time: Duration,
    exited_at: Instant,
}

/// Waits for the child while reading its output. At the deadline it kills the namespace's init
/// (C then exits once the namespace is empty) or, without one, the process group. Leftovers in
/// the group are killed before the child is reaped, so the group id cannot be reused by then.
fn watch(
    pid: libc::pid_t,
    deadline: Instant,
    out: &mut Capture,
    err: &mut Capture,
    mut status: Option<&mut StatusPipe>,
) -> Watched {
    // A pidfd wakes poll the moment the child exits; without one, poll in short steps.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) });
    let (mut timed_out, mut forced) = (false, false);
    loop {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        if rc < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        // rc < 0 otherwise means the child is gone (reaped by someone else): the status is lost.
        let exited = rc == 0 && unsafe { info.si_pid() } == pid;
        if exited || rc < 0 {
            let exited_at = Instant::now();
            unsafe { libc::killpg(pid, libc::SIGKILL) };
            let mut status = 0;
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            let reaped = loop {
                let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
                if r >= 0
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    break r == pid;
                }
            };
            let micros = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            let exit = if timed_out || !reaped { None } else { Some(raw_exit(status)) };
            return Watched {
                exit,
                timed_out,
                cpu_time: micros(usage.ru_utime) + micros(usage.ru_stime),
                exited_at,
            };
        }
        let now = Instant::now();
        if now >= deadline && !timed_out {
            timed_out = true;
            let init = status.as_deref_mut().and_then(|s| {
                s.read();
                s.init
            });
            if !init.is_some_and(|init| kill_init(init, pid)) {
                unsafe { libc::killpg(pid, libc::SIGKILL) };
            }
            continue;
        }
        // The namespace should be gone within moments; if not, fall back to the process group.
        if timed_out && !forced && now >= deadline + Duration::from_secs(5) {
            forced = true;
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
        let step = if pidfd.is_some() {
            deadline.saturating_duration_since(now).min(Duration::from_millis(100))
        } else {
            Duration::from_millis(5)
        };
        poll_once(out, err, pidfd.as_ref(), step);
    }
}

/// Reads whatever the pipes hold until both end or `until` passes.
fn drain(out: &mut Capture, err: &mut Capture, until: Instant) {
    while !(out.done() && err.done()) {
        let now = Instant::now();
        if now >= until {
            break;
        }
        poll_once(out, err, None, until - now);
    }
}

/// One poll over the open pipes (and the pidfd), reading what is ready.
fn poll_once(out: &mut Capture, err: &mut Capture, pidfd: Option<&OwnedFd>, timeout: Duration) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(3);
    for c in [&*out, &*err] {
        if let Some(fd) = &c.fd {
            fds.push(libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
    }
    if let Some(p) = pidfd {
        fds.push(libc::pollfd { fd: p.as_raw_fd(), events: libc::POLLIN, revents: 0 });
    }
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return;
    }
    for pfd in &fds {
        if pfd.revents == 0 {
            continue;
        }
        for c in [&mut *out, &mut *err] {
            if c.fd.as_ref().is_some_and(|f| f.as_raw_fd() == pfd.fd) {
                c.read_some();
            }
        }
    }
}

/// One output stream: the first `cap` bytes, and the last few KiB once it overflows.
struct Capture {
    fd: Option<OwnedFd>,
    head: Vec<u8>,
    tail: Vec<u8>,
    total: usize,
    cap: usize,
}

const TAIL: usize = 4096;

impl Capture {
    fn new(fd: Option<OwnedFd>, cap: usize) -> Capture {
        Capture { fd, head: Vec::new(), tail: Vec::new(), total: 0, cap }
    }

    fn done(&self) -> bool {
        self.fd.is_none()
    }

    fn read_some(&mut self) {
        let Some(fd) = &self.fd else { return };
        let mut buf = [0u8; 16384];
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => self.fd = None,
            n if n > 0 => self.push(&buf[..n as usize]),
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => self.fd = None,
        }
    }

    fn push(&mut self, data: &[u8]) {
        self.total += data.len();
        let room = self.cap.saturating_sub(self.head.len());
        let (keep, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(keep);
        if !rest.is_empty() {
            self.tail.extend_from_slice(rest);
            if self.tail.len() > 2 * TAIL {
                self.tail.drain(..self.tail.len() - TAIL);
            }
        }
    }

    fn finish(mut self) -> (String, bool) {
        let truncated = self.total > self.head.len();
        if truncated {
            let tail_len = self.tail.len().min(TAIL);
            let tail = &self.tail[self.tail.len() - tail_len..];
            let omitted = self.total - self.head.len() - tail_len;
            let mut text = String::from_utf8_lossy(&self.head).into_owned();
            if omitted > 0 {
                text.push_str(&format!("\n[... {omitted} bytes omitted ...]\n"));
            }
            text.push_str(&String::from_utf8_lossy(tail));
            self.head.clear();
            return (text, true);
        }
        (String::from_utf8_lossy(&self.head).into_owned(), false)
    }
}

/// Removes a run directory, making it writable first if the program locked parts of it.
fn remove_dir(dir: tempfile::TempDir) {
    let path = dir.path().to_path_buf();
    if dir.close().is_ok() {
        return;
    }
    let _ = Command::new("chmod").args(["-R", "u+rwx"]).arg(&path).status();
    if let Err(e) = std::fs::remove_dir_all(&path) {
        tracing::warn!(dir = %path.display(), error = %e, "could not remove a sandbox run directory");
    }
}

/// A counting semaphore for run slots.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(n: usize) -> Slots {
        Slots { free: Mutex::new(n), freed: Condvar::new() }
    }

    fn acquire(&self) -> Slot<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}
