//! The webhook sender: each event is POSTed once, form-encoded, to the bot's or the outgoing
//! webhook's URL; its answer's status is recorded (0 when nothing usable came back). No retry:
//! none is known for Synology Chat (platform-apis-wave2 §7).

use std::sync::Arc;

use super::{Delivery, DeliveryRecord, Inner, World};

/// Records a delivery of `fields` to `url` and starts its one attempt; its id.
pub(crate) fn enqueue(
    inner: &Arc<Inner>,
    world: &mut World,
    url: String,
    fields: Vec<(String, String)>,
) -> usize {
    let id = world.deliveries.len();
    world.deliveries.push(Delivery {
        record: DeliveryRecord {
            id,
            url: url.clone(),
            fields: fields.clone(),
            status: 0,
            done: false,
        },
    });
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields.iter())
        .finish();
    let owner = inner.clone();
    let inner = inner.clone();
    let task = tokio::spawn(async move {
        let answer = inner
            .http
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .timeout(inner.config.answer_deadline)
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
        }
    });
    owner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(task);
    id
}
