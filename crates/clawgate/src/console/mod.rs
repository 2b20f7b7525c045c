//! The operator console: a few pages in the browser (overview, outbox, inbox, sessions, leases)
//! over the control API, at `/console/` on the gateway's loopback listener.
//!
//! The assets are plain HTML, CSS and JavaScript embedded with `include_str!`: no front-end
//! toolchain, no build step whose output would have to be checked in and kept fresh in CI, and
//! no CDN (the gateway's machine, and often its operators, are offline).
//!
//! The assets are served without a token: they are the same for everyone and reveal nothing.
//! Every figure on the pages comes from the token-guarded control API (`/v1/*`, the page sends
//! `Authorization: Bearer`, the token kept in the tab's `sessionStorage`), so the console has no
//! data path of its own. The Host check of `serve::app` (DNS rebinding) covers these routes
//! too; the Content-Security-Policy allows scripts, styles and connections to this origin only
//! and no inline script, so text from a platform shown on a page can never run as code.

use std::sync::Arc;

use axum::Router;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::gateway::Gateway;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// Only this origin, no inline script or style, no plugins, not framed anywhere. `data:`
/// images are none of ours but harmless; the charts are inline SVG built by the script.
pub const CONTENT_SECURITY_POLICY_VALUE: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The console's routes (no token: see the module documentation).
pub fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/console/",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/console/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/console/console.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers: [(HeaderName, HeaderValue); 5] = [
        (CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY_VALUE),
        ),
        (X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // A new binary serves new assets: never mix an old script with a new page.
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body).into_response()
}
