//! The real binary with a Matrix account on a real Synapse (started by the test, so it
//! outlives a gateway killed with SIGKILL): a person talks to the agent in a room and sees the
//! reply stream as `m.replace` edits of one event; the random-time crash matrix, judged from
//! Synapse's own room history. Matrix sends carry a transaction id, so nothing here may be
//! left unknown: every message gets exactly one final, and no preview is left behind.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clawgate_channel_matrix::testing::{MessageLimit, Synapse, User, enc};
use serde_json::{Value, json};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
};

pub(crate) const TOKEN_ENV: &str = "E2E_MX_TOKEN";

/// A room with a person and the gateway's account, on its own Synapse (its own record is what
/// a test judges by).
pub(crate) struct SynapseRoom {
    pub(crate) synapse: Synapse,
    pub(crate) bot: User,
    person: User,
    room: String,
}

impl SynapseRoom {
    pub(crate) async fn open() -> SynapseRoom {
        SynapseRoom::open_on(Synapse::start_with(MessageLimit::RAISED).await).await
    }

    /// The room on `synapse`, a homeserver the caller configured.
    pub(crate) async fn open_on(synapse: Synapse) -> SynapseRoom {
        let bot = synapse.register("clawbot").await;
        let person = synapse.register("ada").await;
        // The person opens the room and invites the account; the channel joins on invite.
        let created = synapse
            .call(
                &person,
                reqwest::Method::POST,
                "createRoom",
                Some(json!({ "preset": "private_chat", "invite": [bot.user_id] })),
            )
            .await;
        let room = created["room_id"].as_str().expect("room id").to_owned();
        SynapseRoom {
            synapse,
            bot,
            person,
            room,
        }
    }

    /// The channel settings of the account on this Synapse, its token in [`TOKEN_ENV`].
    pub(crate) fn settings(&self) -> String {
        format!(
            "homeserver_url = \"{}\", user_id = \"{}\", token_env = \"{TOKEN_ENV}\", \
             poll_timeout_s = 1, request_timeout_ms = 5000",
            self.synapse.base, self.bot.user_id
        )
    }

    /// The person writes `text` (transaction `person-{n}`); returns the reply the agent must give.
    pub(crate) async fn say(&self, n: usize, text: &str, words: usize) -> Asked {
        let sent = self
            .synapse
            .call(
                &self.person,
                reqwest::Method::PUT,
                &format!("rooms/{}/send/m.room.message/person-{n}", enc(&self.room)),
                Some(json!({ "msgtype": "m.text", "body": text })),
            )
            .await;
        Asked {
            event_id: sent["event_id"].as_str().expect("event id").to_owned(),
            expected: demo_reply(text, words),
        }
    }

    /// The room's whole history, oldest first (Synapse's own record), page by page: a soak's
    /// room holds more events (previews and their edits) than one page.
    async fn history(&self) -> Vec<Value> {
        let mut events = Vec::new();
        let mut from = String::new();
        loop {
            let answer = self
                .synapse
                .call(
                    &self.person,
                    reqwest::Method::GET,
                    &format!("rooms/{}/messages?dir=b&limit=1000{from}", enc(&self.room)),
                    None,
                )
                .await;
            let chunk = answer["chunk"].as_array().cloned().unwrap_or_default();
            let end = answer["end"].as_str().map(str::to_owned);
            let done = chunk.is_empty() || end.is_none();
            events.extend(chunk);
            match end {
                Some(end) if !done => from = format!("&from={}", enc(&end)),
                _ => break,
            }
        }
        events.reverse();
        events
    }

