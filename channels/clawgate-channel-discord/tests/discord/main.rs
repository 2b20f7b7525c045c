//! The Discord channel against the Discord simulator over real HTTP and websockets on loopback:
//! the channel contract suite, the simulator's own REST and Gateway facts, and the Discord
//! behaviours the contract does not name (nonce window, locked-down mentions, buckets, the
//! Gateway's resume, the echo registry in a shared room).
#![allow(clippy::unwrap_used)]

mod conformance;
mod discordjs;
mod gateway;
mod peer;
mod rooms;
mod send;
mod simulator;
