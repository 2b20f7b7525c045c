"""Drives the Slack simulator with the official Python SDK (slack_sdk), written against the real
Web API, and checks the simulator's event signatures with the SDK's SignatureVerifier.

Environment: SIM_API_URL, SIM_TOKEN, SIM_SIGNING_SECRET, SIM_CHANNEL (the bot is a member),
SIM_DM (a direct message), SIM_PERSON_TS (a person's message in SIM_CHANNEL), SIM_DELIVERIES
(a JSON file: [{"body", "timestamp", "signature"}] the simulator posted).
Every check is an assertion; the last line printed is "checks passed".
"""

import json
import os
import re

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.models.metadata import Metadata
from slack_sdk.signature import SignatureVerifier

api_url = os.environ["SIM_API_URL"]
client = WebClient(token=os.environ["SIM_TOKEN"], base_url=api_url)
channel = os.environ["SIM_CHANNEL"]
dm = os.environ["SIM_DM"]


def error_of(call):
    try:
        call()
    except SlackApiError as e:
        return e.response.status_code, e.response["error"], e.response.headers
    raise AssertionError("the call succeeded")


# auth.test names the bot and its workspace.
auth = client.auth_test()
assert auth["ok"] and auth["user_id"].startswith("U") and auth["team_id"].startswith("T"), auth.data
assert error_of(lambda: WebClient(token="xoxb-wrong", base_url=api_url).auth_test())[1] == "invalid_auth"

# chat.postMessage (JSON body) with metadata; ts format; history GET (query string) returns
# the metadata only with include_all_metadata.
meta = Metadata(event_type="clawgate_check", event_payload={"key": "py-1"})
posted = client.chat_postMessage(channel=channel, text="from slack_sdk", metadata=meta)
ts = posted["ts"]
assert re.fullmatch(r"\d{10}\.\d{6}", ts), ts
assert posted["channel"] == channel and posted["message"]["text"] == "from slack_sdk"
second = client.chat_postMessage(channel=channel, text="second", thread_ts=ts)
assert second["ts"] > ts and second["message"]["thread_ts"] == ts
history = client.conversations_history(channel=channel, include_all_metadata=True, limit=10)
top = [m for m in history["messages"] if m["ts"] == ts][0]
assert top["metadata"] == {"event_type": "clawgate_check", "event_payload": {"key": "py-1"}}, top
assert top["reply_count"] == 1, top
plain = client.conversations_history(channel=channel, limit=10)
assert all("metadata" not in m for m in plain["messages"]), plain["messages"]
assert all(m["ts"] != second["ts"] for m in plain["messages"]), "replies stay in their thread"
replies = client.conversations_replies(channel=channel, ts=ts, include_all_metadata=True)
assert [m["ts"] for m in replies["messages"]] == [ts, second["ts"]]
# Paging with the SDK's cursor.
page = client.conversations_history(channel=channel, limit=1)
assert page["has_more"] and page["response_metadata"]["next_cursor"]
rest = client.conversations_history(channel=channel, limit=1, cursor=page["response_metadata"]["next_cursor"])
assert rest["messages"][0]["ts"] != page["messages"][0]["ts"]

# chat.update and its errors; chat.delete.
updated = client.chat_update(channel=channel, ts=ts, text="edited by slack_sdk")
assert updated["text"] == "edited by slack_sdk"
assert error_of(lambda: client.chat_update(channel=channel, ts="1.000000", text="x"))[1] == "message_not_found"
assert error_of(lambda: client.chat_update(channel=channel, ts=ts, text="x" * 4001))[1] == "msg_too_long"
person_ts = os.environ["SIM_PERSON_TS"]
assert error_of(lambda: client.chat_update(channel=channel, ts=person_ts, text="x"))[1] == "cant_update_message"
assert error_of(lambda: client.chat_postMessage(channel="C0NOPE", text="x"))[1] == "channel_not_found"
assert error_of(lambda: client.chat_postMessage(channel=channel, text="a", markdown_text="b"))[1] == "markdown_text_conflict"
assert client.chat_delete(channel=channel, ts=second["ts"])["ts"] == second["ts"]
assert error_of(lambda: client.chat_delete(channel=channel, ts=second["ts"]))[1] == "message_not_found"

# Native streaming in a DM thread: start, append, stop; appends after the stop are refused.
parent = client.chat_postMessage(channel=dm, text="question")["ts"]
stream = client.chat_startStream(channel=dm, thread_ts=parent, markdown_text="Hel")
assert error_of(lambda: client.chat_update(channel=dm, ts=stream["ts"], text="x"))[1] == "streaming_state_conflict"
client.chat_appendStream(channel=dm, ts=stream["ts"], markdown_text="lo")
stopped = client.chat_stopStream(channel=dm, ts=stream["ts"], markdown_text="!")
assert stopped["message"]["text"] == "Hello!", stopped.data
status, code, _ = error_of(lambda: client.chat_appendStream(channel=dm, ts=stream["ts"], markdown_text="x"))
assert code == "message_not_in_streaming_state", code

# The per-channel posting limit: 429, Retry-After, ratelimited (the SDK's default handlers do
# not retry it).
limited = None
for n in range(6):
    try:
        client.chat_postMessage(channel=dm, text=f"burst {n}")
    except SlackApiError as e:
        limited = e.response
        break
assert limited is not None, "the burst was never limited"
assert limited.status_code == 429 and limited["error"] == "ratelimited", limited
assert int(limited.headers["Retry-After"][0] if isinstance(limited.headers["Retry-After"], list) else limited.headers["Retry-After"]) >= 1

# Event signatures, verified by the SDK.
verifier = SignatureVerifier(os.environ["SIM_SIGNING_SECRET"])
with open(os.environ["SIM_DELIVERIES"]) as f:
    deliveries = json.load(f)
assert deliveries, "no deliveries to verify"
for d in deliveries:
    assert verifier.is_valid(d["body"], d["timestamp"], d["signature"]), d
    assert not verifier.is_valid(d["body"] + " ", d["timestamp"], d["signature"])
    assert not verifier.is_valid(d["body"], str(int(d["timestamp"]) - 301), d["signature"])
    envelope = json.loads(d["body"])
    assert envelope["type"] == "event_callback" and envelope["event_id"].startswith("Ev")

print("checks passed")
