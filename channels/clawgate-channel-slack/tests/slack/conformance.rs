//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(slack, crate::peer::Peer::start().await);
