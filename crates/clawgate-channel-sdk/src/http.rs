//! The HTTP clients of channels and of the gateway, with one proxy rule for all of them.
//!
//! reqwest on its own follows `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` for every request,
//! loopback included: with `HTTP_PROXY` set, a CLI call to the gateway's own control API would
//! hand its bearer token to the proxy, and a plain `http://` platform URL its credentials.
//! Here instead:
//! - a loopback destination (`localhost`, `127.0.0.0/8`, `::1`) is never proxied;
//! - a plain `http://` destination is never proxied: its request, credentials included, would
//!   cross the proxy in clear text;
//! - an `https://` destination goes through `HTTPS_PROXY` (or `https_proxy`) when one is set
//!   and `NO_PROXY` (or `no_proxy`) does not exempt it, as a `CONNECT` tunnel: the proxy sees the
//!   host name and port, never a header or a body;
//! - `HTTP_PROXY` and `ALL_PROXY` are not used.

use std::net::IpAddr;

use reqwest::Url;

/// The environment variables the rule reads, in order of precedence.
const HTTPS_PROXY_VARS: [&str; 2] = ["HTTPS_PROXY", "https_proxy"];

/// A client builder for a platform's API: rustls where the channel enables TLS, and the proxy
/// rule of this module from the process environment.
pub fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder().no_proxy();
    match https_proxy_from_env() {
        Some(proxy) => builder.proxy(
            reqwest::Proxy::custom(move |target| proxy_for(target, Some(&proxy)))
                .no_proxy(reqwest::NoProxy::from_env()),
        ),
        None => builder,
    }
}

/// A client builder for a loopback service (the gateway's control API, an embedded
/// platform): never through a proxy, whatever the environment says.
pub fn loopback_client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().no_proxy()
}

/// The proxy URL from `HTTPS_PROXY` / `https_proxy`, when set to a URL (a value that is not
/// one is ignored with nothing proxied, rather than failing every request).
fn https_proxy_from_env() -> Option<Url> {
    HTTPS_PROXY_VARS
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty())
        .and_then(|value| {
            // `proxy.example:3128` is commonly written without a scheme.
            let value = if value.contains("://") {
                value
            } else {
                format!("http://{value}")
            };
            Url::parse(&value).ok()
        })
}

/// The proxy `target` goes through under the rule, if any (`NO_PROXY` aside).
fn proxy_for(target: &Url, https_proxy: Option<&Url>) -> Option<Url> {
    if target.scheme() != "https" || is_loopback(target) {
        return None;
    }
    https_proxy.cloned()
}

/// Whether `url` names this machine.
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => {
            let name = bare.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("a test URL")
    }

    #[test]
    fn only_https_to_another_machine_goes_through_the_proxy() {
        let proxy = url("http://proxy.example:3128");
        assert_eq!(
            proxy_for(&url("https://api.telegram.org/bot1/getMe"), Some(&proxy)),
            Some(proxy.clone())
        );
        for direct in [
            // Plain HTTP would carry its credentials through the proxy in clear text.
            "http://chat.example.org/hooks/abc",
            "https://127.0.0.1:8443/",
            "https://127.3.4.5/",
            "https://localhost:8443/",
            "https://LOCALHOST./",
            "https://gateway.localhost/",
            "https://[::1]:8443/",
            "https://[::ffff:127.0.0.1]/",
            "http://127.0.0.1:7070/v1/status",
        ] {
            assert_eq!(proxy_for(&url(direct), Some(&proxy)), None, "{direct}");
        }
        assert_eq!(proxy_for(&url("https://api.telegram.org/"), None), None);
    }
}
