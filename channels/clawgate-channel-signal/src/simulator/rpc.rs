//! The JSON-RPC methods, shared by the TCP and HTTP transports.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{FaultKind, Landed, MAX_BODY_BYTES, Outbound, ReceiveMode, Shared, State, Subscriber};

/// What the transport does with one request.
pub(crate) enum Reply {
    /// Writes this answer.
    Answer(Value),
    /// A notification (no `id`): nothing to write.
    Nothing,
    /// The request was carried out; the connection closes before the answer is written.
    Drop,
}

/// The connection a request came on: TCP connections can subscribe, HTTP requests cannot.
pub(crate) struct Conn {
    pub(crate) subscriptions: Option<mpsc::UnboundedSender<Outbound>>,
}

struct RpcError {
    code: i64,
    message: String,
    data: Option<Value>,
}

fn error(code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
        data: None,
    }
}

const INVALID_PARAMS: i64 = -32602;
const USER_ERROR: i64 = -1;

fn answer(id: &Value, result: Result<Value, RpcError>) -> Value {
    match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "result": result, "id": id }),
        Err(e) => {
            let mut err = json!({ "code": e.code, "message": e.message });
            if let Some(data) = e.data {
                err["data"] = data;
            }
            json!({ "jsonrpc": "2.0", "error": err, "id": id })
        }
    }
}

/// Handles one line (TCP) or body (HTTP).
pub(crate) fn handle(shared: &Shared, conn: &Conn, text: &str) -> Reply {
    let Ok(request) = serde_json::from_str::<Value>(text) else {
        return Reply::Answer(answer(&Value::Null, Err(error(-32700, "Parse error"))));
    };
    let id = request.get("id").cloned();
    let method = request.get("method").and_then(Value::as_str);
    let (Some(method), Some("2.0")) = (method, request.get("jsonrpc").and_then(Value::as_str))
    else {
        return Reply::Answer(answer(
            &id.unwrap_or(Value::Null),
            Err(error(-32600, "Invalid Request")),
        ));
    };
    let params = match request.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Reply::Answer(answer(
                &id.unwrap_or(Value::Null),
                Err(error(INVALID_PARAMS, "Invalid params")),
            ));
        }
    };
    let mut state = shared.lock();
    state.calls.push((method.to_owned(), params.clone()));
    let result = call(&mut state, conn, method, &params);
    let followups = std::mem::take(&mut state.followups);
    match (result, id) {
        (Call::Drop, _) => Reply::Drop,
        (Call::Done(_), None) => Reply::Nothing,
        (Call::Done(result), Some(id)) => {
            let answer = answer(&id, result);
            match &conn.subscriptions {
                // On a socket the answer and what follows it share the connection's queue.
                Some(tx) => {
                    let _ = tx.send(Outbound::Line(answer.to_string()));
                    for line in followups {
                        let _ = tx.send(Outbound::Line(line));
                    }
                    Reply::Nothing
                }
                None => Reply::Answer(answer),
            }
        }
    }
}

enum Call {
    Done(Result<Value, RpcError>),
    Drop,
}

/// The account a method works on (a multi-account daemon needs it in every call).
fn account(state: &State, params: &Value) -> Result<String, RpcError> {
    let account = params
        .get("account")
        .and_then(Value::as_str)
        .ok_or_else(|| error(INVALID_PARAMS, "Method requires valid account parameter"))?;
    if !state.accounts.contains_key(account) {
        return Err(error(INVALID_PARAMS, "Specified account does not exist"));
    }
    Ok(account.to_owned())
}

/// A param that may be one string or an array of them (`recipient`, `groupId`).
fn strings(params: &Value, key: &str) -> Result<Vec<String>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| error(INVALID_PARAMS, format!("Invalid params: {key}")))
            })
            .collect(),
        Some(_) => Err(error(INVALID_PARAMS, format!("Invalid params: {key}"))),
    }
}

fn number_param(params: &Value, key: &str) -> Result<Option<u64>, RpcError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| error(INVALID_PARAMS, format!("Invalid params: {key}"))),
    }
}

