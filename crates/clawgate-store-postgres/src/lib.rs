//! The PostgreSQL backend of clawgate's storage ports: several gateways sharing one durable
//! state.
//!
//! [`PostgresStore`] implements every port of [`clawgate_store`] with the semantics of the
//! embedded SQLite backend, on a pool of connections to one server. What several gateways need
//! on top of one process's store:
//! * claims of due intents take rows with `FOR UPDATE SKIP LOCKED`, so two gateways never get the
//!   same intent, and a dead gateway's claims free themselves at their deadline
//!   ([`Claim::until`](clawgate_store::Claim::until)): across machines liveness is decided by
//!   deadlines the holder renews, never by process ids;
//! * appends, notices and cursor moves take row locks, so heads stay gap-free and no update is
//!   lost between gateways;
//! * the change feed is `LISTEN`/`NOTIFY`, notified in the writing transaction;
//! * migrations run under an advisory lock, checked by SHA-256 on every open.
//!
//! Each port method is one transaction; one that loses a serialization or deadlock race is run
//! again a few times before it fails as [`StoreError::Busy`].

// The README's example is compiled as a doctest (not run: it needs a server).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

/// Runs `$body` (a block of type `DbResult<T>`, free to use `?`, `.await` and `return`) with
/// `$conn` bound to a pooled connection, outside an explicit transaction: for a job of one
/// statement (its own transaction), or reads whose statements need not share a snapshot. A job
/// that loses a race is run again (see [`MAX_ATTEMPTS`]). Evaluates to `StoreResult<T>`.
macro_rules! run {
    ($store:expr, |$conn:ident| $body:block) => {{
        let store: &$crate::PostgresStore = $store;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let client = match store.client().await {
                Ok(client) => client,
                Err(e) => break Err(e),
            };
            let outcome = async {
                let $conn = &client;
                let value: $crate::errors::DbResult<_> = $body;
                value
            }
            .await;
            match outcome {
                Ok(value) => break Ok(value),
                Err(e) => {
                    if let Err(e) = store.after_failure(e, attempt).await {
                        break Err(e);
                    }
                }
            }
        }
    }};
}

/// [`run!`] in one transaction (read committed) bound to `$conn`: committed when `$body`
/// succeeds, rolled back when it fails (or when the caller stops waiting: dropping an open
/// transaction rolls it back).
macro_rules! transaction {
    ($store:expr, |$conn:ident| $body:block) => {{
        let store: &$crate::PostgresStore = $store;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut client = match store.client().await {
                Ok(client) => client,
                Err(e) => break Err(e),
            };
            let outcome: $crate::errors::DbResult<_> = async {
                let tx = client.transaction().await?;
                let inner = async {
                    let $conn = &tx;
                    let value: $crate::errors::DbResult<_> = $body;
                    value
                }
                .await;
                let value = inner?;
                tx.commit().await?;
                Ok(value)
            }
            .await;
            match outcome {
                Ok(value) => break Ok(value),
                Err(e) => {
                    if let Err(e) = store.after_failure(e, attempt).await {
                        break Err(e);
                    }
                }
            }
        }
    }};
}

mod accounts;
mod channels;
mod errors;
mod feed;
mod inbound;
mod intents;
mod migrate;
mod notices;
mod options;
mod registry;
mod signals;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use clawgate_store::{StoreError, StoreResult};
use clawgate_types::GatewayInstanceId;
use deadpool_postgres::{Client, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::config::Host;
use tokio_postgres_rustls::MakeRustlsConnect;

pub use feed::feed_application_name;
pub use migrate::{MIGRATIONS, Migration, SCHEMA_VERSION};
pub use options::PostgresOptions;
pub use tls::PostgresTls;

use errors::{DbError, ErrorContext, Reaction};

/// How often a transaction that lost a serialization or deadlock race is run again before the
/// store reports [`StoreError::Busy`].
const MAX_ATTEMPTS: u32 = 8;

struct Inner {
    pool: Pool,
    /// Connection settings (search path, timeouts, sslmode) for the change feed's own
    /// connection.
    config: tokio_postgres::Config,
    /// The TLS connector of every connection (acts only when `config`'s sslmode asks for TLS).
    tls: MakeRustlsConnect,
    ctx: ErrorContext,
    instance: GatewayInstanceId,
    schema: String,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("database", &self.ctx.database)
            .field("schema", &self.schema)
            .field("instance", &self.instance)
            .field("pool", &self.pool.status())
            .finish()
    }
}

