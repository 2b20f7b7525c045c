//! The state directory: the SQLite database, the embedded platform's state, the lock that
//! keeps one gateway per directory, and `gateway.json` — how the CLI finds a running gateway.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clawgate_store::StoreError;
use clawgate_store_sqlite::STATE_DB_FILE;
use serde::{Deserialize, Serialize};

use crate::config::StateBackend;

const LOCK_FILE: &str = "gateway.lock";
const RUNTIME_FILE: &str = "gateway.json";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot create the state directory {path}: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another gateway is running on the state directory {path} (pid {pid}); stop it first, \
         or give this one another directory (--state-dir)"
    )]
    Busy { path: PathBuf, pid: String },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The disk holding the state directory is full.
    #[error(
        "the disk holding {path} is full: free some space there (or give the gateway another \
         state directory, --state-dir), then start again"
    )]
    DiskFull { path: PathBuf },
}

impl StateError {
    /// A failed write of `path`: [`StateError::DiskFull`] when the disk is full, else
    /// [`StateError::Write`] with its cause.
    fn write(path: PathBuf, source: std::io::Error) -> StateError {
        if source.kind() == std::io::ErrorKind::StorageFull || source.raw_os_error() == Some(28) {
            StateError::DiskFull { path }
        } else {
            StateError::Write { path, source }
        }
    }
}

/// An existing state directory (absolute path).
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

/// Held while a gateway runs on the directory; released when dropped (or when the process
/// dies: the OS drops the lock with it, so a SIGKILLed gateway never blocks a restart).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

/// What a running gateway publishes for the CLI (mode 0600: it carries the control token).
/// `Debug` leaves the tokens out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeInfo {
    pub pid: u32,
    /// `http://127.0.0.1:PORT`: the chat page at `/`, the control API under `/v1`.
    pub url: String,
    pub control_token: String,
    pub started_at: i64,
    /// Each channel's platform, so a test or a tool can reach an embedded QA platform (its
    /// `/control` routes) while the gateway runs. Absent in files written by earlier builds.
    #[serde(default)]
    pub channels: Vec<ChannelInfo>,
}

/// Where one channel's platform answers.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelInfo {
    /// The channel name messages carry (`qa`, `qa-<account>`).
    pub name: String,
    /// `http://127.0.0.1:PORT` of the platform (its API under `/api`, test controls under
    /// `/control`).
    pub platform_url: String,
    /// Whether the gateway runs this platform in-process (its state in the state directory).
    pub embedded: bool,
    /// The bearer token an embedded platform's `/api` and `/control` routes require (this
    /// file is the user's alone, mode 0600). Absent for a platform the gateway does not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_token: Option<String>,
}

impl std::fmt::Debug for RuntimeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeInfo")
            .field("pid", &self.pid)
            .field("url", &self.url)
            .field("control_token", &"<redacted>")
            .field("started_at", &self.started_at)
            .field("channels", &self.channels)
            .finish()
    }
}

