//! The relays of one key: publishing a signed event to each and judging "sent" by the
//! configured rule, and asking each relay whether it has an event (`REQ {"ids":[id]}`).
//!
//! The connection, reconnects, pings and NIP-42 authentication are nostr-sdk's (one
//! [`Client`] per channel, signed by the channel's key). The publish and the lookup speak the
//! protocol themselves over each [`Relay`], because "sent", "not sent" and "unknown" are told
//! apart by *where* a call stopped: an event never handed to a connected socket was not
//! written; once written, only the relay's `OK` settles it.

use std::time::Duration;

use clawgate_channel_sdk::SendError;
use clawgate_types::DeliveryFailureKind;
use nostr_sdk::pool::RelayNotification;
use nostr_sdk::prelude::MachineReadablePrefix;
use nostr_sdk::{
    Client, ClientMessage, Event, EventId, Filter, Relay, RelayMessage, RelayOptions, RelayStatus,
    RelayUrl, SubscriptionId,
};
use tokio::sync::broadcast::error::RecvError;

/// The connection is closed (it may come back: nostr-sdk reconnects).
fn gone(status: RelayStatus) -> bool {
    matches!(
        status,
        RelayStatus::Disconnected
            | RelayStatus::Terminated
            | RelayStatus::Banned
            | RelayStatus::Sleeping
    )
}

/// What one relay made of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayOutcome {
    /// `OK true` (a `duplicate:` answer included: the relay already had this very event).
    Accepted,
    /// `OK false` with a machine-readable prefix: nothing was stored.
    Refused {
        /// The failure class the prefix means.
        kind: DeliveryFailureKind,
        /// The relay's message.
        message: String,
    },
    /// The event never reached a connected socket.
    NotWritten(String),
    /// Written, but no `OK` came back (the connection dropped, or the wait ran out).
    Unknown(String),
}

/// What one relay said about an event id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The relay served it.
    Found,
    /// `EOSE` without it.
    Absent,
    /// No answer (down, refused, timed out).
    Unknown(String),
}

/// How many relays must accept an event before it counts as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentRule {
    /// One relay is enough.
    Any,
    /// Every configured relay.
    All,
    /// At least this many.
    Quorum(usize),
}

impl SentRule {
    fn needed(self, relays: usize) -> usize {
        match self {
            SentRule::Any => 1,
            SentRule::All => relays,
            SentRule::Quorum(n) => n.min(relays),
        }
        .max(1)
    }
}

/// A relay's `OK false` prefix as a failure class (NIP-01, NIP-42).
pub fn classify_refusal(message: &str) -> DeliveryFailureKind {
    match MachineReadablePrefix::parse(message) {
        Some(MachineReadablePrefix::RateLimited) => DeliveryFailureKind::RateLimit,
        Some(MachineReadablePrefix::AuthRequired) => DeliveryFailureKind::Auth,
        Some(MachineReadablePrefix::Blocked | MachineReadablePrefix::Restricted) => {
            DeliveryFailureKind::Permission
        }
        Some(MachineReadablePrefix::Invalid | MachineReadablePrefix::Pow) => {
            DeliveryFailureKind::InvalidPayload
        }
        Some(MachineReadablePrefix::Error) | None => DeliveryFailureKind::Transient,
        Some(_) => DeliveryFailureKind::Transient,
    }
}

/// The relays of one channel.
#[derive(Debug, Clone)]
pub struct Relays {
    client: Client,
    urls: Vec<RelayUrl>,
    rule: SentRule,
    ok_timeout: Duration,
    connect_wait: Duration,
}

/// Timings of [`Relays`].
#[derive(Debug, Clone, Copy)]
pub struct RelayTimings {
    /// How long a relay has to answer an `EVENT` or a `REQ`.
    pub answer_timeout: Duration,
    /// How long a call waits for a relay that is (re)connecting.
    pub connect_wait: Duration,
    /// The pause between reconnect attempts.
    pub reconnect: Duration,
}

