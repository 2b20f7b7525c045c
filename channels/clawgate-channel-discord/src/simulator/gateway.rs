//! The Gateway websocket: hello, heartbeats, identify, resume, dispatches with `s`, invalid
//! sessions, reconnect requests and close codes.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::state::{Conn, Inner, Session};
use crate::wire::{intents, op};

/// What a test asks of a bot's live connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// Drop the TCP connection without a close frame.
    Drop,
    /// Close with this code.
    Close(u16),
    /// Op 7.
    Reconnect,
    /// Op 9 with `d` = resumable.
    Invalidate(bool),
    /// Send the session's message events again (what a resume from an older `seq` replays).
    Replay,
}

/// Every intent bit Discord defines (bits 0-25); anything above is 4013.
const KNOWN_INTENTS: u64 = (1 << 26) - 1;

pub(crate) async fn start(inner: &Arc<Inner>) -> io::Result<()> {
    let listener = TcpListener::bind(inner.config.gateway_bind).await?;
    let _ = inner.gateway_addr.set(listener.local_addr()?);
    let accept_inner = inner.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let inner = accept_inner.clone();
            let handle = tokio::spawn(async move {
                let _ = connection(inner, stream).await;
            });
            accept_inner
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(handle);
        }
    });
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(task);
    Ok(())
}

fn payload(op: u8, d: Value) -> Message {
    Message::Text(
        json!({ "op": op, "d": d, "s": null, "t": null })
            .to_string()
            .into(),
    )
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.to_owned().into(),
    }))
}

/// What one client frame leads to.
enum Step {
    Send(Vec<Message>),
    Close(u16, &'static str),
}

struct Conversation {
    inner: Arc<Inner>,
    conn: u64,
    session: Option<String>,
    sent_upto: u64,
    /// The last frame was a heartbeat (it moves the zombie deadline).
    heartbeat: bool,
}

impl Conversation {
    /// Dispatches of the session not yet sent on this connection.
    fn pending(&mut self) -> Vec<Message> {
        let Some(session) = self.session.clone() else {
            return Vec::new();
        };
        let after = self.sent_upto;
        let conn = self.conn;
        let events: Vec<(u64, String, Value)> = self.inner.with_state(|s| {
            if !s.conns.contains_key(&conn) {
                return Vec::new();
            }
            s.sessions
                .get(&session)
                .filter(|x| x.alive)
                .map(|x| x.events.iter().filter(|e| e.0 > after).cloned().collect())
                .unwrap_or_default()
        });
        events
            .into_iter()
            .map(|(seq, t, d)| {
                self.sent_upto = seq;
                Message::Text(
                    json!({ "op": op::DISPATCH, "d": d, "s": seq, "t": t })
                        .to_string()
                        .into(),
                )
            })
            .collect()
    }

