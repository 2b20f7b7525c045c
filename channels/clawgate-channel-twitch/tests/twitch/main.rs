//! The Twitch channel against the Twitch chat simulator on loopback: the simulator's own rules
//! on the wire, the cross-check with tmi.js, the channel contract suite, and what the contract
//! does not name (drop reasons, rate limits by user type, the duplicate rule, IRC sending).
#![allow(clippy::unwrap_used)]

mod conformance;
mod peer;
mod send;
mod simulator;
mod tmijs;
mod twurple;
