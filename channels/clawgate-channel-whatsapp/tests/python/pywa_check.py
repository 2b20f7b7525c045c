"""Cross-checks the Cloud API simulator with pywa, a WhatsApp Cloud API client written against
Meta's API.

Run by the `pywa` test of `tests/simulator/` with the simulator already started. pywa always
talks to https://graph.facebook.com; an httpx transport (httpx's documented extension point)
sends its requests to the simulator instead, unchanged otherwise. The environment says where
things are:

  SIM_BASE_URL, SIM_TOKEN, SIM_PHONE_ID, SIM_APP_SECRET  the simulator
  SIM_PERSON, SIM_INBOUND         a person whose window is open, and their message's wamid
  SIM_CLOSED                      a person who never wrote (window closed)
  SIM_THROTTLED, SIM_UNREACHABLE  people whose next send is refused with 131056 / 131026
  SIM_DELIVERIES                  a JSON file of webhook deliveries the simulator posted
                                  ([{body, signature}]), captured by the test
  SIM_STATUS_TRACKER              the biz_opaque_callback_data of the status deliveries

Every check is an assertion; the script exits non-zero on the first failure.
"""

import json
import os
import urllib.parse

import httpx
from pywa import WhatsApp, errors, handlers, types

BASE = urllib.parse.urlsplit(os.environ["SIM_BASE_URL"])
TOKEN = os.environ["SIM_TOKEN"]
PHONE_ID = os.environ["SIM_PHONE_ID"]
SECRET = os.environ["SIM_APP_SECRET"]
PERSON = os.environ["SIM_PERSON"]
INBOUND = os.environ["SIM_INBOUND"]

checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


class ToSimulator(httpx.HTTPTransport):
    """Sends every request to the simulator (plain HTTP on loopback), path and body unchanged."""

    def handle_request(self, request):
        request.url = request.url.copy_with(scheme=BASE.scheme, host=BASE.hostname, port=BASE.port)
        return super().handle_request(request)


def client(token):
    return WhatsApp(
        phone_id=PHONE_ID,
        token=token,
        session=httpx.Client(transport=ToSimulator(), timeout=10),
        app_secret=SECRET,
        verify_token="unused",
    )


def expect(error_class, code, call):
    try:
        call()
    except error_class as e:
        check(e.code == code, f"{error_class.__name__}: code {e.code}, not {code}")
        return e
    raise AssertionError(f"expected {error_class.__name__} ({code})")


def webhooks(wa):
    """pywa verifies the simulator's signatures and parses its notifications."""
    messages, statuses = [], []
    wa.add_handlers(
        handlers.MessageHandler(lambda _, m: messages.append(m)),
        handlers.MessageStatusHandler(lambda _, s: statuses.append(s)),
    )
    with open(os.environ["SIM_DELIVERIES"]) as f:
        deliveries = json.load(f)
    check(len(deliveries) >= 3, f"deliveries to check: {len(deliveries)}")
    for delivery in deliveries:
        body = delivery["body"].encode()
        check(
            wa.webhook_update_validator(body, delivery["signature"]) is None,
            f"pywa accepts the signature of {delivery['body'][:80]}",
        )
        tampered = body.replace(b"whatsapp", b"WhatsApp", 1)
        check(
            wa.webhook_update_validator(tampered, delivery["signature"]) is not None,
            "pywa refuses a tampered body under the same signature",
        )
        answer = wa.webhook_update_handler(body)
        check(answer[1] == 200, f"pywa handled the update: {answer}")
    check(len(messages) == 1, f"one message parsed: {messages}")
    message = messages[0]
    check(message.id == INBOUND, f"message id {message.id}")
    check(message.text == "hello from a person", f"text {message.text!r}")
    check(message.from_user.wa_id == PERSON, f"from {message.from_user.wa_id}")
    check(message.from_user.name == "Ada", f"name {message.from_user.name}")
    check(message.type == types.MessageType.TEXT, f"type {message.type}")
    tracker = os.environ["SIM_STATUS_TRACKER"]
    seen = {s.status.value for s in statuses}
    check(seen == {"sent", "delivered"}, f"statuses {seen}")
    check(all(s.tracker == tracker for s in statuses), f"trackers {[s.tracker for s in statuses]}")
    check(all(s.from_user.wa_id == PERSON for s in statuses), "statuses name the recipient")


def sends(wa):
    sent = wa.send_message(PERSON, "hello from pywa", preview_url=True, tracker="pywa-tracker-1")
    check(sent.id.startswith("wamid."), f"a wamid: {sent.id}")
    reply = wa.send_message(PERSON, "a quoted reply", reply_to_message_id=INBOUND)
    check(reply.id.startswith("wamid.") and reply.id != sent.id, "a second wamid")
    check(bool(wa.mark_message_as_read(INBOUND)), "marked read")
    expect(errors.ReEngagementMessage, 131047, lambda: wa.send_message(os.environ["SIM_CLOSED"], "late"))
    expect(errors.TooManyMessages, 131056, lambda: wa.send_message(os.environ["SIM_THROTTLED"], "fast"))
    expect(
        errors.MessageUndeliverable,
        131026,
        lambda: wa.send_message(os.environ["SIM_UNREACHABLE"], "nobody"),
    )
    too_long = expect(errors.WhatsAppError, 100, lambda: wa.send_message(PERSON, "x" * 4097))
    check("4096" in (too_long.details or too_long.message), f"names the limit: {too_long}")
    expect(errors.ExpiredAccessToken, 190, lambda: client("EAAG-wrong").send_message(PERSON, "no"))
    expect(errors.WhatsAppError, 100, lambda: wa.mark_message_as_read("wamid.unknown"))


def main():
    wa = client(TOKEN)
    webhooks(wa)
    sends(wa)
    print(f"pywa: {checks} checks passed")


main()
