//! A TCP relay between the channel and the server that can lose an answer (forward the
//! channel's next PRIVMSG, then cut the link before anything comes back: the server has the
//! line, the channel never hears about it — neither the PONG nor, with IRCv3, the echo) and
//! drop the connection on demand.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Default)]
struct Plan {
    /// Lose the answer of the PRIVMSG after this many more went through.
    lose_after: Option<u32>,
}

pub(crate) struct Proxy {
    pub(crate) port: u16,
    plan: Arc<Mutex<Plan>>,
    cut: watch::Sender<u64>,
}

impl Proxy {
    pub(crate) async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let plan = Arc::new(Mutex::new(Plan::default()));
        let (cut, _) = watch::channel(0u64);
        let proxy = Proxy {
            port,
            plan: plan.clone(),
            cut: cut.clone(),
        };
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue; // the server is down: the channel sees its connect fail
                };
                tokio::spawn(relay(client, server, plan.clone(), cut.subscribe()));
            }
        });
        proxy
    }

    pub(crate) fn lose_answer_after(&self, after: u32) {
        self.plan.lock().unwrap().lose_after = Some(after);
    }

    /// Closes every relayed connection now.
    pub(crate) fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    plan: Arc<Mutex<Plan>>,
    mut cut: watch::Receiver<u64>,
) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut from_client = BufReader::new(client_read).lines();
    let mut buffer = vec![0u8; 4096];
    cut.borrow_and_update();
    loop {
        tokio::select! {
            line = from_client.next_line() => {
                let Ok(Some(line)) = line else { break };
                // A labeled line (`@label=… PRIVMSG …`, IRCv3) counts as its command.
                let command = match line.strip_prefix('@') {
                    Some(tagged) => tagged.split_once(' ').map_or("", |(_, rest)| rest),
                    None => line.as_str(),
                };
                let lose = command.starts_with("PRIVMSG ") && {
                    let mut plan = plan.lock().unwrap();
                    match plan.lose_after {
                        Some(0) => { plan.lose_after = None; true }
                        Some(n) => { plan.lose_after = Some(n - 1); false }
                        None => false,
                    }
                };
                if server_write.write_all(format!("{line}\r\n").as_bytes()).await.is_err() {
                    break;
                }
                if lose {
                    // Let the server take the line, then go silent and cut: its answer (and
                    // the PONG behind it) never reaches the channel.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    break;
                }
            }
            read = server_read.read(&mut buffer) => {
                let Ok(n) = read else { break };
                if n == 0 || client_write.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
            _ = cut.changed() => break,
        }
    }
    let _ = client_write.shutdown().await;
    let _ = server_write.shutdown().await;
}