impl std::fmt::Debug for ChannelInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelInfo")
            .field("name", &self.name)
            .field("platform_url", &self.platform_url)
            .field("embedded", &self.embedded)
            .field(
                "platform_token",
                &self.platform_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl StateDir {
    /// Creates the directory if needed, readable by this user only (0700): it holds every
    /// conversation.
    pub fn create(path: &Path) -> Result<StateDir, StateError> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|source| StateError::Create {
                path: path.to_path_buf(),
                source,
            })?;
        let path = std::fs::canonicalize(path).map_err(|source| StateError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(StateDir { path })
    }

    /// An existing directory, as given (for the CLI, which must not create one).
    pub fn existing(path: &Path) -> Option<StateDir> {
        std::fs::canonicalize(path)
            .ok()
            .filter(|p| p.is_dir())
            .map(|path| StateDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `agents/<id>/` in the state directory, created private (0700) if needed: an agent's
    /// default working directory, its own and not the gateway's (whatever the gateway was
    /// started in — a repository, a home directory — is not the agent's to read or change).
    pub fn agent_dir(&self, agent_id: &str) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir = self.path.join("agents").join(agent_id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        Ok(dir)
    }

    /// Refuses a state the operator made read-only: the directory, or (SQLite) the database and
    /// the files SQLite keeps beside it, without its owner's write bit. The bits are read, not
    /// a write tried: root may write whatever the bits say. Call it before anything here
    /// changes, so a refused start leaves the state as it was.
    pub fn refuse_read_only(&self, backend: StateBackend) -> Result<(), StoreError> {
        use std::os::unix::fs::PermissionsExt as _;
        let database = self.path.join(STATE_DB_FILE);
        let owner_may_not_write = |path: &Path| {
            std::fs::metadata(path)
                .map(|meta| meta.permissions().mode() & 0o7777)
                .ok()
                .filter(|mode| mode & 0o200 == 0)
        };
        if let Some(mode) = owner_may_not_write(&self.path) {
            return Err(StoreError::ReadOnly {
                database: match backend {
                    StateBackend::Sqlite => database.display().to_string(),
                    StateBackend::Postgres => self.path.display().to_string(),
                },
                detail: format!(
                    "the state directory {dir} is mode {mode:04o}, which its owner may not \
                     write; to run the gateway on it: chmod u+w {dir}",
                    dir = self.path.display()
                ),
            });
        }
        if backend == StateBackend::Sqlite {
            for suffix in ["", "-wal", "-shm"] {
                let file = PathBuf::from(format!("{}{suffix}", database.display()));
                if let Some(mode) = owner_may_not_write(&file) {
                    let which = if suffix.is_empty() {
                        String::new()
                    } else {
                        format!("{} is ", file.display())
                    };
                    return Err(StoreError::ReadOnly {
                        database: database.display().to_string(),
                        detail: format!(
                            "{which}mode {mode:04o}, which its owner may not write; to run the \
                             gateway on it: chmod u+w {}",
                            file.display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Takes away what other accounts on this machine may do with the directory and with the
    /// state files in it (their group and other bits): a directory made by hand, or by an
    /// earlier build, may be wider. The owner's bits stay as they are: narrowing never makes
    /// writable what the operator made read-only. Returns one line per change, for the
    /// operator.
    pub fn make_private(&self) -> Result<Vec<String>, StateError> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut changed = Vec::new();
        let mut narrow = |path: &Path| -> Result<(), StateError> {
            let Ok(meta) = std::fs::metadata(path) else {
                return Ok(());
            };
            let was = meta.permissions().mode() & 0o7777;
            if was & 0o077 == 0 {
                return Ok(());
            }
            let mode = was & !0o077;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(
                |source| StateError::Write {
                    path: path.to_path_buf(),
                    source,
                },
            )?;
            changed.push(format!(
                "{} was readable by other accounts ({was:04o}); now {mode:04o}",
                path.display()
            ));
            Ok(())
        };
        narrow(&self.path)?;
        let entries = std::fs::read_dir(&self.path).map_err(|source| StateError::Write {
            path: self.path.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                narrow(&entry.path())?;
            }
        }
        Ok(changed)
    }

    /// Takes the directory's gateway lock, or says which process holds it.
    pub fn lock_exclusive(&self) -> Result<StateLock, StateError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = self.path.join(LOCK_FILE);
        // Private like every file here (else the next start narrows it and says so).
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StateError::Lock {
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let pid = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(StateError::Busy {
                    path: self.path.clone(),
                    pid: pid.trim().to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(StateError::Lock { path, source });
            }
        }
        let written = file
            .set_len(0)
            .and_then(|()| write!(file, "{}", std::process::id()));
        written.map_err(|source| StateError::write(path.clone(), source))?;
        Ok(StateLock { _file: file })
    }

    /// Whether a gateway holds the lock right now (the CLI's "running or stopped").
    pub fn is_locked(&self) -> bool {
        let Ok(file) = File::open(self.path.join(LOCK_FILE)) else {
            return false;
        };
        matches!(
            file.try_lock_shared(),
            Err(std::fs::TryLockError::WouldBlock)
        )
    }

    pub fn write_runtime(&self, info: &RuntimeInfo) -> Result<(), StateError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = self.path.join(RUNTIME_FILE);
        let tmp = self.path.join(format!("{RUNTIME_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(info).map_err(std::io::Error::other)?)?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|source| StateError::write(path, source))
    }

    pub fn read_runtime(&self) -> Option<RuntimeInfo> {
        let bytes = std::fs::read(self.path.join(RUNTIME_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn remove_runtime(&self) {
        let _ = std::fs::remove_file(self.path.join(RUNTIME_FILE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gateway_per_state_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::create(dir.path()).expect("create");
        assert!(!state.is_locked());
        let lock = state.lock_exclusive().expect("first");
        assert!(state.is_locked());
        let second = state.lock_exclusive().expect_err("second is refused");
        assert!(
            second.to_string().contains(&std::process::id().to_string()),
            "names the holder: {second}"
        );
        drop(lock);
        assert!(!state.is_locked());
        state.lock_exclusive().expect("free again");
    }

    #[test]
    fn narrowing_keeps_the_owners_bits_and_a_read_only_state_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::create(dir.path()).expect("create");
        let db = state.path().join(STATE_DB_FILE);
        let chmod = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        let mode =
            |path: &Path| std::fs::metadata(path).expect("meta").permissions().mode() & 0o7777;
        std::fs::write(&db, b"").expect("db");
        chmod(&db, 0o444);
        let e = state
            .refuse_read_only(StateBackend::Sqlite)
            .expect_err("read-only db");
        assert!(matches!(e, StoreError::ReadOnly { .. }), "{e:?}");
        assert!(
            e.to_string().contains("0444") && e.to_string().contains("chmod u+w"),
            "{e}"
        );
        assert_eq!(mode(&db), 0o444, "left as it was");
        // The database is not the gateway's with PostgreSQL: only the directory counts.
        state
            .refuse_read_only(StateBackend::Postgres)
            .expect("not the database");
        let changed = state.make_private().expect("narrowed");
        assert!(
            changed.iter().any(|l| l.ends_with("(0444); now 0400")),
            "{changed:?}"
        );
        assert_eq!(
            mode(&db),
            0o400,
            "group and other bits gone, no owner bit added"
        );

        chmod(&db, 0o644);
        chmod(state.path(), 0o2555);
        for backend in [StateBackend::Sqlite, StateBackend::Postgres] {
            let e = state
                .refuse_read_only(backend)
                .expect_err("read-only directory");
            assert!(e.to_string().contains("2555"), "{e}");
        }
        chmod(state.path(), 0o2755);
        state
            .refuse_read_only(StateBackend::Sqlite)
            .expect("writable");
        state.make_private().expect("narrowed");
        assert_eq!(mode(state.path()), 0o2700, "the setgid bit stays");
        assert_eq!(mode(&db), 0o600);
    }

    #[test]
    fn runtime_info_is_private_to_the_owner() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let state = StateDir::create(dir.path()).expect("create");
        let info = RuntimeInfo {
            pid: 1,
            url: "http://127.0.0.1:1".into(),
            control_token: "secret".into(),
            started_at: 0,
            channels: vec![ChannelInfo {
                name: "qa".into(),
                platform_url: "http://127.0.0.1:2".into(),
                embedded: true,
                platform_token: Some("platform-secret".into()),
            }],
        };
        state.write_runtime(&info).expect("write");
        let printed = format!("{info:?}");
        assert!(
            !printed.contains("secret"),
            "Debug leaves the tokens out: {printed}"
        );
        let mode = std::fs::metadata(dir.path().join(RUNTIME_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "no access for group or others");
        assert_eq!(state.read_runtime(), Some(info));
        state.remove_runtime();
        assert_eq!(state.read_runtime(), None);
    }
}
