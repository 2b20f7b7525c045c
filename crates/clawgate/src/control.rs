//! The local control API under `/v1`: the operator views and the session tools, for the CLI and
//! other local programs. Loopback only, and every request carries the bearer token the gateway
//! writes to `<state_dir>/gateway.json` (mode 0600).
//!
//! Each route maps 1:1 onto a function of [`crate::views`] (the CLI calls the same functions on
//! a stopped gateway), so both modes answer with the same JSON. [`ROUTES`] documents them for
//! the generated reference (`docs/schema/README.md`). Errors are `{"error": "..."}` with 400 (bad
//! parameters), 404 (unknown intent or session), 409 (illegal transition, changed meanwhile),
//! 502 (a platform failed), 503 (not possible here).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use clawgate_awareness::{SessionDelivery, SessionTools};
use clawgate_types::clock::{Clock as _, SystemClock};
use clawgate_types::{DurableSendIntent, SessionKey};

use crate::gateway::Gateway;
use crate::views::{self, ViewError};

/// One control route, as the generated reference lists it.
#[derive(Debug, Clone, Copy)]
pub struct RouteDoc {
    pub method: &'static str,
    pub path: &'static str,
    /// The query or body type (a schema in `docs/schema/`), if any.
    pub input: Option<&'static str>,
    /// The answer's type.
    pub output: &'static str,
    pub about: &'static str,
}

const fn route(
    method: &'static str,
    path: &'static str,
    input: Option<&'static str>,
    output: &'static str,
    about: &'static str,
) -> RouteDoc {
    RouteDoc {
        method,
        path,
        input,
        output,
        about,
    }
}

/// Every control route, in the order of [`routes`] (the QA channel's follow in `qa::ROUTES`).
pub const ROUTES: &[RouteDoc] = &[
    route(
        "GET",
        "/v1/status",
        None,
        "StatusView",
        "The state directory at a glance.",
    ),
    route(
        "GET",
        "/v1/events",
        None,
        "StatusView",
        "`text/event-stream`: a `status` event (the `/v1/status` answer) about every second, \
         keep-alive comments between; an `error` event (`ErrorBody`) when the status cannot be \
         read. Ends when the gateway stops. The operator console reads it.",
    ),
    route(
        "GET",
        "/v1/metrics",
        Some("MetricsParams"),
        "MetricsView",
        "Per-minute inbound and sent counts, inbound → final reply latency, and the outcomes of \
         the window's send intents (the operator console's charts).",
    ),
    route(
        "GET",
        "/v1/outbox",
        Some("OutboxListParams"),
        "OutboxList",
        "Send intents, oldest first, filtered by status and channel.",
    ),
    route(
        "GET",
        "/v1/outbox/{id}",
        None,
        "DurableSendIntent",
        "One whole send intent.",
    ),
    route(
        "POST",
        "/v1/outbox/{id}/retry",
        None,
        "OutboxAction",
        "`failed` or `unknown_after_send` → `pending`, due now, with a fresh attempt budget and \
         time-to-live. Retrying an unknown outcome may duplicate the message on a platform \
         without reconciliation.",
    ),
    route(
        "POST",
        "/v1/outbox/{id}/cancel",
        None,
        "OutboxAction",
        "`pending`, `failed` or `unknown_after_send` → `cancelled` (final).",
    ),
    route(
        "GET",
        "/v1/inbox",
        Some("InboxListParams"),
        "InboxList",
        "Inbound event records, newest first (`status=dead_lettered` for dead letters).",
    ),
    route(
        "GET",
        "/v1/leases",
        Some("LeasesListParams"),
        "LeaseList",
        "Agent process leases, oldest first.",
    ),
    route(
        "POST",
        "/v1/leases/reap",
        None,
        "ReapSummary",
        "Ends the processes of unfinished leases no live session owns (verified as this \
         instance's only), then applies lease retention.",
    ),
    route(
        "GET",
        "/v1/sessions",
        Some("SessionsListParams"),
        "SessionsListResult",
        "`sessions_list` as the operator (visibility `all`).",
    ),
    route(
        "GET",
        "/v1/sessions/{key}",
        Some("SessionStatusParams"),
        "SessionStatusResult",
        "`session_status`; with `changesSince` the events after that version.",
    ),
    route(
        "GET",
        "/v1/sessions/{key}/history",
        Some("SessionsHistoryParams"),
        "SessionsHistoryResult",
        "`sessions_history`: the newest retained state changes.",
    ),
    route(
        "GET",
        "/v1/sessions/{key}/watchers",
        None,
        "SessionWatchers",
        "Who watches the session and whom it watches, each watch with its pending notice.",
    ),
    route(
        "POST",
        "/v1/sessions/{key}/send",
        Some("SessionsSendBody"),
        "SessionsSendResult",
        "`sessions_send`: the message goes into the session's QA conversation, authored by \
         `session:<from>`; with `watch` the sender watches the receiving session.",
    ),
    route(
        "POST",
        "/v1/sessions/{key}/cancel",
        None,
        "SessionAction",
        "Cancels the session's running turn (ACP `session/cancel`): the agent ends it, its \
         reply says it was stopped, and the session and its process stay for the next \
         message. `turnWasRunning` false: nothing ran.",
    ),
    route(
        "POST",
        "/v1/sessions/{key}/close",
        None,
        "SessionAction",
        "Closes the session's agent session (a running turn is cancelled first; the process \
         ended, its lease closed): the next message begins a fresh ACP session.",
    ),
];

