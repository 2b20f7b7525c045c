//! An upgrade from the release that kept channel evidence in files in the state directory, for
//! every channel kind that kept any: the real binary starts on a state directory holding that
//! release's files, each in the format its kind's import reads, with one account of each kind in
//! one configuration. Each channel imports its files into state.db (`channel_records` /
//! `channel_values`, under its kind and account) once, while it is built, and renames them
//! `<name>.imported`. No platform is needed for that: every import runs before, or whatever
//! comes of, the channel's first platform call, so every channel points at a loopback port
//! nothing listens on.
//!
//! - discord, account `support`: `discord-discord-support-session.json` → value
//!   `gateway-session`;
//! - imessage: `imessage-sends.jsonl` → book `imessage-sends`;
//! - line, account `shop`: `line-shop.reply-journal` → book `reply-journal`;
//! - matrix: `matrix-sync-start` → value `sync-start`;
//! - mattermost, account `team`: `mattermost-mattermost-team-socket.json` → value `websocket`;
//! - nextcloud, account `office`: the directory `nextcloud-office.talk`
//!   (`talk-attempts.jsonl`, `talk-start.json`) → book `talk-attempts`, value `talk-start`;
//! - nostr: `nostr-<public key hex>.checkpoint` → value `checkpoint`;
//! - qq: `active-sends.jsonl` → books `active-sends` and `active-quota`;
//! - teams: `teams-conversations.json` → values `reference/<conversation id>`;
//! - telegram: `telegram-chat-migrations.json` → book `chat-migrations`;
//! - tlon: `participated-threads` → book `participated-threads`; `eyre-channel.json` → value
//!   `eyre-channel`;
//! - whatsapp: `whatsapp-statuses.jsonl` → book `statuses`;
//! - zalo: `zalo-tokens.json` → value `tokens`; `zalo-sends.jsonl` → book `sends`;
//! - zalo-personal: `zalo-personal-sends.jsonl` → book `zalo-personal-sends`.
//!
//! (Feishu, Google Chat, IRC, QA, Signal, Slack, Synology Chat and Twitch kept nothing there.)
//! Four named accounts check that the files named after the channel are found under
//! `<kind>-<account>`. A second WhatsApp number and a second Zalo OA read the send books that
//! release named the same for every account: each account imports them, and they are set aside
//! once, after both. The files hold what the import must leave out as well: a refused LINE
//! reply, torn last lines, a Nextcloud attempt older than the two weeks it keeps and a temporary
//! file beside it.
//!
//! The store must then hold exactly the records and values the files say, and nothing more;
//! each file is renamed `<name>.imported` with its bytes intact. A gateway SIGKILLed right after
//! start, and started again, imports nothing twice (same rows, same sequence numbers and
//! versions, no `.imported.2`). A gateway aborted at each durable write of its start (the crash
//! hook `CLAWGATE_CRASH_AT=write:N:after`: stored, the import not told) and started again ends
//! with the same single copy of everything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clawgate_channel_nostr::testing::Keys;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{BIN, GatewayProcess};

/// One secret for every variable the channels read (each kind checks only its own shape).
const SECRET: &str = "upgrade-test-secret-0123456789-0123456789-abcdef";
const TELEGRAM_TOKEN: &str = "123456789:AAupgrade-test-token";
const ZALO_REFRESH: &str = "zalo-refresh-token-configured-before-the-upgrade";
const ZALO_COOKIE: &str = "zpw_sek=upgrade-sek; zpsid=zupgrade";

/// Where a row lives in a kind's account state.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Record { book: String, key: String },
    Value { name: String },
}

/// (kind, account, slot).
type RowKey = (String, String, Slot);

fn record(kind: &str, account: &str, book: &str, key: &str) -> RowKey {
    (
        kind.to_owned(),
        account.to_owned(),
        Slot::Record {
            book: book.to_owned(),
            key: key.to_owned(),
        },
    )
}

fn value(kind: &str, account: &str, name: &str) -> RowKey {
    (
        kind.to_owned(),
        account.to_owned(),
        Slot::Value {
            name: name.to_owned(),
        },
    )
}

