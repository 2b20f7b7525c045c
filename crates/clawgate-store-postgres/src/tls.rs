//! TLS to the server: off when every host is this machine, required and verified otherwise.
//! Every connection (the pool's, the migration's, the change feed's) uses the same connector
//! and the same decision, written into the connection settings as `sslmode`.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use clawgate_store::{StoreError, StoreResult};
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

/// Whether connections to the server use TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PostgresTls {
    /// No TLS when every host of the connection string is a loopback address, `localhost` or a
    /// Unix socket directory (the traffic never leaves the machine); TLS required, with the
    /// certificate and host name verified, for any other host.
    #[default]
    Auto,
    /// TLS always, certificate and host name verified.
    Require,
    /// Never TLS: the operator's explicit choice, e.g. for a private network or a tunnel.
    Disable,
}

/// Decides whether `config`'s connections use TLS for `choice`, and writes the decision into
/// `config` as its `sslmode` (`require` or `disable`; never `prefer`, which would fall back to
/// clear text). The connection string's own `sslmode` is honoured where it agrees and refused
/// where it contradicts the choice: `disable` with a remote host under `Auto` needs the explicit
/// [`PostgresTls::Disable`], so a URL copied from a development setup cannot turn TLS off.
pub(crate) fn apply(
    config: &mut tokio_postgres::Config,
    choice: PostgresTls,
    redacted_url: &str,
) -> StoreResult<bool> {
    let url_mode = config.get_ssl_mode();
    let refuse = |why: &str| {
        Err(StoreError::InvalidInput(format!(
            "the PostgreSQL connection string {redacted_url} {why}"
        )))
    };
    let tls = match choice {
        PostgresTls::Require if url_mode == SslMode::Disable => {
            return refuse(
                "says sslmode=disable, but TLS is required: remove sslmode from the URL, or \
                 choose TLS \"disable\" explicitly",
            );
        }
        PostgresTls::Disable if url_mode == SslMode::Require => {
            return refuse(
                "says sslmode=require, but TLS is disabled: remove sslmode from the URL, or \
                 choose TLS \"require\"",
            );
        }
        PostgresTls::Require => true,
        PostgresTls::Disable => false,
        PostgresTls::Auto => match url_mode {
            SslMode::Require => true,
            SslMode::Disable if !all_hosts_local(config) => {
                return refuse(
                    "says sslmode=disable for a host on another machine: to send the traffic \
                     in clear text, choose TLS \"disable\" explicitly (PostgresOptions::tls, \
                     [state] postgres_tls); otherwise remove sslmode from the URL",
                );
            }
            // `prefer` is also what a URL without sslmode reads as: the host decides.
            _ => !all_hosts_local(config),
        },
    };
    config.ssl_mode(if tls {
        SslMode::Require
    } else {
        SslMode::Disable
    });
    Ok(tls)
}

/// Whether every host `config` may connect to is this machine. A `hostaddr` is where the
/// connection goes, so both it and its host name must be local.
pub(crate) fn all_hosts_local(config: &tokio_postgres::Config) -> bool {
    let hosts_local = config.get_hosts().iter().all(|host| match host {
        Host::Tcp(name) => is_local_name(name),
        Host::Unix(_) => true,
    });
    hosts_local && config.get_hostaddrs().iter().all(is_loopback)
}

fn is_local_name(name: &str) -> bool {
    let name = name.trim_start_matches('[').trim_end_matches(']');
    match name.parse::<IpAddr>() {
        Ok(ip) => is_loopback(&ip),
        Err(_) => name.eq_ignore_ascii_case("localhost"),
    }
}

fn is_loopback(ip: &IpAddr) -> bool {
    // `::ffff:127.0.0.1` is IPv4's loopback too.
    ip.to_canonical().is_loopback()
}

