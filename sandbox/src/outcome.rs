//! What a run ended with, and how the raw exit (status, CPU time, stderr) is read into a reason.
use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// What the program was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Denied {
    /// A socket, connection or name lookup (no network in the sandbox).
    Network,
    /// A file-system write outside the run's directory (`EACCES`/`EROFS`/`EXDEV` on a path).
    Filesystem,
    /// Some other operation the kernel refused (`EPERM`), e.g. a signal to a foreign process.
    Operation,
}

/// Why a run failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Wall-clock limit reached; the whole process tree was killed.
    Timeout,
    /// CPU-time limit reached (`SIGXCPU`, or the hard limit's `SIGKILL`).
    CpuLimit,
    /// An allocation failed under the memory limit (`MemoryError`) or the memory cgroup killed it.
    MemoryLimit,
    /// A fork or thread start failed under the process limit.
    ProcessLimit,
    /// A write went past the file-size limit.
    FileSizeLimit,
    Denied(Denied),
    /// Killed by this signal, for no reason the sandbox set up.
    Signal(i32),
    /// Exited with this non-zero code (an uncaught exception gives 1).
    ExitCode(i32),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Timeout => f.write_str("wall-clock timeout"),
            Reason::CpuLimit => f.write_str("CPU time limit"),
            Reason::MemoryLimit => f.write_str("memory limit"),
            Reason::ProcessLimit => f.write_str("process limit"),
            Reason::FileSizeLimit => f.write_str("file size limit"),
            Reason::Denied(Denied::Network) => f.write_str("denied: network access"),
            Reason::Denied(Denied::Filesystem) => {
                f.write_str("denied: file-system write outside the sandbox directory")
            }
            Reason::Denied(Denied::Operation) => f.write_str("denied: operation not permitted"),
            Reason::Signal(s) => write!(f, "killed by signal {s}"),
            Reason::ExitCode(c) => write!(f, "exit code {c}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed(Reason),
}

/// The result of one run. Output is decoded lossily; a stream longer than the cap keeps its
/// head and its tail (where a traceback ends) around an omission marker.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub status: Status,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub wall_time: Duration,
    /// User + system time of the program and the children it waited for.
    pub cpu_time: Duration,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.status == Status::Passed
    }

    pub fn reason(&self) -> Option<Reason> {
        match self.status {
            Status::Passed => None,
            Status::Failed(r) => Some(r),
        }
    }

    /// The last line of an uncaught Python exception (`"AssertionError"`, `"NameError: ..."`).
    pub fn exception(&self) -> Option<&str> {
        last_exception_line(&self.stderr)
    }
}

/// How the program's process ended, as the sandbox observed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawExit {
    Code(i32),
    Signal(i32),
}

/// Everything the status is read from.
pub(crate) struct Observed<'a> {
    pub exit: Option<RawExit>,
    pub timed_out: bool,
    pub cpu_time: Duration,
    pub cpu_limit: Duration,
    pub oom_killed: bool,
    /// The pids cgroup refused a fork.
    pub process_limit_hit: bool,
    pub stderr: &'a str,
}

pub(crate) fn classify(o: &Observed<'_>) -> Status {
    if o.timed_out {
        return Status::Failed(Reason::Timeout);
    }
    let reason = match o.exit {
        Some(RawExit::Code(0)) => return Status::Passed,
        Some(RawExit::Code(code)) => from_exception(o.stderr).unwrap_or(if o.process_limit_hit {
            Reason::ProcessLimit
        } else {
            Reason::ExitCode(code)
        }),
        Some(RawExit::Signal(sig)) => from_signal(sig, o),
        // The status never arrived: the supervising process was killed from outside.
        None => Reason::Signal(libc::SIGKILL),
    };
    Status::Failed(reason)
}

fn from_signal(sig: i32, o: &Observed<'_>) -> Reason {
    match sig {
        libc::SIGXCPU => Reason::CpuLimit,
        libc::SIGXFSZ => Reason::FileSizeLimit,
        // The hard CPU limit kills with SIGKILL; so does the memory cgroup's OOM killer.
        libc::SIGKILL if o.cpu_time + Duration::from_millis(50) >= o.cpu_limit => Reason::CpuLimit,
        libc::SIGKILL if o.oom_killed => Reason::MemoryLimit,
        libc::SIGSEGV | libc::SIGABRT | libc::SIGBUS if mentions_memory(o.stderr) => {
            Reason::MemoryLimit
        }
        _ => Reason::Signal(sig),
    }
}

