"""Drives the Mattermost simulator with mattermostdriver, a client written against real servers.

Run by tests/mattermost/driver.rs with SIM_PORT, SIM_TOKEN (the person's), SIM_CHANNEL (a
channel the person is in), SIM_OTHER (one it is not in); prints "checks passed" at the end.
"""

import asyncio
import json
import os
import sys

from mattermostdriver import Driver
from mattermostdriver.exceptions import (
    InvalidOrMissingParameters,
    NotEnoughPermissions,
    ResourceNotFound,
)
from mattermostdriver.websocket import Websocket


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}")
        sys.exit(1)


driver = Driver({
    "url": "127.0.0.1",
    "port": int(os.environ["SIM_PORT"]),
    "scheme": "http",
    "token": os.environ["SIM_TOKEN"],
    "basepath": "/api/v4",
    "timeout": 5,
})
driver.login()
me = driver.users.get_user("me")
check(me["username"] == "ada", f"users/me is the token's user: {me}")
channel = os.environ["SIM_CHANNEL"]

first = driver.posts.create_post({"channel_id": channel, "message": "from mattermostdriver",
                                  "pending_post_id": "driver-1"})
check(len(first["id"]) == 26, f"a 26-character post id: {first['id']}")
check(first["create_at"] > 0 and first["pending_post_id"] == "driver-1", f"the post: {first}")
again = driver.posts.create_post({"channel_id": channel, "message": "from mattermostdriver",
                                  "pending_post_id": "driver-1"})
check(again["id"] == first["id"], "the same pending_post_id inside 30 s returns the same post")

reply = driver.posts.create_post({"channel_id": channel, "message": "in the thread",
                                  "root_id": first["id"]})
check(reply["root_id"] == first["id"], "a reply under its root")
try:
    driver.posts.create_post({"channel_id": channel, "message": "x", "root_id": reply["id"]})
    check(False, "a reply's id as root_id is refused")
except InvalidOrMissingParameters as e:
    check("root_id" in str(e.args) or "RootId" in str(e.args), f"the refusal names the root: {e.args}")

try:
    driver.posts.create_post({"channel_id": os.environ["SIM_OTHER"], "message": "x"})
    check(False, "a post into a channel the user is not in is refused")
except NotEnoughPermissions:
    pass

try:
    driver.posts.create_post({"channel_id": channel, "message": "x" * 16384})
    check(False, "16,384 runes are refused")
except InvalidOrMissingParameters:
    pass

patched = driver.posts.patch_post(first["id"], options={"message": "edited by mattermostdriver"})
check(patched["message"] == "edited by mattermostdriver" and patched["edit_at"] > 0, f"patched: {patched}")

since = driver.posts.get_posts_for_channel(channel, params={"since": first["create_at"] - 1})
check(first["id"] in since["posts"] and reply["id"] in since["posts"], f"since lists both: {since['order']}")

deleted = driver.posts.delete_post(reply["id"])
check(deleted == {"status": "OK"}, f"delete answers status OK: {deleted}")
try:
    driver.posts.patch_post(reply["id"], options={"message": "gone"})
    check(False, "a deleted post cannot be patched")
except ResourceNotFound:
    pass

# The WebSocket, authenticated by challenge as the driver does: hello, then our own post's event.
async def socket():
    seen = []
    done = asyncio.Event()

    async def handler(message):
        event = json.loads(message)
        seen.append(event)
        if event.get("event") == "hello":
            await asyncio.to_thread(driver.posts.create_post,
                                    {"channel_id": channel, "message": "over the socket"})
        if event.get("event") == "posted":
            post = json.loads(event["data"]["post"])
            if post["message"] == "over the socket":
                done.set()

    ws = Websocket(driver.options, driver.client.token)
    task = asyncio.create_task(ws.connect(handler))
    await asyncio.wait_for(done.wait(), timeout=10)
    ws.disconnect()
    task.cancel()
    return seen

seen = asyncio.run(socket())
hello = [e for e in seen if e.get("event") == "hello"]
check(len(hello) == 1 and hello[0]["seq"] == 0 and hello[0]["data"]["connection_id"],
      f"one hello with seq 0 and a connection_id: {hello}")
check(any(e.get("status") == "OK" and e.get("seq_reply") == 1 for e in seen),
      f"the challenge is answered OK: {seen[:2]}")
posted = [e for e in seen if e.get("event") == "posted"]
check(posted and posted[-1]["seq"] == 1 and posted[-1]["broadcast"]["channel_id"] == channel,
      f"the posted event has the next seq and its channel: {posted}")
print("checks passed")
