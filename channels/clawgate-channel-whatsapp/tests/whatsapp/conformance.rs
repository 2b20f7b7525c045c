//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(whatsapp, crate::peer::Peer::start().await);