fn mentions_memory(stderr: &str) -> bool {
    ["MemoryError", "Cannot allocate memory", "out of memory"].iter().any(|m| stderr.contains(m))
}

/// The final line of a traceback, if stderr ends with one. Frame lines and a lone "Traceback"
/// header are skipped: processes the program forked may still write them after it ended.
fn last_exception_line(stderr: &str) -> Option<&str> {
    last_exception(stderr).map(|(line, _)| line)
}

/// The exception line and the source line of the frame that raised it (empty if none).
fn last_exception(stderr: &str) -> Option<(&str, &str)> {
    let mut lines = stderr.lines().rev().map(str::trim_end);
    let line = lines.find(|l| {
        !l.is_empty()
            && !l.starts_with(char::is_whitespace)
            && !l.starts_with("Traceback (most recent call last)")
    })?;
    let source = lines
        .find(|l| {
            !l.trim().is_empty()
                && !l.trim_start().starts_with('^')
                && !l.trim_start().starts_with('~')
        })
        .filter(|l| l.starts_with("    "))
        .unwrap_or("");
    // `Type` or `Type: message`, where Type is a (dotted) identifier.
    let ty = line.split(':').next().unwrap_or("");
    let is_type = !ty.is_empty()
        && ty.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.')
        && !ty.starts_with(|c: char| c.is_ascii_digit());
    is_type.then_some((line, source))
}

