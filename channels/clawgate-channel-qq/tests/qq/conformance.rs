//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(qq, crate::peer::Peer::start().await);
