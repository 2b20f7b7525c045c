"""Cross-checks the Bot API simulator with aiogram 3, a client written against the real API.

Run by the `aiogram` test of `tests/simulator/` with the simulator already started:
SIM_BASE_URL, SIM_TOKEN, SIM_BOT_ID, SIM_CHAT_ID (a private chat) and SIM_USER_ID (its user)
say where it is. Every check is an assertion; the script exits non-zero on the first failure.
"""

import asyncio
import json
import os
import sys
import urllib.request

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import TelegramBadRequest, TelegramConflictError, TelegramRetryAfter
from aiogram.types import ReplyParameters

BASE = os.environ["SIM_BASE_URL"]
TOKEN = os.environ["SIM_TOKEN"]
BOT_ID = int(os.environ["SIM_BOT_ID"])
CHAT = int(os.environ["SIM_CHAT_ID"])
USER = int(os.environ["SIM_USER_ID"])

checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


def control(path, body=None):
    """The simulator's control API (blocking; these calls answer at once)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{BASE}/control/{path}",
        data=data,
        method="GET" if body is None else "POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


async def until_held():
    for _ in range(500):
        if control("long_poll")["holding"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the first getUpdates was never held")


async def main():
    session = AiohttpSession(api=TelegramAPIServer.from_base(BASE))
    bot = Bot(TOKEN, session=session)
    try:
        me = await bot.get_me()
        check(me.id == BOT_ID and me.is_bot, f"getMe: {me!r}")

        hello = await bot.send_message(CHAT, "<b>Hello</b> world", parse_mode="HTML")
        check(hello.text == "Hello world", f"HTML is parsed: {hello.text!r}")
        check(
            [(e.type, e.offset, e.length) for e in hello.entities or []] == [("bold", 0, 5)],
            f"entities: {hello.entities!r}",
        )
        check(hello.chat.id == CHAT and hello.chat.type == "private", "chat shape")
        check(hello.from_user is not None and hello.from_user.id == BOT_ID, "from is the bot")

        reply = await bot.send_message(
            CHAT,
            "a reply",
            reply_parameters=ReplyParameters(message_id=hello.message_id, quote="world"),
        )
        check(reply.reply_to_message is not None, "reply_to_message present")
        check(reply.reply_to_message.message_id == hello.message_id, "replied to hello")
        check(reply.quote is not None and reply.quote.text == "world", f"quote: {reply.quote!r}")
        check(reply.message_id == hello.message_id + 1, "per-chat ids count up")

        edited = await bot.edit_message_text("Hello again", chat_id=CHAT, message_id=hello.message_id)
        check(edited.text == "Hello again" and edited.edit_date is not None, f"edit: {edited!r}")

        try:
            await bot.edit_message_text("Hello again", chat_id=CHAT, message_id=hello.message_id)
            check(False, "an identical edit must fail")
        except TelegramBadRequest as error:
            check("message is not modified" in error.message, f"not modified: {error.message!r}")

        control(
            "fault",
            {
                "method": "sendMessage",
                "kind": "error",
                "status": 429,
                "description": "Too Many Requests: retry after 5",
                "retry_after": 5,
            },
        )
        try:
            await bot.send_message(CHAT, "refused")
            check(False, "the 429 fault must surface")
        except TelegramRetryAfter as error:
            check(error.retry_after == 5, f"retry_after: {error.retry_after!r}")

        check(await bot.delete_message(CHAT, reply.message_id) is True, "deleteMessage")

        control(
            "write",
            {"chat_id": CHAT, "from": {"id": USER, "first_name": "Alice"}, "text": "from a user"},
        )
        updates = await bot.get_updates(timeout=1)
        texts = [u.message.text for u in updates if u.message is not None]
        check(texts == ["from a user"], f"getUpdates sees the user: {texts!r}")
        check(updates[0].message.from_user.id == USER, "from is the user")
        offset = updates[-1].update_id + 1

        first = asyncio.create_task(bot.get_updates(offset=offset, timeout=20))
        await until_held()
        second = asyncio.create_task(bot.get_updates(offset=offset, timeout=1))
        try:
            await first
            check(False, "the older poll must end with 409")
        except TelegramConflictError as error:
            check("terminated by other getUpdates request" in error.message, error.message)
        check(await second == [], "the newer poll holds and ends empty")
    finally:
        await session.close()
    print(f"aiogram cross-check: {checks} checks passed")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as failure:
        print(f"aiogram cross-check FAILED after {checks} checks: {failure}", file=sys.stderr)
        sys.exit(1)
