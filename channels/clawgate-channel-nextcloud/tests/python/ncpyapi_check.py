"""Drives the Nextcloud Talk simulator with nc-py-api (Nextcloud's own Python framework).

User API: capabilities and the current user (OCS v1), the user's conversations, a message
sent and read back from history, a delete, a refused password. Bot API: nc-py-api's TalkBot
signs and sends a message (HMAC over random + message text). Webhooks: the bodies the
simulator POSTed (as they arrived, with their headers) are parsed with nc-py-api's
TalkBotMessage, and their signatures checked over random + body.

Prints one JSON line with what it did, then "checks passed".
"""

import hashlib
import hmac
import json
import os

from nc_py_api import Nextcloud, NextcloudException
from nc_py_api.talk_bot import TalkBot, TalkBotMessage

base = os.environ["SIM_URL"]
token = os.environ["SIM_TOKEN"]
user = os.environ["SIM_USER"]
password = os.environ["SIM_PASSWORD"]
secret = os.environ["SIM_BOT_SECRET"]

nc = Nextcloud(nextcloud_url=base, nc_auth_user=user, nc_auth_pass=password)
assert nc.talk.available, "spreed is in the capabilities"
assert nc.talk.bots_available, "bots-v1 is in the capabilities"
assert nc.user == user, nc.user

conversations = nc.talk.get_user_conversations()
conversation = next(c for c in conversations if c.token == token)
assert conversation.display_name == "cross-check", conversation.display_name

sent = nc.talk.send_message("hello from nc-py-api", conversation)
assert sent.message_id > 0
assert len(sent.reference_id) == 64, sent.reference_id
assert sent.actor_id == user and sent.actor_type == "users"

history = nc.talk.receive_messages(conversation, look_in_future=False, limit=50)
texts = [m.message for m in history]
assert "hello from nc-py-api" in texts, texts
assert "hello from the gateway" in texts, texts
gateway = next(m for m in history if m.message == "hello from the gateway")
assert len(gateway.reference_id) == 64, gateway.reference_id
assert history[0].message_id > history[-1].message_id, "history is newest first"

deleted = nc.talk.delete_message(sent)
assert deleted.system_message == "message_deleted", deleted.system_message

bad = Nextcloud(nextcloud_url=base, nc_auth_user=user, nc_auth_pass="not-the-password")
try:
    bad.talk.get_user_conversations()
    raise AssertionError("a wrong app password was accepted")
except NextcloudException as e:
    assert e.status_code in (401, 997), e.status_code

# The bot: nc-py-api reads the secret from an environment variable named after the app and URL.
os.environ["NEXTCLOUD_URL"] = base
os.environ["APP_ID"] = "clawgate_check"
callback = "talk_bot"
os.environ[hashlib.sha1(f"clawgate_check_{callback}".encode()).hexdigest()] = secret
bot = TalkBot("/" + callback, "clawgate-bot", "cross-check")
response, reference = bot.send_message("hello from talk_bot", 0, token=token)
assert response.status_code == 201, (response.status_code, response.text)
assert json.loads(response.text)["ocs"]["data"] is None, response.text

# A wrong secret is refused.
os.environ[hashlib.sha1(f"clawgate_check_{callback}".encode()).hexdigest()] = "x" * 40
refused, _ = bot.send_message("forged", 0, token=token)
assert refused.status_code == 401, refused.status_code

events = []
with open(os.environ["SIM_BODIES"], encoding="utf-8") as f:
    for random, signature, body in json.load(f):
        expected = hmac.new(secret.encode(), (random + body).encode(), hashlib.sha256).hexdigest()
        assert hmac.compare_digest(expected, signature), "a webhook signature did not verify"
        message = TalkBotMessage(json.loads(body))
        if message.message_type == "Create":
            assert message.conversation_token == token
            events.append(
                {
                    "type": message.message_type,
                    "actor": message.actor_id,
                    "id": message.object_id,
                    "text": message.object_content["message"],
                    "name": message.object_name,
                }
            )
        else:
            assert message.message_type == "Join", message.message_type
            assert message.conversation_token == token

print(json.dumps({"sent": sent.message_id, "reference": reference, "events": events}))
print("checks passed")
