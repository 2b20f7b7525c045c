//! The inbound feed: the account's TMI connection pushes every relayed `PRIVMSG` to the
//! engine while the feed runs. Twitch chat keeps no backlog and has no acknowledgement, so each event
//! carries a [`NoTransportAck`](clawgate_channel_sdk::NoTransportAck) and what was said while
//! the link was down is not seen. Lines that arrive while no feed runs (the sender connected
//! first) are held, a bounded number, and handed to the next feed.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_channel_sdk::{EventSink, PushedFeed, SourceError};
use clawgate_types::DeliveryFailureKind;

use crate::connection::{Connection, LinkState};

/// The pushed feed of one Twitch account.
#[derive(Debug, Clone)]
pub struct TwitchFeed {
    connection: Connection,
}

impl TwitchFeed {
    pub(crate) fn new(connection: Connection) -> TwitchFeed {
        TwitchFeed { connection }
    }
}

/// Detaches the sink when the feed ends, however it ends.
struct Detach<'a>(&'a Connection);

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        self.0.detach();
    }
}

#[async_trait]
impl PushedFeed for TwitchFeed {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        self.connection.attach(sink.clone()).await;
        let _detach = Detach(&self.connection);
        self.connection.ensure_started();
        let mut state = self.connection.state();
        // The connection reconnects on its own; a refusal of the account is the engine's to
        // report (it stops retrying Auth failures until an operator acts).
        tokio::select! {
            () = sink.stopped() => Ok(()),
            refused = state.wait_for(|s| matches!(s, LinkState::Refused(_))) => {
                let reason = match refused.as_deref() {
                    Ok(LinkState::Refused(reason)) => reason.clone(),
                    _ => "the connection stopped".to_owned(),
                };
                Err(SourceError::new(DeliveryFailureKind::Auth, reason))
            }
        }
    }
}
