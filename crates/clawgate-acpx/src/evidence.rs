//! The pieces of live evidence a lease is compared with: the wrapper's argv (flags before
//! `--`), the command hash, and the executable path.
//!
//! The command hash covers the exact argv (NUL-separated), never a display string, so quoting
//! can neither forge nor break agreement. Stored shell command strings (legacy records) are
//! split with POSIX quoting rules before they are compared.

use std::path::{Component, Path};

use sha2::{Digest, Sha256};

pub const LEASE_FLAG: &str = "--clawgate-acpx-lease-id";
pub const INSTANCE_FLAG: &str = "--clawgate-gateway-instance-id";
/// Set by the gateway in the wrapper's environment: the pid of the process that started it.
pub const PARENT_PID_ENV: &str = "CLAWGATE_ACPX_PARENT_PID";
/// Set by the wrapper in the adapter's environment; inherited by the adapter's descendants.
pub const LEASE_ENV: &str = "CLAWGATE_ACPX_LEASE_ID";

/// `sha256:` + hex of the argv joined by NUL bytes.
pub fn command_hash<S: AsRef<str>>(argv: &[S]) -> String {
    let mut hasher = Sha256::new();
    for (n, arg) in argv.iter().enumerate() {
        if n > 0 {
            hasher.update([0u8]);
        }
        hasher.update(arg.as_ref().as_bytes());
    }
    let digest = hasher.finalize();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The value of a wrapper flag, looked up only before the `--` separator (the adapter's own
/// arguments cannot impersonate it).
pub fn wrapper_flag<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    let head = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
    argv[..head]
        .windows(2)
        .find(|pair| pair[0] == flag)
        .map(|pair| pair[1].as_str())
}

/// True when `path` lies under `root`, compared by normal components (no `..` games).
pub fn is_under(path: &Path, root: &Path) -> bool {
    let clean = |p: &Path| p.components().all(|c| !matches!(c, Component::ParentDir));
    clean(path) && clean(root) && path.is_absolute() && path.starts_with(root)
}

/// Splits a command line with POSIX shell quoting: single quotes, double quotes (with `\`
/// escaping `"`, `\`, `$` and `` ` ``), and backslash escapes outside quotes. `None` when the
/// quoting is unbalanced.
pub fn shell_split(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        other => current.push(other),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            escaped @ ('"' | '\\' | '$' | '`') => current.push(escaped),
                            '\n' => {}
                            other => {
                                current.push('\\');
                                current.push(other);
                            }
                        },
                        other => current.push(other),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') | None => {}
                    Some(other) => current.push(other),
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            other => {
                in_word = true;
                current.push(other);
            }
        }
    }
    if in_word {
        words.push(current);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_split_table() {
        let rows: &[(&str, Option<&[&str]>)] = &[
            ("a b  c", Some(&["a", "b", "c"])),
            (
                "'/opt/my dir/w' --x 'a b'",
                Some(&["/opt/my dir/w", "--x", "a b"]),
            ),
            (r#""say \"hi\"" x\ y"#, Some(&["say \"hi\"", "x y"])),
            ("''", Some(&[""])),
            ("'open", None),
        ];
        for (line, expected) in rows {
            let expected = expected.map(|w| w.iter().map(|s| s.to_string()).collect::<Vec<_>>());
            assert_eq!(shell_split(line), expected, "{line}");
        }
    }

    #[test]
    fn flags_only_before_the_separator() {
        let argv: Vec<String> = ["/w", LEASE_FLAG, "l1", "--", "a", INSTANCE_FLAG, "g"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(wrapper_flag(&argv, LEASE_FLAG), Some("l1"));
        assert_eq!(wrapper_flag(&argv, INSTANCE_FLAG), None);
    }

    #[test]
    fn paths_and_hashes() {
        assert!(is_under(Path::new("/opt/w/bin/x"), Path::new("/opt/w")));
        assert!(!is_under(
            Path::new("/opt/w/../evil/x"),
            Path::new("/opt/w")
        ));
        assert!(!is_under(Path::new("/opt/wx/x"), Path::new("/opt/w")));
        assert_ne!(command_hash(&["a b"]), command_hash(&["a", "b"]));
        assert_eq!(
            command_hash(&["a", "b"]),
            command_hash(&["a".to_string(), "b".to_string()])
        );
    }
}
