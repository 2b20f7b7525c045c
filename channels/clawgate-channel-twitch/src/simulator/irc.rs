//! TMI, Twitch's IRC dialect, over TCP and over WebSocket: one handler of lines, two ways of
//! carrying them (a WebSocket text frame may hold several CRLF-separated lines).

use std::sync::Arc;

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use irc_proto::{Command, Message};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::state::{Conn, MAX_CHARS, Out, Posted, State, badges, tag_string};
use super::{FaultKind, Inner, Via};

const HOST: &str = "tmi.twitch.tv";

pub(crate) async fn serve_tcp(inner: Arc<Inner>, listener: TcpListener) {
    let mut shutdown = inner.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                tokio::spawn(tcp_connection(inner.clone(), stream));
            }
            _ = shutdown.wait_for(|s| *s) => return,
        }
    }
}

async fn tcp_connection(inner: Arc<Inner>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = open(&inner, tx);
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            match out {
                Out::Line(line) => {
                    if write
                        .write_all(format!("{line}\r\n").as_bytes())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                Out::Close => break,
            }
        }
        let _ = write.shutdown().await;
    });
    let mut lines = BufReader::new(read).lines();
    let mut closed = std::pin::pin!(writer);
    loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => on_line(&inner, id, &line),
                _ => break,
            },
            _ = &mut closed => break,
        }
    }
    inner.state().conns.remove(&id);
}

pub(crate) async fn serve_ws(inner: Arc<Inner>, listener: TcpListener) {
    let mut shutdown = inner.shutdown.subscribe();
    let app = axum::Router::new()
        .route("/", axum::routing::get(upgrade))
        .with_state(inner.clone());
    let _ = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
}

async fn upgrade(
    axum::extract::State(inner): axum::extract::State<Arc<Inner>>,
    ws: WebSocketUpgrade,
) -> axum::response::Response {
    ws.protocols(["irc"])
        .on_upgrade(move |socket| ws_connection(inner, socket))
}

async fn ws_connection(inner: Arc<Inner>, mut socket: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let id = open(&inner, tx);
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Line(line)) => {
                    if socket.send(WsMessage::Text(format!("{line}\r\n").into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close) | None => {
                    let _ = socket.send(WsMessage::Close(None)).await;
                    break;
                }
            },
            frame = socket.recv() => match frame {
                Some(Ok(WsMessage::Text(text))) => {
                    for line in text.split(['\r', '\n']).filter(|l| !l.is_empty()) {
                        on_line(&inner, id, line);
                    }
                }
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Binary(_))) => {}
                _ => break,
            },
        }
    }
    inner.state().conns.remove(&id);
}

fn open(inner: &Inner, tx: mpsc::UnboundedSender<Out>) -> u64 {
    let mut state = inner.state();
    state.next_conn += 1;
    let id = state.next_conn;
    state.conns.insert(
        id,
        Conn {
            login: None,
            pass: None,
            tags: false,
            commands: false,
            joined: Default::default(),
            tx,
            pongs: 0,
        },
    );
    id
}

fn tag<'a>(message: &'a Message, key: &str) -> Option<&'a str> {
    message
        .tags
        .as_ref()?
        .iter()
        .find(|t| t.0 == key)
        .and_then(|t| t.1.as_deref())
}

