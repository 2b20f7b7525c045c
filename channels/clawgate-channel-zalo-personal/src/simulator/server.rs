//! The simulator's HTTP calls and the listener WebSocket.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State as AxumState};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Fault, FaultKind, Inner, Out, SimMessage, Socket, random_bytes};
use crate::wire::{self, API_TYPE, API_VERSION, LoginKey, SessionKey, cmd};

type Shared = AxumState<Arc<Inner>>;

pub(crate) async fn serve(listener: tokio::net::TcpListener, inner: Arc<Inner>) {
    let app = axum::Router::new()
        .route("/api/login/getLoginInfo", get(login_info))
        .route("/api/login/getServerInfo", get(server_info))
        .route("/api/message/sms", post(send_user))
        .route("/api/group/sendmsg", post(send_group))
        .route("/ws", any(listener_socket))
        .with_state(inner);
    let _ = axum::serve(listener, app).await;
}

fn answer(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

fn refusal(code: i64, message: &str) -> Response {
    answer(json!({ "error_code": code, "error_message": message }))
}

/// The account's session cookie is in the `Cookie` header.
fn cookie_ok(inner: &Inner, headers: &HeaderMap) -> bool {
    let want = format!("zpw_sek={}", inner.lock().config.session_cookie);
    headers
        .get_all("cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .any(|pair| pair.trim() == want)
}

fn param<'a>(q: &'a HashMap<String, String>, key: &str) -> &'a str {
    q.get(key).map_or("", String::as_str)
}

