#!/usr/bin/env python3
"""A fake ACP agent for the gateway's tests: the shapes real agents take at the edge.

JSON-RPC 2.0, newline-delimited, over stdin/stdout (ACP protocol v1). Written apart from the
gateway's own demo agent on purpose: it answers as real agents were seen to, not as our code
expects.

  --fail-new-session   session/new fails (-32603), as codex-acp without credentials does
  --auth-required      session/prompt fails with -32000 "Authentication required" (claude-code-acp
                       without a key); initialize advertises the auth method "fake-login"
  --hang-on WORD       a prompt whose text holds WORD never answers until session/cancel (then
                       stopReason "cancelled"); other prompts answer at once
  --ignore-cancel      with --hang-on: session/cancel is ignored too (a hung agent)
  --print-env          a prompt is answered with the names of its environment variables
  --grandchild         starts `sleep 600` (which never reads stdin, so stdin EOF does not end
                       it) in the agent's process group before answering initialize
  --events FILE        appends one line per request or notification received ("method") to FILE

Every other prompt is answered "echo: <text> [session <id>]".
"""
import json
import os
import subprocess
import sys
import threading

args = sys.argv[1:]
events_file = None
if "--events" in args:
    events_file = args[args.index("--events") + 1]
hang_on = None
if "--hang-on" in args:
    hang_on = args[args.index("--hang-on") + 1]

lock = threading.Lock()
sessions = 0
prompts = 0
hanging = {}  # request id -> session id of the prompt that waits for a cancel


def log_event(name):
    if events_file:
        with open(events_file, "a") as f:
            f.write(name + "\n")


def send(message):
    with lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def answer(request_id, result):
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def refuse(request_id, code, message):
    send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


def chunk(session_id, text):
    send({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session_id,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            },
        },
    })


for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    message = json.loads(line)
    method = message.get("method")
    request_id = message.get("id")
    params = message.get("params") or {}
    if method is None:
        continue  # an answer to a request of ours: none are sent
    log_event(method)
    if method == "initialize":
        if "--grandchild" in args:
            subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
        auth = [{"id": "fake-login", "name": "Log in with the fake provider"}]
        answer(request_id, {
            "protocolVersion": 1,
            "agentCapabilities": {"loadSession": False},
            "authMethods": auth if "--auth-required" in args else [],
        })
    elif method == "session/new":
        if "--fail-new-session" in args:
            refuse(request_id, -32603, "Internal error: could not start a session (no model)")
            continue
        sessions += 1
        answer(request_id, {"sessionId": f"fake-{os.getpid()}-{sessions}"})
    elif method == "session/prompt":
        session_id = params.get("sessionId")
        text = "".join(
            block.get("text", "") for block in params.get("prompt", []) if block.get("type") == "text"
        )
        prompts += 1
        if "--auth-required" in args:
            refuse(request_id, -32000, "Authentication required")
        elif hang_on is not None and hang_on in text:
            hanging[request_id] = session_id
        elif "--print-env" in args:
            chunk(session_id, "env: " + " ".join(sorted(os.environ)))
            answer(request_id, {"stopReason": "end_turn"})
        else:
            chunk(session_id, f"echo: {text} [session {session_id}]")
            answer(request_id, {"stopReason": "end_turn"})
    elif method == "session/cancel":
        if "--ignore-cancel" in args:
            continue
        for waiting, session_id in list(hanging.items()):
            if session_id == params.get("sessionId"):
                chunk(session_id, "partial work")
                answer(waiting, {"stopReason": "cancelled"})
                del hanging[waiting]
    elif request_id is not None:
        refuse(request_id, -32601, f"Method not found: {method}")
