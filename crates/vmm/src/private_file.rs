//! Files that hold a guest's memory — snapshots, failure reports (which
//! carry the bytes around RIP and on the stack) — written so that no one
//! but the user who runs hakoniwa can read them, and so that a name
//! planted in the directory cannot redirect the write.
//!
//! A file is written as `NAME.partial`, created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW` and mode 0600 (set again with `fchmod`, so
//! the umask cannot widen or narrow it), then synced, renamed to `NAME`,
//! and the directory synced so the rename itself survives a crash.
//!
//! - A symbolic link at `NAME.partial` is refused: `O_EXCL` never follows
//!   it, so its target is untouched.
//! - A symbolic link at `NAME` is replaced, not followed: `rename` swaps
//!   the name, never writes through it.
//! - An existing `NAME.partial` is refused, not removed: it may be
//!   another snapshot in progress to the same name, and a crashed one's
//!   leftover cannot be told apart from that without a lock; the error
//!   says to remove it. A partial file this process created and did not
//!   finish is removed (dropping a [`PrivateFile`] before
//!   [`PrivateFile::commit`]).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use api::io_reason;

/// Why a private file cannot be written; each one line.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    #[error(
        "{} is a symbolic link; refusing to write guest memory through it",
        .0.display()
    )]
    Symlink(PathBuf),
    #[error(
        "{} exists (an interrupted write, or one in progress to the same name); remove it and retry",
        .0.display()
    )]
    PartialExists(PathBuf),
    #[error("{}: {}", .path.display(), io_reason(.error))]
    Io { path: PathBuf, error: io::Error },
}

impl PrivateFileError {
    pub(crate) fn io(path: &Path, error: io::Error) -> Self {
        PrivateFileError::Io {
            path: path.to_owned(),
            error,
        }
    }
}

/// A file being written at `NAME.partial`, in place at `NAME` once
/// committed. Removed if dropped uncommitted.
#[derive(Debug)]
pub struct PrivateFile {
    file: Option<File>,
    partial: PathBuf,
    path: PathBuf,
}

/// `NAME.partial` beside `path`.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut partial: OsString = path.as_os_str().to_owned();
    partial.push(".partial");
    PathBuf::from(partial)
}

impl PrivateFile {
    /// Creates `path.partial`, mode 0600, refusing one that exists.
    pub fn create(path: &Path) -> Result<PrivateFile, PrivateFileError> {
        let partial = partial_path(path);
        let file = OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&partial)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => match std::fs::symlink_metadata(&partial) {
                    Ok(m) if m.file_type().is_symlink() => {
                        PrivateFileError::Symlink(partial.clone())
                    }
                    _ => PrivateFileError::PartialExists(partial.clone()),
                },
                _ => PrivateFileError::io(&partial, e),
            })?;
        let mut this = PrivateFile {
            file: Some(file),
            partial,
            path: path.to_owned(),
        };
        // The mode given to open is masked by the umask; 0600 is meant
        // whatever it is (a umask of 0277 would leave us unable to write).
        let set = std::fs::Permissions::from_mode(0o600);
        let partial = this.partial.clone();
        this.file_mut()
            .set_permissions(set)
            .map_err(|e| PrivateFileError::io(&partial, e))?;
        Ok(this)
    }

    /// The partial file, to write to (and seek in).
    pub fn file_mut(&mut self) -> &mut File {
        // Taken only by commit, which consumes self.
        self.file
            .as_mut()
            .expect("a private file is open until commit")
    }

    /// The partial file's path (for errors while writing).
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    /// Syncs the file, renames it to its name and syncs the directory.
    pub fn commit(mut self) -> Result<(), PrivateFileError> {
        let partial = self.partial.clone();
        let io = |e| PrivateFileError::io(&partial, e);
        if let Some(file) = self.file.take() {
            file.sync_all().map_err(io)?;
        }
        std::fs::rename(&self.partial, &self.path)
            .map_err(|e| PrivateFileError::io(&self.path, e))?;
        // Renamed: nothing left for Drop to remove.
        self.partial = PathBuf::new();
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| PrivateFileError::io(dir, e))
    }
}

