//! The real binary with an IRC nick on a real server (started by the test, so it outlives a
//! gateway killed with SIGKILL): the random-time crash matrix on ngircd (plain IRC, PING
//! receipts) and on InspIRCd 3 (IRCv3 echo-message + labeled-response: the labeled echo is the
//! receipt), judged from what a person in the channel — a second client — received.
//!
//! Plain IRC has no message ids, no history and no redelivery, so two outcomes are inherent
//! and allowed, each with its evidence in the state directory:
//! - a final whose line was written but whose `PONG` (or labeled echo) a kill cut off stays
//!   `unknown_after_send` (reported, never repeated): it may or may not have landed; with
//!   IRCv3 too, InspIRCd 3 has no `draft/chathistory` to look the line up by;
//! - a line the server relayed to the gateway just before a kill, before its durable inbound
//!   record, is gone: the server will not send it again. Only lines written while a kill was
//!   pending may end so; the messages of the last, unkilled run must each get their final.
//!
//! Everything else — a duplicate, a missing final without that evidence, a stray — fails.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_irc::testing::{Client, Inspircd, Ircv3, Ngircd, Penalties};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const NICK: &str = "clawbot";
const CHANNEL: &str = "#crash";
const PERSON: &str = "ada";

/// Which server the nick is on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Server {
    Ngircd,
    /// With its IRCv3 modules.
    Inspircd,
}

/// A server, a person in the channel, and a state directory for the gateway's nick.
struct Network {
    /// The server, of one kind or the other: runs until the test ends (stopped by its pid
    /// when dropped).
    _ngircd: Option<Ngircd>,
    _inspircd: Option<Inspircd>,
    person: Client,
    dir: tempfile::TempDir,
    config: PathBuf,
}

/// Where a message was written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Channel,
    Private,
}

/// One message the person wrote, and the final it must get.
#[derive(Debug, Clone)]
struct Asked {
    n: usize,
    place: Place,
    expected: String,
    /// Written while a kill was coming: may be lost before its durable record.
    before_kill: bool,
}

impl Network {
    fn start(agent_args: &[&str]) -> Network {
        Network::on(Server::Ngircd, agent_args)
    }

