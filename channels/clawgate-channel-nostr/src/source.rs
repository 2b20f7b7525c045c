//! The inbound feed: a subscription to the events addressed to our key (`{"kinds":[1059],
//! "#p":[us], "since": …}`, kind 4 under NIP-04) on every relay, pushed to the engine.
//!
//! Relays keep what they stored, so the feed resumes from a durable checkpoint: the value
//! `checkpoint` of the account's state in the gateway's store, holding the last moment (by the
//! gateway's clock) when everything the feed had received was recorded by the engine (acked). A run subscribes from that moment minus the two days NIP-59
//! lets a gift wrap's `created_at` lie in the past, minus an hour for slow delivery. What comes
//! again is deduplicated: here within a run (by event id), by the engine across runs (by the
//! message id). Each run takes the stored checkpoint as its own and writes it compare-and-set
//! against the version it last read or wrote: a feed still running after another gateway took
//! the account over keeps the new holder's checkpoint and stops writing it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clawgate_channel_sdk::state::{Swapped, ValueExpectation};
use clawgate_channel_sdk::{
    ChannelState, EventSink, ImportError, LegacyFiles, PushedEvent, PushedFeed, SourceError,
    StateError, StateErrorKind, TransportAck,
};
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

/// The value the checkpoint (seconds) is kept in.
const CHECKPOINT: &str = "checkpoint";

/// The file an earlier release kept the checkpoint of key `us` in, in the gateway's state
/// directory.
pub(crate) fn legacy_checkpoint_file(us: &PublicKey) -> String {
    format!("nostr-{}.checkpoint", us.to_hex())
}

/// Imports the checkpoint an earlier release kept for key `us`, once (see
/// [`ChannelState::import_values`]: a stored checkpoint wins). A file that is not a number is
/// set aside unread, as that release ignored it too (the feed reads from now).
pub(crate) async fn import_legacy_checkpoint(
    state: &ChannelState,
    legacy: &LegacyFiles,
    us: &PublicKey,
) -> Result<(), ImportError> {
    let file = legacy_checkpoint_file(us);
    let imported = state
        .import_values(legacy, &file, |bytes| {
            Ok(match String::from_utf8_lossy(bytes).trim().parse::<u64>() {
                Ok(at) => Some((CHECKPOINT, at)),
                Err(error) => {
                    tracing::warn!(file, %error, "not a Nostr checkpoint; set aside unread");
                    None
                }
            })
        })
        .await?;
    if imported.written > 0 {
        tracing::info!("the Nostr checkpoint of an earlier release was imported");
    }
    Ok(())
}

/// What this feed last read or wrote of the stored checkpoint.
#[derive(Debug, Default)]
struct Written {
    /// The moment stored.
    at: Option<u64>,
    /// The stored value's version (`None`: nothing stored).
    version: Option<i64>,
    /// Another gateway wrote the checkpoint since: it holds the account, its checkpoint stays.
    superseded: bool,
}

/// The durable checkpoint of one feed.
#[derive(Debug)]
struct Checkpoint {
    state: ChannelState,
    /// The newest moment everything received in this run was acked, not written yet.
    wanted: Mutex<Option<u64>>,
    /// Held while writing: writes land in order and the checkpoint never moves back.
    written: tokio::sync::Mutex<Written>,
}

impl Checkpoint {
    fn now_s(&self) -> u64 {
        u64::try_from(self.state.now_ms() / 1_000).unwrap_or(0)
    }

    /// Takes the stored checkpoint as this feed's, at the start of each run: a run starts when
    /// this gateway holds the account (again), and whoever held it before left the checkpoint
    /// to read from and the version to write over.
    async fn load(&self) -> Result<Option<u64>, StateError> {
        let mut written = self.written.lock().await;
        let stored = self.state.value::<u64>(CHECKPOINT).await?;
        *written = Written {
            at: stored.as_ref().map(|s| s.value),
            version: stored.as_ref().map(|s| s.version),
            superseded: false,
        };
        // What an earlier run reached says nothing about this one's events.
        *self
            .wanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Ok(written.at)
    }

    /// Notes that everything received was acked now.
    fn reached(&self) {
        let now = self.now_s();
        let mut wanted = self
            .wanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *wanted = Some(wanted.map_or(now, |w| w.max(now)));
    }

