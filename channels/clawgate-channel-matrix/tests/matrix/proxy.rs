//! A loopback HTTP proxy in front of Synapse that can refuse a send with a Matrix error (as
//! Synapse words it) or forward it and drop Synapse's answer. Only sends and redactions
//! (`PUT …/send/…`, `PUT …/redact/…`) meet faults, unless a fault names the path it is for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a faulted call meets.
#[derive(Debug, Clone)]
pub(crate) enum FaultKind {
    /// The proxy answers with this status and Matrix error body; Synapse never sees the call.
    Refuse(u16, Value),
    /// Synapse gets the call; its answer is dropped with the connection.
    LoseAnswer,
}

impl FaultKind {
    pub(crate) fn matrix(status: u16, errcode: &str, error: &str) -> FaultKind {
        FaultKind::Refuse(status, json!({ "errcode": errcode, "error": error }))
    }
}

#[derive(Debug)]
struct Fault {
    /// Requests whose path contains this meet the fault; `None`: sends and redactions.
    on: Option<String>,
    after: u32,
    times: u32,
    kind: FaultKind,
}

#[derive(Debug, Default)]
struct State {
    faults: VecDeque<Fault>,
    /// Send and redaction calls seen.
    sends: u32,
}

#[derive(Clone)]
pub(crate) struct FaultProxy {
    pub(crate) base: String,
    state: Arc<Mutex<State>>,
}

impl FaultProxy {
    pub(crate) async fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let upstream = upstream.to_owned();
        let shared = state.clone();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(
                    stream,
                    upstream.clone(),
                    http.clone(),
                    shared.clone(),
                ));
            }
        });
        FaultProxy { base, state }
    }

    /// `times` sends, after `after` sends went through, meet `kind`.
    pub(crate) fn inject(&self, after: u32, times: u32, kind: FaultKind) {
        self.state.lock().unwrap().faults.push_back(Fault {
            on: None,
            after,
            times,
            kind,
        });
    }

    /// The next `times` requests whose path contains `on` meet `kind`.
    pub(crate) fn inject_on(&self, on: &str, times: u32, kind: FaultKind) {
        self.state.lock().unwrap().faults.push_back(Fault {
            on: Some(on.to_owned()),
            after: 0,
            times,
            kind,
        });
    }

    /// Send and redaction calls seen so far.
    pub(crate) fn sends(&self) -> u32 {
        self.state.lock().unwrap().sends
    }
}

fn take_fault(state: &Mutex<State>, method: &str, path: &str) -> Option<FaultKind> {
    let send = method == "PUT" && (path.contains("/send/") || path.contains("/redact/"));
    let mut state = state.lock().unwrap();
    if send {
        state.sends += 1;
    }
    let fault = state.faults.front_mut()?;
    let applies = match &fault.on {
        Some(on) => path.contains(on.as_str()),
        None => send,
    };
    if !applies {
        return None;
    }
    if fault.after > 0 {
        fault.after -= 1;
        return None;
    }
    let kind = fault.kind.clone();
    fault.times = fault.times.saturating_sub(1);
    if fault.times == 0 {
        state.faults.pop_front();
    }
    Some(kind)
}

/// Reads one request: method, path, headers, body.
async fn read_request(
    stream: &mut TcpStream,
) -> Option<(String, String, Vec<(String, String)>, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut start = lines.next()?.split(' ');
    let method = start.next()?.to_owned();
    let path = start.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some((method, path, headers, body))
}

async fn respond(stream: &mut TcpStream, status: u16, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let _ = stream.shutdown().await;
}

async fn serve(
    mut stream: TcpStream,
    upstream: String,
    http: reqwest::Client,
    state: Arc<Mutex<State>>,
) {
    let Some((method, path, headers, body)) = read_request(&mut stream).await else {
        return;
    };
    let fault = take_fault(&state, &method, &path);
    if let Some(FaultKind::Refuse(status, error)) = &fault {
        respond(&mut stream, *status, error.to_string().as_bytes()).await;
        return;
    }
    let mut request = http.request(
        reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
        format!("{upstream}{path}"),
    );
    for (name, value) in &headers {
        if matches!(name.as_str(), "authorization" | "content-type") {
            request = request.header(name, value);
        }
    }
    let forwarded = request.body(body).send().await;
    let (status, answer) = match forwarded {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.bytes().await.unwrap_or_default().to_vec())
        }
        Err(_) => (502, b"bad gateway".to_vec()),
    };
    if matches!(fault, Some(FaultKind::LoseAnswer)) {
        // Synapse acted; the client never hears of it.
        drop(stream);
        return;
    }
    respond(&mut stream, status, &answer).await;
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}
