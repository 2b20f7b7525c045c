//! One turn: an inbound event → the conversation's session and signal log → the agent's prompt
//! through the leased ACP runtime → live preview edits → the durable final → receipt. Every
//! reply is keyed by its event (`<channel>:reply:<event>:<generation>`), so a replayed event
//! finds the reply an earlier attempt recorded or delivered and never produces a second one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use clawgate_acpx::EnsureInput;
use clawgate_awareness::{Actor, NewSession, StateChange};
use clawgate_channel_sdk::NormalizedInbound;
use clawgate_messages::{
    AckController, DispatchError, EventHandler, LiveOptions, ReceiveOutcome, Receiver, SendOptions,
    SendOutcome,
};
use clawgate_store::IntentStore;
use clawgate_types::{ChannelMessage, IntentId, IntentStatus, MessageDurabilityPolicy, SessionKey};
use tokio::sync::mpsc;
use tracing::{Instrument, info, warn};

use crate::channels::Channel;

/// Now, in the clock every durable record uses.
pub(crate) fn now_ms() -> clawgate_types::UnixMillis {
    use clawgate_types::clock::Clock as _;
    clawgate_types::clock::SystemClock.now_ms()
}

/// Counters shown by `status` and the control API.
#[derive(Debug, Default)]
pub struct Counters {
    pub turns_in_flight: AtomicUsize,
    /// Receive contexts running (a turn and the write that finishes its inbound record).
    pub receives_in_flight: AtomicUsize,
    pub turns_completed: AtomicU64,
    pub turns_failed: AtomicU64,
}

/// What a turn needs of the gateway: the stores, engines and agents, and the stop signal.
pub struct Turns {
    pub(crate) store: Arc<clawgate_store::SqliteStore>,
    pub(crate) messenger: clawgate_messages::Messenger,
    pub(crate) awareness: Arc<clawgate_awareness::Awareness<clawgate_store::SqliteStore>>,
    pub(crate) acpx: Arc<clawgate_acpx::LifecycleController<clawgate_store::SqliteStore>>,
    /// Agent argv and working directory per agent id.
    pub(crate) agents: std::collections::HashMap<String, (Vec<String>, std::path::PathBuf)>,
    pub(crate) durability: MessageDurabilityPolicy,
    pub(crate) counters: Arc<Counters>,
    pub(crate) stop: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Why a turn did not end with its reply delivered. The event stays unfinished and is tried
/// again (or dead-lettered once its attempts are spent).
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error("state database: {0}")]
    Store(#[from] clawgate_store::StoreError),
    #[error("session registry: {0}")]
    Session(String),
    #[error("no agent {0:?} is configured for this channel")]
    NoAgent(String),
    #[error("agent turn failed: {0}")]
    Agent(Box<clawgate_acpx::AcpxError>),
    #[error("the reply's intent could not be recorded: {0}")]
    Recording(clawgate_messages::MessagesError),
    #[error("the final could not be recorded or sent: {0}")]
    Final(clawgate_messages::MessagesError),
    #[error("the reply's intent could not be read or worked on: {0}")]
    Recovery(clawgate_messages::MessagesError),
    #[error("the reply's intent {0} is gone")]
    IntentGone(IntentId),
    #[error("the reply could not be delivered: {0}")]
    Undelivered(String),
    #[error(
        "an earlier reply to event {event} (intent {intent}) is still streaming elsewhere or its \
         preview could not be removed yet"
    )]
    StreamStillOpen { event: String, intent: IntentId },
    #[error("event {0} had 1000 abandoned replies; giving up")]
    TooManyReplies(String),
    #[error("stopping before the reply was delivered")]
    Stopping,
}

impl From<clawgate_acpx::AcpxError> for TurnError {
    fn from(error: clawgate_acpx::AcpxError) -> TurnError {
        TurnError::Agent(Box::new(error))
    }
}

/// A channel's inbound events, through its receive context, to turns.
pub(crate) struct TurnHandler {
    pub(crate) turns: Arc<Turns>,
    pub(crate) channel: Arc<Channel>,
    pub(crate) receiver: Receiver,
}

