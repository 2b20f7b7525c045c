//! The change feed: a dedicated connection `LISTEN`s on `clawgate_changes`, which every write
//! of signal events and watch cursors notifies in its own transaction (triggers of the schema;
//! the send path is left out on purpose, migration 0003 says why). A lost
//! connection is made again; the notifications of the gap are lost with it, so the feed then
//! announces one change and consumers re-read.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use clawgate_store::{ChangeFeed, StoreError, StoreResult};
use tokio::sync::{mpsc, watch};
use tokio_postgres::AsyncMessage;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PostgresStore;
use crate::errors::ErrorContext;

/// The channel the schema's triggers notify; the payload is the schema's name.
pub(crate) const CHANNEL: &str = "clawgate_changes";

/// The feed's connection shows in `pg_stat_activity` as `clawgate-feed <schema>`.
pub fn feed_application_name(schema: &str) -> String {
    let mut name = format!("clawgate-feed {schema}");
    // The server keeps 63 bytes of it; all ASCII, so any cut is a character boundary.
    name.truncate(63);
    name
}

/// How often an idle feed checks that its connection still answers (a peer that vanished
/// without closing the socket sends no error).
const HEARTBEAT: Duration = Duration::from_secs(10);

fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|generation| *generation = generation.wrapping_add(1));
}

/// A listening connection: its notifications' payloads arrive on the receiver, which closes
/// when the connection does.
async fn listen(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    ctx: &ErrorContext,
) -> StoreResult<(tokio_postgres::Client, mpsc::UnboundedReceiver<String>)> {
    let (client, mut connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| ctx.map_pg(e))?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        // Polling messages also drives the connection (the client's queries go through it).
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::debug!(%error, "change feed connection failed");
                    return;
                }
                None => return,
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(|e| ctx.map_pg(e))?;
    Ok((client, rx))
}

/// Serves one feed until every receiver is gone. `ready` hears whether the first `LISTEN`
/// worked: only then has `external_changes` returned, so no commit after it is missed.
async fn serve(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    ctx: ErrorContext,
    schema: String,
    interval: Duration,
    tx: watch::Sender<u64>,
    ready: std_mpsc::Sender<StoreResult<()>>,
) {
    let mut ready = Some(ready);
    let retry_floor = interval.clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut retry = retry_floor;
    loop {
        match listen(&config, &tls, &ctx).await {
            Ok((client, mut notifications)) => {
                match ready.take() {
                    Some(ready) => {
                        let _ = ready.send(Ok(()));
                    }
                    // Listening again: what was committed while nobody listened is unknown.
                    None => {
                        tracing::info!(database = %ctx.database, "change feed listening again");
                        bump(&tx);
                    }
                }
                retry = retry_floor;
                let mut heartbeat = tokio::time::interval(HEARTBEAT);
                heartbeat.tick().await;
                loop {
                    tokio::select! {
                        () = tx.closed() => return,
                        payload = notifications.recv() => match payload {
                            // Other schemas of the database notify the same channel.
                            Some(payload) if payload == schema => bump(&tx),
                            Some(_) => {}
                            None => break,
                        },
                        _ = heartbeat.tick() => {
                            let alive = tokio::time::timeout(HEARTBEAT, client.simple_query("SELECT 1")).await;
                            if !matches!(alive, Ok(Ok(_))) {
                                break;
                            }
                        }
                    }
                }
                tracing::warn!(database = %ctx.database, "change feed lost its connection; reconnecting");
            }
            Err(error) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(error));
                    return;
                }
                tracing::warn!(database = %ctx.database, %error, "change feed cannot reconnect yet");
            }
        }
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(Duration::from_secs(5));
    }
}

impl ChangeFeed for PostgresStore {
    /// Notifications arrive as the writes commit, so `interval` only paces reconnection after a
    /// lost connection. The feed runs on a thread of its own with its own connection, and
    /// `LISTEN` is in place when this returns.
    fn external_changes(&self, interval: Duration) -> StoreResult<watch::Receiver<u64>> {
        let (tx, rx) = watch::channel(0u64);
        let (ready_tx, ready_rx) = std_mpsc::channel();
        let mut config = self.inner.config.clone();
        config.application_name(feed_application_name(&self.inner.schema));
        let tls = self.inner.tls.clone();
        let ctx = self.inner.ctx.clone();
        let schema = self.inner.schema.clone();
        std::thread::Builder::new()
            .name("clawgate-pg-change-feed".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        runtime.block_on(serve(config, tls, ctx, schema, interval, tx, ready_tx));
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(StoreError::Backend(Box::new(e))));
                    }
                }
            })
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(StoreError::Backend(Box::new(e))),
        }
    }
}
