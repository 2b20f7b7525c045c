//! Outbound lines: a PRIVMSG fits the 512-byte line limit as the server relays it (its sender
//! prefix and CRLF included), and text is cut only between UTF-8 characters.

/// The longest IRC line, CRLF included (RFC 2812 §2.3).
pub const MAX_LINE_BYTES: usize = 512;
/// The longest host a server puts in a sender prefix (RFC 2812 §2.3.1 allows 63 for a
/// hostname); used while our real prefix is not known yet.
pub const MAX_HOST_BYTES: usize = 63;

/// How many bytes of text one `PRIVMSG <target> :<text>` carries, when the server relays it
/// as `:<prefix> PRIVMSG <target> :<text>\r\n` and `prefix` is `nick!user@host`.
pub fn text_budget(prefix_len: usize, target: &str) -> usize {
    // ":" prefix " PRIVMSG " target " :" text "\r\n"
    let overhead = 1 + prefix_len + " PRIVMSG ".len() + target.len() + " :".len() + 2;
    MAX_LINE_BYTES.saturating_sub(overhead)
}

/// The prefix length to plan for when only the nick and user are known: the longest host.
pub fn planned_prefix_len(nick: &str, user: &str) -> usize {
    // Servers may put `~` before an unverified user name.
    nick.len() + 1 + 1 + user.len() + 1 + MAX_HOST_BYTES
}

/// Splits `text` into the lines one IRC message each carries: one per text line (empty lines
/// are dropped: IRC refuses an empty PRIVMSG), each cut to at most `budget` bytes at a
/// character boundary. A cut prefers the last space in the second half of a piece and takes
/// that space out, as clients wrap words; trailing spaces go too (servers strip them anyway),
/// so what lands is what was sent.
pub fn split_text(text: &str, budget: usize) -> Vec<String> {
    let budget = budget.max(4); // room for one UTF-8 character of any length
    let mut pieces = Vec::new();
    for line in text.split('\n') {
        // CR and NUL cannot travel inside a line.
        let line: String = line.chars().filter(|c| *c != '\r' && *c != '\0').collect();
        let mut rest = line.trim_end();
        while rest.len() > budget {
            let mut hard = budget;
            while !rest.is_char_boundary(hard) {
                hard -= 1;
            }
            let (piece, next) = match rest[..hard].rfind(' ').filter(|i| *i >= hard / 2) {
                Some(space) => (&rest[..space], &rest[space + 1..]),
                None => (&rest[..hard], &rest[hard..]),
            };
            if !piece.trim().is_empty() {
                pieces.push(piece.trim_end().to_owned());
            }
            rest = next;
        }
        if !rest.trim().is_empty() {
            pieces.push(rest.to_owned());
        }
    }
    pieces
}

/// `PRIVMSG <target> :<text>` (without CRLF).
pub fn privmsg(target: &str, text: &str) -> String {
    format!("PRIVMSG {target} :{text}")
}

/// Whether `target` can be named in a command: a nick or a channel, no spaces, commas or
/// control characters.
pub fn valid_target(target: &str) -> bool {
    !target.is_empty()
        && !target.starts_with(':')
        && target.bytes().all(|b| b > b' ' && b != b',' && b != 0x7f)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fit_the_budget_rejoin_and_never_split_a_character() {
        let text = "é€😀".repeat(200);
        for budget in [4, 5, 7, 100, 433] {
            let pieces = split_text(&text, budget);
            assert_eq!(pieces.concat(), text, "budget {budget}");
            assert!(pieces.iter().all(|p| p.len() <= budget && !p.is_empty()));
        }
    }

    #[test]
    fn lines_become_pieces_and_empty_lines_are_dropped() {
        assert_eq!(
            split_text("one\n\ntwo\r\nthree", 100),
            vec!["one", "two", "three"]
        );
        assert_eq!(split_text("aaaa bbbb cccc", 10), vec!["aaaa bbbb", "cccc"]);
        assert_eq!(split_text("trailing   ", 100), vec!["trailing"]);
        let words = "word ".repeat(100);
        let pieces = split_text(&words, 23);
        assert_eq!(pieces.join(" "), words.trim_end());
        assert!(pieces.iter().all(|p| p.len() <= 23 && !p.ends_with(' ')));
        assert!(split_text("\n \n", 10).is_empty());
    }

    #[test]
    fn the_budget_counts_prefix_command_target_and_crlf() {
        let prefix = "bot!~bot@127.0.0.1";
        let budget = text_budget(prefix.len(), "#chan");
        let line = format!(":{prefix} PRIVMSG #chan :{}\r\n", "x".repeat(budget));
        assert_eq!(line.len(), MAX_LINE_BYTES);
        assert!(planned_prefix_len("bot", "bot") >= prefix.len());
    }

    #[test]
    fn targets_with_separators_are_refused() {
        assert!(valid_target("#chan") && valid_target("ada"));
        assert!(!valid_target("a b") && !valid_target("a,b") && !valid_target(""));
        assert!(!valid_target(":x"));
    }
}
