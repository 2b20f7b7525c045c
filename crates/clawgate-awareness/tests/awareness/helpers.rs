//! A harness: a real SQLite state directory, a manual clock, a recording heartbeat and a
//! recording delivery path.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clawgate_awareness::{
    Actor, Awareness, AwarenessConfig, HeartbeatHook, NewSession, Requester, SessionDelivery,
    SessionTools, SpawnChild, Spawned, StateChange,
};
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::ManualClock;
use clawgate_types::{AgentToAgentPolicy, SessionKey, SessionVisibility};

pub(crate) const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

pub(crate) fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap()
}

#[derive(Debug, Default)]
pub(crate) struct RecordingHeartbeat {
    pub woken: Mutex<Vec<SessionKey>>,
}

impl RecordingHeartbeat {
    pub(crate) fn count(&self, session: &SessionKey) -> usize {
        self.woken
            .lock()
            .unwrap()
            .iter()
            .filter(|s| *s == session)
            .count()
    }
}

impl HeartbeatHook for RecordingHeartbeat {
    fn wake(&self, session: &SessionKey) {
        self.woken.lock().unwrap().push(session.clone());
    }
}

/// Records deliveries; `redirect` routes one key to another (the "actually received" case);
/// `fail` makes every delivery fail.
#[derive(Debug, Default)]
pub(crate) struct RecordingDelivery {
    pub sent: Mutex<Vec<(SessionKey, SessionKey, String)>>,
    pub redirect: Mutex<Option<(SessionKey, SessionKey)>>,
    pub fail: Mutex<bool>,
}

#[async_trait]
impl SessionDelivery for RecordingDelivery {
    async fn deliver(
        &self,
        from: &SessionKey,
        to: &SessionKey,
        message: &str,
    ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>> {
        if *self.fail.lock().unwrap() {
            return Err("dispatcher refused the turn".into());
        }
        let received = match &*self.redirect.lock().unwrap() {
            Some((from_key, to_key)) if from_key == to => to_key.clone(),
            _ => to.clone(),
        };
        self.sent
            .lock()
            .unwrap()
            .push((from.clone(), received.clone(), message.to_owned()));
        Ok(received)
    }
}

pub(crate) struct Harness {
    pub dir: tempfile::TempDir,
    pub store: Arc<SqliteStore>,
    pub clock: Arc<ManualClock>,
    pub heartbeat: Arc<RecordingHeartbeat>,
    pub delivery: Arc<RecordingDelivery>,
    pub awareness: Arc<Awareness>,
    pub tools: SessionTools,
}

impl Harness {
    pub(crate) fn new() -> Harness {
        Harness::with_config(AwarenessConfig::default())
    }

    pub(crate) fn with_config(config: AwarenessConfig) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
        Harness::on(dir, store, config)
    }

    pub(crate) fn on(
        dir: tempfile::TempDir,
        store: Arc<SqliteStore>,
        config: AwarenessConfig,
    ) -> Harness {
        let clock = Arc::new(ManualClock::new(T0));
        let heartbeat = Arc::new(RecordingHeartbeat::default());
        let delivery = Arc::new(RecordingDelivery::default());
        let awareness = Arc::new(
            Awareness::builder(store.clone())
                .clock(clock.clone())
                .heartbeat(heartbeat.clone())
                .config(config)
                .build(),
        );
        let tools = SessionTools::new(awareness.clone(), delivery.clone());
        Harness {
            dir,
            store,
            clock,
            heartbeat,
            delivery,
            awareness,
            tools,
        }
    }

    pub(crate) async fn create(&self, text: &str) -> SessionKey {
        let k = key(text);
        self.awareness
            .create_session(NewSession::new(k.clone()), Actor::system("test"))
            .await
            .unwrap();
        k
    }

    pub(crate) async fn spawn(&self, parent: &SessionKey, child: &str) -> Spawned {
        self.awareness
            .spawn_child(SpawnChild {
                parent: parent.clone(),
                child: NewSession::new(key(child)),
            })
            .await
            .unwrap()
    }

    /// A human types into `session` (a notifying change by someone else).
    pub(crate) async fn human(&self, session: &SessionKey) -> u64 {
        self.awareness
            .record(
                session,
                StateChange::human_direct_message(Actor::human("user-1"), "telegram"),
            )
            .await
            .unwrap()
            .event
            .sequence
    }

    pub(crate) fn texts(&self, watcher: &SessionKey) -> Vec<String> {
        self.awareness
            .pending_notices(watcher)
            .iter()
            .map(|n| n.text())
            .collect()
    }
}

pub(crate) fn requester(session: &SessionKey, visibility: SessionVisibility) -> Requester {
    Requester {
        session_key: session.clone(),
        visibility,
        a2a_policy: AgentToAgentPolicy::default(),
        sandboxed: false,
    }
}
