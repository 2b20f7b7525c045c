//! The daemon's two listeners: line-delimited JSON-RPC over TCP (`--tcp`) and HTTP
//! (`--http`: `POST /api/v1/rpc`, `GET /api/v1/check`).

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};

use super::rpc::{self, Conn, Reply};
use super::{Outbound, Shared};

pub(crate) async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(connection(stream, shared.clone()));
    }
}

async fn connection(stream: TcpStream, shared: Arc<Shared>) {
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Outbound>();
    let closed = Arc::new(Notify::new());
    let id = {
        let mut state = shared.lock();
        state.next_connection += 1;
        let id = state.next_connection;
        state.connections.insert(id, tx.clone());
        id
    };
    let writer_closed = closed.clone();
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            match out {
                Outbound::Line(mut line) => {
                    line.push('\n');
                    if write.write_all(line.as_bytes()).await.is_err() {
                        break;
                    }
                }
                Outbound::Close => break,
            }
        }
        let _ = write.shutdown().await;
        writer_closed.notify_one();
    });
    let conn = Conn {
        subscriptions: Some(tx.clone()),
    };
    let mut lines = BufReader::new(read).lines();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            () = closed.notified() => break,
        };
        let Ok(Some(line)) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match rpc::handle(&shared, &conn, &line) {
            Reply::Answer(answer) => {
                let _ = tx.send(Outbound::Line(answer.to_string()));
            }
            Reply::Nothing => {}
            Reply::Drop => {
                let _ = tx.send(Outbound::Close);
                break;
            }
        }
    }
    {
        let mut state = shared.lock();
        state.connections.remove(&id);
        state.subscribers.retain(|s| !s.tx.same_channel(&tx));
    }
    drop(conn);
    let _ = tx.send(Outbound::Close);
    let _ = writer.await;
}

pub(crate) async fn serve_http(listener: TcpListener, shared: Arc<Shared>) {
    let router =
        axum::Router::new()
            .route(
                "/api/v1/rpc",
                axum::routing::post(
                    |axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
                     body: String| async move { http_rpc(&shared, &body) },
                ),
            )
            .route(
                "/api/v1/check",
                axum::routing::get(|| async { StatusCode::OK }),
            )
            .with_state(shared);
    let _ = axum::serve(listener, router).await;
}

fn http_rpc(shared: &Shared, body: &str) -> Response {
    let conn = Conn {
        subscriptions: None,
    };
    match rpc::handle(shared, &conn, body) {
        Reply::Answer(answer) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response(),
        Reply::Nothing => StatusCode::OK.into_response(),
        // The send was carried out; the answer is cut short (a body shorter than its
        // Content-Length ends the connection), so the client cannot know it.
        Reply::Drop => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CONTENT_LENGTH, "4096"),
            ],
            "{\"jsonrpc\":",
        )
            .into_response(),
    }
}
