//! The webhook sender: each event is POSTed once, as JSON, to the registered URL; its
//! answer's status is recorded (0 when nothing usable came back). No retry and no signature:
//! BlueBubbles' webhooks are fire-and-forget (platform-apis-wave2 §3.1).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{DeliveryRecord, Inner, World};

/// Records a delivery of `body` and starts its one attempt; its id.
pub(crate) fn enqueue(inner: &Arc<Inner>, world: &mut World, body: Value) -> usize {
    let id = world.deliveries.len();
    let url = world.webhook.clone().unwrap_or_default();
    world.deliveries.push(DeliveryRecord {
        id,
        url: url.clone(),
        body: body.clone(),
        status: 0,
        done: url.is_empty(),
    });
    if url.is_empty() {
        return id;
    }
    let sender = inner.clone();
    inner.spawn(async move {
        let answer = sender
            .http
            .post(&url)
            .json(&body)
            .timeout(sender.config.webhook_timeout)
            .send()
            .await;
        let mut status = match answer {
            // The answer counts only once its body has arrived too.
            Ok(response) => {
                let status = response.status().as_u16();
                match response.bytes().await {
                    Ok(_) => status,
                    Err(_) => 0,
                }
            }
            Err(_) => 0,
        };
        let mut world = sender.world();
        if world.cut_deliveries > 0 {
            world.cut_deliveries -= 1;
            status = 0;
        }
        if let Some(delivery) = world.deliveries.get_mut(id) {
            delivery.status = status;
            delivery.done = true;
        }
    });
    id
}

/// Posts `body` after `delay` (the echo of our own send, once the poller saw its row).
pub(crate) fn later(inner: &Arc<Inner>, world: &mut World, body: Value, delay: Duration) {
    world.pending_echoes += 1;
    let sender = inner.clone();
    inner.spawn(async move {
        tokio::time::sleep(delay).await;
        let mut world = sender.world();
        world.pending_echoes -= 1;
        enqueue(&sender, &mut world, body);
    });
}
