"""Drives the Feishu simulator with Feishu's official Python SDK (lark-oapi) and feeds its event
pushes to the SDK's own EventDispatcherHandler, which decrypts them and checks their signature
and verification token. Run by tests/feishu/lark_oapi.rs; every failed check exits non-zero."""

import json
import os
import sys

import lark_oapi as lark
from lark_oapi.api.auth.v3 import InternalTenantAccessTokenRequest, InternalTenantAccessTokenRequestBody
from lark_oapi.api.cardkit.v1 import (
    Card,
    ContentCardElementRequest,
    ContentCardElementRequestBody,
    CreateCardRequest,
    CreateCardRequestBody,
    SettingsCardRequest,
    SettingsCardRequestBody,
    UpdateCardRequest,
    UpdateCardRequestBody,
)
from lark_oapi.api.im.v1 import (
    CreateMessageRequest,
    CreateMessageRequestBody,
    DeleteMessageRequest,
    ListMessageRequest,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
    UpdateMessageRequest,
    UpdateMessageRequestBody,
)

API = os.environ["SIM_API_URL"]
APP_ID = os.environ["SIM_APP_ID"]
SECRET = os.environ["SIM_APP_SECRET"]
ENCRYPT_KEY = os.environ["SIM_ENCRYPT_KEY"]
TOKEN = os.environ["SIM_VERIFICATION_TOKEN"]
CHAT = os.environ["SIM_CHAT"]
PERSON_MESSAGE = os.environ["SIM_PERSON_MESSAGE"]
EVENT_ID = os.environ["SIM_EVENT_ID"]

failures = []


def check(what, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(what)


def client():
    return (
        lark.Client.builder()
        .app_id(APP_ID)
        .app_secret(SECRET)
        .domain(API)
        .log_level(lark.LogLevel.ERROR)
        .build()
    )


def text(t):
    return json.dumps({"text": t})


def create(c, content, uuid=None):
    body = CreateMessageRequestBody.builder().receive_id(CHAT).msg_type("text").content(content)
    if uuid:
        body = body.uuid(uuid)
    request = CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body.build()).build()
    return c.im.v1.message.create(request)


c = client()

# The test injected one frequency limit on the first message call.
limited = create(c, text("limited"))
check("a frequency limit is code 99991400", limited.code == 99991400, f"{limited.code} {limited.msg}")
reset = limited.raw.headers.get("x-ogw-ratelimit-reset") or limited.raw.headers.get("X-Ogw-Ratelimit-Reset")
check("it names x-ogw-ratelimit-reset", reset == "7", str(limited.raw.headers))

first = create(c, text("hello from lark-oapi"), uuid="sdk-uuid-1")
check("create succeeds", first.success(), f"{first.code} {first.msg}")
again = create(c, text("hello from lark-oapi"), uuid="sdk-uuid-1")
check("a repeated uuid answers the first message", again.success() and again.data.message_id == first.data.message_id,
      f"{again.code} {again.data.message_id if again.data else None} vs {first.data.message_id}")

reply = c.im.v1.message.reply(
    ReplyMessageRequest.builder()
    .message_id(PERSON_MESSAGE)
    .request_body(ReplyMessageRequestBody.builder().msg_type("text").content(text("threaded reply"))
                  .reply_in_thread(True).uuid("sdk-uuid-2").build())
    .build()
)
check("reply_in_thread opens a thread", reply.success() and bool(reply.data.thread_id), f"{reply.code} {reply.msg}")

updated = c.im.v1.message.update(
    UpdateMessageRequest.builder()
    .message_id(first.data.message_id)
    .request_body(UpdateMessageRequestBody.builder().msg_type("text").content(text("edited by lark-oapi")).build())
    .build()
)
check("update succeeds", updated.success(), f"{updated.code} {updated.msg}")

bad = create(c, "not json")
check("a bad content is code 230001 in the body", bad.code == 230001, f"{bad.code} {bad.msg}")

listed = c.im.v1.message.list(
    ListMessageRequest.builder().container_id_type("chat").container_id(CHAT).page_size(1).build()
)
check("history pages", listed.success() and listed.data.has_more and len(listed.data.items) == 1,
      f"{listed.code} {listed.msg}")
texts = []
token = None
while True:
    builder = ListMessageRequest.builder().container_id_type("chat").container_id(CHAT).page_size(2)
    if token:
        builder = builder.page_token(token)
    page = c.im.v1.message.list(builder.build())
    texts += [json.loads(i.body.content).get("text") for i in page.data.items or []]
    if not page.data.has_more:
        break
    token = page.data.page_token