/// The control routes; `token` guards all of them. `delivery` carries `sessions_send` into the
/// receiving session's conversation (the channel decides how).
pub fn routes(token: Arc<String>, delivery: Arc<dyn SessionDelivery>) -> Router<Arc<Gateway>> {
    let router = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/events", get(events))
        .route("/v1/metrics", get(metrics))
        .route("/v1/outbox", get(outbox_list))
        .route("/v1/outbox/{id}", get(outbox_show))
        .route("/v1/outbox/{id}/retry", post(outbox_retry))
        .route("/v1/outbox/{id}/cancel", post(outbox_cancel))
        .route("/v1/inbox", get(inbox_list))
        .route("/v1/leases", get(leases_list))
        .route("/v1/leases/reap", post(leases_reap))
        .route("/v1/sessions", get(sessions_list))
        .route("/v1/sessions/{key}", get(session_status))
        .route("/v1/sessions/{key}/history", get(sessions_history))
        .route("/v1/sessions/{key}/watchers", get(session_watchers))
        .route("/v1/sessions/{key}/send", post(sessions_send))
        .route("/v1/sessions/{key}/cancel", post(session_cancel))
        .route("/v1/sessions/{key}/close", post(session_close));
    require_token(router, token).layer(Extension(delivery))
}

/// Guards every route of `router` (added so far) with the bearer token.
pub(crate) fn require_token(
    router: Router<Arc<Gateway>>,
    token: Arc<String>,
) -> Router<Arc<Gateway>> {
    router.route_layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let token = token.clone();
            async move {
                let expected = format!("Bearer {token}");
                // Exactly one header: with two, which one a proxy or a framework in front
                // would honour is anyone's guess.
                let mut given = request
                    .headers()
                    .get_all(axum::http::header::AUTHORIZATION)
                    .iter();
                let only = match (given.next(), given.next()) {
                    (Some(value), None) => value.to_str().ok(),
                    _ => None,
                };
                if !only.is_some_and(|given| {
                    clawgate_channel_sdk::same_secret(expected.as_bytes(), given.as_bytes())
                }) {
                    return ApiError(
                        StatusCode::UNAUTHORIZED,
                        "missing or wrong bearer token (see gateway.json in the state directory)"
                            .into(),
                    )
                    .into_response();
                }
                next.run(request).await
            }
        },
    ))
}

/// `{"error": "..."}` with a status code.
#[derive(Debug)]
pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(views::ErrorBody { error: self.1 })).into_response()
    }
}

/// `{"error": message}` with `status`, for answers made outside the control routes.
pub(crate) fn api_error(status: StatusCode, message: String) -> Response {
    ApiError(status, message).into_response()
}

impl From<ViewError> for ApiError {
    fn from(error: ViewError) -> Self {
        let status =
            StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError(status, error.to_string())
    }
}

pub(crate) fn bad_request(rejection: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, rejection.to_string())
}

/// The largest request body any route of the gateway's listener takes (the longest message a
/// channel accepts is far smaller).
pub const MAX_REQUEST_BODY: usize = 256 * 1024;

/// `413` with the limit named.
pub(crate) fn too_large() -> ApiError {
    ApiError(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than {MAX_REQUEST_BODY} bytes, the limit of every route"
        ),
    )
}