    fn on(kind: Server, agent_args: &[&str]) -> Network {
        let (ngircd, inspircd) = match kind {
            Server::Ngircd => (Some(Ngircd::start(Penalties::Off)), None),
            Server::Inspircd => (None, Some(Inspircd::start(Ircv3::On))),
        };
        let port = ngircd
            .as_ref()
            .map(|s| s.port)
            .or(inspircd.as_ref().map(|s| s.port))
            .unwrap_or_default();
        // On InspIRCd the person reads message tags: each line's msgid, to hold receipts to.
        let person = match kind {
            Server::Ngircd => Client::connect(port, PERSON),
            Server::Inspircd => Client::connect_with_caps(port, PERSON, &["message-tags"]),
        };
        person.join(CHANNEL);
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), port, agent_args);
        Network {
            _ngircd: ngircd,
            _inspircd: inspircd,
            person,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Starts the gateway and waits until its nick has joined the channel (a line written
    /// before that would reach no one: IRC keeps nothing for absent clients).
    fn gateway(&self) -> Result<GatewayProcess, String> {
        let mark = self.person.mark();
        let gateway = GatewayProcess::try_start(&self.state(), &self.config, &[])?;
        let joined = format!(":{NICK}!");
        self.person
            .try_wait_for(mark, Duration::from_secs(30), |l| {
                l.starts_with(&joined) && l.contains(" JOIN ") && l.ends_with(CHANNEL)
            })
            .ok_or_else(|| {
                let log =
                    std::fs::read_to_string(self.state().with_extension("log")).unwrap_or_default();
                format!("{NICK} never joined {CHANNEL} within 30 s; the gateway's log: {log}")
            })?;
        Ok(gateway)
    }

    /// SIGKILLs the gateway and waits until the server has seen its nick go, so the next
    /// start gets the same nick rather than an alternate one.
    fn kill(&self, gateway: GatewayProcess) {
        let mark = self.person.mark();
        gateway.kill_hard();
        let quit = format!(":{NICK}!");
        self.person
            .try_wait_for(mark, Duration::from_secs(30), |l| {
                l.starts_with(&quit) && l.contains(" QUIT ")
            })
            .unwrap_or_else(|| panic!("the server never saw {NICK} go"));
    }

    fn say(&self, n: usize, place: Place, words: usize, before_kill: bool) -> Asked {
        // Tokens that are no substring of one another (`msg-1-x` is not in `msg-10-x`).
        let text = format!("msg-{n}-x");
        match place {
            Place::Channel => self
                .person
                .send(&format!("PRIVMSG {CHANNEL} :{NICK}: {text}")),
            Place::Private => self.person.send(&format!("PRIVMSG {NICK} :{text}")),
        }
        Asked {
            n,
            place,
            expected: demo_reply(&text, words),
            before_kill,
        }
    }

    /// What the person received from the nick, in the channel and in private.
    fn received(&self) -> Vec<(Place, String)> {
        let mut texts: Vec<(Place, String)> = self
            .person
            .texts_from(NICK, CHANNEL)
            .into_iter()
            .map(|t| (Place::Channel, t))
            .collect();
        texts.extend(
            self.person
                .texts_from(NICK, PERSON)
                .into_iter()
                .map(|t| (Place::Private, t)),
        );
        texts
    }
}

/// IRCv3 only: each sent reply's receipt ids must be the `msgid`s of lines the person saw
/// (the labeled echo settled it, not a PING fence). Returns how many receipt ids matched, and
/// the ones that did not.
fn receipts_are_msgids(network: &Network) -> (usize, Vec<String>) {
    let mut seen = std::collections::BTreeSet::new();
    for target in [CHANNEL, PERSON] {
        seen.extend(
            network
                .person
                .tagged_texts_from(NICK, target)
                .into_iter()
                .filter_map(|(msgid, _)| msgid),
        );
    }
    let intents = state_pairs(&network.state(), "SELECT payload, status FROM send_intents");
    let (mut matched, mut unmatched) = (0, Vec::new());
    for (payload, status) in intents {
        if status != "sent" {
            continue;
        }
        let payload: serde_json::Value = serde_json::from_str(&payload).expect("intent JSON");
        let parts = payload["receipt"]["parts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for part in parts {
            let id = part["platformMessageId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if seen.contains(&id) {
                matched += 1;
            } else {
                unmatched.push(id);
            }
        }
    }
    (matched, unmatched)
}

fn config_file(dir: &Path, port: u16, agent_args: &[&str]) -> PathBuf {
    let settings = format!(
        "server = \"127.0.0.1\", port = {port}, nick = \"{NICK}\", \
         channels = [\"{CHANNEL}\"], answer_timeout_ms = 5000, reconnect_min_ms = 100, \
         reconnect_max_ms = 1000"
    );
    channel_config(dir, "irc", &settings, agent_args, 100)
}

#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// No final visible, and its reply recorded `unknown_after_send`.
    unknown: usize,
    /// No final, and no inbound record of the line: relayed just before a kill.
    unrecorded: usize,
    problems: Vec<String>,
}

fn judge(network: &Network, asked: &[Asked]) -> Verdict {
    let state = network.state();
    let intents = state_pairs(&state, "SELECT payload, status FROM send_intents");
    let inbound = state_pairs(&state, "SELECT payload, status FROM inbound_records");
    let mut received = network.received();
    let mut verdict = Verdict::default();
    for a in asked {
        let finals = received
            .iter()
            .filter(|(place, text)| *place == a.place && *text == a.expected)
            .count();
        let token = format!("msg-{}-x", a.n);
        let unknown = intents.iter().any(|(payload, status)| {
            status == "unknown_after_send" && payload.contains(&a.expected)
        });
        let recorded = inbound.iter().any(|(payload, _)| payload.contains(&token));
        match finals {
            1 => verdict.finals += 1,
            0 if unknown => verdict.unknown += 1,
            0 if a.before_kill && !recorded => verdict.unrecorded += 1,
            0 => verdict.problems.push(format!(
                "{a:?}: no final (recorded inbound: {recorded}, unknown reply: {unknown})"
            )),
            n => verdict.problems.push(format!("{a:?}: {n} finals")),
        }
        received.retain(|(place, text)| !(*place == a.place && *text == a.expected));
    }
    verdict.problems.extend(
        received
            .into_iter()
            .map(|(place, text)| format!("stray line ({place:?}): {text:?}")),
    );
    verdict
}

