//! End-to-end tests of the real `clawgate` binary: a conversation through the QA platform,
//! SIGKILL mid-reply and restart, two gateways side by side, and the chat page in a browser.

mod browser;
mod conversation;
mod crash;
mod isolation;
mod support;
mod webdriver;
