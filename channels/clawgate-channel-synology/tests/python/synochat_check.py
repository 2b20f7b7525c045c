"""Drives the Synology Chat simulator with the `synochat` package (1.0.4): its IncomingWebhook
posts into a channel and raises its own exceptions for the simulator's refusals; its
OutgoingWebhook and SlashCommand parse the webhook bodies the simulator posted, exactly as
they arrived on the wire. Every assertion here is the test's."""

import json
import os
import sys
from urllib.parse import parse_qsl

from synochat.exceptions import InvalidPayloadError, InvalidTokenError, RateLimitError
from synochat.webhooks import IncomingWebhook, OutgoingWebhook, SlashCommand

port = int(os.environ["SIM_PORT"])
incoming_token = os.environ["SIM_INCOMING_TOKEN"]


def hook(token):
    # synochat puts the token into the query as given: the caller adds DSM's quotes.
    h = IncomingWebhook("127.0.0.1", f'"{token}"', port=port, send_delay_enabled=False)
    h.use_https = False
    return h


assert hook(incoming_token).send("hello from synochat") is True

try:
    hook(incoming_token).send("too soon")
    raise AssertionError("a second post at once must be refused as too fast")
except RateLimitError:
    pass

try:
    hook("not-a-token").send("forged")
    raise AssertionError("a wrong token must be refused")
except InvalidTokenError:
    pass

try:
    hook(incoming_token).send("with a bad file", file_url="not a url")
    raise AssertionError("a bad file_url must be refused")
except InvalidPayloadError:
    pass

bodies = json.load(open(os.environ["SIM_BODIES"]))
outgoing_token = os.environ["SIM_OUTGOING_TOKEN"]
channel = [b for b in bodies if "trigger_word=" in b][0]
data = dict(parse_qsl(channel, keep_blank_values=True))
event = OutgoingWebhook(data, outgoing_token)
assert event.authenticate(outgoing_token)
assert event.channel_id == os.environ["SIM_CHANNEL_ID"], event.channel_id
assert event.channel_name == "general"
assert event.username == "grace"
assert event.text == "!ask does this parse? & = + %", event.text
assert event.trigger_word == "!ask"
assert event.post_id.isdigit() and event.timestamp.isdigit() and event.user_id.isdigit()

dm = [b for b in bodies if "trigger_word=" not in b][0]
command = SlashCommand(dict(parse_qsl(dm, keep_blank_values=True)))
assert command.authenticate(os.environ["SIM_BOT_TOKEN"])
assert not command.authenticate(outgoing_token)
assert command.text == "a DM, ünïcode too"

print("synochat checks passed")
sys.exit(0)
