//! A tiny raw-socket IRC client: a person (or another bot) in the channel who writes lines and
//! reads what landed. Blocking std I/O with a reader thread, so it works from sync and async
//! code alike.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

/// A connected, registered client.
#[derive(Debug)]
pub struct Client {
    /// Its nick.
    pub nick: String,
    writer: Mutex<TcpStream>,
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
    syncs: AtomicU64,
    /// Our `nick!user@host`, from our own JOIN.
    prefix: Mutex<Option<String>>,
}

impl Client {
    /// Connects to a server on loopback and registers as `nick`.
    pub fn connect(port: u16, nick: &str) -> Client {
        Client::connect_with_caps(port, nick, &[])
    }

    /// Like [`Client::connect`], first asking for the IRCv3 capabilities `caps` (say
    /// `message-tags`, to read the `msgid` of what lands); panics when they are not granted.
    pub fn connect_with_caps(port: u16, nick: &str, caps: &[&str]) -> Client {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_nodelay(true).unwrap();
        let reader = stream.try_clone().unwrap();
        let lines = Arc::new((Mutex::new(Vec::<String>::new()), Condvar::new()));
        let shared = lines.clone();
        let mut answer = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if let Some(server) = line.strip_prefix("PING ") {
                    let _ = write!(answer, "PONG {server}\r\n");
                }
                let (list, ready) = &*shared;
                list.lock().unwrap().push(line);
                ready.notify_all();
            }
        });
        let client = Client {
            nick: nick.to_owned(),
            writer: Mutex::new(stream),
            lines,
            syncs: AtomicU64::new(0),
            prefix: Mutex::new(None),
        };
        if !caps.is_empty() {
            client.send(&format!("CAP REQ :{}", caps.join(" ")));
        }
        client.send(&format!("NICK {nick}"));
        client.send(&format!("USER {nick} 0 * :test person"));
        if !caps.is_empty() {
            let answer = client.wait_for(0, |l| l.contains(" ACK ") || l.contains(" NAK "));
            assert!(
                answer.contains(" ACK "),
                "{nick} asked for {caps:?}: {answer}"
            );
            client.send("CAP END");
        }
        client.wait_for(0, |l| l.contains(" 001 "));
        client
    }

    /// Writes one raw line (CRLF added).
    pub fn send(&self, line: &str) {
        let mut writer = self.writer.lock().unwrap();
        writer.write_all(format!("{line}\r\n").as_bytes()).unwrap();
    }

    /// How many lines arrived so far (a mark for [`Client::wait_for`]).
    pub fn mark(&self) -> usize {
        self.lines.0.lock().unwrap().len()
    }

    /// Every line received so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.0.lock().unwrap().clone()
    }

    /// The first line at or after `from` matching `pred`, waiting for it.
    pub fn wait_for(&self, from: usize, pred: impl Fn(&str) -> bool) -> String {
        self.try_wait_for(from, WAIT, pred).unwrap_or_else(|| {
            panic!(
                "{}: no such line within {WAIT:?}: {:#?}",
                self.nick,
                self.lines()
            )
        })
    }

    /// Like [`Client::wait_for`], but `None` after `wait`.
    pub fn try_wait_for(
        &self,
        from: usize,
        wait: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        let deadline = Instant::now() + wait;
        let (list, ready) = &*self.lines;
        let mut lines = list.lock().unwrap();
        loop {
            if let Some(line) = lines.iter().skip(from).find(|l| pred(l)) {
                return Some(line.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            lines = ready.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Round trip to the server: every line relayed to us before it has arrived.
    pub fn sync(&self) {
        let n = self.syncs.fetch_add(1, Ordering::Relaxed);
        let mark = self.mark();
        self.send(&format!("PING :sync{n}"));
        let token = format!(":sync{n}");
        self.wait_for(mark, |l| l.contains(" PONG ") && l.ends_with(&token));
    }

    /// Joins `channel` and waits until the server confirms.
    pub fn join(&self, channel: &str) {
        let mark = self.mark();
        self.send(&format!("JOIN {channel}"));
        let me = format!(":{}!", self.nick);
        let line = self.wait_for(mark, |l| {
            untagged(l).starts_with(&me) && l.contains(" JOIN ")
        });
        let prefix = untagged(&line)[1..].split(' ').next().unwrap().to_owned();
        *self.prefix.lock().unwrap() = Some(prefix);
    }

    /// Our `nick!user@host`, as others see it.
    pub fn prefix(&self) -> String {
        self.prefix
            .lock()
            .unwrap()
            .clone()
            .expect("joined a channel")
    }

    /// Texts of the PRIVMSGs `from` (a nick) sent to `target`, in order.
    pub fn texts_from(&self, from: &str, target: &str) -> Vec<String> {
        self.tagged_texts_from(from, target)
            .into_iter()
            .map(|(_, text)| text)
            .collect()
    }

    /// Like [`Client::texts_from`], each with its `msgid` tag (IRCv3 `message-tags`), if any.
    pub fn tagged_texts_from(&self, from: &str, target: &str) -> Vec<(Option<String>, String)> {
        let head = format!(":{from}!");
        let command = format!(" PRIVMSG {target} :");
        self.lines()
            .iter()
            .filter(|l| untagged(l).starts_with(&head))
            .filter_map(|l| {
                let (_, text) = untagged(l).split_once(&command)?;
                Some((tag(l, "msgid"), text.to_owned()))
            })
            .collect()
    }
}

/// A line without its IRCv3 tags (`@a=b;c :prefix …` → `:prefix …`).
fn untagged(line: &str) -> &str {
    match line.strip_prefix('@') {
        Some(tagged) => tagged.split_once(' ').map_or("", |(_, rest)| rest),
        None => line,
    }
}

/// The value of tag `name` on a line (escapes are not undone: the tests' values have none).
fn tag(line: &str, name: &str) -> Option<String> {
    let tags = line.strip_prefix('@')?.split(' ').next()?;
    tags.split(';').find_map(|t| {
        let (key, value) = t.split_once('=').unwrap_or((t, ""));
        (key == name).then(|| value.to_owned())
    })
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(writer) = self.writer.lock() {
            let _ = writer.shutdown(std::net::Shutdown::Both);
        }
    }
}
