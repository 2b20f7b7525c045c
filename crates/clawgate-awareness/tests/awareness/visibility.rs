//! Session visibility: the matrix (one table), a2a patterns, and the monotonicity properties.

use clawgate_awareness::{
    Actor, NewSession, Requester, SessionStatusParams, SessionsHistoryParams, SessionsListParams,
    SessionsSendParams, can_see_session_row, pattern_matches,
};
use clawgate_types::{
    AcpBackend, AcpSessionOwner, AgentToAgentPolicy, GatewayInstanceId, SessionKey,
    SessionVisibility, SessionVisibilityInput, VisibilityRow,
};
use proptest::prelude::*;

use crate::helpers::{Harness, T0, key};

const ROW_KINDS: [&str; 5] = [
    "self",
    "same-agent row",
    "other-agent row",
    "requester-owned spawned ACP row of another agent",
    "child spawned by requester",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    List,
    History,
    Send,
    Status,
}

use SessionVisibility::{Agent, All, OwnSession, Tree};
const Y: bool = true;
const N: bool = false;

/// (visibility, a2a enabled, sandboxed) => visible?, per row kind in `ROW_KINDS` order.
/// One expectation answers all four actions: list, history, send and status.
#[rustfmt::skip]
const MATRIX: &[(SessionVisibility, bool, bool, [bool; 5])] = &[
    (OwnSession, N, N, [Y, N, N, N, N]),
    (OwnSession, N, Y, [Y, N, N, N, N]),
    (OwnSession, Y, N, [Y, N, N, N, N]),
    (OwnSession, Y, Y, [Y, N, N, N, N]),
    (Tree,       N, N, [Y, N, N, Y, Y]),
    (Tree,       N, Y, [Y, N, N, Y, Y]),
    (Tree,       Y, N, [Y, N, N, Y, Y]),
    (Tree,       Y, Y, [Y, N, N, Y, Y]),
    (Agent,      N, N, [Y, Y, N, Y, Y]),
    (Agent,      N, Y, [Y, N, N, Y, Y]), // sandboxed: clamped to tree
    (Agent,      Y, N, [Y, Y, N, Y, Y]), // agent ignores a2a
    (Agent,      Y, Y, [Y, N, N, Y, Y]),
    (All,        N, N, [Y, Y, N, Y, Y]), // the owned ACP child stays visible with a2a off
    (All,        N, Y, [Y, N, N, Y, Y]),
    (All,        Y, N, [Y, Y, Y, Y, Y]),
    (All,        Y, Y, [Y, N, N, Y, Y]),
];

async fn matrix_world() -> (Harness, SessionKey, [SessionKey; 5]) {
    let h = Harness::new();
    let me = h.create("agent:main:main").await;
    let same = h.create("agent:main:other").await;
    let other = h.create("agent:ops:main").await;
    // Owned only through the ACP owner record on the row (no spawn edge fields set).
    let acp_key = key("agent:codex:acp:7");
    let acp = AcpSessionOwner {
        session_key: acp_key.clone(),
        spawned_by: None,
        parent_session_key: None,
        owner_session_key: me.clone(),
        agent_id: "codex".into(),
        backend: AcpBackend::Acpx,
        gateway_instance_id: GatewayInstanceId::parse("gw-1").unwrap(),
        created_at: T0,
    };
    h.awareness
        .create_session(
            NewSession {
                acp_owner: Some(acp),
                ..NewSession::new(acp_key.clone())
            },
            Actor::agent(&me),
        )
        .await
        .unwrap();
    let child = h
        .spawn(&me, "agent:main:subagent:kid")
        .await
        .row
        .session_key;
    (h, me.clone(), [me, same, other, acp_key, child])
}