#[async_trait::async_trait]
impl EventHandler for TurnHandler {
    async fn handle(&self, raw: &serde_json::Value, ack: &AckController, attempt: u32) -> bool {
        let gateway = &self.turns;
        let channel = &self.channel;
        let span = tracing::info_span!("turn", channel = %channel.name, attempt);
        gateway
            .counters
            .receives_in_flight
            .fetch_add(1, Ordering::SeqCst);
        let outcome = self
            .receiver
            .receive_or_settle(
                raw,
                ack,
                |inbound| async move {
                    // A turn cut short by a stop is not the message's failure: its attempt is
                    // given back.
                    gateway.turn(channel, inbound).await.map_err(|e| {
                        if gateway.stopping() {
                            DispatchError::interrupted(e.to_string())
                        } else {
                            DispatchError::from(e.to_string())
                        }
                    })
                },
                |inbound| async move { gateway.settle(channel, inbound).await },
            )
            .instrument(span)
            .await;
        gateway
            .counters
            .receives_in_flight
            .fetch_sub(1, Ordering::SeqCst);
        match &outcome {
            Ok(ReceiveOutcome::Failed {
                dead_lettered: false,
                error,
                ..
            }) => {
                warn!(%error, attempt, "turn failed; retrying");
                false
            }
            Ok(ReceiveOutcome::Failed {
                dead_lettered: true,
                error,
                ..
            }) => gateway.tell_of_failure(channel, raw, error).await,
            // Dead-lettered by an earlier run that may have died before its notice was
            // recorded: the notice is keyed by the event, so this sends it at most once.
            Ok(ReceiveOutcome::Duplicate {
                status: clawgate_store::InboundStatus::DeadLettered,
            }) => {
                gateway
                    .tell_of_failure(channel, raw, "dead-lettered by an earlier run")
                    .await
            }
            Ok(_) => true,
            Err(e) => {
                warn!(error = %e, attempt, "receive failed; retrying");
                false
            }
        }
    }
}

impl Turns {
    /// Whether the gateway is stopping.
    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// A dead-lettered event gets one visible answer instead of silence: a short notice that the
    /// agent could not answer, marked as gateway-failure output (another gateway in the room
    /// drops it as an echo, by marker). Durable and keyed by the event: sent once. Returns
    /// whether the notice is recorded (else the update stays unfinished and this is asked
    /// again).
    async fn tell_of_failure(
        &self,
        channel: &Channel,
        raw: &serde_json::Value,
        error: &str,
    ) -> bool {
        let Some(Ok(inbound)) = channel.plugin.receiver.as_ref().map(|r| r.normalize(raw)) else {
            return true;
        };
        let key = format!("{}:failure:{}", channel.name, inbound.event_id);
        let mut notice = reply_message(
            channel,
            &inbound,
            &key,
            "The agent could not answer this message; it has been set aside for an operator. \
             Please try again later.",
        );
        notice.origin = Some(clawgate_types::MessageOrigin::gateway_failure(
            clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
        ));
        let options = SendOptions {
            durability: self.durability,
            idempotency_key: Some(key),
            time_to_live_ms: None,
        };
        match self.messenger.send(notice, options).await {
            Ok(report) => {
                if !matches!(
                    report.outcome,
                    SendOutcome::AlreadySent { .. } | SendOutcome::InProgress { .. }
                ) {
                    warn!(event = %inbound.event_id, %error, "turn dead-lettered; the person was told");
                }
                true
            }
            Err(e) => {
                warn!(error = %e, "the failure notice could not be recorded; asked again");
                false
            }
        }
    }

    /// An event whose attempts all died with the process: no agent runs again, but a reply an
    /// attempt delivered (or recorded) before dying is finished and completes the event, and a
    /// stream it left without a final is ended (its preview removed) before the notice goes out.
    async fn settle(&self, channel: &Channel, inbound: NormalizedInbound) -> Result<(), String> {
        let settled = match self.reply_for(channel, &inbound.event_id).await {
            Ok(Reply::Delivered) => Ok(()),
            Ok(Reply::Recorded(id)) => self.await_reply(&id).await,
            Ok(Reply::New(_)) => return Err(String::new()),
            Err(e) => Err(e),
        };
        settled.map_err(|e| e.to_string())
    }