    /// The account's visible messages: (event id, what it shows now), redacted ones gone and
    /// every edit applied to the event it replaces; and how many edits there were.
    async fn bot_messages(&self) -> (Vec<(String, String)>, usize) {
        let events = self.history().await;
        let mut shown: Vec<(String, String)> = Vec::new();
        let mut edits = 0;
        for event in events
            .iter()
            .filter(|e| e["type"] == "m.room.message" && e["sender"] == self.bot.user_id.as_str())
        {
            let content = &event["content"];
            if content.as_object().is_none_or(serde_json::Map::is_empty) {
                continue; // redacted
            }
            if content["m.relates_to"]["rel_type"] == "m.replace" {
                edits += 1;
                let target = content["m.relates_to"]["event_id"].as_str().unwrap_or("");
                let body = content["m.new_content"]["body"].as_str().unwrap_or("");
                if let Some(original) = shown.iter_mut().find(|(id, _)| id == target) {
                    body.clone_into(&mut original.1);
                }
                continue;
            }
            let id = event["event_id"].as_str().unwrap_or("").to_owned();
            let body = content["body"].as_str().unwrap_or("").to_owned();
            shown.push((id, body));
        }
        // An edit of a redacted preview shows nothing.
        let redacted: Vec<&str> = events
            .iter()
            .filter(|e| {
                e["content"]
                    .as_object()
                    .is_some_and(serde_json::Map::is_empty)
            })
            .filter_map(|e| e["event_id"].as_str())
            .collect();
        shown.retain(|(id, _)| !redacted.contains(&id.as_str()));
        (shown, edits)
    }
}

/// A [`SynapseRoom`] and one gateway's state directory and configuration.
struct Room {
    room: SynapseRoom,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Room {
    async fn start(agent_args: &[&str]) -> Room {
        let room = SynapseRoom::open().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let config = channel_config(dir.path(), "matrix", &room.settings(), agent_args, 100);
        Room { room, dir, config }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(TOKEN_ENV, self.room.bot.token.as_str())],
        )
    }
}

/// A message the person wrote and the final it must get.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    event_id: String,
    expected: String,
}

/// What is wrong with the room: each message needs exactly one final, nothing else shows.
pub(crate) async fn problems(room: &SynapseRoom, asked: &[Asked]) -> (usize, Vec<String>) {
    let (mut shown, _) = room.bot_messages().await;
    let mut finals = 0;
    let mut wrong = Vec::new();
    for a in asked {
        let count = shown.iter().filter(|(_, text)| *text == a.expected).count();
        match count {
            1 => finals += 1,
            n => wrong.push(format!("{}: {n} finals of {:?}", a.event_id, a.expected)),
        }
        shown.retain(|(_, text)| *text != a.expected);
    }
    wrong.extend(
        shown
            .into_iter()
            .map(|(id, text)| format!("stray {id}: {text:?}")),
    );
    (finals, wrong)
}

/// Until every message has its final (then a second more, for anything that would land
/// twice), or nothing changed for `quiet`.
pub(crate) async fn settle(room: &SynapseRoom, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let (finals, _) = problems(room, asked).await;
        if finals == asked.len() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        if finals != last.0 {
            last = (finals, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_in_a_synapse_room_sees_the_reply_stream_as_edits_and_one_final() {
    const WORDS: usize = 12;
    let room = Room::start(&["--chunk-ms", "150", "--words", "12"]).await;
    let gateway = room.gateway().expect("gateway starts");
    let mut asked = Vec::new();
    for n in 0..3 {
        asked.push(room.room.say(n, &format!("question {n}"), WORDS).await);
        settle(&room.room, &asked, Duration::from_secs(20)).await;
    }
    let (finals, wrong) = problems(&room.room, &asked).await;
    let (_, edits) = room.room.bot_messages().await;
    let status = gateway.interrupt();
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(finals, asked.len());
    assert!(
        edits >= asked.len(),
        "the previews were edited (m.replace): {edits} edits"
    );
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&room.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_matrix_account_leave_exactly_one_final_per_message() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("MATRIX", 10, 30);
    eprintln!("matrix crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let room = Room::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let mut asked = Vec::new();
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = room
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        for _ in 0..per_kill.min(count - asked.len()) {
            let n = asked.len();
            asked.push(room.room.say(n, &format!("message {n}"), WORDS).await);
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = room
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let n = asked.len();
        asked.push(room.room.say(n, &format!("message {n}"), WORDS).await);
    }
    settle(&room.room, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let (finals, wrong) = problems(&room.room, &asked).await;
    let leftovers = leftover_processes(&room.state());
    eprintln!(
        "matrix crash matrix figures: seed={seed} kills={kills} messages={} finals={finals} \
         violations={} leftovers={} seconds={:.1}",
        asked.len(),
        wrong.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !wrong.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = room.dir.keep();
        panic!(
            "matrix crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {wrong:?}; leftovers {leftovers:?}",
            kept.display()
        );
    }
}
