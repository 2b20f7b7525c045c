//! The sender's own Eyre channel: pokes go out as `PUT`s, and their results come back on the
//! channel's event stream as `{"id": <poke id>, "response": "poke", "ok": "ok"}` or
//! `{"err": …}`. A `PUT` answered 204 only means Eyre took the action: a poke counts as done
//! only on its `ok`, as refused on its `err`, and as unknown when neither arrives in time.
//!
//! One reader task per channel reads the stream, hands each poke result to its waiter and
//! acks every event (an unacked backlog clogs the channel and Eyre kills it). A dropped stream
//! is opened again at once: Eyre replays what was not acked, poke results included. A reaped
//! channel (404) fails the pokes still waiting (their outcome is unknown) and the next poke
//! opens a new channel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_types::clock::Clock;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::eyre::{Eyre, EyreError};

/// How a poke ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PokeOutcome {
    /// The agent took it (`ok`).
    Done,
    /// The agent refused it (`err`, Hoon's trace as text): nothing happened.
    Refused(String),
}

/// Why a poke has no outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PokeError {
    /// The `PUT` was answered with an error or never reached the ship: the poke was not sent.
    #[error(transparent)]
    NotSent(EyreError),
    /// The poke may have been taken, but its result never came (lost answer, dropped stream,
    /// reaped channel).
    #[error("the poke's result never came: {0}")]
    Unknown(String),
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<PokeOutcome>>>>;

struct Open {
    uid: String,
    /// Set by the reader when the channel is gone.
    gone: Arc<std::sync::atomic::AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

/// A poke channel on one ship.
pub(crate) struct Airlock {
    eyre: Arc<Eyre>,
    our: String,
    label: String,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    poke_timeout: Duration,
    next_id: AtomicU64,
    waiters: Waiters,
    open: tokio::sync::Mutex<Option<Open>>,
}

impl std::fmt::Debug for Airlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Airlock")
            .field("our", &self.our)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl Drop for Airlock {
    fn drop(&mut self) {
        if let Ok(open) = self.open.try_lock()
            && let Some(open) = open.as_ref()
        {
            open.reader.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An Eyre channel uid no earlier run nor another gateway chose: `<prefix>-<now>-<random>`,
/// the time by the gateway's clock and 32 random bits (two gateways may start in one
/// millisecond).
pub(crate) fn fresh_uid(prefix: &str, clock: &dyn Clock) -> String {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{prefix}-{}-{:08x}", clock.now_ms(), random & 0xffff_ffff)
}

impl Airlock {
    /// Pokes as `our` through `eyre`; `timeout` per HTTP call, `poke_timeout` for a result;
    /// new channels are named by `clock` (the gateway's).
    pub(crate) fn new(
        eyre: Arc<Eyre>,
        our: &str,
        label: &str,
        timeout: Duration,
        poke_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Airlock {
        Airlock {
            eyre,
            our: our.to_owned(),
            label: label.to_owned(),
            clock,
            timeout,
            poke_timeout,
            next_id: AtomicU64::new(1),
            waiters: Arc::new(Mutex::new(HashMap::new())),
            open: tokio::sync::Mutex::new(None),
        }
    }

    /// Pokes `app` on our ship with `mark` and `json`, and waits for the result.
    pub(crate) async fn poke(
        &self,
        app: &str,
        mark: &str,
        body: Value,
    ) -> Result<PokeOutcome, PokeError> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters).insert(id, tx);
        let action = json!([{
            "id": id, "action": "poke", "ship": self.our.trim_start_matches('~'),
            "app": app, "mark": mark, "json": body,
        }]);
        let put = async {
            let mut open = self.open.lock().await;
            if open.as_ref().is_some_and(|o| o.gone.load(Ordering::SeqCst)) {
                *open = None;
            }
            let uid = open.as_ref().map_or_else(
                || fresh_uid(&format!("clawgate-{}", self.label), self.clock.as_ref()),
                |o| o.uid.clone(),
            );
            self.eyre.put(&uid, &action, self.timeout).await?;
            if open.is_none() {
                // The first PUT made the channel: now its stream can be read.
                *open = Some(self.start_reader(uid));
            }
            Ok::<_, EyreError>(())
        };
        if let Err(error) = put.await {
            lock(&self.waiters).remove(&id);
            return Err(match error {
                EyreError::Lost { .. } => PokeError::Unknown(error.to_string()),
                other => PokeError::NotSent(other),
            });
        }
        match tokio::time::timeout(self.poke_timeout, rx).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err(PokeError::Unknown(
                "the channel was reaped before the poke's result came".into(),
            )),
            Err(_) => {
                lock(&self.waiters).remove(&id);
                Err(PokeError::Unknown(format!(
                    "no result within {} ms",
                    self.poke_timeout.as_millis()
                )))
            }
        }
    }

    fn start_reader(&self, uid: String) -> Open {
        let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = tokio::spawn(read_channel(
            self.eyre.clone(),
            uid.clone(),
            self.waiters.clone(),
            gone.clone(),
            self.timeout,
        ));
        Open { uid, gone, reader }
    }
}

async fn read_channel(
    eyre: Arc<Eyre>,
    uid: String,
    waiters: Waiters,
    gone: Arc<std::sync::atomic::AtomicBool>,
    timeout: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match eyre.stream(&uid, timeout).await {
            Ok(mut stream) => {
                backoff = Duration::from_millis(50);
                loop {
                    match stream.next().await {
                        Ok(Some(event)) => {
                            if event.data["response"] == "poke"
                                && let Some(id) = event.data["id"].as_u64()
                                && let Some(waiter) = lock(&waiters).remove(&id)
                            {
                                let outcome = match event.data.get("err") {
                                    Some(err) => PokeOutcome::Refused(
                                        err.as_str().map_or_else(|| err.to_string(), str::to_owned),
                                    ),
                                    None => PokeOutcome::Done,
                                };
                                let _ = waiter.send(outcome);
                            }
                            // Acks are cumulative; every event here is handled once read.
                            let ack = json!([{ "action": "ack", "event-id": event.id }]);
                            if let Err(error) = eyre.put(&uid, &ack, timeout).await {
                                debug!(%uid, %error, "ack failed; the event comes again");
                            }
                        }
                        Ok(None) => break,
                        Err(error) => {
                            debug!(%uid, %error, "the poke channel's stream broke");
                            break;
                        }
                    }
                }
            }
            Err(EyreError::Reaped { .. }) => {
                warn!(%uid, "the poke channel was reaped; a new one opens with the next poke");
                gone.store(true, Ordering::SeqCst);
                lock(&waiters).clear();
                return;
            }
            Err(error) => debug!(%uid, %error, "could not open the poke channel's stream"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
