//! A real relay for tests (feature `testing`): `nostr-relay-builder`'s [`LocalRelay`] in the
//! test process on 127.0.0.1, with its in-memory database kept so a test reads the relay's own
//! record of what landed, and a person on it — a nostr-sdk client with a key of its own that
//! writes and reads gift-wrapped DMs.
//!
//! The channel reaches the relay through [`TestRelay::url`], a TCP proxy the test controls:
//! it can lose the relay's next `OK` (forwarding the `EVENT`, dropping the answer and the
//! connection: the relay stored the event, the channel never learns it), or take the relay
//! down (refuse and drop connections). Refusals are the relay's own, by a write policy
//! (`OK false "blocked: …"`) that applies only to events arriving through the proxy. The person
//! connects to [`TestRelay::direct_url`], past the proxy and its faults. The relay lives as long
//! as the value: a gateway process killed and restarted meets the same relay and events.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // A test fixture: failures panic loudly.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nostr_relay_builder::prelude::{LocalRelay, PolicyResult, RelayBuilder, WritePolicy};
use nostr_sdk::nostr::util::BoxedFuture;
use nostr_sdk::prelude::{MemoryDatabase, MemoryDatabaseOptions, NostrDatabase};
use nostr_sdk::{
    Client, Event, EventBuilder, EventId, Filter, Kind, PublicKey, RelayUrl, UnsignedEvent,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::dm::{self, Opened};

/// Keys for the channel under test and its people.
pub use nostr_sdk::Keys;

/// Faults of the proxied connections.
#[derive(Debug, Default)]
struct Faults {
    /// `(events to let through, refusal message)`, in order.
    refusals: Mutex<Vec<(u32, String)>>,
    /// `OK` answers to let through before one is lost.
    lose_after: Mutex<Option<u32>>,
    down: AtomicBool,
    /// Answers lost so far.
    lost: std::sync::atomic::AtomicU32,
    /// The proxy's own ends of its relay connections (the write policy knows them by these).
    upstream: Mutex<HashSet<SocketAddr>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
struct FaultPolicy(Arc<Faults>);

impl WritePolicy for FaultPolicy {
    fn admit_event<'a>(
        &'a self,
        _event: &'a Event,
        addr: &'a SocketAddr,
    ) -> BoxedFuture<'a, PolicyResult> {
        Box::pin(async move {
            if !lock(&self.0.upstream).contains(addr) {
                return PolicyResult::Accept;
            }
            let mut refusals = lock(&self.0.refusals);
            let Some((after, _)) = refusals.first_mut() else {
                return PolicyResult::Accept;
            };
            if *after > 0 {
                *after -= 1;
                return PolicyResult::Accept;
            }
            PolicyResult::Reject(refusals.remove(0).1)
        })
    }
}

/// A relay in the test process, behind a fault proxy.
pub struct TestRelay {
    relay: LocalRelay,
    database: Arc<MemoryDatabase>,
    direct: RelayUrl,
    proxy: SocketAddr,
    faults: Arc<Faults>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for TestRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestRelay")
            .field("direct", &self.direct.to_string())
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

impl Drop for TestRelay {
    fn drop(&mut self) {
        self.accept.abort();
        for task in lock(&self.faults.tasks).drain(..) {
            task.abort();
        }
        self.relay.shutdown();
    }
}

impl TestRelay {
    /// Starts a relay on a free loopback port, and its proxy on another.
    pub async fn start() -> TestRelay {
        TestRelay::start_with(false).await
    }

    /// As [`TestRelay::start`], a relay that wants NIP-42 AUTH for reading and writing and
    /// serves a gift wrap only to the key it is addressed to (what NIP-17 asks of DM relays).
    pub async fn start_authenticating() -> TestRelay {
        TestRelay::start_with(true).await
    }

