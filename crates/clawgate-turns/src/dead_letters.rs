//! Dead letters whose failure notice a crash cut off.

use clawgate_store::InboundStatus;
use clawgate_types::UnixMillis;
use tracing::{info, warn};

use crate::keys::failure_key;
use crate::{Channel, Turns};

/// How many of the newest dead letters one sweep looks at.
const SWEEP_LIMIT: u32 = 1_000;

impl Turns {
    /// Tells the person about each event of `channel` dead-lettered since `since` whose
    /// failure notice was never recorded, and returns how many were told. The dead letter and
    /// the notice are two writes: a crash between them would leave nobody told, as nothing
    /// works on a dead-lettered event again and a platform does not deliver an acknowledged
    /// event twice. Run when a gateway takes the channel's account; the notice is keyed by the
    /// event, so it goes out at most once however often this runs.
    pub async fn tell_untold_dead_letters(&self, channel: &Channel, since: UnixMillis) -> usize {
        let records = match self
            .store
            .list_inbound(Some(InboundStatus::DeadLettered), SWEEP_LIMIT)
            .await
        {
            Ok(records) => records,
            Err(e) => {
                warn!(channel = %channel.name, error = %e, "dead letters unreadable; their failure notices are not checked");
                return 0;
            }
        };
        let mut told = 0;
        for record in records.into_iter().filter(|r| {
            r.channel == channel.name && r.account_id == channel.account && r.updated_at >= since
        }) {
            match self
                .store
                .find_intent_by_key(&failure_key(&channel.name, &record.event_id))
                .await
            {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(e) => {
                    warn!(event = %record.event_id, error = %e, "failure notice unreadable; not checked");
                    continue;
                }
            }
            let Some(raw) = record.payload.get("raw").filter(|r| !r.is_null()) else {
                warn!(event = %record.event_id, "dead letter without its platform payload: the person cannot be told");
                continue;
            };
            let error = record.last_error.as_deref().unwrap_or("dead-lettered");
            if self.tell_of_failure(channel, raw, error).await {
                told += 1;
            }
        }
        if told > 0 {
            info!(channel = %channel.name, told, "failure notices a crash had cut off recorded");
        }
        told
    }
}
