//! End-to-end tests of the real `clawgate` binary: a conversation through the QA platform,
//! SIGKILL mid-reply and restart, an agent killed between two messages, two gateways side by
//! side, the chat page and the operator console in a browser, the operator CLI in both modes, a Telegram bot on the Bot
//! API simulator, and every other channel kind on its real server or its simulator (one module
//! per channel: a reply through it, and its random-instant crash matrix).

mod agent_pool;
mod agents;
mod backlog;
mod bots;
mod browser;
mod cli;
mod console;
mod conversation;
mod crash;
mod crash_matrix;
mod crash_points;
mod dead_agent;
mod discord;
mod error_texts;
mod failure;
mod feishu;
mod googlechat;
mod imessage;
mod irc;
mod isolation;
mod line;
mod matrix;
mod mattermost;
mod nextcloud;
mod nostr;
mod notices;
mod platform_faults;
mod plugin_channel;
mod probes;
mod proxy;
mod qq;
mod real_agents;
mod security;
mod shared_postgres;
mod signal;
mod slack;
mod store_faults;
mod support;
mod synology;
mod teams;
mod telegram;
mod tlon;
mod twitch;
mod upgrade;
mod webdriver;
mod whatsapp;
mod zalo;
mod zalo_personal;
