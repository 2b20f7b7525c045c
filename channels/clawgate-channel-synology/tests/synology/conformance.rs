//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(synology, crate::peer::Peer::start().await);
