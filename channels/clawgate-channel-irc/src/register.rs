//! Registration with the server, as a state machine over parsed lines (so it is tested without
//! a socket): `CAP LS 302`, `CAP REQ` for the IRCv3 capabilities the channel uses when the
//! server offers them ([`WANTED_CAPS`]) and for `sasl` (then SASL PLAIN) when configured,
//! `CAP END`; `PASS`, `NICK`/`USER`, alternate nicks on 433, done at `001`. A server that does
//! not know `CAP` answers 421 and registers us anyway.

use std::collections::BTreeSet;

use clawgate_channel_sdk::Secret;
use irc_proto::{CapSubCommand, Command, Message, Response};

/// How we authenticate.
#[derive(Debug, Clone)]
pub enum Auth {
    /// No password.
    None,
    /// A server password (`PASS`).
    ServerPassword(Secret),
    /// SASL PLAIN with this account and password (the server must offer `sasl` in `CAP LS`).
    SaslPlain {
        /// The account name.
        account: String,
        /// Its password.
        password: Secret,
    },
}

/// Why registration failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The server refused the credentials: retrying will not help until they are fixed.
    #[error("the server refused the login: {0}")]
    Refused(String),
    /// Every configured nick is taken.
    #[error(
        "every nick is in use ({0}); add alternate_nicks to the settings or wait for the nick \
         to be free"
    )]
    NicksTaken(String),
    /// The server cannot do what the settings ask (SASL without `CAP sasl`).
    #[error("{0}")]
    Unsupported(String),
}

/// What the machine asks the connection to do after a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Keep reading.
    Continue,
    /// Registered under this nick.
    Done(String),
}

/// The IRCv3 capabilities requested when offered: `echo-message` + `labeled-response` make the
/// server's echo of a line its receipt (with `message-tags` for the `label` and `msgid` tags,
/// `batch` for a labeled answer of several lines); `server-time` stamps what we receive.
pub const WANTED_CAPS: [&str; 5] = [
    "echo-message",
    "labeled-response",
    "message-tags",
    "batch",
    "server-time",
];

/// The registration of one connection.
#[derive(Debug)]
pub struct Registration {
    nicks: Vec<String>,
    next_nick: usize,
    auth: Auth,
    out: Vec<String>,
    /// Offered so far in a `CAP LS` of several lines.
    offered: BTreeSet<String>,
    /// `CAP REQ`s not answered yet.
    pending_reqs: usize,
    /// SASL runs: `CAP END` waits for its 903.
    sasl_running: bool,
    /// `CAP END` was written (or the server does not do CAP).
    cap_done: bool,
    /// What the server granted on this connection.
    granted: BTreeSet<String>,
}

/// Standard base64 (RFC 4648 §4, with padding), for `AUTHENTICATE`.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The `AUTHENTICATE` lines carrying a SASL PLAIN response: base64 in pieces of 400, and a
/// final `+` when the last piece is exactly 400 long (IRCv3 SASL 3.1).
pub fn sasl_plain_lines(account: &str, password: &str) -> Vec<String> {
    let payload = base64(format!("{account}\0{account}\0{password}").as_bytes());
    let mut lines: Vec<String> = payload
        .as_bytes()
        .chunks(400)
        .map(|c| format!("AUTHENTICATE {}", String::from_utf8_lossy(c)))
        .collect();
    if payload.len().is_multiple_of(400) {
        lines.push("AUTHENTICATE +".to_owned());
    }
    lines
}

impl Registration {
    /// Registration as `nicks[0]` (then the others, in order, while taken), logging in as
    /// `user` with `realname`. The first lines to write are in [`Registration::take_output`].
    pub fn start(nicks: Vec<String>, user: &str, realname: &str, auth: Auth) -> Registration {
        let mut out = Vec::new();
        if let Auth::ServerPassword(password) = &auth {
            out.push(format!("PASS {}", password.expose()));
        }
        // CAP LS first holds registration until CAP END (IRCv3 capability negotiation).
        out.push("CAP LS 302".to_owned());
        out.push(format!("NICK {}", nicks[0]));
        out.push(format!("USER {user} 0 * :{realname}"));
        Registration {
            nicks,
            next_nick: 1,
            auth,
            out,
            offered: BTreeSet::new(),
            pending_reqs: 0,
            sasl_running: false,
            cap_done: false,
            granted: BTreeSet::new(),
        }
    }

