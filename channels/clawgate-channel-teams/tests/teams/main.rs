//! The Teams channel against the simulator over real HTTP on loopback: the channel contract
//! suite (group chats, and one-on-one chats where previews are Teams streams), the simulator's
//! Bot Connector rules, the sends and streams as Teams answers them, the inbound activities
//! with their Bot Framework tokens, and the cross-check with Microsoft's own Bot Builder.
#![allow(clippy::unwrap_used)]

mod botbuilder;
mod conformance;
mod connector;
mod inbound;
mod peer;
mod references;
mod send;
