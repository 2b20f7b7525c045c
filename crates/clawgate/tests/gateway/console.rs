//! The operator console (`/console/`) against a real gateway: its assets and headers and the
//! control API's event stream over plain HTTP, then each page in headless Chromium. Every
//! browser test saves screenshots of the pages it saw under `<target>/console-screenshots/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clawgate_channel_qa::Fault;
use serde_json::Value;

use crate::support::{
    BIN, GatewayProcess, config_file, config_file_with_agent, demo_reply, eventually,
    inject_faults, leases, processes_mentioning,
};
use crate::webdriver::{Chromedriver, Session};

/// `gateway.json`'s control token.
fn control_token(state: &Path) -> String {
    let info: Value =
        serde_json::from_slice(&std::fs::read(state.join("gateway.json")).expect("gateway.json"))
            .expect("gateway.json is JSON");
    info["controlToken"].as_str().expect("token").to_owned()
}

/// `GET {path}` of the control API with the token.
async fn get_json(gateway: &GatewayProcess, path: &str) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", gateway.url))
        .bearer_auth(control_token(&gateway.state))
        .send()
        .await
        .expect("control API answers");
    assert!(
        response.status().is_success(),
        "{path}: {}",
        response.status()
    );
    response.json().await.expect("JSON")
}

/// `<target>/console-screenshots/`: the binary under test is `<target>/<profile>/clawgate`.
fn screenshot_dir() -> PathBuf {
    let target = Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .expect("the binary lives under the target directory");
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot directory");
    dir
}

async fn screenshot(browser: &Session, name: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).expect("screenshot written");
    eprintln!("screenshot: {}", path.display());
}

/// A browser at 1280×800 on the console, the token given through the prompt, the overview
/// showing the first status event.
async fn open_console(driver: &Chromedriver, gateway: &GatewayProcess) -> Session {
    let browser = driver.new_session().await.expect("browser session");
    browser
        .set_window_size(1280, 800)
        .await
        .expect("window size");
    browser
        .goto(&format!("{}/console/", gateway.url))
        .await
        .expect("console loads");
    browser
        .find("#token")
        .await
        .expect("token prompt")
        .send_keys(&control_token(&gateway.state))
        .await
        .expect("typing the token");
    browser
        .find("#login-form button[type=submit]")
        .await
        .expect("submit")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            "!document.querySelector('#nav').hidden \
             && document.querySelector('#turns-completed').textContent !== '–'",
            Duration::from_secs(15),
            "the overview with the first status event",
        )
        .await
        .expect("console open");
    browser
}

