// The cross-check with clients written by others against the real Discord: discord.js's
// @discordjs/rest (REST, its own bucket limiter and 429 handling) and @discordjs/ws (the Gateway:
// identify, heartbeats, resume) pointed at the simulator. The Rust test that runs this writes as
// a person when told (lines on stdout) and judges the simulator's record afterwards.
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import assert from "node:assert/strict";

const require = createRequire(process.env.DISCORDJS_MODULES + "/");
const { REST, DiscordAPIError } = require("@discordjs/rest");
const { WebSocketManager, WebSocketShardEvents } = require("@discordjs/ws");

const { SIM_ORIGIN, SIM_TOKEN, SIM_CHANNEL } = process.env;
const lines = createInterface({ input: process.stdin });
const said = [];
let waiting = null;
lines.on("line", (line) => {
  said.push(line);
  if (waiting) waiting();
});
async function heard(text) {
  while (!said.includes(text)) await new Promise((resolve) => (waiting = resolve));
}

const rest = new REST({ version: "10", api: `${SIM_ORIGIN}/api` }).setToken(SIM_TOKEN);
const limited = [];
rest.on("rateLimited", (info) => limited.push(info));
const messages = `/channels/${SIM_CHANNEL}/messages`;

// 1. The first create meets a 429 (the test planned it): discord.js waits retry_after and
//    retries on its own.
const first = await rest.post(messages, { body: { content: "after a 429" } });
assert.equal(first.content, "after a 429");

// 2. The nonce dedupes with enforce_nonce.
const a = await rest.post(messages, { body: { content: "once", nonce: "djs-1", enforce_nonce: true } });
const b = await rest.post(messages, { body: { content: "once", nonce: "djs-1", enforce_nonce: true } });
assert.equal(a.id, b.id);
assert.equal(a.nonce, "djs-1");

// 3. Discord's error bodies come through as DiscordAPIError with code, status and the form tree.
try {
  await rest.post(messages, { body: { content: "x".repeat(2001) } });
  assert.fail("2001 characters were accepted");
} catch (error) {
  assert.ok(error instanceof DiscordAPIError, String(error));
  assert.equal(error.status, 400);
  assert.equal(error.code, 50035);
  assert.equal(error.rawError.errors.content._errors[0].code, "BASE_TYPE_MAX_LENGTH");
}
try {
  await rest.post("/channels/1/messages", { body: { content: "x" } });
  assert.fail("an unknown channel was accepted");
} catch (error) {
  assert.equal(error.status, 404);
  assert.equal(error.code, 10003);
}

// 4. A burst on a small bucket (2 per second): discord.js reads X-RateLimit-* and waits.
for (let n = 0; n < 5; n++) {
  await rest.post(messages, { body: { content: `burst ${n}` } });
}

// 5. Edit and delete (a 204).
const edited = await rest.patch(`${messages}/${a.id}`, { body: { content: "edited" } });
assert.equal(edited.content, "edited");
await rest.delete(`${messages}/${b.id === a.id ? first.id : b.id}`);

// 6. The Gateway: identify, a person's message, a dropped socket, the resume, the next message.
const seen = [];
const manager = new WebSocketManager({
  token: SIM_TOKEN,
  intents: (1 << 9) | (1 << 15),
  rest,
});
manager.on(WebSocketShardEvents.Dispatch, (event) => {
  const payload = event?.data ?? event;
  if (payload.t === "MESSAGE_CREATE") seen.push(payload.d.content);
});
const ready = new Promise((resolve) => manager.on(WebSocketShardEvents.Ready, resolve));
await manager.connect();
await ready;
console.log("gateway ready");
await heard("written 1");
while (!seen.includes("hello gateway")) await new Promise((r) => setTimeout(r, 20));
console.log("got the first message");
await heard("written 2");
while (!seen.includes("after the drop")) await new Promise((r) => setTimeout(r, 20));
assert.equal(seen.filter((t) => t === "after the drop").length, 1);
await manager.destroy();
console.log(`rate limited events: ${limited.length}`);
console.log("checks passed");
process.exit(0);
