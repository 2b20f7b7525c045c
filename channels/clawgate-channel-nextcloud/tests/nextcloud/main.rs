//! The Nextcloud Talk channel against the Talk simulator over real HTTP on loopback, in both
//! modes: the channel contract suite for the bot and for the user, and the Talk behaviours it
//! does not name (signatures over random ‖ body and random ‖ text, 201 without an id, the
//! referenceId receipt, parked bot unknowns, history lookups for user unknowns, 304 long
//! polls, the edit and delete windows, webhooks answered only after the durable record, own
//! messages never answered, user mode's state in the gateway's store), and the cross-check
//! with `nc-py-api`.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod ncpyapi;
mod peer;
mod send;
mod simulator;
mod state;