impl Write for PrivateFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file_mut().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file_mut().flush()
    }
}

impl Drop for PrivateFile {
    fn drop(&mut self) {
        // Ours: created by this value with O_EXCL and not yet renamed.
        if !self.partial.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Writes `bytes` to `path` as a private file.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), PrivateFileError> {
    let mut file = PrivateFile::create(path)?;
    let partial = file.partial().to_owned();
    file.write_all(bytes)
        .map_err(|e| PrivateFileError::io(&partial, e))?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use vmm_sys_util::tempdir::TempDir;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// The umask is the process's, and other tests create files meanwhile:
    /// the test runs itself again alone, in a child, for each umask.
    #[test]
    fn the_file_is_0600_whatever_the_umask() {
        const CHILD: &str = "HAKONIWA_TEST_UMASK";
        if let Ok(umask) = std::env::var(CHILD) {
            let umask = u32::from_str_radix(&umask, 8).unwrap();
            let dir = TempDir::new().unwrap();
            let path = dir.as_path().join("vm.snap");
            // SAFETY: umask only sets the process's file-creation mask;
            // this process runs this one test.
            unsafe { libc::umask(umask as libc::mode_t) };
            write_private(&path, b"guest memory").unwrap();
            assert_eq!(mode(&path), 0o600, "umask {umask:o}");
            assert_eq!(std::fs::read(&path).unwrap(), b"guest memory");
            assert!(!partial_path(&path).exists());
            return;
        }
        for umask in ["000", "022", "077", "277"] {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "private_file::tests::the_file_is_0600_whatever_the_umask",
                ])
                .args(["--test-threads", "1"])
                .env(CHILD, umask)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "umask {umask}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn a_symlink_at_the_partial_path_is_refused_and_its_target_untouched() {
        let dir = TempDir::new().unwrap();
        let target = dir.as_path().join("victim");
        std::fs::write(&target, b"precious").unwrap();
        let target_mode = mode(&target);
        let path = dir.as_path().join("vm.snap");
        symlink(&target, partial_path(&path)).unwrap();
        let err = write_private(&path, b"guest memory")
            .unwrap_err()
            .to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert_eq!(mode(&target), target_mode);
        assert!(!path.exists());
        // A dangling link is refused the same way and not created through.
        let dangling = dir.as_path().join("nowhere");
        let path = dir.as_path().join("other.snap");
        symlink(&dangling, partial_path(&path)).unwrap();
        let err = write_private(&path, b"x").unwrap_err().to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        assert!(!dangling.exists());
    }

    #[test]
    fn a_symlink_at_the_name_is_replaced_not_followed() {
        let dir = TempDir::new().unwrap();
        let target = dir.as_path().join("victim");
        std::fs::write(&target, b"precious").unwrap();
        let path = dir.as_path().join("vm.snap");
        symlink(&target, &path).unwrap();
        write_private(&path, b"guest memory").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&path).unwrap(), b"guest memory");
    }

    #[test]
    fn an_existing_partial_file_is_refused_and_kept() {
        let dir = TempDir::new().unwrap();
        let path = dir.as_path().join("vm.snap");
        std::fs::write(partial_path(&path), b"someone else's").unwrap();
        let err = write_private(&path, b"guest memory")
            .unwrap_err()
            .to_string();
        assert!(err.contains("exists") && err.contains("remove it"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert_eq!(
            std::fs::read(partial_path(&path)).unwrap(),
            b"someone else's"
        );
        assert!(!path.exists());
    }

    #[test]
    fn an_unfinished_file_of_ours_is_removed() {
        let dir = TempDir::new().unwrap();
        let path = dir.as_path().join("vm.snap");
        let mut file = PrivateFile::create(&path).unwrap();
        file.write_all(b"half").unwrap();
        drop(file);
        assert!(!partial_path(&path).exists());
        assert!(!path.exists());
    }
}
