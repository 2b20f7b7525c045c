//! The session registry: rows with their ownership metadata (spawn edges, owner, ACP owner),
//! the created/reset/deleted lifecycle, and the watch cursors that lifecycle implies.

use clawgate_store::{SessionRow, WatchCursor, WatchSource};
use clawgate_types::{AcpSessionOwner, LeaseId, SessionKey, StateVersion};
use tracing::warn;

use crate::engine::Awareness;
use crate::error::{AwarenessError, AwarenessResult};
use crate::events::{Actor, StateChange};

/// A session to register.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSession {
    pub key: SessionKey,
    /// Required for keys that are not agent-qualified; must agree with the key otherwise.
    pub agent_id: Option<String>,
    pub label: Option<String>,
    pub owner_session_key: Option<SessionKey>,
    pub spawned_by: Option<SessionKey>,
    pub parent_session_key: Option<SessionKey>,
    pub acp_owner: Option<AcpSessionOwner>,
    pub lease_id: Option<LeaseId>,
}

impl NewSession {
    pub fn new(key: SessionKey) -> NewSession {
        NewSession {
            key,
            agent_id: None,
            label: None,
            owner_session_key: None,
            spawned_by: None,
            parent_session_key: None,
            acp_owner: None,
            lease_id: None,
        }
    }
}

/// A child session spawned by `parent` (a subagent, or an ACP session with its owner record).
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnChild {
    pub parent: SessionKey,
    pub child: NewSession,
}

/// A registered session and the version its log stood at when it was created.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    pub row: SessionRow,
    pub creation_version: StateVersion,
}

/// A spawned child; `parent_watching` says whether the implicit cursor exists.
#[derive(Debug, Clone, PartialEq)]
pub struct Spawned {
    pub row: SessionRow,
    pub creation_version: StateVersion,
    pub parent_watching: bool,
}

impl Awareness {
    /// Registers a session and logs its creation (the log entry is best effort).
    #[tracing::instrument(name = "awareness.create", skip_all, fields(session = %new.key))]
    pub async fn create_session(
        &self,
        new: NewSession,
        actor: Actor,
    ) -> AwarenessResult<Registered> {
        let row = self.new_row(new).await?;
        self.store.upsert_session(&row).await?;
        let creation_version = self.creation_version(&row.session_key, actor).await;
        Ok(Registered {
            row,
            creation_version,
        })
    }

    /// Registers a child of `spawn.parent` and gives the parent its implicit watch: the
    /// parent's cursor starts at the child's creation version, so it never subscribes by hand.
    #[tracing::instrument(name = "awareness.spawn", skip_all, fields(session = %spawn.parent, child = %spawn.child.key))]
    pub async fn spawn_child(&self, spawn: SpawnChild) -> AwarenessResult<Spawned> {
        let SpawnChild { parent, mut child } = spawn;
        if child.key == parent {
            return Err(AwarenessError::InvalidInput(format!(
                "session {parent} cannot spawn itself"
            )));
        }
        // The spawn edge lives on the row, so visibility never has to look it up.
        child.spawned_by.get_or_insert_with(|| parent.clone());
        child
            .parent_session_key
            .get_or_insert_with(|| parent.clone());
        let owner = child
            .acp_owner
            .as_ref()
            .map(|a| a.owner_session_key.clone())
            .unwrap_or_else(|| parent.clone());
        child.owner_session_key.get_or_insert(owner);
        let row = self.new_row(child).await?;
        self.store.upsert_session(&row).await?;
        let actor = Actor::agent(&parent);
        let creation_version = self.creation_version(&row.session_key, actor.clone()).await;
        self.record(&parent, StateChange::child_spawned(actor, &row.session_key))
            .await;
        let parent_watching = self
            .ensure_watch(
                &parent,
                &row.session_key,
                creation_version,
                WatchSource::Spawn,
            )
            .await;
        Ok(Spawned {
            row,
            creation_version,
            parent_watching,
        })
    }

    /// Registers `watcher` as a watcher of `target` from `target`'s current version (earlier
    /// history never notifies). An existing cursor is kept as it is. False when the watcher
    /// cannot watch (not agent-qualified, e.g. global scope) or the cursor could not be written.
    pub async fn watch(&self, watcher: &SessionKey, target: &SessionKey) -> bool {
        let head = match self.store.session_head(target).await {
            Ok(head) => head.state_version,
            Err(error) => {
                warn!(session = %target, %error, "could not read the head to start a watch");
                return false;
            }
        };
        self.ensure_watch(watcher, target, head, WatchSource::Explicit)
            .await
    }

