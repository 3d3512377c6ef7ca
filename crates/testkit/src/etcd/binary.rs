//! Which etcd the kit runs: the `etcd` binary named by `PALISADE_ETCD`, else the one on
//! `PATH`; `etcdctl` and `etcdutl` are taken from the same directory.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The variable naming the `etcd` binary to run (a path). Unset or empty: `etcd` on
/// `PATH`. `scripts/test` sets it to etcd 3.5 for its second pass.
pub const ETCD_VARIABLE: &str = "PALISADE_ETCD";

/// An etcd release, as `etcd --version` prints it (`etcd Version: 3.5.30`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EtcdVersion {
    /// 3 for every etcd the kit supports.
    pub major: u32,
    /// 4 or 5.
    pub minor: u32,
    /// The patch release.
    pub patch: u32,
}

impl EtcdVersion {
    /// Whether this is `major.minor` or later.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Parses `etcd --version` output: the first line `etcd Version: X.Y.Z`.
    fn parse(out: &str) -> Option<EtcdVersion> {
        let line = out.lines().next()?;
        let number = line.strip_prefix("etcd Version:")?.trim();
        let mut parts = number.split('.').map(|p| p.parse::<u32>().ok());
        let version = EtcdVersion {
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next()??,
        };
        parts.next().is_none().then_some(version)
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The etcd binaries the kit runs and their release: `etcd` as [`ETCD_VARIABLE`] or
/// `PATH` selects it, `etcdctl` and `etcdutl` from the same directory.
#[derive(Debug, Clone)]
pub struct EtcdBinaries {
    etcd: PathBuf,
    version: EtcdVersion,
}

impl EtcdBinaries {
    /// The binaries of this process, found once.
    ///
    /// # Panics
    ///
    /// If `PALISADE_ETCD` names no executable file, if no `etcd` is on `PATH` (the
    /// message names `scripts/test`), or if `etcd --version` fails or prints no version.
    pub fn get() -> &'static EtcdBinaries {
        static BINARIES: OnceLock<EtcdBinaries> = OnceLock::new();
        BINARIES.get_or_init(|| Self::find().unwrap_or_else(|e| panic!("{e}")))
    }

    /// The binaries [`ETCD_VARIABLE`] or `PATH` selects, looked up now (for a program
    /// that reports the error rather than panic, such as the demo).
    ///
    /// # Errors
    ///
    /// [`LocateError`] naming what is missing: the variable names no executable file,
    /// no `etcd` is on `PATH`, or `etcd --version` failed or printed no version.
    pub fn find() -> Result<EtcdBinaries, LocateError> {
        Self::find_in(std::env::var_os(ETCD_VARIABLE), std::env::var_os("PATH"))
    }

    /// [`find`](Self::find) with the values of [`ETCD_VARIABLE`] and `PATH` given.
    fn find_in(
        variable: Option<OsString>,
        path: Option<OsString>,
    ) -> Result<EtcdBinaries, LocateError> {
        let chosen = if variable.as_ref().is_some_and(|v| !v.is_empty()) {
            CHOSEN_BY_VARIABLE
        } else {
            "the etcd on PATH"
        };
        let etcd = locate(variable, path)?;
        let version = version_of(&etcd, chosen)?;
        Ok(EtcdBinaries { etcd, version })
    }

    /// The `etcd` server binary.
    pub fn etcd(&self) -> &Path {
        &self.etcd
    }

    /// `etcdctl`, next to [`etcd`](Self::etcd).
    pub fn etcdctl(&self) -> PathBuf {
        self.sibling("etcdctl")
    }

    /// `etcdutl`, next to [`etcd`](Self::etcd): etcd 3.5 moved the offline snapshot
    /// commands (`restore`, `status`) there from `etcdctl`. `None` before 3.5.
    pub fn etcdutl(&self) -> Option<PathBuf> {
        self.version.at_least(3, 5).then(|| self.sibling("etcdutl"))
    }

    /// The release `etcd --version` reported.
    pub fn version(&self) -> EtcdVersion {
        self.version
    }

    fn sibling(&self, name: &str) -> PathBuf {
        self.etcd.with_file_name(name)
    }
}

/// How [`LocateError::Version`] names an `etcd` chosen by [`ETCD_VARIABLE`].
const CHOSEN_BY_VARIABLE: &str = "the etcd PALISADE_ETCD names";

/// Why the kit found no `etcd` to run.
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// `PALISADE_ETCD` names something that is not an executable file.
    #[error(
        "{ETCD_VARIABLE}={} is not an executable file ({cause}): point it at an `etcd` \
         binary (scripts/test fetches etcd 3.5 and sets it)",
        .path.display()
    )]
    NotExecutable {
        /// What the variable names.
        path: PathBuf,
        /// Why it cannot run (missing, not a regular file, not executable).
        cause: String,
    },
    /// No `etcd` in any `PATH` directory.
    #[error(
        "`etcd` was not found on PATH and {ETCD_VARIABLE} is unset: run scripts/test, which \
         installs etcd-server and etcd-client (etcd 3.4), or set {ETCD_VARIABLE}"
    )]
    NotOnPath,
    /// `etcd --version` failed or printed no version line.
    #[error("`{} --version` ({chosen}) {cause}", .path.display())]
    Version {
        /// The `etcd` that was run.
        path: PathBuf,
        /// How it was chosen: `the etcd PALISADE_ETCD names` or `the etcd on PATH`.
        chosen: &'static str,
        /// How it failed, with its stderr or stdout.
        cause: String,
    },
}

