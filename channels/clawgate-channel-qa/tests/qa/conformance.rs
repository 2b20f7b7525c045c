//! The channel contract suite against the QA platform, in both adapter variants.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_qa::{Fault, InboundRequest, QaAdapter, QaFeed, QaPlatform, QaPlatformConfig};
use clawgate_channel_sdk::{ChannelPlugin, InboundSource};
use clawgate_conformance::ConformancePeer;
use clawgate_types::{DeliveryFailureKind, MessageTarget};

pub(crate) struct QaPeer {
    platform: QaPlatform,
    idempotent: bool,
}

impl QaPeer {
    pub(crate) async fn start(idempotent: bool) -> QaPeer {
        QaPeer {
            platform: QaPlatform::start(QaPlatformConfig::default())
                .await
                .unwrap(),
            idempotent,
        }
    }
}

#[clawgate_conformance::async_trait]
impl ConformancePeer for QaPeer {
    fn plugin(&self) -> ChannelPlugin {
        let (url, token) = (self.platform.base_url(), self.platform.token().to_owned());
        let adapter = if self.idempotent {
            QaAdapter::new(&url, &token)
        } else {
            QaAdapter::without_idempotency(&url, &token)
        };
        let feed = QaFeed::new(adapter.clone(), Duration::from_secs(2));
        ChannelPlugin::new(Arc::new(adapter.clone()))
            .with_inbound(Arc::new(adapter), InboundSource::Polling(Arc::new(feed)))
    }

    fn target(&self, case: &str) -> MessageTarget {
        MessageTarget::group(format!("conformance-{case}"))
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let fault = match kind {
            DeliveryFailureKind::Transient => Fault::status(count, 503, "unavailable"),
            DeliveryFailureKind::RateLimit => Fault::rate_limited(count, 2),
            DeliveryFailureKind::Auth => Fault::status(count, 401, "unauthorized"),
            DeliveryFailureKind::Permission => Fault::status(count, 403, "forbidden"),
            DeliveryFailureKind::NotFound => Fault::status(count, 404, "conversation_not_found"),
            DeliveryFailureKind::InvalidPayload => Fault::status(count, 400, "invalid_request"),
            DeliveryFailureKind::Conflict => Fault::status(count, 409, "conflict"),
            DeliveryFailureKind::Cancelled | DeliveryFailureKind::Unknown => return false,
            // A class newer than this harness: it has no fault for it, so it says it cannot
            // inject one (the suite then skips the case) rather than pretend it did.
            _ => return false,
        };
        self.platform.inject(fault.after(after));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.platform
            .inject(Fault::drop_after_accept(1).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.platform
            .messages(&target.id)
            .into_iter()
            .map(|m| m.text)
            .collect()
    }

    async fn inject_inbound(
        &self,
        target: &MessageTarget,
        text: &str,
        bot: bool,
    ) -> Option<serde_json::Value> {
        let message = self
            .platform
            .inject_inbound(
                &target.id,
                InboundRequest {
                    text: text.to_owned(),
                    author_id: if bot { "other-bot" } else { "someone" }.to_owned(),
                    author_is_bot: bot,
                    thread_id: None,
                    reply_to_id: None,
                    metadata: None,
                },
            )
            .ok()?;
        serde_json::to_value(message).ok()
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<serde_json::Value> {
        self.platform
            .messages(&target.id)
            .into_iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect()
    }
}

clawgate_conformance::conformance_tests!(qa_idempotent, QaPeer::start(true).await);
clawgate_conformance::conformance_tests!(qa_without_idempotency, QaPeer::start(false).await);
