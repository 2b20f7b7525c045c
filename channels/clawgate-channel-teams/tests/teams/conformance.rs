//! The channel contract suite against the simulator: in group chats (previews are messages
//! updated in place) and in one-on-one chats (previews are Teams streams).

clawgate_conformance::conformance_tests!(teams, crate::peer::Peer::start().await);
clawgate_conformance::conformance_tests!(teams_personal, crate::peer::Peer::start_personal().await);
