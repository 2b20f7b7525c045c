//! The proxy rule, black box: the real binary with `HTTPS_PROXY`, `HTTP_PROXY` and `ALL_PROXY`
//! all pointing at a recording proxy, a Telegram bot whose Bot API is `https://` on a host
//! only the proxy can reach (the simulator behind TLS with a throwaway CA, trusted through
//! `SSL_CERT_FILE`), and an operator command against the running gateway. The platform's
//! traffic must cross the proxy as a `CONNECT` tunnel (the proxy never sees the bot token), and
//! nothing loopback — the CLI's control API call with its bearer token — may reach it at all.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_telegram::simulator::{
    BotApiSimulator, SimUser, SimulatorConfig, WriteOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{BIN, GatewayProcess, channel_config, demo_reply, eventually};

const TOKEN_ENV: &str = "E2E_TG_TOKEN";
/// The Bot API's host: it resolves nowhere, so only the proxy can reach it.
const API_HOST: &str = "api.telegram.test";

/// A throwaway CA and a certificate for [`API_HOST`] signed by it, made with `openssl`.
fn certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("the proxy test makes its certificates with the `openssl` command");
        assert!(status.success(), "openssl {args:?}: {status}");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &[
                "req",
                "-x509",
                "-days",
                "2",
                "-subj",
                "/CN=clawgate proxy test CA",
            ][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem"],
            &["-addext", "basicConstraints=critical,CA:TRUE"],
            &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req", "-subj", &format!("/CN={API_HOST}")][..],
            &["-keyout", "server.key", "-out", "server.csr"],
            &ec,
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("server.ext"),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{API_HOST}\n"
        ),
    )
    .expect("server.ext written");
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-set_serial",
        "7",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
}

/// A TLS front for `backend` on a loopback port, with the certificate in `dir`.
async fn tls_front(dir: &Path, backend: String) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.crt"))
        .expect("server.crt readable")
        .map(|c| c.expect("a certificate"))
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server.key readable");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("the server certificate");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let backend = backend.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(&backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    port
}

/// What reached the proxy: each request head, and every byte clients sent through it.
#[derive(Default)]
struct Seen {
    heads: Vec<String>,
    bytes: Vec<u8>,
}

/// A forward proxy on a loopback port: `CONNECT` (to any host) is tunnelled to the TLS front
/// on `front`; any other request is recorded and refused.
async fn recording_proxy(front: u16, seen: Arc<Mutex<Seen>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                {
                    let mut seen = seen.lock().expect("proxy record");
                    seen.heads.push(text.clone());
                    seen.bytes.extend_from_slice(&head);
                }
                if !text.starts_with("CONNECT ") {
                    let _ = client
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                }
                let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", front)).await else {
                    return;
                };
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_err()
                {
                    return;
                }
                // Client to server recorded (what a proxy could read), server to client as is.
                let (mut client_read, mut client_write) = client.into_split();
                let (mut upstream_read, mut upstream_write) = upstream.split();
                let up = async {
                    let mut buffer = [0u8; 16 * 1024];
                    loop {
                        let n = client_read.read(&mut buffer).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        seen.lock()
                            .expect("proxy record")
                            .bytes
                            .extend_from_slice(&buffer[..n]);
                        if upstream_write.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                    let _ = upstream_write.shutdown().await;
                };
                let down = tokio::io::copy(&mut upstream_read, &mut client_write);
                let _ = tokio::join!(up, down);
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_traffic_tunnels_through_https_proxy_and_loopback_never_touches_a_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).expect("certs directory");
    certificates(&certs);
    let sim = BotApiSimulator::start(SimulatorConfig::default())
        .await
        .expect("simulator starts");
    let backend = sim
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let front = tls_front(&certs, backend).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let proxy = format!(
        "http://127.0.0.1:{}",
        recording_proxy(front, seen.clone()).await
    );

    let settings = format!(
        "token_env = \"{TOKEN_ENV}\", api_base = \"https://{API_HOST}:{front}\", \
         poll_timeout_s = 1, request_timeout_ms = 5000"
    );
    let config = channel_config(dir.path(), "telegram", &settings, &["--words", "4"], 100);
    let state = dir.path().join("state");
    let ca = certs.join("ca.pem");
    let ca = ca.to_str().expect("a UTF-8 path");
    let env = [
        (TOKEN_ENV, sim.token()),
        ("HTTPS_PROXY", proxy.as_str()),
        ("HTTP_PROXY", proxy.as_str()),
        ("ALL_PROXY", proxy.as_str()),
        ("SSL_CERT_FILE", ca),
    ];
    let gateway = GatewayProcess::try_start(&state, &config, &env).expect("gateway starts");

    // A person writes; the reply can only have come through the proxy.
    let text = "through the proxy";
    let person = SimUser::person(4242, "Ada");
    let chat = sim.private_chat(&person);
    let update = sim.user_writes(chat, &person, text, WriteOptions::default());
    assert!(update.is_object());
    let expected = demo_reply(text, 4);
    eventually(Duration::from_secs(30), "the reply landed", || {
        let landed = sim
            .messages(chat)
            .into_iter()
            .any(|m| m.from_bot_self && m.text.as_deref() == Some(expected.as_str()));
        async move { landed.then_some(()) }
    })
    .await;

    // An operator command against the running gateway, with the same proxy environment.
    let status = Command::new(BIN)
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(&config)
        .arg("status")
        .envs(env)
        .output()
        .expect("clawgate status runs");
    assert!(
        status.status.success(),
        "status: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        String::from_utf8_lossy(&status.stderr).contains("running gateway"),
        "the command went to the running gateway's control API: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let exit = gateway.interrupt();
    assert!(exit.success(), "clean stop: {exit}");

    let seen = seen.lock().expect("proxy record");
    assert!(
        !seen.heads.is_empty(),
        "the platform was reached through the proxy"
    );
    for head in &seen.heads {
        assert!(
            head.starts_with(&format!("CONNECT {API_HOST}:{front} ")),
            "only CONNECT tunnels to the platform cross the proxy, got: {head:?}"
        );
    }
    let token = sim.token().as_bytes();
    assert!(
        !seen.bytes.windows(token.len()).any(|w| w == token),
        "the bot token never crosses the proxy readable"
    );
}
