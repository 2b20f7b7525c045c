//! Session key parsing, shapes, display and watch rights.

use clawgate_types::{
    GLOBAL_SESSION_KEY, SessionKey, SessionKeyError, WireError, from_json, to_json,
};
use proptest::prelude::*;

#[derive(Debug)]
enum Expect {
    /// `agent:<agent_id>:<rest>`.
    Agent(&'static str, &'static str),
    Global,
    Legacy,
    Empty,
    BadCharacter,
    EmptySegment,
    TooLong,
}

#[test]
fn parse_table() {
    let long_ok = "a".repeat(512);
    let long_bad = "a".repeat(513);
    let wide_ok = "é".repeat(256); // 512 bytes
    let wide_bad = "é".repeat(257); // 514 bytes, only 257 characters
    #[rustfmt::skip]
    let cases: Vec<(&str, &str, Expect)> = vec![
        ("agent-qualified",             "agent:main:subagent:child", Expect::Agent("main", "subagent:child")),
        ("agent-qualified, one rest",   "agent:main:main",           Expect::Agent("main", "main")),
        ("agent-qualified, deep rest",  "agent:coder:acp:7:x",       Expect::Agent("coder", "acp:7:x")),
        ("agent-qualified, non-ASCII",  "agent:漢字:セッション",     Expect::Agent("漢字", "セッション")),
        ("global",                      "global",                    Expect::Global),
        ("unqualified legacy",          "main",                      Expect::Legacy),
        ("legacy with colons",          "telegram:dm:123",           Expect::Legacy),
        ("agent prefix case-sensitive", "Agent:main:x",              Expect::Legacy),
        ("512 bytes",                   &long_ok,                    Expect::Legacy),
        ("512 bytes, 2-byte chars",     &wide_ok,                    Expect::Legacy),
        ("empty",                       "",                          Expect::Empty),
        ("agent without a session",     "agent:main",                Expect::EmptySegment),
        ("empty agent id",              "agent::x",                  Expect::EmptySegment),
        ("bare agent prefix",           "agent:",                    Expect::EmptySegment),
        ("trailing colon",              "agent:main:",               Expect::EmptySegment),
        ("leading colon",               ":main",                     Expect::EmptySegment),
        ("empty legacy segment",        "x::y",                      Expect::EmptySegment),
        ("space",                       "a b",                       Expect::BadCharacter),
        ("tab",                         "a\tb",                      Expect::BadCharacter),
        ("newline",                     "agent:main:a\n",            Expect::BadCharacter),
        ("non-breaking space",          "a\u{a0}b",                  Expect::BadCharacter),
        ("control character",           "a\u{7f}b",                  Expect::BadCharacter),
        ("513 bytes",                   &long_bad,                   Expect::TooLong),
        ("514 bytes, 257 characters",   &wide_bad,                   Expect::TooLong),
    ];
    for (name, input, expect) in cases {
        let parsed = SessionKey::parse(input);
        assert_eq!(
            input.parse::<SessionKey>(),
            parsed,
            "{name}: FromStr agrees with parse"
        );
        let error = |e: fn(String) -> SessionKeyError| Err(e(input.to_owned()));
        match expect {
            Expect::Empty => assert_eq!(parsed, Err(SessionKeyError::Empty), "{name}"),
            Expect::BadCharacter => {
                assert_eq!(parsed, error(SessionKeyError::BadCharacter), "{name}")
            }
            Expect::EmptySegment => {
                assert_eq!(parsed, error(SessionKeyError::EmptySegment), "{name}")
            }
            Expect::TooLong => assert_eq!(parsed, error(SessionKeyError::TooLong), "{name}"),
            ref shape => {
                let key = parsed.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(key.as_str(), input, "{name}");
                let (agent_id, rest, global) = match *shape {
                    Expect::Agent(agent, rest) => (Some(agent), rest, false),
                    Expect::Global => (None, input, true),
                    _ => (None, input, false),
                };
                assert_eq!(key.agent_id(), agent_id, "{name}: agent_id");
                assert_eq!(key.rest(), rest, "{name}: rest");
                assert_eq!(key.is_agent_qualified(), agent_id.is_some(), "{name}");
                assert_eq!(
                    key.can_watch(),
                    agent_id.is_some(),
                    "{name}: only agent keys watch"
                );
                assert_eq!(key.is_global(), global, "{name}: is_global");
                // Display round-trips, and the wire form is the plain string.
                assert_eq!(key.to_string(), input, "{name}");
                assert_eq!(
                    SessionKey::parse(&key.to_string()).as_ref(),
                    Ok(&key),
                    "{name}"
                );
                assert_eq!(to_json(&key).unwrap(), serde_json::json!(input).to_string());
                assert_eq!(
                    from_json::<SessionKey>(&to_json(&key).unwrap()).unwrap(),
                    key
                );
                continue;
            }
        }
        // Whatever `parse` rejects, decoding rejects as Invalid.
        let decoded = from_json::<SessionKey>(&serde_json::json!(input).to_string());
        assert!(
            matches!(decoded, Err(WireError::Invalid { .. })),
            "{name}: {decoded:?}"
        );
    }
}

