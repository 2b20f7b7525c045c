//! The web chat page in a real browser (Debian's headless Chromium through chromedriver): a
//! person types a message, sees the agent's reply stream as a preview, and sees that preview
//! become the final in place.

use std::time::Duration;

use serde_json::Value;

use crate::support::{GatewayProcess, config_file};
use crate::webdriver::Chromedriver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_page_shows_the_preview_streaming_then_the_final() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // About 2 s of streaming, so the page is seen in its streaming state.
    let config = config_file(dir.path(), None, &["--chunk-ms", "80", "--words", "25"]);
    let gateway = GatewayProcess::start(&state, &config);

    let driver = Chromedriver::start().await.expect("chromedriver");
    let browser = driver.new_session().await.expect("browser session");
    browser
        .goto(&format!("{}/?conversation=dm-browser", gateway.url))
        .await
        .expect("page loads");
    let header = browser.find("#conversation").await.expect("header");
    assert_eq!(header.text().await.expect("text"), "dm-browser");
    let input = browser.find("#text").await.expect("message box");
    input
        .send_keys("hello from the browser")
        .await
        .expect("typing");
    let send = browser.find("#send").await.expect("send button");
    send.click().await.expect("click");

    browser
        .wait_for(
            "document.querySelector('#messages li.user')?.textContent",
            Duration::from_secs(15),
            "the person's message on the page",
        )
        .await
        .expect("own message shown");
    let streaming = browser
        .wait_for(
            "(() => { const m = document.querySelector('#messages li.bot.streaming');
                      return m && { id: m.dataset.id, text: m.querySelector('.text').textContent }; })()",
            Duration::from_secs(20),
            "the agent's reply streaming as a preview",
        )
        .await
        .expect("preview seen");
    let final_message = browser
        .wait_for(
            "(() => { const m = document.querySelector('#messages li.bot.final');
                      return m && { id: m.dataset.id, text: m.querySelector('.text').textContent }; })()",
            Duration::from_secs(20),
            "the preview becoming the final",
        )
        .await
        .expect("final seen");

    assert_eq!(
        streaming["id"], final_message["id"],
        "the same message, finalized in place"
    );
    let partial = streaming["text"].as_str().unwrap_or_default();
    let full = final_message["text"].as_str().unwrap_or_default();
    assert!(full.starts_with("echo: hello from the browser"), "{full}");
    assert!(full.ends_with(" w20"), "the whole reply: {full}");
    assert!(
        full.starts_with(partial) && partial.len() < full.len(),
        "the preview showed a prefix of the final: {partial:?} / {full:?}"
    );
    let agent_messages = browser
        .execute(
            "return document.querySelectorAll('#messages li.bot').length;",
            vec![],
        )
        .await
        .expect("count");
    assert_eq!(agent_messages, Value::from(1), "one reply on the page");
    browser.close().await.expect("session closed");
    assert!(gateway.interrupt().success());
}
