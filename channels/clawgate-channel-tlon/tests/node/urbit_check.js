// Tlon's own Eyre client, @urbit/http-api 3.0.0, pointed at the Tlon channel's simulated ship
// (with @urbit/aura 3.0.0 for the writ ids). Prints one JSON line per event; takes JSON-line
// commands on stdin: {"dm": {to, text, sent}}, {"scry": {app, path}}, {"quit": true}.
'use strict';

const { Urbit } = require('@urbit/http-api');
const aura = require('@urbit/aura');
const readline = require('readline');

const url = process.env.SHIP_URL;
const code = process.env.SHIP_CODE;
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
process.on('unhandledRejection', (e) => out({ event: 'unhandled', error: String((e && e.message) || e) }));

async function main() {
  // The library's own login: it treats every 2xx answer as a failure, and Eyre answers 204.
  const probe = new Urbit(url, code);
  try {
    await probe.connect();
    out({ event: 'connect', ok: true });
  } catch (e) {
    out({ event: 'connect', ok: false, error: e.message });
  }
  // So the session is made as a browser would, and handed to the client.
  const login = await fetch(`${url}/~/login`, { method: 'POST', body: `password=${code}` });
  const cookie = login.headers.get('set-cookie') || '';
  out({ event: 'login', status: login.status, cookie: cookie.split('=')[0] });
  const api = new Urbit(url, code);
  api.cookie = cookie.split(';')[0];
  api.ship = 'zod';
  api.our = 'zod';
  await api.poke({ app: 'hood', mark: 'helm-hi', json: 'opening airlock' });
  out({ event: 'open' });
  const id = await api.subscribe({
    app: 'chat',
    path: '/v3',
    event: (json) => out({ event: 'fact', json }),
    quit: () => out({ event: 'quit' }),
    err: (e) => out({ event: 'suberr', error: String(e) }),
  });
  out({ event: 'subscribed', id });
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const cmd = JSON.parse(line);
    if (cmd.dm) {
      const { to, text, sent } = cmd.dm;
      const writ = `~zod/${aura.render('ud', aura.da.fromUnix(sent))}`;
      const result = await new Promise((resolve) => {
        api.poke({
          app: 'chat',
          mark: 'chat-dm-action',
          json: {
            ship: to,
            diff: {
              id: writ,
              delta: { add: { memo: { content: [{ inline: [text] }], author: '~zod', sent }, kind: null, time: null } },
            },
          },
          onSuccess: () => resolve({ ok: true }),
          onError: (e) => resolve({ ok: false, err: String(e) }),
        });
      });
      out({ event: 'poked', id: writ, ...result });
    } else if (cmd.scry) {
      try {
        out({ event: 'scried', value: await api.scry(cmd.scry) });
      } catch (r) {
        out({ event: 'scried', status: r.status });
      }
    } else if (cmd.quit) {
      process.exit(0);
    }
  }
}

main().catch((e) => {
  out({ event: 'fatal', error: String((e && e.stack) || e) });
  process.exit(1);
});
