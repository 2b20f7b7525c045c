//! A real InspIRCd 3 (Debian's, from `cargo xtask setup`): the IRCv3 server of the tests. A
//! generated config in a tempdir, a free loopback port, started in the foreground
//! (`--nofork`) so its pid is ours, stopped by that pid on drop.
//!
//! Flood penalties are off in effect: `fakelag="no"` with a threshold and a command rate no
//! test reaches (100 000 penalty points, 1000 commands a second), so the tests measure the
//! channel, not the server's pacing; the channel's own bucket still runs in front.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::ngircd::{SERVER_NAME, free_port};

/// Which IRCv3 modules the server loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ircv3 {
    /// `cap`, `ircv3`, `echo-message`, `labeled-response`, `msgid`, `batch`, `server-time`,
    /// `message-tags` (`ircv3_ctctags`): what the channel asks for is offered.
    On,
    /// All of [`Ircv3::On`] but `labeled-response`: echoes come back unlabeled (the channel
    /// then keeps PING receipts and must still know its echoes from people's lines).
    EchoOnly,
    /// `cap` alone: `CAP LS` answers, offering none of what the channel asks for.
    Off,
}

/// One running InspIRCd, killed when dropped.
#[derive(Debug)]
pub struct Inspircd {
    dir: tempfile::TempDir,
    /// Its loopback port.
    pub port: u16,
    ircv3: Ircv3,
    child: Option<Child>,
}

const BINARY: &str = "/usr/sbin/inspircd";

fn binary() -> PathBuf {
    let path = PathBuf::from(BINARY);
    assert!(
        path.exists(),
        "inspircd is not installed ({BINARY} is missing): the IRCv3 tests run against a real \
         InspIRCd 3. Install it with `cargo xtask setup` (Debian's `inspircd` package)"
    );
    path
}

impl Inspircd {
    /// Starts a server with the IRCv3 modules loaded or not.
    pub fn start(ircv3: Ircv3) -> Inspircd {
        let mut server = Inspircd {
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            ircv3,
            child: None,
        };
        // Another test may take the released port first: try a few.
        for _ in 0..3 {
            match server.launch() {
                Ok(()) => return server,
                Err(error) => {
                    eprintln!("inspircd on {}: {error}; another port", server.port);
                    server.port = free_port();
                }
            }
        }
        panic!("inspircd did not start on three ports");
    }

    fn config(&self) -> String {
        let dir = self.dir.path().display();
        let modules: &[&str] = match self.ircv3 {
            Ircv3::On => &[
                "cap",
                "ircv3",
                "ircv3_echomessage",
                "ircv3_labeledresponse",
                "ircv3_msgid",
                "ircv3_batch",
                "ircv3_servertime",
                "ircv3_ctctags",
            ],
            Ircv3::EchoOnly => &[
                "cap",
                "ircv3",
                "ircv3_echomessage",
                "ircv3_msgid",
                "ircv3_batch",
                "ircv3_servertime",
                "ircv3_ctctags",
            ],
            Ircv3::Off => &["cap"],
        };
        let modules: String = modules
            .iter()
            .map(|m| format!("<module name=\"{m}\">\n"))
            .collect();
        format!(
            "<server name=\"{SERVER_NAME}\" description=\"clawgate test server\" \
             network=\"clawgate\">\n\
             <admin name=\"clawgate tests\" nick=\"admin\" email=\"tests@localhost\">\n\
             <bind address=\"127.0.0.1\" port=\"{port}\" type=\"clients\">\n\
             <connect name=\"main\" allow=\"*\" timeout=\"20\" pingfreq=\"120\" \
             hardsendq=\"1M\" softsendq=\"1M\" recvq=\"64K\" threshold=\"100000\" \
             commandrate=\"1000000\" fakelag=\"no\" localmax=\"1000\" globalmax=\"1000\" \
             maxchans=\"100\" resolvehostnames=\"no\" useident=\"no\" limit=\"5000\">\n\
             <files motd=\"{dir}/motd.txt\">\n\
             <options syntaxhints=\"no\">\n\
             {modules}",
            port = self.port,
        )
    }

    fn launch(&mut self) -> Result<(), String> {
        let path = self.dir.path().join("inspircd.conf");
        std::fs::write(&path, self.config()).unwrap();
        std::fs::write(self.dir.path().join("motd.txt"), "test\n").unwrap();
        let mut command = Command::new(binary());
        command
            .arg(format!("--config={}", path.display()))
            .arg("--nofork")
            .arg("--nopid");
        // It refuses to run as root unless told to (the tests' tempdir says who we are).
        if std::fs::metadata(self.dir.path()).unwrap().uid() == 0 {
            command.arg("--runasroot");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("inspircd starts");
        // A port taken by someone else is only a warning to InspIRCd (it runs without the
        // listener), and a connect would reach the other server: read its report instead.
        let stdout = child.stdout.take().unwrap();
        let (ready, started) = mpsc::channel();
        std::thread::spawn(move || {
            let mut said = String::new();
            let mut reported = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !reported {
                    said.push_str(&line);
                    said.push('\n');
                    if line.contains("is now running") {
                        reported = true;
                        let _ = ready.send(said.clone());
                    }
                }
                // Keep draining so the server never blocks on a full pipe.
            }
            if !reported {
                let _ = ready.send(said);
            }
        });
        let said = started.recv_timeout(Duration::from_secs(10)).ok();
        let failed = match &said {
            Some(said) if !said.contains("is now running") => Some(format!("exited: {said}")),
            Some(said) if said.contains("failed to bind") => Some(format!("port taken: {said}")),
            Some(_) => None,
            None => Some("did not report running within 10 s".to_owned()),
        };
        if let Some(error) = failed {
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
        self.child = Some(child);
        Ok(())
    }

    /// Kills the server (every client's connection drops).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        let ircv3 = self.ircv3;
        self.restart_with(ircv3);
    }

    /// Starts it again on the same port, with the IRCv3 modules of `ircv3` (a reconnect that
    /// lands on a server granting less).
    pub fn restart_with(&mut self, ircv3: Ircv3) {
        self.ircv3 = ircv3;
        self.stop();
        if let Err(error) = self.launch() {
            panic!("inspircd did not start again on {}: {error}", self.port);
        }
    }
}

impl Drop for Inspircd {
    fn drop(&mut self) {
        self.stop();
    }
}
