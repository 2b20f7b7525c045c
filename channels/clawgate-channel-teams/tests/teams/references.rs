//! Conversation references in the gateway's store: a second gateway on the same store sends
//! where the first learned, two bots on one store keep their references apart, and the file an
//! earlier release kept is imported once.

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{ChannelSetup, LegacyFiles};
use clawgate_channel_teams::simulator::{ConversationKind, TeamsSimulator};
use clawgate_channel_teams::{ConversationReference, REFERENCES_FILE, TeamsFactory};
use serde_json::{Value, json};

use crate::inbound::{Running, store, until};
use crate::peer::{Peer, quiet};

/// The settings of a bot of `sim` listening on `listen`, with no configured service URL: it
/// sends only where a reference says.
fn settings(sim: &TeamsSimulator, listen: &str) -> Value {
    json!({
        "app_id": sim.app_id(),
        "app_password_env": "UNUSED_IN_TESTS",
        "listen": listen,
        "token_url": sim.token_url(),
        "openid_url": sim.openid_url(),
        "request_timeout_ms": 3000,
    })
}

async fn build(setup: &ChannelSetup, sim: &TeamsSimulator) -> ChannelPlugin {
    TeamsFactory
        .build_with_secrets(setup, Secret::new(sim.app_password()))
        .await
        .unwrap()
}

async fn send(plugin: &ChannelPlugin, target: &MessageTarget, text: &str) -> Result<(), SendError> {
    plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound(text, "teams", target.clone(), ""),
                text,
            ),
            &RenderedMessageUnit::text(0, text),
        )
        .await
        .map(|_| ())
}

async fn listening(listen: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tokio::net::TcpStream::connect(listen).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the messaging endpoint never came up"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_answers_a_conversation_whose_reference_the_first_stored() {
    // Gateway A receives; gateway B, on the same store and started before A learned anything,
    // answers.
    let a = Peer::with(quiet(), json!({ "service_url": null })).await;
    let setup_b = clawgate_conformance::channel_setup(
        0,
        "teams",
        "default",
        settings(&a.sim, "127.0.0.1:0"),
        a.state.path(),
    );
    let b = build(&setup_b, &a.sim).await;
    let (_dir, inbound) = store();
    let running = Running::start(&a.plugin, &inbound);
    a.listening().await;
    let channel = a.channel("general");
    let post = a
        .sim
        .person_writes(&channel, &a.person, "ask", None)
        .unwrap();
    until("the post dispatched on A", || {
        running.seen().get("ask") == Some(&1)
    })
    .await;
    running.stop().await;
    let target = MessageTarget::group(&channel).with_thread_id(Some(post.id.clone()));
    send(&b, &target, "answer from B")
        .await
        .expect("B sends where A learned Teams wants it");
    let shown = a.sim.bot_visible(&channel);
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].text, "answer from B");
    assert_eq!(shown[0].thread.as_deref(), Some(post.id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bots_on_one_store_keep_their_references_apart() {
    // Two bots on two Teams (two service URLs) whose conversations have the same id: an
    // earlier release kept both in one teams-conversations.json, and the bot that wrote last
    // decided where the other sent after a restart.
    let shared = tempfile::tempdir().unwrap();
    let mut bots = Vec::new();
    for account in ["bot-a", "bot-b"] {
        let sim = TeamsSimulator::start(quiet()).await.unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let listen = format!("127.0.0.1:{port}");
        let setup = clawgate_conformance::channel_setup(
            0,
            "teams",
            account,
            settings(&sim, &listen),
            shared.path(),
        );
        let plugin = build(&setup, &sim).await;
        bots.push((account, sim, plugin, listen));
    }
    let mut conversations = Vec::new();
    for (_, sim, plugin, listen) in &bots {
        let (_dir, inbound) = store();
        let running = Running::start(plugin, &inbound);
        sim.set_endpoint(Some(&format!("http://{listen}/api/messages")));
        listening(listen).await;
        let person = sim.person("ada");
        let channel = sim.conversation(
            ConversationKind::GroupChat,
            "general",
            std::slice::from_ref(&person),
        );
        sim.person_writes(&channel, &person, "ask", None).unwrap();
        until("the message dispatched", || {
            running.seen().get("ask") == Some(&1)
        })
        .await;
        running.stop().await;
        sim.set_endpoint(None);
        conversations.push(channel);
    }
    assert_eq!(
        conversations[0], conversations[1],
        "the two Teams gave the conversations one id"
    );
    // Both restarted on the shared store: each answers on its own Teams.
    for (account, sim, _, _) in &bots {
        let setup = clawgate_conformance::channel_setup(
            0,
            "teams",
            account,
            settings(sim, "127.0.0.1:0"),
            shared.path(),
        );
        let again = build(&setup, sim).await;
        send(
            &again,
            &MessageTarget::group(&conversations[0]),
            &format!("answer from {account}"),
        )
        .await
        .unwrap_or_else(|e| panic!("{account}: {e}"));
    }
    for (account, sim, _, _) in &bots {
        let shown: Vec<String> = sim
            .bot_visible(&conversations[0])
            .into_iter()
            .map(|a| a.text)
            .collect();
        assert_eq!(shown, vec![format!("answer from {account}")], "{account}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_file_of_an_earlier_release_is_imported_once() {
    let sim = TeamsSimulator::start(quiet()).await.unwrap();
    let person = sim.person("ada");
    let chat = sim.conversation(
        ConversationKind::GroupChat,
        "crew",
        std::slice::from_ref(&person),
    );
    let old_file = |service_url: &str| {
        let mut file = serde_json::Map::new();
        file.insert(
            chat.clone(),
            json!({ "service_url": service_url, "conversation_type": "groupChat" }),
        );
        serde_json::to_vec_pretty(&file).unwrap()
    };
    let old = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        old.path().join(REFERENCES_FILE),
        old_file(&sim.service_url()),
    )
    .unwrap();
    let setup = || {
        clawgate_conformance::channel_setup(
            0,
            "teams",
            "default",
            settings(&sim, "127.0.0.1:0"),
            dir.path(),
        )
        .with_legacy_files(LegacyFiles::in_dir(old.path()))
    };
    let plugin = build(&setup(), &sim).await;
    assert!(!old.path().join(REFERENCES_FILE).exists());
    assert!(
        old.path()
            .join(format!("{REFERENCES_FILE}.imported"))
            .is_file()
    );
    send(&plugin, &MessageTarget::group(&chat), "one")
        .await
        .expect("sent where the old file said");
    // A crash between the import and the rename leaves the file in place; here it names a
    // connector that is gone. The stored reference wins: nothing is imported twice.
    std::fs::write(
        old.path().join(REFERENCES_FILE),
        old_file("http://127.0.0.1:9/"),
    )
    .unwrap();
    let again = build(&setup(), &sim).await;
    send(&again, &MessageTarget::group(&chat), "two")
        .await
        .expect("sent where the stored reference says");
    let texts: Vec<String> = sim.bot_visible(&chat).into_iter().map(|a| a.text).collect();
    assert_eq!(texts, ["one", "two"]);
    let stored = clawgate_conformance::channel_state(dir.path(), "teams", "default")
        .value::<ConversationReference>(&format!("reference/{chat}"))
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(stored.version, 1, "written once");
}