    /// Every message event of the session again.
    fn replay(&mut self) -> Vec<Message> {
        let Some(session) = self.session.clone() else {
            return Vec::new();
        };
        let upto = self.sent_upto;
        let events: Vec<(u64, String, Value)> = self.inner.with_state(|s| {
            s.sessions
                .get(&session)
                .map(|x| {
                    x.events
                        .iter()
                        .filter(|e| e.0 <= upto && e.1.starts_with("MESSAGE_"))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default()
        });
        events
            .into_iter()
            .map(|(seq, t, d)| {
                Message::Text(
                    json!({ "op": op::DISPATCH, "d": d, "s": seq, "t": t })
                        .to_string()
                        .into(),
                )
            })
            .collect()
    }

    fn frame(&mut self, text: &str) -> Step {
        let Ok(frame) = serde_json::from_str::<Value>(text) else {
            return Step::Close(4002, "Error while decoding payload.");
        };
        let Some(code) = frame.get("op").and_then(Value::as_u64) else {
            return Step::Close(4002, "Error while decoding payload.");
        };
        let d = frame.get("d").cloned().unwrap_or(Value::Null);
        let code = u8::try_from(code).unwrap_or(u8::MAX);
        self.heartbeat = code == op::HEARTBEAT;
        match code {
            op::HEARTBEAT => {
                self.inner.with_state(|s| {
                    if let Some(bot) = s.conns.get(&self.conn).and_then(|c| c.bot.clone()) {
                        s.stats.entry(bot).or_default().heartbeats += 1;
                    }
                });
                Step::Send(vec![payload(op::HEARTBEAT_ACK, Value::Null)])
            }
            op::IDENTIFY => self.identify(&d),
            op::RESUME => self.resume(&d),
            _ if self.session.is_none() => Step::Close(4003, "Not authenticated."),
            _ => Step::Close(4001, "Unknown opcode."),
        }
    }

    fn identify(&mut self, d: &Value) -> Step {
        if self.session.is_some() {
            return Step::Close(4005, "Already authenticated.");
        }
        let token = d.get("token").and_then(Value::as_str).unwrap_or_default();
        let wanted = d.get("intents").and_then(Value::as_u64).unwrap_or(0);
        if wanted & !KNOWN_INTENTS != 0 {
            return Step::Close(4013, "Invalid intent(s).");
        }
        if wanted & intents::MESSAGE_CONTENT != 0 && !self.inner.config.message_content_allowed {
            return Step::Close(4014, "Disallowed intent(s).");
        }
        let resume_url = format!("ws://{}", self.inner.gateway_addr());
        let conn = self.conn;
        let ready = self.inner.with_state(|s| {
            let bot = s.token_user(token).filter(|u| u.bot).cloned()?;
            let id = format!("{:032x}", s.snowflake().parse::<u128>().unwrap_or(0) * 0x9e37_79b9);
            let stats = s.stats.entry(bot.id.clone()).or_default();
            stats.identifies += 1;
            stats.sessions += 1;
            stats.intents = wanted;
            let guild = s.guild_id.clone();
            s.sessions.insert(
                id.clone(),
                Session {
                    id: id.clone(),
                    bot: bot.id.clone(),
                    intents: wanted,
                    seq: 1,
                    events: vec![(
                        1,
                        "READY".to_owned(),
                        json!({
                            "v": 10,
                            "user": { "id": bot.id, "username": bot.username, "bot": true, "discriminator": "0" },
                            "guilds": [ { "id": guild, "unavailable": true } ],
                            "session_id": id,
                            "resume_gateway_url": resume_url,
                            "shard": [0, 1],
                            "application": { "id": bot.id, "flags": 0 },
                        }),
                    )],
                    alive: true,
                },
            );
            if let Some(c) = s.conns.get_mut(&conn) {
                c.bot = Some(bot.id.clone());
                c.session = Some(id.clone());
            }
            Some(id)
        });
        let Some(id) = ready else {
            return Step::Close(4004, "Authentication failed.");
        };
        self.session = Some(id);
        self.sent_upto = 0;
        Step::Send(self.pending())
    }

    fn resume(&mut self, d: &Value) -> Step {
        let token = d.get("token").and_then(Value::as_str).unwrap_or_default();
        let session_id = d
            .get("session_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let seq = d.get("seq").and_then(Value::as_u64).unwrap_or(0);
        let conn = self.conn;
        enum Resumed {
            Yes,
            Refused,
            BadToken,
        }
        let outcome = self.inner.with_state(|s| {
            let Some(bot) = s.token_user(token).filter(|u| u.bot).cloned() else {
                return Resumed::BadToken;
            };
            if let Some(c) = s.conns.get_mut(&conn) {
                c.bot = Some(bot.id.clone());
            }
            let resumable = s
                .sessions
                .get(&session_id)
                .is_some_and(|x| x.alive && x.bot == bot.id && seq <= x.seq);
            let stats = s.stats.entry(bot.id.clone()).or_default();
            if !resumable {
                stats.refused_resumes += 1;
                return Resumed::Refused;
            }
            stats.resumes += 1;
            if let Some(c) = s.conns.get_mut(&conn) {
                c.session = Some(session_id.clone());
            }
            Resumed::Yes
        });
        match outcome {
            Resumed::BadToken => Step::Close(4004, "Authentication failed."),
            Resumed::Refused => Step::Send(vec![payload(op::INVALID_SESSION, json!(false))]),
            Resumed::Yes => {
                self.session = Some(session_id.clone());
                self.sent_upto = seq;
                // Missed events first, then RESUMED.
                let mut out = self.pending();
                self.inner.with_state(|s| {
                    if let Some(x) = s.sessions.get_mut(&session_id) {
                        x.seq += 1;
                        let seq = x.seq;
                        x.events.push((seq, "RESUMED".to_owned(), json!({})));
                    }
                });
                out.extend(self.pending());
                Step::Send(out)
            }
        }
    }
}

async fn connection(
    inner: Arc<Inner>,
    stream: TcpStream,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let _ = stream.set_nodelay(true);
    let ws = tokio_tungstenite::accept_async(stream).await?;
    let (mut sink, mut frames) = ws.split();
    let (tx, mut commands) = mpsc::unbounded_channel();
    let conn = inner.with_state(|s| {
        s.next_conn += 1;
        let id = s.next_conn;
        s.conns.insert(
            id,
            Conn {
                bot: None,
                session: None,
                tx,
            },
        );
        id
    });
    let interval = inner.config.heartbeat_interval;
    let mut changed = inner.changed.subscribe();
    let mut shutdown = inner.shutdown.subscribe();
    let mut talk = Conversation {
        inner: inner.clone(),
        conn,
        session: None,
        sent_upto: 0,
        heartbeat: false,
    };
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let result = async {
        sink.send(payload(op::HELLO, json!({ "heartbeat_interval": interval_ms })))
            .await?;
        // Discord closes a connection whose heartbeats stop (a zombie).
        let mut deadline = tokio::time::Instant::now() + interval * 2;
        loop {
            tokio::select! {
                frame = frames.next() => {
                    let text = match frame {
                        Some(Ok(Message::Text(text))) => text.to_string(),
                        Some(Ok(Message::Binary(_))) => {
                            sink.send(close(4002, "Error while decoding payload.")).await?;
                            break;
                        }
                        Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                        Some(Ok(_)) => continue,
                    };
                    let step = talk.frame(&text);
                    if talk.heartbeat {
                        deadline = tokio::time::Instant::now() + interval * 2;
                    }
                    match step {
                        Step::Send(messages) => {
                            for m in messages {
                                sink.send(m).await?;
                            }
                        }
                        Step::Close(code, reason) => {
                            sink.send(close(code, reason)).await?;
                            break;
                        }
                    }
                }
                command = commands.recv() => match command {
                    Some(Command::Drop) | None => break,
                    Some(Command::Close(code)) => {
                        sink.send(close(code, "closed by the simulator")).await?;
                        break;
                    }
                    Some(Command::Replay) => {
                        for m in talk.replay() {
                            sink.send(m).await?;
                        }
                    }
                    Some(Command::Reconnect) => sink.send(payload(op::RECONNECT, Value::Null)).await?,
                    Some(Command::Invalidate(resumable)) => {
                        if !resumable {
                            talk.session = None;
                        }
                        sink.send(payload(op::INVALID_SESSION, json!(resumable))).await?;
                    }
                },
                _ = changed.changed() => {
                    for m in talk.pending() {
                        sink.send(m).await?;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    sink.send(close(4009, "Session timed out.")).await?;
                    break;
                }
                _ = shutdown.changed() => break,
            }
        }
        Ok::<(), tokio_tungstenite::tungstenite::Error>(())
    }
    .await;
    inner.with_state(|s| s.conns.remove(&conn));
    result
}
