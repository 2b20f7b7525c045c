//! End-to-end tests of the real `clawgate` binary: a conversation through the QA platform,
//! SIGKILL mid-reply and restart, an agent killed between two messages, two gateways side by
//! side, the chat page in a browser, the operator CLI in both modes, a Telegram bot on the Bot
//! API simulator, Slack, Discord, Mattermost and Twitch bots on their simulators, a Matrix
//! account on a real Synapse, an IRC nick on a real ngircd, and a Nostr key on a real relay.

mod bots;
mod browser;
mod cli;
mod conversation;
mod crash;
mod crash_matrix;
mod crash_points;
mod dead_agent;
mod discord;
mod failure;
mod irc;
mod isolation;
mod matrix;
mod mattermost;
mod nostr;
mod platform_faults;
mod plugin_channel;
mod slack;
mod store_faults;
mod support;
mod telegram;
mod twitch;
mod webdriver;
