//! The simulator itself, as zca-js expects Zalo Web: signed and encrypted logins bound to the
//! session cookie and IMEI, sends only under a session key, the listener only with the cookie.

use std::time::Duration;

use clawgate_channel_sdk::Secret;
use clawgate_channel_zalo_personal::simulator::{SimulatorConfig, ZaloWebSimulator};
use clawgate_channel_zalo_personal::wire::{self, SessionKey};
use clawgate_channel_zalo_personal::{Credentials, LoginError, ThreadKind, WebClient};
use serde_json::{Value, json};

use crate::peer::UA;

fn client(sim: &ZaloWebSimulator, cookie: &str, imei: &str) -> WebClient {
    WebClient::new(
        &sim.url(),
        Credentials {
            cookie: Secret::new(cookie),
            imei: Secret::new(imei),
            user_agent: UA.to_owned(),
        },
        Duration::from_secs(5),
        std::sync::Arc::new(clawgate_channel_sdk::types::clock::SystemClock),
    )
}

#[tokio::test]
async fn logins_need_the_session_cookie_and_its_imei_and_each_gets_its_own_key() {
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let good = client(&sim, &sim.cookie(), &sim.imei());
    let a = good.login().await.unwrap();
    let b = good.login().await.unwrap();
    assert_eq!(a.uid, sim.uid());
    assert_eq!(a.chat_base, sim.url());
    assert!(a.ws_urls[0].starts_with("ws://") && a.ws_urls[0].ends_with("/ws"));
    assert_eq!(a.ping_interval, Duration::from_secs(1));
    assert_ne!(format!("{:?}", a), "", "debuggable");
    for bad in [
        client(&sim, "zpw_sek=expired", &sim.imei()),
        client(&sim, &sim.cookie(), "another-device"),
    ] {
        assert!(matches!(bad.login().await, Err(LoginError::Refused(_))));
    }
    assert_eq!(sim.socket_stats().logins, 2);
    // Both sessions send; the answer decrypts under the key of the session that sent.
    let id_a = good
        .send_text(&a, ThreadKind::User, "100", "from a", 1)
        .await
        .unwrap();
    let id_b = good
        .send_text(&b, ThreadKind::Group, "200", "from b", 2)
        .await
        .unwrap();
    assert_ne!(id_a, id_b);
    let landed = sim.landed();
    assert_eq!(landed.len(), 2);
    assert_eq!(
        (landed[1].group, landed[1].cli_msg_id.as_str()),
        (true, "2")
    );
    sim.stop();
}

#[tokio::test]
async fn a_badly_signed_login_and_a_send_under_no_session_key_are_refused() {
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let url = format!(
        "{}/api/login/getLoginInfo?zcid=AB&zcid_ext=1&enc_ver=v2&params=x&type=30&client_version=685&signkey=bad&nretry=0&zpw_ver=685&zpw_type=30",
        sim.url()
    );
    let body: Value = http
        .get(url)
        .header("cookie", sim.cookie())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(body["error_code"], 0, "{body}");
    assert!(body["data"].is_null());
    // A send sealed with a key no login handed out.
    let stranger = SessionKey::from_enk(&wire::b64(&[3u8; 16])).unwrap();
    let params = stranger.encrypt(
        &json!({ "message": "hi", "clientId": 1, "toid": "1", "imei": sim.imei(), "ttl": 0 })
            .to_string(),
    );
    let form = format!(
        "params={}",
        params
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D")
    );
    let body: Value = http
        .post(format!(
            "{}/api/message/sms?nretry=0&zpw_ver=685&zpw_type=30",
            sim.url()
        ))
        .header("cookie", sim.cookie())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(body["error_code"], 0, "{body}");
    assert!(sim.landed().is_empty());
    sim.stop();
}

#[tokio::test]
async fn the_listener_refuses_a_connection_without_the_session_cookie() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let url = format!(
        "{}/ws?zpw_ver=685&zpw_type=30&t=1",
        sim.url().replace("http", "ws")
    );
    let request = url.as_str().into_client_request().unwrap();
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 401);
        }
        other => panic!("expected 401, got {:?}", other.map(|_| ())),
    }
    assert_eq!(sim.socket_stats().opened, 0);
    sim.stop();
}
