//! `clawgate qa`: the QA channel from a terminal, through a running gateway's control API (the
//! platform lives in the gateway).

use std::collections::HashMap;

use clap::Subcommand;

use super::views::{QaConversation, QaMessage, QaMessagesParams, QaSendBody};
use crate::cli::{
    Backend, CliError, FOLLOW_INTERVAL, Render, compact, emit, print, terminal_safe, wire,
};
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum QaCommand {
    /// Write into a QA conversation as a person; the agent answers as usual.
    Send {
        #[arg(long)]
        conversation: String,
        text: String,
        /// Author id on the platform (default: operator).
        #[arg(long)]
        author: Option<String>,
        /// Channel name (default: the first configured channel).
        #[arg(long)]
        channel: Option<String>,
    },
    /// Print a conversation's messages, then new and edited ones as they change (Ctrl-C ends).
    Tail {
        #[arg(long)]
        conversation: String,
        #[arg(long)]
        channel: Option<String>,
    },
}

/// Runs one `clawgate qa` command against the gateway of `config.state_dir`.
pub async fn run(config: &Config, command: QaCommand, json: bool) -> Result<(), CliError> {
    let backend = Backend::connect(config).await?;
    match command {
        QaCommand::Send {
            conversation,
            text,
            author,
            channel,
        } => {
            let api = backend.running("qa send")?;
            let body = QaSendBody {
                conversation: conversation.clone(),
                text,
                author,
                channel,
            };
            let sent: QaMessage = api.post("/v1/qa/send", &body).await?;
            if json {
                return emit(&sent, true);
            }
            print(&format!(
                "sent {} to conversation {conversation}; `clawgate qa tail --conversation \
                 {conversation}` shows the answer\n",
                sent.id
            ))
        }
        QaCommand::Tail {
            conversation,
            channel,
        } => {
            let api = backend.running("qa tail")?;
            let params = QaMessagesParams {
                conversation,
                channel,
            };
            let stop = tokio::signal::ctrl_c();
            tokio::pin!(stop);
            let mut shown: HashMap<String, QaMessage> = HashMap::new();
            loop {
                let mut listed: QaConversation = api.get("/v1/qa/messages", &params).await?;
                listed.messages.sort_by_key(|m| m.seq);
                for message in listed.messages {
                    if shown.get(&message.id) != Some(&message) {
                        print(&qa_line(&message, json))?;
                        shown.insert(message.id.clone(), message);
                    }
                }
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = tokio::time::sleep(FOLLOW_INTERVAL) => {}
                }
            }
        }
    }
}

fn qa_line(message: &QaMessage, json: bool) -> String {
    if json {
        return format!("{}\n", compact(message));
    }
    let author = match (&message.author_id, message.from_agent) {
        // The gateway's own notice (a failure, every agent busy), not the agent's words.
        (_, true) if message.origin.is_some() => "gateway".to_owned(),
        (_, true) => "agent".to_owned(),
        (Some(id), false) => id.clone(),
        (None, false) => "?".to_owned(),
    };
    let mut marks = Vec::new();
    if message.from_agent {
        marks.push(wire(&message.state));
    }
    if message.edits > 0 {
        marks.push(format!("edit {}", message.edits));
    }
    let marks = if marks.is_empty() {
        String::new()
    } else {
        format!(" ({})", marks.join(", "))
    };
    format!(
        "[{}] {}{marks}: {}\n",
        terminal_safe(&message.id),
        terminal_safe(&author),
        terminal_safe(&message.text)
    )
}

impl Render for QaMessage {
    fn table(&self) -> String {
        qa_line(self, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qa::QaMessageState;

    #[test]
    fn a_qa_line_cannot_drive_the_terminal() {
        let message = QaMessage {
            id: "m-9".into(),
            seq: 9,
            author_id: Some("mallory\u{1b}[2J".into()),
            from_agent: false,
            text: "hi\u{1b}]0;owned\u{7}\rclear\n".into(),
            edits: 0,
            state: QaMessageState::Final,
            origin: None,
        };
        let line = qa_line(&message, false);
        assert_eq!(
            line,
            "[m-9] mallory\\u{1b}[2J: hi\\u{1b}]0;owned\\u{7}\\rclear\\n\n"
        );
        assert_eq!(
            line.chars().filter(|c| c.is_control()).count(),
            1,
            "only the line end"
        );
        // The JSON line stays exact.
        let json: serde_json::Value =
            serde_json::from_str(qa_line(&message, true).trim()).expect("one JSON object");
        assert_eq!(json["text"], "hi\u{1b}]0;owned\u{7}\rclear\n");
    }

    #[test]
    fn qa_lines_mark_agent_state_and_edits() {
        let message = QaMessage {
            id: "m-2".into(),
            seq: 2,
            author_id: None,
            from_agent: true,
            text: "hi".into(),
            edits: 3,
            state: QaMessageState::Streaming,
            origin: None,
        };
        assert_eq!(
            qa_line(&message, false),
            "[m-2] agent (streaming, edit 3): hi\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(qa_line(&message, true).trim()).expect("one JSON object");
        assert_eq!(json["state"], "streaming");
        let notice = QaMessage {
            origin: Some(clawgate_types::MessageOrigin::gateway_failure(
                clawgate_types::GatewayFailureCode::AgentsBusy,
            )),
            state: QaMessageState::Final,
            edits: 0,
            ..message
        };
        assert_eq!(qa_line(&notice, false), "[m-2] gateway (final): hi\n");
        let json: serde_json::Value =
            serde_json::from_str(qa_line(&notice, true).trim()).expect("one JSON object");
        assert_eq!(json["origin"]["code"], "agents_busy");
    }
}