/// A JSON body that could not be taken: `413` when it was over the limit, else `400`.
pub(crate) fn body_rejected(rejection: JsonRejection) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        too_large()
    } else {
        bad_request(rejection)
    }
}

pub(crate) type Answer<T> = Result<Json<T>, ApiError>;
pub(crate) type QueryOf<T> = Result<Query<T>, QueryRejection>;
pub(crate) type BodyOf<T> = Result<Json<T>, JsonRejection>;
type PathOf = Result<Path<String>, PathRejection>;

fn now() -> i64 {
    SystemClock.now_ms()
}

async fn status(State(gateway): State<Arc<Gateway>>) -> Answer<views::StatusView> {
    Ok(Json(status_view(&gateway).await?))
}

/// How often `/v1/events` sends the status.
const EVENT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// `GET /v1/events`: the status as server-sent events, until the client goes or the gateway
/// stops (an open stream must not hold up the HTTP server's graceful shutdown).
async fn events(State(gateway): State<Arc<Gateway>>) -> impl IntoResponse {
    let stopped = gateway.stopped();
    let stream = futures_util::stream::unfold(
        (gateway, stopped, true),
        |(gateway, mut stopped, first)| async move {
            if *stopped.borrow() {
                return None;
            }
            if !first {
                tokio::select! {
                    _ = tokio::time::sleep(EVENT_INTERVAL) => {}
                    _ = stopped.changed() => return None,
                }
            }
            let event = match status_view(&gateway).await {
                Ok(view) => Event::default().event("status").json_data(&view),
                Err(ApiError(_, error)) => Event::default()
                    .event("error")
                    .json_data(views::ErrorBody { error }),
            };
            // Serializing these plain structs cannot fail; a comment keeps the stream well-formed
            // if it ever did.
            let event = event.unwrap_or_else(|_| Event::default().comment("unserializable"));
            Some((
                Ok::<_, std::convert::Infallible>(event),
                (gateway, stopped, false),
            ))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn metrics(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<views::MetricsParams>,
) -> Answer<views::MetricsView> {
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(views::metrics(&*gateway.store, &params, now()).await?))
}

async fn status_view(gateway: &Gateway) -> Result<views::StatusView, ApiError> {
    let url = gateway
        .state
        .read_runtime()
        .map(|info| info.url)
        .unwrap_or_default();
    let counters = &gateway.counters;
    let pools = gateway.acpx.figures().await;
    let info = views::GatewayInfo {
        pid: std::process::id(),
        url,
        started_at: gateway.started_at,
        turns_in_flight: counters.turns_in_flight.load(Ordering::Relaxed) as u64,
        turns_completed: counters.turns_completed.load(Ordering::Relaxed),
        turns_failed: counters.turns_failed.load(Ordering::Relaxed),
        agent_sessions_live: pools.live as u64,
        agent_sessions_in_use: pools.in_use as u64,
        turns_queued: pools.queued as u64,
        idle_closes: pools.idle_closes,
        evictions: pools.evictions,
        handovers: pools.handovers,
        agent_auth_failures: counters.agent_auth_failures.load(Ordering::Relaxed),
        turn_deadlines: counters.turn_deadlines.load(Ordering::Relaxed),
        turns_cancelled: counters.turns_cancelled.load(Ordering::Relaxed),
        channels: gateway
            .channels
            .iter()
            .map(|channel| views::ChannelSummary {
                name: channel.name.clone(),
                kind: channel.kind.clone(),
                account: channel.account.clone(),
                agent: channel.agent_id.clone(),
                description: channel.plugin.description.clone(),
            })
            .collect(),
    };
    Ok(views::status(&*gateway.store, gateway.state.path(), Some(info)).await?)
}

async fn outbox_list(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<views::OutboxListParams>,
) -> Answer<views::OutboxList> {
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(views::outbox_list(&*gateway.store, &params).await?))
}

async fn outbox_show(State(gateway): State<Arc<Gateway>>, id: PathOf) -> Answer<DurableSendIntent> {
    let Path(id) = id.map_err(bad_request)?;
    Ok(Json(views::outbox_show(&*gateway.store, &id).await?))
}

async fn outbox_retry(
    State(gateway): State<Arc<Gateway>>,
    id: PathOf,
) -> Answer<views::OutboxAction> {
    let Path(id) = id.map_err(bad_request)?;
    Ok(Json(
        views::outbox_retry(&*gateway.store, &id, now()).await?,
    ))
}

async fn outbox_cancel(
    State(gateway): State<Arc<Gateway>>,
    id: PathOf,
) -> Answer<views::OutboxAction> {
    let Path(id) = id.map_err(bad_request)?;
    Ok(Json(
        views::outbox_cancel(&*gateway.store, &id, now()).await?,
    ))
}

async fn inbox_list(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<views::InboxListParams>,
) -> Answer<views::InboxList> {
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(views::inbox_list(&*gateway.store, &params).await?))
}

