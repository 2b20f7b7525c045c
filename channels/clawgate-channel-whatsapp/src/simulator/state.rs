//! The platform's state: people and their windows, sent and received messages, faults, the
//! call record and the webhook queue; and the `messages` endpoint acting on it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::{
    CallRecord, DeliveryRecord, Fault, FaultKind, GraphFault, SimInbound, SimMessage,
    SimulatorConfig,
};

/// Longest text body.
const MAX_BODY: usize = 4_096;
/// Longest `biz_opaque_callback_data`.
const MAX_CALLBACK_DATA: usize = 512;

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    pub(crate) wake: Notify,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        Inner {
            world: Mutex::new(World::new(config.clone())),
            config,
            addr,
            wake: Notify::new(),
            shutdown: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One queued webhook delivery.
#[derive(Debug, Clone)]
pub(crate) struct QueuedDelivery {
    pub(crate) id: usize,
    pub(crate) body: Value,
    /// The exact bytes posted (and signed), the same on every attempt.
    pub(crate) bytes: String,
    pub(crate) attempts: Vec<u16>,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    pub(crate) first_due: Instant,
    pub(crate) next_at: Instant,
}

impl QueuedDelivery {
    pub(crate) fn record(&self) -> DeliveryRecord {
        DeliveryRecord {
            id: self.id,
            body: self.body.clone(),
            attempts: self.attempts.clone(),
            acked: self.acked,
            given_up: self.given_up,
        }
    }
}

pub(crate) struct World {
    config: SimulatorConfig,
    pub(crate) webhook_url: Option<String>,
    /// When each person last wrote (their window's start).
    pub(crate) windows: HashMap<String, Instant>,
    names: HashMap<String, String>,
    pub(crate) token_revoked: bool,
    pub(crate) faults: Vec<Fault>,
    pub(crate) sent: Vec<SimMessage>,
    pub(crate) inbound: Vec<SimInbound>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<QueuedDelivery>,
    /// Webhook attempts whose answer is to be lost.
    pub(crate) cut_deliveries: u32,
    next_id: u64,
}

/// The person's business-scoped user id (`<country>.<digits>`), which Meta adds beside the
/// `wa_id` in `contacts` (messages and statuses alike).
fn bsuid(wa_id: &str) -> String {
    let mut hash: u64 = 14_695_981_039_346_656_037;
    for byte in wa_id.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(1_099_511_628_211);
    }
    format!("DE.{hash}")
}

fn now_s() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        .to_string()
}

/// Graph's error envelope.
pub(crate) fn envelope(fault: &GraphFault, trace: u64) -> Value {
    let mut error = json!({
        "message": fault.message,
        "type": "OAuthException",
        "code": fault.code,
        "fbtrace_id": format!("AsIm{trace:08X}"),
    });
    if let Some(subcode) = fault.subcode {
        error["error_subcode"] = json!(subcode);
    }
    if let Some(details) = &fault.details {
        error["error_data"] = json!({ "messaging_product": "whatsapp", "details": details });
    }
    json!({ "error": error })
}

fn bad_parameter(details: impl Into<String>) -> GraphFault {
    GraphFault {
        details: Some(details.into()),
        ..GraphFault::code(100)
    }
}

/// What a send did besides answering: the status webhooks to queue.
pub(crate) enum Outcome {
    Answer(Value),
    Refused(GraphFault),
    /// Accepted, answer dropped.
    Lost,
    /// Not Graph talking.
    ServerError(u16),
}

