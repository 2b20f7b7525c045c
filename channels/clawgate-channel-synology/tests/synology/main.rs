//! The Synology Chat channel against the Chat simulator over real HTTP on loopback: the
//! channel contract suite, and the Synology behaviours it does not name (`success:false` in a
//! 200, the two user-id spaces, the token's quotes, the rate limit, token checks before
//! parsing, dedupe by post id, own posts never answered, plain durable finals), and the
//! cross-check of the simulator with the `synochat` Python package.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod peer;
mod send;
mod simulator;
mod synochat;
