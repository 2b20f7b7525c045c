//! For tests (feature `testing`): the test server every PostgreSQL test uses, and schemas no
//! other test or run uses, so tests share one server without seeing each other's state.

use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// The variable naming the test server (a superuser URL); `cargo xtask ci` sets it to a
/// throwaway cluster, `cargo xtask pg start` prints one for local use.
pub const URL_VAR: &str = "CLAWGATE_TEST_PG_URL";

/// The test server's URL. These tests never run against nothing: without it they fail,
/// saying how to get one (or how to leave them out).
pub fn server_url() -> String {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "PostgreSQL tests need {URL_VAR}; `cargo xtask ci` starts a throwaway cluster, \
             `cargo xtask pg start` prints one for local use; set CLAWGATE_TEST_PG=0 to leave \
             these tests out"
        ),
    }
}

/// A schema name no other test or run uses, from `label`, the process and the clock.
pub fn fresh_schema(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = Sha256::digest(format!("{label}:{}:{nanos}", std::process::id()).as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("t_{hex}")
}