    /// The capabilities the server granted (`CAP ACK`) on this connection.
    pub fn granted(&self) -> &BTreeSet<String> {
        &self.granted
    }

    /// Writes `CAP END` once every request is answered and SASL (if any) is over.
    fn maybe_end(&mut self) {
        if !self.cap_done && self.pending_reqs == 0 && !self.sasl_running {
            self.cap_done = true;
            self.out.push("CAP END".to_owned());
        }
    }

    fn wants_sasl(&self) -> bool {
        matches!(self.auth, Auth::SaslPlain { .. })
    }

    /// Lines to write now.
    pub fn take_output(&mut self) -> Vec<String> {
        std::mem::take(&mut self.out)
    }

    /// Feeds one line from the server.
    pub fn on_message(&mut self, message: &Message) -> Result<Step, RegisterError> {
        match &message.command {
            Command::CAP(_, CapSubCommand::LS, first, second) => {
                let caps = second.as_deref().or(first.as_deref()).unwrap_or_default();
                // `CAP * LS * :…` says more lines follow; the last has no `*`.
                let more = first.as_deref() == Some("*") && second.is_some();
                // A 302 listing may carry values (`sasl=PLAIN,EXTERNAL`): the name is before `=`.
                self.offered.extend(
                    caps.split_whitespace()
                        .map(|c| c.split('=').next().unwrap_or(c).to_owned()),
                );
                if more {
                    return Ok(Step::Continue);
                }
                let wanted: Vec<&str> = WANTED_CAPS
                    .into_iter()
                    .filter(|c| self.offered.contains(*c))
                    .collect();
                if !wanted.is_empty() {
                    self.pending_reqs += 1;
                    self.out.push(format!("CAP REQ :{}", wanted.join(" ")));
                }
                if self.wants_sasl() {
                    if !self.offered.contains("sasl") {
                        return Err(RegisterError::Unsupported(
                            "SASL is configured but the server does not offer the sasl \
                             capability; remove sasl_account or use password_env as a server \
                             password"
                                .to_owned(),
                        ));
                    }
                    // Its own request: a NAK of the others must not take SASL down with it.
                    self.pending_reqs += 1;
                    self.sasl_running = true;
                    self.out.push("CAP REQ :sasl".to_owned());
                }
                self.maybe_end();
            }
            Command::CAP(_, CapSubCommand::ACK, first, second) => {
                let caps = second.as_deref().or(first.as_deref()).unwrap_or_default();
                self.pending_reqs = self.pending_reqs.saturating_sub(1);
                let acked: Vec<&str> = caps.split_whitespace().collect();
                self.granted
                    .extend(acked.iter().map(|c| c.trim_start_matches('-').to_owned()));
                if acked.contains(&"sasl") {
                    self.out.push("AUTHENTICATE PLAIN".to_owned());
                }
                self.maybe_end();
            }
            Command::CAP(_, CapSubCommand::NAK, first, second) => {
                let caps = second.as_deref().or(first.as_deref()).unwrap_or_default();
                self.pending_reqs = self.pending_reqs.saturating_sub(1);
                if caps.split_whitespace().any(|c| c == "sasl") {
                    return Err(RegisterError::Unsupported(
                        "the server refused the sasl capability".to_owned(),
                    ));
                }
                // Refused as a whole (a request is atomic): carry on as plain IRC.
                self.maybe_end();
            }
            Command::Response(Response::ERR_UNKNOWNCOMMAND, args)
                if args.get(1).is_some_and(|c| c.eq_ignore_ascii_case("CAP")) =>
            {
                if self.wants_sasl() {
                    return Err(RegisterError::Unsupported(
                        "SASL is configured but the server does not know CAP; remove \
                         sasl_account or use password_env as a server password"
                            .to_owned(),
                    ));
                }
                // A pre-IRCv3 server: it registers us without negotiation.
                self.cap_done = true;
            }
            Command::AUTHENTICATE(data) if data == "+" => {
                if let Auth::SaslPlain { account, password } = &self.auth {
                    let lines = sasl_plain_lines(account, password.expose());
                    self.out.extend(lines);
                }
            }
            Command::Response(Response::RPL_SASLSUCCESS, _) => {
                self.sasl_running = false;
                self.maybe_end();
            }
            Command::Response(
                code @ (Response::ERR_SASLFAIL
                | Response::ERR_SASLTOOLONG
                | Response::ERR_SASLABORT
                | Response::ERR_NICKLOCKED),
                args,
            ) => {
                return Err(RegisterError::Refused(format!(
                    "SASL failed ({}: {})",
                    *code as u16,
                    args.last().map_or("", String::as_str)
                )));
            }
            Command::Response(Response::ERR_PASSWDMISMATCH, _) => {
                return Err(RegisterError::Refused(
                    "the server password is wrong (464); check password_env".to_owned(),
                ));
            }
            Command::Response(
                Response::ERR_NICKNAMEINUSE
                | Response::ERR_NICKCOLLISION
                | Response::ERR_UNAVAILRESOURCE
                | Response::ERR_ERRONEOUSNICKNAME,
                _,
            ) => {
                let Some(nick) = self.nicks.get(self.next_nick) else {
                    return Err(RegisterError::NicksTaken(self.nicks.join(", ")));
                };
                self.next_nick += 1;
                self.out.push(format!("NICK {nick}"));
            }
            Command::Response(Response::RPL_WELCOME, args) => {
                let nick = args
                    .first()
                    .cloned()
                    .unwrap_or_else(|| self.nicks[self.next_nick - 1].clone());
                return Ok(Step::Done(nick));
            }
            Command::ERROR(reason) => {
                return Err(RegisterError::Refused(format!(
                    "the server closed the link: {reason}"
                )));
            }
            _ => {}
        }
        Ok(Step::Continue)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn feed(registration: &mut Registration, line: &str) -> Result<Step, RegisterError> {
        registration.on_message(&line.parse::<Message>().expect("a valid line"))
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn sasl_plain_runs_the_whole_exchange() {
        let mut r = Registration::start(
            vec!["bot".into()],
            "bot",
            "clawgate",
            Auth::SaslPlain {
                account: "jilles".into(),
                password: Secret::new("sesame"),
            },
        );
        assert_eq!(
            r.take_output(),
            vec!["CAP LS 302", "NICK bot", "USER bot 0 * :clawgate"]
        );
        assert_eq!(
            feed(
                &mut r,
                ":irc.test CAP * LS :multi-prefix sasl=PLAIN,EXTERNAL"
            ),
            Ok(Step::Continue)
        );
        assert_eq!(r.take_output(), vec!["CAP REQ :sasl"]);
        feed(&mut r, ":irc.test CAP * ACK :sasl").unwrap();
        assert_eq!(r.take_output(), vec!["AUTHENTICATE PLAIN"]);
        feed(&mut r, "AUTHENTICATE +").unwrap();
        // The example of IRCv3's SASL page: "jilles\0jilles\0sesame".
        assert_eq!(
            r.take_output(),
            vec!["AUTHENTICATE amlsbGVzAGppbGxlcwBzZXNhbWU="]
        );
        feed(&mut r, ":irc.test 903 bot :SASL authentication successful").unwrap();
        assert_eq!(r.take_output(), vec!["CAP END"]);
        assert_eq!(
            feed(&mut r, ":irc.test 001 bot :Welcome"),
            Ok(Step::Done("bot".into()))
        );
    }

    #[test]
    fn a_refused_sasl_login_and_a_server_without_sasl_are_errors() {
        let sasl = || Auth::SaslPlain {
            account: "a".into(),
            password: Secret::new("wrong"),
        };
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", sasl());
        assert!(matches!(
            feed(&mut r, ":irc.test 904 bot :SASL authentication failed"),
            Err(RegisterError::Refused(_))
        ));
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", sasl());
        assert!(matches!(
            feed(&mut r, ":irc.test CAP * LS :multi-prefix"),
            Err(RegisterError::Unsupported(_))
        ));
        // A continued LS waits for its last line.
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", sasl());
        r.take_output();
        feed(&mut r, ":irc.test CAP * LS * :multi-prefix").unwrap();
        assert!(r.take_output().is_empty());
        feed(&mut r, ":irc.test CAP * LS :sasl").unwrap();
        assert_eq!(r.take_output(), vec!["CAP REQ :sasl"]);
    }

    #[test]
    fn long_sasl_payloads_are_cut_at_400_and_closed_with_a_plus() {
        // 3 × 100 bytes of payload → exactly 400 base64 characters.
        let lines = sasl_plain_lines(&"a".repeat(149), "");
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0].len(), "AUTHENTICATE ".len() + 400);
        assert_eq!(lines[1], "AUTHENTICATE +");
    }