impl World {
    fn new(config: SimulatorConfig) -> World {
        World {
            config,
            webhook_url: None,
            windows: HashMap::new(),
            names: HashMap::new(),
            token_revoked: false,
            faults: Vec::new(),
            sent: Vec::new(),
            inbound: Vec::new(),
            calls: Vec::new(),
            deliveries: Vec::new(),
            cut_deliveries: 0,
            next_id: 0,
        }
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A `wamid.` id: base64-looking, unique, like Meta's `wamid.HBgL…`.
    fn wamid(&mut self, wa_id: &str) -> String {
        let n = self.next();
        let digits: String = wa_id.chars().filter(char::is_ascii_digit).collect();
        format!("wamid.HBgL{digits}FQIAERgS{n:016X}AA==")
    }

    fn metadata(&self) -> Value {
        json!({
            "display_phone_number": self.config.display_phone_number,
            "phone_number_id": self.config.phone_number_id,
        })
    }

    fn notification(&self, value: Value) -> Value {
        json!({
            "object": "whatsapp_business_account",
            "entry": [{ "id": self.config.waba_id, "changes": [{ "value": value, "field": "messages" }] }],
        })
    }

    pub(crate) fn enqueue(&mut self, body: Value) -> usize {
        let id = self.deliveries.len();
        let now = Instant::now();
        self.deliveries.push(QueuedDelivery {
            id,
            bytes: body.to_string(),
            body,
            attempts: Vec::new(),
            acked: false,
            given_up: false,
            in_flight: false,
            first_due: now,
            next_at: now,
        });
        id
    }

    fn person_message(&mut self, wa_id: &str, text: &str, context: Option<&str>) -> Value {
        let wamid = self.wamid(wa_id);
        self.windows.insert(wa_id.to_owned(), Instant::now());
        self.inbound.push(SimInbound {
            wamid: wamid.clone(),
            from: wa_id.to_owned(),
            text: text.to_owned(),
            read: false,
        });
        let mut message = json!({
            "from": wa_id,
            "id": wamid,
            "timestamp": now_s(),
            "text": { "body": text },
            "type": "text",
        });
        if let Some(context) = context {
            message["context"] = json!({
                "from": self.config.display_phone_number,
                "id": context,
            });
        }
        message
    }

    fn contacts(&mut self, wa_id: &str, name: &str) -> Value {
        self.names.insert(wa_id.to_owned(), name.to_owned());
        json!([{ "profile": { "name": name }, "wa_id": wa_id, "user_id": bsuid(wa_id) }])
    }

    pub(crate) fn person_writes(
        &mut self,
        wa_id: &str,
        name: &str,
        text: &str,
        context: Option<&str>,
    ) -> String {
        let message = self.person_message(wa_id, text, context);
        let wamid = message["id"].as_str().unwrap_or_default().to_owned();
        let value = json!({
            "messaging_product": "whatsapp",
            "metadata": self.metadata(),
            "contacts": self.contacts(wa_id, name),
            "messages": [message],
        });
        let body = self.notification(value);
        self.enqueue(body);
        wamid
    }

    pub(crate) fn person_writes_batch(
        &mut self,
        wa_id: &str,
        name: &str,
        texts: &[&str],
    ) -> Vec<String> {
        let messages: Vec<Value> = texts
            .iter()
            .map(|text| self.person_message(wa_id, text, None))
            .collect();
        let wamids = messages
            .iter()
            .map(|m| m["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        let value = json!({
            "messaging_product": "whatsapp",
            "metadata": self.metadata(),
            "contacts": self.contacts(wa_id, name),
            "messages": messages,
        });
        let body = self.notification(value);
        self.enqueue(body);
        wamids
    }

    fn status(&mut self, index: usize, status: &str, error: Option<&GraphFault>) {
        let message = &mut self.sent[index];
        // A read message stays read; a failed one stays failed.
        if !(message.status == "read" || message.status == "failed") || status == "failed" {
            message.status = status.to_owned();
        }
        let message = message.clone();
        let mut entry = json!({
            "id": message.wamid,
            "status": status,
            "timestamp": now_s(),
            "recipient_id": message.to,
        });
        if status != "failed" {
            entry["conversation"] = json!({
                "id": format!("CONVERSATION_{}", message.to),
                "origin": { "type": "service" },
            });
            entry["pricing"] =
                json!({ "billable": true, "pricing_model": "CBP", "category": "service" });
        }
        if let Some(error) = error {
            entry["errors"] = json!([{
                "code": error.code,
                "title": error.message.split_once(") ").map_or(error.message.as_str(), |(_, t)| t),
                "message": error.message.split_once(") ").map_or(error.message.as_str(), |(_, t)| t),
                "error_data": { "details": error.details.clone().unwrap_or_default() },
                "href": "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/",
            }]);
        }
        if let Some(data) = &message.callback_data {
            entry["biz_opaque_callback_data"] = json!(data);
        }
        let value = json!({
            "messaging_product": "whatsapp",
            "metadata": self.metadata(),
            "contacts": [{ "wa_id": message.to, "user_id": bsuid(&message.to) }],
            "statuses": [entry],
        });
        let body = self.notification(value);
        self.enqueue(body);
    }

    pub(crate) fn person_reads(&mut self, wamid: &str) -> bool {
        let Some(index) = self.sent.iter().position(|m| m.wamid == wamid) else {
            return false;
        };
        self.status(index, "read", None);
        true
    }

    /// `Err` when the bearer token is missing, wrong or revoked.
    pub(crate) fn authorize(&self, bearer: Option<&str>) -> Result<(), GraphFault> {
        match bearer {
            _ if self.token_revoked => Err(GraphFault::code(190)),
            Some(token) if token == self.config.token => Ok(()),
            Some(_) => Err(GraphFault {
                status: 401,
                code: 190,
                subcode: None,
                message: "Invalid OAuth access token - Cannot parse access token".into(),
                details: None,
            }),
            None => Err(GraphFault {
                status: 401,
                code: 190,
                subcode: None,
                message: "An active access token must be used to query information about the \
                          current user."
                    .into(),
                details: None,
            }),
        }
    }

    pub(crate) fn unknown_object(&self, id: &str) -> GraphFault {
        GraphFault {
            status: 400,
            code: 100,
            subcode: Some(33),
            message: format!(
                "Unsupported post request. Object with ID '{id}' does not exist, cannot be \
                 loaded due to missing permissions, or does not support this operation."
            ),
            details: None,
        }
    }

    pub(crate) fn number(&self) -> Value {
        json!({
            "verified_name": "Clawgate Simulated Business",
            "display_phone_number": format!("+{}", self.config.display_phone_number),
            "id": self.config.phone_number_id,
            "quality_rating": "GREEN",
        })
    }

    /// The first queued fault for a send to `to`, if one is due.
    fn take_fault(&mut self, to: &str) -> Option<FaultKind> {
        let index = self
            .faults
            .iter()
            .position(|f| f.to.as_deref().is_none_or(|t| t == to))?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times -= 1;
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(kind)
    }

    /// `POST /<phone-number-id>/messages`.
    pub(crate) fn messages(&mut self, body: &Value) -> Outcome {
        if body.get("messaging_product").and_then(Value::as_str) != Some("whatsapp") {
            return Outcome::Refused(bad_parameter(
                "The parameter messaging_product is required and must be \"whatsapp\".",
            ));
        }
        if body.get("status").is_some() {
            return self.mark_read(body);
        }
        let to: String = body
            .get("to")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let fault = self.take_fault(&to);
        match &fault {
            Some(FaultKind::Refuse(fault)) => return Outcome::Refused(fault.clone()),
            Some(FaultKind::ServerError(status)) => return Outcome::ServerError(*status),
            _ => {}
        }
        let message = match self.validate(body) {
            Ok(message) => message,
            Err(fault) => return Outcome::Refused(fault),
        };
        let in_window = self
            .windows
            .get(&message.to)
            .is_some_and(|at| at.elapsed() < self.config.window);
        let outside = !in_window && message.kind != "template";
        if outside && self.config.window_refused_synchronously {
            return Outcome::Refused(GraphFault::code(131_047));
        }
        let to = message.to.clone();
        let wamid = self.wamid(&to);
        let mut message = message;
        message.wamid = wamid.clone();
        self.sent.push(message);
        let index = self.sent.len() - 1;
        let async_failure = match fault {
            Some(FaultKind::FailAsync(code)) => Some(GraphFault::code(code)),
            _ if outside => Some(GraphFault::code(131_047)),
            _ => None,
        };
        match async_failure {
            Some(failure) => self.status(index, "failed", Some(&failure)),
            None => {
                self.status(index, "sent", None);
                if self.config.auto_delivered {
                    self.status(index, "delivered", None);
                }
            }
        }
        if fault == Some(FaultKind::LoseAnswer) {
            return Outcome::Lost;
        }
        Outcome::Answer(json!({
            "messaging_product": "whatsapp",
            "contacts": [{ "input": body["to"], "wa_id": to }],
            "messages": [{ "id": wamid }],
        }))
    }

    fn mark_read(&mut self, body: &Value) -> Outcome {
        if body.get("status").and_then(Value::as_str) != Some("read") {
            return Outcome::Refused(bad_parameter("status must be \"read\"."));
        }
        let Some(id) = body.get("message_id").and_then(Value::as_str) else {
            return Outcome::Refused(bad_parameter("The parameter message_id is required."));
        };
        let Some(at) = self.inbound.iter().position(|m| m.wamid == id) else {
            return Outcome::Refused(bad_parameter(format!(
                "message_id {id} is not a message this number received."
            )));
        };
        // Marking one message read marks the earlier ones of the thread too.
        let from = self.inbound[at].from.clone();
        for message in self.inbound[..=at].iter_mut().filter(|m| m.from == from) {
            message.read = true;
        }
        Outcome::Answer(json!({ "success": true }))
    }

    /// The message a valid send body describes (its `wamid` not yet given).
    fn validate(&self, body: &Value) -> Result<SimMessage, GraphFault> {
        let to = body
            .get("to")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_parameter("The parameter to is required."))?;
        let wa_id: String = to.chars().filter(char::is_ascii_digit).collect();
        if wa_id.len() < 7 {
            return Err(bad_parameter(format!("to {to:?} is not a phone number.")));
        }
        match body.get("recipient_type").and_then(Value::as_str) {
            None | Some("individual") => {}
            Some(other) => {
                return Err(bad_parameter(format!(
                    "recipient_type {other:?} is not supported."
                )));
            }
        }
        let callback_data = match body.get("biz_opaque_callback_data") {
            None => None,
            Some(Value::String(data)) if data.chars().count() <= MAX_CALLBACK_DATA => {
                Some(data.clone())
            }
            Some(_) => {
                return Err(bad_parameter(format!(
                    "Param biz_opaque_callback_data must be a string of at most \
                     {MAX_CALLBACK_DATA} characters."
                )));
            }
        };
        let context = match body.get("context") {
            None => None,
            Some(context) => Some(
                context
                    .get("message_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        bad_parameter("The parameter context['message_id'] is required.")
                    })?
                    .to_owned(),
            ),
        };
        let kind = body.get("type").and_then(Value::as_str).unwrap_or("text");
        let (text, link, preview_url) = match kind {
            "text" => {
                let text = body
                    .get("text")
                    .ok_or_else(|| bad_parameter("The parameter text is required."))?;
                let text_body = text
                    .get("body")
                    .and_then(Value::as_str)
                    .filter(|b| !b.trim().is_empty())
                    .ok_or_else(|| bad_parameter("The parameter text['body'] is required."))?;
                if text_body.chars().count() > MAX_BODY {
                    return Err(bad_parameter(format!(
                        "Param text['body'] must be at most {MAX_BODY} characters long."
                    )));
                }
                let preview_url = match text.get("preview_url") {
                    None => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        return Err(bad_parameter(
                            "Param text['preview_url'] must be a boolean.",
                        ));
                    }
                };
                (Some(text_body.to_owned()), None, preview_url)
            }
            "image" | "document" | "audio" | "video" => {
                let media = body
                    .get(kind)
                    .ok_or_else(|| bad_parameter(format!("The parameter {kind} is required.")))?;
                let link = media
                    .get("link")
                    .and_then(Value::as_str)
                    .filter(|l| l.starts_with("http://") || l.starts_with("https://"))
                    .ok_or_else(|| {
                        bad_parameter(format!(
                            "The parameter {kind}['link'] is required (an http(s) URL)."
                        ))
                    })?;
                let caption = media.get("caption").and_then(Value::as_str);
                (caption.map(str::to_owned), Some(link.to_owned()), false)
            }
            "template" => {
                let name = body
                    .pointer("/template/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                return Err(GraphFault {
                    status: 404,
                    code: 132_001,
                    subcode: None,
                    message: "(#132001) Template name does not exist in the translation".into(),
                    details: Some(format!("template name ({name}) does not exist")),
                });
            }
            other => {
                return Err(GraphFault {
                    status: 400,
                    code: 131_051,
                    subcode: None,
                    message: "(#131051) Unsupported message type".into(),
                    details: Some(format!("type {other:?} is not supported.")),
                });
            }
        };
        Ok(SimMessage {
            wamid: String::new(),
            to: wa_id,
            kind: kind.to_owned(),
            text,
            link,
            preview_url,
            context,
            callback_data,
            status: "accepted".into(),
        })
    }
}
