"""Drives the Zalo simulator with elizaos-plugin-zalo's ZaloClient (a Zalo OA client written
by others): the token endpoint (form fields, `secret_key` header, rotation), the OA profile and
consultation sends with the `access_token` header, and a failure inside an HTTP 200 body.

The plugin still posts texts to the retired v2 path (`/v2.0/oa/message`); its transport is
wrapped to move that one path to v3's `/v3.0/oa/message/cs`, leaving the body, the headers
and the answer handling the plugin's own. Usage: elizaos_zalo_check.py <base> <app_id>
<app_secret> <refresh_token> <open_user> <closed_user>; prints one JSON line of results.
"""

import asyncio
import json
import sys

import httpx

import elizaos_plugin_zalo.client as zalo_client
from elizaos_plugin_zalo.client import ZaloClient
from elizaos_plugin_zalo.error import ApiError, TokenRefreshError
from elizaos_plugin_zalo.types import ZaloSendMessageParams


class V3Messages(httpx.AsyncBaseTransport):
    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.moved = 0

    async def handle_async_request(self, request):
        if request.url.path == "/v2.0/oa/message":
            request.url = request.url.copy_with(path="/v3.0/oa/message/cs")
            self.moved += 1
        return await self.inner.handle_async_request(request)


async def main():
    base, app_id, secret, refresh, open_user, closed_user = sys.argv[1:7]
    zalo_client.ZALO_OAUTH_API_BASE = f"{base}/v4"
    zalo_client.ZALO_OA_API_BASE = f"{base}/v2.0/oa"
    out = {}

    tokens = await ZaloClient.refresh_token(app_id, secret, refresh)
    assert tokens["access_token"] and tokens["refresh_token"], tokens
    assert tokens["refresh_token"] != refresh, "the refresh token rotates"
    out["expires_in"] = tokens["expires_in"]
    try:
        await ZaloClient.refresh_token(app_id, secret, refresh)
        out["reused_refresh"] = "accepted"
    except TokenRefreshError as error:
        out["reused_refresh"] = str(error)
    rotated = await ZaloClient.refresh_token(app_id, secret, tokens["refresh_token"])
    out["rotated_refresh_works"] = bool(rotated["access_token"])

    client = ZaloClient(rotated["access_token"])
    transport = V3Messages()
    client._client = httpx.AsyncClient(transport=transport)
    info = await client.get_oa_info()
    out["oa_id"] = info.oa_id
    out["oa_name"] = info.name
    out["message_id"] = await client.send_message(
        ZaloSendMessageParams(user_id=open_user, text="from elizaos-plugin-zalo")
    )
    try:
        await client.send_message(ZaloSendMessageParams(user_id=closed_user, text="too late"))
        out["closed_window"] = "accepted"
    except ApiError as error:
        out["closed_window"] = error.error_code
    stale = ZaloClient("not-a-token")
    try:
        await stale.get_oa_info()
        out["bad_token"] = "accepted"
    except ApiError as error:
        out["bad_token"] = error.error_code
    await stale.close()
    out["moved"] = transport.moved
    await client.close()
    print(json.dumps(out))


asyncio.run(main())
