//! Per-run cgroups: the process limit root cannot get from `RLIMIT_NPROC` (the kernel does not
//! enforce it for root) and a memory limit over the whole process tree. Used where the machine
//! lets us create cgroups (root, or a delegated cgroup v2 subtree); v1 and v2 are both handled.
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PREFIX: &str = "comas-sandbox-";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A cgroup directory under which run cgroups holding one controller are created.
#[derive(Debug, Clone)]
pub(crate) struct Parent {
    dir: PathBuf,
    version: Version,
    controller: &'static str,
}

impl Parent {
    /// Where this process's cgroup for `controller` is, if a hierarchy holds the controller and
    /// children of our cgroup get it.
    pub fn find(controller: &'static str) -> Option<Parent> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
        // v1: one hierarchy per controller set, e.g. "8:pids:/user.slice".
        for line in membership.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == controller) {
                let (mount, root) = mount_of(&mountinfo, "cgroup", Some(controller))?;
                return Some(Parent {
                    dir: join_cgroup(&mount, &root, path),
                    version: Version::V1,
                    controller,
                });
            }
        }
        // v2: the unified hierarchy, "0::/path".
        let path = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
        let (mount, root) = mount_of(&mountinfo, "cgroup2", None)?;
        let dir = join_cgroup(&mount, &root, path);
        let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
        enabled.split_whitespace().any(|c| c == controller).then_some(Parent {
            dir,
            version: Version::V2,
            controller,
        })
    }

    /// Removes run cgroups that crashed sandboxes left behind (their owner's pid is gone).
    pub fn remove_stale(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|r| r.split('-').next()?.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{owner}")).exists() {
                kill_all_and_remove(&entry.path(), Duration::from_millis(200));
            }
        }
    }
}

/// The mount point and mount root of the hierarchy of `fstype` (holding `controller` for v1).
fn mount_of(mountinfo: &str, fstype: &str, controller: Option<&str>) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (root, mount) = (fields.get(3)?, fields.get(4)?);
        if right.first()? != &fstype {
            return None;
        }
        if let Some(c) = controller {
            if !right.get(2)?.split(',').any(|o| o == c) {
                return None;
            }
        }
        Some((PathBuf::from(mount), root.to_string()))
    })
}