/// Goes to a page through its navigation link (as a person would).
async fn go(browser: &Session, page: &str) {
    browser
        .find(&format!("#nav a[data-page={page}]"))
        .await
        .expect("navigation link")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            &format!("!document.querySelector('#page-{page}').hidden"),
            Duration::from_secs(10),
            "the page shown",
        )
        .await
        .expect("page shown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_a_strict_policy_and_the_event_stream_wants_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    eventually(
        Duration::from_secs(10),
        "`up` saying where the console is",
        || async {
            gateway
                .printed(&format!("console:     {}/console/", gateway.url))
                .then_some(())
        },
    )
    .await;
    let http = reqwest::Client::new();

    let page = http
        .get(format!("{}/console/", gateway.url))
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200);
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let policy = header("content-security-policy");
    assert!(
        policy.contains("default-src 'self'")
            && policy.contains("script-src 'self';")
            && !policy.contains("unsafe-inline"),
        "{policy}"
    );
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("referrer-policy"), "no-referrer");
    let html = page.text().await.expect("html");
    assert!(html.contains(r#"<script src="console.js" defer></script>"#));
    assert!(!html.contains("<script>"), "no inline script");
    for (asset, kind) in [
        ("console.js", "text/javascript"),
        ("console.css", "text/css"),
    ] {
        let response = http
            .get(format!("{}/console/{asset}", gateway.url))
            .send()
            .await
            .expect("asset");
        assert_eq!(response.status(), 200, "{asset}");
        let served = response.headers()["content-type"].to_str().unwrap_or("");
        assert!(served.starts_with(kind), "{asset}: {served}");
        assert!(response.headers().contains_key("content-security-policy"));
    }
    // The Host check covers the console as every other route (DNS rebinding).
    let rebound = http
        .get(format!("{}/console/", gateway.url))
        .header("host", "attacker.example")
        .send()
        .await
        .expect("answer");
    assert_eq!(rebound.status(), 421);

    let refused = http
        .get(format!("{}/v1/events", gateway.url))
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.expect("an error body");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("bearer token")),
        "{body}"
    );

    let mut stream = http
        .get(format!("{}/v1/events", gateway.url))
        .bearer_auth(control_token(&state))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("text/event-stream")
    );
    let mut text = String::new();
    let two_events = tokio::time::timeout(Duration::from_secs(10), async {
        while text.matches("event: status").count() < 2 {
            let chunk = stream.chunk().await.expect("chunk").expect("stream open");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(
        two_events.is_ok(),
        "two status events within 10 s: {text:?}"
    );
    let data = text
        .lines()
        .find_map(|line| line.strip_prefix("data: "))
        .expect("a data line");
    let status: Value = serde_json::from_str(data).expect("status JSON");
    assert!(
        status["stateDir"]
            .as_str()
            .is_some_and(|dir| dir.ends_with("/state")),
        "the /v1/status answer: {status}"
    );
    assert!(status["gateway"]["turnsInFlight"].is_u64(), "{status}");

    let metrics = get_json(&gateway, "/v1/metrics?minutes=60").await;
    assert_eq!(metrics["minutes"].as_array().map(Vec::len), Some(60));
    drop(stream);
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_asks_for_the_token_and_says_clearly_when_it_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = driver.new_session().await.expect("browser session");
    browser
        .set_window_size(1280, 800)
        .await
        .expect("window size");
    browser
        .goto(&format!("{}/console/", gateway.url))
        .await
        .expect("console loads");
    let prompt = browser
        .wait_for(
            "!document.querySelector('#login').hidden && document.querySelector('#nav').hidden \
             && document.querySelector('#login').textContent",
            Duration::from_secs(10),
            "the token prompt, and no page without it",
        )
        .await
        .expect("prompt shown");
    assert!(
        prompt.as_str().unwrap_or_default().contains("gateway.json"),
        "says where the token is: {prompt}"
    );
    let label = browser
        .execute(
            "return document.querySelector('label[for=token]').textContent;",
            vec![],
        )
        .await
        .expect("label");
    assert_eq!(label, Value::from("Control token"));
    screenshot(&browser, "token-prompt").await;

    browser
        .find("#token")
        .await
        .expect("token field")
        .send_keys("not-the-token")
        .await
        .expect("typing");
    browser
        .find("#login-form button[type=submit]")
        .await
        .expect("submit")
        .click()
        .await
        .expect("click");
    let message = browser
        .wait_for(
            "!document.querySelector('#login-error').hidden \
             && document.querySelector('#login-error').textContent",
            Duration::from_secs(10),
            "the refusal on the page",
        )
        .await
        .expect("refusal shown");
    let message = message.as_str().unwrap_or_default().to_owned();
    assert!(
        message.contains("refused this token (401)")
            && message.contains("missing or wrong bearer token"),
        "the API's own error, said plainly: {message}"
    );
    let kept = browser
        .execute(
            "return sessionStorage.getItem('clawgate.console.token');",
            vec![],
        )
        .await
        .expect("storage");
    assert_eq!(kept, Value::Null, "a refused token is not kept");
    screenshot(&browser, "token-refused").await;

    // The right token, submitted from the keyboard (Enter in the field), opens the overview.
    let field = browser.find("#token").await.expect("token field");
    field.clear().await.expect("cleared");
    field
        .send_keys(&format!("{}\u{E007}", control_token(&state)))
        .await
        .expect("typing and Enter");
    browser
        .wait_for(
            "document.querySelector('#login').hidden \
             && document.querySelector('#nav a[aria-current=page]')?.dataset.page === 'overview' \
             && document.querySelector('#turns-completed').textContent === '0'",
            Duration::from_secs(15),
            "the overview after the right token",
        )
        .await
        .expect("console open");
    // Forgetting the token brings the prompt back and clears the tab's copy.
    browser
        .find("#forget")
        .await
        .expect("forget button")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            "!document.querySelector('#login').hidden \
             && sessionStorage.getItem('clawgate.console.token') === null",
            Duration::from_secs(5),
            "the prompt again, the token forgotten",
        )
        .await
        .expect("forgotten");
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_shows_a_turn_appear_and_its_final_land_without_a_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // About 4 s of streaming: the turn is in flight for several status events.
    let config = config_file(dir.path(), None, &["--chunk-ms", "150", "--words", "30"]);
    let gateway = GatewayProcess::start(&state, &config);
    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = open_console(&driver, &gateway).await;
    browser
        .execute("window.sameDocument = 'yes'; return true;", vec![])
        .await
        .expect("marker");
    assert_eq!(
        browser
            .execute(
                "return document.querySelector('#turns-completed').textContent;",
                vec![]
            )
            .await
            .expect("text"),
        Value::from("0")
    );

    let channel = browser
        .execute(
            "return document.querySelector('#channels tr[data-channel=qa]')?.cells[1].textContent;",
            vec![],
        )
        .await
        .expect("channels");
    assert_eq!(
        channel,
        Value::from("qa"),
        "the QA channel listed with its kind"
    );

    gateway.say("dm-console", "hello console").await;
    browser
        .wait_for(
            "document.querySelector('#turns-in-flight').textContent === '1'",
            Duration::from_secs(20),
            "the turn in flight on the overview",
        )
        .await
        .expect("turn appears");
    screenshot(&browser, "overview-turn-in-flight").await;
    browser
        .wait_for(
            "document.querySelector('#turns-in-flight').textContent === '0' \
             && document.querySelector('#turns-completed').textContent === '1' \
             && document.querySelector('#intents-by-status tr[data-status=sent] td.num')\
                  .textContent === '1'",
            Duration::from_secs(30),
            "the turn finished and its final sent",
        )
        .await
        .expect("final lands");
    let messages = gateway.chat("dm-console").await;
    assert!(
        messages
            .iter()
            .any(|m| m["fromAgent"] == true && m["state"] == "final"),
        "the final is on the platform: {messages:?}"
    );
    // The charts follow: the sent intent is in this minute's bar of the outcome histogram.
    browser
        .wait_for(
            "document.querySelector('#chart-outcomes rect[data-label=sent]')?.dataset.count === '1' \
             && document.querySelector('#throughput-desc')?.textContent.includes('sent: 1 in the hour') \
             && document.querySelector('#latency-desc')?.textContent.startsWith('median: up to')",
            Duration::from_secs(15),
            "the charts counting the sent reply and its inbound → final latency",
        )
        .await
        .expect("charts updated");
    let same = browser
        .execute("return window.sameDocument;", vec![])
        .await
        .expect("marker");
    assert_eq!(same, Value::from("yes"), "updated in place, no reload");
    screenshot(&browser, "overview").await;
    browser
        .execute(
            "document.querySelector('.charts').scrollIntoView(); return true;",
            vec![],
        )
        .await
        .expect("scrolled to the charts");
    screenshot(&browser, "overview-charts").await;
    browser
        .execute("window.scrollTo(0, 0); return true;", vec![])
        .await
        .expect("scrolled to the top");
    browser.set_window_size(390, 844).await.expect("phone size");
    browser
        .wait_for(
            "document.documentElement.scrollWidth <= window.innerWidth + 1",
            Duration::from_secs(5),
            "no sideways scrolling of the page on a phone",
        )
        .await
        .expect("fits a phone");
    screenshot(&browser, "overview-phone").await;
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_shows_a_dead_letter_with_its_last_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // A program that exits at once: the turn fails until the event is dead-lettered.
    let config = config_file_with_agent(dir.path(), None, &["false".to_owned()]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-dead", "are you there?").await;
    let error = eventually(Duration::from_secs(60), "a dead letter", || async {
        let inbox = get_json(&gateway, "/v1/inbox?status=dead_lettered").await;
        inbox["records"][0]["lastError"].as_str().map(str::to_owned)
    })
    .await;
    assert!(!error.is_empty());

    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = open_console(&driver, &gateway).await;
    browser
        .wait_for(
            "document.querySelector('#dead-letters').textContent === '1'",
            Duration::from_secs(10),
            "the dead letter counted on the overview",
        )
        .await
        .expect("counted");
    go(&browser, "inbox").await;
    let shown = browser
        .wait_for(
            "document.querySelector('#inbox-table tr[data-status=dead_lettered] .last-error')\
               ?.textContent",
            Duration::from_secs(10),
            "the dead letter's error in the inbox",
        )
        .await
        .expect("error shown");
    assert_eq!(shown, Value::from(error.clone()), "the record's last error");
    screenshot(&browser, "inbox").await;
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}

/// The leases page against /proc, reaping on demand, then the sessions page: a session's
/// signal log, its watcher with the pending notice and its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_page_lists_the_agent_processes_the_process_table_has() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    // Sessions see every session of their agent: one can watch the other.
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("\n[sessions]\nvisibility = \"agent\"\n");
    std::fs::write(&config, text).expect("config written");
    let gateway = GatewayProcess::start(&state, &config);
    // Two conversations, two agent sessions: one process tree each, kept alive after the turn.
    for conversation in ["dm-lease-a", "dm-lease-b"] {
        gateway.say(conversation, "hello").await;
    }
    for conversation in ["dm-lease-a", "dm-lease-b"] {
        eventually(Duration::from_secs(30), "the reply", || async {
            gateway
                .chat(conversation)
                .await
                .into_iter()
                .any(|m| m["fromAgent"] == true && m["state"] == "final")
                .then_some(())
        })
        .await;
    }

    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = open_console(&driver, &gateway).await;
    go(&browser, "leases").await;
    let rows = browser
        .wait_for(
            "(() => { const rows = [...document.querySelectorAll('#leases-table tr[data-state=open]')];
                      return rows.length === 2 && rows.map(r => [r.dataset.lease, r.dataset.pid,
                        r.querySelector('.pid').textContent, r.querySelector('.evidence').textContent]); })()",
            Duration::from_secs(15),
            "both open leases on the page",
        )
        .await
        .expect("leases listed");
    screenshot(&browser, "leases").await;
    // The process table's view: the gateway's live children running the agent wrapper.
    let gateway_pid = gateway.child.id();
    let table = clawgate_acpx::system_table()
        .list()
        .expect("the process table is readable");
    let wrappers: Vec<(u32, u64)> = table
        .iter()
        .filter(|p| p.ppid == gateway_pid && !p.zombie)
        .filter(|p| {
            std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("acpx-wrapper"))
        })
        .map(|p| (p.pid, p.start_time))
        .collect();
    let mut page_pids = Vec::new();
    for row in rows.as_array().expect("rows") {
        let lease = row[0].as_str().expect("lease id");
        let pid: u32 = row[1]
            .as_str()
            .and_then(|p| p.parse().ok())
            .expect("a root pid");
        assert_eq!(row[2], Value::from(pid.to_string()), "the pid shown");
        let (_, start_time) = wrappers
            .iter()
            .find(|(p, _)| *p == pid)
            .unwrap_or_else(|| panic!("lease {lease}: pid {pid} is no live wrapper: {wrappers:?}"));
        // The evidence shown is the process's own start time, as /proc has it.
        let evidence = row[3].as_str().unwrap_or_default();
        assert!(
            evidence.contains(&format!("start {start_time}")),
            "lease {lease}: {evidence}"
        );
        // And that wrapper names this lease on its command line.
        assert!(
            processes_mentioning(lease).iter().any(|(p, _)| *p == pid),
            "lease {lease}: pid {pid}"
        );
        page_pids.push(pid);
    }
    let mut table_pids: Vec<u32> = wrappers.iter().map(|(pid, _)| *pid).collect();
    table_pids.sort_unstable();
    page_pids.sort_unstable();
    assert_eq!(
        page_pids, table_pids,
        "the page lists exactly the live agent processes"
    );

    // Reap on demand: both leases belong to live sessions, so nothing is signalled.
    browser
        .find("#leases-reap")
        .await
        .expect("reap button")
        .click()
        .await
        .expect("click");
    browser
        .find("#confirm-yes")
        .await
        .expect("confirmation")
        .click()
        .await
        .expect("confirm");
    let outcome = browser
        .wait_for(
            "!document.querySelector('#reap-result').hidden \
             && document.querySelector('#reap-outcomes').textContent",
            Duration::from_secs(15),
            "the reap's outcome",
        )
        .await
        .expect("reaped");
    assert!(
        outcome
            .as_str()
            .unwrap_or_default()
            .contains("nothing was signalled"),
        "{outcome}"
    );
    for pid in &page_pids {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "a live session's agent {pid} survives a reap"
        );
    }
    screenshot(&browser, "leases-reaped").await;

    // The first session watches the second (`sessions_send` with `watch`), then a person
    // writes to the second: the watch holds a pending notice.
    let (watcher, target) = ("agent:main:qa:dm-lease-a", "agent:main:qa:dm-lease-b");
    let sent: Value = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{target}/send", gateway.url))
        .bearer_auth(control_token(&state))
        .json(&serde_json::json!({ "message": "build it", "from": watcher, "watch": true }))
        .send()
        .await
        .expect("sessions send")
        .json()
        .await
        .expect("json");
    assert_eq!(sent["watched"], true, "{sent}");
    gateway.say("dm-lease-b", "the plan changed").await;
    let notice = eventually(Duration::from_secs(30), "a pending notice", || async {
        let watches = get_json(&gateway, &format!("/v1/sessions/{target}/watchers")).await;
        watches["watchedBy"][0]["pendingNoticeVersion"].as_u64()
    })
    .await;

    // The sessions page: the session with its state version, its watcher and its lease.
    go(&browser, "sessions").await;
    let key = browser
        .wait_for(
            "document.querySelector('#sessions-table tr[data-key*=\"dm-lease-b\"]')?.dataset.key",
            Duration::from_secs(10),
            "the session listed",
        )
        .await
        .expect("session listed");
    browser
        .find(&format!(
            "#sessions-table tr[data-key=\"{}\"] button",
            key.as_str().unwrap_or_default()
        ))
        .await
        .expect("session link")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            "!document.querySelector('#session-detail').hidden \
             && document.querySelectorAll('#session-leases tr td .status-open').length === 1",
            Duration::from_secs(10),
            "the session with its open lease",
        )
        .await
        .expect("session detail");
    let pending = browser
        .wait_for(
            &format!(
                "document.querySelector('#session-watchers tr[data-watcher=\"{watcher}\"] .pending')\
                   ?.textContent"
            ),
            Duration::from_secs(10),
            "the watcher with its pending notice",
        )
        .await
        .expect("watcher shown");
    assert_eq!(pending, Value::from(format!("up to version {notice}")));
    screenshot(&browser, "sessions").await;
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}

