//! The sandbox: configuration, the start-up probe, and one run from spawn to cleanup.
use crate::cgroup::{Parent, RunCgroups};
use crate::child::{self, ChildPlan, Namespaces};
use crate::error::SandboxError;
use crate::files::{RunFile, RunFiles};
use crate::outcome::{classify, Observed, Outcome};
use crate::protect::{self, Protections};
use crate::watch::*;
use seccompiler::BpfProgram;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
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
