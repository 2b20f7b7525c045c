//! The channel contract suite against the simulator.

clawgate_conformance::conformance_tests!(signal, crate::peer::Peer::start().await);
