//! The adapter contract suite against the QA platform, in both adapter variants.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_channel_qa::{Fault, QaAdapter, QaPlatform, QaPlatformConfig};
use clawgate_channel_sdk::ChannelMessageAdapter;
use clawgate_conformance::ConformancePeer;
use clawgate_types::{DeliveryFailureKind, MessageTarget, TargetKind};

pub struct QaPeer {
    platform: QaPlatform,
    idempotent: bool,
}

impl QaPeer {
    pub async fn start(idempotent: bool) -> QaPeer {
        QaPeer {
            platform: QaPlatform::start(QaPlatformConfig::default())
                .await
                .unwrap(),
            idempotent,
        }
    }
}

#[async_trait]
impl ConformancePeer for QaPeer {
    fn adapter(&self) -> Arc<dyn ChannelMessageAdapter> {
        let (url, token) = (self.platform.base_url(), self.platform.token().to_owned());
        Arc::new(if self.idempotent {
            QaAdapter::new(&url, &token)
        } else {
            QaAdapter::without_idempotency(&url, &token)
        })
    }

    fn target(&self, case: &str) -> MessageTarget {
        MessageTarget {
            kind: TargetKind::Group,
            id: format!("conformance-{case}"),
            label: None,
            space_id: None,
            parent_id: None,
            thread_id: None,
            native_channel_id: None,
        }
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
}

mod qa_idempotent {
    use super::QaPeer;
    clawgate_conformance::adapter_conformance_tests!(QaPeer::start(true).await);
}

mod qa_without_idempotency {
    use super::QaPeer;
    clawgate_conformance::adapter_conformance_tests!(QaPeer::start(false).await);
}
