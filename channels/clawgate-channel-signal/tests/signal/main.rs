//! The Signal channel against the signal-cli daemon simulator over real TCP and HTTP on
//! loopback: the channel contract suite, the Signal behaviours it does not name (per-recipient
//! results, untrusted identities, 2000-byte bodies, manual receive, sync copies, plain durable
//! finals, unknown sends parked), the simulator's JSON-RPC surface, and the cross-check with
//! pysignalclijsonrpc.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod peer;
mod pysignalclijsonrpc;
mod send;
mod simulator;
