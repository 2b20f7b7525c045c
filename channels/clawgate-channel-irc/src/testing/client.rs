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
        client.send(&format!("NICK {nick}"));
        client.send(&format!("USER {nick} 0 * :test person"));
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
        let line = self.wait_for(mark, |l| l.starts_with(&me) && l.contains(" JOIN "));
        let prefix = line[1..].split(' ').next().unwrap().to_owned();
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
        let head = format!(":{from}!");
        let command = format!(" PRIVMSG {target} :");
        self.lines()
            .iter()
            .filter(|l| l.starts_with(&head))
            .filter_map(|l| l.split_once(&command).map(|(_, text)| text.to_owned()))
            .collect()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(writer) = self.writer.lock() {
            let _ = writer.shutdown(std::net::Shutdown::Both);
        }
    }
}
