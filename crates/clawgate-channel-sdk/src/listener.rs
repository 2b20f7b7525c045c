//! The one HTTP listener every pushed channel serves its webhook on (feature `listener`).
//!
//! A webhook listener faces the internet before anything is authenticated, so it is bounded
//! before any handler runs: request headers must arrive within a deadline (a connection that
//! trickles or never finishes them is closed), the whole body must arrive within another and
//! fit the platform's size (a larger `Content-Length` is answered 413 without reading a byte of
//! it), connections and requests in flight are capped (beyond the cap a connection is closed at
//! once and a request is answered 503, which platforms retry). Handlers get the body buffered,
//! so they check the signature over the bytes before parsing anything, and answer every
//! refusal with [`refused`], one fixed response whose details go to the log only.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clawgate_types::DeliveryFailureKind;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{Semaphore, watch};

use crate::SourceError;

/// What bounds a webhook listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// How long a connection may take to send a request's headers (each request of a
    /// kept-alive connection too; an idle kept-alive connection is closed after it as well).
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive, once its headers did.
    pub body_timeout: Duration,
    /// The largest body accepted (the platform's largest delivery, with room to spare).
    pub max_body_bytes: usize,
    /// Open connections at most; one more is closed as soon as it is accepted.
    pub max_connections: usize,
    /// Requests being handled at most; one more is answered 503 (platforms redeliver).
    pub max_in_flight: usize,
}

impl Limits {
    /// The default bounds, with the platform's body limit: headers within 10 s, the body
    /// within 20 s, 1,024 connections, 128 requests in flight.
    pub fn with_max_body(max_body_bytes: usize) -> Limits {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(20),
            max_body_bytes,
            max_connections: 1_024,
            max_in_flight: 128,
        }
    }
}

/// The answer to every request that fails authentication: one fixed status and body, so a
/// caller learns nothing about why (which check failed, which key was unknown). Log the reason
/// before answering.
pub fn refused() -> Response {
    (StatusCode::UNAUTHORIZED, "unauthorized").into_response()
}

/// Serves `router` on `listen` within `limits` until `stop` resolves, then stops accepting,
/// lets the requests in progress finish and returns. `what` names the listener in errors and
/// the log ("the LINE webhook listener").
pub async fn serve(
    what: &str,
    listen: SocketAddr,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), SourceError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        SourceError::new(
            DeliveryFailureKind::Transient,
            format!("{what} cannot listen on {listen}: {e}"),
        )
    })?;
    tracing::info!(%listen, "{what} up");
    serve_on(listener, router, limits, stop).await;
    Ok(())
}

/// [`serve`] on a listener already bound (tests bind port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()> + Send,
) {
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
    let app = router
        // The body reaches the handler already bounded here; axum's extractors would otherwise
        // apply their own 2 MB default to it, below some platforms' deliveries.
        .layer(axum::extract::DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            (limits, in_flight),
            bounded,
        ));
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let (stopping, stopped) = watch::channel(false);
    let mut open = tokio::task::JoinSet::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(%error, "a webhook connection could not be accepted");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut stopped = stopped.clone();
        open.spawn(async move {
            let _permit = permit;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopped.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
        // Finished connections are reaped as new ones come, so the set stays small.
        while open.try_join_next().is_some() {}
    }
    let _ = stopping.send(true);
    while open.join_next().await.is_some() {}
}

/// Caps the requests in flight and buffers the body within the size and time limits, before
/// the handler sees the request.
async fn bounded(
    State((limits, in_flight)): State<(Limits, Arc<Semaphore>)>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = in_flight.try_acquire() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy, retry").into_response();
    };
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return too_large();
    }
    let read = axum::body::to_bytes(body, limits.max_body_bytes);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => (StatusCode::REQUEST_TIMEOUT, "request body too slow").into_response(),
        Ok(Err(error)) => {
            let limit = std::error::Error::source(&error)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if limit {
                too_large()
            } else {
                (StatusCode::BAD_REQUEST, "unreadable request body").into_response()
            }
        }
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

fn too_large() -> Response {
    (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::routing::post;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// A listener on a free port whose handler counts the bodies it got; stopped on drop of
    /// the returned sender.
    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        Arc<std::sync::atomic::AtomicUsize>,
        watch::Sender<bool>,
    ) {
        let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = handled.clone();
        let router = Router::new().route(
            "/hook",
            post(move |body: axum::body::Bytes| {
                let count = count.clone();
                async move {
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    format!("got {}", body.len())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(serve_on(listener, router, limits, async move {
            let _ = stopped.changed().await;
        }));
        (addr, handled, stop)
    }

    /// Sends `head` (and `body`), returns the status line of the answer.
    async fn status_of(addr: SocketAddr, head: &str, body: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        // The answer may come (and the connection close) before all of the body is written.
        let _ = stream.write_all(body).await;
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    fn post_head(len: usize) -> String {
        format!(
            "POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_idle_half_sent_requests_do_not_stop_a_delivery() {
        let (addr, handled, _stop) = start(Limits::with_max_body(1 << 20)).await;
        let mut idle = Vec::new();
        for _ in 0..1_000 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"POST /hook HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
            idle.push(stream);
        }
        let status = status_of(addr, &post_head(5), b"hello").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_over_the_limit_is_refused_unread() {
        let (addr, handled, _stop) = start(Limits::with_max_body(1 << 20)).await;
        // Declares 3 MiB and sends none of it: the answer cannot wait for the body.
        let status = status_of(addr, &post_head(3 << 20), b"").await;
        assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
        // Chunked, with no length declared: cut at the limit.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        for _ in 0..20 {
            let head = format!("{:x}\r\n", chunk.len());
            if stream.write_all(head.as_bytes()).await.is_err()
                || stream.write_all(&chunk).await.is_err()
                || stream.write_all(b"\r\n").await.is_err()
            {
                break;
            }
        }
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
        assert!(
            String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 413"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert_eq!(
            handled.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "no handler ran"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trickled_body_and_trickled_headers_are_cut_off() {
        let mut limits = Limits::with_max_body(1 << 20);
        limits.header_timeout = Duration::from_millis(300);
        limits.body_timeout = Duration::from_millis(300);
        let (addr, handled, _stop) = start(limits).await;
        // Headers done, then a byte of the body now and then.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(post_head(100).as_bytes()).await.unwrap();
        let trickle = async {
            for _ in 0..100 {
                if stream.write_all(b"a").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), trickle).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        assert!(
            String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        // Headers never finished: the connection is closed.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"POST /hook HTTP/1.1\r\n").await.unwrap();
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(
            closed.is_ok(),
            "a connection that never finishes its headers is closed"
        );
        assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_over_the_cap_are_closed_and_the_listener_stops_on_request() {
        let mut limits = Limits::with_max_body(1 << 20);
        limits.max_connections = 2;
        let (addr, handled, stop) = start(limits).await;
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"POST /hook HTTP/1.1\r\n").await.unwrap();
            held.push(stream);
        }
        // Give the listener the time to take both.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let refused = status_of(addr, &post_head(2), b"hi").await;
        assert_eq!(
            refused, "",
            "a third connection gets no answer: it is closed"
        );
        drop(held);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            status_of(addr, &post_head(2), b"hi").await,
            "HTTP/1.1 200 OK"
        );
        assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 1);
        stop.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(TcpStream::connect(addr).await.is_err(), "stopped listening");
    }
}
