//! Every QA fault mode at every platform call of one streamed turn: the fault is queued on the
//! embedded platform (`POST /control/faults` at the URL `gateway.json` names) to hit the Nth
//! message call (preview post, edits, final, a delete or resend the fault causes), then one
//! message is sent. Each case must end with exactly one complete final visible and nothing else,
//! no agent process and no open lease after a clean stop.

use std::time::Duration;

use clawgate_channel_qa::{Fault, FaultMode};

use crate::support::{
    AccountSpec, GatewayProcess, Sent, config_file_accounts, demo_reply, inject_faults, judge,
    leftover_processes, settle,
};

/// The streamed turn of the crash points: a preview post and three edits (the last one is the
/// final, finalized in place).
const STREAMED: &[&str] = &["--chunk-ms", "80", "--words", "8"];
const WORDS: usize = 8;
const PROMPT: &str = "fault me";
/// One past the clean turn's four calls: the call a fault adds (a resend, a delete).
const CALLS: u32 = 5;
const PARALLEL: usize = 2;

fn modes() -> Vec<(&'static str, Fault)> {
    vec![
        ("status 503", Fault::status(1, 503, "unavailable")),
        ("status 500 twice", Fault::status(2, 500, "internal")),
        ("429 retry-after 1", Fault::rate_limited(1, 1)),
        ("drop after accept", Fault::drop_after_accept(1)),
        (
            "delay before 400ms",
            Fault {
                mode: FaultMode::DelayBefore,
                delay_ms: Some(400),
                ..Fault::drop_after_accept(1)
            },
        ),
        (
            "delay after accept 400ms",
            Fault::delay_after_accept(1, 400),
        ),
    ]
}

/// One gateway, one fault at message call `call` (1-based), one message; what is wrong, if
/// anything.
async fn one_case(
    agent: &'static [&'static str],
    words: usize,
    fault: Fault,
    call: u32,
) -> Option<String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file_accounts(
        dir.path(),
        &[AccountSpec {
            account: "default",
            agent_args: agent,
        }],
        "",
    );
    let sent = vec![Sent {
        channel: "qa".into(),
        conversation: "dm-faults".into(),
        text: PROMPT.into(),
        expected: demo_reply(PROMPT, words),
    }];
    let gateway = GatewayProcess::try_start(&state, &config, &[("CLAWGATE_LOG", "warn")])
        .unwrap_or_else(|why| panic!("{why}"));
    inject_faults(&state, "qa", &[fault.after(call - 1)]).await;
    gateway.say("dm-faults", PROMPT).await;
    settle(&state, &sent, Duration::from_secs(4)).await;
    let status = gateway.interrupt();
    judge(&state, &sent).problems(leftover_processes(&state), status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_mode_at_every_platform_call_of_a_turn_leaves_exactly_one_final() {
    let mut cases = Vec::new();
    for (name, fault) in modes() {
        for call in 1..=CALLS {
            cases.push((name, fault.clone(), call));
        }
    }
    let total = cases.len();
    let mut queue = cases.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut results = Vec::new();
    loop {
        while running.len() < PARALLEL {
            let Some((name, fault, call)) = queue.next() else {
                break;
            };
            running
                .spawn(async move { (name, call, one_case(STREAMED, WORDS, fault, call).await) });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        results.push(done.expect("fault case"));
    }
    results.sort_by_key(|(name, call, _)| (*name, *call));
    let failed = results.iter().filter(|(_, _, p)| p.is_some()).count();
    let table: String = results
        .iter()
        .map(|(name, call, problem)| {
            format!(
                "{name:<26} call {call}  {}\n",
                problem.as_deref().unwrap_or("ok")
            )
        })
        .collect();
    eprintln!("platform faults: {total} cases, {failed} failed\n{table}");
    assert_eq!(
        failed, 0,
        "{failed} of {total} fault cases leave something other than exactly one final:\n{table}"
    );
}

/// Issue 16's case: with `--chunk-ms 0` the one preview carries the whole reply; its POST lands
/// but the answer is lost. The reply must show once, not as the lost preview plus a new final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_landed_with_its_answer_lost_is_not_shown_beside_the_final() {
    let problem = one_case(
        &["--chunk-ms", "0", "--words", "6"],
        6,
        Fault::drop_after_accept(1),
        1,
    )
    .await;
    assert!(
        problem.is_none(),
        "drop_after_accept on the first preview POST: {}",
        problem.unwrap_or_default()
    );
}
