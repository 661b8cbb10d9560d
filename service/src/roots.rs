//! The folders a service may read and write for a peer. A job submitted over the network names
//! model, data and output paths on the servers; with roots set, each must resolve (symlinks
//! followed, no `..`) to a place inside one of them, or it is refused before anything runs.
use std::path::{Component, Path, PathBuf};

/// Allowed roots, canonical. Empty: every path is allowed (the default, for one trusted user).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedRoots(Vec<PathBuf>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RootsError {
    #[error("allowed root {0}: {1}")]
    BadRoot(String, String),
    #[error("{path} is relative; a path a peer sends must be absolute")]
    Relative { path: String },
    #[error("{path} goes up through `..`, which is refused; name the folder directly")]
    DotDot { path: String },
    #[error("{path} resolves to {resolved}, outside the allowed roots ({roots}); move it under one of them, or ask the operator to add its folder to --allowed-roots")]
    Outside { path: String, resolved: String, roots: String },
    #[error("{path}: cannot resolve {at}: {message}")]
    Unresolvable { path: String, at: String, message: String },
}

impl AllowedRoots {
    /// Roots from a list separated by commas (or colons, as in `PATH`); each must be an
    /// existing folder. An empty list allows everything.
    pub fn parse(list: &str) -> Result<Self, RootsError> {
        let mut roots = Vec::new();
        for part in list.split([',', ':']).map(str::trim).filter(|p| !p.is_empty()) {
            let p = Path::new(part);
            let canonical = std::fs::canonicalize(p)
                .map_err(|e| RootsError::BadRoot(part.to_string(), e.to_string()))?;
            if !canonical.is_dir() {
                return Err(RootsError::BadRoot(part.to_string(), "is not a folder".into()));
            }
            roots.push(canonical);
        }
        Ok(Self(roots))
    }

    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }

    /// Where `path` really is, if it lies inside a root. A path that does not exist yet (an
    /// output folder) is resolved through its nearest existing ancestor, so a symlink anywhere
    /// above it cannot lead outside.
    pub fn check(&self, path: &Path) -> Result<PathBuf, RootsError> {
        if self.is_open() {
            return Ok(path.to_path_buf());
        }
        let shown = path.display().to_string();
        if !path.is_absolute() {
            return Err(RootsError::Relative { path: shown });
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(RootsError::DotDot { path: shown });
        }
        let mut existing = path;
        let mut rest = Vec::new();
        let resolved = loop {
            match std::fs::canonicalize(existing) {
                Ok(c) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let (Some(parent), Some(name)) = (existing.parent(), existing.file_name())
                    else {
                        return Err(RootsError::Unresolvable {
                            path: shown,
                            at: existing.display().to_string(),
                            message: e.to_string(),
                        });
                    };
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                Err(e) => {
                    return Err(RootsError::Unresolvable {
                        path: shown,
                        at: existing.display().to_string(),
                        message: e.to_string(),
                    })
                }
            }
        };
        let full = rest.iter().rev().fold(resolved, |p, name| p.join(name));
        if self.0.iter().any(|r| full.starts_with(r)) {
            return Ok(full);
        }
        let roots = self.0.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ");
        Err(RootsError::Outside { path: shown, resolved: full.display().to_string(), roots })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_a_root_pass_and_every_way_out_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("models/m")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
        let roots =
            AllowedRoots::parse(&format!("{}, {}", root.display(), root.join("models").display()))
                .unwrap();
        let canonical_root = std::fs::canonicalize(&root).unwrap();
        assert_eq!(roots.check(&root.join("models/m")).unwrap(), canonical_root.join("models/m"));
        // An output folder that does not exist yet, under the root.
        assert_eq!(roots.check(&root.join("out/run-1")).unwrap(), canonical_root.join("out/run-1"));
        assert!(matches!(roots.check(Path::new("/etc/shadow")), Err(RootsError::Outside { .. })));
        assert!(matches!(
            roots.check(&root.join("models/../../x")),
            Err(RootsError::DotDot { .. })
        ));
        assert!(matches!(roots.check(Path::new("models/m")), Err(RootsError::Relative { .. })));
        // Through a symlink inside the root, to a file or to a folder not yet made.
        let e = roots.check(&root.join("etc-link/shadow")).unwrap_err();
        assert!(
            matches!(&e, RootsError::Outside { resolved, .. } if resolved == "/etc/shadow"),
            "{e}"
        );
        assert!(matches!(
            roots.check(&root.join("etc-link/new/out")),
            Err(RootsError::Outside { .. })
        ));
        assert!(e.to_string().contains("--allowed-roots"));
        // No roots: everything, as before.
        assert_eq!(
            AllowedRoots::default().check(Path::new("/etc/shadow")).unwrap(),
            PathBuf::from("/etc/shadow")
        );
        assert!(matches!(AllowedRoots::parse("/no/such/root"), Err(RootsError::BadRoot(..))));
    }
}
