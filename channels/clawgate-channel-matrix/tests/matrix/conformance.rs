//! The channel contract suite against Synapse.

clawgate_conformance::conformance_tests!(matrix_synapse, crate::peer::Peer::start().await);
