//! Files a run starts with and the files it hands back: a workspace that travels along a chain
//! of runs (MAPPA's DSBench pipeline uploads the data and everything earlier steps saved on
//! every call, and fetches what this one saves, spec 6).
use crate::error::SandboxError;
use std::path::Path;

/// Most bytes a run may hand back, over all its fetched files.
pub const MAX_FETCH_BYTES: u64 = 64 << 20;

/// One file of a run's folder: a plain name (no folders) and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFile {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// What a run starts with and what it hands back.
#[derive(Debug, Clone, Default)]
pub struct RunFiles {
    /// Written into the run's folder before the program starts.
    pub inputs: Vec<RunFile>,
    /// Name patterns (`*` any run of characters, `?` one) of the files to hand back, e.g.
    /// `*.pkl`, `submission.csv`.
    pub fetch: Vec<String>,
}

/// A name a run's folder may hold: one path component, not hidden, not the program itself.
pub fn check_name(name: &str) -> Result<(), SandboxError> {
    let ok = !name.is_empty()
        && name != "main.py"
        && !name.starts_with('.')
        && !name.contains(['/', '\\', '\0'])
        && name.len() <= 255;
    if ok {
        Ok(())
    } else {
        Err(SandboxError::BadFileName(name.to_string()))
    }
}

/// Whether `name` matches `pattern` (`*` and `?` wildcards, nothing else special).
pub fn name_matches(pattern: &str, name: &str) -> bool {
    fn go(p: &[char], n: &[char]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some('*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some('?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    go(&p, &n)
}

pub(crate) fn write_inputs(dir: &Path, files: &RunFiles) -> Result<(), SandboxError> {
    for f in &files.inputs {
        check_name(&f.name)?;
        std::fs::write(dir.join(&f.name), &f.bytes)
            .map_err(|source| SandboxError::Setup { what: "writing an input file", source })?;
    }
    Ok(())
}

/// The regular files (no links, no folders) at the top of `dir` that match a fetch pattern, by
/// name, within [`MAX_FETCH_BYTES`] in all; a file past the budget is left out and named in the
/// returned note.
pub(crate) fn fetch(dir: &Path, patterns: &[String]) -> (Vec<RunFile>, Option<String>) {
    if patterns.is_empty() {
        return (Vec::new(), None);
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    names.sort();
    let (mut out, mut total, mut skipped) = (Vec::new(), 0u64, Vec::new());
    for name in names {
        if check_name(&name).is_err() || !patterns.iter().any(|p| name_matches(p, &name)) {
            continue;
        }
        let path = dir.join(&name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if !meta.file_type().is_file() {
            continue;
        }
        if total + meta.len() > MAX_FETCH_BYTES {
            skipped.push(name);
            continue;
        }
        if let Ok(bytes) = std::fs::read(&path) {
            total += bytes.len() as u64;
            out.push(RunFile { name, bytes });
        }
    }
    let note = (!skipped.is_empty()).then(|| {
        format!("not handed back (over {MAX_FETCH_BYTES} bytes in all): {}", skipped.join(", "))
    });
    (out, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_names() {
        assert!(name_matches("*.pkl", "X_train.pkl") && !name_matches("*.pkl", "X_train.pkl.bak"));
        assert!(
            name_matches("submission.csv", "submission.csv")
                && !name_matches("submission.csv", "submission.csv2")
        );
        assert!(name_matches("model?.joblib", "model1.joblib") && name_matches("*", "a"));
        for bad in ["", "main.py", ".hidden", "a/b", "../x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert!(check_name("train.csv").is_ok());
    }
}