/// The PostgreSQL implementation of every storage port. Cheap to clone (shared pool).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

impl PostgresStore {
    /// Connects, creates the schema if missing and applies pending migrations (once, however
    /// many gateways start at the same time) — or, without
    /// [`apply_migrations`](PostgresOptions::apply_migrations), only checks that the schema is
    /// current — then opens the pool.
    pub async fn open(options: PostgresOptions) -> StoreResult<PostgresStore> {
        let mut config: tokio_postgres::Config = options.url.parse().map_err(|e| {
            StoreError::InvalidInput(format!(
                "the PostgreSQL connection string {} is invalid: {e}",
                options.redacted_url()
            ))
        })?;
        let ctx = ErrorContext {
            database: database_name(&config),
            lock_timeout_ms: u64::try_from(options.lock_timeout.as_millis()).unwrap_or(u64::MAX),
        };
        if let Some(schema) = &options.schema {
            check_schema_name(schema)?;
        }
        let mut server_options = config.get_options().unwrap_or_default().to_owned();
        server_options.push_str(&format!(" -c lock_timeout={}", ctx.lock_timeout_ms));
        if let Some(schema) = &options.schema {
            server_options.push_str(&format!(" -c search_path={schema}"));
        }
        config
            .options(server_options.trim())
            .connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("clawgate");
        }
        let use_tls = tls::apply(&mut config, options.tls, &options.redacted_url())?;
        let connector = tls::connector(options.ca_file.as_deref())?;
        tracing::debug!(database = %ctx.database, tls = use_tls, "connecting to PostgreSQL");

        let schema = if options.apply_migrations {
            migrate::migrate(&config, &connector, options.schema.as_deref(), &ctx).await?
        } else {
            migrate::require_current(&config, &connector, options.schema.as_deref(), &ctx).await?
        };

        let manager = Manager::from_config(
            config.clone(),
            connector.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                config,
                tls: connector,
                ctx,
                instance: options.instance,
                schema,
            }),
        })
    }

    /// The server and database as `host:port/dbname` (what error messages name).
    pub fn database(&self) -> &str {
        &self.inner.ctx.database
    }

    /// The schema holding this store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    pub(crate) async fn client(&self) -> StoreResult<Client> {
        self.inner
            .pool
            .get()
            .await
            .map_err(|e| self.inner.ctx.map_pool(e))
    }

    /// `Ok` when the failed job should run again (after a short pause that grows with each
    /// attempt, so racing gateways fall out of step); the store's error otherwise.
    pub(crate) async fn after_failure(&self, error: DbError, attempt: u32) -> StoreResult<()> {
        if errors::reaction(&error) == Reaction::Fail {
            return Err(self.inner.ctx.map(error));
        }
        if attempt >= MAX_ATTEMPTS {
            tracing::warn!(database = %self.inner.ctx.database, attempts = attempt, "transaction kept losing races");
            return Err(self.inner.ctx.busy());
        }
        let jitter = u64::from(std::process::id() % 7) + u64::from(attempt) * 3;
        tokio::time::sleep(Duration::from_millis(jitter)).await;
        Ok(())
    }
}

/// `host:port/dbname` of the first host, as error messages name the database.
fn database_name(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(name)) => name.clone(),
        Some(Host::Unix(dir)) => dir.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let dbname = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("{host}:{port}/{dbname}")
}

/// A schema name the store can put into `search_path` and SQL without quoting.
fn check_schema_name(schema: &str) -> StoreResult<()> {
    let mut chars = schema.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if first_ok && rest_ok && schema.len() <= 63 && !schema.starts_with("pg_") {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "PostgreSQL schema name {schema:?} is not usable: use lower-case letters, digits and \
             '_' (at most 63, starting with a letter or '_', not 'pg_')"
        )))
    }
}

/// Integer columns are `BIGINT`; the store's unsigned values are stored as such.
pub(crate) fn i64_of(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

pub(crate) fn u64_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(crate) fn u32_of(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
