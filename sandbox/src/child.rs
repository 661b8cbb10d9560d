//! What runs in the forked child between `fork` and `exec` (`Command::pre_exec`).
//!
//! Only async-signal-safe work is allowed here, since the parent is multi-threaded: raw system
//! calls on data prepared before the fork, no allocation, no locks. Everything that needs memory
//! (the seccomp program, the Landlock ruleset, the uid map text, cgroup files) is built by the
//! parent and only applied here.
//!
//! With a PID namespace the child (C, the process the parent knows) forks the namespace's init
//! (P), which forks the program (Q):
//!
//! ```text
//! parent ── C (own process group, waits for P, exits 0)
//!            └─ P = pid 1 of the new namespace: reaps orphans, sends Q's wait status and CPU time
//!                 └─ Q = the Python program (Landlock + seccomp, then exec)
//! ```
//!
//! When P exits the kernel kills every process left in the namespace, so nothing the program
//! forked can outlive the run; killing C's process group on a timeout takes P down with it. Q is
//! not pid 1, so its signals (`SIGXCPU`, `SIGTERM`, ...) keep their normal meaning.
use landlock::RulesetCreated;
use seccompiler::BpfProgram;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Which namespaces the child enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Namespaces {
    None,
    /// Network + PID namespaces, as root (needs `CAP_SYS_ADMIN`).
    Privileged,
    /// The same inside a new user namespace (unprivileged users, where the kernel allows it).
    User,
}

impl Namespaces {
    pub fn isolated(self) -> bool {
        self != Namespaces::None
    }
}

/// Size of a record on the status pipe: a tag byte, 3 bytes padding, an i32 and a u64. C sends
/// `b'C'` with P's pid (so the parent can kill the namespace's init on a timeout); P sends `b'P'`
/// with the program's wait status and CPU time in µs.
pub(crate) const STATUS_RECORD: usize = 16;

fn record(tag: u8, a: i32, b: u64) -> [u8; STATUS_RECORD] {
    let mut r = [0u8; STATUS_RECORD];
    r[0] = tag;
    r[4..8].copy_from_slice(&a.to_ne_bytes());
    r[8..].copy_from_slice(&b.to_ne_bytes());
    r
}

/// Reads one record: `(tag, a, b)`.
pub(crate) fn parse_record(r: &[u8]) -> (u8, i32, u64) {
    let a = i32::from_ne_bytes([r[4], r[5], r[6], r[7]]);
    let b = u64::from_ne_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
    (r[0], a, b)
}

/// Everything the child applies, prepared by the parent.
pub(crate) struct ChildPlan {
    /// Opened `cgroup.procs` files to join (written "0": the writer itself).
    pub cgroup_procs: Vec<RawFd>,
    /// `(resource, limit)` pairs set as soft = hard, except CPU whose hard limit is one second later.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// Set only inside a user namespace, where it counts this sandbox's processes alone.
    pub nproc: Option<u64>,
    pub namespaces: Namespaces,
    /// `"<uid> <uid> 1"` and `"<gid> <gid> 1"` for the user namespace.
    pub uid_map: Vec<u8>,
    pub gid_map: Vec<u8>,
    pub landlock: Option<RulesetCreated>,
    pub seccomp: Option<Arc<BpfProgram>>,
    /// Write end of the status pipe (PID namespace only), else -1.
    pub status_fd: RawFd,
    /// Exit 0 just before exec: used to probe which protections the machine allows.
    pub probe_exit: bool,
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

unsafe fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let n = libc::write(fd, buf.as_ptr().cast(), buf.len());
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let r = write_all(fd, data);
    libc::close(fd);
    r
}

/// Closes every descriptor from `from` up (close_range, with a loop where the kernel lacks it).
unsafe fn close_from(from: RawFd, to: RawFd) {
    if from > to {
        return;
    }
    if libc::syscall(
        libc::SYS_close_range,
        from as libc::c_uint,
        to as libc::c_uint,
        0 as libc::c_uint,
    ) != 0
    {
        let mut fd = from;
        while fd <= to.min(65535) {
            libc::close(fd);
            fd += 1;
        }
    }
}

