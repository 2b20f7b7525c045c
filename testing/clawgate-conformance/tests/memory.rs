//! The suite against the SDK's in-memory channel, polled and pushed: every case that applies
//! passes, so the suite itself is passable — and the cases that do not apply say why.

use clawgate_channel_sdk::ChannelPlugin;
use clawgate_channel_sdk::testing::{MemoryChannel, MemoryFault, MemoryPlatform};
use clawgate_conformance::ConformancePeer;
use clawgate_types::{DeliveryFailureKind, MessageTarget};

struct MemoryPeer {
    channel: MemoryChannel,
}

impl MemoryPeer {
    fn polling() -> MemoryPeer {
        MemoryPeer {
            channel: MemoryChannel::new("memory", MemoryPlatform::new()),
        }
    }

    fn live_stream() -> MemoryPeer {
        MemoryPeer {
            channel: MemoryChannel::new("memory", MemoryPlatform::new()).with_live_stream(),
        }
    }

    fn pushed() -> MemoryPeer {
        MemoryPeer {
            channel: MemoryChannel::new("memory", MemoryPlatform::new()).pushed(),
        }
    }

    fn platform(&self) -> &MemoryPlatform {
        self.channel.platform()
    }
}

#[clawgate_conformance::async_trait]
impl ConformancePeer for MemoryPeer {
    fn plugin(&self) -> ChannelPlugin {
        self.channel.plugin()
    }

    fn target(&self, case: &str) -> MessageTarget {
        MessageTarget::group(format!("conformance-{case}"))
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        if matches!(
            kind,
            DeliveryFailureKind::Unknown | DeliveryFailureKind::Cancelled
        ) {
            return false;
        }
        self.platform()
            .inject(MemoryFault::Refuse(kind), count, after);
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.platform().inject(MemoryFault::LoseAnswer, 1, after);
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.platform().texts(&target.id)
    }

    async fn inject_inbound(
        &self,
        target: &MessageTarget,
        text: &str,
        bot: bool,
    ) -> Option<serde_json::Value> {
        let message = self.platform().write(&target.id, "someone", text, bot);
        serde_json::to_value(message).ok()
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<serde_json::Value> {
        self.platform()
            .messages(&target.id)
            .into_iter()
            .filter_map(|m| serde_json::to_value(m).ok())
            .collect()
    }

    fn redeliver_pushed(&self) -> bool {
        self.platform().redeliver_all();
        true
    }

    fn drop_connection(&self) -> bool {
        self.platform().drop_connection();
        true
    }
}

clawgate_conformance::conformance_tests!(memory_polled, MemoryPeer::polling());
clawgate_conformance::conformance_tests!(memory_pushed, MemoryPeer::pushed());
clawgate_conformance::conformance_tests!(memory_live_stream, MemoryPeer::live_stream());

/// A declared live adapter is the path previews take: the suite's live cases pass through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_go_through_a_declared_live_adapter() {
    let peer = MemoryPeer::live_stream();
    assert_eq!(
        clawgate_conformance::live_preview_finalizes_in_place_when_declared(&peer).await,
        clawgate_conformance::Outcome::Passed
    );
    let finalized = peer.platform().live_calls();
    assert!(
        finalized >= 3,
        "show, replace and finalize went through the live adapter: {finalized}"
    );
    assert_eq!(
        clawgate_conformance::live_preview_is_removed_when_abandoned(&peer).await,
        clawgate_conformance::Outcome::Passed
    );
    assert!(
        peer.platform().live_calls() >= finalized + 2,
        "the abandoned preview was shown and removed through it"
    );
    let plain = MemoryPeer::polling();
    let _ = clawgate_conformance::live_preview_finalizes_in_place_when_declared(&plain).await;
    assert_eq!(
        plain.platform().live_calls(),
        0,
        "no live adapter, no live calls"
    );
}
