//! The HTTP side: the listener (whose connections a fault can cut), parameter decoding (query
//! string, form, JSON, multipart), the Bot API envelope and the call log.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use clawgate_channel_sdk::simulator::{Connection, CuttableListener};
use serde_json::Value;
use tokio::net::TcpListener;

use super::state::{ApiError, Inner, Success};
use super::{CallRecord, FaultKind, SimulatorConfig, control, methods, webhook};

/// Parameters of one call; a later source wins over an earlier one (query, then body).
pub(crate) type Params = HashMap<String, String>;

pub(crate) async fn start(config: SimulatorConfig) -> io::Result<Arc<Inner>> {
    let listener = TcpListener::bind(config.bind).await?;
    let addr = listener.local_addr()?;
    let inner = Arc::new(Inner::new(config, addr));
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(inner.clone());
    let mut shutdown = inner.shutdown_tx.subscribe();
    let server = axum::serve(
        CuttableListener::new(listener),
        app.into_make_service_with_connect_info::<Connection>(),
    )
    .with_graceful_shutdown(async move {
        let _ = shutdown.wait_for(|stopped| *stopped).await;
    });
    let server_task = tokio::spawn(async move {
        // Accept errors are retried inside axum; serve itself only ends on shutdown.
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
    inner.shutdown_tx.send_replace(true);
    inner.updates_changed();
    let tasks: Vec<_> = std::mem::take(
        &mut *inner
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    for task in tasks {
        // Held requests end on the shutdown signal; a client that keeps a connection open
        // must not keep the simulator alive.
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    ConnectInfo(connection): ConnectInfo<Connection>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    if let Some(rest) = path.strip_prefix("/control/") {
        return control::handle(&inner, &method, rest, &body).await;
    }
    let Some((token, name)) = path
        .strip_prefix("/bot")
        .and_then(|rest| rest.split_once('/'))
    else {
        return envelope(Err(ApiError::new(404, "Not Found")));
    };
    let refusal = if token != inner.config.bot_token {
        let description = if super::state::bot_id_of(token) > 0 {
            "Unauthorized"
        } else {
            "Unauthorized: invalid token specified"
        };
        Some(ApiError::new(401, description))
    } else if methods::canonical(name).is_none() {
        Some(ApiError::new(404, "Not Found: method not found"))
    } else {
        None
    };
    if let Some(error) = refusal {
        let method = methods::canonical(name).unwrap_or(name);
        let params = decode_params(uri.query(), &headers, &body).unwrap_or_default();
        record(&inner, method, &params, &Err(error.clone()), true);
        return envelope(Err(error));
    }
    let canonical = methods::canonical(name).expect("checked above");
    let params = match decode_params(uri.query(), &headers, &body) {
        Ok(params) => params,
        Err(error) => {
            record(&inner, canonical, &Params::new(), &Err(error.clone()), true);
            return envelope(Err(error));
        }
    };
    let fault = inner.with_state(|s| s.match_fault(canonical));
    let outcome = match &fault {
        Some(FaultKind::Unreachable) => {
            connection.cut();
            inner.with_state(|s| {
                s.log.push(CallRecord {
                    method: canonical.to_owned(),
                    chat_id: chat_id_param(&params),
                    status: 0,
                    description: None,
                    answered: false,
                    params: params_json(&params),
                })
            });
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        Some(FaultKind::Error {
            status,
            description,
            retry_after,
            migrate_to_chat_id,
        }) => Err(ApiError {
            status: *status,
            description: description.clone(),
            retry_after: *retry_after,
            migrate_to_chat_id: *migrate_to_chat_id,
        }),
        _ => methods::call(&inner, canonical, &params).await,
    };
    let lost = matches!(fault, Some(FaultKind::LoseAnswer));
    record(&inner, canonical, &params, &outcome, !lost);
    match fault {
        Some(FaultKind::LoseAnswer) => {
            connection.cut();
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
        Some(FaultKind::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            envelope(outcome)
        }
        _ => envelope(outcome),
    }
}

fn record(
    inner: &Inner,
    method: &str,
    params: &Params,
    outcome: &Result<Success, ApiError>,
    answered: bool,
) {
    let (status, description) = match outcome {
        Ok(_) => (200, None),
        Err(error) => (error.status, Some(error.description.clone())),
    };
    inner.with_state(|s| {
        s.log.push(CallRecord {
            method: method.to_owned(),
            chat_id: chat_id_param(params),
            status,
            description,
            answered,
            params: params_json(params),
        })
    });
}

fn chat_id_param(params: &Params) -> Option<i64> {
    params.get("chat_id").and_then(|id| id.trim().parse().ok())
}

fn params_json(params: &Params) -> serde_json::Map<String, Value> {
    params
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect()
}

/// The Bot API envelope: `{"ok":true,"result":…}` or `{"ok":false,"error_code":…,
/// "description":…,"parameters":…}` in the server's key order, with HTTP status = error_code.
pub(crate) fn envelope(outcome: Result<Success, ApiError>) -> Response {
    match outcome {
        Ok(Success {
            result,
            description,
        }) => {
            let body = match description {
                None => format!("{{\"ok\":true,\"result\":{result}}}"),
                Some(text) => format!(
                    "{{\"ok\":true,\"result\":{result},\"description\":{}}}",
                    Value::String(text.to_owned())
                ),
            };
            json_response(StatusCode::OK, body, None)
        }
        Err(error) => {
            let mut body = format!(
                "{{\"ok\":false,\"error_code\":{},\"description\":{}",
                error.status,
                Value::String(error.description.clone())
            );
            let mut parameters = Vec::new();
            if let Some(chat_id) = error.migrate_to_chat_id {
                parameters.push(format!("\"migrate_to_chat_id\":{chat_id}"));
            }
            if let Some(secs) = error.retry_after {
                parameters.push(format!("\"retry_after\":{secs}"));
            }
            if !parameters.is_empty() {
                body.push_str(&format!(",\"parameters\":{{{}}}", parameters.join(",")));
            }
            body.push('}');
            let status =
                StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(status, body, error.retry_after)
        }
    }
}

fn json_response(status: StatusCode, body: String, retry_after: Option<u64>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = retry_after
        && let Ok(value) = HeaderValue::from_str(&secs.to_string())
    {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// Query string first, then the body as form, JSON or multipart (by Content-Type).
fn decode_params(
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Params, ApiError> {
    let mut params = Params::new();
    if let Some(query) = query {
        params.extend(decode_form(query));
    }
    if body.is_empty() {
        return Ok(params);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "application/json" => {
            let value: Value = serde_json::from_slice(body)
                .map_err(|_| ApiError::bad_request("can't parse JSON request body"))?;
            let Value::Object(object) = value else {
                return Err(ApiError::bad_request("JSON request body must be an object"));
            };
            for (key, value) in object {
                let text = match value {
                    Value::String(text) => text,
                    Value::Null => continue,
                    other => other.to_string(),
                };
                params.insert(key, text);
            }
        }
        "multipart/form-data" => {
            let boundary = content_type
                .split(';')
                .filter_map(|part| part.trim().strip_prefix("boundary="))
                .next()
                .map(|b| b.trim_matches('"').to_owned())
                .ok_or_else(|| ApiError::bad_request("multipart body without a boundary"))?;
            params.extend(decode_multipart(body, &boundary)?);
        }
        _ => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("request body is not UTF-8"))?;
            params.extend(decode_form(text));
        }
    }
    Ok(params)
}

pub(crate) fn decode_form(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
                match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                    (Some(high), Some(low)) => {
                        out.push((high * 16 + low) as u8);
                        i += 3;
                    }
                    _ => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Text fields of a multipart body; a file part is refused (uploads go by URL here).
fn decode_multipart(body: &[u8], boundary: &str) -> Result<Vec<(String, String)>, ApiError> {
    let delimiter = format!("--{boundary}");
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    for part in text.split(delimiter.as_str()).skip(1) {
        if part.starts_with("--") {
            break;
        }
        let part = part.strip_prefix("\r\n").unwrap_or(part);
        let Some((head, value)) = part.split_once("\r\n\r\n") else {
            continue;
        };
        let value = value.strip_suffix("\r\n").unwrap_or(value);
        let disposition = head
            .lines()
            .find(|line| {
                line.to_ascii_lowercase()
                    .starts_with("content-disposition:")
            })
            .unwrap_or("");
        let field = |key: &str| {
            disposition.split(';').find_map(|piece| {
                piece
                    .trim()
                    .strip_prefix(key)
                    .and_then(|rest| rest.strip_prefix('='))
                    .map(|v| v.trim_matches('"').to_owned())
            })
        };
        let Some(name) = field("name") else { continue };
        if field("filename").is_some() {
            return Err(ApiError::bad_request(format!(
                "file uploads are not supported by this server: pass {name} as an HTTP URL or a file_id"
            )));
        }
        out.push((name, value.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_and_percent_decoding() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("a=1&b=x+y", &[("a", "1"), ("b", "x y")]),
            ("t=%3Cb%3E%F0%9F%98%80", &[("t", "<b>😀")]),
            ("bad=%zz&end=%4", &[("bad", "%zz"), ("end", "%4")]),
        ];
        for (input, expected) in cases {
            let got = decode_form(input);
            let expected: Vec<(String, String)> = expected
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(got, expected, "{input}");
        }
    }

    #[test]
    fn multipart_text_fields_and_refused_files() {
        let body = "--XX\r\nContent-Disposition: form-data; name=\"chat_id\"\r\n\r\n42\r\n--XX\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nhi\r\nthere\r\n--XX--\r\n";
        let fields = decode_multipart(body.as_bytes(), "XX").expect("text fields");
        assert_eq!(
            fields,
            [
                ("chat_id".to_owned(), "42".to_owned()),
                ("text".to_owned(), "hi\r\nthere".to_owned())
            ]
        );
        let file = "--XX\r\nContent-Disposition: form-data; name=\"photo\"; filename=\"a.png\"\r\n\r\nPNG\r\n--XX--\r\n";
        let error = decode_multipart(file.as_bytes(), "XX").expect_err("file refused");
        assert_eq!(error.status, 400);
        assert!(error.description.contains("pass photo as an HTTP URL"));
    }
}