/// Runs in the child after `fork`. Returns only in the process that goes on to exec Python.
///
/// # Safety
/// Must only be called from `Command::pre_exec`.
pub(crate) unsafe fn setup(p: &mut ChildPlan) -> io::Result<()> {
    for &fd in &p.cgroup_procs {
        write_all(fd, b"0")?;
    }
    match p.namespaces {
        Namespaces::None => {}
        Namespaces::Privileged => check(libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWPID))?,
        Namespaces::User => {
            check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET | libc::CLONE_NEWPID))?;
            // Keep our own ids (files in the run directory stay ours); setgroups must be denied
            // before an unprivileged process may write a gid map.
            write_file(c"/proc/self/setgroups", b"deny")?;
            write_file(c"/proc/self/uid_map", &p.uid_map)?;
            write_file(c"/proc/self/gid_map", &p.gid_map)?;
        }
    }
    // Set after entering the user namespace: the count then starts from this sandbox alone.
    if let Some(n) = p.nproc {
        check(libc::setrlimit(libc::RLIMIT_NPROC, &libc::rlimit { rlim_cur: n, rlim_max: n }))?;
    }
    if p.namespaces.isolated() {
        supervise(p.status_fd)?;
    }
    // Now in the process that becomes the program. The limits are set here, not in C: C and P
    // are copies of the parent, whose address space may already exceed the program's limit.
    for &(resource, limit) in &p.rlimits {
        // A CPU soft limit sends SIGXCPU; the hard one a second later kills a program that catches it.
        let hard = if resource == libc::RLIMIT_CPU { limit.saturating_add(1) } else { limit };
        check(libc::setrlimit(resource, &libc::rlimit { rlim_cur: limit, rlim_max: hard }))?;
    }
    if let Some(ruleset) = p.landlock.take() {
        ruleset.restrict_self().map_err(|_| io::Error::last_os_error())?;
    }
    check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    if let Some(bpf) = &p.seccomp {
        seccompiler::apply_filter(bpf).map_err(|_| io::Error::from_raw_os_error(libc::EPERM))?;
    }
    if p.probe_exit {
        libc::_exit(0);
    }
    Ok(())
}

/// Forks P (pid 1 of the new PID namespace) and Q; returns in Q only.
unsafe fn supervise(status_fd: RawFd) -> io::Result<()> {
    let init = libc::fork();
    if init < 0 {
        return Err(io::Error::last_os_error());
    }
    if init > 0 {
        // C: closing everything (the spawner's exec-error pipe included) tells the parent the
        // start went well once Q has exec'd. C then waits for P, so that P's exit (which comes
        // only once the namespace is empty) is what ends C.
        let _ = write_all(status_fd, &record(b'C', init, 0));
        close_from(3, RawFd::MAX);
        let mut status = 0;
        while libc::waitpid(init, &mut status, 0) < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
        libc::_exit(0);
    }
    // P. If this fork fails, returning the error lets the spawner report it.
    let program = libc::fork();
    if program < 0 {
        return Err(io::Error::last_os_error());
    }
    if program == 0 {
        // Q: die with P rather than be left over (P's exit kills the namespace anyway).
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        libc::close(status_fd);
        return Ok(());
    }
    close_from(3, status_fd - 1);
    close_from(status_fd + 1, RawFd::MAX);
    loop {
        let mut status = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        let pid = libc::wait4(-1, &mut status, 0, &mut usage);
        if pid == program {
            let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            let cpu = micros(usage.ru_utime) + micros(usage.ru_stime);
            let _ = write_all(status_fd, &record(b'P', status, cpu));
            // Exiting as pid 1 kills whatever the program left running.
            libc::_exit(0);
        }
        if pid < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            libc::_exit(1);
        }
    }
}