#[test]
fn global_key() {
    let global = SessionKey::global();
    assert_eq!(global.as_str(), GLOBAL_SESSION_KEY);
    assert_eq!(GLOBAL_SESSION_KEY, "global");
    assert_eq!(SessionKey::parse("global").unwrap(), global);
    assert!(global.is_global());
    assert!(!global.can_watch());
    assert_eq!(global.agent_id(), None);
    assert!(!SessionKey::parse("agent:main:global").unwrap().is_global());
}

#[test]
fn global_sessions_of_two_agents_are_distinct_keys_that_read_global() {
    let a = SessionKey::global_of("alpha").expect("a valid agent id");
    let b = SessionKey::global_of("beta").expect("a valid agent id");
    assert_ne!(a, b);
    assert_ne!(a, SessionKey::global(), "a bare `global` names no agent");
    for (key, agent) in [(&a, "alpha"), (&b, "beta")] {
        assert_eq!(key.as_str(), "global");
        assert_eq!(key.to_string(), "global");
        assert!(key.is_global());
        assert!(!key.can_watch(), "global-scope sessions never watch");
        assert_eq!(key.agent_id(), None);
        assert_eq!(key.global_agent(), Some(agent));
        assert_eq!(to_json(key).expect("serializes"), "\"global\"");
        assert_eq!(key.storage_key(), format!("global::{agent}"));
        assert_eq!(
            SessionKey::from_storage(&key.storage_key()).expect("reads back"),
            *key
        );
    }
    // The storage spelling is no key `parse` accepts, so it cannot collide with one.
    assert!(SessionKey::parse("global::alpha").is_err());
    let legacy = SessionKey::parse("global@alpha").expect("a legacy key");
    assert_eq!(legacy.storage_key(), "global@alpha");
    assert_eq!(SessionKey::global().storage_key(), "global");
    assert_eq!(
        SessionKey::from_storage("global").expect("bare global"),
        SessionKey::global()
    );
    for bad in ["", "a:b", "a b", "a\u{7}"] {
        assert_eq!(
            SessionKey::global_of(bad),
            Err(SessionKeyError::BadAgentId(bad.to_owned()))
        );
    }
}

#[test]
fn for_agent_builds_qualified_keys() {
    let key = SessionKey::for_agent("main", "subagent:child").unwrap();
    assert_eq!(key, SessionKey::parse("agent:main:subagent:child").unwrap());
    assert_eq!(
        (key.agent_id(), key.rest()),
        (Some("main"), "subagent:child")
    );
    assert_eq!(
        SessionKey::for_agent("", "x"),
        Err(SessionKeyError::EmptySegment("agent::x".into()))
    );
    assert_eq!(
        SessionKey::for_agent("main", ""),
        Err(SessionKeyError::EmptySegment("agent:main:".into()))
    );
    assert!(matches!(
        SessionKey::for_agent("my agent", "x"),
        Err(SessionKeyError::BadCharacter(_))
    ));
}

#[test]
fn errors_and_debug_show_the_key() {
    let error = SessionKey::parse("x::y").unwrap_err();
    assert!(error.to_string().contains("\"x::y\""), "{error}");
    assert_eq!(
        SessionKey::parse("").unwrap_err().to_string(),
        "session key is empty"
    );
    assert!(
        SessionKey::parse(&"a".repeat(513))
            .unwrap_err()
            .to_string()
            .contains("512 bytes")
    );
    let key = SessionKey::parse("agent:main:x").unwrap();
    assert_eq!(format!("{key:?}"), r#"SessionKey("agent:main:x")"#);
}

proptest! {
    #[test]
    fn qualified_keys_split_back_into_their_parts(
        agent in "[A-Za-z0-9_.é-]{1,12}",
        rest in proptest::collection::vec("[A-Za-z0-9_.漢-]{1,8}", 1..4),
    ) {
        let rest = rest.join(":");
        let key = SessionKey::for_agent(&agent, &rest).unwrap();
        prop_assert_eq!(key.agent_id(), Some(agent.as_str()));
        prop_assert_eq!(key.rest(), rest.as_str());
        prop_assert!(key.can_watch());
        let shown = key.to_string();
        prop_assert_eq!(SessionKey::parse(&shown).unwrap(), key);
    }

    #[test]
    fn any_valid_key_displays_back_to_itself(key in crate::strategies::session_key()) {
        prop_assert_eq!(SessionKey::parse(&key.to_string()).unwrap(), key.clone());
        prop_assert_eq!(key.can_watch(), key.agent_id().is_some());
        prop_assert_eq!(key.can_watch(), key.as_str().starts_with("agent:"));
    }

    #[test]
    fn parse_never_panics(text in any::<String>()) {
        if let Ok(key) = SessionKey::parse(&text) {
            prop_assert_eq!(key.as_str(), text.as_str());
            prop_assert!(key.rest().len() <= text.len());
        }
    }
}