    /// One agent turn for an inbound message. Returns an error (retried) when the reply could
    /// not be produced; never sends a second reply for the same event.
    pub(crate) async fn turn(
        &self,
        channel: &Channel,
        inbound: NormalizedInbound,
    ) -> Result<(), TurnError> {
        self.counters.turns_in_flight.fetch_add(1, Ordering::SeqCst);
        let result = self.turn_inner(channel, inbound).await;
        self.counters.turns_in_flight.fetch_sub(1, Ordering::SeqCst);
        match &result {
            Ok(()) => self
                .counters
                .turns_completed
                .fetch_add(1, Ordering::Relaxed),
            Err(_) => self.counters.turns_failed.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    async fn turn_inner(
        &self,
        channel: &Channel,
        inbound: NormalizedInbound,
    ) -> Result<(), TurnError> {
        let conversation = inbound.message.target.id.clone();
        let session = session_key_for(&channel.agent_id, &channel.name, &conversation)?;
        self.register(&session, &channel.agent_id, &conversation)
            .await?;
        let author = inbound
            .message
            .sender
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), |s| s.id.clone());
        // Best effort and deduplicated: a replayed turn logs the message once.
        self.awareness
            .record(
                &session,
                StateChange::human_direct_message(Actor::human(author), &channel.name)
                    .with_dedupe_key(format!("inbound:{}:{}", channel.name, inbound.event_id)),
            )
            .await;

        let reply_key = match self.reply_for(channel, &inbound.event_id).await? {
            Reply::New(key) => key,
            Reply::Delivered => {
                info!(event = %inbound.event_id, "the reply to this event was delivered already; nothing to do");
                return Ok(());
            }
            Reply::Recorded(id) => {
                // An earlier attempt recorded the final: it is delivered (or reconciled) before
                // the event is completed, never produced a second time.
                info!(event = %inbound.event_id, intent = %id, "the final of this event is recorded; finishing its delivery");
                return self.await_reply(&id).await;
            }
        };
        let (argv, cwd) = self
            .agents
            .get(&channel.agent_id)
            .cloned()
            .ok_or_else(|| TurnError::NoAgent(channel.agent_id.clone()))?;
        let handle = self
            .acpx
            .ensure_session(EnsureInput {
                session_key: session.clone(),
                agent_id: channel.agent_id.clone(),
                owner_session_key: session.clone(),
                spawned_by: None,
                adapter: argv,
                cwd,
                now: now_ms(),
            })
            .await?;

        let reply = reply_message(channel, &inbound, &reply_key, "");
        let options = SendOptions {
            durability: self.durability,
            idempotency_key: Some(reply_key.clone()),
            time_to_live_ms: None,
        };
        let prompt = inbound
            .message
            .body
            .as_ref()
            .map(|b| b.text.clone())
            .unwrap_or_default();
        // Previews need a durable intent (a preview must never be orphaned): without one the
        // reply is sent once, at the end.
        let mut live = match options.durability {
            MessageDurabilityPolicy::Disabled => None,
            policy => match self
                .messenger
                .begin_live(reply.clone(), options.clone(), LiveOptions::default())
                .await
            {
                Ok(live) => Some(live),
                Err(e) if policy == MessageDurabilityPolicy::BestEffort => {
                    warn!(error = %e, "no durable intent for the reply (best_effort): no preview, sending at the end");
                    None
                }
                Err(e) => return Err(TurnError::Recording(e)),
            },
        };

        // The agent streams chunks; the preview shows the text so far (edits coalesced by the
        // live context to the platform's rate).
        let (text_tx, mut text_rx) = mpsc::unbounded_channel::<String>();
        let mut so_far = String::new();
        let prompt_turn = self.acpx.prompt(&handle, &prompt, move |chunk| {
            so_far.push_str(chunk);
            let _ = text_tx.send(so_far.clone());
        });
        let preview = async {
            let mut error = None;
            while let Some(mut text) = text_rx.recv().await {
                while let Ok(newer) = text_rx.try_recv() {
                    text = newer;
                }
                if let Some(live) = live.as_mut()
                    && error.is_none()
                    && let Err(e) = live.update(&text).await
                {
                    error = Some(e.to_string());
                }
            }
            error
        };
        let (outcome, preview_error) = tokio::join!(prompt_turn, preview);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                if let Some(live) = live {
                    let _ = live.abandon().await;
                }
                return Err(TurnError::Agent(Box::new(e)));
            }
        };
        if let Some(e) = preview_error {
            warn!(error = %e, "preview update failed; the final is still delivered");
        }
        let mut text = outcome.chunks.concat();
        if text.trim().is_empty() {
            text = format!(
                "(the agent ended its turn without text: {:?})",
                outcome.stop_reason
            );
        }
        let final_message = reply_message(channel, &inbound, &reply_key, &text);
        let report = match live {
            Some(live) => live.finalize(final_message).await,
            None => self.messenger.send(final_message, options).await,
        }
        .map_err(TurnError::Final)?;
        // The event is completed only once its final is committed: a final that is scheduled
        // for a retry or being reconciled is waited for here.
        match (&report.outcome, &report.intent_id) {
            (
                SendOutcome::Sent { .. }
                | SendOutcome::AlreadySent { .. }
                | SendOutcome::Partial { .. },
                _,
            )
            | (_, None) => {}
            (_, Some(id)) => self.await_reply(id).await?,
        }
        info!(outcome = ?report.outcome, "reply delivered");
        self.awareness
            .record(
                &session,
                StateChange::run_completed(Actor::agent(&session), "reply delivered")
                    .with_dedupe_key(format!("reply:{reply_key}")),
            )
            .await;
        Ok(())
    }

    /// Creates the session row on first contact.
    async fn register(
        &self,
        session: &SessionKey,
        agent_id: &str,
        conversation: &str,
    ) -> Result<(), TurnError> {
        let known = self
            .awareness
            .session(session)
            .await
            .map_err(|e| TurnError::Session(e.to_string()))?;
        if known.is_none() {
            let mut new = NewSession::new(session.clone());
            new.agent_id = Some(agent_id.to_owned());
            new.label = Some(conversation.to_owned());
            self.awareness
                .create_session(new, Actor::system("gateway"))
                .await
                .map_err(|e| TurnError::Session(e.to_string()))?;
        }
        Ok(())
    }

    /// Where this event's reply stands. Generations of one event's reply are keyed
    /// `<channel>:reply:<event>:<generation>`; a cancelled one (a stream that never produced
    /// its final) is passed over. A stream an earlier attempt left without a final (a crash,
    /// a store or platform failure) is ended here first — its preview removed, the intent
    /// cancelled — so a fresh reply never stands beside it.
    async fn reply_for(&self, channel: &Channel, event_id: &str) -> Result<Reply, TurnError> {
        for generation in 0..1_000u32 {
            let key = format!("{}:reply:{}:{}", channel.name, event_id, generation);
            let found = self.store.find_intent_by_key(&key).await?;
            let Some(intent) = found else {
                return Ok(Reply::New(key));
            };
            match intent.status {
                IntentStatus::Cancelled => continue,
                IntentStatus::Sent => return Ok(Reply::Delivered),
                _ if intent.awaits_final() => {
                    let ended = self
                        .messenger
                        .recover_intent(&intent.id)
                        .await
                        .map_err(TurnError::Recovery)?;
                    if ended.is_some_and(|i| i.status == IntentStatus::Cancelled) {
                        continue;
                    }
                    return Err(TurnError::StreamStillOpen {
                        event: event_id.to_owned(),
                        intent: intent.id,
                    });
                }
                _ => return Ok(Reply::Recorded(intent.id)),
            }
        }
        Err(TurnError::TooManyReplies(event_id.to_owned()))
    }

    /// Waits until a recorded final is committed, driving it meanwhile (a retry that is due,
    /// a reconciliation): `Ok` once it is sent, or handed to an operator (an unknown outcome
    /// the adapter cannot reconcile, a cancel); an error when it failed for good.
    async fn await_reply(&self, id: &IntentId) -> Result<(), TurnError> {
        let mut stop = self.stop.clone();
        loop {
            let intent = self
                .messenger
                .recover_intent(id)
                .await
                .map_err(TurnError::Recovery)?
                .ok_or_else(|| TurnError::IntentGone(id.clone()))?;
            match intent.status {
                IntentStatus::Sent | IntentStatus::Cancelled => return Ok(()),
                IntentStatus::Failed => {
                    return Err(TurnError::Undelivered(intent.failure.as_ref().map_or_else(
                        || "no failure recorded".to_owned(),
                        |f| f.message.clone(),
                    )));
                }
                IntentStatus::UnknownAfterSend if intent.next_attempt_at.is_none() => {
                    warn!(intent = %id, "the reply's outcome is unknown and this channel cannot tell; left to an operator (outbox list)");
                    return Ok(());
                }
                _ => {}
            }
            if *stop.borrow() {
                return Err(TurnError::Stopping);
            }
            let wait = intent
                .next_attempt_at
                .map_or(250, |at| at.saturating_sub(now_ms()))
                .clamp(50, 1_000);
            tokio::select! {
                _ = stop.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())) => {}
            }
        }
    }
}