async fn leases_list(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<views::LeasesListParams>,
) -> Answer<views::LeaseList> {
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(views::leases_list(&*gateway.store, &params).await?))
}

async fn leases_reap(State(gateway): State<Arc<Gateway>>) -> Answer<views::ReapSummary> {
    Ok(Json(views::leases_reap(&gateway.acpx, now()).await?))
}

/// How `sessions_send` reaches the receiving session, as [`routes`] was given it.
type Delivery = Extension<Arc<dyn SessionDelivery>>;

/// The session tools of the running gateway: sends go through `delivery`.
fn tools(gateway: &Gateway, Extension(delivery): Delivery) -> SessionTools {
    SessionTools::new(gateway.awareness.clone(), delivery)
}

fn session_key(path: PathOf) -> Result<SessionKey, ApiError> {
    let Path(key) = path.map_err(bad_request)?;
    Ok(views::parse_session_key(&key)?)
}

async fn sessions_list(
    State(gateway): State<Arc<Gateway>>,
    delivery: Delivery,
    query: QueryOf<views::SessionsListParams>,
) -> Answer<views::SessionsListResult> {
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(
        views::sessions_list(&tools(&gateway, delivery), &params).await?,
    ))
}

async fn session_status(
    State(gateway): State<Arc<Gateway>>,
    delivery: Delivery,
    key: PathOf,
    query: QueryOf<views::SessionStatusParams>,
) -> Answer<views::SessionStatusResult> {
    let key = session_key(key)?;
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(
        views::session_status(&tools(&gateway, delivery), key, &params).await?,
    ))
}

async fn sessions_history(
    State(gateway): State<Arc<Gateway>>,
    delivery: Delivery,
    key: PathOf,
    query: QueryOf<views::SessionsHistoryParams>,
) -> Answer<views::SessionsHistoryResult> {
    let key = session_key(key)?;
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(
        views::sessions_history(&tools(&gateway, delivery), key, &params).await?,
    ))
}

async fn session_watchers(
    State(gateway): State<Arc<Gateway>>,
    key: PathOf,
) -> Answer<views::SessionWatchers> {
    let key = session_key(key)?;
    Ok(Json(views::session_watchers(&*gateway.store, key).await?))
}

async fn session_cancel(
    State(gateway): State<Arc<Gateway>>,
    key: PathOf,
) -> Answer<views::SessionAction> {
    let key = session_key(key)?;
    let running = gateway
        .turns
        .cancel_turn_of(&key, clawgate_awareness::Actor::human("operator"))
        .await;
    Ok(Json(views::SessionAction {
        session: key,
        action: "cancel".into(),
        turn_was_running: running,
    }))
}

async fn session_close(
    State(gateway): State<Arc<Gateway>>,
    key: PathOf,
) -> Answer<views::SessionAction> {
    let key = session_key(key)?;
    let running = gateway
        .turns
        .close_session_of(&key, clawgate_awareness::Actor::human("operator"))
        .await
        .map_err(|e| match e {
            clawgate_turns::TurnError::Agent(e) => views::ViewError::Acpx(e),
            other => views::ViewError::Unavailable(other.to_string()),
        })?;
    Ok(Json(views::SessionAction {
        session: key,
        action: "close".into(),
        turn_was_running: running,
    }))
}

async fn sessions_send(
    State(gateway): State<Arc<Gateway>>,
    delivery: Delivery,
    key: PathOf,
    body: BodyOf<views::SessionsSendBody>,
) -> Answer<views::SessionsSendResult> {
    let key = session_key(key)?;
    let Json(body) = body.map_err(body_rejected)?;
    Ok(Json(
        views::sessions_send(
            &tools(&gateway, delivery),
            &gateway.config.sessions,
            key,
            &body,
        )
        .await?,
    ))
}