    #[test]
    fn taken_nicks_move_to_the_alternates_then_fail() {
        let mut r = Registration::start(
            vec!["bot".into(), "bot_".into()],
            "bot",
            "x",
            Auth::ServerPassword(Secret::new("pw")),
        );
        assert_eq!(r.take_output()[0], "PASS pw");
        feed(&mut r, ":irc.test 433 * bot :Nickname already in use").unwrap();
        assert_eq!(r.take_output(), vec!["NICK bot_"]);
        assert!(matches!(
            feed(&mut r, ":irc.test 433 * bot_ :Nickname already in use"),
            Err(RegisterError::NicksTaken(_))
        ));
    }

    #[test]
    fn offered_ircv3_caps_are_requested_granted_and_kept() {
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", Auth::None);
        assert_eq!(
            r.take_output(),
            vec!["CAP LS 302", "NICK bot", "USER bot 0 * :x"]
        );
        // InspIRCd 3.15's listing, split over two lines, with its trailing space.
        feed(
            &mut r,
            ":irc.test CAP * LS * :account-notify away-notify batch echo-message",
        )
        .unwrap();
        assert!(r.take_output().is_empty(), "waits for the last LS line");
        feed(
            &mut r,
            ":irc.test CAP * LS :labeled-response message-tags server-time ",
        )
        .unwrap();
        assert_eq!(
            r.take_output(),
            vec!["CAP REQ :echo-message labeled-response message-tags batch server-time"]
        );
        feed(
            &mut r,
            "@time=2026-12-01T21:23:09.724Z :irc.test CAP bot ACK :echo-message \
             labeled-response message-tags batch server-time",
        )
        .unwrap();
        assert_eq!(r.take_output(), vec!["CAP END"]);
        assert!(r.granted().contains("echo-message") && r.granted().contains("labeled-response"));
        assert_eq!(r.granted().len(), 5);
    }