/// One line from client `id`.
fn on_line(inner: &Inner, id: u64, line: &str) {
    if line.trim().eq_ignore_ascii_case("PING") {
        // A bare PING (tmi.js's keepalive) is answered without a prefix, as Twitch does.
        if let Some(conn) = inner.state().conns.get(&id) {
            conn.send(format!("PONG :{HOST}"));
        }
        return;
    }
    let Ok(message) = line.parse::<Message>() else {
        return;
    };
    let mut guard = inner.state();
    let state = &mut *guard;
    let Some(conn) = state.conns.get_mut(&id) else {
        return;
    };
    let nick = conn.login.clone().unwrap_or_else(|| "*".into());
    match &message.command {
        Command::CAP(_, irc_proto::CapSubCommand::REQ, first, second) => {
            let asked = second.as_deref().or(first.as_deref()).unwrap_or_default();
            let known = [
                "twitch.tv/tags",
                "twitch.tv/commands",
                "twitch.tv/membership",
            ];
            let verdict = if asked.split_whitespace().all(|c| known.contains(&c)) {
                for cap in asked.split_whitespace() {
                    match cap {
                        "twitch.tv/tags" => conn.tags = true,
                        "twitch.tv/commands" => conn.commands = true,
                        _ => {}
                    }
                }
                "ACK"
            } else {
                "NAK"
            };
            conn.send(format!(":{HOST} CAP * {verdict} :{asked}"));
        }
        Command::CAP(_, irc_proto::CapSubCommand::LS, _, _) => {
            conn.send(format!(
                ":{HOST} CAP * LS :twitch.tv/tags twitch.tv/commands twitch.tv/membership"
            ));
        }
        Command::CAP(..) | Command::USER(..) => {}
        Command::PASS(pass) => conn.pass = Some(pass.clone()),
        Command::NICK(login) if conn.login.is_none() => {
            let login = login.to_ascii_lowercase();
            let anonymous = login.starts_with("justinfan");
            let pass = conn.pass.clone().unwrap_or_default();
            if !anonymous {
                let Some(token) = pass.strip_prefix("oauth:") else {
                    conn.send(format!(":{HOST} NOTICE * :Improperly formatted auth"));
                    let _ = conn.tx.send(Out::Close);
                    return;
                };
                let valid = state
                    .users
                    .get(&login)
                    .is_some_and(|u| !token.is_empty() && u.token == token);
                if !valid {
                    if let Some(conn) = state.conns.get(&id) {
                        conn.send(format!(":{HOST} NOTICE * :Login authentication failed"));
                        let _ = conn.tx.send(Out::Close);
                    }
                    return;
                }
            }
            let user_id = state.users.get(&login).map(|u| u.id.clone());
            let Some(conn) = state.conns.get_mut(&id) else {
                return;
            };
            conn.login = Some(login.clone());
            for (code, text) in [
                ("001", "Welcome, GLHF!"),
                ("002", "Your host is tmi.twitch.tv"),
                ("003", "This server is rather new"),
                ("004", "-"),
                ("375", "-"),
                ("372", "You are in a maze of twisty passages, all alike."),
                ("376", ">"),
            ] {
                conn.send(format!(":{HOST} {code} {login} :{text}"));
            }
            if conn.commands && !anonymous {
                let tags = tag_string(&[
                    ("badge-info", String::new()),
                    ("badges", String::new()),
                    ("color", String::new()),
                    ("display-name", login.clone()),
                    ("emote-sets", "0".into()),
                    ("user-id", user_id.unwrap_or_default()),
                    ("user-type", String::new()),
                ]);
                conn.send(format!("{tags} :{HOST} GLOBALUSERSTATE"));
            }
        }
        Command::NICK(_) => {}
        Command::PING(token, _) => conn.send(format!(":{HOST} PONG {HOST} :{token}")),
        Command::PONG(..) => conn.pongs += 1,
        Command::QUIT(_) => {
            let _ = conn.tx.send(Out::Close);
        }
        _ if conn.login.is_none() => {
            // Nothing but registration before NICK: Twitch closes such a link.
            let _ = conn.tx.send(Out::Close);
        }
        Command::JOIN(channels, _, _) => {
            for channel in channels.split(',') {
                join(state, id, channel);
            }
        }
        Command::PART(channels, _) => {
            for channel in channels.split(',') {
                let name = channel.trim_start_matches('#').to_ascii_lowercase();
                if let Some(conn) = state.conns.get_mut(&id)
                    && conn.joined.remove(&name)
                {
                    conn.send(format!(":{nick}!{nick}@{nick}.{HOST} PART #{name}"));
                }
            }
        }
        Command::PRIVMSG(target, text) => {
            privmsg(state, id, &nick, target, text, &message);
        }
        _ => {
            let name = line
                .split_whitespace()
                .find(|w| !w.starts_with(['@', ':']))
                .unwrap_or_default()
                .to_ascii_uppercase();
            conn.send(format!(":{HOST} 421 {nick} {name} :Unknown command"));
        }
    }
}

fn join(state: &mut State, id: u64, channel: &str) {
    let name = channel.trim_start_matches('#').to_ascii_lowercase();
    let Some(conn) = state.conns.get(&id) else {
        return;
    };
    let nick = conn.login.clone().unwrap_or_default();
    if !state.rooms.contains_key(&name) {
        let prefix = if conn.tags {
            "@msg-id=msg_channel_suspended "
        } else {
            ""
        };
        conn.send(format!(
            "{prefix}:{HOST} NOTICE #{name} :This channel does not exist or has been suspended."
        ));
        return;
    }
    let Some(conn) = state.conns.get_mut(&id) else {
        return;
    };
    conn.joined.insert(name.clone());
    conn.send(format!(":{nick}!{nick}@{nick}.{HOST} JOIN #{name}"));
    conn.send(format!(":{nick}.{HOST} 353 {nick} = #{name} :{nick}"));
    conn.send(format!(
        ":{nick}.{HOST} 366 {nick} #{name} :End of /NAMES list"
    ));
    if conn.commands {
        let userstate = userstate_line(state, &name, &nick, None);
        let roomstate = roomstate_line(state, &name, None);
        if let Some(conn) = state.conns.get(&id) {
            conn.send(userstate);
            conn.send(roomstate);
        }
    }
}

