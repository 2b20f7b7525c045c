"""Drives the QQ Bot simulator with Tencent's own Python SDK, qq-botpy (botpy 1.2.1).

botpy builds its API URLs from `Route.SCHEME` and `Route.DOMAIN`, which are pointed at the
simulator; its token request goes to a fixed https://bots.qq.com URL, so only that one URL is
redirected to the simulator. Everything else is botpy's own code: the token fetch and its
`expires_in` handling, the `QQBot <token>` and `X-Union-Appid` headers, the message and file
payloads, and how it reports an error answer.

Usage: botpy_check.py <api base> <app id> <secret> <openid> <msg_id> <group_openid> <group msg_id>
Prints one JSON object of what botpy saw.
"""

import asyncio
import json
import sys
import time

import aiohttp
from botpy import robot
from botpy.api import BotAPI
from botpy.http import BotHttp, Route

BASE, APP_ID, SECRET, OPENID, MSG_ID, GROUP, GROUP_MSG = sys.argv[1:8]
TOKEN_URL = "https://bots.qq.com/app/getAppAccessToken"

Route.SCHEME = "http"
Route.DOMAIN = BASE.split("://", 1)[1]


class Loopback(aiohttp.ClientSession):
    """A session whose one change is where botpy's fixed token URL goes."""

    def post(self, url, **kwargs):
        if str(url) == TOKEN_URL:
            url = BASE + "/app/getAppAccessToken"
        return super().post(url, **kwargs)


robot.aiohttp.ClientSession = Loopback


def failure(error):
    return f"{type(error).__name__}: {error}"


async def main():
    out = {}
    http = BotHttp(timeout=5, app_id=APP_ID, secret=SECRET)
    api = BotAPI(http)
    first = await api.post_c2c_message(
        openid=OPENID, msg_type=0, content="from botpy", msg_id=MSG_ID, msg_seq=1
    )
    out["id"] = first["id"]
    out["token_left"] = http._token.expires_in - int(time.time())
    out["auth_scheme"] = http._headers["Authorization"].split(" ")[0]
    out["union_appid"] = http._headers["X-Union-Appid"]
    try:
        await api.post_c2c_message(
            openid=OPENID, msg_type=0, content="from botpy", msg_id=MSG_ID, msg_seq=1
        )
        out["repeat"] = "accepted"
    except Exception as error:  # botpy raises its ServerError for a 400
        out["repeat"] = failure(error)
    second = await api.post_c2c_message(
        openid=OPENID, msg_type=0, content="second from botpy", msg_id=MSG_ID, msg_seq=2
    )
    out["second_id"] = second["id"]
    media = await api.post_c2c_file(
        openid=OPENID, file_type=1, url="https://img.example/botpy.png"
    )
    out["file_info"] = media["file_info"]
    picture = await api.post_c2c_message(
        openid=OPENID, msg_type=7, media=media, msg_id=MSG_ID, msg_seq=3
    )
    out["picture_id"] = picture["id"]
    group = await api.post_group_message(
        group_openid=GROUP, msg_type=0, content="to the group", msg_id=GROUP_MSG, msg_seq=1
    )
    out["group_id"] = group["id"]
    await http.close()
    wrong = BotHttp(timeout=5, app_id=APP_ID, secret="not-the-secret")
    try:
        await BotAPI(wrong).post_c2c_message(openid=OPENID, content="x", msg_id=MSG_ID, msg_seq=9)
        out["wrong_secret"] = "accepted"
    except Exception as error:  # botpy raises RuntimeError(<the answer>)
        out["wrong_secret"] = failure(error)
    await wrong.close()
    print(json.dumps(out, ensure_ascii=False))


asyncio.run(main())