/// The session page's actions: "Cancel turn" with no turn running changes nothing; "Close
/// session" asks first (Escape keeps the session), then closes the agent session: its lease
/// closes in the store, and the next message begins a fresh agent process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_page_closes_the_agent_session_after_asking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let conversation = "dm-close";
    let finals = || async {
        gateway
            .chat(conversation)
            .await
            .into_iter()
            .filter(|m| m["fromAgent"] == true && m["state"] == "final")
            .count()
    };
    gateway.say(conversation, "hello").await;
    eventually(Duration::from_secs(30), "the reply", || async {
        (finals().await == 1).then_some(())
    })
    .await;
    // The agent process stays for the next message: one open lease.
    let lease = eventually(
        Duration::from_secs(10),
        "the session's open lease",
        || async {
            match leases(&state).as_slice() {
                [(id, lease_state)] if lease_state == "open" => Some(id.clone()),
                _ => None,
            }
        },
    )
    .await;

    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = open_console(&driver, &gateway).await;
    go(&browser, "sessions").await;
    let key = browser
        .wait_for(
            &format!(
                "document.querySelector('#sessions-table tr[data-key*=\"{conversation}\"]')\
                   ?.dataset.key"
            ),
            Duration::from_secs(10),
            "the session listed",
        )
        .await
        .expect("session listed");
    let key = key.as_str().expect("a session key").to_owned();
    browser
        .find(&format!("#sessions-table tr[data-key=\"{key}\"] button"))
        .await
        .expect("session link")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            &format!(
                "!document.querySelector('#session-detail').hidden \
                 && document.querySelector('#session-leases tr[data-lease=\"{lease}\"]')\
                      ?.dataset.state === 'open'"
            ),
            Duration::from_secs(10),
            "the session with its open lease",
        )
        .await
        .expect("session detail");

    // No turn runs: cancelling says so, and the agent session stays.
    browser
        .find("#session-cancel")
        .await
        .expect("cancel button")
        .click()
        .await
        .expect("click");
    let said = browser
        .wait_for(
            "document.querySelector('#session-action-result').textContent",
            Duration::from_secs(10),
            "the cancel's answer",
        )
        .await
        .expect("cancel answered");
    assert_eq!(said, Value::from("No turn was running."));
    assert_eq!(
        leases(&state),
        vec![(lease.clone(), "open".to_owned())],
        "a cancel with nothing running leaves the agent session"
    );

    // Close asks first; Escape keeps the session.
    browser
        .find("#session-close")
        .await
        .expect("close button")
        .click()
        .await
        .expect("click");
    let asked = browser
        .wait_for(
            "document.querySelector('#confirm').open && document.querySelector('#confirm-text').textContent",
            Duration::from_secs(5),
            "the confirmation with what closing means",
        )
        .await
        .expect("asked");
    let asked = asked.as_str().unwrap_or_default().to_owned();
    assert!(
        asked.contains("begins a fresh agent session") && asked.contains("memory"),
        "{asked}"
    );
    browser
        .active_element()
        .await
        .expect("the focused button")
        .send_keys("\u{E00C}")
        .await
        .expect("Escape");
    browser
        .wait_for(
            "!document.querySelector('#confirm').open",
            Duration::from_secs(5),
            "the confirmation dismissed",
        )
        .await
        .expect("dismissed");
    assert_eq!(
        leases(&state),
        vec![(lease.clone(), "open".to_owned())],
        "not closed on Escape"
    );

    browser
        .find("#session-close")
        .await
        .expect("close button")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            "document.querySelector('#confirm').open",
            Duration::from_secs(5),
            "the confirmation",
        )
        .await
        .expect("asked again");
    screenshot(&browser, "session-close-confirm").await;
    browser
        .find("#confirm-yes")
        .await
        .expect("confirm")
        .click()
        .await
        .expect("click");
    let said = browser
        .wait_for(
            "(t => t.includes('closed') && t)\
               (document.querySelector('#session-action-result').textContent)",
            Duration::from_secs(15),
            "the close's answer",
        )
        .await
        .expect("close answered");
    assert_eq!(
        said,
        Value::from("The agent session was closed; the next message begins a fresh one.")
    );
    eventually(Duration::from_secs(15), "the lease closed", || async {
        (leases(&state) == vec![(lease.clone(), "closed".to_owned())]).then_some(())
    })
    .await;
    // The page, read again, shows the lease closed (and keeps the answer).
    browser
        .find("#sessions-refresh")
        .await
        .expect("refresh")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            &format!(
                "document.querySelector('#session-leases tr[data-lease=\"{lease}\"]')\
                   ?.dataset.state === 'closed' \
                 && document.querySelector('#session-action-result').textContent.includes('closed')"
            ),
            Duration::from_secs(10),
            "the closed lease on the page",
        )
        .await
        .expect("closed lease shown");
    screenshot(&browser, "session-closed").await;

    // The next message begins a fresh agent session: a new process, a new open lease.
    gateway.say(conversation, "hello again").await;
    eventually(Duration::from_secs(30), "the second reply", || async {
        (finals().await == 2).then_some(())
    })
    .await;
    let now = leases(&state);
    assert!(
        now.len() == 2
            && now.contains(&(lease.clone(), "closed".to_owned()))
            && now.iter().any(|(id, s)| *id != lease && s == "open"),
        "the closed lease and a fresh open one: {now:?}"
    );
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_retried_from_the_outbox_after_its_warning_and_sent_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // One preview carries the whole reply (`--chunk-ms 0`); its final is an edit in place. A
    // reconciliation window of 0: an edit whose outcome stays unknown is parked at once.
    let config = dir.path().join("clawgate.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
             [retry]\nbase_delay_ms = 100\nreconcile_delay_ms = 100\nreconcile_window_ms = 0\n\n\
             [[agents]]\nid = \"main\"\ncommand = [{BIN:?}, \"demo-agent\", \"--chunk-ms\", \"0\", \
             \"--words\", \"6\"]\n\n\
             [[channels]]\nkind = \"qa\"\nsettings = {{ poll_timeout_ms = 1000 }}\n"
        ),
    )
    .expect("config written");
    let gateway = GatewayProcess::start(&state, &config);
    // The preview's POST goes through; the final's edit and the edit made again land, but
    // their answers are lost: the outcome is unknown, and stays so.
    inject_faults(&state, "qa", &[Fault::drop_after_accept(2).after(1)]).await;
    let prompt = "unknown please";
    gateway.say("dm-unknown", prompt).await;
    let id = eventually(
        Duration::from_secs(60),
        "the reply parked as unknown_after_send",
        || async {
            let outbox = get_json(&gateway, "/v1/outbox?status=unknown_after_send").await;
            let intent = &outbox["intents"][0];
            // Parked: no reconciliation scheduled, an operator decides.
            let id = intent["id"].as_str().map(str::to_owned);
            id.filter(|_| intent["nextAttemptAt"].is_null())
        },
    )
    .await;

    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = open_console(&driver, &gateway).await;
    go(&browser, "outbox").await;
    let button =
        format!("#outbox-table tr[data-id=\"{id}\"][data-status=unknown_after_send] button");
    browser
        .find(&button)
        .await
        .expect("the parked intent listed")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            "!document.querySelector('#intent-detail').hidden \
             && !document.querySelector('#intent-retry').disabled",
            Duration::from_secs(10),
            "the intent's detail with retry offered",
        )
        .await
        .expect("detail shown");
    screenshot(&browser, "outbox-unknown").await;
    // Escape at the warning changes nothing.
    browser
        .find("#intent-retry")
        .await
        .expect("retry")
        .click()
        .await
        .expect("click");
    browser
        .wait_for(
            "document.querySelector('#confirm').open",
            Duration::from_secs(5),
            "the confirmation",
        )
        .await
        .expect("asked");
    browser
        .active_element()
        .await
        .expect("the focused button")
        .send_keys("\u{E00C}")
        .await
        .expect("Escape");
    browser
        .wait_for(
            "!document.querySelector('#confirm').open",
            Duration::from_secs(5),
            "the confirmation dismissed",
        )
        .await
        .expect("dismissed");
    let still = get_json(&gateway, &format!("/v1/outbox/{id}")).await;
    assert_eq!(
        still["status"], "unknown_after_send",
        "not retried on Escape"
    );
    browser
        .find("#intent-retry")
        .await
        .expect("retry")
        .click()
        .await
        .expect("click");
    let warning = browser
        .wait_for(
            "document.querySelector('#confirm').open && document.querySelector('#confirm-text').textContent",
            Duration::from_secs(5),
            "the confirmation with its warning",
        )
        .await
        .expect("warning shown");
    assert!(
        warning
            .as_str()
            .unwrap_or_default()
            .contains("A retry may duplicate the message"),
        "{warning}"
    );
    screenshot(&browser, "outbox-retry-warning").await;
    browser
        .find("#confirm-yes")
        .await
        .expect("confirm")
        .click()
        .await
        .expect("click");
    let result = browser
        .wait_for(
            "document.querySelector('#intent-action-result').textContent",
            Duration::from_secs(10),
            "the retry's answer",
        )
        .await
        .expect("retried");
    let result = result.as_str().unwrap_or_default().to_owned();
    assert!(
        result.contains("unknown_after_send → pending") && result.contains("Warning:"),
        "the API's answer and its warning: {result}"
    );
    browser
        .wait_for(
            "document.querySelector('#intent-fields .status')?.textContent === 'sent'",
            Duration::from_secs(30),
            "the intent sent, seen live on the page",
        )
        .await
        .expect("sent");
    screenshot(&browser, "outbox").await;
    let agent_messages: Vec<Value> = gateway
        .chat("dm-unknown")
        .await
        .into_iter()
        .filter(|m| m["fromAgent"] == true)
        .collect();
    assert_eq!(
        agent_messages.len(),
        1,
        "sent once: one reply on the platform: {agent_messages:?}"
    );
    assert_eq!(
        agent_messages[0]["text"],
        Value::from(demo_reply(prompt, 6))
    );
    assert_eq!(agent_messages[0]["state"], "final");
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}
