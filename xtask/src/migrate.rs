//! `cargo xtask migrate --state-dir DIR [--status]`: apply (or show) the state database's
//! migrations on a real directory.

#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;

use anyhow::Context;
use clawgate_store_sqlite::SqliteOptions;
use clawgate_store_sqlite::{self as sqlite, MigrationStatus, STATE_DB_FILE};

/// What to do with the migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Migrate {
    pub(crate) state_dir: PathBuf,
    pub(crate) status_only: bool,
}

pub(crate) fn run(args: &Migrate) -> anyhow::Result<()> {
    let report = execute(args)?;
    print!("{report}");
    Ok(())
}

/// Runs the command and returns what it prints (tests read it).
pub(crate) fn execute(args: &Migrate) -> anyhow::Result<String> {
    let path = args.state_dir.join(STATE_DB_FILE);
    let options = SqliteOptions::default();
    let mut out = String::new();
    let statuses = if args.status_only {
        out.push_str(&format!(
            "state database {} (status only)\n",
            path.display()
        ));
        sqlite::migration_status(&path, &options)
    } else {
        if !args.state_dir.is_dir() {
            // The store's own error names the directory and what to do.
            clawgate_store_sqlite::SqliteStore::open_state_dir(&args.state_dir, options.clone())?;
        }
        out.push_str(&format!("migrating state database {}\n", path.display()));
        sqlite::migrate_file(&path, &options)
    }
    .with_context(|| format!("migrate {}", path.display()))?;
    out.push_str(&table(&statuses));
    Ok(out)
}

fn table(statuses: &[MigrationStatus]) -> String {
    let mut out = String::from("  version  name                 state\n");
    for status in statuses {
        let state = match status.applied_at {
            Some(at) if status.version > sqlite::SCHEMA_VERSION => {
                format!("applied at {at} (unknown to this build: newer schema)")
            }
            Some(at) => format!("applied at {at}"),
            None => "pending".to_owned(),
        };
        out.push_str(&format!(
            "  {:>7}  {:<19}  {state}\n",
            status.version, status.name
        ));
    }
    out
}

/// Whether a state directory's database is fully migrated (used by tests).
#[cfg(test)]
fn fully_applied(dir: &Path) -> bool {
    sqlite::migration_status(&dir.join(STATE_DB_FILE), &SqliteOptions::default())
        .is_ok_and(|s| s.iter().all(|m| m.applied_at.is_some()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    fn migrate(dir: &Path, status_only: bool) -> anyhow::Result<String> {
        execute(&Migrate {
            state_dir: dir.to_path_buf(),
            status_only,
        })
    }

    #[test]
    fn empty_directory_gets_a_usable_database() {
        let dir = tempfile::tempdir().unwrap();
        let before = migrate(dir.path(), true).unwrap();
        assert!(before.contains("pending"), "{before}");
        assert!(
            !dir.path().join(STATE_DB_FILE).exists(),
            "--status creates nothing"
        );
        let out = migrate(dir.path(), false).unwrap();
        assert!(
            out.contains("applied at") && !out.contains("pending"),
            "{out}"
        );
        assert!(fully_applied(dir.path()));
        // Usable: the store opens it and writes.
        let store = clawgate_store_sqlite::testing::open_store(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use clawgate_store::InstanceStore as _;
            store.gateway_instance_id().await.unwrap();
        });
        let again = migrate(dir.path(), false).unwrap();
        assert_eq!(
            again.matches("applied at").count(),
            sqlite::MIGRATIONS.len(),
            "idempotent"
        );
    }

    #[test]
    fn read_only_and_corrupt_files_are_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        migrate(dir.path(), false).unwrap();
        let path = dir.path().join(STATE_DB_FILE);
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        perms.set_readonly(true);
        std::fs::set_permissions(&path, perms).unwrap();
        let err = format!("{:#}", migrate(dir.path(), false).unwrap_err());
        assert!(
            err.contains("read-only") && err.contains(&path.display().to_string()),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_DB_FILE);
        std::fs::write(&path, b"not a database at all, just some text ".repeat(200)).unwrap();
        let err = format!("{:#}", migrate(dir.path(), false).unwrap_err());
        assert!(
            err.contains("corrupt") && err.contains(&path.display().to_string()),
            "{err}"
        );
        let err = format!("{:#}", migrate(dir.path(), true).unwrap_err());
        assert!(err.contains("corrupt"), "--status says so too: {err}");
    }

    #[test]
    fn missing_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = format!(
            "{:#}",
            migrate(&dir.path().join("absent"), false).unwrap_err()
        );
        assert!(
            err.contains("absent") && err.contains("does not exist"),
            "{err}"
        );
    }
}
