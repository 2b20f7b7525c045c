//! What a gateway needs to reach its shared state: the server, the pool, its own instance id.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clawgate_types::GatewayInstanceId;

use crate::PostgresTls;

/// Tunables of the PostgreSQL backend. `Debug` never shows the password of [`url`](Self::url).
#[derive(Clone)]
pub struct PostgresOptions {
    /// A libpq-style connection string: a `postgres://user:password@host:port/dbname` URL or
    /// `host=… user=… password=… dbname=…` pairs. Holds a secret: never log it.
    pub url: String,
    /// Most connections the store's pool opens (the change feed holds one more of its own).
    pub pool_size: usize,
    /// This gateway's instance id. With one shared database every gateway has its own: the
    /// caller keeps it locally (beside its configuration) and passes the same one on each start.
    pub instance: GatewayInstanceId,
    /// How long connecting, and waiting for a pooled connection, may take before an operation
    /// fails as [`StoreError::Unavailable`](clawgate_store::StoreError::Unavailable).
    pub connect_timeout: Duration,
    /// How long a statement waits for a row lock another gateway holds before failing as
    /// [`StoreError::Busy`](clawgate_store::StoreError::Busy) (`lock_timeout`).
    pub lock_timeout: Duration,
    /// The PostgreSQL schema holding the tables (created if missing): several independent states
    /// in one database. Lower-case letters, digits and `_`, starting with a letter or `_`.
    /// `None`: the first schema of the server's `search_path` (usually `public`).
    pub schema: Option<String>,
    /// Whether connections use TLS: by default none to this machine, required and verified to
    /// any other host (see [`PostgresTls`]).
    pub tls: PostgresTls,
    /// A PEM file of CA certificates trusted besides Mozilla's roots (`webpki-roots`): a
    /// private CA's certificate.
    pub ca_file: Option<PathBuf>,
    /// Whether opening applies pending migrations (a gateway's start, `clawgate migrate`), or
    /// refuses a schema that is not current with
    /// [`StoreError::OlderSchema`](clawgate_store::StoreError::OlderSchema) and creates
    /// nothing (an operator's read of a stopped state must not change it).
    pub apply_migrations: bool,
}

impl PostgresOptions {
    /// Options with the defaults: a pool of 8, 10 s to connect, 5 s lock timeout, the default
    /// schema, TLS [`Auto`](PostgresTls::Auto) with Mozilla's roots.
    pub fn new(url: impl Into<String>, instance: GatewayInstanceId) -> PostgresOptions {
        PostgresOptions {
            url: url.into(),
            pool_size: 8,
            instance,
            connect_timeout: Duration::from_secs(10),
            lock_timeout: Duration::from_secs(5),
            schema: None,
            tls: PostgresTls::Auto,
            ca_file: None,
            apply_migrations: true,
        }
    }

    /// The connection string with its password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.url)
    }
}

impl fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &self.redacted_url())
            .field("pool_size", &self.pool_size)
            .field("instance", &self.instance)
            .field("connect_timeout", &self.connect_timeout)
            .field("lock_timeout", &self.lock_timeout)
            .field("schema", &self.schema)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

const HIDDEN: &str = "***";

/// Hides the password of a URL's user info, of a `password=` query parameter, and of a
/// `password=` pair of the key/value form (quoted or not).
pub(crate) fn redact(url: &str) -> String {
    let text = match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let (authority, tail) = rest.split_at(authority_end);
            let authority = match authority.rsplit_once('@') {
                Some((userinfo, hosts)) => match userinfo.split_once(':') {
                    Some((user, _)) => format!("{user}:{HIDDEN}@{hosts}"),
                    None => format!("{userinfo}@{hosts}"),
                },
                None => authority.to_owned(),
            };
            format!("{scheme}://{authority}{tail}")
        }
        None => url.to_owned(),
    };
    redact_password_pairs(&text)
}

/// `password=secret` (after start, space, `?` or `&`) becomes `password=***`; a quoted value
/// ends at its closing quote.
fn redact_password_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("password") {
        let before_ok = at == 0 || matches!(rest.as_bytes()[at - 1], b' ' | b'?' | b'&' | b'\t');
        let after = &rest[at + "password".len()..];
        let eq = after.len() - after.trim_start().len();
        let value_part = &after[eq..];
        if !before_ok || !value_part.starts_with('=') {
            out.push_str(&rest[..at + "password".len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at + "password".len() + eq + 1]);
        let value = value_part[1..].trim_start();
        let skipped = value_part.len() - 1 - value.len();
        let end = if let Some(quoted) = value.strip_prefix('\'') {
            let mut end = quoted.len();
            let mut escaped = false;
            for (i, c) in quoted.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '\'' if !escaped => {
                        end = i + 1;
                        break;
                    }
                    _ => escaped = false,
                }
            }
            (1 + end).min(value.len())
        } else {
            value.find([' ', '&', '\t']).unwrap_or(value.len())
        };
        out.push_str(&" ".repeat(skipped));
        out.push_str(HIDDEN);
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_in_every_form() {
        for (url, want) in [
            (
                "postgres://gw:s3cret@db.example:5433/state",
                "postgres://gw:***@db.example:5433/state",
            ),
            (
                "postgresql://gw:p%40ss@h1,h2/state?sslmode=disable&password=other",
                "postgresql://gw:***@h1,h2/state?sslmode=disable&password=***",
            ),
            (
                "postgres://gw@localhost/state",
                "postgres://gw@localhost/state",
            ),
            (
                "host=db user=gw password=s3cret dbname=state",
                "host=db user=gw password=*** dbname=state",
            ),
            (
                "host=db password = 'a \\' b' dbname=state",
                "host=db password = *** dbname=state",
            ),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
        let options = PostgresOptions::new(
            "postgres://gw:s3cret@db/state",
            GatewayInstanceId::parse("gw-1").unwrap(),
        );
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("gw:***@db/state"), "{shown}");
    }
}
