//! The channel contract suite.

clawgate_conformance::conformance_tests!(discord, crate::peer::Peer::start().await);
