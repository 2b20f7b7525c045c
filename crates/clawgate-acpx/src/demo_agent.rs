//! The bundled deterministic ACP agent, for tests and offline demos (JSON-RPC 2.0, newline-delimited,
//! over stdio; ACP protocol v1 subset).
//!
//! * `initialize` → protocol 1, advertises `sessionCapabilities.close`;
//! * `session/new` → `sess-<pid>-N` (unique across processes, so a session id never names
//!   another conversation's session on a process that serves several in turn);
//! * `session/prompt` → the reply `echo: <prompt text>` streamed word by word as
//!   `agent_message_chunk` updates, `--chunk-ms` (default 40) apart; a `session/cancel`
//!   between chunks ends the turn with stopReason `cancelled`, otherwise `end_turn`;
//! * `session/load` (advertised as `loadSession`, unless `--no-load-session`) → replays the
//!   session's earlier replies as `agent_message_chunk` updates, then answers `{}`; an unknown
//!   session is error -32002. With `--sessions-dir DIR` each session's replies are kept in
//!   `DIR/<session id>.json`, so a later process loads a session an earlier one began; each
//!   load is reported on stderr;
//! * `session/close` → `{}`, and the session is forgotten (only `DIR` keeps it); each close is
//!   reported on stderr; stdin EOF → exit 0.
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
    sessions_dir: Option<std::path::PathBuf>,
    load_session: bool,
    close_session: bool,
    /// `session/new` beyond this many in one process is refused (error -32603).
    sessions_per_process: Option<u32>,
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
  --sessions-dir DIR
                  keep each session's replies in DIR, so that a later process resumes it
                  with session/load (after the gateway closed an idle session, or restarted)
  --no-load-session
                  do not advertise loadSession: every process begins fresh sessions
  --no-session-close
                  do not advertise session/close (the gateway then never hands this
                  process from one conversation to another)
  --sessions-per-process N
                  refuse session/new after N sessions in one process
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
        sessions_dir: None,
        load_session: true,
        close_session: true,
        sessions_per_process: None,
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
            "--sessions-dir" => options.sessions_dir = args.next().map(Into::into),
            "--no-load-session" => options.load_session = false,
            "--no-session-close" => options.close_session = false,
            "--sessions-per-process" => {
                options.sessions_per_process = args.next().and_then(|v| v.parse().ok());
            }
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
                "agentCapabilities": {
                    "loadSession": options.load_session,
                    "sessionCapabilities": if options.close_session { json!({"close": {}}) } else { json!({}) }
                },
                "authMethods": [],
                "agentInfo": {"name": "clawgate-acp-test-agent", "version": "0.1.0"}
            }}),
        ),
        ("session/new", Some(id)) => {
            if options
                .sessions_per_process
                .is_some_and(|most| *sessions >= most)
            {
                send(
                    out,
                    &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": format!("this process serves at most {sessions} sessions")}}),
                );
                return;
            }
            *sessions += 1;
            let session = format!("sess-{}-{sessions}", std::process::id());
            send(
                out,
                &json!({"jsonrpc": "2.0", "id": id, "result": {"sessionId": session}}),
            );
            transcripts.insert(session, Vec::new());
        }
        ("session/load", Some(id)) => {
            let session = session_of(&params).unwrap_or_default();
            if !transcripts.contains_key(&session)
                && let Some(kept) = kept_transcript(options, &session)
            {
                transcripts.insert(session.clone(), kept);
            }
            let Some(replies) = transcripts.get(&session) else {
                send(
                    out,
                    &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32002, "message": format!("session not found: {session}")}}),
                );
                return;
            };
            eprintln!(
                "demo-agent: session/load {session}: {} earlier replies",
                replies.len()
            );
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
            let session = session_of(&params).unwrap_or_default();
            let known = transcripts.remove(&session).is_some();
            eprintln!("demo-agent: session/close {session} (known: {known})");
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
                let replies = transcripts.entry(session.clone()).or_default();
                replies.push(words.join(" "));
                keep_transcript(options, &session, replies);
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

/// Where `session`'s replies are kept under `--sessions-dir` (None without one, or for an id
/// that is not a plain name).
fn transcript_path(options: &Options, session: &str) -> Option<std::path::PathBuf> {
    let dir = options.sessions_dir.as_ref()?;
    let plain = !session.is_empty()
        && session
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    plain.then(|| dir.join(format!("{session}.json")))
}

fn kept_transcript(options: &Options, session: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(transcript_path(options, session)?).ok()?;
    serde_json::from_str(&text).ok()
}

fn keep_transcript(options: &Options, session: &str, replies: &[String]) {
    let Some(path) = transcript_path(options, session) else {
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(error) = std::fs::write(&path, json!(replies).to_string()) {
        eprintln!("demo-agent: cannot keep {}: {error}", path.display());
    }
}