/// Where one event's reply stands (see [`Gateway::reply_for`]).
enum Reply {
    /// None yet: start one under this key.
    New(String),
    /// Delivered: nothing to do.
    Delivered,
    /// Its final is recorded and not committed yet.
    Recorded(IntentId),
}

/// `agent:<agent>:<channel>:<conversation>` (characters a key refuses become `_`).
pub fn session_key_for(
    agent_id: &str,
    channel: &str,
    conversation: &str,
) -> Result<SessionKey, TurnError> {
    let clean: String = conversation
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() || c == ':' {
                '_'
            } else {
                c
            }
        })
        .collect();
    SessionKey::for_agent(agent_id, &format!("{channel}:{clean}"))
        .map_err(|e| TurnError::Session(e.to_string()))
}

pub(crate) fn reply_message(
    channel: &Channel,
    inbound: &NormalizedInbound,
    reply_key: &str,
    text: &str,
) -> ChannelMessage {
    // Stable per reply key: the intent and the platform's idempotency key follow it.
    ChannelMessage::outbound(
        reply_key,
        &channel.name,
        inbound.message.target.clone(),
        text,
    )
    .with_account_id(&channel.account)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_keys_are_agent_qualified_and_clean() {
        let key = session_key_for("main", "qa", "dm web:1").expect("key");
        assert_eq!(key.as_str(), "agent:main:qa:dm_web_1");
    }
}