/// The connector every connection uses: Mozilla's roots (`webpki-roots`) plus the certificates
/// of `ca_file` (PEM), on rustls with `ring`. It only acts when `sslmode` asks for TLS.
pub(crate) fn connector(ca_file: Option<&Path>) -> StoreResult<MakeRustlsConnect> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        for cert in read_ca_file(path)? {
            roots
                .add(cert)
                .map_err(|e| bad_ca_file(path, &e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Backend(Box::new(e)))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn read_ca_file(path: &Path) -> StoreResult<Vec<CertificateDer<'static>>> {
    let text = std::fs::read(path).map_err(|e| bad_ca_file(path, &e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_ca_file(path, &format!("it is not PEM ({e})")))?;
    if certs.is_empty() {
        return Err(bad_ca_file(
            path,
            "it holds no certificate (expected PEM \"BEGIN CERTIFICATE\" blocks)",
        ));
    }
    Ok(certs)
}

fn bad_ca_file(path: &Path, why: &str) -> StoreError {
    StoreError::InvalidInput(format!(
        "the PostgreSQL CA file {} is not usable: {why}",
        path.display()
    ))
}

/// What to do about a failed TLS handshake or a server without TLS; `None` for other failures.
pub(crate) fn failure_detail(error: &tokio_postgres::Error) -> Option<String> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let rustls_error = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .or_else(|| cause.downcast_ref::<rustls::Error>());
        match rustls_error {
            Some(rustls::Error::InvalidCertificate(why)) => {
                return Some(format!(
                    "TLS certificate verification failed ({why:?}): the server's certificate \
                     is not signed by a trusted CA or does not name the host connected to; give \
                     the CA that signed it as the CA file (PostgresOptions::ca_file, [state] \
                     postgres_ca_file) and connect by a host name the certificate names"
                ));
            }
            Some(other) => {
                return Some(format!(
                    "the TLS handshake with the server failed ({other}): check the server's \
                     ssl settings and certificate"
                ));
            }
            None => {}
        }
        // tokio-postgres reports a server without TLS by this message only.
        if cause.to_string().contains("server does not support TLS") {
            return Some(
                "the server does not accept TLS, which this connection requires (TLS \
                 \"require\", or \"auto\" with a host on another machine): turn ssl on in the \
                 server's configuration, or, on a trusted private network only, choose TLS \
                 \"disable\" explicitly"
                    .to_owned(),
            );
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn local(url: &str) -> bool {
        all_hosts_local(&url.parse().unwrap())
    }

    fn decide(url: &str, choice: PostgresTls) -> StoreResult<bool> {
        let mut config: tokio_postgres::Config = url.parse().unwrap();
        let tls = apply(&mut config, choice, url)?;
        let want = if tls {
            SslMode::Require
        } else {
            SslMode::Disable
        };
        assert_eq!(config.get_ssl_mode(), want, "{url}");
        Ok(tls)
    }

    #[test]
    fn loopback_hosts_are_local() {
        for url in [
            "postgres://gw@127.0.0.1:5432/state",
            "postgres://gw@127.8.9.10/state",
            "postgres://gw@[::1]:5432/state",
            "host=::1 user=gw",
            "postgres://gw@localhost/state",
            "postgres://gw@LOCALHOST/state",
            "host=/var/run/postgresql user=gw dbname=state",
            "postgres://gw@%2Fvar%2Frun%2Fpostgresql/state",
            "postgres://gw@localhost,127.0.0.1,[::1]/state",
            "host=localhost hostaddr=127.0.0.1 user=gw",
            "host=::ffff:127.0.0.1 user=gw",
        ] {
            assert!(local(url), "{url} is this machine");
        }
    }

    #[test]
    fn any_remote_host_is_not_local() {
        for url in [
            "postgres://gw@db.example.com/state",
            "postgres://gw@10.0.0.5/state",
            "postgres://gw@[2001:db8::1]/state",
            "postgres://gw@localhost,db.example.com/state",
            "postgres://gw@127.0.0.1,10.0.0.5:5433/state",
            "host=localhost hostaddr=10.0.0.5 user=gw",
            "postgres://gw@localhost.example.com/state",
        ] {
            assert!(!local(url), "{url} leaves the machine");
        }
    }

    #[test]
    fn auto_uses_tls_exactly_for_remote_hosts() {
        assert!(!decide("postgres://gw@127.0.0.1/s", PostgresTls::Auto).unwrap());
        assert!(!decide("postgres://gw@localhost/s", PostgresTls::Auto).unwrap());
        assert!(decide("postgres://gw@db.example.com/s", PostgresTls::Auto).unwrap());
        assert!(
            decide(
                "postgres://gw@localhost,db.example.com/s",
                PostgresTls::Auto
            )
            .unwrap()
        );
        // `prefer` would fall back to clear text; the host decides instead.
        assert!(decide("postgres://gw@db/s?sslmode=prefer", PostgresTls::Auto).unwrap());
        assert!(
            decide(
                "postgres://gw@localhost/s?sslmode=require",
                PostgresTls::Auto
            )
            .unwrap()
        );
        assert!(
            !decide(
                "postgres://gw@localhost/s?sslmode=disable",
                PostgresTls::Auto
            )
            .unwrap()
        );
    }

    #[test]
    fn explicit_choices_win_and_contradictions_are_refused() {
        assert!(decide("postgres://gw@127.0.0.1/s", PostgresTls::Require).unwrap());
        assert!(!decide("postgres://gw@db.example.com/s", PostgresTls::Disable).unwrap());
        assert!(
            !decide(
                "postgres://gw@db.example.com/s?sslmode=disable",
                PostgresTls::Disable
            )
            .unwrap()
        );
        for (url, choice, says) in [
            (
                "postgres://gw@db.example.com/s?sslmode=disable",
                PostgresTls::Auto,
                "choose TLS \"disable\" explicitly",
            ),
            (
                "postgres://gw@localhost/s?sslmode=disable",
                PostgresTls::Require,
                "TLS is required",
            ),
            (
                "postgres://gw@db/s?sslmode=require",
                PostgresTls::Disable,
                "TLS is disabled",
            ),
        ] {
            match decide(url, choice) {
                Err(StoreError::InvalidInput(message)) => {
                    assert!(message.contains(says), "{message}");
                }
                other => panic!("{url} with {choice:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn ca_files_must_hold_pem_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificates here\n").unwrap();
        let broken = dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        for path in [&missing, &empty, &broken] {
            match connector(Some(path)) {
                Err(StoreError::InvalidInput(message)) => {
                    assert!(message.contains("CA file"), "{message}");
                    assert!(message.contains(&path.display().to_string()), "{message}");
                }
                Err(other) => panic!("{}: {other:?}", path.display()),
                Ok(_) => panic!("{} was accepted", path.display()),
            }
        }
        assert!(connector(None).is_ok());
    }
}
