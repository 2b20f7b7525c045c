//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(googlechat, crate::peer::Peer::start().await);
