//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(zalo_personal, crate::peer::Peer::start().await);