impl Relays {
    /// Connects (in the background) to `urls` as the key of `client`.
    pub async fn new(
        client: Client,
        urls: Vec<RelayUrl>,
        rule: SentRule,
        timings: RelayTimings,
    ) -> Result<Relays, String> {
        for url in &urls {
            let opts = RelayOptions::new()
                .reconnect(true)
                .retry_interval(timings.reconnect)
                .adjust_retry_interval(false)
                // Lookups use their own subscription ids, unknown to the pool.
                .verify_subscriptions(false);
            client
                .pool()
                .add_relay(url.clone(), opts)
                .await
                .map_err(|e| format!("relay {url}: {e}"))?;
        }
        client.connect().await;
        Ok(Relays {
            client,
            urls,
            rule,
            ok_timeout: timings.answer_timeout,
            connect_wait: timings.connect_wait,
        })
    }

    /// The client (the feed subscribes through it).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The configured relays.
    pub fn urls(&self) -> &[RelayUrl] {
        &self.urls
    }

    async fn relay(&self, url: &RelayUrl) -> Option<Relay> {
        self.client.relay(url.clone()).await.ok()
    }

    /// Publishes `event` to every relay; `Ok` with the accepting relays when the rule is met.
    pub async fn publish(&self, event: &Event) -> Result<Vec<RelayUrl>, SendError> {
        let outcomes = futures_util::future::join_all(self.urls.iter().map(|url| async move {
            let outcome = match self.relay(url).await {
                Some(relay) => publish_one(&relay, event, self.ok_timeout, self.connect_wait).await,
                None => RelayOutcome::NotWritten("relay not in the pool".into()),
            };
            (url.clone(), outcome)
        }))
        .await;
        judge(&outcomes, self.rule.needed(self.urls.len()), &event.id)
    }

    /// Asks every relay for `id`.
    pub async fn lookup(&self, id: &EventId) -> Vec<(RelayUrl, Lookup)> {
        futures_util::future::join_all(self.urls.iter().map(|url| async move {
            let lookup = match self.relay(url).await {
                Some(relay) => lookup_one(&relay, id, self.ok_timeout, self.connect_wait).await,
                None => Lookup::Unknown("relay not in the pool".into()),
            };
            (url.clone(), lookup)
        }))
        .await
    }

    /// How many relays must hold an event for it to count as sent.
    pub fn needed(&self) -> usize {
        self.rule.needed(self.urls.len())
    }
}