/// Waits until every message has its final or its evidence, or `quiet` passes with nothing new.
fn settle(network: &Network, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let verdict = judge(network, asked);
        let settled = verdict.finals + verdict.unknown;
        if settled == asked.len() {
            std::thread::sleep(Duration::from_secs(1));
            return;
        }
        if settled != last.0 {
            last = (settled, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Lines of one conversation wait for its running turn; the server never sends them again, so
/// they must be durable as they arrive, not when their turn comes.
#[test]
fn lines_queued_behind_a_running_turn_survive_a_kill() {
    const WORDS: usize = 12;
    // A slow reply: 12 words at 300 ms, several seconds per turn.
    let network = Network::start(&["--chunk-ms", "300", "--words", "12"]);
    let gateway = network.gateway().expect("gateway starts");
    let asked: Vec<Asked> = (0..3)
        .map(|n| network.say(n, Place::Private, WORDS, false))
        .collect();
    // The first turn is running and the other two lines are queued behind it.
    std::thread::sleep(Duration::from_secs(1));
    let mid = judge(&network, &asked);
    assert_eq!(mid.finals, 0, "killed before any final: {mid:?}");
    network.kill(gateway);
    let restarted = network.gateway().expect("gateway restarts");
    settle(&network, &asked, Duration::from_secs(20));
    let status = restarted.interrupt();
    network.person.sync();
    let verdict = judge(&network, &asked);
    assert!(verdict.problems.is_empty(), "{verdict:?}");
    assert_eq!(verdict.finals, 3, "each line answered once: {verdict:?}");
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&network.state()).is_empty());
}

#[test]
fn random_sigkills_on_an_irc_nick_never_duplicate_or_silently_lose_a_final() {
    crash_matrix(Server::Ngircd);
}

/// The same matrix where receipts are InspIRCd's labeled echoes.
#[test]
fn random_sigkills_on_an_ircv3_nick_never_duplicate_or_silently_lose_a_final() {
    crash_matrix(Server::Inspircd);
}

fn crash_matrix(server: Server) {
    const WORDS: usize = 8;
    let name = match server {
        Server::Ngircd => "irc",
        Server::Inspircd => "irc (inspircd)",
    };
    let seed = crash_seed();
    let (kills, count) = crash_size("IRC", 8, 24);
    eprintln!("{name} crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let network = Network::on(server, &["--chunk-ms", "25", "--words", "8"]);
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let place = |rng: &mut Rng| {
        if rng.below(2) == 0 {
            Place::Channel
        } else {
            Place::Private
        }
    };
    let mut asked = Vec::new();
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = network
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        for _ in 0..per_kill.min(count - asked.len()) {
            let n = asked.len();
            let at = place(&mut rng);
            asked.push(network.say(n, at, WORDS, true));
        }
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        network.kill(gateway);
    }
    let gateway = network
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    // Messages of the clean run: at least a few, so the judge sees a gateway that is not
    // being killed answer everything.
    for _ in 0..(count - asked.len()).max(3) {
        let n = asked.len();
        let at = place(&mut rng);
        asked.push(network.say(n, at, WORDS, false));
    }
    settle(&network, &asked, Duration::from_secs(20));
    let status = gateway.interrupt();
    network.person.sync();
    let mut verdict = judge(&network, &asked);
    let leftovers = leftover_processes(&network.state());
    let labeled = if server == Server::Inspircd {
        let (matched, unmatched) = receipts_are_msgids(&network);
        if matched == 0 || !unmatched.is_empty() {
            verdict.problems.push(format!(
                "receipts that are no msgid the person saw: {unmatched:?} ({matched} matched)"
            ));
        }
        format!(" labeled_receipts={matched}")
    } else {
        String::new()
    };
    eprintln!(
        "{name} crash matrix figures: seed={seed} kills={kills} messages={} finals={} unknown={} \
         unrecorded={} violations={} leftovers={} seconds={:.1}{labeled}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.unrecorded,
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.problems.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = network.dir.keep();
        panic!(
            "{name} crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; state \
             kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}