/// `path` (as /proc/self/cgroup shows it) below a mount of the hierarchy rooted at `root`.
fn join_cgroup(mount: &Path, root: &str, path: &str) -> PathBuf {
    let rel = path.strip_prefix(root).filter(|_| root != "/").unwrap_or(path);
    mount.join(rel.trim_start_matches('/'))
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// The cgroups of one run; dropping it kills what is left in them and removes them.
pub(crate) struct RunCgroups {
    groups: Vec<(PathBuf, Version, &'static str, fs::File)>,
}

impl RunCgroups {
    /// Creates one cgroup per parent with its limit: `pids.max` = `max_processes`, memory =
    /// `memory_bytes` (swap included where the kernel lets us say so).
    pub fn create(
        parents: &[&Parent],
        max_processes: u64,
        memory_bytes: u64,
    ) -> io::Result<RunCgroups> {
        let name =
            format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let mut run = RunCgroups { groups: Vec::new() };
        for parent in parents {
            let dir = parent.dir.join(&name);
            fs::create_dir(&dir)?;
            // Registered before the limits are written so that a failure still removes the dir.
            let procs = fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"));
            let procs = match procs {
                Ok(f) => f,
                Err(e) => {
                    let _ = fs::remove_dir(&dir);
                    return Err(e);
                }
            };
            run.groups.push((dir.clone(), parent.version, parent.controller, procs));
            match (parent.controller, parent.version) {
                ("pids", _) => fs::write(dir.join("pids.max"), max_processes.to_string())?,
                ("memory", Version::V1) => {
                    fs::write(dir.join("memory.limit_in_bytes"), memory_bytes.to_string())?;
                    let _ = fs::write(
                        dir.join("memory.memsw.limit_in_bytes"),
                        memory_bytes.to_string(),
                    );
                }
                ("memory", Version::V2) => {
                    fs::write(dir.join("memory.max"), memory_bytes.to_string())?;
                    let _ = fs::write(dir.join("memory.swap.max"), "0");
                }
                _ => {}
            }
        }
        Ok(run)
    }

    /// The opened `cgroup.procs` files the child writes itself into.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.groups.iter().map(|g| g.3.as_raw_fd()).collect()
    }

    /// Whether the memory cgroup's OOM killer killed a process of the run.
    pub fn oom_killed(&self) -> bool {
        self.groups.iter().filter(|g| g.2 == "memory").any(|(dir, version, _, _)| {
            let file = if *version == Version::V1 { "memory.oom_control" } else { "memory.events" };
            fs::read_to_string(dir.join(file))
                .map(|s| {
                    s.lines().any(|l| {
                        l.strip_prefix("oom_kill ")
                            .and_then(|n| n.trim().parse::<u64>().ok())
                            .is_some_and(|n| n > 0)
                    })
                })
                .unwrap_or(false)
        })
    }

    /// Whether the pids cgroup refused a fork (`pids.events`: `max N`).
    pub fn process_limit_hit(&self) -> bool {
        self.groups.iter().filter(|g| g.2 == "pids").any(|(dir, ..)| {
            fs::read_to_string(dir.join("pids.events"))
                .map(|s| {
                    s.lines().any(|l| {
                        l.strip_prefix("max ")
                            .and_then(|n| n.trim().parse::<u64>().ok())
                            .is_some_and(|n| n > 0)
                    })
                })
                .unwrap_or(false)
        })
    }

    /// Kills every process still in the run's cgroups (the ones that left the process group).
    pub fn kill_all(&self) {
        for (dir, ..) in &self.groups {
            for pid in members(dir) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

impl Drop for RunCgroups {
    fn drop(&mut self) {
        for (dir, ..) in self.groups.drain(..).rev() {
            kill_all_and_remove(&dir, Duration::from_secs(2));
        }
    }
}

fn members(dir: &Path) -> Vec<libc::pid_t> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills the cgroup's processes until it is empty, then removes it (a cgroup with members cannot
/// be removed, and dying processes leave it a moment after SIGKILL).
fn kill_all_and_remove(dir: &Path, patience: Duration) {
    let start = Instant::now();
    loop {
        let pids = members(dir);
        for &pid in &pids {
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if pids.is_empty() && fs::remove_dir(dir).is_ok() {
            return;
        }
        if !dir.exists() {
            return;
        }
        if start.elapsed() > patience {
            tracing::warn!(cgroup = %dir.display(), "could not remove a sandbox cgroup; processes may be left in it");
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths_are_joined_below_the_mount_root() {
        assert_eq!(
            join_cgroup(Path::new("/sys/fs/cgroup/pids"), "/", "/a/b"),
            PathBuf::from("/sys/fs/cgroup/pids/a/b")
        );
        assert_eq!(
            join_cgroup(Path::new("/sys/fs/cgroup"), "/", "/"),
            PathBuf::from("/sys/fs/cgroup/")
        );
        assert_eq!(
            join_cgroup(Path::new("/sys/fs/cgroup"), "/docker/x", "/docker/x/y"),
            PathBuf::from("/sys/fs/cgroup/y")
        );
        let mountinfo = "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            mount_of(mountinfo, "cgroup", Some("pids")),
            Some((PathBuf::from("/sys/fs/cgroup/pids"), "/".to_string()))
        );
        assert_eq!(mount_of(mountinfo, "cgroup", Some("memory")), None);
        assert_eq!(
            mount_of(mountinfo, "cgroup2", None),
            Some((PathBuf::from("/sys/fs/cgroup/unified"), "/".to_string()))
        );
    }
}