    async fn ensure_watch(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
        from: StateVersion,
        source: WatchSource,
    ) -> bool {
        // Global-scope keys are ambiguous between agents: log and changesSince only.
        if !watcher.can_watch() || watcher == target {
            return false;
        }
        let now = self.now();
        let cursor = WatchCursor {
            watcher_key: watcher.clone(),
            target_key: target.clone(),
            acked_version: from,
            notified_version: None,
            material_version: from,
            target_deleted_by: None,
            source,
            created_at: now,
            updated_at: now,
        };
        match self.store.ensure_cursor(&cursor).await {
            Ok(_) => true,
            Err(error) => {
                warn!(watcher = %watcher, session = %target, %error, "could not register a watch");
                false
            }
        }
    }

    /// Marks a reset: the cursors the session holds as a watcher are removed (it starts over
    /// without stale watches); cursors on it stay.
    #[tracing::instrument(name = "awareness.reset", skip_all, fields(session = %key))]
    pub async fn reset_session(&self, key: &SessionKey) -> AwarenessResult<()> {
        self.store.reset_session(key, self.now()).await?;
        self.forget_session(key, false);
        Ok(())
    }

    /// Deletes the session: the watches it holds end, and each session watching it gets one
    /// last notice saying it was deleted and by whom (`actor`'s id, else its type) — except
    /// the deleter itself, whose watch just ends. Consuming that notice ends the watch.
    #[tracing::instrument(name = "awareness.delete", skip_all, fields(session = %key))]
    pub async fn delete_session(&self, key: &SessionKey, actor: Actor) -> AwarenessResult<()> {
        let deleted_by = actor
            .id
            .unwrap_or_else(|| clawgate_store::codec::enum_text(&actor.actor_type));
        let notified = self
            .store
            .delete_session(key, &deleted_by, self.now())
            .await?;
        // Its change notices (as target or watcher) are superseded; the deletion notices come
        // from the store's answer, as a rebuild would find them.
        self.forget_session(key, true);
        self.queue_cursors(&notified);
        Ok(())
    }

    /// A live (not deleted) registry row.
    pub async fn session(&self, key: &SessionKey) -> AwarenessResult<Option<SessionRow>> {
        Ok(self
            .store
            .load_session(key)
            .await?
            .filter(|row| row.deleted_at.is_none()))
    }

    async fn new_row(&self, mut new: NewSession) -> AwarenessResult<SessionRow> {
        // Under global scope every agent's session is called `global`: the agent id given with
        // it says whose, so two agents' global sessions are two sessions.
        if new.key.is_global()
            && new.key.global_agent().is_none()
            && let Some(agent) = new.agent_id.as_deref().filter(|a| !a.trim().is_empty())
        {
            new.key = SessionKey::global_of(agent)
                .map_err(|e| AwarenessError::InvalidInput(format!("global-scope session: {e}")))?;
        }
        if self.session(&new.key).await?.is_some() {
            return Err(AwarenessError::AlreadyExists { key: new.key });
        }
        let agent_id = match (new.key.agent_id().or(new.key.global_agent()), new.agent_id) {
            (Some(from_key), Some(given)) if from_key != given => {
                return Err(AwarenessError::InvalidInput(format!(
                    "session {} belongs to agent {from_key:?}, not {given:?}",
                    new.key
                )));
            }
            (Some(from_key), _) => from_key.to_owned(),
            (None, Some(given)) if !given.trim().is_empty() => given,
            (None, _) => {
                return Err(AwarenessError::InvalidInput(format!(
                    "session {} is not agent-qualified: pass its agent id",
                    new.key
                )));
            }
        };
        if let Some(acp) = &new.acp_owner
            && (acp.session_key != new.key || acp.agent_id != agent_id)
        {
            return Err(AwarenessError::InvalidInput(format!(
                "the ACP owner record names {} of agent {:?}, not {} of agent {agent_id:?}",
                acp.session_key, acp.agent_id, new.key
            )));
        }
        let now = self.now();
        Ok(SessionRow {
            session_key: new.key,
            agent_id,
            owner_session_key: new.owner_session_key,
            spawned_by: new.spawned_by,
            parent_session_key: new.parent_session_key,
            label: new.label,
            acp_owner: new.acp_owner,
            lease_id: new.lease_id,
            acp_session_id: None,
            created_at: now,
            updated_at: now,
            reset_at: None,
            deleted_at: None,
        })
    }

    /// Logs the creation and returns its version; when the append fails (best effort), the
    /// head as it stands is the best creation version there is.
    async fn creation_version(&self, key: &SessionKey, actor: Actor) -> StateVersion {
        if let Some(appended) = self.record(key, StateChange::created(actor)).await {
            return StateVersion(appended.event.sequence);
        }
        match self.store.session_head(key).await {
            Ok(head) => head.state_version,
            Err(error) => {
                warn!(session = %key, %error, "could not read the creation version");
                StateVersion(0)
            }
        }
    }
}
