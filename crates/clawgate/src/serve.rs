//! `clawgate up`: start the gateway, serve the chat page and control API on loopback, run
//! until Ctrl-C (or SIGTERM), then shut down cleanly: polling stops, running turns finish
//! (bounded), agent sessions and their leases are closed, `gateway.json` is removed.

use std::sync::Arc;

use tracing::{error, info};

use crate::config::Config;
use crate::gateway::{Gateway, GatewayError, random_token};
use crate::state::{ChannelInfo, RuntimeInfo};

/// Runs a gateway until a stop signal. Prints where it listens and where the state lives.
pub async fn up(config: Config) -> Result<(), GatewayError> {
    let listen = config.gateway.listen;
    // Whatever set it (the file is checked when read; `--listen` is not): the listener carries
    // the operator's token and every conversation, so it never leaves this machine.
    if !listen.ip().is_loopback() {
        return Err(GatewayError::NotLoopback(listen));
    }
    // Watched before anything starts, so the default action never ends the process: a stop
    // while the gateway starts ends the start (as a crash there would, which recovery is built
    // for), and one sent the moment it says it is up is kept and closes its agents.
    let mut stop = StopSignals::watch();
    let gateway = tokio::select! {
        started = Gateway::start(config) => started?,
        () = stop.wait() => {
            println!("stopped while starting");
            return Ok(());
        }
    };
    let listener =
        tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| GatewayError::Listen {
                addr: listen,
                source: e,
            })?;
    let addr = listener.local_addr().map_err(|e| GatewayError::Listen {
        addr: listen,
        source: e,
    })?;
    let url = format!("http://{addr}");
    gateway.turns.set_control_url(&url);
    let token = random_token().map_err(GatewayError::Random)?;
    let app = app(&gateway, &token, addr.port());
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = http_stopped.await;
        });
        if let Err(e) = serve.await {
            error!(error = %e, "HTTP server stopped with an error");
        }
    });
    gateway.state.write_runtime(&RuntimeInfo {
        pid: std::process::id(),
        url: url.clone(),
        control_token: token,
        started_at: gateway.started_at,
        channels: gateway
            .channels
            .iter()
            .map(|channel| ChannelInfo {
                name: channel.name.clone(),
                platform_url: channel.plugin.platform_url.clone().unwrap_or_default(),
                embedded: channel.plugin.embedded,
                #[cfg(feature = "channel-qa")]
                platform_token: crate::qa::embedded_platform_token(channel),
                #[cfg(not(feature = "channel-qa"))]
                platform_token: None,
            })
            .collect(),
    })?;
    gateway.run().await;
    println!("clawgate is up");
    #[cfg(feature = "channel-qa")]
    if crate::qa::has_qa_channel(&gateway.channels) {
        println!("  chat:        {url}/");
    }
    println!("  console:     {url}/console/");
    println!(
        "  control API: {url}/v1 (token in {}/gateway.json)",
        gateway.state.path().display()
    );
    println!("  state:       {}", gateway.state.path().display());
    for channel in &gateway.channels {
        println!("  channel {}: {}", channel.name, channel.plugin.description);
    }
    println!("Press Ctrl-C to stop.");

    stop.wait().await;
    println!("stopping: closing agent sessions…");
    gateway.shutdown().await;
    let _ = stop_http.send(());
    let _ = server.await;
    gateway.state.remove_runtime();
    info!("stopped");
    println!("stopped cleanly");
    drop(gateway);
    Ok(())
}

/// Everything `clawgate up` serves for `gateway` on loopback port `port`: the control API under
/// `/v1` (bearer `token`), the operator console at `/console/` (its data through that API), and,
/// only beside a QA channel, the chat page and `/v1/qa/*`.
pub fn app(gateway: &Arc<Gateway>, token: &str, port: u16) -> axum::Router {
    let shared_token = Arc::new(token.to_owned());
    let delivery = Arc::new(crate::relay::ConversationDelivery::new(gateway.clone()));
    #[cfg_attr(not(feature = "channel-qa"), allow(unused_mut))]
    let mut app =
        crate::control::routes(shared_token.clone(), delivery).merge(crate::console::routes());
    #[cfg(feature = "channel-qa")]
    if crate::qa::has_qa_channel(&gateway.channels) {
        app = app.merge(crate::qa::routes(shared_token));
    }
    // Every answer is JSON, a path no route serves and a method a route does not take too
    // (set last: the method fallback reaches only the routes added so far).
    let app = app
        .fallback(unrouted)
        .method_not_allowed_fallback(wrong_method);
    // One body limit for every route: a declared length over it is refused before anything is
    // read; a chunked body is cut off at it (the extractor then answers 413 too).
    app.layer(axum::extract::DefaultBodyLimit::max(
        crate::control::MAX_REQUEST_BODY,
    ))
    .layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| async move {
            if !loopback_host(&request, port) {
                return misdirected();
            }
            if declared_length(&request).is_some_and(|n| n > crate::control::MAX_REQUEST_BODY) {
                return axum::response::IntoResponse::into_response(crate::control::too_large());
            }
            next.run(request).await
        },
    ))
    .with_state(gateway.clone())
}

/// `404` for a path no route serves, naming it and where the routes are.
async fn unrouted(method: axum::http::Method, uri: axum::http::Uri) -> axum::response::Response {
    crate::control::api_error(
        axum::http::StatusCode::NOT_FOUND,
        format!(
            "no route serves {method} {}: the control API's routes are under /v1/ (listed in \
             docs/schema/README.md), the console is at /console/",
            uri.path()
        ),
    )
}

/// `405` for a method the path's route does not take (the `Allow` header lists those it does).
async fn wrong_method(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> axum::response::Response {
    crate::control::api_error(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} does not take {method} (the Allow header names the methods it takes)",
            uri.path()
        ),
    )
}

/// Whether the request names this server by a loopback name (see
/// [`clawgate_channel_sdk::loopback`]: DNS rebinding is refused).
fn loopback_host(request: &axum::extract::Request, port: u16) -> bool {
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok());
    clawgate_channel_sdk::loopback::is_loopback_host(host, port)
}

/// The request's `Content-Length`, when it declares one.
fn declared_length(request: &axum::extract::Request) -> Option<usize> {
    request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

fn misdirected() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    (
        axum::http::StatusCode::MISDIRECTED_REQUEST,
        axum::Json(serde_json::json!({
            "error": "this gateway answers only to 127.0.0.1, localhost or [::1] as Host"
        })),
    )
        .into_response()
}

/// SIGINT (Ctrl-C) and SIGTERM, each registered when watched, so none sent after is lost.
struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn watch() -> StopSignals {
        use tokio::signal::unix::{SignalKind, signal};
        let watch = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(stream) => Some(stream),
            Err(e) => {
                error!(error = %e, "cannot watch {name}; stop the gateway with the other signal");
                None
            }
        };
        StopSignals {
            interrupt: watch(SignalKind::interrupt(), "SIGINT"),
            terminate: watch(SignalKind::terminate(), "SIGTERM"),
        }
    }

    /// Until either signal arrives (or arrived since [`StopSignals::watch`] or the last wait).
    async fn wait(&mut self) {
        async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(self.interrupt.as_mut()) => {}
            () = next(self.terminate.as_mut()) => {}
        }
    }
}

#[cfg(test)]
mod fuzz;