/// The rule over the relays' outcomes.
pub fn judge(
    outcomes: &[(RelayUrl, RelayOutcome)],
    needed: usize,
    id: &EventId,
) -> Result<Vec<RelayUrl>, SendError> {
    let accepted: Vec<RelayUrl> = outcomes
        .iter()
        .filter(|(_, o)| *o == RelayOutcome::Accepted)
        .map(|(url, _)| url.clone())
        .collect();
    if accepted.len() >= needed {
        return Ok(accepted);
    }
    let summary = outcomes
        .iter()
        .map(|(url, o)| match o {
            RelayOutcome::Accepted => format!("{url}: accepted"),
            RelayOutcome::Refused { message, .. } => format!("{url}: refused ({message})"),
            RelayOutcome::NotWritten(why) => format!("{url}: not sent ({why})"),
            RelayOutcome::Unknown(why) => format!("{url}: no answer ({why})"),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let message = format!(
        "event {id}: {} of {needed} needed relays accepted it — {summary}",
        accepted.len()
    );
    if outcomes
        .iter()
        .any(|(_, o)| matches!(o, RelayOutcome::Unknown(_)))
    {
        // A relay may hold it: only a lookup by id settles that.
        return Err(SendError::after_io(DeliveryFailureKind::Unknown, message));
    }
    // Every relay answered or was never written to. Sending the same event again cannot
    // duplicate it (its id is its content), so a partial acceptance is retried like nothing.
    let refused = outcomes.iter().find_map(|(_, o)| match o {
        RelayOutcome::Refused { kind, .. } => Some(*kind),
        _ => None,
    });
    let kind = refused.unwrap_or(DeliveryFailureKind::Transient);
    let mut error = SendError::before_io(kind, message);
    let first_refusal = outcomes.iter().find_map(|(_, o)| match o {
        RelayOutcome::Refused { message, .. } => message.split(':').next(),
        _ => None,
    });
    if let Some(prefix) = first_refusal {
        error = error.with_platform_code(prefix.trim());
    }
    Err(error)
}

async fn connected(relay: &Relay, wait: Duration) -> bool {
    if !relay.is_connected() {
        relay.wait_for_connection(wait).await;
    }
    relay.is_connected()
}

/// One `EVENT` → `OK` exchange (again once after a NIP-42 `auth-required:`).
pub async fn publish_one(
    relay: &Relay,
    event: &Event,
    ok_timeout: Duration,
    connect_wait: Duration,
) -> RelayOutcome {
    for attempt in 0..2 {
        if !connected(relay, connect_wait).await {
            return RelayOutcome::NotWritten("not connected".into());
        }
        // One receiver from before the write: an AUTH exchange racing the OK is not missed.
        let mut notes = relay.notifications();
        if let Err(e) = relay.send_msg(ClientMessage::event(event.clone())) {
            return RelayOutcome::NotWritten(e.to_string());
        }
        let mut authenticated = false;
        let answer = tokio::time::timeout(ok_timeout, async {
            loop {
                match notes.recv().await {
                    Ok(RelayNotification::Message {
                        message:
                            RelayMessage::Ok {
                                event_id,
                                status,
                                message,
                            },
                    }) if event_id == event.id => return Ok((status, message.into_owned())),
                    Ok(RelayNotification::Authenticated) => authenticated = true,
                    Ok(RelayNotification::RelayStatus { status }) if gone(status) => {
                        return Err("the connection closed before the relay's OK".to_owned());
                    }
                    Ok(RelayNotification::Shutdown) | Err(RecvError::Closed) => {
                        return Err("the client shut down before the relay's OK".to_owned());
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                }
            }
        })
        .await;
        match answer {
            Err(_) => {
                return RelayOutcome::Unknown(format!(
                    "no OK within {} ms",
                    ok_timeout.as_millis()
                ));
            }
            Ok(Err(why)) => return RelayOutcome::Unknown(why),
            Ok(Ok((true, _))) => return RelayOutcome::Accepted,
            Ok(Ok((false, message))) => {
                let kind = classify_refusal(&message);
                if kind == DeliveryFailureKind::Auth && attempt == 0 {
                    // nostr-sdk answers the relay's AUTH challenge (NIP-42); the same event
                    // goes once more after it.
                    let authed = authenticated
                        || tokio::time::timeout(connect_wait, async {
                            loop {
                                match notes.recv().await {
                                    Ok(RelayNotification::Authenticated) => return true,
                                    Ok(RelayNotification::AuthenticationFailed)
                                    | Err(RecvError::Closed) => return false,
                                    _ => {}
                                }
                            }
                        })
                        .await
                        .unwrap_or(false);
                    if authed {
                        continue;
                    }
                }
                return RelayOutcome::Refused { kind, message };
            }
        }
    }
    RelayOutcome::Refused {
        kind: DeliveryFailureKind::Auth,
        message: "auth-required: still refused after authenticating".into(),
    }
}

/// `REQ {"ids":[id]}` until `EOSE`.
pub async fn lookup_one(
    relay: &Relay,
    id: &EventId,
    timeout: Duration,
    connect_wait: Duration,
) -> Lookup {
    if !connected(relay, connect_wait).await {
        return Lookup::Unknown("not connected".into());
    }
    let sub = SubscriptionId::generate();
    let mut notes = relay.notifications();
    if let Err(e) = relay.send_msg(ClientMessage::req(sub.clone(), vec![Filter::new().id(*id)])) {
        return Lookup::Unknown(e.to_string());
    }
    let mut found = false;
    let answer = tokio::time::timeout(timeout, async {
        loop {
            match notes.recv().await {
                Ok(RelayNotification::Message { message }) => match message {
                    RelayMessage::Event {
                        subscription_id,
                        event,
                    } if *subscription_id == sub && event.id == *id => found = true,
                    RelayMessage::EndOfStoredEvents(s) if *s == sub => return Ok(()),
                    RelayMessage::Closed {
                        subscription_id,
                        message,
                    } if *subscription_id == sub => return Err(format!("CLOSED: {message}")),
                    _ => {}
                },
                Ok(RelayNotification::RelayStatus { status }) if gone(status) => {
                    return Err("the connection closed before EOSE".to_owned());
                }
                Ok(RelayNotification::Shutdown) | Err(RecvError::Closed) => {
                    return Err("the client shut down".to_owned());
                }
                Ok(_) | Err(RecvError::Lagged(_)) => {}
            }
        }
    })
    .await;
    let _ = relay.send_msg(ClientMessage::close(sub));
    match answer {
        Ok(Ok(())) if found => Lookup::Found,
        Ok(Ok(())) => Lookup::Absent,
        // An event served before the relay stopped answering still counts.
        _ if found => Lookup::Found,
        Ok(Err(why)) => Lookup::Unknown(why),
        Err(_) => Lookup::Unknown(format!("no EOSE within {} ms", timeout.as_millis())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn refusal_prefixes_map_to_failure_classes() {
        for (message, kind) in [
            ("rate-limited: slow down", DeliveryFailureKind::RateLimit),
            ("auth-required: you must auth", DeliveryFailureKind::Auth),
            ("blocked: not on the list", DeliveryFailureKind::Permission),
            ("restricted: members only", DeliveryFailureKind::Permission),
            (
                "invalid: bad signature",
                DeliveryFailureKind::InvalidPayload,
            ),
            (
                "pow: difficulty 20 needed",
                DeliveryFailureKind::InvalidPayload,
            ),
            ("error: database down", DeliveryFailureKind::Transient),
            ("no prefix at all", DeliveryFailureKind::Transient),
        ] {
            assert_eq!(classify_refusal(message), kind, "{message}");
        }
    }

    #[test]
    fn the_rule_decides_sent_and_an_unanswered_relay_makes_it_unknown() {
        let a = RelayUrl::parse("ws://127.0.0.1:1").unwrap();
        let b = RelayUrl::parse("ws://127.0.0.1:2").unwrap();
        let id = EventId::all_zeros();
        let refused = RelayOutcome::Refused {
            kind: DeliveryFailureKind::Permission,
            message: "blocked: no".into(),
        };
        let both = [
            (a.clone(), RelayOutcome::Accepted),
            (b.clone(), refused.clone()),
        ];
        assert_eq!(
            judge(&both, SentRule::Any.needed(2), &id).unwrap(),
            vec![a.clone()]
        );
        let error = judge(&both, SentRule::All.needed(2), &id).unwrap_err();
        assert_eq!(error.kind, DeliveryFailureKind::Permission);
        assert_eq!(error.side_effect, clawgate_channel_sdk::SideEffect::None);
        let lost = [
            (a.clone(), RelayOutcome::Accepted),
            (b.clone(), RelayOutcome::Unknown("timeout".into())),
        ];
        let error = judge(&lost, SentRule::Quorum(2).needed(2), &id).unwrap_err();
        assert_eq!(
            error.side_effect,
            clawgate_channel_sdk::SideEffect::Possible
        );
        let down = [(a, RelayOutcome::NotWritten("down".into()))];
        let error = judge(&down, 1, &id).unwrap_err();
        assert_eq!(
            (error.kind, error.side_effect),
            (
                DeliveryFailureKind::Transient,
                clawgate_channel_sdk::SideEffect::None
            )
        );
    }
}
