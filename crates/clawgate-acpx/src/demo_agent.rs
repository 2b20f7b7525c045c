//! The bundled deterministic ACP agent, for tests and offline demos (JSON-RPC 2.0, newline-delimited,
//! over stdio; ACP protocol v1 subset).
//!
//! * `initialize` → protocol 1, advertises `sessionCapabilities.close`;
//! * `session/new` → `sess-N`;
//! * `session/prompt` → the reply `echo: <prompt text>` streamed word by word as
//!   `agent_message_chunk` updates, `--chunk-ms` (default 40) apart; a `session/cancel`
//!   between chunks ends the turn with stopReason `cancelled`, otherwise `end_turn`;
//! * `session/load` (advertised as `loadSession`) → replays the session's earlier replies as
//!   `agent_message_chunk` updates, then answers `{}`; an unknown session is error -32002;
//! * `session/close` → `{}`; stdin EOF → exit 0.
//!
//! `--words N` pads the reply to at least N words; `--grandchild` starts `sleep 600` (and
//! `--stubborn-grandchild` one that ignores TERM) in the agent's process group, with its pid
//! written to `--grandchild-pid-file PATH`.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

#[derive(Debug)]
struct Options {
    chunk: Duration,
    words: usize,
    grandchild: Option<&'static str>,
    pid_file: Option<String>,
    help: bool,
}

/// What `--help` prints.
pub const HELP: &str = "\
clawgate demo-agent: the bundled deterministic ACP agent (JSON-RPC over stdin/stdout).

It answers every prompt with `echo: <prompt text>`, streamed word by word, so a reply's
preview, edits and final can be watched and checked exactly. Configure it as an agent:
  [[agents]]
  id = \"main\"
  command = [\"clawgate\", \"demo-agent\", \"--chunk-ms\", \"300\", \"--words\", \"20\"]

Options:
  --chunk-ms MS   wait MS milliseconds before each word (default 40); a slow agent (e.g.
                  1500) leaves a wide window between the reply's intent and its text, to try
                  crashes in; 0 sends the whole reply at once
  --words N       pad the reply with w1 w2 … to at least N words (default: no padding), so
                  the reply is `echo: <prompt words> w1 … wK`
  --grandchild, --stubborn-grandchild, --grandchild-pid-file PATH
                  start `sleep 600` in the agent's process group (the stubborn one ignores
                  TERM) and write its pid to PATH: for process-tree tests
  -h, --help      print this and exit
";

fn options(args: impl IntoIterator<Item = String>) -> Options {
    let mut options = Options {
        chunk: Duration::from_millis(40),
        words: 0,
        grandchild: None,
        pid_file: None,
        help: false,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--chunk-ms" => {
                let ms = args.next().and_then(|v| v.parse().ok()).unwrap_or(40);
                options.chunk = Duration::from_millis(ms);
            }
            "--words" => options.words = args.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            "--grandchild" => options.grandchild = Some("exec sleep 600"),
            "--stubborn-grandchild" => options.grandchild = Some("trap '' TERM; exec sleep 600"),
            "--grandchild-pid-file" => options.pid_file = args.next(),
            "-h" | "--help" => options.help = true,
            other => eprintln!("test agent: ignoring unknown argument {other:?}"),
        }
    }
    options
}

fn send(out: &mut impl Write, message: &Value) {
    // A closed stdout means the client is gone; the read loop ends on stdin EOF.
    let _ = writeln!(out, "{message}");
    let _ = out.flush();
}

/// Serves ACP on stdin/stdout until stdin closes; `args` are the options above (without the
/// program name).
pub fn run(args: impl IntoIterator<Item = String>) {
    let options = options(args);
    if options.help {
        print!("{HELP}");
        return;
    }
    if let Some(script) = options.grandchild {
        match std::process::Command::new("sh")
            .args(["-c", script])
            .spawn()
        {
            Ok(child) => {
                if let Some(path) = &options.pid_file {
                    let _ = std::fs::write(path, child.id().to_string());
                }
                // Deliberately never waited for: it must outlive us in the group.
                std::mem::forget(child);
            }
            Err(error) => eprintln!("test agent: cannot start grandchild: {error}"),
        }
    }
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Value>(&line) {
                Ok(message) => {
                    if tx.send(message).is_err() {
                        break;
                    }
                }
                Err(error) => eprintln!("test agent: bad JSON {line:?}: {error}"),
            }
        }
    });
    let mut out = std::io::stdout().lock();
    let mut sessions = 0u32;
    let mut cancelled: HashSet<String> = HashSet::new();
    // Replies per session, replayed by `session/load`.
    let mut transcripts: HashMap<String, Vec<String>> = HashMap::new();
    while let Ok(message) = rx.recv() {
        handle(
            &message,
            &options,
            &rx,
            &mut out,
            &mut sessions,
            &mut cancelled,
            &mut transcripts,
        );
    }
}

