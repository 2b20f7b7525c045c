//! The local control API under `/v1`: operator views and the session tools, for the CLI and
//! other local programs. Loopback only, and every request carries the bearer token the gateway
//! writes to `<state_dir>/gateway.json` (mode 0600).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::gateway::Gateway;

/// The control routes; `token` guards all of them.
pub fn routes(token: String) -> Router<Arc<Gateway>> {
    let token = Arc::new(token);
    Router::new()
        .route("/v1/status", get(status))
        .route_layer(axum::middleware::from_fn(move |request: Request, next: Next| {
            let token = token.clone();
            async move {
                let expected = format!("Bearer {token}");
                let given = request
                    .headers()
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                if given != Some(expected.as_str()) {
                    return (
                        StatusCode::UNAUTHORIZED,
                        Json(serde_json::json!({
                            "error": "missing or wrong bearer token (see gateway.json in the state directory)"
                        })),
                    )
                        .into_response();
                }
                next.run(request).await
            }
        }))
}

async fn status(State(gateway): State<Arc<Gateway>>) -> Response {
    use std::sync::atomic::Ordering;
    Json(serde_json::json!({
        "running": true,
        "pid": std::process::id(),
        "stateDir": gateway.state.path(),
        "startedAt": gateway.started_at,
        "turnsInFlight": gateway.counters.turns_in_flight.load(Ordering::Relaxed),
        "turnsCompleted": gateway.counters.turns_completed.load(Ordering::Relaxed),
        "turnsFailed": gateway.counters.turns_failed.load(Ordering::Relaxed),
    }))
    .into_response()
}