    #[test]
    fn without_offered_caps_or_cap_support_registration_is_plain() {
        // ngircd offers only multi-prefix: nothing to ask, CAP END at once.
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", Auth::None);
        r.take_output();
        feed(&mut r, ":irc.test CAP * LS :multi-prefix").unwrap();
        assert_eq!(r.take_output(), vec!["CAP END"]);
        assert!(r.granted().is_empty());
        // A refused request leaves the connection without the caps.
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", Auth::None);
        r.take_output();
        feed(&mut r, ":irc.test CAP * LS :echo-message labeled-response").unwrap();
        assert_eq!(
            r.take_output(),
            vec!["CAP REQ :echo-message labeled-response"]
        );
        feed(&mut r, ":irc.test CAP * NAK :echo-message labeled-response").unwrap();
        assert_eq!(r.take_output(), vec!["CAP END"]);
        assert!(r.granted().is_empty());
        // A server without CAP: 421, then it registers us.
        let mut r = Registration::start(vec!["bot".into()], "bot", "x", Auth::None);
        r.take_output();
        feed(&mut r, ":old.irc 421 * CAP :Unknown command").unwrap();
        assert!(r.take_output().is_empty());
        assert_eq!(
            feed(&mut r, ":old.irc 001 bot :Welcome"),
            Ok(Step::Done("bot".into()))
        );
    }

    #[test]
    fn sasl_and_ircv3_caps_are_separate_requests() {
        let mut r = Registration::start(
            vec!["bot".into()],
            "bot",
            "x",
            Auth::SaslPlain {
                account: "a".into(),
                password: Secret::new("pw"),
            },
        );
        r.take_output();
        feed(
            &mut r,
            ":irc.test CAP * LS :echo-message labeled-response sasl=PLAIN",
        )
        .unwrap();
        assert_eq!(
            r.take_output(),
            vec!["CAP REQ :echo-message labeled-response", "CAP REQ :sasl"]
        );
        feed(
            &mut r,
            ":irc.test CAP bot NAK :echo-message labeled-response",
        )
        .unwrap();
        assert!(r.take_output().is_empty(), "SASL still to run");
        feed(&mut r, ":irc.test CAP bot ACK :sasl").unwrap();
        assert_eq!(r.take_output(), vec!["AUTHENTICATE PLAIN"]);
        feed(&mut r, "AUTHENTICATE +").unwrap();
        r.take_output();
        feed(&mut r, ":irc.test 903 bot :SASL authentication successful").unwrap();
        assert_eq!(r.take_output(), vec!["CAP END"]);
        assert_eq!(r.granted().iter().collect::<Vec<_>>(), vec!["sasl"]);
    }
}
