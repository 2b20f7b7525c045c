//! A real ngircd: a generated config in a tempdir, a free loopback port, started in the
//! foreground (`-n`) so its pid is ours, stopped by that pid on drop.

use std::io::Read;
use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server's name in its replies (`:irc.test 001 …`).
pub const SERVER_NAME: &str = "irc.test";

/// How the server punishes floods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Penalties {
    /// `MaxPenaltyTime = 0`: no flood penalties (the contract cases send bursts).
    Off,
    /// ngircd's default (no limit): a client sending too fast is delayed.
    On,
}

#[derive(Debug)]
/// One running ngircd, killed when dropped.
pub struct Ngircd {
    dir: tempfile::TempDir,
    /// Its loopback port.
    pub port: u16,
    penalties: Penalties,
    /// The server password (`[Global] Password`), when it has one.
    password: Option<String>,
    child: Option<Child>,
}

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn binary() -> PathBuf {
    let path = PathBuf::from("/usr/sbin/ngircd");
    if path.exists() {
        return path;
    }
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("ngircd"))
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!(
            "ngircd is not installed: these tests run against a real IRC server. Install it \
             with `apt-get install ngircd` (or `cargo xtask setup`)"
        )
    })
}

impl Ngircd {
    /// Starts a server without a password.
    pub fn start(penalties: Penalties) -> Ngircd {
        Ngircd::start_with(penalties, None)
    }

    /// Starts a server, with `password` as its `[Global] Password` when given.
    pub fn start_with(penalties: Penalties, password: Option<&str>) -> Ngircd {
        let mut server = Ngircd {
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            penalties,
            password: password.map(str::to_owned),
            child: None,
        };
        // Another test may take the released port first: try a few.
        for _ in 0..3 {
            match server.launch() {
                Ok(()) => return server,
                Err(error) => {
                    eprintln!("ngircd on {}: {error}; another port", server.port);
                    server.port = free_port();
                }
            }
        }
        panic!("ngircd did not start on three ports");
    }

    fn config(&self) -> String {
        // ngircd drops root for ServerUID; run it as whoever owns the tempdir (us).
        let meta = std::fs::metadata(self.dir.path()).unwrap();
        let penalty = match self.penalties {
            Penalties::Off => "MaxPenaltyTime = 0\n",
            Penalties::On => "",
        };
        let password = self
            .password
            .as_ref()
            .map_or_else(String::new, |p| format!("Password = {p}\n"));
        format!(
            "[Global]\n{password}Name = {SERVER_NAME}\nInfo = clawgate test server\n\
             AdminInfo1 = clawgate tests\nAdminInfo2 = loopback\nAdminEMail = tests@localhost\n\
             Listen = 127.0.0.1\nPorts = {port}\nMotdPhrase = test\n\
             PidFile = {dir}/ngircd.pid\nServerUID = {uid}\nServerGID = {gid}\n\
             [Limits]\nMaxConnectionsIP = 0\nMaxNickLength = 30\nPingTimeout = 120\n\
             PongTimeout = 20\n{penalty}\
             [Options]\nPAM = no\nDNS = no\nIdent = no\n",
            port = self.port,
            dir = self.dir.path().display(),
            uid = meta.uid(),
            gid = meta.gid(),
        )
    }

    fn launch(&mut self) -> Result<(), String> {
        let path = self.dir.path().join("ngircd.conf");
        std::fs::write(&path, self.config()).unwrap();
        let mut child = Command::new(binary())
            .arg("-n")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ngircd starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                if let Some(mut stderr) = child.stderr.take() {
                    let _ = stderr.read_to_string(&mut err);
                }
                return Err(format!("exited ({status}) before listening: {err}"));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err("did not listen within 10 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(10));
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
        self.stop();
        if let Err(error) = self.launch() {
            panic!("ngircd did not start again on {}: {error}", self.port);
        }
    }
}

impl Drop for Ngircd {
    fn drop(&mut self) {
        self.stop();
    }
}
