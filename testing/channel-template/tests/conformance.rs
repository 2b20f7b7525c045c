//! The channel contract suite against the in-process Bot API.

use std::sync::Arc;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_template::{ApiError, BotApi, Fault, TemplateChannel};
use clawgate_conformance::ConformancePeer;

struct Peer {
    api: Arc<BotApi>,
}

#[clawgate_conformance::async_trait]
impl ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        TemplateChannel::new("template", self.api.clone()).plugin()
    }

    fn target(&self, case: &str) -> MessageTarget {
        MessageTarget::group(format!("chat-{case}"))
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let error_code = match kind {
            DeliveryFailureKind::Transient => 502,
            DeliveryFailureKind::RateLimit => 429,
            DeliveryFailureKind::Auth => 401,
            DeliveryFailureKind::Permission => 403,
            DeliveryFailureKind::NotFound => 404,
            DeliveryFailureKind::InvalidPayload => 400,
            DeliveryFailureKind::Conflict => 409,
            _ => return false,
        };
        for n in 0..count {
            let error = ApiError {
                error_code,
                description: format!("refused ({error_code})"),
                retry_after: (error_code == 429).then_some(3),
            };
            self.api
                .inject(if n == 0 { after } else { 0 }, Fault::Refuse(error));
        }
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.api.inject(after, Fault::LoseAnswer);
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.api
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
        serde_json::to_value(self.api.user_writes(&target.id, "ada", text, bot)).ok()
    }
}

clawgate_conformance::conformance_tests!(
    template,
    Peer {
        api: Arc::new(BotApi::default())
    }
);
