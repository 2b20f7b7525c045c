//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(tlon, crate::peer::Peer::start().await);
