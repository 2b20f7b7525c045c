//! The live `/proc` table. A handle is an `O_DIRECTORY` fd of `/proc/PID`: reads through it
//! (`openat(fd, "stat")`) fail once that process is reaped, and `pidfd_send_signal` accepts it,
//! so a recycled pid can never be read or signalled through an old handle.

use std::fs;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use rustix::fs::{CWD, Mode, OFlags, openat, readlinkat};
use rustix::io::Errno;
use rustix::process::{Signal, pidfd_send_signal};

use super::{Delivery, ProcStat, ProcessHandle, ProcessTable, Read, Sig, TableError, parse_stat};

#[derive(Debug, Default)]
pub struct ProcFs;

impl ProcessTable for ProcFs {
    fn boot_id(&self) -> Result<String, TableError> {
        fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|id| id.trim().to_owned())
            .map_err(|e| TableError::new("/proc/sys/kernel/random/boot_id", e))
    }

    fn list(&self) -> Result<Vec<ProcStat>, TableError> {
        let entries = fs::read_dir("/proc").map_err(|e| TableError::new("/proc", e))?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| TableError::new("/proc", e))?;
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // A process may exit between readdir and read: skip it.
            if let Ok(line) = fs::read_to_string(format!("/proc/{pid}/stat"))
                && let Some(stat) = parse_stat(pid, &line)
            {
                out.push(stat);
            }
        }
        Ok(out)
    }

    fn open(&self, pid: u32) -> Read<Box<dyn ProcessHandle>> {
        let path = format!("/proc/{pid}");
        match openat(
            CWD,
            path.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(Box::new(ProcHandle { pid, dir: fd }))),
            Err(Errno::NOENT | Errno::SRCH) => Ok(None),
            Err(e) => Err(TableError::new(path, e)),
        }
    }
}

#[derive(Debug)]
struct ProcHandle {
    pid: u32,
    dir: OwnedFd,
}

impl ProcHandle {
    fn read(&self, name: &str) -> Read<Vec<u8>> {
        let fd = match openat(
            &self.dir,
            name,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::SRCH) => return Ok(None),
            Err(e) => return Err(TableError::new(format!("/proc/{}/{name}", self.pid), e)),
        };
        let mut bytes = Vec::new();
        match fs::File::from(fd).read_to_end(&mut bytes) {
            Ok(_) => Ok(Some(bytes)),
            Err(e) if e.raw_os_error() == Some(Errno::SRCH.raw_os_error()) => Ok(None),
            Err(e) => Err(TableError::new(format!("/proc/{}/{name}", self.pid), e)),
        }
    }
}

fn nul_split(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter(|part| !part.is_empty())
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect()
}

impl ProcessHandle for ProcHandle {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn stat(&self) -> Read<ProcStat> {
        let Some(bytes) = self.read("stat")? else {
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&bytes);
        parse_stat(self.pid, &line)
            .map(Some)
            .ok_or_else(|| TableError::new(format!("/proc/{}/stat", self.pid), "unparsable"))
    }

    fn exe(&self) -> Read<PathBuf> {
        match readlinkat(&self.dir, "exe", Vec::new()) {
            Ok(target) => {
                let text = target.to_string_lossy().into_owned();
                let text = text.strip_suffix(" (deleted)").unwrap_or(&text).to_owned();
                Ok(Some(PathBuf::from(text)))
            }
            // A zombie has no exe; a reaped process no directory.
            Err(Errno::NOENT | Errno::SRCH) => Ok(None),
            Err(e) => Err(TableError::new(format!("/proc/{}/exe", self.pid), e)),
        }
    }

    fn cmdline(&self) -> Read<Vec<String>> {
        Ok(self.read("cmdline")?.map(|bytes| nul_split(&bytes)))
    }

    fn environ_var(&self, key: &str) -> Read<Option<String>> {
        let Some(bytes) = self.read("environ")? else {
            return Ok(None);
        };
        let prefix = format!("{key}=");
        Ok(Some(nul_split(&bytes).into_iter().find_map(|entry| {
            entry.strip_prefix(&prefix).map(str::to_owned)
        })))
    }

    fn signal(&self, sig: Sig) -> Result<Delivery, TableError> {
        let signal = match sig {
            Sig::Term => Signal::TERM,
            Sig::Kill => Signal::KILL,
        };
        match pidfd_send_signal(&self.dir, signal) {
            Ok(()) => Ok(Delivery::Delivered),
            Err(Errno::SRCH) => Ok(Delivery::Gone),
            Err(e) => Err(TableError::new(format!("signal {}", self.pid), e)),
        }
    }
}
