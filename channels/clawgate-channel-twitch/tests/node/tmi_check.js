// tmi.js (a Twitch chat client written against the real TMI) on the simulator's IRC over
// WebSocket. Prints one JSON line per event it sees; reads one JSON command per line on stdin:
// {"say": text}, {"raw": line}, {"quit": true}. The Rust test drives it and judges.
const readline = require('readline');
const tmi = require('tmi.js');

const out = (event) => process.stdout.write(JSON.stringify(event) + '\n');
const env = (name) => {
  const value = process.env[name];
  if (!value) { out({ event: 'error', message: `${name} is not set` }); process.exit(2); }
  return value;
};

const channel = env('SIM_CHANNEL');
const client = new tmi.Client({
  options: { skipUpdatingEmotesets: true, skipMembership: true },
  connection: { server: '127.0.0.1', port: Number(env('SIM_WS_PORT')), secure: false, reconnect: false },
  identity: { username: env('SIM_LOGIN'), password: `oauth:${env('SIM_TOKEN')}` },
  channels: [channel],
  logger: { info() {}, warn() {}, error: (m) => out({ event: 'log', message: String(m) }) },
});

client.on('message', (chan, tags, message, self) => out({
  event: 'message', channel: chan, self, message,
  id: tags.id || null, login: tags.username || null, userId: tags['user-id'] || null,
  display: tags['display-name'] || null, sentTs: tags['tmi-sent-ts'] || null,
  replyParent: tags['reply-parent-msg-id'] || null,
}));
client.on('notice', (chan, msgid, message) => out({ event: 'notice', channel: chan, msgid, message }));
client.on('roomstate', (chan, state) => out({ event: 'roomstate', channel: chan, roomId: state['room-id'] || null }));
client.on('join', (chan, username, self) => { if (self) out({ event: 'joined', channel: chan, username }); });
client.on('disconnected', (reason) => out({ event: 'disconnected', reason: String(reason) }));
client.on('pong', () => out({ event: 'pong' }));

client.connect().then(
  ([server, port]) => out({ event: 'connected', server, port }),
  (reason) => { out({ event: 'connect_failed', reason: String(reason) }); process.exit(0); },
);

readline.createInterface({ input: process.stdin }).on('line', async (line) => {
  const command = JSON.parse(line);
  if (command.say !== undefined) {
    try { await client.say(channel, command.say); out({ event: 'said', message: command.say }); }
    catch (reason) { out({ event: 'say_failed', reason: String(reason) }); }
  } else if (command.raw !== undefined) {
    client.ws.send(command.raw);
  } else if (command.ping) {
    client.ping().then(() => {}, (reason) => out({ event: 'ping_failed', reason: String(reason) }));
  } else if (command.quit) {
    await client.disconnect().catch(() => {});
    process.exit(0);
  }
});