/// The `etcd` to run: `variable` (the value of `PALISADE_ETCD`) when set and not empty,
/// else the first executable `etcd` in the directories of `path`.
pub(crate) fn locate(
    variable: Option<OsString>,
    path: Option<OsString>,
) -> Result<PathBuf, LocateError> {
    if let Some(chosen) = variable.filter(|v| !v.is_empty()) {
        let chosen = PathBuf::from(chosen);
        return match executable(&chosen) {
            Ok(()) => Ok(chosen),
            Err(cause) => Err(LocateError::NotExecutable {
                path: chosen,
                cause,
            }),
        };
    }
    let path = path.ok_or(LocateError::NotOnPath)?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|file| executable(file).is_ok())
        .ok_or(LocateError::NotOnPath)
}

/// `Ok` for an executable regular file, else what is wrong with it.
fn executable(file: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("not executable".to_owned());
    }
    Ok(())
}

fn version_of(etcd: &Path, chosen: &'static str) -> Result<EtcdVersion, LocateError> {
    let fail = |cause: String| LocateError::Version {
        path: etcd.to_owned(),
        chosen,
        cause,
    };
    let out = Command::new(etcd)
        .arg("--version")
        .output()
        .map_err(|e| fail(format!("could not run: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(fail(format!(
            "failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    EtcdVersion::parse(&text).ok_or_else(|| fail(format!("printed no version: {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_etcd_output() {
        let v = EtcdVersion::parse(
            "etcd Version: 3.5.30\nGit SHA: Not provided\nGo Version: go1.26.4\n",
        )
        .unwrap();
        assert_eq!((v.major, v.minor, v.patch), (3, 5, 30));
        assert_eq!(v.to_string(), "3.5.30");
        assert!(v.at_least(3, 5) && v.at_least(3, 4) && !v.at_least(3, 6));
        let old = EtcdVersion::parse("etcd Version: 3.4.23\n").unwrap();
        assert!(old < v && !old.at_least(3, 5));
        assert_eq!(EtcdVersion::parse("etcdutl version: 3.5.30"), None);
        assert_eq!(EtcdVersion::parse("etcd Version: 3.5"), None);
        assert_eq!(EtcdVersion::parse("etcd Version: 3.5.x"), None);
    }

    #[test]
    fn the_variable_wins_over_path_and_must_name_an_executable() {
        let dir = tempfile::tempdir().unwrap();
        let on_path = dir.path().join("bin");
        std::fs::create_dir(&on_path).unwrap();
        let etcd = on_path.join("etcd");
        std::fs::write(&etcd, "#!/bin/sh\n").unwrap();
        let path = Some(OsString::from(&on_path));

        // Nothing chosen (unset or empty): an executable `etcd` on PATH, and only that.
        assert!(
            matches!(locate(None, path.clone()), Err(LocateError::NotOnPath)),
            "not executable yet"
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(locate(None, path.clone()).unwrap(), etcd);
        assert_eq!(locate(Some("".into()), path.clone()).unwrap(), etcd);

        // Chosen: that file, even when PATH has another.
        let other = dir.path().join("etcd-3.5");
        std::fs::write(&other, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            locate(Some(other.clone().into()), path.clone()).unwrap(),
            other
        );

        // A chosen path that is missing or a directory is an error naming the variable.
        let missing = dir.path().join("nope");
        let e = locate(Some(missing.clone().into()), path.clone()).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("PALISADE_ETCD={}", missing.display())),
            "{text}"
        );
        assert!(text.contains("No such file"), "{text}");
        let e = locate(Some(on_path.clone().into()), path).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");

        let e = locate(None, Some(OsString::from(dir.path()))).unwrap_err();
        assert!(e.to_string().contains("scripts/test"), "{e}");
    }

    #[test]
    fn an_etcd_that_prints_no_version_is_named_with_how_it_was_chosen() {
        let dir = tempfile::tempdir().unwrap();
        let etcd = dir.path().join("etcd");
        std::fs::write(&etcd, "#!/bin/sh\necho not etcd >&2\nexit 3\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).unwrap();

        let by_variable = EtcdBinaries::find_in(Some(etcd.clone().into()), None).unwrap_err();
        assert_eq!(
            by_variable.to_string(),
            format!(
                "`{} --version` (the etcd PALISADE_ETCD names) failed (exit status: 3): not etcd",
                etcd.display()
            )
        );
        let on_path = EtcdBinaries::find_in(None, Some(OsString::from(dir.path()))).unwrap_err();
        assert!(
            on_path.to_string().contains("(the etcd on PATH) failed"),
            "{on_path}"
        );
        std::fs::write(&etcd, "#!/bin/sh\necho etcd 9\n").unwrap();
        let e = EtcdBinaries::find_in(Some(etcd.into()), None).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("(the etcd PALISADE_ETCD names) printed no version: \"etcd 9\\n\""),
            "{e}"
        );
    }

    #[test]
    fn the_tools_lie_next_to_etcd() {
        let b = EtcdBinaries {
            etcd: PathBuf::from("/opt/etcd/bin/etcd"),
            version: EtcdVersion {
                major: 3,
                minor: 5,
                patch: 30,
            },
        };
        assert_eq!(b.etcdctl(), Path::new("/opt/etcd/bin/etcdctl"));
        assert_eq!(b.etcdutl().unwrap(), Path::new("/opt/etcd/bin/etcdutl"));
        let old = EtcdBinaries {
            version: EtcdVersion {
                major: 3,
                minor: 4,
                patch: 23,
            },
            ..b
        };
        assert_eq!(old.etcdutl(), None);
    }
}