async fn allowed(h: &Harness, req: &Requester, row: &SessionKey, action: Action) -> bool {
    match action {
        Action::List => h
            .tools
            .sessions_list(req, &SessionsListParams::default())
            .await
            .unwrap()
            .sessions
            .iter()
            .any(|e| e.key == *row),
        Action::History => h
            .tools
            .sessions_history(
                req,
                &SessionsHistoryParams {
                    session_key: row.clone(),
                    limit: None,
                },
            )
            .await
            .is_ok(),
        Action::Send => h
            .tools
            .sessions_send(
                req,
                &SessionsSendParams {
                    session_key: row.clone(),
                    message: "hi".into(),
                    watch: None,
                },
            )
            .await
            .is_ok(),
        Action::Status => h
            .tools
            .session_status(
                req,
                &SessionStatusParams {
                    session_key: row.clone(),
                    changes_since: None,
                },
            )
            .await
            .is_ok(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn visibility_matrix() {
    let (h, me, rows) = matrix_world().await;
    let mut failures = Vec::new();
    let mut cases = 0;
    for &(visibility, a2a, sandboxed, expected) in MATRIX {
        let req = Requester {
            session_key: me.clone(),
            visibility,
            a2a_policy: AgentToAgentPolicy {
                enabled: a2a,
                allow: vec!["Op*".into()],
            },
            sandboxed,
        };
        for (kind, (row, want)) in ROW_KINDS.iter().zip(rows.iter().zip(expected)) {
            for action in [Action::List, Action::History, Action::Send, Action::Status] {
                cases += 1;
                let got = allowed(&h, &req, row, action).await;
                if got != want {
                    failures.push(format!(
                        "{visibility:?} / a2a {} / {} / {kind} / {action:?}: expected {want}, got {got}",
                        if a2a { "on" } else { "off" },
                        if sandboxed { "sandboxed" } else { "not sandboxed" },
                    ));
                }
            }
        }
    }
    assert_eq!(cases, 4 * 2 * 2 * 5 * 4);
    assert!(
        failures.is_empty(),
        "visibility matrix failures:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a2a_patterns() {
    #[rustfmt::skip]
    let table: &[(&str, &str, bool, &str)] = &[
        ("ops", "ops", true, "exact name"),
        ("Ops", "ops", false, "exact names are case-sensitive"),
        ("OP*", "ops", true, "wildcards are case-insensitive"),
        ("*", "anything", true, "a lone star allows every agent"),
        ("", "ops", false, "empty pattern fails closed"),
        ("   ", "ops", false, "blank pattern fails closed"),
        ("o.s", "ops", false, "regex dot is literal"),
        ("o.s*", "o.sx", true, "literal dot inside a wildcard"),
        ("(ops|dev)*", "ops", false, "regex alternation is literal"),
        ("ops+", "opss", false, "regex plus is literal"),
        ("[o]ps*", "ops", false, "brackets are literal"),
        ("*-bot", "support-bot", true, "suffix wildcard"),
        ("*-bot", "support-bots", false, "suffix must end the id"),
        ("a*b*c", "axxbyyc", true, "several stars"),
        ("a*b*c", "axxcyyb", false, "pieces in order"),
    ];
    for &(pattern, agent, want, case) in table {
        assert_eq!(
            pattern_matches(pattern, agent),
            want,
            "{case}: {pattern:?} vs {agent:?}"
        );
    }
    let blank = AgentToAgentPolicy {
        enabled: true,
        allow: vec![String::new(), " ".into()],
    };
    assert!(!clawgate_awareness::agent_allowed(&blank, "ops"));
}

#[test]
fn pathological_patterns_match_in_linear_time() {
    // With backtracking this is exponential in the number of stars; here it is a few scans.
    let pattern = format!("{}b", "*a".repeat(40));
    let text = "a".repeat(50_000);
    let started = std::time::Instant::now();
    assert!(!pattern_matches(&pattern, &text));
    assert!(pattern_matches(&pattern, &format!("{text}b")));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

fn arb_key() -> impl Strategy<Value = SessionKey> {
    prop_oneof![
        Just(key("agent:main:main")),
        Just(key("agent:main:w1")),
        Just(key("agent:ops:main")),
        Just(key("agent:codex:acp:1")),
        Just(SessionKey::global()),
    ]
}

fn arb_input() -> impl Strategy<Value = SessionVisibilityInput> {
    (
        arb_key(),
        arb_key(),
        prop_oneof![Just("main"), Just("ops"), Just("codex"), Just("Ops")],
        proptest::option::of(arb_key()),
        proptest::option::of(arb_key()),
        proptest::option::of(arb_key()),
        any::<bool>(),
        proptest::collection::vec(
            prop_oneof![
                Just("ops"),
                Just("O*"),
                Just(""),
                Just("*x*"),
                Just("codex")
            ],
            0..3,
        ),
        any::<bool>(),
    )
        .prop_map(
            |(req, row_key, agent, owner, spawned, parent, a2a, allow, sandboxed)| {
                SessionVisibilityInput {
                    requester_session_key: req,
                    row: VisibilityRow {
                        key: row_key,
                        agent_id: agent.into(),
                        owner_session_key: owner,
                        spawned_by: spawned,
                        parent_session_key: parent,
                    },
                    visibility: SessionVisibility::Tree,
                    a2a_policy: AgentToAgentPolicy {
                        enabled: a2a,
                        allow: allow.into_iter().map(String::from).collect(),
                    },
                    requester_sandboxed: sandboxed,
                }
            },
        )
}

fn with(input: &SessionVisibilityInput, visibility: SessionVisibility, sandboxed: bool) -> bool {
    can_see_session_row(&SessionVisibilityInput {
        visibility,
        requester_sandboxed: sandboxed,
        ..input.clone()
    })
}

proptest! {
    #[test]
    fn wider_visibility_never_hides_what_narrower_shows(input in arb_input()) {
        for sandboxed in [false, true] {
            let own = with(&input, OwnSession, sandboxed);
            let tree = with(&input, Tree, sandboxed);
            let agent = with(&input, Agent, sandboxed);
            let all = with(&input, All, sandboxed);
            prop_assert!(!own || tree, "tree ⊇ self");
            prop_assert!(!tree || agent, "agent ⊇ tree");
            prop_assert!(!tree || all, "all ⊇ tree");
            prop_assert!(!agent || all, "all ⊇ agent");
        }
        for v in [OwnSession, Tree, Agent, All] {
            prop_assert!(!with(&input, v, true) || with(&input, v, false), "a sandbox never widens");
            prop_assert!(!with(&input, v, true) || with(&input, Tree, false), "sandboxed ⊆ tree");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn what_list_shows_history_never_denies(
        rows in proptest::collection::vec(
            (prop_oneof![Just("main"), Just("ops")], proptest::option::of(0usize..3), any::<bool>()), 1..6),
        visibility in prop_oneof![Just(OwnSession), Just(Tree), Just(Agent), Just(All)],
        a2a in any::<bool>(),
        sandboxed in any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async {
            let h = Harness::new();
            let me = h.create("agent:main:main").await;
            let mut keys = vec![me.clone()];
            for (n, (agent, owner, by_me)) in rows.iter().enumerate() {
                let k = key(&format!("agent:{agent}:s{n}"));
                let owner = owner.and_then(|i| keys.get(i).cloned());
                let new = NewSession {
                    owner_session_key: owner,
                    spawned_by: by_me.then(|| me.clone()),
                    ..NewSession::new(k.clone())
                };
                h.awareness.create_session(new, Actor::system("t")).await.unwrap();
                keys.push(k);
            }
            let req = Requester {
                session_key: me.clone(),
                visibility,
                a2a_policy: AgentToAgentPolicy { enabled: a2a, allow: vec!["OPS".into(), "*p*".into()] },
                sandboxed,
            };
            let list = h.tools.sessions_list(&req, &SessionsListParams::default()).await.unwrap();
            let listed: Vec<SessionKey> = list.sessions.iter().map(|e| e.key.clone()).collect();
            for k in &keys {
                let history = allowed(&h, &req, k, Action::History).await;
                let status = allowed(&h, &req, k, Action::Status).await;
                assert_eq!(listed.contains(k), history, "list and history disagree on {k}");
                assert_eq!(history, status, "history and status disagree on {k}");
            }
        });
    }
}
