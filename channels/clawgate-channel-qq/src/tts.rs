//! Text as voice: a configured command turns text into audio. The command (`tts_command`, an
//! argv list, no shell) gets the text on standard input and writes the audio file's bytes to
//! standard output; QQ plays SILK voice messages, so the command produces SILK (or whatever the
//! operator's QQ accepts) — converting is its job, not the channel's. A command that fails,
//! times out or writes nothing is an `invalid_payload` failure, so the message falls back to
//! plain text.

use std::process::Stdio;
use std::time::Duration;

use clawgate_channel_sdk::SendError;
use clawgate_types::DeliveryFailureKind;
use tokio::io::AsyncWriteExt;

/// Largest audio a command may produce (QQ's upload limit is larger; a voice note is small).
pub const MAX_AUDIO_BYTES: usize = 10 * 1024 * 1024;

/// A text-to-speech command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tts {
    argv: Vec<String>,
    timeout: Duration,
}

fn refused(message: String) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

impl Tts {
    /// The command `argv` (program first), allowed `timeout` per text.
    pub fn new(argv: Vec<String>, timeout: Duration) -> Option<Tts> {
        (!argv.is_empty()).then_some(Tts { argv, timeout })
    }

    /// The audio of `text`.
    pub async fn speak(&self, text: &str) -> Result<Vec<u8>, SendError> {
        let program = &self.argv[0];
        let mut child = tokio::process::Command::new(program)
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| refused(format!("the tts_command {program:?} cannot start: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A command that does not read its input is its own business.
            let _ = stdin.write_all(text.as_bytes()).await;
        }
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                refused(format!(
                    "the tts_command {program:?} took longer than {} ms",
                    self.timeout.as_millis()
                ))
            })?
            .map_err(|e| refused(format!("the tts_command {program:?} failed: {e}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(refused(format!(
                "the tts_command {program:?} exited with {}: {}",
                output.status,
                stderr.trim()
            )));
        }
        if output.stdout.is_empty() || output.stdout.len() > MAX_AUDIO_BYTES {
            return Err(refused(format!(
                "the tts_command {program:?} wrote {} bytes of audio (1 to {MAX_AUDIO_BYTES} \
                 expected)",
                output.stdout.len()
            )));
        }
        Ok(output.stdout)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn sh(script: &str) -> Tts {
        Tts::new(
            vec!["sh".into(), "-c".into(), script.into()],
            Duration::from_secs(5),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn the_command_reads_text_and_writes_audio_or_fails_typed() {
        let audio = sh("printf '#!SILK_V3'; cat").speak("你好").await.unwrap();
        assert_eq!(audio, "#!SILK_V3你好".as_bytes());
        for (case, tts) in [
            ("exit 3", sh("echo no voice >&2; exit 3")),
            ("silent", sh("cat >/dev/null")),
            (
                "slow",
                Tts::new(
                    vec!["sh".into(), "-c".into(), "sleep 5".into()],
                    Duration::from_millis(100),
                )
                .unwrap(),
            ),
            (
                "missing",
                Tts::new(vec!["/nonexistent/tts".into()], Duration::from_secs(1)).unwrap(),
            ),
        ] {
            let error = tts.speak("x").await.unwrap_err();
            assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload, "{case}");
        }
        assert!(Tts::new(Vec::new(), Duration::from_secs(1)).is_none());
    }
}
