//! The PostgreSQL backend against a real server (`CLAWGATE_TEST_PG_URL`): the store conformance
//! suite, migrations, and what several gateways sharing one database rely on.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod common;
mod conformance;
mod errors;
mod migrations;
mod shared;
mod tls;