    async fn start_with(authenticating: bool) -> TestRelay {
        let database = Arc::new(MemoryDatabase::with_opts(MemoryDatabaseOptions {
            events: true,
            max_events: None,
        }));
        let faults = Arc::new(Faults::default());
        let builder = RelayBuilder::default()
            .addr(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
            .database(database.clone())
            // Tests publish far faster than a person; the relay's own limiter is not under test.
            .rate_limit(nostr_relay_builder::prelude::RateLimit {
                max_reqs: 10_000,
                notes_per_minute: 100_000,
            })
            .write_policy(FaultPolicy(faults.clone()));
        let builder = if authenticating {
            builder
                .nip42(nostr_relay_builder::prelude::RelayBuilderNip42 {
                    mode: nostr_relay_builder::prelude::RelayBuilderNip42Mode::Both,
                })
                .auth_dm(true)
        } else {
            builder
        };
        let relay = LocalRelay::new(builder);
        relay.run().await.unwrap();
        let direct = relay.url().await;
        let upstream: SocketAddr = direct
            .as_str()
            .trim_start_matches("ws://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = listener.local_addr().unwrap();
        let accept = tokio::spawn(accept_loop(listener, upstream, faults.clone()));
        TestRelay {
            relay,
            database,
            direct,
            proxy,
            faults,
            accept,
        }
    }

    /// The relay as the channel under test reaches it (through the fault proxy).
    pub fn url(&self) -> String {
        format!("ws://{}", self.proxy)
    }

    /// The relay itself.
    pub fn direct_url(&self) -> String {
        self.direct.to_string()
    }

    /// The next `count` events arriving through the proxy, after `after` went through, are
    /// refused with `OK false "blocked: <reason>"`.
    pub fn refuse(&self, count: u32, after: u32, reason: &str) {
        let mut refusals = lock(&self.faults.refusals);
        for n in 0..count {
            refusals.push((if n == 0 { after } else { 0 }, reason.to_owned()));
        }
    }

    /// After `after` more `OK` answers, the next one is lost with the connection.
    pub fn lose_answer(&self, after: u32) {
        *lock(&self.faults.lose_after) = Some(after);
    }

    /// How many answers the proxy has lost so far.
    pub fn answers_lost(&self) -> u32 {
        self.faults.lost.load(Ordering::SeqCst)
    }

    /// Takes the relay down for the channel (every proxied connection dropped, new ones
    /// refused) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.faults.down.store(down, Ordering::SeqCst);
        if down {
            for task in lock(&self.faults.tasks).drain(..) {
                task.abort();
            }
        }
    }

    /// Every event the relay stored that matches `filter`.
    pub async fn stored(&self, filter: Filter) -> Vec<Event> {
        self.database
            .query(filter)
            .await
            .unwrap()
            .into_iter()
            .collect()
    }

    /// Whether the relay stored `id`.
    pub async fn has(&self, id: &EventId) -> bool {
        !self.stored(Filter::new().id(*id)).await.is_empty()
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, faults: Arc<Faults>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if faults.down.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream).await else {
            continue;
        };
        if let Ok(local) = server.local_addr() {
            lock(&faults.upstream).insert(local);
        }
        let task = tokio::spawn(pipe(client, server, faults.clone()));
        let mut tasks = lock(&faults.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }
}

/// Client bytes go to the relay as they are; relay bytes come back unless a lost answer is
/// due, when everything from that `OK` frame on is dropped and both connections close.
async fn pipe(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    let down = async {
        const OK: &[u8] = b"[\"OK\",";
        let mut buf = vec![0u8; 64 * 1024];
        // The tail of the previous read, so a marker split across reads is still seen.
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut window = std::mem::take(&mut carry);
            let offset = window.len();
            window.extend_from_slice(&buf[..n]);
            let mut cut = None;
            {
                let mut lose = lock(&faults.lose_after);
                if lose.is_some() {
                    let mut at = 0;
                    while let Some(pos) = window[at..].windows(OK.len()).position(|w| w == OK) {
                        let pos = at + pos;
                        match lose.as_mut() {
                            Some(0) => {
                                *lose = None;
                                faults.lost.fetch_add(1, Ordering::SeqCst);
                                cut = Some(pos);
                                break;
                            }
                            Some(k) => *k -= 1,
                            None => break,
                        }
                        at = pos + OK.len();
                    }
                }
            }
            let keep = window.len().saturating_sub(OK.len() - 1);
            carry = window[keep.max(offset)..].to_vec();
            if let Some(pos) = cut {
                let _ = client_write.write_all(&window[offset.min(pos)..pos]).await;
                return;
            }
            if client_write.write_all(&window[offset..]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// A person on the relay: a key of its own and a nostr-sdk client connected past the proxy.
#[derive(Debug, Clone)]
pub struct Person {
    /// The person's key.
    pub keys: Keys,
    client: Client,
    last: Arc<Mutex<Option<(PublicKey, UnsignedEvent)>>>,
}

impl Person {
    /// A new person on `relay` (its direct URL).
    pub async fn join(relay: &TestRelay) -> Person {
        let keys = Keys::generate();
        let client = Client::builder().signer(keys.clone()).build();
        client.add_relay(relay.direct_url()).await.unwrap();
        client.connect().await;
        client.wait_for_connection(Duration::from_secs(10)).await;
        Person {
            keys,
            client,
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// The person's public key, as the channel's conversation id.
    pub fn id(&self) -> String {
        self.keys.public_key().to_hex()
    }

    /// Sends `text` to `to` as a NIP-17 gift wrap built by nostr-sdk; returns the wrap once
    /// the relay accepted it.
    pub async fn send_dm(&self, to: &PublicKey, text: &str) -> Event {
        let rumor = EventBuilder::private_msg_rumor(*to, text).build(self.keys.public_key());
        *lock(&self.last) = Some((*to, rumor.clone()));
        self.wrap_and_send(to, rumor).await
    }

    /// Sends the last message again in a new gift wrap (what a client's retry does): another
    /// wrap id, the same rumor id.
    pub async fn send_last_again(&self) -> Event {
        let (to, rumor) = lock(&self.last).clone().expect("a message was sent before");
        self.wrap_and_send(&to, rumor).await
    }

    async fn wrap_and_send(&self, to: &PublicKey, rumor: UnsignedEvent) -> Event {
        let wrap = EventBuilder::gift_wrap(&self.keys, to, rumor, [])
            .await
            .unwrap();
        self.publish(&wrap).await;
        wrap
    }

    /// Publishes an event someone built (another client's gift wrap) through the person's
    /// connection, once the relay accepted it.
    pub async fn publish(&self, event: &Event) {
        let output = self.client.send_event(event).await.unwrap();
        assert!(
            !output.success.is_empty(),
            "the relay refused the event: {output:?}"
        );
    }

    /// Every gift wrap the relay holds for the person, opened, oldest rumor first: `(wrap id,
    /// message)`. Wraps that do not open are left out.
    pub async fn inbox(&self, relay: &TestRelay) -> Vec<(EventId, Opened)> {
        let filter = Filter::new()
            .kind(Kind::GiftWrap)
            .pubkey(self.keys.public_key());
        let mut opened: Vec<(EventId, Opened)> = relay
            .stored(filter)
            .await
            .into_iter()
            .filter_map(|wrap| dm::open(&self.keys, &wrap).ok().map(|o| (wrap.id, o)))
            .collect();
        opened.sort_by_key(|(_, o)| o.created_at);
        opened
    }

    /// The texts the person received from `from`, oldest first, one per message (a message in
    /// two wraps counts once, as a client shows it).
    pub async fn texts_from(&self, relay: &TestRelay, from: &PublicKey) -> Vec<String> {
        let mut seen = HashSet::new();
        self.inbox(relay)
            .await
            .into_iter()
            .filter(|(_, o)| o.sender == *from && seen.insert(o.id.clone()))
            .map(|(_, o)| o.text)
            .collect()
    }
}