/// A limit or a denial named by the uncaught exception that ended the program.
fn from_exception(stderr: &str) -> Option<Reason> {
    let (line, source) = last_exception(stderr)?;
    let ty = line.split(':').next().unwrap_or("");
    let errno = |n: i32| line.contains(&format!("[Errno {n}]"));
    if ty == "MemoryError" || errno(libc::ENOMEM) {
        return Some(Reason::MemoryLimit);
    }
    // os.fork / threading under the process limit.
    if (ty == "BlockingIOError" && errno(libc::EAGAIN)) || line.contains("can't start new thread") {
        return Some(Reason::ProcessLimit);
    }
    if errno(libc::EFBIG) {
        return Some(Reason::FileSizeLimit);
    }
    // EAFNOSUPPORT is what the seccomp filter answers to an internet socket; the others are what
    // a network namespace without interfaces gives connect, bind and name lookups.
    let network_errnos = [
        libc::EAFNOSUPPORT,
        libc::ENETUNREACH,
        libc::EADDRNOTAVAIL,
        libc::ECONNREFUSED,
        -2,
        -3,
        -5,
    ];
    if network_errnos.iter().any(|&n| errno(n))
        || ty.ends_with("gaierror")
        || ty.ends_with("URLError")
    {
        return Some(Reason::Denied(Denied::Network));
    }
    // Landlock answers EACCES to a TCP connect or bind as well as to a file write.
    let socket_call = ["connect", "bind", "socket", "urlopen", "sendto", "listen"]
        .iter()
        .any(|c| source.contains(c));
    if socket_call && (errno(libc::EACCES) || errno(libc::EPERM)) {
        return Some(Reason::Denied(Denied::Network));
    }
    // Landlock answers EACCES (EXDEV for a cross-directory rename).
    if errno(libc::EACCES) || errno(libc::EROFS) || errno(libc::EXDEV) {
        return Some(Reason::Denied(Denied::Filesystem));
    }
    if ty == "PermissionError" || errno(libc::EPERM) {
        return Some(Reason::Denied(Denied::Operation));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(code: i32, stderr: &str) -> Status {
        classify(&Observed {
            exit: Some(RawExit::Code(code)),
            timed_out: false,
            cpu_time: Duration::ZERO,
            cpu_limit: Duration::from_secs(4),
            oom_killed: false,
            process_limit_hit: false,
            stderr,
        })
    }

    #[test]
    fn exceptions_name_the_reason() {
        let tb = |last: &str| {
            format!("Traceback (most recent call last):\n  File \"main.py\", line 2, in <module>\n{last}\n")
        };
        assert_eq!(code(0, &tb("MemoryError")), Status::Passed);
        assert_eq!(code(1, &tb("MemoryError")), Status::Failed(Reason::MemoryLimit));
        assert_eq!(
            code(1, &tb("BlockingIOError: [Errno 11] Resource temporarily unavailable")),
            Status::Failed(Reason::ProcessLimit)
        );
        assert_eq!(
            code(1, &tb("RuntimeError: can't start new thread")),
            Status::Failed(Reason::ProcessLimit)
        );
        assert_eq!(
            code(1, &tb("OSError: [Errno 97] Address family not supported by protocol")),
            Status::Failed(Reason::Denied(Denied::Network))
        );
        assert_eq!(
            code(1, &tb("OSError: [Errno 101] Network is unreachable")),
            Status::Failed(Reason::Denied(Denied::Network))
        );
        assert_eq!(
            code(1, &tb("socket.gaierror: [Errno -3] Temporary failure in name resolution")),
            Status::Failed(Reason::Denied(Denied::Network))
        );
        assert_eq!(
            code(1, &tb("PermissionError: [Errno 13] Permission denied: '/etc/x'")),
            Status::Failed(Reason::Denied(Denied::Filesystem))
        );
        // Landlock's TCP rule gives the same errno; the failing source line tells them apart.
        let connect = "Traceback (most recent call last):\n  File \"main.py\", line 4, in <module>\n    s.connect(('1.1.1.1', 80))\nPermissionError: [Errno 13] Permission denied\n";
        assert_eq!(code(1, connect), Status::Failed(Reason::Denied(Denied::Network)));
        assert_eq!(
            code(1, &tb("PermissionError: [Errno 1] Operation not permitted")),
            Status::Failed(Reason::Denied(Denied::Operation))
        );
        assert_eq!(
            code(1, &tb("OSError: [Errno 27] File too large")),
            Status::Failed(Reason::FileSizeLimit)
        );
        assert_eq!(code(1, &tb("AssertionError")), Status::Failed(Reason::ExitCode(1)));
        assert_eq!(
            code(1, &tb("NameError: name 'x' is not defined")),
            Status::Failed(Reason::ExitCode(1))
        );
        assert_eq!(code(3, "some output\n"), Status::Failed(Reason::ExitCode(3)));
        assert_eq!(
            last_exception_line(&tb("ValueError: bad: value")),
            Some("ValueError: bad: value")
        );
        // A forked process may start a traceback after the program's own one ended.
        let interleaved = format!(
            "{}Traceback (most recent call last):\n  File \"main.py\", line 3\n",
            tb("BlockingIOError: [Errno 11] Resource temporarily unavailable")
        );
        assert_eq!(code(1, &interleaved), Status::Failed(Reason::ProcessLimit));
        assert_eq!(last_exception_line("  File \"x\", line 1\n"), None);
        assert_eq!(last_exception_line(""), None);
    }

    #[test]
    fn signals_and_timeouts_name_the_reason() {
        let sig = |s: i32, cpu_ms: u64, oom: bool| {
            classify(&Observed {
                exit: Some(RawExit::Signal(s)),
                timed_out: false,
                cpu_time: Duration::from_millis(cpu_ms),
                cpu_limit: Duration::from_secs(2),
                oom_killed: oom,
                process_limit_hit: false,
                stderr: "",
            })
        };
        assert_eq!(sig(libc::SIGXCPU, 2000, false), Status::Failed(Reason::CpuLimit));
        assert_eq!(sig(libc::SIGKILL, 2990, false), Status::Failed(Reason::CpuLimit));
        assert_eq!(sig(libc::SIGKILL, 10, true), Status::Failed(Reason::MemoryLimit));
        assert_eq!(sig(libc::SIGKILL, 10, false), Status::Failed(Reason::Signal(libc::SIGKILL)));
        assert_eq!(sig(libc::SIGXFSZ, 10, false), Status::Failed(Reason::FileSizeLimit));
        assert_eq!(sig(libc::SIGSEGV, 10, false), Status::Failed(Reason::Signal(libc::SIGSEGV)));
        let timed_out = Observed {
            exit: None,
            timed_out: true,
            cpu_time: Duration::ZERO,
            cpu_limit: Duration::ZERO,
            oom_killed: false,
            process_limit_hit: false,
            stderr: "",
        };
        assert_eq!(classify(&timed_out), Status::Failed(Reason::Timeout));
    }
}