    /// Writes the newest moment noted, when it is later than the one stored and no other
    /// gateway wrote the checkpoint since this feed last read or wrote it.
    ///
    /// Compare-and-set rather than "only ever forward": the checkpoint is the holder's word
    /// that everything *its* feed received until then is recorded, and a nack holds it back on
    /// purpose. A superseded feed moving it on to its own later moment would let the next
    /// takeover read from past events the holder received and has not recorded, and lose those
    /// older than the replay slack.
    async fn flush(&self) {
        let mut written = self.written.lock().await;
        if written.superseded {
            return;
        }
        let wanted = *self
            .wanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(at) = wanted.filter(|at| written.at.is_none_or(|w| *at > w)) else {
            return;
        };
        let expected = written
            .version
            .map_or(ValueExpectation::Absent, ValueExpectation::Version);
        match self.state.swap(CHECKPOINT, expected, &at).await {
            Ok(Swapped::Written(version)) => {
                written.at = Some(at);
                written.version = Some(version);
            }
            Ok(Swapped::Conflict(_)) => self.superseded(&mut written),
            // A conflict too: a number always encodes, so the store refused the expectation and
            // held a value of another shape (written by another version of the channel).
            Err(error) if matches!(error.kind(), StateErrorKind::Shape { .. }) => {
                self.superseded(&mut written);
            }
            Err(error) => {
                tracing::warn!(%error, "checkpoint not written; a restart reads from an older one");
            }
        }
    }

    /// Another gateway wrote the checkpoint: it holds the account now (this one stalled or has
    /// not stopped its feed yet). This feed stops writing and keeps its subscription: ending
    /// the run would only start it again on the other gateway's checkpoint until the lease
    /// tells this gateway to stop.
    fn superseded(&self, written: &mut Written) {
        written.superseded = true;
        tracing::warn!(
            scope = %self.state.scope(),
            "another gateway wrote the Nostr checkpoint since this feed last did: it holds the \
             account now; its checkpoint is kept, and this feed no longer writes it"
        );
    }

    /// [`Checkpoint::flush`] from code that cannot wait (an ack), on the runtime.
    fn flush_soon(self: &Arc<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let checkpoint = self.clone();
            runtime.spawn(async move { checkpoint.flush().await });
        }
    }
}

/// The pushed feed of one key.
#[derive(Debug, Clone)]
pub struct NostrFeed {
    relays: Relays,
    us: PublicKey,
    protocol: DmProtocol,
    checkpoint: Arc<Checkpoint>,
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
    checkpoint: Arc<Checkpoint>,
}

fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    progress
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether everything received is acked (the checkpoint may move to now).
fn settled(progress: &Progress) -> bool {
    progress.caught_up && !progress.stuck && progress.pending.is_empty()
}

impl TransportAck for EventAck {
    fn ack(&self) {
        let mut progress = lock(&self.progress);
        progress.pending.remove(&self.id);
        progress.done.insert(self.id);
        if settled(&progress) {
            self.checkpoint.reached();
            self.checkpoint.flush_soon();
        }
    }

    fn nack(&self, reason: &str) {
        let mut progress = lock(&self.progress);
        progress.pending.remove(&self.id);
        progress.stuck = true;
        tracing::info!(event = %self.id, "event not taken: {reason}");
    }
}

impl NostrFeed {
    /// The feed of key `us`, keeping its checkpoint in `state`.
    pub(crate) fn new(
        relays: Relays,
        us: PublicKey,
        protocol: DmProtocol,
        state: ChannelState,
    ) -> NostrFeed {
        NostrFeed {
            relays,
            us,
            protocol,
            checkpoint: Arc::new(Checkpoint {
                state,
                wanted: Mutex::new(None),
                written: tokio::sync::Mutex::default(),
            }),
        }
    }

    /// Where the next run starts reading (seconds): the checkpoint (on a first start, now by
    /// the gateway's clock) less the slack a gift wrap's time may lie back.
    pub async fn since(&self) -> Result<u64, StateError> {
        let kept = self.checkpoint.state.value::<u64>(CHECKPOINT).await?;
        Ok(self.read_from(kept.map(|k| k.value)))
    }

    /// Where a run reads from with checkpoint `kept`.
    fn read_from(&self, kept: Option<u64>) -> u64 {
        kept.unwrap_or_else(|| self.checkpoint.now_s())
            .saturating_sub(TWEAK_RANGE_S + LATE_DELIVERY_S)
    }
}

#[async_trait]
impl PushedFeed for NostrFeed {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let kind = match self.protocol {
            DmProtocol::Nip17 => Kind::GiftWrap,
            DmProtocol::Nip04 => Kind::EncryptedDirectMessage,
        };
        let since = self
            .checkpoint
            .load()
            .await
            .map(|kept| self.read_from(kept))
            .map_err(|e| {
                SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!("the Nostr checkpoint cannot be read: {e}"),
                )
            })?;
        let filter = Filter::new()
            .kind(kind)
            .pubkey(self.us)
            .since(Timestamp::from_secs(since));
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
                    let reached = {
                        let mut p = lock(&progress);
                        p.caught_up = true;
                        settled(&p)
                    };
                    if reached {
                        self.checkpoint.reached();
                        self.checkpoint.flush().await;
                    }
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
        // The acks taken since the last write: kept before the feed ends.
        self.checkpoint.flush().await;
        result
    }
}
