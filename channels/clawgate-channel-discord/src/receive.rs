//! Inbound: one `MESSAGE_CREATE` (the Message object of its `d`) → a normalized message.
//!
//! - The event id is the message's snowflake: a resumed session replays the same messages with
//!   the same ids, so a replay is deduplicated by the engine.
//! - Guild channels (and threads, which are channels) are group conversations; a message
//!   without `guild_id` is a DM.
//! - The bot's own messages are ignored (Discord sends every bot its own messages); other bots'
//!   (`author.bot`, or a webhook's) are passed on as bot-written, for the engine's echo drop,
//!   `allow_bots` and loop guard.
//! - A message without text (no MESSAGE_CONTENT intent, only an attachment) is ignored.

use std::collections::BTreeSet;
use std::sync::Arc;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageRelation, MessageTarget};

use crate::adapter::BotCell;
use crate::wire::Message;

/// Normalizes the messages of one bot account.
#[derive(Debug, Clone)]
pub struct DiscordReceiver {
    name: String,
    bot: Arc<BotCell>,
    allowed_guilds: BTreeSet<String>,
    allowed_channels: BTreeSet<String>,
}

impl DiscordReceiver {
    /// The receiver of channel `name` for the bot in `bot`, answering `allowed_guilds` and
    /// `allowed_channels` (everything when empty).
    pub fn new(
        name: &str,
        bot: Arc<BotCell>,
        allowed_guilds: impl IntoIterator<Item = String>,
        allowed_channels: impl IntoIterator<Item = String>,
    ) -> DiscordReceiver {
        DiscordReceiver {
            name: name.to_owned(),
            bot,
            allowed_guilds: allowed_guilds.into_iter().collect(),
            allowed_channels: allowed_channels.into_iter().collect(),
        }
    }

    fn ignored(&self, reason: impl Into<String>) -> ReceiveError {
        ReceiveError::Ignored {
            channel: self.name.clone(),
            reason: reason.into(),
        }
    }
}

impl MessageReceiveAdapter for DiscordReceiver {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let message: Message =
            serde_json::from_value(raw.clone()).map_err(|e| ReceiveError::Malformed {
                channel: self.name.clone(),
                reason: format!("not a Discord message: {e}"),
            })?;
        if self.bot.get().as_deref() == Some(message.author.id.as_str()) {
            return Err(self.ignored("the bot's own message"));
        }
        if let Some(guild) = &message.guild_id
            && !self.allowed_guilds.is_empty()
            && !self.allowed_guilds.contains(guild)
        {
            return Err(self.ignored(format!("guild {guild} is not in allowed_guilds")));
        }
        if !self.allowed_channels.is_empty() && !self.allowed_channels.contains(&message.channel_id)
        {
            return Err(self.ignored(format!(
                "channel {} is not in allowed_channels",
                message.channel_id
            )));
        }
        if message.content.is_empty() {
            return Err(self.ignored(
                "a message without text (an attachment only, or the MESSAGE_CONTENT intent is off)",
            ));
        }
        let target = if message.guild_id.is_some() {
            MessageTarget::group(&message.channel_id)
        } else {
            MessageTarget::direct(&message.channel_id)
        };
        let is_bot = message.author.bot || message.webhook_id.is_some();
        let mut inbound = ChannelMessage::inbound(message.id.clone(), &self.name, target)
            .with_text(&message.content)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        let mut sender = MessageActor::new(message.author.id.clone()).with_is_bot(is_bot);
        sender.display_name = Some(message.author.username.clone());
        inbound.sender = Some(sender);
        if let Some(answered) = message
            .message_reference
            .as_ref()
            .and_then(|r| r.message_id.clone())
        {
            inbound.relation = Some(MessageRelation::reply_to(answered));
        }
        Ok(NormalizedInbound::new(message.id, inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use clawgate_types::TargetKind;
    use serde_json::json;

    use super::*;

    fn receiver() -> DiscordReceiver {
        let bot = Arc::new(BotCell::default());
        bot.set("900");
        DiscordReceiver::new("discord", bot, Vec::new(), Vec::new())
    }

    #[test]
    fn a_guild_message_is_a_group_conversation_keyed_by_its_snowflake() {
        let raw = json!({
            "id": "1001", "channel_id": "55", "guild_id": "7", "content": "hi",
            "author": { "id": "42", "username": "ada" },
            "message_reference": { "message_id": "1000" }
        });
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.event_id, "1001");
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(inbound.message.target.id, "55");
        assert!(!inbound.is_bot_author);
        assert!(
            matches!(inbound.message.relation, Some(MessageRelation::Reply { reply_to_id: Some(ref r), .. }) if r == "1000")
        );
    }

    #[test]
    fn own_empty_and_foreign_guild_messages_are_ignored() {
        let own = json!({ "id": "1", "channel_id": "5", "content": "x", "author": { "id": "900", "username": "me", "bot": true } });
        assert!(matches!(
            receiver().normalize(&own),
            Err(ReceiveError::Ignored { .. })
        ));
        let empty = json!({ "id": "2", "channel_id": "5", "guild_id": "7", "content": "", "author": { "id": "4", "username": "a" } });
        assert!(matches!(
            receiver().normalize(&empty),
            Err(ReceiveError::Ignored { .. })
        ));
        let bot = Arc::new(BotCell::default());
        let only = DiscordReceiver::new("d", bot, vec!["8".to_owned()], Vec::new());
        let foreign = json!({ "id": "3", "channel_id": "5", "guild_id": "7", "content": "x", "author": { "id": "4", "username": "a" } });
        assert!(matches!(
            only.normalize(&foreign),
            Err(ReceiveError::Ignored { .. })
        ));
        assert!(matches!(
            receiver().normalize(&json!({"id": 3})),
            Err(ReceiveError::Malformed { .. })
        ));
    }

    #[test]
    fn dms_are_direct_and_bots_and_webhooks_are_bot_authors() {
        let dm = json!({ "id": "1", "channel_id": "5", "content": "x", "author": { "id": "4", "username": "a" } });
        assert_eq!(
            receiver()
                .normalize(&dm)
                .expect("normalizes")
                .message
                .target
                .kind,
            TargetKind::Direct
        );
        let hook = json!({ "id": "2", "channel_id": "5", "guild_id": "7", "content": "x", "webhook_id": "9", "author": { "id": "9", "username": "hook" } });
        assert!(
            receiver()
                .normalize(&hook)
                .expect("normalizes")
                .is_bot_author
        );
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let guild = json!({
            "id": "1001", "channel_id": "55", "guild_id": "7", "content": "hi",
            "author": { "id": "42", "username": "ada" },
            "message_reference": { "message_id": "1000" }
        });
        let dm = json!({ "id": "1", "channel_id": "5", "content": "x",
            "author": { "id": "4", "username": "a", "bot": true } });
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(), vec![guild, dm]);
    }
}
