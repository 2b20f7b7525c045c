//! The inbound feed: a subscription to the events addressed to our key (`{"kinds":[1059],
//! "#p":[us], "since": …}`, kind 4 under NIP-04) on every relay, pushed to the engine.
//!
//! Relays keep what they stored, so the feed resumes from a durable checkpoint: a file in the
//! channel's state directory holding the last moment when everything the feed had received was
//! recorded by the engine (acked). A run subscribes from that moment minus the two days NIP-59
//! lets a gift wrap's `created_at` lie in the past, minus an hour for slow delivery. What comes
//! again is deduplicated: here within a run (by event id), by the engine across runs (by the
//! message id).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use clawgate_channel_sdk::{EventSink, PushedEvent, PushedFeed, SourceError, TransportAck};
use clawgate_types::DeliveryFailureKind;
use nostr_sdk::pool::{RelayNotification, RelayPoolNotification};
use nostr_sdk::{
    ClientMessage, EventId, Filter, Kind, PublicKey, RelayMessage, RelayStatus, Timestamp,
};
use tokio::sync::broadcast::error::RecvError;

use crate::client::Relays;
use crate::dm::{DmProtocol, TWEAK_RANGE_S};
use crate::receive::inbound_event;

/// Slack for a wrap that reached its relays late.
const LATE_DELIVERY_S: u64 = 60 * 60;

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The pushed feed of one key.
#[derive(Debug, Clone)]
pub struct NostrFeed {
    relays: Relays,
    us: PublicKey,
    protocol: DmProtocol,
    checkpoint: PathBuf,
}

#[derive(Debug, Default)]
struct Progress {
    /// Delivered and not yet acked.
    pending: HashSet<EventId>,
    /// Acked in this run (a relay serving it again is not delivered again).
    done: HashSet<EventId>,
    /// Whether a relay finished its stored events: before that, nothing is caught up.
    caught_up: bool,
    /// An event was nacked: the checkpoint stays where it is for the rest of the run.
    stuck: bool,
}

struct EventAck {
    id: EventId,
    progress: Arc<Mutex<Progress>>,
    checkpoint: PathBuf,
}

fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    progress
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `at` as the checkpoint (write then rename: a crash leaves the old one or the new).
fn store_checkpoint(path: &PathBuf, at: u64) {
    let tmp = path.with_extension("tmp");
    let written = std::fs::write(&tmp, at.to_string()).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), "checkpoint not written: {e}");
    }
}

fn advance(progress: &Progress, checkpoint: &PathBuf) {
    if progress.caught_up && !progress.stuck && progress.pending.is_empty() {
        store_checkpoint(checkpoint, now_s());
    }
}

impl TransportAck for EventAck {
    fn ack(&self) {
        let mut progress = lock(&self.progress);
        progress.pending.remove(&self.id);
        progress.done.insert(self.id);
        advance(&progress, &self.checkpoint);
    }

    fn nack(&self, reason: &str) {
        let mut progress = lock(&self.progress);
        progress.pending.remove(&self.id);
        progress.stuck = true;
        tracing::info!(event = %self.id, "event not taken: {reason}");
    }
}

impl NostrFeed {
    pub(crate) fn new(
        relays: Relays,
        us: PublicKey,
        protocol: DmProtocol,
        checkpoint: PathBuf,
    ) -> NostrFeed {
        NostrFeed {
            relays,
            us,
            protocol,
            checkpoint,
        }
    }

    /// Where the next run starts reading (seconds).
    pub fn since(&self) -> u64 {
        let from = std::fs::read_to_string(&self.checkpoint)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or_else(now_s);
        from.saturating_sub(TWEAK_RANGE_S + LATE_DELIVERY_S)
    }
}

