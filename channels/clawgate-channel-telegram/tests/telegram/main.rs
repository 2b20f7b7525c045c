//! The Telegram channel against the Bot API simulator over real HTTP on loopback: the channel
//! contract suite in polling and webhook mode, and the Telegram behaviours the contract does
//! not name (parse-mode and media fallbacks, group migration, topics, quotes, drafts, typing,
//! 409s, the webhook secret).
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod peer;
mod send;
