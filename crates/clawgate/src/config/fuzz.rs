//! The configuration file as outside input: a full valid file mutated at random places (wrong
//! types, missing and unknown keys, huge and negative numbers, long and odd strings, NUL, deep
//! nesting), arbitrary trees written as TOML, and arbitrary text. Every file parses or is
//! refused with an error naming the file; a well-formed TOML file that is refused names the
//! key; nothing panics or holds memory out of proportion to the file. `CLAWGATE_FUZZ_CASES`
//! cases (`cargo xtask soak` sets it high).

use clawgate_fuzz::proptest::prelude::*;
use clawgate_fuzz::{meter, toml_text};
use serde_json::Value;

use super::{Config, ConfigError};

const FILE: &str = "fuzz.toml";

/// Every section, a `[[agents]]` and a `[[channels]]` with settings.
const VALID: &str = r#"
state_dir = "/var/lib/clawgate"
[state]
backend = "sqlite"
account_lease_secs = 30
[gateway]
listen = "127.0.0.1:0"
shutdown_grace_ms = 3000
[durability]
policy = "best_effort"
sync = "normal"
[retry]
max_attempts = 3
base_delay_ms = 500
max_delay_ms = 60000
time_to_live_secs = 3600
[retention]
signal_log_days = 7
lease_days = 30
inbound_days = 7
outbox_days = 7
[sessions]
visibility = "all"
a2a = { enabled = true, allow = ["ops-*"] }
[[agents]]
id = "coder"
command = ["sh", "--acp"]
[[channels]]
kind = "qa"
account = "bot"
agent = "coder"
max_turn_attempts = 3
allow_bots = false
[channels.settings]
base_url = "http://127.0.0.1:9000"
token_env = "QA_TOKEN"
"#;

/// The file parses, or is refused naming the file (and, when `named` is true, a key).
fn parses_or_names(text: &str, named: bool) -> Result<(), TestCaseError> {
    let (outcome, peak) = meter::measure(|| Config::parse(text, FILE));
    prop_assert!(
        peak <= meter::allowance(text.len()),
        "parsing held {} bytes for a {}-byte file",
        peak,
        text.len()
    );
    match outcome {
        Ok(_) => Ok(()),
        Err(error @ ConfigError::Invalid { .. }) => {
            let ConfigError::Invalid { file, key, reason } = &error else {
                unreachable!()
            };
            prop_assert_eq!(file, FILE);
            prop_assert!(!reason.trim().is_empty(), "no reason: {}", error);
            if named {
                prop_assert!(
                    !key.is_empty() && key != "(file)",
                    "a well-formed file refused without naming a key: {}",
                    error
                );
            }
            Ok(())
        }
        Err(other) => Err(TestCaseError::fail(format!("not a parse error: {other}"))),
    }
}

fn valid_tree() -> Value {
    toml::from_str(VALID).expect("the valid file is TOML")
}

#[test]
fn the_valid_file_parses_and_survives_its_toml_rewrite() {
    Config::parse(VALID, FILE).expect("valid");
    let rewritten = toml_text(&valid_tree());
    assert_eq!(
        Config::parse(&rewritten, FILE).expect("the rewrite is valid"),
        Config::parse(VALID, FILE).expect("valid"),
        "{rewritten}"
    );
}

#[test]
fn mutated_files_parse_or_name_the_key() {
    clawgate_fuzz::run(
        "config mutations",
        clawgate_fuzz::mutated_json(vec![valid_tree()]),
        |tree| parses_or_names(&toml_text(&tree), true),
    );
}

#[test]
fn arbitrary_files_parse_or_are_refused() {
    let texts = prop_oneof![
        clawgate_fuzz::any_json().prop_map(|tree| toml_text(&tree)),
        clawgate_fuzz::json_texts(vec![valid_tree()])
            .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        (any::<usize>(), clawgate_fuzz::odd_string()).prop_map(|(at, insert)| {
            // The valid file with odd text spliced in at a character boundary.
            let mut text = VALID.to_owned();
            let mut i = at % (text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            text.insert_str(i, &insert);
            text
        }),
    ];
    clawgate_fuzz::run("config text", texts, |text| parses_or_names(&text, false));
}