check("history holds the edit, not the threaded reply", "edited by lark-oapi" in texts and "threaded reply" not in texts, str(texts))

card = {"schema": "2.0", "config": {"streaming_mode": True},
        "body": {"elements": [{"tag": "markdown", "content": "", "element_id": "reply"}]}}
created = c.cardkit.v1.card.create(
    CreateCardRequest.builder().request_body(
        CreateCardRequestBody.builder().type("card_json").data(json.dumps(card)).build()).build())
check("a card entity is created", created.success() and bool(created.data.card_id), f"{created.code} {created.msg}")
card_id = created.data.card_id
body = CreateMessageRequestBody.builder().receive_id(CHAT).msg_type("interactive").content(
    json.dumps({"type": "card", "data": {"card_id": card_id}})).uuid("sdk-uuid-3").build()
sent_card = c.im.v1.message.create(CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body).build())
check("the card is sent", sent_card.success(), f"{sent_card.code} {sent_card.msg}")


def stream(content, sequence):
    return c.cardkit.v1.card_element.content(
        ContentCardElementRequest.builder().card_id(card_id).element_id("reply").request_body(
            ContentCardElementRequestBody.builder().content(content).sequence(sequence).build()).build())


check("streaming content", stream("partial", 1).success())
stale = stream("stale", 1)
check("a sequence that does not increase is refused", not stale.success(), f"{stale.code}")
closed = c.cardkit.v1.card.settings(
    SettingsCardRequest.builder().card_id(card_id).request_body(
        SettingsCardRequestBody.builder().settings(json.dumps({"config": {"streaming_mode": False}})).sequence(2).build()).build())
check("streaming closes", closed.success(), f"{closed.code} {closed.msg}")
late = stream("too late", 3)
check("a closed card answers 300309", late.code == 300309, f"{late.code} {late.msg}")
card["config"]["streaming_mode"] = False
card["body"]["elements"][0]["content"] = "final via full update"
full = c.cardkit.v1.card.update(
    UpdateCardRequest.builder().card_id(card_id).request_body(
        UpdateCardRequestBody.builder().card(Card.builder().type("card_json").data(json.dumps(card)).build()).sequence(4).build()).build())
check("a full card update still works", full.success(), f"{full.code} {full.msg}")

recalled = c.im.v1.message.delete(DeleteMessageRequest.builder().message_id(reply.data.message_id).build())
check("recall succeeds", recalled.success(), f"{recalled.code} {recalled.msg}")

# The SDK caches tenant tokens per app id, so the wrong secret is checked at the token endpoint.
wrong = c.auth.v3.tenant_access_token.internal(
    InternalTenantAccessTokenRequest.builder().request_body(
        InternalTenantAccessTokenRequestBody.builder().app_id(APP_ID).app_secret("wrong-secret").build()).build())
check("a wrong app secret is code 10014", wrong.code == 10014, f"{wrong.code} {wrong.msg}")

# Events: the pushes the simulator made, fed to the SDK's dispatcher.
seen = []


def on_message(data):
    seen.append((data.header.event_id, json.loads(data.event.message.content)["text"], data.event.message.message_id))


handler = (
    lark.EventDispatcherHandler.builder(ENCRYPT_KEY, TOKEN, lark.LogLevel.CRITICAL)
    .register_p2_im_message_receive_v1(on_message)
    .build()
)


def feed(delivery, tamper=False):
    request = lark.RawRequest()
    request.uri = "/feishu/events"
    request.headers = {
        "X-Lark-Request-Timestamp": delivery["timestamp"],
        "X-Lark-Request-Nonce": delivery["nonce"],
        "X-Lark-Signature": ("0" * 64) if tamper else delivery["signature"],
    }
    request.body = delivery["body"].encode()
    return handler.do(request)


with open(os.environ["SIM_DELIVERIES"]) as f:
    deliveries = json.load(f)
pushes = [d for d in deliveries if d["kind"] == "event"]
check("the event was pushed more than once", len(pushes) >= 2, str(len(pushes)))
for push in pushes:
    answer = feed(push)
    check("the SDK accepts a push", answer.status_code == 200, answer.content)
check("every push decrypts to the person's message under one event id",
      seen == [(EVENT_ID, "hello bot", PERSON_MESSAGE)] * len(pushes), str(seen))
check("a wrong signature is refused", feed(pushes[0], tamper=True).status_code == 500)
verification = [d for d in deliveries if d["kind"] == "challenge"][0]
answer = feed(verification)
check("the URL verification is answered with its challenge",
      json.loads(answer.content).get("challenge") == verification["challenge"], answer.content)

if failures:
    print(f"{len(failures)} checks failed")
    sys.exit(1)
print("checks passed")
