//! The channel contract suite against the Feishu simulator.

clawgate_conformance::conformance_tests!(feishu, crate::peer::Peer::start().await);
