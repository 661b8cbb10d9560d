//! One vLLM OpenAI server per base model: started by the worker as a child process (its own
//! process group, so vLLM's engine process goes with it), or one already running that the
//! worker is pointed at. A started server is stopped when the worker drops it.
use super::VllmError;
use comas_service::openai::Endpoint;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The name a started server serves its base model under.
pub const BASE_NAME: &str = "base";
/// LoRA ranks vLLM accepts for `--max-lora-rank`.
const LORA_RANKS: [i64; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];
/// Bytes of a server's log quoted in an error.
const LOG_TAIL: u64 = 3000;

/// How a worker runs vLLM (its `--vllm-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct VllmSettings {
    /// A running server (`http://host:port`) to use instead of starting one; it must serve the
    /// job's one base model, under `served_name`.
    pub url: Option<String>,
    pub served_name: String,
    /// The Python that has vLLM (`scripts/setup-vllm.sh` makes `.venv-vllm`).
    pub python: PathBuf,
    /// Arguments added to the server's command line.
    pub extra_args: Vec<String>,
    /// KV-cache memory of a server on the CPU, in GiB (`VLLM_CPU_KVCACHE_SPACE`).
    pub cpu_kv_gib: u32,
    /// Threads of a server on the CPU (its OpenMP threads).
    pub cpu_threads: usize,
    /// How long a server may take to start (loading, compiling, allocating its cache).
    pub startup: Duration,
    /// The longest prompt plus completion a server takes (capped by each model's context).
    pub max_model_len: usize,
    /// Where the servers run: `cpu`, `cuda` or `cuda:N` (vLLM's device, not comas's).
    pub device: String,
    /// Folder for the servers' logs and the adapters and weights handed to them.
    pub work_dir: PathBuf,
}

/// What one server must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSpec {
    pub model_dir: PathBuf,
    /// `float32`, `bfloat16`, … (comas's names are vLLM's).
    pub dtype: String,
    /// The longest prompt plus completion.
    pub max_model_len: usize,
    /// The largest LoRA rank of its agents and how many adapters it holds at once, if any.
    pub lora: Option<(i64, usize)>,
    /// `cpu`, `cuda` or `cuda:N`.
    pub device: String,
}

pub struct VllmServer {
    pub endpoint: Endpoint,
    pub served_name: String,
    /// Whether its requests carry the turns' seeds (not on the CPU: see `Generation::seeded`).
    pub seeded: bool,
    child: std::sync::Mutex<Option<Child>>,
    log: Option<PathBuf>,
}

/// Debian's and Ubuntu's tcmalloc, preloaded into CPU servers where installed.
const TCMALLOC: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
    "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
];

