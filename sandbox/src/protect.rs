//! The protections a run can get, how each is built, and which ones this machine allows.
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// What the sandbox could set up on this machine (probed once by `Sandbox::new`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Protections {
    /// New network namespace: no interfaces but a down loopback, so nothing can be reached.
    pub network_namespace: bool,
    /// New PID namespace: the run's whole process tree dies with it.
    pub pid_namespace: bool,
    /// The namespaces were made inside a user namespace (not root).
    pub user_namespace: bool,
    /// seccomp filter: `socket(AF_INET | AF_INET6 | AF_PACKET)` and io_uring fail.
    pub seccomp: bool,
    /// Landlock ABI version enforced (writes only inside the run directory); None if unavailable.
    pub landlock_abi: Option<i32>,
    /// A pids cgroup per run caps the number of processes (works for root too).
    pub pids_cgroup: bool,
    /// A memory cgroup per run caps the memory of the whole process tree.
    pub memory_cgroup: bool,
    /// `RLIMIT_NPROC` is enforced (not root, inside a user namespace of its own).
    pub rlimit_nproc: bool,
}

impl Protections {
    /// One sentence per protection this machine lacks, saying what it means for a run.
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        if !self.network_namespace {
            gaps.push(if self.seccomp {
                "no network namespace: the network is blocked by the seccomp socket filter only"
                    .to_string()
            } else {
                "NO NETWORK ISOLATION: neither a network namespace nor seccomp is available"
                    .to_string()
            });
        }
        if !self.pid_namespace {
            gaps.push("no PID namespace: processes that leave the process group (setsid) may outlive a run unless a cgroup holds them".into());
        }
        if self.landlock_abi.is_none() {
            gaps.push("no Landlock: writes outside the run directory are limited only by file permissions".into());
        }
        if !self.pids_cgroup && !self.rlimit_nproc {
            gaps.push("no process limit (root ignores RLIMIT_NPROC and no pids cgroup could be made): a fork bomb is stopped only by the timeout".into());
        }
        if !self.memory_cgroup {
            gaps.push("no memory cgroup: memory is limited per process (RLIMIT_AS), not for the process tree as a whole".into());
        }
        gaps
    }
}

/// The errno a blocked socket gets: "Address family not supported by protocol", which programs
/// read as "no such network" and which names the cause unambiguously in a traceback.
pub(crate) const SOCKET_ERRNO: i32 = libc::EAFNOSUPPORT;

/// The seccomp program that makes internet and packet sockets fail (and io_uring, which could
/// open sockets without the socket system call).
pub(crate) fn seccomp_program() -> Result<BpfProgram, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))?;
    let family = |f: i32| -> Result<SeccompRule, String> {
        let cond = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, f as u64)
            .map_err(|e| e.to_string())?;
        SeccompRule::new(vec![cond]).map_err(|e| e.to_string())
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(
        libc::SYS_socket,
        vec![family(libc::AF_INET)?, family(libc::AF_INET6)?, family(libc::AF_PACKET)?],
    );
    rules.insert(libc::SYS_io_uring_setup, vec![]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(SOCKET_ERRNO as u32),
        arch,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))
}

/// The Landlock ABI of the running kernel, None where Landlock is missing or disabled.
pub(crate) fn landlock_abi() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as i32)
}

/// A ruleset that allows writes beneath `dir` (and to /dev/null) and no other write; reads stay
/// allowed. From ABI 4 TCP bind/connect are denied too, from ABI 6 signals and abstract UNIX
/// sockets that reach outside the sandbox. Every feature asked for is a hard requirement, so
/// what is built is what the kernel enforces.
pub(crate) fn landlock_ruleset(abi: i32, dir: &Path) -> Result<RulesetCreated, String> {
    let abi = ABI::from(abi);
    let write = AccessFs::from_write(abi);
    let err = |e: landlock::RulesetError| format!("landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(write)
        .map_err(err)?;
    if abi >= ABI::V4 {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(err)?;
    }
    if abi >= ABI::V6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let dir_fd = PathFd::new(dir).map_err(|e| format!("landlock: {e}"))?;
    let null_fd = PathFd::new("/dev/null").map_err(|e| format!("landlock: {e}"))?;
    ruleset
        .create()
        .map_err(err)?
        .add_rule(PathBeneath::new(dir_fd, write))
        .map_err(err)?
        .add_rule(PathBeneath::new(null_fd, write & AccessFs::from_file(abi)))
        .map_err(err)
}
