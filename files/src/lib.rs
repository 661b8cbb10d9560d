//! The one atomic writer of the workspace. A file is written to a temporary sibling (same
//! folder, so the same file system), synced, renamed over its destination, and then the folder
//! is synced so that the rename itself survives a power loss. A reader sees the old file or the
//! whole new one; a crash midway leaves at most a hidden temporary file, which the next write
//! does not trip over.
use std::fs::{File, Permissions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Mode of files anyone may read (the process umask still applies): models, logs, reports.
const SHARED: u32 = 0o644;
/// Mode of secrets: private keys.
const PRIVATE: u32 = 0o600;

/// Writes `bytes` to `path` atomically (see the crate docs); the folder must exist.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with_mode(path, SHARED, |w| w.write_all(bytes))
}

/// Like [`write_atomic`], for a file only its owner may read (a private key).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with_mode(path, PRIVATE, |w| w.write_all(bytes))
}

/// Writes what `fill` writes to `path` atomically, through a buffer: for large files written
/// in pieces (weights).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    write_with_mode(path, SHARED, fill)
}

/// Like [`write_atomic_with`], for a library that opens the file itself (the safetensors
/// writer): `fill` writes the temporary sibling at the path it is given, which is then synced
/// and renamed like any other.
pub fn write_atomic_at(
    path: &Path,
    fill: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = parent(path);
    let tmp = temporary_sibling(path, SHARED)?;
    fill(tmp.path())?;
    // The writer reopened the same file: syncing this handle syncs what it wrote.
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

fn temporary_sibling(path: &Path, mode: u32) -> std::io::Result<tempfile::NamedTempFile> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(parent(path))
}

fn write_with_mode(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = parent(path);
    let tmp = temporary_sibling(path, mode)?;
    {
        let mut w = BufWriter::new(tmp.as_file());
        fill(&mut w)?;
        w.flush()?;
    }
    tmp.as_file().sync_all()?;
    // On failure the temporary file is removed when `tmp` drops.
    tmp.persist(path).map_err(|e| e.error)?;
    sync_dir(dir)
}

/// Syncs a folder, so that renames and new entries in it are on disk. File systems that cannot
/// sync a folder (some network ones answer EINVAL) are taken at their word: nothing to do.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match File::open(dir)?.sync_all() {
        Err(e)
            if e.kind() == std::io::ErrorKind::InvalidInput
                || e.kind() == std::io::ErrorKind::Unsupported =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Whether `a` and `b` name one and the same existing file or folder (through links, `..` or
/// another spelling): what a command must check before writing its output over its input.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// The folder `path` is in (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_same_file_is_recognised_under_another_name_and_a_missing_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.jsonl");
        write_atomic(&a, b"x").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("link")).unwrap();
        assert!(same_file(&a, &dir.path().join("sub/../a.jsonl")));
        assert!(same_file(&a, &dir.path().join("link")));
        assert!(same_file(dir.path(), &dir.path().join("sub/..")));
        write_atomic(&dir.path().join("b.jsonl"), b"x").unwrap();
        assert!(!same_file(&a, &dir.path().join("b.jsonl")));
        assert!(!same_file(&a, &dir.path().join("missing")));
    }

    #[test]
    fn replaces_a_file_whole_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic_with(&path, |w| {
            w.write_all(b"ne")?;
            w.write_all(b"w")
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(entries(dir.path()), ["a.json"]);
    }

    #[test]
    fn a_failed_fill_keeps_the_old_file_and_removes_the_temporary_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        write_atomic(&path, b"old").unwrap();
        let err = write_atomic_with(&path, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(entries(dir.path()), ["w.bin"]);
    }

    #[test]
    fn a_writer_given_a_path_replaces_the_file_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        write_atomic(&path, b"old").unwrap();
        // A library that creates the file itself at the path it is given.
        write_atomic_at(&path, |tmp| std::fs::write(tmp, b"new")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let err = write_atomic_at(&path, |tmp| {
            std::fs::write(tmp, b"ha")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(entries(dir.path()), ["model.safetensors"]);
    }

    #[test]
    fn shared_files_are_readable_by_all_and_private_ones_by_the_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let (shared, private) = (dir.path().join("model.json"), dir.path().join("key.pem"));
        write_atomic(&shared, b"{}").unwrap();
        write_private(&private, b"secret").unwrap();
        // The umask may take bits away from 0644, never add them.
        assert_eq!(mode(&shared) & 0o044, 0o044 & !umask());
        assert_eq!(mode(&private), 0o600);
    }

    #[test]
    fn a_missing_folder_is_an_error_and_is_not_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no/such/file");
        assert_eq!(write_atomic(&path, b"x").unwrap_err().kind(), std::io::ErrorKind::NotFound);
        assert!(!dir.path().join("no").exists());
    }

    /// The process umask, read from a file created with 0o777.
    fn umask() -> u32 {
        let dir = tempfile::tempdir().unwrap();
        let probe = dir.path().join("probe");
        std::fs::OpenOptions::new().write(true).create(true).mode(0o777).open(&probe).unwrap();
        0o777 & !mode(&probe)
    }
}
