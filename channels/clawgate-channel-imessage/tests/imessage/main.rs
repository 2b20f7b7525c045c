//! The iMessage channel against the BlueBubbles simulator over real HTTP on loopback: the
//! channel contract suite; the seed's requirement (durable finals populate the sent-echo cache,
//! on the recovery path and after a restart too); sends keyed by `tempGuid` and settled after
//! a lost answer from the chat's own rows; the webhook token checked before parsing; dedupe by
//! message guid; edit and unsend windows; the journal in the gateway's store (imported once,
//! apart per account, shared by gateways); and the cross-check of the simulator with elizaOS's
//! BlueBubbles client.
#![allow(clippy::unwrap_used)]

mod conformance;
mod echoes;
mod elizaos;
mod inbound;
mod peer;
mod send;
mod simulator;
mod state;
