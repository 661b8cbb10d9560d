//! Watching a run: the status pipe its init and supervisor report on, its output captured to a
//! head and a tail, its exit read without blocking, and the kill at its deadline.
use crate::child::{self, STATUS_RECORD};
use crate::outcome::RawExit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The read end of the status pipe (PID namespace runs): what C and P report.
pub(crate) struct StatusPipe {
    pub(crate) fd: OwnedFd,
    pub(crate) buf: Vec<u8>,
    /// Host pid of the namespace's init (P).
    pub(crate) init: Option<libc::pid_t>,
    /// The program's wait status and CPU time.
    pub(crate) program: Option<(RawExit, Duration)>,
}

impl StatusPipe {
    pub(crate) fn new(fd: OwnedFd) -> StatusPipe {
        StatusPipe { fd, buf: Vec::new(), init: None, program: None }
    }

    /// Reads the records that have arrived (the pipe is non-blocking).
    pub(crate) fn read(&mut self) {
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
pub(crate) fn kill_init(init: libc::pid_t, supervisor: libc::pid_t) -> bool {
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

pub(crate) fn raw_exit(status: i32) -> RawExit {
    if libc::WIFSIGNALED(status) {
        RawExit::Signal(libc::WTERMSIG(status))
    } else {
        RawExit::Code(libc::WEXITSTATUS(status))
    }
}

pub(crate) struct Watched {
    pub(crate) exit: Option<RawExit>,
    pub(crate) timed_out: bool,
    pub(crate) cpu_time: Duration,
    pub(crate) exited_at: Instant,
}

/// Waits for the child while reading its output. At the deadline it kills the namespace's init
/// (C then exits once the namespace is empty) or, without one, the process group. Leftovers in
/// the group are killed before the child is reaped, so the group id cannot be reused by then.
pub(crate) fn watch(
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
pub(crate) fn drain(out: &mut Capture, err: &mut Capture, until: Instant) {
    while !(out.done() && err.done()) {
        let now = Instant::now();
        if now >= until {
            break;
        }
        poll_once(out, err, None, until - now);
    }
}

/// One poll over the open pipes (and the pidfd), reading what is ready.
pub(crate) fn poll_once(
    out: &mut Capture,
    err: &mut Capture,
    pidfd: Option<&OwnedFd>,
    timeout: Duration,
) {
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
pub(crate) struct Capture {
    pub(crate) fd: Option<OwnedFd>,
    pub(crate) head: Vec<u8>,
    pub(crate) tail: Vec<u8>,
    pub(crate) total: usize,
    pub(crate) cap: usize,
}

pub(crate) const TAIL: usize = 4096;

impl Capture {
    pub(crate) fn new(fd: Option<OwnedFd>, cap: usize) -> Capture {
        Capture { fd, head: Vec::new(), tail: Vec::new(), total: 0, cap }
    }

    pub(crate) fn done(&self) -> bool {
        self.fd.is_none()
    }

    pub(crate) fn read_some(&mut self) {
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

    pub(crate) fn push(&mut self, data: &[u8]) {
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

    pub(crate) fn finish(mut self) -> (String, bool) {
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