/// The earlier release's state directory, and what the store holds once it is imported.
struct Fixture {
    /// Files to write: the kind that imports it, its path in the state directory, its bytes.
    files: Vec<(&'static str, String, Vec<u8>)>,
    /// The names the imports set aside (top-level files and directories), and their kinds.
    legacy: BTreeMap<String, &'static str>,
    /// Every channel row the store must hold after the import, and only those.
    expected: BTreeMap<RowKey, Value>,
    /// Rows the channels keep live besides the import (present, their content their own): the
    /// second Zalo OA's token chain, seeded from its configured token and refreshed against
    /// the platform nothing serves.
    live: BTreeSet<RowKey>,
    /// The Nostr key's secret (its public key names the checkpoint file).
    nostr_secret: String,
    /// A loopback port nothing listens on: every platform's address.
    dead: u16,
    /// The webhook listeners' ports.
    listen: [u16; 8],
}

fn jsonl(lines: &[Value]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms fit")
}

impl Fixture {
    fn new() -> Fixture {
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port;
        let dead = port();
        let now = now_ms();
        let hour_ago = now - 3_600_000;
        let mut files: Vec<(&str, String, String)> = Vec::new();
        let mut expected = BTreeMap::new();

        // Discord: the Gateway session to resume (its resume URL kept on loopback).
        let session = json!({
            "session_id": "9f1c2e3d4b5a69788796a5b4c3d2e1f0",
            "resume_gateway_url": format!("ws://127.0.0.1:{dead}/?v=10&encoding=json"),
            "seq": 4187,
        });
        files.push((
            "discord",
            "discord-discord-support-session.json".into(),
            session.to_string(),
        ));
        expected.insert(value("discord", "support", "gateway-session"), session);

        // iMessage: the send journal, one answered send, one whose answer was lost, a torn line.
        let (k1, k2) = ("imessage:reply:evt-41:0#0", "imessage:reply:evt-42:0#0");
        let mut journal = jsonl(&[
            json!({"t": "attempt", "key": k1, "chat": "iMessage;-;+15551230001",
                   "text": "Your table for two is booked for 8 pm.",
                   "temp_guid": "temp-7c1f0a2e", "at_ms": hour_ago}),
            json!({"t": "answered", "key": k1, "guid": "5B8F6C52-9A0E-4B0D-8C47-1F3E2D7A9B10"}),
            json!({"t": "attempt", "key": k2, "chat": "iMessage;-;+15551230002",
                   "text": "See you tomorrow.", "temp_guid": "temp-3d9b44c1",
                   "at_ms": hour_ago + 5_000}),
        ]);
        journal.push_str(r#"{"t":"attempt","key":"imessage:reply:evt-43:0#0","chat":"iMess"#);
        files.push(("imessage", "imessage-sends.jsonl".into(), journal));
        let book = "imessage-sends";
        expected.insert(
            record("imessage", "default", book, &format!("attempt:{k1}")),
            json!({"t": "attempt", "chat": "iMessage;-;+15551230001",
                   "text": "Your table for two is booked for 8 pm.",
                   "temp_guid": "temp-7c1f0a2e", "at_ms": hour_ago}),
        );
        expected.insert(
            record(
                "imessage",
                "default",
                book,
                "taken:5B8F6C52-9A0E-4B0D-8C47-1F3E2D7A9B10",
            ),
            json!({"t": "taken", "key": k1}),
        );
        expected.insert(
            record("imessage", "default", book, &format!("guid:{k1}")),
            json!({"t": "guid", "guid": "5B8F6C52-9A0E-4B0D-8C47-1F3E2D7A9B10",
                   "temp_guid": "temp-7c1f0a2e"}),
        );
        expected.insert(
            record("imessage", "default", book, &format!("attempt:{k2}")),
            json!({"t": "attempt", "chat": "iMessage;-;+15551230002",
                   "text": "See you tomorrow.", "temp_guid": "temp-3d9b44c1",
                   "at_ms": hour_ago + 5_000}),
        );

        // LINE (account `shop`): started replies; `!` marks one LINE refused (nothing sent).
        files.push((
            "line",
            "line-shop.reply-journal".into(),
            "line:reply:Ue1a2b3c4:0#0\nline:reply:Ue5f6a7b8:0#0\n!line:reply:Ue5f6a7b8:0#0\n\
             line:reply:Ue9c0d1e2:0#0\n"
                .into(),
        ));
        for key in ["line:reply:Ue1a2b3c4:0#0", "line:reply:Ue9c0d1e2:0#0"] {
            expected.insert(
                record("line", "shop", "reply-journal", &format!("start:1:{key}")),
                json!({}),
            );
        }

        // Matrix: the account's first /sync token.
        files.push((
            "matrix",
            "matrix-sync-start".into(),
            "s72594_4483_1934_1_44_1_1_17_1\n".into(),
        ));
        expected.insert(
            value("matrix", "default", "sync-start"),
            json!("s72594_4483_1934_1_44_1_1_17_1"),
        );

        // Mattermost (account `team`): the WebSocket connection to resume.
        let socket = json!({
            "connection_id": "8pyn5x9q7tgc3rwd1zjzj1ohyw", "sequence_number": 57,
            "create_at": hour_ago, "refetch_owed": false,
        });
        files.push((
            "mattermost",
            "mattermost-mattermost-team-socket.json".into(),
            socket.to_string(),
        ));
        expected.insert(value("mattermost", "team", "websocket"), socket);

        // Nextcloud Talk (account `office`, user mode): a directory with the attempt journal
        // (one attempt too old to keep, a torn line) and the poller's start, and a temporary
        // file the earlier release left.
        let reference = "6f1e0c5d2b7a4e3f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f";
        let mut attempts = jsonl(&[
            json!({"ref": "0000-too-old", "token": "k3vq8x2z", "at": now - 15 * 24 * 3_600_000}),
            json!({"ref": reference, "token": "k3vq8x2z", "at": hour_ago}),
        ]);
        attempts.push_str(r#"{"ref":"torn","tok"#);
        files.push((
            "nextcloud",
            "nextcloud-office.talk/talk-attempts.jsonl".into(),
            attempts,
        ));
        files.push((
            "nextcloud",
            "nextcloud-office.talk/talk-start.json".into(),
            json!({"after": 18234}).to_string(),
        ));
        files.push((
            "nextcloud",
            "nextcloud-office.talk/talk-start.json.tmp".into(),
            json!({"after": 99999}).to_string(),
        ));
        expected.insert(
            record("nextcloud", "office", "talk-attempts", reference),
            json!({"token": "k3vq8x2z", "atMs": hour_ago}),
        );
        expected.insert(
            value("nextcloud", "office", "talk-start"),
            json!({"after": 18234}),
        );

        // Nostr: the feed's checkpoint (seconds), in a file named by the public key.
        let keys = Keys::generate();
        let checkpoint_file = format!("nostr-{}.checkpoint", keys.public_key().to_hex());
        files.push(("nostr", checkpoint_file.clone(), "1796600000\n".into()));
        expected.insert(
            value("nostr", "default", "checkpoint"),
            json!(1_796_600_000),
        );

        // QQ: active messages (answered; answer lost), a passive reply with its chosen target
        // and id, a torn line.
        let (a1, a2, p1) = (
            "qq:reply:c2c-7781:0#0",
            "qq:reply:c2c-7782:0#0",
            "qq:reply:grp-3301:0#0",
        );
        let user = "user:E3C0A4B7F2D94E1A";
        let mut active = jsonl(&[
            json!({"key": a1, "target": user, "month": "2026-12", "id": "ROBOT1.0_active-1"}),
            json!({"key": a2, "target": user, "month": "2026-12"}),
            json!({"key": p1, "target": "group:9B2D", "month": "2026-12", "passive": true,
                   "reply_to": "MSG-GRP-77", "id": "ROBOT1.0_passive-1"}),
        ]);
        active.push_str(r#"{"key":"qq:reply:c2c-7783:0#0","target":"us"#);
        files.push(("qq", "active-sends.jsonl".into(), active));
        let sends = "active-sends";
        expected.insert(
            record("qq", "default", sends, &format!("attempt:{a1}")),
            json!({"target": user, "month": "2026-12", "slot": 0}),
        );
        expected.insert(
            record("qq", "default", sends, &format!("answered:{a1}")),
            json!({"id": "ROBOT1.0_active-1"}),
        );
        expected.insert(
            record("qq", "default", sends, &format!("attempt:{a2}")),
            json!({"target": user, "month": "2026-12", "slot": 1}),
        );
        expected.insert(
            record("qq", "default", sends, &format!("chosen:{p1}")),
            json!({"msgId": "MSG-GRP-77"}),
        );
        expected.insert(
            record("qq", "default", sends, &format!("passive:{p1}")),
            json!({"id": "ROBOT1.0_passive-1"}),
        );
        for (n, key) in [a1, a2].into_iter().enumerate() {
            expected.insert(
                record(
                    "qq",
                    "default",
                    "active-quota",
                    &format!("2026-12/{user}/{n}"),
                ),
                json!({"key": key}),
            );
        }

        // Teams: the conversation references (where each conversation's replies go).
        let references = json!({
            "a:1Xq3mPz9LkVb0Tc7": {"service_url": "https://smba.trafficmanager.net/emea/",
                                   "conversation_type": "personal"},
            "19:8b1c44f0e2d14c9a@thread.tacv2": {
                "service_url": "https://smba.trafficmanager.net/amer/",
                "conversation_type": "channel"},
        });
        files.push((
            "teams",
            "teams-conversations.json".into(),
            references.to_string(),
        ));
        for (conversation, reference) in references.as_object().expect("object") {
            expected.insert(
                value("teams", "default", &format!("reference/{conversation}")),
                reference.clone(),
            );
        }

        // Telegram: groups upgraded to supergroups.
        let moves = json!({"-987654321": "-1001987654321", "-123456789": "-1001123456789"});
        files.push((
            "telegram",
            "telegram-chat-migrations.json".into(),
            moves.to_string(),
        ));
        for (from, to) in moves.as_object().expect("object") {
            expected.insert(
                record("telegram", "default", "chat-migrations", from),
                to.clone(),
            );
        }

        // Tlon: the threads we replied in (a line without a thread is not one), and the Eyre
        // channel the feed reads.
        let threads = [
            "chat/~zod/general 170.141.184.506.851.484.294.137.253.093.920.382.976",
            "chat/~bus/support 170.141.184.506.851.500.000.000.000.000.000.000.001",
        ];
        files.push((
            "tlon",
            "participated-threads".into(),
            format!("{}\n{}\nnot-a-thread\n", threads[0], threads[1]),
        ));
        for thread in threads {
            expected.insert(
                record("tlon", "default", "participated-threads", thread),
                json!({}),
            );
        }
        let channel = json!({
            "uid": "clawgate-tlon-feed-1796000000000-abcd1234",
            "subscriptions": {"1": ["chat", "/v3"], "2": ["channels", "/v4"]},
            "next_id": 3,
        });
        files.push(("tlon", "eyre-channel.json".into(), channel.to_string()));
        expected.insert(value("tlon", "default", "eyre-channel"), channel);

        // WhatsApp: one line per change of a key's evidence, the last one holding it all.
        let (w1, w2) = (
            "whatsapp:reply:wamid.HBgLMTU1NTEyMzAwMDEVAgASGBQ:0#0",
            "whatsapp:reply:wamid.HBgLMTU1NTEyMzAwMDIVAgASGBQ:0#0",
        );
        files.push((
            "whatsapp",
            "whatsapp-statuses.jsonl".into(),
            jsonl(&[
                json!({"key": w1, "attempted": true, "wamid": null, "accepted": false,
                       "failed_codes": []}),
                json!({"key": w1, "attempted": true, "wamid": "wamid.OUT1", "accepted": true,
                       "failed_codes": []}),
                json!({"key": w2, "attempted": true, "wamid": "wamid.OUT2", "accepted": false,
                       "failed_codes": [131026]}),
            ]),
        ));
        expected.insert(
            record(
                "whatsapp",
                "default",
                "statuses",
                &format!("attempted:{w1}"),
            ),
            json!({"t": "attempted"}),
        );
        expected.insert(
            record("whatsapp", "default", "statuses", &format!("accepted:{w1}")),
            json!({"t": "accepted", "wamid": "wamid.OUT1"}),
        );
        expected.insert(
            record(
                "whatsapp",
                "default",
                "statuses",
                &format!("attempted:{w2}"),
            ),
            json!({"t": "attempted"}),
        );
        expected.insert(
            record("whatsapp", "default", "statuses", &format!("failed:{w2}")),
            json!({"t": "failed", "wamid": "wamid.OUT2", "codes": [131026]}),
        );

        // Zalo OA: the token chain grown from the configured refresh token (its access token
        // good for two more days: the start refreshes nothing), and the send book.
        let seeded_from: String = Sha256::digest(ZALO_REFRESH.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let expires = now + 48 * 3_600_000;
        files.push((
            "zalo",
            "zalo-tokens.json".into(),
            json!({"access_token": "zalo-access-legacy", "access_expires_at_ms": expires,
                   "refresh_token": "zalo-refresh-rotated-7", "seeded_from": seeded_from})
            .to_string(),
        ));
        expected.insert(
            value("zalo", "default", "tokens"),
            json!({"access_token": "zalo-access-legacy", "access_expires_at_ms": expires,
                   "refresh_token": "zalo-refresh-rotated-7", "seeded_from": seeded_from,
                   "refreshing_since_ms": null}),
        );
        let (z1, z2) = ("zalo:reply:ev-5521:0#0", "zalo:reply:ev-5522:0#0");
        let mut book = jsonl(&[
            json!({"t": "attempt", "key": z1, "user_id": "8490000000000400001",
                   "text": "Đơn hàng của bạn đã được gửi.", "at_ms": hour_ago}),
            json!({"t": "echo", "msg_id": "msg-af31", "user_id": "8490000000000400001",
                   "text": "Đơn hàng của bạn đã được gửi.", "at_ms": hour_ago + 900}),
            json!({"t": "answered", "key": z1, "msg_id": "msg-af31"}),
            json!({"t": "attempt", "key": z2, "user_id": "8490000000000400002",
                   "text": "Cảm ơn!", "at_ms": hour_ago + 60_000}),
        ]);
        book.push_str(r#"{"t":"echo","msg_id":"msg-b"#);
        files.push(("zalo", "zalo-sends.jsonl".into(), book));
        expected.insert(
            record("zalo", "default", "sends", &format!("attempt:{z1}")),
            json!({"t": "attempt", "user_id": "8490000000000400001",
                   "text": "Đơn hàng của bạn đã được gửi.", "at_ms": hour_ago}),
        );
        expected.insert(
            record("zalo", "default", "sends", "echo:msg-af31"),
            json!({"t": "echo", "user_id": "8490000000000400001",
                   "text": "Đơn hàng của bạn đã được gửi.", "at_ms": hour_ago + 900}),
        );
        expected.insert(
            record("zalo", "default", "sends", &format!("answered:{z1}")),
            json!({"t": "answered", "msg_id": "msg-af31"}),
        );
        expected.insert(
            record("zalo", "default", "sends", "claimed:msg-af31"),
            json!({"t": "claimed", "key": z1}),
        );
        expected.insert(
            record("zalo", "default", "sends", &format!("attempt:{z2}")),
            json!({"t": "attempt", "user_id": "8490000000000400002", "text": "Cảm ơn!",
                   "at_ms": hour_ago + 60_000}),
        );

        // Zalo Personal: attempts by clientId, an answer, and an echo settling the other one.
        let (p_1, p_2) = (
            "zalo-personal:reply:7301:0#0",
            "zalo-personal:reply:7302:0#0",
        );
        files.push((
            "zalo-personal",
            "zalo-personal-sends.jsonl".into(),
            jsonl(&[
                json!({"t": "attempt", "key": p_1, "client_id": 1_796_600_000_123_u64,
                       "at_ms": hour_ago}),
                json!({"t": "answered", "key": p_1, "msg_id": "7301234567890"}),
                json!({"t": "attempt", "key": p_2, "client_id": 1_796_600_000_456_u64,
                       "at_ms": hour_ago + 2_000}),
                json!({"t": "echo", "client_id": 1_796_600_000_456_u64,
                       "msg_id": "7301234567999"}),
            ]),
        ));
        let zp = "zalo-personal-sends";
        expected.insert(
            record("zalo-personal", "default", zp, "client:1796600000123"),
            json!({"key": p_1, "at_ms": hour_ago}),
        );
        expected.insert(
            record("zalo-personal", "default", zp, &format!("attempt:{p_1}")),
            json!({"at_ms": hour_ago}),
        );
        expected.insert(
            record("zalo-personal", "default", zp, &format!("answered:{p_1}")),
            json!({"msg_id": "7301234567890"}),
        );
        expected.insert(
            record("zalo-personal", "default", zp, "client:1796600000456"),
            json!({"key": p_2, "at_ms": hour_ago + 2_000}),
        );
        expected.insert(
            record("zalo-personal", "default", zp, &format!("attempt:{p_2}")),
            json!({"at_ms": hour_ago + 2_000}),
        );
        expected.insert(
            record("zalo-personal", "default", zp, &format!("echo:{p_2}")),
            json!({"msg_id": "7301234567999"}),
        );

        // A second WhatsApp number and a second Zalo OA: the release named those send books
        // the same for every account, so a file may hold evidence of either, and each account
        // imports all of it (another account's keys are inert in its book). The Zalo token
        // file stays the first OA's: its chain grew from that OA's configured token.
        let shared: Vec<(RowKey, Value)> = expected
            .iter()
            .filter(|((kind, account, slot), _)| {
                account == "default"
                    && (kind == "whatsapp" || kind == "zalo" && matches!(slot, Slot::Record { .. }))
            })
            .map(|((kind, _, slot), v)| {
                ((kind.clone(), "second".to_owned(), slot.clone()), v.clone())
            })
            .collect();
        expected.extend(shared);
        let legacy = files
            .iter()
            .map(|(kind, path, _)| (path.split('/').next().unwrap_or(path).to_owned(), *kind))
            .collect();
        Fixture {
            files: files
                .into_iter()
                .map(|(kind, path, text)| (kind, path, text.into_bytes()))
                .collect(),
            legacy,
            expected,
            live: BTreeSet::from([value("zalo", "second", "tokens")]),
            nostr_secret: keys.secret_key().to_secret_hex(),
            dead,
            listen: std::array::from_fn(|_| port()),
        }
    }

    /// The rows of `state` the import wrote (the live ones left out), with their sequence
    /// numbers and versions.
    fn imported_rows(&self, state: &Path) -> BTreeMap<RowKey, (Value, i64)> {
        stored(state)
            .into_iter()
            .filter(|(key, _)| !self.live.contains(key))
            .collect()
    }

    /// Writes the earlier release's state directory at `state`.
    fn write(&self, state: &Path) {
        for (_, path, bytes) in &self.files {
            let path = state.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("directory");
            std::fs::write(&path, bytes).expect("legacy file written");
        }
    }

    /// The kinds whose files the fixture holds.
    fn kinds(&self) -> BTreeSet<String> {
        self.expected
            .keys()
            .map(|(kind, _, _)| kind.clone())
            .collect()
    }

    /// The gateway's names of the channels (`<kind>`, or `<kind>-<account>`).
    fn channels(&self) -> BTreeSet<String> {
        self.expected
            .keys()
            .map(|(kind, account, _)| {
                if account == "default" {
                    kind.clone()
                } else {
                    format!("{kind}-{account}")
                }
            })
            .collect()
    }

    /// The environment of a gateway configured by [`Fixture::config`].
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("E2E_UPGRADE_SECRET", SECRET.to_owned()),
            ("E2E_UPGRADE_TELEGRAM_TOKEN", TELEGRAM_TOKEN.to_owned()),
            ("E2E_UPGRADE_ZALO_REFRESH", ZALO_REFRESH.to_owned()),
            ("E2E_UPGRADE_ZALO_COOKIE", ZALO_COOKIE.to_owned()),
            ("E2E_UPGRADE_NOSTR_KEY", self.nostr_secret.clone()),
            ("CLAWGATE_LOG", "info".to_owned()),
        ]
    }

    /// A gateway configuration in `dir` with an account of every kind the fixture holds files
    /// of, each on a platform address nothing listens on; the webhook listeners on ports of
    /// their own.
    fn config(&self, dir: &Path) -> PathBuf {
        let dead = format!("http://127.0.0.1:{}", self.dead);
        let mut ports = self.listen.iter();
        let mut port = || *ports.next().expect("a listener port");
        let s = "E2E_UPGRADE_SECRET";
        let channels = [
            (
                "discord",
                "support",
                format!("api_base = \"{dead}\", token_env = \"{s}\""),
            ),
            (
                "imessage",
                "default",
                format!(
                    "server_url = \"{dead}\", password_env = \"{s}\", webhook_token_env = \"{s}\", \
                     webhook_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "line",
                "shop",
                format!(
                    "api_base = \"{dead}\", token_env = \"{s}\", channel_secret_env = \"{s}\", \
                     webhook_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "matrix",
                "default",
                format!(
                    "homeserver_url = \"{dead}\", user_id = \"@clawgate:example.org\", \
                     token_env = \"{s}\", poll_timeout_s = 1"
                ),
            ),
            (
                "mattermost",
                "team",
                format!("url = \"{dead}\", token_env = \"{s}\""),
            ),
            (
                "nextcloud",
                "office",
                format!(
                    "base_url = \"{dead}\", mode = \"user\", user = \"clawgate\", \
                     app_password_env = \"{s}\", poll_timeout_s = 5"
                ),
            ),
            (
                "nostr",
                "default",
                format!(
                    "secret_key_env = \"E2E_UPGRADE_NOSTR_KEY\", relays = [\"{}\"], \
                     connect_wait_ms = 500, reconnect_ms = 1000",
                    dead.replace("http://", "ws://")
                ),
            ),
            (
                "qq",
                "default",
                format!(
                    "app_id = \"102000001\", secret_env = \"{s}\", api_base = \"{dead}\", \
                     token_base = \"{dead}\", callback_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "teams",
                "default",
                format!(
                    "app_id = \"5f0c2a8e-1b3d-4c6f-9a7e-2d4b6c8e0f1a\", \
                     app_password_env = \"{s}\", listen = \"127.0.0.1:{}\", \
                     token_url = \"{dead}/token\", openid_url = \"{dead}/openid\"",
                    port()
                ),
            ),
            (
                "telegram",
                "default",
                format!(
                    "token_env = \"E2E_UPGRADE_TELEGRAM_TOKEN\", api_base = \"{dead}\", \
                     poll_timeout_s = 1"
                ),
            ),
            (
                "tlon",
                "default",
                format!("url = \"{dead}\", ship = \"~zod\", code_env = \"{s}\""),
            ),
            (
                "whatsapp",
                "default",
                format!(
                    "token_env = \"{s}\", app_secret_env = \"{s}\", verify_token_env = \"{s}\", \
                     phone_number_id = \"109876543210987\", api_base = \"{dead}\", \
                     webhook_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "zalo",
                "default",
                format!(
                    "app_id = \"4318000000000000001\", app_secret_env = \"{s}\", \
                     oa_secret_key_env = \"{s}\", \
                     refresh_token_env = \"E2E_UPGRADE_ZALO_REFRESH\", \
                     api_base = \"{dead}\", oauth_base = \"{dead}\", \
                     webhook_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "whatsapp",
                "second",
                format!(
                    "token_env = \"{s}\", app_secret_env = \"{s}\", verify_token_env = \"{s}\", \
                     phone_number_id = \"109876543210988\", api_base = \"{dead}\", \
                     webhook_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "zalo",
                "second",
                format!(
                    "app_id = \"4318000000000000002\", app_secret_env = \"{s}\", \
                     oa_secret_key_env = \"{s}\", refresh_token_env = \"{s}\", \
                     api_base = \"{dead}\", oauth_base = \"{dead}\", \
                     webhook_listen = \"127.0.0.1:{}\"",
                    port()
                ),
            ),
            (
                "zalo-personal",
                "default",
                format!(
                    "cookie_env = \"E2E_UPGRADE_ZALO_COOKIE\", imei_env = \"{s}\", \
                     user_agent = \"Mozilla/5.0 (X11; Linux x86_64)\", login_base = \"{dead}\""
                ),
            ),
        ];
        let mut text = format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
             [[agents]]\nid = \"main\"\ncommand = [{:?}, \"demo-agent\"]\n\n",
            BIN
        );
        for (kind, account, settings) in channels {
            // Nostr's relays answer over open sockets: it has no request timeout.
            let timeout = if kind == "nostr" {
                "answer_timeout_ms"
            } else {
                "request_timeout_ms"
            };
            text.push_str(&format!(
                "[[channels]]\nkind = \"{kind}\"\naccount = \"{account}\"\n\
                 settings = {{ {settings}, {timeout} = 2000 }}\n\n"
            ));
        }
        let path = dir.join("clawgate.toml");
        std::fs::write(&path, text).expect("config written");
        path
    }
}

/// Every channel row of a state directory, with its sequence number (records) or version
/// (values): two reads are equal only if nothing was appended or written in between.
fn stored(state: &Path) -> BTreeMap<RowKey, (Value, i64)> {
    let mut rows = BTreeMap::new();
    if !state.join("state.db").exists() {
        return rows;
    }
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("state.db");
    for (query, is_record) in [
        (
            "SELECT kind, account, book, key, value, seq FROM channel_records",
            true,
        ),
        (
            "SELECT kind, account, name, '', value, version FROM channel_values",
            false,
        ),
    ] {
        let mut statement = db.prepare(query).expect("query");
        let found = statement
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, i64>(5)?,
                ))
            })
            .expect("rows");
        for row in found {
            let (kind, account, name, key, text, n) = row.expect("row");
            let slot = if is_record {
                Slot::Record { book: name, key }
            } else {
                Slot::Value { name }
            };
            let json = serde_json::from_str(&text).expect("a stored JSON value");
            rows.insert((kind, account, slot), (json, n));
        }
    }
    rows
}

/// The store holds exactly the fixture's rows, under their kinds and accounts, and every file
/// is set aside once, as `<name>.imported` with its bytes.
fn assert_imported_once(state: &Path, fixture: &Fixture, when: &str) {
    let rows: BTreeMap<RowKey, Value> = stored(state)
        .into_iter()
        .map(|(key, (json, _))| (key, json))
        .collect();
    let mut wrong = Vec::new();
    for (key, want) in &fixture.expected {
        match rows.get(key) {
            None => wrong.push(format!("missing {key:?} = {want}")),
            Some(got) if got != want => wrong.push(format!("{key:?} is {got}, not {want}")),
            Some(_) => {}
        }
    }
    for key in &fixture.live {
        if !rows.contains_key(key) {
            wrong.push(format!("missing {key:?}"));
        }
    }
    for (key, got) in &rows {
        if !fixture.expected.contains_key(key) && !fixture.live.contains(key) {
            wrong.push(format!("unexpected {key:?} = {got}"));
        }
    }
    for kind in fixture.kinds() {
        if !rows.keys().any(|(k, _, _)| *k == kind) {
            wrong.push(format!("nothing stored under kind {kind}"));
        }
    }
    for name in fixture.legacy.keys() {
        if state.join(name).exists() {
            wrong.push(format!("{name} is still there"));
        }
        if state.join(format!("{name}.imported.2")).exists() {
            wrong.push(format!("{name} was set aside twice ({name}.imported.2)"));
        }
    }
    for (_, path, bytes) in &fixture.files {
        let (top, rest) = path
            .split_once('/')
            .map_or((path.as_str(), None), |(t, r)| (t, Some(r)));
        let mut retired = state.join(format!("{top}.imported"));
        if let Some(rest) = rest {
            retired = retired.join(rest);
        }
        match std::fs::read(&retired) {
            Ok(kept) if kept == *bytes => {}
            Ok(_) => wrong.push(format!(
                "{} does not hold {path}'s bytes",
                retired.display()
            )),
            Err(e) => wrong.push(format!(
                "{path} was not set aside as {}: {e}",
                retired.display()
            )),
        }
    }
    assert!(
        wrong.is_empty(),
        "{when}: the import of the earlier release's files is wrong:\n  {}",
        wrong.join("\n  ")
    );
}

fn start(
    state: &Path,
    config: &Path,
    fixture: &Fixture,
    extra: &[(&str, &str)],
) -> Result<GatewayProcess, String> {
    let env = fixture.env();
    let mut pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    pairs.extend_from_slice(extra);
    GatewayProcess::try_start(state, config, &pairs)
}

#[test]
fn every_kinds_files_of_the_file_keeping_release_are_imported_once_and_set_aside() {
    let fixture = Fixture::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    fixture.write(&state);
    let config = fixture.config(dir.path());

    // The imports are done when the gateway prints its address (each runs while its channel is
    // built); a SIGKILL right then runs no shutdown code.
    let first = start(&state, &config, &fixture, &[]).unwrap_or_else(|why| panic!("{why}"));
    first.kill_hard();
    assert_imported_once(&state, &fixture, "after the first start (SIGKILLed)");
    let imported = fixture.imported_rows(&state);

    // A second start finds only the set-aside copies: it imports nothing, appends nothing,
    // writes no value, renames nothing again, and runs and stops cleanly.
    let mut second = start(&state, &config, &fixture, &[]).unwrap_or_else(|why| panic!("{why}"));
    // Long enough for every feed to try its platform (and fail) a few times.
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(second.exited().is_none(), "the second start keeps running");
    for channel in fixture.channels() {
        assert!(
            second.printed(&format!("channel {channel}:")),
            "the second start runs channel {channel}: {:?}",
            second.stdout.lock().expect("lines")
        );
    }
    assert!(
        second.interrupt().success(),
        "the second start stops cleanly"
    );
    assert_imported_once(&state, &fixture, "after the second start");
    assert_eq!(
        fixture.imported_rows(&state),
        imported,
        "the second start changed the imported rows (a record appended again or a value \
         written again)"
    );
}

/// The writes a clean start on the fixture commits before it prints its address.
fn writes_of_a_clean_start(fixture: &Fixture) -> u64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    fixture.write(&state);
    let config = fixture.config(dir.path());
    let counts = dir.path().join("counts.txt");
    let counts_env = counts.display().to_string();
    let gateway = start(
        &state,
        &config,
        fixture,
        &[("CLAWGATE_CRASH_COUNT", counts_env.as_str())],
    )
    .unwrap_or_else(|why| panic!("{why}"));
    let writes = std::fs::read_to_string(&counts)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with("write "))
        .count();
    gateway.kill_hard();
    assert_imported_once(&state, fixture, "the counting start");
    u64::try_from(writes).expect("count fits")
}

/// What a start aborted at write `n` left.
struct Aborted {
    n: u64,
    /// The abort came before the gateway was up.
    during_start: bool,
    /// The kinds caught between their writes and setting their files aside: some of their
    /// rows stored, some of their files still in place.
    caught: BTreeSet<&'static str>,
}

/// A fresh copy of the fixture's directory, started with an abort right after write `n`
/// commits (stored, its writer never told), then started again and checked.
fn abort_at(fixture: &Fixture, n: u64) -> Aborted {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    fixture.write(&state);
    let config = fixture.config(dir.path());
    let point = format!("write:{n}:after");
    let during_start = match start(&state, &config, fixture, &[("CLAWGATE_CRASH_AT", &point)]) {
        Err(_) => true,
        // The feeds write too: a point can fall after the start.
        Ok(gateway) => {
            gateway.kill_hard();
            false
        }
    };
    let rows = stored(&state);
    let caught = fixture
        .legacy
        .iter()
        .filter(|(name, kind)| state.join(name).exists() && rows.keys().any(|(k, _, _)| k == *kind))
        .map(|(_, kind)| *kind)
        .collect();
    let again = start(&state, &config, fixture, &[])
        .unwrap_or_else(|why| panic!("the start after {point}: {why}"));
    again.kill_hard();
    assert_imported_once(&state, fixture, &format!("restarted after {point}"));
    Aborted {
        n,
        during_start,
        caught,
    }
}

#[test]
fn a_start_aborted_at_any_write_of_the_import_ends_with_one_copy_of_everything() {
    let counted = Fixture::new();
    let writes = writes_of_a_clean_start(&counted);
    // Two at a time, each on its own directory and listener ports.
    const WORKERS: u64 = 2;
    let mut aborted: Vec<Aborted> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                scope.spawn(move || {
                    let fixture = Fixture::new();
                    // A few past the count: a start may commit a write more than the counted one.
                    (1..=writes + 4)
                        .filter(|n| n % WORKERS == w)
                        .map(|n| abort_at(&fixture, n))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a worker panicked"))
            .collect()
    });
    aborted.sort_by_key(|a| a.n);
    // Every kind's re-import ran at least once: an abort caught it with rows stored and a
    // file not yet set aside, and the start after it still ended with one copy.
    let mut caught_at: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for a in &aborted {
        for kind in &a.caught {
            caught_at.entry(kind).or_default().push(a.n);
        }
    }
    eprintln!(
        "{writes} writes, {} aborts during the start; kinds caught mid-import at writes: \
         {caught_at:?}",
        aborted.iter().filter(|a| a.during_start).count()
    );
    let missed: Vec<String> = counted
        .kinds()
        .into_iter()
        .filter(|kind| !caught_at.contains_key(kind.as_str()))
        .collect();
    assert!(
        missed.is_empty(),
        "no abort fell between the writes and the setting aside of {missed:?}"
    );
}