#[async_trait]
impl PushedFeed for NostrFeed {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let kind = match self.protocol {
            DmProtocol::Nip17 => Kind::GiftWrap,
            DmProtocol::Nip04 => Kind::EncryptedDirectMessage,
        };
        let filter = Filter::new()
            .kind(kind)
            .pubkey(self.us)
            .since(Timestamp::from_secs(self.since()));
        let client = self.relays.client();
        let mut notes = client.notifications();
        let sub = client
            .subscribe(filter.clone(), None)
            .await
            .map_err(|e| {
                SourceError::new(DeliveryFailureKind::Transient, format!("subscribe: {e}"))
            })?
            .val;
        // nostr-sdk renews a subscription after a reconnect only when the new connection is
        // in a later second than the subscription: a relay that drops us at once would go
        // quiet. So every reconnect sends the REQ again (the same id replaces it, NIP-01).
        let (reconnected, mut reconnects) = tokio::sync::mpsc::unbounded_channel();
        let watchers: Vec<tokio::task::JoinHandle<()>> = client
            .relays()
            .await
            .into_values()
            .map(|relay| {
                let reconnected = reconnected.clone();
                let mut status = relay.notifications();
                tokio::spawn(async move {
                    loop {
                        match status.recv().await {
                            // After a reconnect, and after NIP-42 AUTH (a relay that
                            // serves gift wraps only to their addressee closes the REQ until
                            // then).
                            Ok(
                                RelayNotification::RelayStatus {
                                    status: RelayStatus::Connected,
                                }
                                | RelayNotification::Authenticated,
                            ) if reconnected.send(relay.clone()).is_err() => return,
                            Ok(RelayNotification::Shutdown) | Err(RecvError::Closed) => return,
                            _ => {}
                        }
                    }
                })
            })
            .collect();
        let progress = Arc::new(Mutex::new(Progress::default()));
        let result = loop {
            let note = tokio::select! {
                () = sink.stopped() => break Ok(()),
                Some(relay) = reconnects.recv() => {
                    let again = ClientMessage::req(sub.clone(), vec![filter.clone()]);
                    if let Err(e) = relay.send_msg(again) {
                        tracing::info!(relay = %relay.url(), "subscription not renewed: {e}");
                    }
                    continue;
                }
                note = notes.recv() => note,
            };
            let (relay, message) = match note {
                Ok(RelayPoolNotification::Message { relay_url, message }) => (relay_url, message),
                Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed) => {
                    break Err(SourceError::new(
                        DeliveryFailureKind::Transient,
                        "the relay client shut down",
                    ));
                }
                // Missed notifications: subscribe again from the checkpoint.
                Err(RecvError::Lagged(n)) => {
                    break Err(SourceError::new(
                        DeliveryFailureKind::Transient,
                        format!("{n} relay notifications missed"),
                    ));
                }
                Ok(_) => continue,
            };
            match message {
                RelayMessage::Event {
                    subscription_id,
                    event,
                } if *subscription_id == sub => {
                    let id = event.id;
                    {
                        let mut p = lock(&progress);
                        if p.done.contains(&id) || !p.pending.insert(id) {
                            continue;
                        }
                    }
                    let ack = Arc::new(EventAck {
                        id,
                        progress: progress.clone(),
                        checkpoint: self.checkpoint.clone(),
                    });
                    sink.deliver(PushedEvent::new(inbound_event(&event, relay.as_str()), ack))
                        .await;
                }
                RelayMessage::EndOfStoredEvents(s) if *s == sub => {
                    let mut p = lock(&progress);
                    p.caught_up = true;
                    advance(&p, &self.checkpoint);
                }
                RelayMessage::Closed {
                    subscription_id,
                    message,
                } if *subscription_id == sub => {
                    if message.starts_with("auth-required") {
                        // nostr-sdk authenticates; the REQ goes again once it has.
                        tracing::debug!(relay = %relay, "subscription waits for AUTH: {message}");
                        continue;
                    }
                    let kind =
                        if message.starts_with("restricted") || message.starts_with("blocked") {
                            DeliveryFailureKind::Permission
                        } else {
                            DeliveryFailureKind::Transient
                        };
                    break Err(SourceError::new(
                        kind,
                        format!("relay {relay} closed the subscription: {message}"),
                    ));
                }
                _ => {}
            }
        };
        for watcher in watchers {
            watcher.abort();
        }
        client.unsubscribe(&sub).await;
        result
    }
}
