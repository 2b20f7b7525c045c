// @twurple/api (a Helix client written against the real Twitch API) on the simulator's Helix,
// through twurple's own mock-server switch (TWURPLE_MOCK_API_PORT: Helix under /mock, the
// token check under /auth). Prints one JSON line per result; the Rust test judges.
const { ApiClient, ChatMessageDroppedError } = require('@twurple/api');
const { StaticAuthProvider } = require('@twurple/auth');

const out = (event) => process.stdout.write(JSON.stringify(event) + '\n');
const env = (name) => process.env[name];

async function main() {
  const auth = new StaticAuthProvider(env('SIM_CLIENT_ID'), env('SIM_TOKEN'));
  const api = new ApiClient({ authProvider: auth, logger: { minLevel: 'critical' } });
  const broadcaster = env('SIM_BROADCASTER_ID');
  const send = async (label, text, params) => {
    try {
      const sent = await api.asUser(env('SIM_USER_ID'), (ctx) => ctx.chat.sendChatMessage(broadcaster, text, params));
      out({ label, sent: sent.isSent, id: sent.id });
    } catch (e) {
      if (e instanceof ChatMessageDroppedError) {
        out({ label, dropped: true, code: e.code ?? null, message: e.message });
      } else {
        out({ label, error: e.constructor.name, status: e.statusCode ?? null, message: String(e.message) });
      }
    }
  };
  await send('first', 'hello from twurple');
  await send('repeat', 'hello from twurple');
  await send('reply', 'answering ada', { replyParentMessageId: env('SIM_PARENT_ID') });
  const wrong = new ApiClient({ authProvider: new StaticAuthProvider(env('SIM_CLIENT_ID'), 'not-the-token'), logger: { minLevel: 'critical' } });
  try {
    await wrong.asUser(env('SIM_USER_ID'), (ctx) => ctx.chat.sendChatMessage(broadcaster, 'nope'));
    out({ label: 'wrong token', sent: true });
  } catch (e) {
    out({ label: 'wrong token', error: e.constructor.name, message: String(e.message) });
  }
  out({ label: 'done' });
}
main().catch((e) => { out({ label: 'crash', message: String(e && e.stack) }); process.exit(1); });
