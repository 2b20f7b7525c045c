//! The account's one Zalo Web session, shared by the sender and the listener: logged in once
//! (again after a refusal), and marked **taken over** when Zalo closes the listener because
//! another session of the account opened its own (a browser on chat.zalo.me, another
//! gateway). Zalo keeps one listener per account; reconnecting would kick the other session,
//! which would kick us back. So a taken-over channel stays down until an operator restarts it.

use std::sync::{Arc, Mutex};

use tracing::{error, info};

use crate::client::{LoginError, Session, WebClient};

/// Why the session was lost to another one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Takeover {
    /// The WebSocket close code (3000 another connection, 3003 kicked), or the command of the
    /// frame that announced it (3000).
    pub code: u16,
    /// When the listener saw it (ms since the epoch).
    pub at_ms: u64,
}

impl Takeover {
    /// What happened and what to do, for logs and errors.
    pub fn describe(&self) -> String {
        let what = if self.code == crate::wire::close::KICK_CONNECTION {
            "Zalo kicked this session (close code 3003: logged out or kicked from another device)"
        } else {
            "another Zalo Web session of this account took over (code 3000: a browser on \
             chat.zalo.me or a second gateway opened its listener)"
        };
        format!(
            "{what}. Zalo allows one listener per account; this channel stays down and does \
             not reconnect (that would kick the other session, which would kick it back). \
             Close the other session, then restart the gateway; if the account was logged out, \
             export fresh cookies first"
        )
    }
}

/// The state of the account's session (a plugin extension: the gateway's status can read it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionState {
    /// Not logged in yet (or Zalo was unreachable).
    LoggedOut,
    /// Logged in as this user id.
    LoggedIn {
        /// The account's user id.
        uid: String,
    },
    /// Lost to another session: down until restarted.
    TakenOver(Takeover),
}

#[derive(Debug)]
struct Inner {
    name: String,
    client: WebClient,
    session: tokio::sync::Mutex<Option<Session>>,
    takeover: Mutex<Option<Takeover>>,
}

/// One account's Zalo Web session.
#[derive(Debug, Clone)]
pub struct Account {
    inner: Arc<Inner>,
}

impl Account {
    pub(crate) fn new(name: &str, client: WebClient) -> Account {
        Account {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                client,
                session: tokio::sync::Mutex::new(None),
                takeover: Mutex::new(None),
            }),
        }
    }

    pub(crate) fn client(&self) -> &WebClient {
        &self.inner.client
    }

    /// The session, logging in when there is none.
    pub async fn session(&self) -> Result<Session, LoginError> {
        let mut held = self.inner.session.lock().await;
        if let Some(session) = held.as_ref() {
            return Ok(session.clone());
        }
        let session = self.inner.client.login().await?;
        info!(channel = %self.inner.name, uid = %session.uid, "logged in to Zalo Web");
        *held = Some(session.clone());
        Ok(session)
    }

    /// Forgets the session (Zalo refused it): the next use logs in again.
    pub(crate) async fn forget(&self) {
        *self.inner.session.lock().await = None;
    }

    /// The takeover, when the session was lost to another one.
    pub fn taken_over(&self) -> Option<Takeover> {
        self.inner
            .takeover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Marks the session taken over and says so at error level.
    pub(crate) fn take_over(&self, code: u16) -> Takeover {
        let takeover = Takeover {
            code,
            at_ms: self.inner.client.now_ms(),
        };
        let mut held = self
            .inner
            .takeover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.is_none() {
            error!(channel = %self.inner.name, code, "{}", takeover.describe());
            *held = Some(takeover.clone());
        }
        held.clone().unwrap_or(takeover)
    }

    /// Where the session stands.
    pub async fn state(&self) -> SessionState {
        if let Some(takeover) = self.taken_over() {
            return SessionState::TakenOver(takeover);
        }
        match self.inner.session.lock().await.as_ref() {
            Some(session) => SessionState::LoggedIn {
                uid: session.uid.clone(),
            },
            None => SessionState::LoggedOut,
        }
    }
}
