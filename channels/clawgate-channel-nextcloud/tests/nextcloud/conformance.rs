//! The channel contract suite against the simulator, once per mode.

clawgate_conformance::conformance_tests!(nextcloud_bot, crate::peer::BotPeer::start().await);
clawgate_conformance::conformance_tests!(nextcloud_user, crate::peer::UserPeer::start().await);
