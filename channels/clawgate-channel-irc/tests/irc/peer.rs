//! An IRC channel built by its factory against a fresh server — ngircd (plain IRC) or InspIRCd
//! (IRCv3 echo-message + labeled-response) — through the relay that can lose answers, with a
//! person and another bot in its channel.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clawgate_channel_irc::{IrcFactory, IrcLink, inbound_event};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

use crate::proxy::Proxy;
use clawgate_channel_irc::testing::{Client, Inspircd, Ircv3, Ngircd, Penalties};

/// The server a test runs against, kept running while held.
#[derive(Debug)]
pub(crate) enum Server {
    Ngircd(Ngircd),
    Inspircd(Inspircd),
}

impl Server {
    pub(crate) fn port(&self) -> u16 {
        match self {
            Server::Ngircd(server) => server.port,
            Server::Inspircd(server) => server.port,
        }
    }
}

pub(crate) const NICK: &str = "claw";
pub(crate) const CHANNEL: &str = "#conformance";

pub(crate) struct Peer {
    pub(crate) plugin: ChannelPlugin,
    pub(crate) person: Client,
    pub(crate) other_bot: Client,
    pub(crate) proxy: Proxy,
    /// Kept running for the peer's life.
    _server: Server,
    /// The channel is `+m` for an injected refusal, lifted at the next look.
    moderated: AtomicBool,
    /// Where the person's lines stood when the channel's link was last cut.
    dropped_at: Mutex<Option<usize>>,
    events: AtomicU64,
}

/// Settings for a channel on `port`, merged over `extra`.
pub(crate) fn settings(port: u16, extra: Value) -> Value {
    let mut merged = json!({
        "server": "127.0.0.1",
        "port": port,
        "nick": NICK,
        "channels": [CHANNEL],
        "bot_nicks": ["otherbot"],
        // The contract server has no flood penalties: no need to hold lines back.
        "flood_burst_bytes": 65536,
        "flood_bytes_per_second": 65536,
        "flood_min_line_bytes": 1,
        "answer_timeout_ms": 5000,
        "send_wait_ms": 10000,
        "reconnect_min_ms": 50,
        "reconnect_max_ms": 500,
    });
    for (key, value) in extra.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

pub(crate) async fn build(settings: Value) -> ChannelPlugin {
    let setup = clawgate_conformance::channel_setup_in_memory(0, "irc", "default", settings);
    IrcFactory.build_with_secrets(&setup, None).await.unwrap()
}

pub(crate) fn link(plugin: &ChannelPlugin) -> std::sync::Arc<IrcLink> {
    plugin
        .extension::<IrcLink>()
        .expect("an IRC plugin carries its link")
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(Penalties::Off, json!({})).await
    }

    /// Against InspIRCd with its IRCv3 modules: receipts are labeled echoes.
    pub(crate) async fn start_inspircd() -> Peer {
        let peer = Peer::on(Server::Inspircd(Inspircd::start(Ircv3::On)), json!({})).await;
        let caps = link(&peer.plugin).capabilities();
        assert!(
            caps.iter().any(|c| c == "labeled-response"),
            "InspIRCd granted labeled-response: {caps:?}"
        );
        peer
    }

    pub(crate) async fn with(penalties: Penalties, extra: Value) -> Peer {
        Peer::on(Server::Ngircd(Ngircd::start(penalties)), extra).await
    }

    pub(crate) async fn on(server: Server, extra: Value) -> Peer {
        let port = server.port();
        let proxy = Proxy::start(port).await;
        let person = Client::connect(port, "ada");
        person.join(CHANNEL);
        let other_bot = Client::connect(port, "otherbot");
        other_bot.join(CHANNEL);
        let plugin = build(settings(proxy.port, extra)).await;
        let peer = Peer {
            plugin,
            person,
            other_bot,
            proxy,
            _server: server,
            moderated: AtomicBool::new(false),
            dropped_at: Mutex::new(None),
            events: AtomicU64::new(0),
        };
        peer.wait_joined(0).await;
        peer
    }

    /// Connects the channel and waits until the person sees it join (after line `from`).
    pub(crate) async fn wait_joined(&self, from: usize) -> String {
        let (nick, _) = link(&self.plugin)
            .wait_up(Duration::from_secs(20))
            .await
            .expect("the channel registers");
        let head = format!(":{nick}!");
        let person = &self.person;
        tokio::task::block_in_place(|| {
            person.wait_for(from, |l| l.starts_with(&head) && l.contains(" JOIN "));
        });
        nick
    }

    /// What the channel's nick said in `target`, as the person saw it.
    pub(crate) fn said(&self, target: &str) -> Vec<String> {
        let person = &self.person;
        tokio::task::block_in_place(|| person.sync());
        let nick = link(&self.plugin)
            .current()
            .map_or_else(|| NICK.to_owned(), |(nick, _)| nick);
        self.person.texts_from(&nick, target)
    }
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, _case: &str) -> MessageTarget {
        // Each case runs on its own server, so one channel is a fresh conversation.
        MessageTarget::group(CHANNEL)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, _count: u32, after: u32) -> bool {
        // The one refusal IRC gives a joined channel: +m without voice (404), until the
        // peer next looks at the channel.
        if kind != DeliveryFailureKind::Permission || after != 0 {
            return false;
        }
        let person = &self.person;
        tokio::task::block_in_place(|| {
            let mark = person.mark();
            person.send(&format!("MODE {CHANNEL} +m"));
            person.wait_for(mark, |l| l.contains(" MODE ") && l.contains("+m"));
        });
        self.moderated.store(true, Ordering::SeqCst);
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.proxy.lose_answer_after(after);
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        let texts = self.said(&target.id);
        if self.moderated.swap(false, Ordering::SeqCst) {
            let person = &self.person;
            tokio::task::block_in_place(|| {
                let mark = person.mark();
                person.send(&format!("MODE {CHANNEL} -m"));
                person.wait_for(mark, |l| l.contains(" MODE ") && l.contains("-m"));
            });
        }
        texts
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // IRC keeps no backlog: after a drop, write only once the channel is back in.
        let dropped = self.dropped_at.lock().unwrap().take();
        let nick = match dropped {
            Some(mark) => self.wait_joined(mark).await,
            None => link(&self.plugin).current()?.0,
        };
        let writer = if bot { &self.other_bot } else { &self.person };
        let line = format!("PRIVMSG {} :{nick}: {text}", target.id);
        tokio::task::block_in_place(|| {
            writer.send(&line);
            writer.sync();
        });
        let n = self.events.fetch_add(1, Ordering::Relaxed);
        Some(inbound_event(
            &format!(":{} {line}", writer.prefix()),
            &nick,
            &format!("peer-{n}"),
        ))
    }

    fn drop_connection(&self) -> bool {
        *self.dropped_at.lock().unwrap() = Some(self.person.mark());
        self.proxy.cut();
        true
    }
}
