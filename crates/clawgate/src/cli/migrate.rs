//! `clawgate migrate`: create or upgrade the state database.

use clawgate_store_sqlite::{MigrationStatus, STATE_DB_FILE};
use serde::Serialize;

use crate::config::{Config, StateBackend};
use crate::state::StateDir;

use super::{CliError, CliResult, applied_version, lock_for_change, pretty, print};

/// What `migrate --json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MigrateReport {
    state_database: String,
    from_version: i64,
    to_version: i64,
    applied: Vec<String>,
}

pub(super) async fn migrate(config: &Config, create: bool, json: bool) -> CliResult<()> {
    let dir = &config.state_dir;
    if !dir.is_dir() {
        if !create {
            return Err(CliError::NoStateDir(dir.clone()));
        }
        StateDir::create(dir)?;
        eprintln!("created the state directory {}", dir.display());
    }
    let state = StateDir::existing(dir).ok_or_else(|| CliError::NoStateDir(dir.clone()))?;
    if state.is_locked() {
        eprintln!(
            "(state directory {}, held by a running gateway: it migrated the database when it \
             started)",
            state.path().display()
        );
    } else {
        eprintln!(
            "(state directory {}, gateway not running)",
            state.path().display()
        );
    }
    if config.state.backend == StateBackend::Postgres {
        return migrate_shared(config, &state, json).await;
    }
    let db = state.path().join(STATE_DB_FILE);
    let options = crate::store::sqlite_options(config);
    let before = clawgate_store_sqlite::migration_status(&db, &options)?;
    let from_version = applied_version(&before);
    if from_version > clawgate_store_sqlite::SCHEMA_VERSION {
        // Written by a newer build: there is nothing to apply, and nothing this build may
        // touch; saying "up to date" would hide that it cannot run on it.
        return Err(clawgate_store::StoreError::NewerSchema {
            database: db.display().to_string(),
            found: from_version,
            supported: clawgate_store_sqlite::SCHEMA_VERSION,
        }
        .into());
    }
    let pending: Vec<&MigrationStatus> = before.iter().filter(|m| m.applied_at.is_none()).collect();
    // A running gateway migrated when it started; a stopped one is locked while migrating.
    let _lock = if state.is_locked() || pending.is_empty() {
        None
    } else {
        Some(lock_for_change(&state)?)
    };
    eprintln!("state database {}", db.display());
    let after = if pending.is_empty() {
        before.clone()
    } else {
        for m in &pending {
            eprintln!("  applying migration {:04} {}…", m.version, m.name);
        }
        clawgate_store_sqlite::migrate_file(&db, &options)?
    };
    let report = MigrateReport {
        state_database: db.display().to_string(),
        from_version,
        to_version: applied_version(&after),
        applied: pending
            .iter()
            .map(|m| format!("{:04} {}", m.version, m.name))
            .collect(),
    };
    print_report(&report, clawgate_store_sqlite::SCHEMA_VERSION, json)
}

/// A shared PostgreSQL state: opening the store migrates it, once, under the database's advisory
/// lock (several gateways may start at the same moment); what this run applied is what
/// carries an applied time from now on.
async fn migrate_shared(config: &Config, state: &StateDir, json: bool) -> CliResult<()> {
    use clawgate_types::clock::Clock as _;
    let started = clawgate_types::clock::SystemClock.now_ms();
    let store =
        crate::store::open(config, state.path(), crate::store::Migrations::Apply, None).await?;
    eprintln!("state database {}", store.database());
    let after = store.migration_status().await?;
    let (now, earlier): (Vec<&MigrationStatus>, Vec<&MigrationStatus>) = after
        .iter()
        .filter(|m| m.applied_at.is_some())
        .partition(|m| m.applied_at.is_some_and(|at| at >= started));
    let report = MigrateReport {
        state_database: store.database(),
        from_version: earlier.iter().map(|m| m.version).max().unwrap_or(0),
        to_version: applied_version(&after),
        applied: now
            .iter()
            .map(|m| format!("{:04} {}", m.version, m.name))
            .collect(),
    };
    print_report(&report, clawgate_store_postgres::SCHEMA_VERSION, json)
}

fn print_report(report: &MigrateReport, this_build: i64, json: bool) -> CliResult<()> {
    if json {
        return print(&format!("{}\n", pretty(report)));
    }
    if report.applied.is_empty() {
        print(&format!(
            "up to date: schema version {} (this build writes {})\n",
            report.to_version, this_build
        ))
    } else {
        print(&format!(
            "migrated: schema version {} -> {}\n",
            report.from_version, report.to_version
        ))
    }
}
