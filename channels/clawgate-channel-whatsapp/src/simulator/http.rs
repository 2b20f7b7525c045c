//! The Graph API server: `/<version>/<phone-number-id>` and `/<version>/<phone-number-id>/
//! messages`, behind a listener whose connections a handler can cut (a lost answer).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::state::{Inner, Outcome, envelope};
use super::{CallRecord, GraphFault, SimulatorConfig, webhook};

pub(crate) async fn start(config: SimulatorConfig) -> io::Result<Arc<Inner>> {
    let listener = TcpListener::bind(config.bind).await?;
    let addr = listener.local_addr()?;
    let inner = Arc::new(Inner::new(config, addr));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(inner.clone());
    let mut shutdown = inner.shutdown.subscribe();
    let server = axum::serve(
        CuttableListener(listener),
        app.into_make_service_with_connect_info::<Connection>(),
    )
    .with_graceful_shutdown(async move {
        let _ = shutdown.wait_for(|stopped| *stopped).await;
    });
    let server_task = tokio::spawn(async move {
        let _ = server.await;
    });
    let webhook_task = tokio::spawn(webhook::run(inner.clone()));
    inner
        .tasks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .extend([server_task, webhook_task]);
    Ok(inner)
}

pub(crate) async fn stop(inner: &Arc<Inner>) {
    inner.shutdown.send_replace(true);
    inner.wake.notify_one();
    let tasks: Vec<_> = std::mem::take(
        &mut *inner
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

/// `v<major>.<minor>`.
fn is_version(segment: &str) -> bool {
    segment
        .strip_prefix('v')
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(major, minor)| {
            !major.is_empty()
                && !minor.is_empty()
                && major.chars().all(|c| c.is_ascii_digit())
                && minor.chars().all(|c| c.is_ascii_digit())
        })
}

fn answer(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(body.clone())).into_response()
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let (version, rest) = match segments.split_first() {
        Some((version, rest)) if is_version(version) => (*version, rest),
        _ => ("", segments.as_slice()),
    };
    let path = format!("/{}", rest.join("/"));
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let json: Value = if method == Method::POST {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            // Graph also reads form bodies; the Cloud API's clients send JSON.
            Err(_) => Value::Null,
        }
    } else {
        Value::Null
    };
    let mut world = inner.world();
    let trace = world.next();
    let outcome = if version.is_empty() {
        Outcome::Refused(GraphFault {
            status: 400,
            code: 2500,
            subcode: None,
            message: format!("Unknown path components: {}", uri.path()),
            details: None,
        })
    } else if let Err(fault) = world.authorize(bearer) {
        Outcome::Refused(fault)
    } else {
        let number = inner.config.phone_number_id.as_str();
        match (&method, rest) {
            (&Method::GET, [id]) if *id == number => Outcome::Answer(world.number()),
            (&Method::POST, [id, "messages"]) if *id == number => {
                if json.is_object() {
                    world.messages(&json)
                } else {
                    Outcome::Refused(GraphFault {
                        status: 400,
                        code: 100,
                        subcode: None,
                        message: "(#100) The parameter messaging_product is required.".into(),
                        details: None,
                    })
                }
            }
            (_, [id, ..]) => Outcome::Refused(world.unknown_object(id)),
            _ => Outcome::Refused(world.unknown_object("")),
        }
    };
    let (status, code, answered) = match &outcome {
        Outcome::Answer(_) => (200, None, true),
        Outcome::Refused(fault) => (fault.status, Some(fault.code), true),
        Outcome::Lost => (200, None, false),
        Outcome::ServerError(status) => (*status, None, true),
    };
    world.calls.push(CallRecord {
        method: method.to_string(),
        path,
        body: json,
        status,
        code,
        answered,
    });
    drop(world);
    inner.wake.notify_one();
    match outcome {
        Outcome::Answer(body) => answer(200, &body),
        Outcome::Refused(fault) => answer(fault.status, &envelope(&fault, trace)),
        Outcome::Lost => {
            connection.cut();
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
        Outcome::ServerError(status) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body><h1>502 Bad Gateway</h1></body></html>",
        )
            .into_response(),
    }
}

/// A TCP listener whose connections can be closed from inside a request handler.
struct CuttableListener(TcpListener);

impl axum::serve::Listener for CuttableListener {
    type Io = CuttableStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    let cut = Arc::new(AtomicBool::new(false));
                    return (CuttableStream { stream, cut }, addr);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// Once cut, reads see end-of-stream and writes fail: hyper drops the connection without
/// writing the answer, as a connection lost after Meta acted.
pub(crate) struct CuttableStream {
    stream: TcpStream,
    cut: Arc<AtomicBool>,
}

impl AsyncRead for CuttableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.cut.load(Ordering::SeqCst) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CuttableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.cut.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.cut.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The per-connection handle a handler uses to cut its own connection.
#[derive(Clone)]
struct Connection {
    cut: Arc<AtomicBool>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, CuttableListener>>
    for Connection
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, CuttableListener>) -> Self {
        Connection {
            cut: stream.io().cut.clone(),
        }
    }
}

impl Connection {
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}
