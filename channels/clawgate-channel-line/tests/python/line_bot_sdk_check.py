"""LINE's official Python SDK (line-bot-sdk v3) against the clawgate LINE simulator.

Drives the Messaging API with linebot.v3.messaging (reply, the reply token's single use, push
with X-Line-Retry-Key and its 409 repeat, LINE's validation error body, a wrong token) and
parses the simulator's webhook deliveries with linebot.v3.WebhookParser (signature check
included). Every check is an assert; the Rust test reads "checks passed" on success.
"""

import json
import os
import uuid

from linebot.v3 import WebhookParser
from linebot.v3.exceptions import InvalidSignatureError
from linebot.v3.messaging import (
    ApiClient,
    ApiException,
    Configuration,
    MessagingApi,
    PushMessageRequest,
    ReplyMessageRequest,
    TextMessage,
)
from linebot.v3.webhooks import MessageEvent, TextMessageContent, UserSource

API = os.environ["SIM_API_URL"]
TOKEN = os.environ["SIM_TOKEN"]
SECRET = os.environ["SIM_SECRET"]
BOT = os.environ["SIM_BOT"]
USER = os.environ["SIM_USER"]
REPLY_TOKEN = os.environ["SIM_REPLY_TOKEN"]
EVENT_ID = os.environ["SIM_EVENT_ID"]
with open(os.environ["SIM_DELIVERIES"], encoding="utf-8") as f:
    DELIVERIES = json.load(f)


def api(token=TOKEN):
    return MessagingApi(ApiClient(Configuration(host=API, access_token=token)))


def error_of(call):
    try:
        call()
    except ApiException as e:
        return e
    raise AssertionError("the call was expected to fail")


line = api()

info = line.get_bot_info()
assert info.user_id == BOT, info

replied = line.reply_message(
    ReplyMessageRequest(reply_token=REPLY_TOKEN, messages=[TextMessage(text="reply from the sdk")])
)
assert len(replied.sent_messages) == 1, replied
assert replied.sent_messages[0].id.isdigit(), replied
assert replied.sent_messages[0].quote_token, replied

again = error_of(
    lambda: line.reply_message(
        ReplyMessageRequest(reply_token=REPLY_TOKEN, messages=[TextMessage(text="twice")])
    )
)
assert again.status == 400, again
assert json.loads(again.body) == {"message": "Invalid reply token"}, again.body
assert again.headers.get("x-line-request-id"), again.headers

key = str(uuid.uuid4())
request = PushMessageRequest(to=USER, messages=[TextMessage(text="push from the sdk")])
first = line.push_message_with_http_info(request, x_line_retry_key=key)
assert first.status_code == 200, first
first_request_id = first.headers["x-line-request-id"]
first_id = first.data.sent_messages[0].id

repeat = error_of(lambda: line.push_message_with_http_info(request, x_line_retry_key=key))
assert repeat.status == 409, repeat
assert repeat.headers["x-line-accepted-request-id"] == first_request_id, repeat.headers
assert repeat.headers["x-line-request-id"] != first_request_id, repeat.headers
body = json.loads(repeat.body)
assert body["message"] == "The retry key is already accepted", body
assert [m["id"] for m in body["sentMessages"]] == [first_id], body

too_long = error_of(
    lambda: line.push_message(
        PushMessageRequest(to=USER, messages=[TextMessage(text="x" * 5001)]),
        x_line_retry_key=str(uuid.uuid4()),
    )
)
assert too_long.status == 400, too_long
details = json.loads(too_long.body)
assert details["message"] == "The request body has 1 error(s)", details
assert details["details"] == [
    {"message": "Length must be between 0 and 5000", "property": "messages[0].text"}
], details

bad_key = error_of(lambda: line.push_message(request, x_line_retry_key="not-a-uuid"))
assert bad_key.status == 400, bad_key

refused = error_of(lambda: api("wrong-token").get_bot_info())
assert refused.status == 401, refused
assert "Authentication failed" in json.loads(refused.body)["message"], refused.body

parser = WebhookParser(SECRET)
seen = []
for delivery in DELIVERIES:
    events = parser.parse(delivery["body"], delivery["signature"])
    assert len(events) == 1, events
    event = events[0]
    assert isinstance(event, MessageEvent), event
    assert isinstance(event.message, TextMessageContent), event.message
    assert isinstance(event.source, UserSource) and event.source.user_id == USER, event.source
    assert event.webhook_event_id == EVENT_ID, event
    assert event.reply_token and event.mode.value == "active", event
    seen.append(event.delivery_context.is_redelivery)
    try:
        parser.parse(delivery["body"].replace("hello", "jello"), delivery["signature"])
        raise AssertionError("a tampered body passed the signature check")
    except InvalidSignatureError:
        pass
assert seen[0] is False and True in seen, seen

print("line-bot-sdk: checks passed")
