// The cross-check with a client written by others: nostr-tools (pinned by `cargo xtask setup`)
// opens the gift wrap the channel sent and writes a NIP-17 DM back. Input on stdin, one JSON
// object: {"person_sk": hex, "channel_pk": hex, "wrap": <event>, "reply": text}. Output on
// stdout: {"opened": <rumor>, "dm": <gift wrap event for the channel>}.
import { readFileSync } from 'node:fs';

import * as nip17 from 'nostr-tools/nip17';
import * as nip59 from 'nostr-tools/nip59';
import { verifyEvent } from 'nostr-tools/pure';

const input = JSON.parse(readFileSync(0, 'utf8'));
const personSk = Uint8Array.from(Buffer.from(input.person_sk, 'hex'));
if (!verifyEvent(input.wrap)) throw new Error('the gift wrap does not verify');
if (input.wrap.kind !== 1059) throw new Error(`kind ${input.wrap.kind}, not a gift wrap`);
const opened = nip59.unwrapEvent(input.wrap, personSk);
const dm = nip17.wrapEvent(personSk, { publicKey: input.channel_pk }, input.reply);
process.stdout.write(JSON.stringify({ opened, dm }));