fn privmsg(state: &mut State, id: u64, nick: &str, target: &str, text: &str, message: &Message) {
    let Some(channel) = target.strip_prefix('#').map(str::to_ascii_lowercase) else {
        // Whispers over IRC are gone (Twitch: Helix only).
        return;
    };
    if nick.starts_with("justinfan") {
        // Anonymous logins read only: Twitch ignores what they send.
        return;
    }
    let notice = |state: &State, msg_id: &str, text: &str| {
        if let Some(conn) = state.conns.get(&id) {
            let prefix = if conn.tags {
                format!("@msg-id={msg_id} ")
            } else {
                String::new()
            };
            conn.send(format!("{prefix}:{HOST} NOTICE #{channel} :{text}"));
        }
    };
    let fault = state.take_fault(Via::Irc);
    if let Some(FaultKind::IrcDrop { msg_id, message }) = &fault {
        notice(state, msg_id, message);
        return;
    }
    if text.chars().count() > MAX_CHARS {
        // Twitch documents only the limit; the simulator refuses what is over it.
        notice(
            state,
            "msg_rejected",
            "Your message was not sent because it is too long.",
        );
        return;
    }
    let posted = state.post(
        nick,
        &channel,
        text,
        tag(message, "reply-parent-msg-id"),
        tag(message, "client-nonce"),
        Via::Irc,
    );
    match posted {
        Posted::Sent(sent) => {
            state.relay(&sent, Some(id));
            if matches!(fault, Some(FaultKind::IrcCutAfterPost)) {
                if let Some(conn) = state.conns.get(&id) {
                    let _ = conn.tx.send(Out::Close);
                }
                return;
            }
            if state.conns.get(&id).is_some_and(|c| c.commands) {
                let line = userstate_line(state, &channel, nick, Some(&sent.id));
                if let Some(conn) = state.conns.get(&id) {
                    conn.send(line);
                }
            }
        }
        Posted::Dropped { code, message } => notice(state, &code, &message),
    }
}

/// `USERSTATE #channel` for `login` (with the `id` of the message it just sent, if any).
fn userstate_line(state: &State, channel: &str, login: &str, sent: Option<&str>) -> String {
    let is_mod = state
        .rooms
        .get(channel)
        .is_some_and(|r| r.moderators.contains(login));
    let mut tags = vec![
        ("badge-info", String::new()),
        ("badges", badges(channel, login, state)),
        ("color", String::new()),
        ("display-name", login.to_owned()),
        ("emote-sets", "0".into()),
    ];
    if let Some(id) = sent {
        tags.push(("id", id.to_owned()));
    }
    tags.extend([
        ("mod", if is_mod { "1" } else { "0" }.to_owned()),
        ("subscriber", "0".into()),
        ("user-type", if is_mod { "mod" } else { "" }.to_owned()),
    ]);
    format!("{} :{HOST} USERSTATE #{channel}", tag_string(&tags))
}

fn roomstate_line(state: &State, channel: &str, only: Option<&str>) -> String {
    let room = state.rooms.get(channel);
    let tags = match only {
        Some(change) => format!("@{change};room-id={}", room.map_or("", |r| r.id.as_str())),
        None => tag_string(&[
            ("emote-only", "0".into()),
            ("followers-only", "-1".into()),
            ("r9k", "0".into()),
            ("room-id", room.map(|r| r.id.clone()).unwrap_or_default()),
            ("slow", room.map_or(0, |r| r.slow_secs).to_string()),
            ("subs-only", "0".into()),
        ]),
    };
    format!("{tags} :{HOST} ROOMSTATE #{channel}")
}

/// A fresh `USERSTATE` to `login`'s connections in `channel` (its badges changed).
pub(crate) fn send_userstate_to(state: &State, channel: &str, login: &str, sent: Option<&str>) {
    let line = userstate_line(state, channel, login, sent);
    for conn in state.conns.values() {
        if conn.login.as_deref() == Some(login) && conn.commands && conn.joined.contains(channel) {
            conn.send(line.clone());
        }
    }
}

/// A `ROOMSTATE` with just the change to every connection in `channel`.
pub(crate) fn send_roomstate(state: &State, channel: &str, change: Option<&str>) {
    let line = roomstate_line(state, channel, change);
    for conn in state.conns.values() {
        if conn.commands && conn.joined.contains(channel) {
            conn.send(line.clone());
        }
    }
}