/// `VLLM_CPU_OMP_THREADS_BIND` for a CPU server of `threads` threads whose worker may run on
/// the CPUs `allowed`: bound to them where they are no more than its threads (a worker given
/// its own cores: a Kubernetes cpuset, taskset, or a machine of that size), unbound otherwise,
/// since workers sharing a larger machine would each bind to the same first cores. Bound and
/// with tcmalloc preloaded, a server on 2 cores generated 1.5 to 1.8 times the tokens per
/// second of one with neither (experiments/vllm-rollout/server_decode.py).
pub fn cpu_binding(allowed: &[usize], threads: usize) -> String {
    if allowed.is_empty() || allowed.len() > threads {
        return "nobind".into();
    }
    allowed.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The CPUs this process may run on (empty where the kernel does not say).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// The smallest rank vLLM accepts that holds `r`.
pub fn lora_rank_bound(r: i64) -> Result<i64, VllmError> {
    LORA_RANKS.iter().copied().find(|&k| k >= r).ok_or(VllmError::LoraRank(r))
}

/// The last bytes of a log file, for an error message.
pub fn log_tail(path: &Path) -> String {
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

/// Whether `python` can import vLLM: checked when a worker starts, so a missing install is a
/// clear error at once rather than at the first job.
pub fn check_python(python: &Path) -> Result<(), VllmError> {
    let out = Command::new(python)
        .args(["-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"])
        .env("VLLM_TARGET_DEVICE", "cpu")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| VllmError::NoPython { python: python.to_path_buf(), err: e.to_string() })?;
    if out.status.success() {
        tracing::info!(python = %python.display(), version = %String::from_utf8_lossy(&out.stdout), "vLLM found");
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    Err(VllmError::NoPython { python: python.to_path_buf(), err: last.to_string() })
}

impl VllmServer {
    /// The server `settings.url` names, once it answers its health check.
    pub fn attach(settings: &VllmSettings, url: &str) -> Result<Self, VllmError> {
        let endpoint = Endpoint::parse(&format!("{}/v1", url.trim_end_matches('/')), None)
            .map_err(|e| VllmError::Url(e.to_string()))?;
        let s = Self {
            endpoint,
            served_name: settings.served_name.clone(),
            seeded: settings.device != "cpu",
            child: std::sync::Mutex::new(None),
            log: None,
        };
        s.wait_healthy(settings.startup)?;
        Ok(s)
    }

    /// Starts a server for `spec` and waits until it answers (at most `settings.startup`).
    pub fn start(settings: &VllmSettings, spec: &ServeSpec, tag: &str) -> Result<Self, VllmError> {
        let port = comas_service::port::spare_port().map_err(VllmError::Spawn)?;
        // vLLM's own ports (its process group's rendezvous) are otherwise bound to port 0 and
        // released before use, the race `spare_port` avoids; from VLLM_PORT up they are not.
        let inner_port = comas_service::port::spare_port().map_err(VllmError::Spawn)?;
        std::fs::create_dir_all(&settings.work_dir).map_err(VllmError::Spawn)?;
        let log = settings.work_dir.join(format!("vllm-{tag}.log"));
        let out = std::fs::File::create(&log).map_err(VllmError::Spawn)?;
        let err = out.try_clone().map_err(VllmError::Spawn)?;
        let mut cmd = Command::new(&settings.python);
        cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(&spec.model_dir)
            .args(["--served-model-name", BASE_NAME, "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["--dtype", &spec.dtype, "--max-model-len"])
            .arg(spec.max_model_len.to_string())
            // The learner's quantity: log p under softmax(logits / T), after the guide's mask.
            .args(["--logprobs-mode", "processed_logprobs"])
            // llguidance, the library comas's own engine guides tails with.
            .args(["--structured-outputs-config.backend", "guidance"])
            .args(["--seed", "0", "--disable-log-stats"])
            // Reloading full weights goes through the dev-mode collective_rpc route.
            .env("VLLM_SERVER_DEV_MODE", "1")
            .env("VLLM_PORT", inner_port.to_string())
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("HF_HUB_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        if let Some((rank, adapters)) = spec.lora {
            cmd.args(["--enable-lora", "--max-lora-rank"])
                .arg(lora_rank_bound(rank)?.to_string())
                .args(["--max-loras"])
                .arg(adapters.max(1).to_string());
        }
        if spec.device == "cpu" {
            let binding = cpu_binding(&allowed_cpus(), settings.cpu_threads);
            tracing::info!(%binding, "the server's OpenMP threads");
            cmd.env("VLLM_TARGET_DEVICE", "cpu")
                .env("VLLM_CPU_KVCACHE_SPACE", settings.cpu_kv_gib.to_string())
                .env("OMP_NUM_THREADS", settings.cpu_threads.to_string())
                .env("VLLM_CPU_OMP_THREADS_BIND", binding);
            // vLLM's CPU docs advise preloading tcmalloc (Debian: libtcmalloc-minimal4).
            let tcmalloc = TCMALLOC.iter().map(Path::new).find(|p| p.is_file());
            if let (Some(lib), None) = (tcmalloc, std::env::var_os("LD_PRELOAD")) {
                cmd.env("LD_PRELOAD", lib);
            }
        } else if let Some(n) = spec.device.strip_prefix("cuda:") {
            cmd.env("CUDA_VISIBLE_DEVICES", n);
        }
        cmd.args(&settings.extra_args);
        // SAFETY: prctl(2) in the child before exec; it only sets a flag of the child itself.
        // A worker killed outright (SIGKILL, OOM) never runs its Drop: the server then gets
        // SIGTERM from the kernel, and stops its engine process as on any shutdown.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        tracing::info!(model = %spec.model_dir.display(), port, log = %log.display(), "starting a vLLM server");
        let child = cmd.spawn().map_err(|e| VllmError::NoPython {
            python: settings.python.clone(),
            err: e.to_string(),
        })?;
        let endpoint = Endpoint::parse(&format!("http://127.0.0.1:{port}/v1"), None)
            .map_err(|e| VllmError::Url(e.to_string()))?;
        let s = Self {
            endpoint,
            served_name: BASE_NAME.to_string(),
            seeded: spec.device != "cpu",
            child: std::sync::Mutex::new(Some(child)),
            log: Some(log),
        };
        let started = Instant::now();
        s.wait_healthy(settings.startup)?;
        tracing::info!(port, secs = started.elapsed().as_secs_f64(), "vLLM server ready");
        Ok(s)
    }

    /// Where the server writes, if this worker started it.
    pub fn log(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Whether a started server's process has ended, and how.
    pub fn exited(&self) -> Option<String> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let child = child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    fn wait_healthy(&self, limit: Duration) -> Result<(), VllmError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(VllmError::Spawn)?;
        let started = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                return Err(VllmError::Exited { status, log: self.log_tail() });
            }
            let health = rt.block_on(self.endpoint.call(
                hyper::Method::GET,
                "/health",
                None,
                Duration::from_secs(5),
            ));
            if health.is_ok() {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(VllmError::NotReady {
                    secs: limit.as_secs(),
                    last: health.err().map(|e| e.to_string()).unwrap_or_default(),
                    log: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The end of a started server's log.
    pub fn log_tail(&self) -> String {
        self.log.as_deref().map(log_tail).unwrap_or_default()
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        let taken =
            self.child.lock().map(|mut c| c.take()).unwrap_or_else(|p| p.into_inner().take());
        let Some(mut child) = taken else { return };
        let group = -(child.id() as libc::pid_t);
        // SAFETY: kill(2) on the process group this worker created for the server.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above; whatever of the group is left is stopped for good.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_bound_to_its_workers_cores_only_where_it_has_no_more_than_its_threads() {
        assert_eq!(cpu_binding(&[0, 1], 2), "0,1");
        assert_eq!(cpu_binding(&[4, 5, 9], 4), "4,5,9");
        // More cores than threads: other workers may share them; no core is the server's own.
        assert_eq!(cpu_binding(&[0, 1, 2, 3], 2), "nobind");
        assert_eq!(cpu_binding(&[], 2), "nobind");
        assert!(!allowed_cpus().is_empty(), "this process runs somewhere");
    }

    #[test]
    fn a_lora_rank_is_served_by_the_smallest_rank_vllm_takes_above_it() {
        assert_eq!(
            [1, 4, 8, 9, 64, 512].map(|r| lora_rank_bound(r).unwrap()),
            [1, 8, 8, 16, 64, 512]
        );
        assert!(matches!(lora_rank_bound(513), Err(VllmError::LoraRank(513))));
    }

    #[test]
    fn a_python_without_vllm_is_refused_with_the_install_command() {
        let e = check_python(Path::new("/nonexistent/python")).unwrap_err().to_string();
        assert!(
            e.contains("bash scripts/setup-vllm.sh") && e.contains("/nonexistent/python"),
            "{e}"
        );
        // A Python that runs but lacks the package: its last error line is quoted.
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python");
        std::fs::write(&python, "#!/bin/sh\necho 'Traceback:' >&2\necho \"ModuleNotFoundError: No module named 'vllm'\" >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let e = check_python(&python).unwrap_err().to_string();
        assert!(
            e.contains("ModuleNotFoundError: No module named 'vllm'")
                && e.contains("setup-vllm.sh"),
            "{e}"
        );
    }
}