fn handle(
    message: &Value,
    options: &Options,
    rx: &mpsc::Receiver<Value>,
    out: &mut impl Write,
    sessions: &mut u32,
    cancelled: &mut HashSet<String>,
    transcripts: &mut HashMap<String, Vec<String>>,
) {
    let id = message.get("id").cloned();
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let params = message.get("params").cloned().unwrap_or(Value::Null);
    let session_of = |p: &Value| {
        p.get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match (method, id) {
        ("initialize", Some(id)) => send(
            out,
            &json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": true, "sessionCapabilities": {"close": {}}},
                "authMethods": [],
                "agentInfo": {"name": "clawgate-acp-test-agent", "version": "0.1.0"}
            }}),
        ),
        ("session/new", Some(id)) => {
            *sessions += 1;
            send(
                out,
                &json!({"jsonrpc": "2.0", "id": id, "result": {"sessionId": format!("sess-{sessions}")}}),
            );
            transcripts.insert(format!("sess-{sessions}"), Vec::new());
        }
        ("session/load", Some(id)) => {
            let session = session_of(&params).unwrap_or_default();
            let Some(replies) = transcripts.get(&session) else {
                send(
                    out,
                    &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32002, "message": format!("session not found: {session}")}}),
                );
                return;
            };
            for reply in replies {
                send(
                    out,
                    &json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                        "sessionId": session,
                        "update": {"sessionUpdate": "agent_message_chunk",
                                   "content": {"type": "text", "text": reply}}
                    }}),
                );
            }
            send(out, &json!({"jsonrpc": "2.0", "id": id, "result": {}}));
        }
        ("session/cancel", None) => {
            if let Some(session) = session_of(&params) {
                cancelled.insert(session);
            }
        }
        ("session/close", Some(id)) => {
            send(out, &json!({"jsonrpc": "2.0", "id": id, "result": {}}))
        }
        ("session/prompt", Some(id)) => {
            let session = session_of(&params).unwrap_or_default();
            cancelled.remove(&session);
            let text: Vec<String> = params
                .get("prompt")
                .and_then(Value::as_array)
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter_map(|b| b.get("text").and_then(Value::as_str))
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let mut words: Vec<String> = std::iter::once("echo:".to_owned())
                .chain(text.join(" ").split_whitespace().map(str::to_owned))
                .collect();
            let mut n = 0;
            while words.len() < options.words {
                n += 1;
                words.push(format!("w{n}"));
            }
            let mut stop = "end_turn";
            for (i, word) in words.iter().enumerate() {
                // Between chunks: take any messages that arrived (a cancel, most likely).
                let deadline = std::time::Instant::now() + options.chunk;
                while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
                    match rx.recv_timeout(left) {
                        Ok(other) => {
                            handle(&other, options, rx, out, sessions, cancelled, transcripts)
                        }
                        Err(_) => break,
                    }
                }
                if cancelled.contains(&session) {
                    stop = "cancelled";
                    break;
                }
                let chunk = if i == 0 {
                    word.clone()
                } else {
                    format!(" {word}")
                };
                send(
                    out,
                    &json!({"jsonrpc": "2.0", "method": "session/update", "params": {
                        "sessionId": session,
                        "update": {"sessionUpdate": "agent_message_chunk",
                                   "content": {"type": "text", "text": chunk}}
                    }}),
                );
            }
            cancelled.remove(&session);
            if stop == "end_turn" {
                transcripts
                    .entry(session.clone())
                    .or_default()
                    .push(words.join(" "));
            }
            send(
                out,
                &json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": stop}}),
            );
        }
        (_, Some(id)) => send(
            out,
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("method not found: {method}")}}),
        ),
        (_, None) => {}
    }
}