async fn login_info(
    AxumState(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let signed: Vec<(&str, String)> = [
        "zcid",
        "zcid_ext",
        "enc_ver",
        "params",
        "type",
        "client_version",
    ]
    .into_iter()
    .map(|k| (k, param(&q, k).to_owned()))
    .collect();
    if wire::sign_key("getlogininfo", &signed) != param(&q, "signkey") {
        return refusal(-1401, "invalid signkey");
    }
    if param(&q, "type") != API_TYPE.to_string() || param(&q, "zpw_ver") != API_VERSION.to_string()
    {
        return refusal(-1400, "unsupported client");
    }
    let Ok(key) = LoginKey::derive(param(&q, "zcid"), param(&q, "zcid_ext")) else {
        return refusal(-1400, "invalid zcid");
    };
    let Some(data) = key
        .decrypt(param(&q, "params"))
        .ok()
        .and_then(|d| serde_json::from_str::<Value>(&d).ok())
    else {
        return refusal(-1400, "invalid params");
    };
    let (imei_in_zcid, imei) = (
        wire::open_zcid(param(&q, "zcid"))
            .map(|z| z.1)
            .unwrap_or_default(),
        data.get("imei")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    );
    let cookie = cookie_ok(&inner, &headers);
    let mut state = inner.lock();
    if !cookie || imei != state.config.imei || imei_in_zcid != imei {
        // Not a session: zca-js then fails the login ("Đăng nhập thất bại").
        drop(state);
        return refusal(-1403, "session expired or not this device");
    }
    let session = SessionKey::from_enk(&wire::b64(&random_bytes::<16>()))
        .unwrap_or_else(|_| unreachable!("16 bytes is a key"));
    let enk = session.to_enk();
    state.sessions.push(session);
    state.stats.logins += 1;
    let ws = format!("{}/ws", state.base.replacen("http://", "ws://", 1));
    let base = state
        .config
        .service_base
        .clone()
        .unwrap_or_else(|| state.base.clone());
    let info = json!({
        "error_code": 0, "error_message": "Successful.",
        "data": {
            "uid": state.config.uid, "zpw_enk": enk, "zpw_ws": [ws],
            // Every service zca-js 2.2.0 builds a URL for when it logs in.
            "zpw_service_map_v3": {
                "chat": [base], "group": [base], "file": [base], "friend": [base],
                "profile": [base], "group_poll": [base], "reaction": [base],
                "group_board": [base], "conversation": [base], "catalog": [base],
                "zimsg": [base], "sticker": [base], "quick_message": [base], "label": [base],
                "auto_reply": [base], "alias": [base], "friend_board": [base], "aext": [base],
            },
        },
    });
    answer(json!({
        "error_code": 0, "error_message": "Successful.",
        "data": key.encrypt(&info.to_string()),
    }))
}

async fn server_info(
    AxumState(inner): Shared,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let signed: Vec<(&str, String)> = ["imei", "type", "client_version", "computer_name"]
        .into_iter()
        .map(|k| (k, param(&q, k).to_owned()))
        .collect();
    if wire::sign_key("getserverinfo", &signed) != param(&q, "signkey") {
        return answer(
            json!({ "error_code": -1401, "error_message": "invalid signkey", "data": null }),
        );
    }
    let ping = u64::try_from(inner.lock().config.ping_interval.as_millis()).unwrap_or(u64::MAX);
    answer(json!({
        "error_code": 0, "error_message": "Successful.",
        "data": {
            "setttings": { "features": {
                "socket": {
                    "ping_interval": ping,
                    "retries": { "1006": { "max": 3, "times": [1000, 2000, 5000] } },
                    "close_and_retry_codes": [1006],
                    "rotate_error_codes": [],
                },
                "sharefile": { "max_file": 10, "max_size_share_file_v3": 1024 },
            }},
            "extra_ver": {},
        },
    }))
}

async fn send_user(
    inner: Shared,
    headers: HeaderMap,
    q: Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    send(inner, headers, q, body, false).await
}

async fn send_group(
    inner: Shared,
    headers: HeaderMap,
    q: Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    send(inner, headers, q, body, true).await
}

fn take_fault(faults: &mut Vec<Fault>) -> Option<FaultKind> {
    let fault = faults.first_mut()?;
    if fault.after > 0 {
        fault.after -= 1;
        return None;
    }
    let kind = fault.kind.clone();
    fault.times = fault.times.saturating_sub(1);
    if fault.times == 0 {
        faults.remove(0);
    }
    Some(kind)
}

async fn send(
    AxumState(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
    group: bool,
) -> Response {
    if param(&q, "zpw_ver") != API_VERSION.to_string()
        || param(&q, "zpw_type") != API_TYPE.to_string()
    {
        return refusal(-1400, "unsupported client");
    }
    if !cookie_ok(&inner, &headers) {
        return refusal(-1403, "session expired");
    }
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    let Some(sealed) = form.get("params") else {
        return refusal(-1400, "missing params");
    };
    let mut state = inner.lock();
    let Some((key, params)) = state.sessions.iter().rev().find_map(|k| {
        let plain = k.decrypt(sealed).ok()?;
        Some((k.clone(), serde_json::from_str::<Value>(&plain).ok()?))
    }) else {
        return refusal(-1403, "the params are not encrypted with a session key");
    };
    let text = params.get("message").and_then(Value::as_str).unwrap_or("");
    let thread = params
        .get(if group { "grid" } else { "toid" })
        .and_then(|v| {
            v.as_str()
                .map(str::to_owned)
                .or_else(|| v.as_u64().map(|n| n.to_string()))
        })
        .unwrap_or_default();
    let client_id = params.get("clientId").and_then(Value::as_u64);
    if group && params.get("visibility").and_then(Value::as_i64) != Some(0) {
        return refusal(-1400, "missing visibility");
    }
    if !group && params.get("imei").and_then(Value::as_str) != Some(state.config.imei.as_str()) {
        return refusal(-1400, "missing imei");
    }
    let (Some(client_id), false, false) = (client_id, text.is_empty(), thread.is_empty()) else {
        return refusal(-1400, "invalid params");
    };
    if text.chars().count() > state.config.max_text_chars {
        return refusal(-1401, "message too long");
    }
    let fault = take_fault(&mut state.faults);
    match &fault {
        Some(FaultKind::Refuse(code, message)) => return refusal(*code, message),
        Some(FaultKind::ServerError(status)) => {
            return StatusCode::from_u16(*status)
                .unwrap_or(StatusCode::BAD_GATEWAY)
                .into_response();
        }
        Some(FaultKind::LoseAnswer) | None => {}
    }
    let lost = fault == Some(FaultKind::LoseAnswer);
    let msg_id = state.next_msg_id();
    let message = SimMessage {
        msg_id: msg_id.clone(),
        cli_msg_id: client_id.to_string(),
        from: state.config.uid.clone(),
        group,
        thread,
        text: text.to_owned(),
        answered: !lost,
    };
    state.landed.push(message.clone());
    // The account's own message, on its listener (what zca-js emits with selfListen).
    state.push(&message);
    drop(state);
    let inner_answer = json!({
        "error_code": 0, "error_message": "",
        "data": { "msgId": msg_id.parse::<u64>().unwrap_or_default() },
    });
    if lost {
        // Headers go out, then the connection breaks: the client never reads an answer.
        let broken = futures_util::stream::once(async {
            Err::<Bytes, std::io::Error>(std::io::Error::other("connection lost"))
        });
        return Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from_stream(broken))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    answer(json!({
        "error_code": 0, "error_message": "",
        "data": key.encrypt(&inner_answer.to_string()),
    }))
}

async fn listener_socket(
    AxumState(inner): Shared,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
    ws: WebSocketUpgrade,
) -> Response {
    if !cookie_ok(&inner, &headers) || param(&q, "zpw_ver") != API_VERSION.to_string() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    ws.on_upgrade(move |socket| run_socket(inner, socket))
}

async fn run_socket(inner: Arc<Inner>, mut socket: WebSocket) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cipher_key = wire::b64(&random_bytes::<32>());
    let id = {
        let mut state = inner.lock();
        // One listener per account: the open one is told and closed.
        for old in std::mem::take(&mut state.sockets) {
            let _ = old.tx.send(Out::Frame(wire::encode_frame(
                1,
                cmd::DUPLICATE,
                0,
                &json!({}),
            )));
            let _ = old.tx.send(Out::Close(wire::close::DUPLICATE_CONNECTION));
            state.stats.kicked += 1;
        }
        state.next_socket += 1;
        let id = state.next_socket;
        let key_frame = wire::encode_frame(
            1,
            cmd::CIPHER_KEY,
            1,
            &json!({ "key": cipher_key, "encrypt": 0, "error_code": 0 }),
        );
        let _ = tx.send(Out::Frame(key_frame));
        state.sockets.push(Socket {
            id,
            cipher_key: cipher_key.clone(),
            tx,
        });
        state.stats.opened += 1;
        state.stats.open = state.sockets.len() as u64;
        id
    };
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Frame(bytes)) => {
                    if socket.send(Message::Binary(bytes.into())).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close(code)) => {
                    let _ = socket
                        .send(Message::Close(Some(CloseFrame { code, reason: "".into() })))
                        .await;
                    break;
                }
                Some(Out::Drop) | None => {
                    // Gone without a close frame.
                    drop(socket);
                    return;
                }
            },
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    if let Ok((1, cmd::PING, 1, _)) = wire::decode_frame(&bytes) {
                        inner.lock().stats.pings += 1;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let mut state = inner.lock();
    state.sockets.retain(|s| s.id != id);
    state.stats.open = state.sockets.len() as u64;
}