fn call(state: &mut State, conn: &Conn, method: &str, params: &Value) -> Call {
    let done = Call::Done;
    match method {
        "version" => done(Ok(json!({ "version": "0.14.6" }))),
        "listAccounts" => done(Ok(Value::Array(
            state
                .accounts
                .keys()
                .map(|a| json!({ "number": a }))
                .collect(),
        ))),
        "listGroups" => done(account(state, params).map(|account| {
            Value::Array(
                state
                    .groups
                    .iter()
                    .map(|(id, (name, members))| {
                        let mut all: Vec<&str> = members.iter().map(String::as_str).collect();
                        all.push(&account);
                        json!({ "id": id, "name": name, "isMember": true, "isBlocked": false,
                            "members": all.iter().map(|m| json!({ "number": m, "uuid": super::uuid_for(m) })).collect::<Vec<_>>() })
                    })
                    .collect(),
            )
        })),
        "getUserStatus" => done(account(state, params).and_then(|_| {
            let numbers = strings(params, "recipient")?;
            Ok(Value::Array(
                numbers
                    .iter()
                    .map(|n| {
                        let p = state.person(n).clone();
                        json!({ "recipient": n, "number": n,
                            "uuid": p.registered.then_some(p.uuid),
                            "isRegistered": p.registered })
                    })
                    .collect(),
            ))
        })),
        "subscribeReceive" => done(subscribe(state, conn, params)),
        "unsubscribeReceive" => done(account(state, params).map(|_| {
            if let Some(tx) = &conn.subscriptions {
                state.subscribers.retain(|s| !s.tx.same_channel(tx));
            }
            Value::Null
        })),
        "sendTyping" => done(account(state, params).and_then(|_| {
            if strings(params, "recipient")?.is_empty() && strings(params, "groupId")?.is_empty() {
                return Err(error(USER_ERROR, "No recipients given"));
            }
            Ok(json!({}))
        })),
        "remoteDelete" => done(account(state, params).and_then(|account| {
            let target = number_param(params, "targetTimestamp")?
                .ok_or_else(|| error(USER_ERROR, "No target timestamp given"))?;
            let timestamp = state.next_timestamp();
            state
                .landed
                .retain(|l| !(l.account == account && l.timestamp == target));
            Ok(json!({ "timestamp": timestamp, "results": [] }))
        })),
        "send" => send(state, params),
        _ => done(Err(error(-32601, "Method not implemented"))),
    }
}

fn subscribe(state: &mut State, conn: &Conn, params: &Value) -> Result<Value, RpcError> {
    let account = account(state, params)?;
    if state.mode == ReceiveMode::OnStart {
        return Err(error(
            USER_ERROR,
            "Receive command cannot be used if messages are already being received.",
        ));
    }
    let Some(tx) = conn.subscriptions.clone() else {
        return Err(error(
            -32601,
            "Method not implemented: subscribeReceive needs a socket connection",
        ));
    };
    let id = state.next_subscription;
    state.next_subscription += 1;
    let queued: Vec<Value> = state
        .accounts
        .get_mut(&account)
        .map(|a| a.queue.drain(..).collect())
        .unwrap_or_default();
    // Written after the answer, in order, while the daemon's lock is held.
    for item in queued {
        state.followups.push(super::notification(Some(id), &item));
        state.handed.push(item);
    }
    state.subscribers.push(Subscriber {
        id,
        account: Some(account),
        tx,
    });
    Ok(json!(id))
}

/// `"start:length:number"`, as signal-cli parses `mentions`.
fn valid_mention(m: &str) -> bool {
    let mut parts = m.splitn(3, ':');
    let start = parts.next().and_then(|p| p.parse::<u32>().ok());
    let length = parts.next().and_then(|p| p.parse::<u32>().ok());
    let who = parts.next().filter(|p| !p.is_empty());
    start.is_some() && length.is_some() && who.is_some()
}

/// The body as it goes out inline: at most 2000 bytes, cut on a character boundary.
fn inline_body(text: &str) -> (String, Option<String>) {
    if text.len() <= MAX_BODY_BYTES {
        return (text.to_owned(), None);
    }
    let mut cut = MAX_BODY_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    (text[..cut].to_owned(), Some(text.to_owned()))
}

