//! A sandbox for model-written Python, and the code grader built on it (spec 8.3).
//!
//! Each run is one `python3 main.py` in a fresh private directory, confined by every mechanism
//! the machine allows (probed once by [`Sandbox::new`], listed by [`Sandbox::protections`]):
//!
//! - **network**: a new network namespace (as root, or inside a user namespace), and a seccomp
//!   filter on top that makes `socket(AF_INET | AF_INET6 | AF_PACKET)` fail;
//! - **file system**: Landlock allows writes only beneath the run directory (reads stay open);
//!   the directory is removed afterwards;
//! - **resources**: rlimits on CPU time, address space, file size (and processes inside a user
//!   namespace); per-run pids and memory cgroups where they can be made, since root ignores
//!   `RLIMIT_NPROC`; a wall-clock timeout;
//! - **cleanup**: the program runs in a PID namespace (its init's exit kills everything it
//!   forked) and in its own process group, which is killed on timeout and on exit;
//! - stdin is `/dev/null`, stdout and stderr are captured up to a cap.
//!
//! Every way a program can go wrong ends as an [`Outcome`] with [`Status::Failed`] and a
//! [`Reason`]; only a broken sandbox is an error. Linux only.
mod cgroup;
mod child;
mod error;
mod files;
mod grade;
mod humaneval;
mod outcome;
mod protect;
mod sandbox;
mod watch;

pub use comas_workflow::code::CodeGrading;
pub use error::{DataError, SandboxError};
pub use files::{name_matches, RunFile, RunFiles, MAX_FETCH_BYTES};
pub use grade::{
    grade_code, grade_code_with_timeout, Failure, Verdict, CODE_TIMEOUT, TRAINING_CODE_TIMEOUT,
};
pub use humaneval::{default_humaneval_path, load_humaneval, HumanEvalProblem, HUMANEVAL_PROBLEMS};
pub use outcome::{Denied, Outcome, Reason, Status};
pub use protect::Protections;
pub use sandbox::{Sandbox, SandboxConfig};
