"""Drives the BlueBubbles simulator with elizaos-plugin-bluebubbles (2.0.0a5): its
BlueBubblesClient probes the server, sends a text with a tempGuid (parsing the answer into its
own BlueBubblesMessage model), lists the chat's messages, queries them, edits and unsends,
and meets a 401 with a wrong password; its webhook models and BlueBubblesService parse the
webhook bodies the simulator posted, exactly as they arrived. Every assertion here is the
test's.

The package's `__init__` imports its elizaOS actions, which fail against the elizaOS core
release it requires (`Content` has no `action` field in elizaos 2.0.0a5); the client, config,
types and service modules import nothing of elizaOS, so the package is registered without
running its `__init__` and those modules are imported as they are."""

import asyncio
import importlib.util
import json
import os
import sys
import types

_spec = importlib.util.find_spec("elizaos_plugin_bluebubbles")
_package = types.ModuleType("elizaos_plugin_bluebubbles")
_package.__path__ = list(_spec.submodule_search_locations)
sys.modules["elizaos_plugin_bluebubbles"] = _package

from elizaos_plugin_bluebubbles.client import BlueBubblesClient
from elizaos_plugin_bluebubbles.config import BlueBubblesConfig
from elizaos_plugin_bluebubbles.service import BlueBubblesService
from elizaos_plugin_bluebubbles.types import (
    BlueBubblesMessage,
    BlueBubblesWebhookPayload,
    DmPolicy,
    SendMessageOptions,
)

url = os.environ["SIM_URL"]
password = os.environ["SIM_PASSWORD"]
chat = os.environ["SIM_CHAT"]


async def main():
    client = BlueBubblesClient(BlueBubblesConfig(server_url=url, password=password))
    probe = await client.probe()
    assert probe.ok, probe
    assert probe.private_api_enabled is True, probe

    sent = await client.send_message(
        chat, "hello from elizaos", SendMessageOptions(temp_guid="eliza-temp-1")
    )
    assert sent.guid and sent.guid != "eliza-temp-1", sent
    assert sent.text == "hello from elizaos", sent

    listed = await client.get_messages(chat, limit=10)
    # Newest first: our message, then the person's that came before it.
    assert [m.guid for m in listed][0] == sent.guid and len(listed) == 2, listed
    assert not listed[1].is_from_me and listed[1].text == "a person writes", listed
    assert listed[0].is_from_me and listed[0].date_created == sent.date_created
    assert listed[0].handle is not None and listed[0].handle.address == chat.split(";")[-1]

    rows = await client._post(
        "/api/v1/message/query",
        {"chatGuid": chat, "after": 0, "limit": 10, "sort": "ASC"},
    )
    assert [r["guid"] for r in rows][-1] == sent.guid and len(rows) == 2, rows
    assert all("tempGuid" not in r for r in rows), rows

    await client.edit_message(sent.guid, "hello, edited")
    await client.unsend_message(sent.guid)

    wrong = BlueBubblesClient(BlueBubblesConfig(server_url=url, password="not-it"))
    bad = await wrong.probe()
    assert not bad.ok and "401" in (bad.error or ""), bad
    try:
        await wrong.send_message(chat, "forged", SendMessageOptions(temp_guid="x"))
        raise AssertionError("a wrong password must be refused")
    except Exception as e:  # the client raises a bare Exception naming the status
        assert "401" in str(e), e
    await wrong.close()

    # The test writes the webhook bodies once the ones of the calls above have arrived.
    path = os.environ["SIM_BODIES"]
    for _ in range(600):
        if os.path.exists(path):
            break
        await asyncio.sleep(0.05)
    bodies = json.load(open(path))
    kinds = []
    service = BlueBubblesService()
    service.config = BlueBubblesConfig(
        server_url=url, password=password, dm_policy=DmPolicy.OPEN
    )
    service.client = client
    for body in bodies:
        payload = BlueBubblesWebhookPayload(**body)
        kinds.append(payload.type)
        if payload.type in ("new-message", "updated-message"):
            message = BlueBubblesMessage(**payload.data)
            assert message.chats and message.chats[0].guid == chat, message
        await service.handle_webhook(payload)
    assert "new-message" in kinds and "updated-message" in kinds, kinds
    person = [
        BlueBubblesMessage(**b["data"])
        for b in bodies
        if b["type"] == "new-message" and not b["data"]["isFromMe"]
    ]
    assert len(person) == 1 and person[0].text == "a person writes", person
    assert person[0].handle.address == chat.split(";")[-1]
    await client.close()
    print("elizaos-plugin-bluebubbles checks passed")


asyncio.run(main())
sys.exit(0)