fn send(state: &mut State, params: &Value) -> Call {
    let prepared = (|| {
        let account = account(state, params)?;
        let recipients = strings(params, "recipient")?;
        let groups = strings(params, "groupId")?;
        if recipients.is_empty() && groups.is_empty() {
            return Err(error(USER_ERROR, "No recipients given"));
        }
        if !recipients.is_empty() && !groups.is_empty() {
            return Err(error(
                USER_ERROR,
                "You cannot specify recipients by phone number and groups at the same time",
            ));
        }
        let message = match params.get("message") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(error(INVALID_PARAMS, "Invalid params: message")),
        };
        if message.is_empty() {
            return Err(error(USER_ERROR, "No message given"));
        }
        let mentions = strings(params, "mentions")?;
        if let Some(bad) = mentions.iter().find(|m| !valid_mention(m)) {
            return Err(error(
                USER_ERROR,
                format!("Invalid mention syntax ({bad}) expected 'start:length:recipientNumber'"),
            ));
        }
        let quote_ts = number_param(params, "quoteTimestamp")?;
        let quote_author = params
            .get("quoteAuthor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let quote = match (quote_ts, quote_author) {
            (Some(ts), Some(author)) => Some((ts, author)),
            (None, None) => None,
            _ => {
                return Err(error(
                    USER_ERROR,
                    "Quote timestamp and quote author must both be given",
                ));
            }
        };
        let edit_of = number_param(params, "editTimestamp")?;
        let mut group_id = None;
        let members: Vec<String> = if let Some(group) = groups.first() {
            let (_, members) = state
                .groups
                .get(group)
                .ok_or_else(|| error(USER_ERROR, format!("Group not found: {group}")))?;
            group_id = Some(group.clone());
            members.iter().cloned().collect()
        } else {
            let set: BTreeSet<String> = recipients.iter().cloned().collect();
            set.into_iter().collect()
        };
        Ok((
            account, members, group_id, message, quote, edit_of, mentions, recipients,
        ))
    })();
    let (account, members, group_id, message, quote, edit_of, mentions, recipients) = match prepared
    {
        Ok(p) => p,
        Err(e) => return Call::Done(Err(e)),
    };
    let fault = state.take_fault();
    if let Some(FaultKind::Error { code, message }) = &fault {
        return Call::Done(Err(error(*code, message.clone())));
    }
    let timestamp = state.next_timestamp();
    let mut results = Vec::new();
    let mut delivered = Vec::new();
    let mut failures = Vec::new();
    for member in &members {
        let person = state.person(member).clone();
        let kind = match &fault {
            Some(FaultKind::NetworkFailure) => "NETWORK_FAILURE",
            Some(FaultKind::RateLimit { .. }) => "RATE_LIMIT_FAILURE",
            Some(FaultKind::UntrustedIdentity) => "IDENTITY_FAILURE",
            Some(FaultKind::Unregistered) => "UNREGISTERED_FAILURE",
            _ if !person.registered => "UNREGISTERED_FAILURE",
            _ if !person.trusted => "IDENTITY_FAILURE",
            _ => "SUCCESS",
        };
        let mut result = json!({
            "recipientAddress": { "uuid": person.uuid, "number": member },
            "type": kind,
        });
        if let Some(group) = &group_id {
            result["groupId"] = json!(group);
        }
        if let Some(FaultKind::RateLimit {
            retry_after_seconds,
        }) = &fault
        {
            result["retryAfterSeconds"] = json!(retry_after_seconds);
        }
        match kind {
            "SUCCESS" => delivered.push(member.clone()),
            "NETWORK_FAILURE" => failures.push(format!("Network failure for \"{member}\"")),
            "RATE_LIMIT_FAILURE" => failures.push(format!("Rate limit failure for \"{member}\"")),
            "IDENTITY_FAILURE" => failures.push(format!("Untrusted Identity for \"{member}\"")),
            _ => failures.push(format!("Unregistered user \"{member}\"")),
        }
        results.push(result);
    }
    let response = json!({ "timestamp": timestamp, "results": results });
    if delivered.is_empty() && !members.is_empty() {
        let has = |t: &str| results.iter().any(|r| r["type"] == t);
        let code = if has("RATE_LIMIT_FAILURE") {
            -5
        } else if has("IDENTITY_FAILURE") {
            -4
        } else if has("NETWORK_FAILURE") {
            -3
        } else {
            USER_ERROR
        };
        return Call::Done(Err(RpcError {
            code,
            message: failures.join("\n"),
            data: Some(json!({ "response": response })),
        }));
    }
    let (body, long_text) = inline_body(&message);
    state.landed.push(Landed {
        account,
        timestamp,
        recipient: group_id.is_none().then(|| recipients[0].clone()),
        group_id,
        body,
        long_text,
        quote,
        edit_of,
        mentions,
        delivered_to: delivered,
    });
    if fault == Some(FaultKind::LoseAnswer) {
        state.dropped_answers += 1;
        return Call::Drop;
    }
    Call::Done(Ok(response))
}
