//! The channel contract suite against the simulator (a server with the Private API, so edits
//! and unsends are declared and checked).

clawgate_conformance::conformance_tests!(imessage, crate::peer::Peer::start().await);
