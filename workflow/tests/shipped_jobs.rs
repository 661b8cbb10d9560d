//! Every job file shipped in the repository parses and passes the submit-time checks that need
//! no file system, so an example can never drift from the parser.
use comas_workflow::job::JobSpec;
use std::path::{Path, PathBuf};

fn job_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            job_files(&p, out);
        } else if p.file_name().is_some_and(|n| n == "job.toml") {
            out.push(p);
        }
    }
}

#[test]
fn shipped_job_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s");
    let mut files = Vec::new();
    job_files(&root, &mut files);
    assert!(files.len() >= 3, "expected the base and overlay job files, found {files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let spec = JobSpec::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        // The paper's training set size.
        let job = spec.check(2000).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(job.total_steps >= 1);
        for (k, a) in job.spec.agents.iter().enumerate() {
            assert_eq!(
                a.learner.as_deref(),
                Some(format!("http://learner-{k}.learner:50061").as_str()),
                "{}",
                f.display()
            );
        }
    }
}
