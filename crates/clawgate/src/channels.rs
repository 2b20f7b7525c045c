//! The channel kinds this build knows — one line per channel crate, each behind its cargo
//! feature (`channel-<kind>`, all on by default) — and the configured channel accounts built
//! from them. A configuration entry's `kind` picks the factory; nothing else in the gateway
//! knows a platform.

use clawgate_channel_sdk::ChannelRegistry;

/// Every channel kind compiled into this build. An embedded QA platform keeps its state (the
/// platform's, not the channel's) in `state_dir`.
pub fn registry(state_dir: &std::path::Path) -> ChannelRegistry {
    #[cfg_attr(
        not(any(
            feature = "channel-qa",
            feature = "channel-telegram",
            feature = "channel-matrix",
            feature = "channel-irc",
            feature = "channel-twitch",
            feature = "channel-slack",
            feature = "channel-nostr",
            feature = "channel-discord",
            feature = "channel-mattermost",
            feature = "channel-googlechat",
            feature = "channel-line",
            feature = "channel-whatsapp",
            feature = "channel-zalo",
            feature = "channel-signal",
            feature = "channel-synology",
            feature = "channel-nextcloud",
            feature = "channel-teams",
            feature = "channel-feishu",
            feature = "channel-tlon",
            feature = "channel-imessage",
            feature = "channel-qq",
            feature = "channel-zalo-personal",
        )),
        allow(unused_mut)
    )]
    let mut registry = ChannelRegistry::new();
    #[cfg(not(feature = "channel-qa"))]
    let _ = state_dir;
    #[cfg(feature = "channel-qa")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_qa::QaFactory::keeping_platforms_in(state_dir),
    ));
    #[cfg(feature = "channel-telegram")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_telegram::TelegramFactory,
    ));
    #[cfg(feature = "channel-matrix")]
    registry.register(std::sync::Arc::new(clawgate_channel_matrix::MatrixFactory));
    #[cfg(feature = "channel-irc")]
    registry.register(std::sync::Arc::new(clawgate_channel_irc::IrcFactory));
    #[cfg(feature = "channel-twitch")]
    registry.register(std::sync::Arc::new(clawgate_channel_twitch::TwitchFactory));
    #[cfg(feature = "channel-slack")]
    registry.register(std::sync::Arc::new(clawgate_channel_slack::SlackFactory));
    #[cfg(feature = "channel-nostr")]
    registry.register(std::sync::Arc::new(clawgate_channel_nostr::NostrFactory));
    #[cfg(feature = "channel-discord")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_discord::DiscordFactory::default(),
    ));
    #[cfg(feature = "channel-mattermost")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_mattermost::MattermostFactory,
    ));
    #[cfg(feature = "channel-googlechat")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_googlechat::GoogleChatFactory,
    ));
    #[cfg(feature = "channel-line")]
    registry.register(std::sync::Arc::new(clawgate_channel_line::LineFactory));
    #[cfg(feature = "channel-whatsapp")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_whatsapp::WhatsAppFactory,
    ));
    #[cfg(feature = "channel-zalo")]
    registry.register(std::sync::Arc::new(clawgate_channel_zalo::ZaloFactory));
    #[cfg(feature = "channel-signal")]
    registry.register(std::sync::Arc::new(clawgate_channel_signal::SignalFactory));
    #[cfg(feature = "channel-synology")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_synology::SynologyFactory,
    ));
    #[cfg(feature = "channel-nextcloud")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_nextcloud::NextcloudFactory,
    ));
    #[cfg(feature = "channel-teams")]
    registry.register(std::sync::Arc::new(clawgate_channel_teams::TeamsFactory));
    #[cfg(feature = "channel-feishu")]
    registry.register(std::sync::Arc::new(clawgate_channel_feishu::FeishuFactory));
    #[cfg(feature = "channel-tlon")]
    registry.register(std::sync::Arc::new(clawgate_channel_tlon::TlonFactory));
    #[cfg(feature = "channel-imessage")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_imessage::ImessageFactory,
    ));
    #[cfg(feature = "channel-qq")]
    registry.register(std::sync::Arc::new(clawgate_channel_qq::QqFactory));
    #[cfg(feature = "channel-zalo-personal")]
    registry.register(std::sync::Arc::new(
        clawgate_channel_zalo_personal::ZaloPersonalFactory,
    ));
    registry
}

/// One configured chat account (the turn engine's type: it is what a turn runs on).
pub use clawgate_turns::Channel;
