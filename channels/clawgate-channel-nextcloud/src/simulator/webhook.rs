//! The bot webhook sender: each event is POSTed once as JSON, signed
//! (`X-Nextcloud-Talk-Random`, `X-Nextcloud-Talk-Signature` = hex HMAC-SHA256(secret, random ‖
//! body), `X-Nextcloud-Talk-Backend`), with a 5-second timeout and no retry — Talk's
//! `BotService::sendAsyncRequest`. The answer's status is recorded (0 when none came).

use std::sync::Arc;

use super::{Delivery, DeliveryRecord, Inner, World};
use crate::sign;

/// Records a delivery of `body` to `url`, signed with the bot's secret, and starts its one
/// attempt; its id.
pub(crate) fn enqueue(inner: &Arc<Inner>, world: &mut World, url: String, body: String) -> usize {
    let seed = format!("{}:{}", world.deliveries.len(), body.len());
    // Talk's random is 64 characters.
    let random = sign::random(&seed);
    let signature = sign::signature(&inner.config.bot_secret, &random, body.as_bytes());
    enqueue_signed(inner, world, url, body, random, signature)
}

/// [`enqueue`] with the headers given as they are.
pub(crate) fn enqueue_signed(
    inner: &Arc<Inner>,
    world: &mut World,
    url: String,
    body: String,
    random: String,
    signature: String,
) -> usize {
    let id = world.deliveries.len();
    world.deliveries.push(Delivery {
        record: DeliveryRecord {
            id,
            url: url.clone(),
            body: body.clone(),
            random: random.clone(),
            signature: signature.clone(),
            status: 0,
            done: false,
            elapsed_ms: 0,
        },
    });
    let owner = inner.clone();
    let inner = inner.clone();
    let task = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let answer = inner
            .http
            .post(&url)
            .header("content-type", "application/json")
            .header("OCS-APIRequest", "true")
            .header("X-Nextcloud-Talk-Random", random)
            .header("X-Nextcloud-Talk-Signature", signature)
            .header(
                "X-Nextcloud-Talk-Backend",
                format!("http://{}/", inner.addr),
            )
            .body(body)
            .timeout(inner.config.webhook_timeout)
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
        let mut world = inner.world();
        if world.cut_deliveries > 0 {
            world.cut_deliveries -= 1;
            status = 0;
        }
        if let Some(delivery) = world.deliveries.get_mut(id) {
            delivery.record.status = status;
            delivery.record.done = true;
            delivery.record.elapsed_ms =
                u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        }
    });
    owner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(task);
    id
}
