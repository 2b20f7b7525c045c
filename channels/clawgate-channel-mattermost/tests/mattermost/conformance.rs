//! The channel contract suite.

clawgate_conformance::conformance_tests!(mattermost, crate::peer::Peer::start().await);
