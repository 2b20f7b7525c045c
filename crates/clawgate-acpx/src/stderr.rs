//! The last lines an agent wrote on stderr: why a start or a turn failed is usually there
//! ("--dangerously-skip-permissions cannot be used with root/sudo privileges", "API key is
//! missing"). Every line goes to the debug log as it comes; the last [`TAIL_LINES`] are kept
//! so a failure can be logged at WARN with them. Values of the agent's environment (API keys
//! passed to it) are masked before a line is kept or logged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::environment::AgentEnv;

/// How many lines are kept.
pub const TAIL_LINES: usize = 20;
/// A kept line is cut to this many characters.
const LINE_CHARS: usize = 400;
/// Values shorter than this are not masked (`1`, `yes`, a locale name would mask every line).
const MASKED_MIN: usize = 8;

/// The last stderr lines of one agent process, shared by its reader task and the controller.
#[derive(Debug, Clone)]
pub struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Values never to show (the secrets of the agent's environment).
    masked: Arc<Vec<String>>,
}

impl StderrTail {
    /// A tail that masks the values of `env` that are long enough to be secrets, except the
    /// base variables (a `PATH` is no secret and would mask half a line).
    pub fn new(env: &AgentEnv) -> StderrTail {
        let masked = env
            .iter()
            .filter(|(name, _)| !crate::environment::BASE_VARIABLES.contains(name))
            .filter(|(_, value)| value.len() >= MASKED_MIN)
            .map(|(_, value)| value.to_owned())
            .collect();
        StderrTail {
            lines: Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES))),
            masked: Arc::new(masked),
        }
    }

    /// Keeps `line` (masked and cut), dropping the oldest beyond [`TAIL_LINES`]; returns it
    /// as kept, for the log.
    pub fn push(&self, line: &str) -> String {
        let mut kept = line.to_owned();
        for secret in self.masked.iter() {
            if kept.contains(secret.as_str()) {
                kept = kept.replace(secret.as_str(), "[redacted]");
            }
        }
        if let Some((cut, _)) = kept.char_indices().nth(LINE_CHARS) {
            kept.truncate(cut);
            kept.push('…');
        }
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(kept.clone());
        kept
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// The kept lines as one string for a log field (`" | "` between lines), or `"(none)"`.
    pub fn joined(&self) -> String {
        let lines = self.lines();
        if lines.is_empty() {
            "(none)".to_owned()
        } else {
            lines.join(" | ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_only_the_last_lines_kept() {
        let mut env = AgentEnv::empty();
        env.set("ANTHROPIC_API_KEY", "sk-ant-0123456789");
        env.set("FLAG", "yes");
        let tail = StderrTail::new(&env);
        for n in 0..30 {
            tail.push(&format!("line {n}"));
        }
        let kept = tail.push("auth with sk-ant-0123456789 failed: yes");
        assert_eq!(kept, "auth with [redacted] failed: yes");
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line 11", "the oldest dropped first");
        assert!(!tail.joined().contains("0123456789"));
    }
}
