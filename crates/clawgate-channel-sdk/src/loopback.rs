//! Listeners that must only be reached from this machine (a gateway's control API, an embedded
//! platform): the `Host` a request names must be a loopback name. A web page elsewhere that
//! rebinds its own domain to 127.0.0.1 (DNS rebinding) sends its own domain as `Host` and is
//! refused, so it can neither read nor drive anything behind such a listener.

/// The loopback names a request may use for a listener on `port`.
pub const LOOPBACK_NAMES: [&str; 3] = ["127.0.0.1", "localhost", "[::1]"];

/// Whether `host` (a request's `Host` header, absent when `None`) names the listener on
/// `port` by a loopback name: `127.0.0.1`, `localhost` or `[::1]`, with that port or none.
/// Other spellings of loopback (`127.1`, `2130706433`, `[::ffff:127.0.0.1]`) are refused too:
/// no browser sends them for a page it loaded from a loopback name.
pub fn is_loopback_host(host: Option<&str>, port: u16) -> bool {
    let Some(host) = host else {
        return false;
    };
    LOOPBACK_NAMES
        .iter()
        .any(|name| host == *name || host.strip_prefix(name) == Some(&format!(":{port}")))
}

/// The text of the refusal (`421 Misdirected Request`) such a listener answers other hosts.
pub const NOT_LOOPBACK: &str =
    "this listener answers only to 127.0.0.1, localhost or [::1] as Host";

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn only_loopback_names_on_the_listeners_port_pass() {
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:8080",
            "localhost",
        ] {
            assert!(is_loopback_host(Some(host), 8080), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1:8081",
            "127.1:8080",
            "2130706433:8080",
            "[::ffff:127.0.0.1]:8080",
            "localhost.evil.example:8080",
            "127.0.0.1:80801",
            "",
        ] {
            assert!(!is_loopback_host(Some(host), 8080), "{host}");
        }
        assert!(!is_loopback_host(None, 8080), "no Host at all");
    }
}
