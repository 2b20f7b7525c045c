use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) const WRAPPER: &str = env!("CARGO_BIN_EXE_clawgate-acpx-wrapper");

/// Polls `check` until it holds or `within` passes.
pub(crate) fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Alive = has a /proc entry that is not a zombie.
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            !matches!(rest.split_whitespace().next(), Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

pub(crate) fn pgid_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// Children of `pid` from /proc (test helper only).
pub(crate) fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) {
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
                out.push(child);
            }
        }
    }
    out
}

pub(crate) fn wrapper_args(grace_ms: u64, adapter: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--clawgate-acpx-lease-id",
        "lease-w",
        "--clawgate-gateway-instance-id",
        "gw-w",
        "--clawgate-grace-ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(grace_ms.to_string());
    args.push("--".into());
    args.extend(adapter.iter().map(|s| s.to_string()));
    args
}

/// The wrapper's report: (root pid, process group id).
pub(crate) fn read_report(stderr: ChildStderr) -> (u32, u32) {
    let mut lines = BufReader::new(stderr).lines();
    let line = lines.next().unwrap().unwrap();
    let json = line
        .strip_prefix("clawgate-acpx-wrapper ready ")
        .unwrap_or_else(|| panic!("unexpected first stderr line {line:?}"));
    let number = |key: &str| -> u32 {
        let start = json.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
        json[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    (number("rootPid"), number("processGroupId"))
}

pub(crate) fn spawn_wrapper(grace_ms: u64, adapter: &[&str]) -> Child {
    Command::new(WRAPPER)
        .args(wrapper_args(grace_ms, adapter))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(crate) fn term(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A process this test started; should it outlive the test's assertion (the failure this test
/// exists to catch), it is killed on drop — only while /proc still shows the same process
/// (same start time), never a recycled pid.
pub(crate) struct Survivor {
    pid: u32,
    start_time: String,
}

fn start_time_of(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 of stat; `rest` starts at field 3.
    rest.split_whitespace().nth(19).map(str::to_owned)
}

impl Survivor {
    pub(crate) fn of(pid: u32) -> Survivor {
        let start_time = start_time_of(pid).expect("the process is alive");
        Survivor { pid, start_time }
    }
}

impl Drop for Survivor {
    fn drop(&mut self) {
        if alive(self.pid) && start_time_of(self.pid).as_deref() == Some(&self.start_time) {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
        }
    }
}
