//! What a person can say to the gateway itself rather than to the agent: `/stop` cancels the
//! running turn of the conversation's session (ACP `session/cancel`; the session and its process
//! stay for the next message), `/new` closes the session so that the next message begins a
//! fresh one. Both are recorded in the session's signal log with the person as actor.
//!
//! A command is recognised by its whole trimmed text (`/stop`, `/new`, and the `/stop@bot`
//! form group chats address a bot with), case-insensitively. A command event runs in a lane
//! of its own beside the conversation's (see `TurnHandler::is_control`): `/stop` must not
//! wait behind the turn it stops.

/// A command a person gave in a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Cancel the running turn; keep the session.
    Stop,
    /// Close the session; the next message begins a fresh one.
    New,
}

impl Command {
    /// The command `text` is, if it is one.
    pub fn parse(text: &str) -> Option<Command> {
        let word = text.trim();
        let word = word.split_once('@').map_or(word, |(command, _bot)| command);
        match word.to_ascii_lowercase().as_str() {
            "/stop" => Some(Command::Stop),
            "/new" => Some(Command::New),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_whole_text_is_a_command() {
        assert_eq!(Command::parse(" /stop "), Some(Command::Stop));
        assert_eq!(Command::parse("/STOP"), Some(Command::Stop));
        assert_eq!(Command::parse("/new@clawgate_bot"), Some(Command::New));
        assert_eq!(Command::parse("/stop now please"), None);
        assert_eq!(Command::parse("please /stop"), None);
        assert_eq!(Command::parse("/stopper"), None);
    }
}
