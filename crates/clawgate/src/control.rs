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
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawgate_awareness::{SessionDelivery, SessionTools};
use clawgate_store::SqliteStore;
use clawgate_types::clock::{Clock as _, SystemClock};
use clawgate_types::{DurableSendIntent, SessionKey};

use crate::gateway::{Channel, Gateway};
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

/// Every control route, in the order of [`routes`].
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
        "POST",
        "/v1/sessions/{key}/send",
        Some("SessionsSendBody"),
        "SessionsSendResult",
        "`sessions_send`: the message goes into the session's QA conversation, authored by \
         `session:<from>`; with `watch` the sender watches the receiving session.",
    ),
    route(
        "GET",
        "/v1/qa/messages",
        Some("QaMessagesParams"),
        "QaConversation",
        "What a QA conversation shows, agent messages marked `streaming` or `final`.",
    ),
    route(
        "POST",
        "/v1/qa/send",
        Some("QaSendBody"),
        "QaMessage",
        "Writes into a QA conversation as a person (the agent answers as usual).",
    ),
];

/// The control routes; `token` guards all of them.
pub fn routes(token: String) -> Router<Arc<Gateway>> {
    let token = Arc::new(token);
    Router::new()
        .route("/v1/status", get(status))
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
        .route("/v1/sessions/{key}/send", post(sessions_send))
        .route("/v1/qa/messages", get(qa_messages))
        .route("/v1/qa/send", post(qa_send))
        .route_layer(axum::middleware::from_fn(
            move |request: Request, next: Next| {
                let token = token.clone();
                async move {
                    let expected = format!("Bearer {token}");
                    let given = request
                        .headers()
                        .get(axum::http::header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok());
                    if given != Some(expected.as_str()) {
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

impl From<ViewError> for ApiError {
    fn from(error: ViewError) -> Self {
        let status =
            StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError(status, error.to_string())
    }
}

fn bad_request(rejection: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, rejection.to_string())
}

type Answer<T> = Result<Json<T>, ApiError>;
type QueryOf<T> = Result<Query<T>, QueryRejection>;
type BodyOf<T> = Result<Json<T>, JsonRejection>;
type PathOf = Result<Path<String>, PathRejection>;

fn now() -> i64 {
    SystemClock.now_ms()
}

async fn status(State(gateway): State<Arc<Gateway>>) -> Answer<views::StatusView> {
    let url = gateway
        .state
        .read_runtime()
        .map(|info| info.url)
        .unwrap_or_default();
    let counters = &gateway.counters;
    let info = views::GatewayInfo {
        pid: std::process::id(),
        url,
        started_at: gateway.started_at,
        turns_in_flight: counters.turns_in_flight.load(Ordering::Relaxed) as u64,
        turns_completed: counters.turns_completed.load(Ordering::Relaxed),
        turns_failed: counters.turns_failed.load(Ordering::Relaxed),
    };
    Ok(Json(
        views::status(&gateway.store, gateway.state.path(), Some(info)).await?,
    ))
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

/// The session tools of the running gateway: sends go into the target's conversation.
fn tools(gateway: &Gateway) -> SessionTools<SqliteStore> {
    SessionTools::new(
        gateway.awareness.clone(),
        Arc::new(ConversationDelivery {
            channels: gateway.channels.clone(),
        }),
    )
}

fn session_key(path: PathOf) -> Result<SessionKey, ApiError> {
    let Path(key) = path.map_err(bad_request)?;
    Ok(views::parse_session_key(&key)?)
}

async fn sessions_list(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<views::SessionsListParams>,
) -> Answer<views::SessionsListResult> {
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(views::sessions_list(&tools(&gateway), &params).await?))
}

async fn session_status(
    State(gateway): State<Arc<Gateway>>,
    key: PathOf,
    query: QueryOf<views::SessionStatusParams>,
) -> Answer<views::SessionStatusResult> {
    let key = session_key(key)?;
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(
        views::session_status(&tools(&gateway), key, &params).await?,
    ))
}

async fn sessions_history(
    State(gateway): State<Arc<Gateway>>,
    key: PathOf,
    query: QueryOf<views::SessionsHistoryParams>,
) -> Answer<views::SessionsHistoryResult> {
    let key = session_key(key)?;
    let Query(params) = query.map_err(bad_request)?;
    Ok(Json(
        views::sessions_history(&tools(&gateway), key, &params).await?,
    ))
}

async fn sessions_send(
    State(gateway): State<Arc<Gateway>>,
    key: PathOf,
    body: BodyOf<views::SessionsSendBody>,
) -> Answer<views::SessionsSendResult> {
    let key = session_key(key)?;
    let Json(body) = body.map_err(bad_request)?;
    Ok(Json(
        views::sessions_send(&tools(&gateway), &gateway.config.sessions, key, &body).await?,
    ))
}

/// Also the chat page's view of its conversation (served there without a token).
pub(crate) async fn qa_messages(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<views::QaMessagesParams>,
) -> Answer<views::QaConversation> {
    let Query(params) = query.map_err(bad_request)?;
    let channel = views::pick_channel(&gateway.channels, params.channel.as_deref())?;
    Ok(Json(
        views::qa_messages(&*gateway.store, channel, &params.conversation).await?,
    ))
}

async fn qa_send(
    State(gateway): State<Arc<Gateway>>,
    body: BodyOf<views::QaSendBody>,
) -> Answer<views::QaMessage> {
    let Json(body) = body.map_err(bad_request)?;
    let channel = views::pick_channel(&gateway.channels, body.channel.as_deref())?;
    Ok(Json(views::qa_send(channel, &body).await?))
}

/// `sessions_send` of a running gateway: a session `agent:<agent>:<channel>:<conversation>`
/// receives the message as an inbound message of its conversation, authored by
/// `session:<from>`, so the agent answers it like any other turn.
struct ConversationDelivery {
    channels: Vec<Arc<Channel>>,
}

#[async_trait::async_trait]
impl SessionDelivery for ConversationDelivery {
    async fn deliver(
        &self,
        from: &SessionKey,
        to: &SessionKey,
        message: &str,
    ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>> {
        let not_ours = || {
            format!(
                "session {to} is not a conversation of this gateway's channels (keys look like \
                 agent:<agent>:<channel>:<conversation>)"
            )
        };
        let (channel_name, conversation) = to
            .rest()
            .split_once(':')
            .filter(|_| to.is_agent_qualified())
            .ok_or_else(not_ours)?;
        let channel = self
            .channels
            .iter()
            .find(|c| c.name == channel_name)
            .ok_or_else(not_ours)?;
        crate::chat::inject(channel, conversation, &format!("session:{from}"), message).await?;
        Ok(to.clone())
    }
}
