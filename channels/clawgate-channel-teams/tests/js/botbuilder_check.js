// Microsoft's Bot Builder against the Teams simulator: its JWT validation (the code every
// botbuilder bot runs on an inbound activity) on what the simulator POSTs, and its Bot
// Connector client for sends, replies in a channel thread, updates, deletes, a Teams stream and
// the simulator's errors. Talks to the Rust test over stdout: `endpoint <url>`, `validated …`,
// `result <json>`, then `done`; any failure exits non-zero with the reason on stderr.
'use strict';
const { createRequire } = require('module');
const http = require('http');
const assert = require('assert');

const req = createRequire(process.env.BOTBUILDER_MODULES + '/');
const connector = req('botframework-connector');
const { ConnectorClient, ChannelValidation, JwtTokenValidation, SimpleCredentialProvider } =
  connector;
const TokenCredentials = connector.TokenCredentials;

const appId = process.env.SIM_APP_ID;
const password = process.env.SIM_APP_PASSWORD;
const serviceUrl = process.env.SIM_SERVICE_URL;
const expected = Number(process.env.SIM_EXPECT);
const personal = process.env.SIM_PERSONAL;
const channel = process.env.SIM_CHANNEL;

// The one override Bot Builder offers for tests: where the channel's OpenID metadata is.
ChannelValidation.OpenIdMetadataEndpoint = process.env.SIM_OPENID_URL;

function out(line) {
  process.stdout.write(line + '\n');
}

function fail(why) {
  process.stderr.write(String(why && why.stack ? why.stack : why) + '\n');
  process.exit(1);
}

const received = [];

async function validate(activity, header) {
  const credentials = new SimpleCredentialProvider(appId, '');
  const identity = await JwtTokenValidation.authenticateRequest(activity, header, credentials, '');
  assert.ok(identity.isAuthenticated, 'Bot Builder authenticates the activity');
  return identity;
}

async function refuses(activity, header, credentials, what) {
  try {
    await JwtTokenValidation.authenticateRequest(activity, header, credentials, '');
  } catch (error) {
    return String(error.message);
  }
  throw new Error('Bot Builder accepted ' + what);
}

const server = http.createServer((request, response) => {
  let body = '';
  request.on('data', (chunk) => (body += chunk));
  request.on('end', async () => {
    try {
      const activity = JSON.parse(body);
      const header = request.headers['authorization'];
      const identity = await validate(activity, header);
      received.push({ activity, header });
      out(`validated ${activity.type} ${activity.conversation.id} ${identity.getClaimValue('aud')}`);
      response.writeHead(200);
      response.end();
      if (received.length === expected) {
        server.close();
        connectorChecks().then(() => out('done'), fail);
      }
    } catch (error) {
      response.writeHead(401);
      response.end();
      fail(error);
    }
  });
});

async function token(secret) {
  const form = new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: appId,
    client_secret: secret,
    scope: 'https://api.botframework.com/.default',
  });
  const answer = await fetch(process.env.SIM_TOKEN_URL, { method: 'POST', body: form });
  return { status: answer.status, body: await answer.json() };
}

async function errorOf(promise) {
  try {
    await promise;
  } catch (error) {
    return { status: error.statusCode, code: error.code, body: error.body || error.response?.parsedBody };
  }
  throw new Error('the call succeeded');
}

async function connectorChecks() {
  // What the simulator sent holds up under tampering: another bot's app id, another service URL.
  const { activity, header } = received.find((r) => r.activity.type === 'message');
  const otherApp = await refuses(activity, header, new SimpleCredentialProvider('another-app', ''), 'another app id');
  const moved = await refuses({ ...activity, serviceUrl: 'https://evil.example/' }, header,
    new SimpleCredentialProvider(appId, ''), 'another serviceUrl');
  out('result ' + JSON.stringify({ refused: { otherApp, moved } }));

  const bad = await token('not-the-secret');
  const good = await token(password);
  assert.strictEqual(good.status, 200);
  assert.strictEqual(good.body.token_type, 'Bearer');
  const client = new ConnectorClient(new TokenCredentials(good.body.access_token), { baseUri: serviceUrl });
  const conversations = client.conversations;
  const sent = await conversations.sendToConversation(personal, { type: 'message', text: 'from bot builder' });
  // The simulator answers the second send 429 once: Bot Builder's own throttling retry honours it.
  const second = await conversations.sendToConversation(personal, { type: 'message', text: 'after a 429' });
  const root = received.find((r) => r.activity.conversation.id.startsWith(channel + ';messageid='));
  const thread = root.activity.conversation.id;
  const reply = await conversations.replyToActivity(thread, root.activity.id, {
    type: 'message', text: 'a reply in the thread', replyToId: root.activity.id,
  });
  await conversations.updateActivity(personal, sent.id, { type: 'message', id: sent.id, text: 'edited by bot builder' });
  await conversations.deleteActivity(personal, second.id);
  const stream = await conversations.sendToConversation(personal, {
    type: 'typing', text: 'Thinking',
    entities: [{ type: 'streaminfo' }],
    // Bot Builder's serializer keeps only the entity fields it models: the stream's ride in
    // channelData, as Teams' own libraries send them.
    channelData: { streamType: 'informative', streamSequence: 1 },
  });
  await conversations.sendToConversation(personal, {
    type: 'typing', text: 'The answer', entities: [{ type: 'streaminfo' }],
    channelData: { streamId: stream.id, streamType: 'streaming', streamSequence: 2 },
  });
  const final = await conversations.sendToConversation(personal, {
    type: 'message', text: 'The answer is 42.', entities: [{ type: 'streaminfo' }],
    channelData: { streamId: stream.id, streamType: 'final' },
  });
  const completed = await errorOf(conversations.sendToConversation(personal, {
    type: 'message', text: 'again', entities: [{ type: 'streaminfo' }],
    channelData: { streamId: stream.id, streamType: 'final' },
  }));
  const missing = await errorOf(conversations.sendToConversation('a:no-such-chat', { type: 'message', text: 'x' }));
  const unauthenticated = await errorOf(
    new ConnectorClient(new TokenCredentials('forged'), { baseUri: serviceUrl })
      .conversations.sendToConversation(personal, { type: 'message', text: 'x' }));
  out('result ' + JSON.stringify({
    bad_token: bad, sent: sent.id, second: second.id, reply: reply.id, stream: stream.id,
    final: final.id, completed, missing, unauthenticated,
  }));
}

server.listen(0, '127.0.0.1', () => out(`endpoint http://127.0.0.1:${server.address().port}/api/messages`));
setTimeout(() => fail('timed out'), 60000).unref();
