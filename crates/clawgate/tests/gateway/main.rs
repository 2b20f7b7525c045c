//! End-to-end tests of the real `clawgate` binary: a conversation through the QA platform,
//! SIGKILL mid-reply and restart, an agent killed between two messages, two gateways side by
//! side, the chat page in a browser, the operator CLI in both modes, a Telegram bot on the Bot
//! API simulator, and a Matrix account on a real Synapse.

mod browser;
mod cli;
mod conversation;
mod crash;
mod crash_matrix;
mod crash_points;
mod dead_agent;
mod discord;
mod failure;
mod isolation;
mod matrix;
mod platform_faults;
mod plugin_channel;
mod store_faults;
mod support;
mod telegram;
mod webdriver;
