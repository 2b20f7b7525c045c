//! The Tlon channel against the Eyre simulator over real HTTP on loopback: the channel contract
//! suite, the Tlon behaviours it does not name (pokes sent only on their `ok`, client-chosen
//! DM ids, host-assigned post ids settled by scrying, cumulative acks after the durable record,
//! quits and clogs, the model signature and participated threads on the durable path), the
//! channel's state in the gateway's store, and the cross-check of the simulator with Tlon's own `@urbit/http-api`.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod peer;
mod send;
mod simulator;
mod state;
mod urbit_http_api;
